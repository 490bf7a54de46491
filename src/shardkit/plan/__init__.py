"""The planner: predict per-device memory, communication and compute for every layout, rank them.

`plan(workload, devices=, hardware=, batch=)` enumerates data x fsdp x tensor x stage layouts
of the device count, costs each with closed forms (ZeRO state, Korthikanti activations, α-β
ring collectives, FLOPs over an achievable peak) and returns a `Plan` ranked by step time.

Modules, one job each: `workload` (what is trained), `hardware` (chip profiles with sources),
`runtime` (how a software stack executes a layout), `memory` (bytes per device), `comm`
(collective bytes and times), `roofline` (the scaling book's critical batch sizes), `cost` (one
layout -> `Candidate`), `search` (all layouts -> `Plan`), `report` (table and explanation),
`command` (`shardkit plan`).

Example:
    >>> import shardkit.plan as sp
    >>> p = sp.plan("llama3-70b", devices=256, hardware="h100", batch=512)
    >>> p.best.mesh_axes
    {'data': 4, 'fsdp': 64}
    >>> text = str(p)  # the ranked table and why the top row wins
    >>> p.best.strategy().mesh_axes(256) == p.best.mesh_axes
    True
"""

from shardkit.plan.cost import Candidate as Candidate
from shardkit.plan.cost import evaluate as evaluate
from shardkit.plan.hardware import Hardware as Hardware
from shardkit.plan.hardware import UnknownHardwareError as UnknownHardwareError
from shardkit.plan.hardware import get_hardware as get_hardware
from shardkit.plan.hardware import hardware_for as hardware_for
from shardkit.plan.hardware import known_hardware as known_hardware
from shardkit.plan.memory import Precision as Precision
from shardkit.plan.memory import model_state_bytes as model_state_bytes
from shardkit.plan.runtime import Runtime as Runtime
from shardkit.plan.runtime import get_runtime as get_runtime
from shardkit.plan.runtime import known_runtimes as known_runtimes
from shardkit.plan.search import DoesNotFitError as DoesNotFitError
from shardkit.plan.search import NoValidLayoutError as NoValidLayoutError
from shardkit.plan.search import Plan as Plan
from shardkit.plan.search import plan as plan
from shardkit.plan.workload import Dense as Dense
from shardkit.plan.workload import Transformer as Transformer
from shardkit.plan.workload import preset as preset
from shardkit.plan.workload import presets as presets

__all__ = [
    "Candidate",
    "Dense",
    "DoesNotFitError",
    "Hardware",
    "NoValidLayoutError",
    "Plan",
    "Precision",
    "Runtime",
    "Transformer",
    "UnknownHardwareError",
    "evaluate",
    "get_hardware",
    "get_runtime",
    "hardware_for",
    "known_hardware",
    "known_runtimes",
    "model_state_bytes",
    "plan",
    "preset",
    "presets",
]


def _make_callable() -> None:
    """`shardkit.plan(...)` is `shardkit.plan.plan(...)`: the package is callable."""
    import sys
    import types

    class _CallablePlanModule(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return plan(*args, **kwargs)

    sys.modules[__name__].__class__ = _CallablePlanModule


_make_callable()
