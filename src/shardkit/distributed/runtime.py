"""Starting JAX's multi-controller runtime with clear errors and bounded waits.

`initialize()` wraps `jax.distributed.initialize`: one process per host (or per group of local
devices), a coordinator at process 0, CPU collectives over gloo. JAX itself aborts the process
(SIGABRT) when the coordinator cannot be reached or a peer dies, so `initialize` checks what it
can before handing over: that the coordinator's port answers within `timeout` seconds, and,
once connected, that every process was started with the same process count. It also sets
JAX's heartbeat timeout (default 10 s here, 100 s in JAX) so a dead peer stops the survivors
in seconds rather than minutes.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from shardkit.compat import backend_started, distributed_client
from shardkit.distributed.environment import Environment, detect_environment
from shardkit.errors import ShardkitError


class DistributedError(ShardkitError, RuntimeError):
    """A multi-process setup problem: what is wrong, on which process, and the fix."""


class CoordinatorUnreachableError(DistributedError):
    """The coordinator address did not accept a connection within the timeout."""


class ProcessCountMismatchError(DistributedError):
    """Processes were started with different process counts."""


class ProcessMeshError(ShardkitError, ValueError):
    """The devices of one process do not form a block of the mesh."""


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """Who this process is in a multi-process run.

    Attributes:
        process_id: this process's index (`jax.process_index()`).
        num_processes: process count (`jax.process_count()`).
        local_devices: devices this process drives.
        devices: all devices of all processes.
        environment: how the run was started ("shardkit", "slurm", ..., or "single").
    """

    process_id: int
    num_processes: int
    local_devices: tuple
    devices: tuple
    environment: str

    @property
    def is_primary(self) -> bool:
        """True on process 0, the one that prints and writes shared files."""
        return self.process_id == 0


def _info(kind: str) -> ProcessInfo:
    import jax

    return ProcessInfo(
        jax.process_index(),
        jax.process_count(),
        tuple(jax.local_devices()),
        tuple(jax.devices()),
        kind,
    )


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise DistributedError(
            f"coordinator_address={address!r} is not host:port; fix: "
            "coordinator_address='127.0.0.1:12355' (or the first node's name and a free port)."
        )
    return host.strip("[]"), int(port)


def wait_for_coordinator(address: str, timeout: float) -> None:
    """Waits until `address` (host:port) accepts a TCP connection.

    Raises:
        CoordinatorUnreachableError: if it does not within `timeout` seconds.

    Example:
        >>> wait_for_coordinator("127.0.0.1:9", timeout=0.2)  # doctest: +SKIP
        Traceback (most recent call last):
        CoordinatorUnreachableError: coordinator 127.0.0.1:9 did not answer within 0.2 s ...
    """
    host, port = _split_address(address)
    deadline = time.monotonic() + timeout
    last: OSError | None = None
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError as e:
            last = e
        if time.monotonic() >= deadline:
            raise CoordinatorUnreachableError(
                f"coordinator {address} did not answer within {timeout:g} s ({last}); "
                "fix: start process 0 (it hosts the coordinator) or correct the address, "
                "and check that the port is open between the hosts."
            )
        time.sleep(0.2)


def _check_port_free(address: str) -> None:
    _, port = _split_address(address)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds it
        try:
            s.bind(("", port))
        except OSError as e:
            raise DistributedError(
                f"process 0 cannot host the coordinator on port {port} of {address} ({e}); "
                "fix: pick a free port, e.g. let `shardkit launch` choose one."
            ) from None


def _check_process_counts(num_processes: int, process_id: int, timeout: float) -> None:
    """Every process publishes its process count; each compares all of them with its own."""
    client = distributed_client()
    client.key_value_set(f"shardkit/num_processes/{process_id}", str(num_processes))
    seen = {}
    for other in range(num_processes):
        try:
            seen[other] = int(
                client.blocking_key_value_get(
                    f"shardkit/num_processes/{other}", int(timeout * 1000)
                )
            )
        except Exception:  # noqa: BLE001 - a timeout here means that process never came up
            seen[other] = None
    wrong = {p: n for p, n in seen.items() if n != num_processes}
    if wrong:
        detail = ", ".join(
            f"process {p}: {'no answer' if n is None else f'num_processes={n}'}"
            for p, n in sorted(wrong.items())
        )
        raise ProcessCountMismatchError(
            f"process {process_id} was started with num_processes={num_processes}, but "
            f"{detail}; fix: start every process with the same count (shardkit launch -n N "
            "does), and process ids 0 .. N-1 exactly once."
        )


def _check_coordinates(env: Environment) -> None:
    n, pid = env.num_processes, env.process_id
    if not isinstance(n, int) or n < 1 or not isinstance(pid, int) or not 0 <= pid < n:
        raise DistributedError(
            f"process_id={pid!r} with num_processes={n!r}: need 0 <= process_id < "
            "num_processes; fix: number the processes 0 .. N-1 (shardkit launch -n N does)."
        )
    _split_address(env.coordinator_address)


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    timeout: float = 60.0,
    heartbeat_timeout: int = 10,
    shutdown_timeout: int = 30,
    local_device_ids: Sequence[int] | None = None,
) -> ProcessInfo:
    """Joins this process to a multi-process JAX run; a no-op when it runs alone.

    Reads the coordinator, process count and id from the arguments, else from `shardkit
    launch`'s variables, else from SLURM / Open MPI / Kubernetes / Cloud TPU through JAX's own
    cluster detection. Call it before any other JAX call. Calling it again returns the same
    information.

    Args:
        coordinator_address: "host:port" of process 0's coordinator.
        num_processes: total process count.
        process_id: this process's index in 0 .. num_processes - 1.
        timeout: seconds to wait for the coordinator and for all processes to join.
        heartbeat_timeout: seconds without a heartbeat after which a process counts as dead
            and the others stop (JAX aborts them with "another task died").
        shutdown_timeout: seconds process 0 waits for the others at exit.
        local_device_ids: GPUs this process drives. Under SLURM, JAX's default is one GPU
            per task (`SLURM_LOCALID`); with one task per node pass all, e.g. `range(8)` (or
            set `JAX_LOCAL_DEVICE_IDS=0,1,...`).

    Returns:
        `ProcessInfo` for this process.

    Raises:
        CoordinatorUnreachableError: the coordinator did not answer within `timeout`.
        ProcessCountMismatchError: processes were started with different counts.
        DistributedError: bad arguments, or JAX already started in this process.

    Example:
        >>> import shardkit.distributed as skd
        >>> info = skd.initialize()      # alone: nothing to join
        >>> info.num_processes, info.is_primary
        (1, True)

    See also: `shardkit launch`, `jax.distributed.initialize`.
    """
    import jax

    if jax.distributed.is_initialized():  # joined already
        kind = detect_environment().kind
        return _info("jax" if kind == "single" else kind)
    given = (coordinator_address, num_processes, process_id)
    if all(v is not None for v in given):
        env = Environment("arguments", coordinator_address, num_processes, process_id)
    elif any(v is not None for v in given):
        raise DistributedError(
            f"initialize(coordinator_address={coordinator_address!r}, "
            f"num_processes={num_processes!r}, process_id={process_id!r}): give all three or "
            "none (to read them from the launcher or cluster); fix: "
            "initialize('127.0.0.1:12355', num_processes=2, process_id=0)."
        )
    else:
        env = detect_environment()
    if env.kind == "single":
        return _info("single")
    if env.coordinator_address is not None:
        _check_coordinates(env)
    if backend_started():
        raise DistributedError(
            "shardkit.distributed.initialize() was called after JAX started its backend; "
            "fix: call it first thing in the script, before any jax.devices() or computation."
        )
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeouts = dict(
        local_device_ids=None if local_device_ids is None else list(local_device_ids),
        initialization_timeout=max(1, math.ceil(timeout)),
        heartbeat_timeout_seconds=heartbeat_timeout,
        shutdown_timeout_seconds=shutdown_timeout,
    )
    if env.coordinator_address is not None:
        n, pid = env.num_processes, env.process_id
        if pid == 0:
            _check_port_free(env.coordinator_address)
        else:
            wait_for_coordinator(env.coordinator_address, timeout)
        jax.distributed.initialize(
            env.coordinator_address, n, pid, cluster_detection_method="deactivate", **timeouts
        )
    else:
        jax.distributed.initialize(**timeouts)  # JAX reads the cluster's variables
        n, pid = jax.process_count(), jax.process_index()
    _check_process_counts(n, pid, timeout)
    _exit_fast_on_error()
    return _info(env.kind)


def _exit_fast_on_error() -> None:
    """An uncaught exception in this rank prints its traceback and ends the process at once.

    Without this, the interpreter's exit runs `jax.distributed.shutdown`, which waits for
    the other ranks (about 30 s) until the coordinator aborts them all with SIGABRT, and the
    launcher then reports whichever rank aborted first instead of this rank's error.
    """
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130 if issubclass(kind, KeyboardInterrupt) else 1)

    sys.excepthook = hook


def check_mesh(mesh: Any, *, devices_per_process: int | None = None) -> None:
    """Checks that each process's devices form one block of the mesh.

    Process-local data loading needs it: a process feeds the rows of its own devices, which
    must be a contiguous block of every split dimension. With `jax.devices()` order (process
    by process) it holds when the devices per process divide the mesh from its last axis:
    e.g. 4 per process divide {"data": 4, "tensor": 2}; 3 per process do not divide
    {"data": 3, "tensor": 2}.

    Args:
        mesh: a `jax.sharding.Mesh`.
        devices_per_process: check as if the mesh's devices, in `jax.devices()` order, were
            split over processes in groups of this size (to plan a launch); default: the
            devices' real `process_index`.

    Raises:
        ProcessMeshError: naming the mesh axis sizes, the devices per process and a fix.

    Example:
        >>> import jax
        >>> from shardkit.mesh import make_mesh
        >>> check_mesh(make_mesh({"data": 4, "tensor": 2}), devices_per_process=4)
        >>> check_mesh(make_mesh({"data": 3, "tensor": 2}, devices=jax.devices()[:6]),
        ...            devices_per_process=3)
        Traceback (most recent call last):
        ...
        shardkit.distributed.runtime.ProcessMeshError: mesh {'data': 3, 'tensor': 2} ...
    """
    import jax
    import numpy as np

    grid = np.asarray(mesh.devices)
    axes = dict(mesh.shape)
    if devices_per_process is None:
        owner = np.vectorize(lambda d: d.process_index, otypes=[int])(grid)
    else:
        order = {d.id: i for i, d in enumerate(jax.devices())}
        if devices_per_process < 1 or grid.size % devices_per_process:
            raise ProcessMeshError(
                f"mesh {axes} has {grid.size} devices, not a multiple of "
                f"devices_per_process={devices_per_process}; fix: use a device count per "
                "process that divides the mesh size."
            )
        rank = np.vectorize(lambda d: order[d.id], otypes=[int])(grid)
        owner = np.argsort(np.argsort(rank.ravel())).reshape(grid.shape) // devices_per_process
    for p in np.unique(owner):
        where = np.nonzero(owner == p)
        spans = [len(np.unique(w)) for w in where]
        if math.prod(spans) != len(where[0]):
            per = len(where[0])
            lo = {name: sorted(set(int(i) for i in w)) for name, w in zip(axes, where)}
            raise ProcessMeshError(
                f"mesh {axes} does not split into blocks of {per} devices per process: "
                f"process {int(p)} holds mesh indices {lo}, {math.prod(spans)} mesh "
                f"positions for {per} devices; fix: choose mesh axis sizes whose trailing "
                f"product is a multiple or divisor of {per} (e.g. put an axis of size {per} "
                "last), or change the devices per process (shardkit launch "
                "--devices-per-process)."
            )


def shutdown() -> None:
    """Leaves the multi-process run (waits for the others); a no-op when alone."""
    import jax

    if jax.distributed.is_initialized():
        jax.distributed.shutdown()


def local_device_env(devices_per_process: int, env: dict[str, str] | None = None) -> dict:
    """Environment variables that give a CPU process `devices_per_process` devices."""
    env = dict(os.environ if env is None else env)
    flags = [
        f
        for f in env.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    flags.append(f"--xla_force_host_platform_device_count={devices_per_process}")
    env["XLA_FLAGS"] = " ".join(flags)
    return env
