"""Parallelism strategies: small frozen values that yield mesh axes, layouts and collectives.

Example:
    >>> from shardkit.strategies import Hybrid
    >>> s = Hybrid(data=2, fsdp=2, tensor=2)
    >>> mesh = s.make_mesh()  # 8 devices -> {'data': 2, 'fsdp': 2, 'tensor': 2}
    >>> s.batch_spec(mesh)
    PartitionSpec(('data', 'fsdp'), None)
    >>> from shardkit.strategies import Pipeline
    >>> Hybrid(data=2, pipeline=Pipeline(stages=4)).mesh_axes(8)  # 'stage' is outermost
    {'stage': 4, 'data': 2}
"""

from shardkit.strategies.auto import Auto as Auto
from shardkit.strategies.bound import BoundStrategy as BoundStrategy
from shardkit.strategies.bound import ExpectedCollectives as ExpectedCollectives
from shardkit.strategies.bound import Strategy as Strategy
from shardkit.strategies.core import FSDP as FSDP
from shardkit.strategies.core import DataParallel as DataParallel
from shardkit.strategies.core import Hybrid as Hybrid
from shardkit.strategies.core import TensorParallel as TensorParallel
from shardkit.strategies.core import UnmatchedLeafError as UnmatchedLeafError
from shardkit.strategies.parse import from_name as from_name
from shardkit.strategies.pipeline import Pipeline as Pipeline

__all__ = [
    "FSDP",
    "Auto",
    "DataParallel",
    "BoundStrategy",
    "ExpectedCollectives",
    "Hybrid",
    "Pipeline",
    "Strategy",
    "TensorParallel",
    "UnmatchedLeafError",
    "from_name",
]
