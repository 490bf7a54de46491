"""Pipeline parallelism over a 'stage' mesh axis: schedules, their simulator and timelines.

Schedules (:class:`GPipe`, :class:`OneFOneB`, :class:`Interleaved`, :class:`ZeroBubbleH1`) give
per-device op orders; :func:`table` packs them into the lockstep step table the SPMD executor
runs; :func:`simulate` runs the same orders as an event simulation with per-op costs and
:func:`plot` draws either as a timeline.

Example:
    >>> from shardkit.pipeline import OneFOneB, simulate, table
    >>> table(OneFOneB(), p=4, m=8).steps
    14
    >>> round(simulate(OneFOneB(), p=4, m=8).bubble, 4)   # (p-1)/(m+p-1)
    0.2727
"""

from shardkit.pipeline.plot import plot as plot
from shardkit.pipeline.schedule import BI as BI
from shardkit.pipeline.schedule import IDLE as IDLE
from shardkit.pipeline.schedule import KIND_CODES as KIND_CODES
from shardkit.pipeline.schedule import B as B
from shardkit.pipeline.schedule import Costs as Costs
from shardkit.pipeline.schedule import F as F
from shardkit.pipeline.schedule import GPipe as GPipe
from shardkit.pipeline.schedule import Interleaved as Interleaved
from shardkit.pipeline.schedule import OneFOneB as OneFOneB
from shardkit.pipeline.schedule import Op as Op
from shardkit.pipeline.schedule import Schedule as Schedule
from shardkit.pipeline.schedule import Table as Table
from shardkit.pipeline.schedule import W as W
from shardkit.pipeline.schedule import ZeroBubbleH1 as ZeroBubbleH1
from shardkit.pipeline.schedule import table as table
from shardkit.pipeline.simulate import Event as Event
from shardkit.pipeline.simulate import Timeline as Timeline
from shardkit.pipeline.simulate import simulate as simulate

__all__ = [
    "B",
    "BI",
    "F",
    "IDLE",
    "KIND_CODES",
    "W",
    "Costs",
    "Event",
    "GPipe",
    "Interleaved",
    "OneFOneB",
    "Op",
    "Schedule",
    "Table",
    "Timeline",
    "ZeroBubbleH1",
    "plot",
    "simulate",
    "table",
]

# The SPMD executor imports JAX, so its names load on first use (the schedules stay pure Python).
_ENGINE = (
    "PipelinedValueAndGrad",
    "gpipe_value_and_grad",
    "pipeline_value_and_grad",
    "reference_value_and_grad",
)
__all__ += list(_ENGINE)


def __getattr__(name: str):
    if name in _ENGINE:
        from shardkit.pipeline import engine  # lazy: the executor imports JAX

        return getattr(engine, name)
    raise AttributeError(f"module 'shardkit.pipeline' has no attribute {name!r}")
