"""shardkit: sharded and parallel computation on JAX, made practical.

Meshes (:func:`make_mesh`), partition rules (:class:`Rules`) with a linter (:func:`lint`),
layout views (:func:`show`), a collective audit (:func:`inspect`), parallel training
(``shardkit.strategies``, ``shardkit.train``), a planner that ranks layouts by predicted
memory and time (:func:`plan`) and distributed kernels (``shardkit.fft``,
``shardkit.linalg``, ``shardkit.matmul``).

Names are imported on first use, so ``import shardkit`` (and ``shardkit --help``) stays fast.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

__version__ = "0.1.0"

# public name -> (module, attribute or None for the module itself)
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "make_mesh": ("shardkit.mesh", "make_mesh"),
    "describe_mesh": ("shardkit.mesh", "describe_mesh"),
    "mesh_table": ("shardkit.mesh", "mesh_table"),
    "simulate_cpu_devices": ("shardkit.mesh", "simulate_cpu_devices"),
    "MeshError": ("shardkit.mesh", "MeshError"),
    "ShardkitError": ("shardkit.errors", "ShardkitError"),
    "Rules": ("shardkit.rules", "Rules"),
    "shard": ("shardkit.rules", "shard"),
    "sharded_model": ("shardkit.rules", "sharded_model"),
    "ShardingRuleError": ("shardkit.rules", "ShardingRuleError"),
    "lint": ("shardkit.linter", "lint"),
    "LintReport": ("shardkit.linter", "LintReport"),
    "show": ("shardkit.layout", "show"),
    "shard_table": ("shardkit.layout", "shard_table"),
    "tree_table": ("shardkit.layout", "tree_table"),
    "diff_specs": ("shardkit.layout", "diff_specs"),
    "spec_notation": ("shardkit.layout", "spec_notation"),
    "inspect": ("shardkit.inspection", "inspect"),
    "assert_collectives": ("shardkit.inspection", "assert_collectives"),
    "compiled_layout": ("shardkit.inspection", "compiled_layout"),
    "Report": ("shardkit.inspection", "Report"),
    "CollectiveAssertionError": ("shardkit.inspection", "CollectiveAssertionError"),
    "fft": ("shardkit.fft", None),
    "linalg": ("shardkit.linalg", None),
    "matmul": ("shardkit.matmul", None),
    "strategies": ("shardkit.strategies", None),
    "models": ("shardkit.models", None),
    "train": ("shardkit.train", None),
    "Trainer": ("shardkit.train", "Trainer"),
    "Checkpointer": ("shardkit.train", "Checkpointer"),
    "plan": ("shardkit.plan", None),  # callable: shardkit.plan(workload, devices=...)
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        # any submodule, as the docs write them (`sk.inspection.compiled_layout`), on first use
        if not name.startswith("_") and importlib.util.find_spec(f"shardkit.{name}") is not None:
            module, attr = f"shardkit.{name}", None
        else:
            raise AttributeError(f"module 'shardkit' has no attribute {name!r}") from None
    mod = importlib.import_module(module)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
