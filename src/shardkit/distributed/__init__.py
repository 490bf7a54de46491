"""Beyond one process: join a multi-process JAX run, launch local ranks, check meshes.

JAX runs one controller process per host; each drives its local devices and all of them run
the same program over one global mesh. `initialize()` joins that run (from `shardkit launch`,
SLURM, Open MPI, Kubernetes or a Cloud TPU slice) with bounded waits and clear errors;
`launch()` / `shardkit launch -n N -- python script.py` starts N ranks on this machine, the way
a scheduler starts one per host. Everything after `initialize()` — meshes, strategies, the
`Trainer`, checkpoints, the FFT and solvers — is unchanged; only data loading differs: each
process loads the rows of its own devices (`Trainer.load_batch`).

Example:
    >>> import shardkit.distributed as skd
    >>> info = skd.initialize()      # first thing in the script; alone it is a no-op
    >>> info.process_id, info.num_processes
    (0, 1)
"""

from __future__ import annotations

from shardkit.distributed.environment import Environment as Environment
from shardkit.distributed.environment import LaunchEnvironmentError as LaunchEnvironmentError
from shardkit.distributed.environment import detect_environment as detect_environment
from shardkit.distributed.launch import free_port as free_port
from shardkit.distributed.launch import launch as launch
from shardkit.distributed.runtime import CoordinatorUnreachableError as CoordinatorUnreachableError
from shardkit.distributed.runtime import DistributedError as DistributedError
from shardkit.distributed.runtime import ProcessCountMismatchError as ProcessCountMismatchError
from shardkit.distributed.runtime import ProcessInfo as ProcessInfo
from shardkit.distributed.runtime import ProcessMeshError as ProcessMeshError
from shardkit.distributed.runtime import check_mesh as check_mesh
from shardkit.distributed.runtime import initialize as initialize
from shardkit.distributed.runtime import shutdown as shutdown
from shardkit.distributed.runtime import wait_for_coordinator as wait_for_coordinator

__all__ = [
    "CoordinatorUnreachableError",
    "DistributedError",
    "Environment",
    "LaunchEnvironmentError",
    "ProcessCountMismatchError",
    "ProcessInfo",
    "ProcessMeshError",
    "check_mesh",
    "detect_environment",
    "free_port",
    "initialize",
    "launch",
    "shutdown",
    "wait_for_coordinator",
]
