"""Which cluster a process runs in: shardkit's launcher, SLURM, Open MPI, Kubernetes, Cloud TPU.

`detect_environment()` only reads environment variables (and, on a Cloud TPU VM, looks for the
TPU chips); it starts nothing. shardkit's own
launcher (`shardkit launch`) sets `SHARDKIT_COORDINATOR_ADDRESS`, `SHARDKIT_NUM_PROCESSES` and
`SHARDKIT_PROCESS_ID`, which shardkit reads itself. For the other clusters shardkit names the
environment and lets JAX's own cluster detection (`jax.distributed.initialize()` with no
arguments) read the scheduler's variables, so the rules stay JAX's.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
from collections.abc import Mapping

from shardkit.errors import ShardkitError

COORDINATOR = "SHARDKIT_COORDINATOR_ADDRESS"
NUM_PROCESSES = "SHARDKIT_NUM_PROCESSES"
PROCESS_ID = "SHARDKIT_PROCESS_ID"
DEVICES_PER_PROCESS = "SHARDKIT_DEVICES_PER_PROCESS"

# name -> variables whose presence marks the environment (all must be set); JAX reads them
_CLUSTERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "slurm",
        ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"),
    ),  # fmt: skip
    ("openmpi", ("OMPI_MCA_orte_hnp_uri",)),
    ("openmpi", ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")),
    ("tpu", ("TPU_WORKER_HOSTNAMES",)),
    ("tpu", ("MEGASCALE_COORDINATOR_ADDRESS",)),
    ("kubernetes", ("KUBERNETES_SERVICE_HOST", "JOB_COMPLETION_INDEX")),
    ("jax", ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")),
)


class LaunchEnvironmentError(ShardkitError, ValueError):
    """Launcher variables that are missing, malformed or inconsistent."""


@dataclasses.dataclass(frozen=True)
class Environment:
    """The detected multi-process environment.

    Attributes:
        kind: "shardkit" (our launcher), "slurm", "openmpi", "tpu", "kubernetes", "jax"
            (JAX_* variables) or "single" (one process, nothing to initialize).
        coordinator_address: "host:port" when known from the environment (shardkit, jax).
        num_processes: process count when known.
        process_id: this process's rank when known.

    Example:
        >>> detect_environment({}).kind
        'single'
    """

    kind: str
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


def _int(env: Mapping[str, str], name: str) -> int:
    text = env[name]
    try:
        return int(text)
    except ValueError:
        raise LaunchEnvironmentError(
            f"{name}={text!r} is not an integer; fix: {name}=0 (set by `shardkit launch`)."
        ) from None


def detect_environment(env: Mapping[str, str] | None = None) -> Environment:
    """Names the multi-process environment from environment variables (starts nothing).

    Args:
        env: variables to read (default `os.environ`).

    Returns:
        An `Environment`; kind "single" when no launcher or scheduler variables are present.

    Raises:
        ValueError: if only some of shardkit's launcher variables are set, or they are not
            integers.

    Example:
        >>> detect_environment({"SHARDKIT_COORDINATOR_ADDRESS": "127.0.0.1:1234",
        ...                     "SHARDKIT_NUM_PROCESSES": "2", "SHARDKIT_PROCESS_ID": "1"})
        Environment(kind='shardkit', coordinator_address='127.0.0.1:1234', num_processes=2, \
process_id=1)
    """
    env = os.environ if env is None else env
    ours = [name for name in (COORDINATOR, NUM_PROCESSES, PROCESS_ID) if name in env]
    if ours:
        if len(ours) != 3:
            missing = sorted({COORDINATOR, NUM_PROCESSES, PROCESS_ID} - set(ours))
            raise LaunchEnvironmentError(
                f"{', '.join(ours)} set but {', '.join(missing)} missing; fix: start the "
                "processes with `shardkit launch -n N -- python script.py`, which sets all three."
            )
        return Environment(
            "shardkit", env[COORDINATOR], _int(env, NUM_PROCESSES), _int(env, PROCESS_ID)
        )
    for kind, names in _CLUSTERS:
        if all(n in env for n in names):
            if kind == "slurm" and env.get("SLURM_NTASKS") == "1":
                return Environment("single")
            if kind == "jax":
                return Environment(
                    "jax",
                    env["JAX_COORDINATOR_ADDRESS"],
                    _int(env, "JAX_NUM_PROCESSES"),
                    _int(env, "JAX_PROCESS_ID"),
                )
            return Environment(kind)
    if env is os.environ and _on_cloud_tpu_vm():
        return Environment("tpu")  # JAX reads the slice's workers from the metadata server
    return Environment("single")


def _on_cloud_tpu_vm() -> bool:
    """libtpu installed and TPU chips attached: a Cloud TPU VM (one host of a slice)."""
    chips = glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*")
    return bool(chips) and importlib.util.find_spec("libtpu") is not None
