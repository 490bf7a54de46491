"""Inspection: what the compiler really did (collectives, memory, FLOPs, layouts).

`inspect(fn, *args)` compiles a function and returns a `Report` of its collectives (kind,
bytes per device, mesh axes, executions, the user's source line), per-device memory and FLOPs,
and warnings; `assert_collectives` turns the same audit into a test assertion;
`compiled_layout` shows input/output shardings, requested vs compiled. Submodules import JAX
only when called.
"""

from shardkit.inspection.asserts import CollectiveAssertionError as CollectiveAssertionError
from shardkit.inspection.asserts import assert_collectives as assert_collectives
from shardkit.inspection.audit import NoMeshError as NoMeshError
from shardkit.inspection.audit import inspect as inspect
from shardkit.inspection.compiled_layout import CompiledLayout as CompiledLayout
from shardkit.inspection.compiled_layout import LayoutEntry as LayoutEntry
from shardkit.inspection.compiled_layout import compiled_layout as compiled_layout
from shardkit.inspection.hlo import collective_counts as collective_counts
from shardkit.inspection.hlo import parse_hlo as parse_hlo
from shardkit.inspection.report import Collective as Collective
from shardkit.inspection.report import Cost as Cost
from shardkit.inspection.report import Finding as Finding
from shardkit.inspection.report import MemoryStats as MemoryStats
from shardkit.inspection.report import Report as Report

__all__ = [
    "Collective",
    "CollectiveAssertionError",
    "CompiledLayout",
    "Cost",
    "Finding",
    "LayoutEntry",
    "MemoryStats",
    "NoMeshError",
    "Report",
    "assert_collectives",
    "collective_counts",
    "compiled_layout",
    "inspect",
    "parse_hlo",
]
