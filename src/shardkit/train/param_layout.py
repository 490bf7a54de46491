"""Parameter layouts the Trainer derives from the strategy's specs: the stacked layers it
gathers one layer at a time inside the scan, and notes on what tensor parallelism replicated.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import PartitionSpec as P

from shardkit.common import path_str
from shardkit.strategies.core import tensor_request

__all__ = ["indivisible_notes", "split_stacked", "unannotated_notes"]


def split_stacked(params, logical, param_specs, compute_specs, bound):
    """Specs for the up-front gather (stacked layers left split) and per-layer compute specs.

    Applies when a top-level entry of the parameters is a stack of layers: every leaf under
    it carries the leading logical axis "layers" (as `shardkit.models.GPT`'s "blocks" do).
    Otherwise everything is gathered up front and the per-layer specs are None.
    """
    if not isinstance(params, dict) or not isinstance(logical, dict):
        return None, compute_specs, None
    key = next((k for k in params if k in logical and _is_stack(params[k], logical[k])), None)
    if key is None:
        return None, compute_specs, None
    upfront = dict(compute_specs)
    upfront[key] = param_specs[key]  # stay split; gathered per layer inside the scan
    layer = jax.tree.map(
        lambda s: bound.compute_spec(P(*tuple(s)[1:])),
        param_specs[key],
        is_leaf=lambda x: isinstance(x, P),
    )
    return key, upfront, layer


def _is_stack(params, logical) -> bool:
    """Whether every leaf of `params` has the leading logical axis "layers"."""
    try:
        names = jax.tree.structure(params).flatten_up_to(logical)
    except (ValueError, TypeError):  # the logical tree does not mirror this entry
        return False
    return bool(names) and all(n and n[0] == "layers" for n in names)


def unannotated_notes(trainer: Any) -> list[str]:
    """Unannotated 1-D parameters (norm scales, biases) that tensor parallelism replicates."""
    strategy = trainer.strategy
    if trainer.bound.size("tensor") == 1 or getattr(strategy, "tensor_rules", None) is not None:
        return []
    if getattr(strategy, "rules", None) is not None:
        return []
    flat = jax.tree_util.tree_flatten_with_path(trainer.abstract_params)[0]
    names = (
        jax.tree.structure(trainer.abstract_params).flatten_up_to(trainer.logical)
        if trainer.logical is not None
        else [None] * len(flat)
    )
    small = [path_str(p) for (p, x), n in zip(flat, names) if n is None and len(x.shape) <= 1]
    if not small:
        return []
    more = f" and {len(small) - 3} more" if len(small) > 3 else ""
    return [
        f"{len(small)} unannotated 1-D parameters ({', '.join(small[:3])}{more}) are "
        "replicated over 'tensor'; annotate them (e.g. bias_init=nnx.with_partitioning(init, "
        "('mlp',))) to split them"
    ]


def indivisible_notes(trainer: Any) -> list[str]:
    """Parameters whose dim tensor parallelism is asked to split (by name or `tensor_rules`)
    does not divide by the tensor axis, so they are replicated over it instead."""
    tensor = trainer.bound.size("tensor")
    if tensor == 1 or getattr(trainer.strategy, "rules", None) is not None:
        return []  # a shardkit.Rules layout raises IndivisibleShardingError itself
    flat = jax.tree_util.tree_flatten_with_path(trainer.abstract_params)[0]
    names = (
        jax.tree.structure(trainer.abstract_params).flatten_up_to(trainer.logical)
        if trainer.logical is not None
        else [None] * len(flat)
    )
    found = []
    for (path, leaf), nm in zip(flat, names, strict=True):
        where, shape = path_str(path), tuple(leaf.shape)
        dim = tensor_request(trainer.strategy, where, shape, nm)
        if dim is not None and shape[dim] % tensor:
            found.append(f"{where!r} dim {dim} of {shape}")
    if not found:
        return []
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    return [
        f"{len(found)} parameters are replicated over 'tensor' ({tensor} devices), which does "
        f"not divide the dim it was asked to split: {', '.join(found[:3])}{more}; to split "
        f"them, make those dims multiples of {tensor} or use a smaller tensor degree; to "
        "replicate them on purpose, give their tensor_rules dim None"
    ]
