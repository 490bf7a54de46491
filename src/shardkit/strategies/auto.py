"""`Auto`: the planner chooses the strategy, from Python as from `shardkit train --strategy auto`.

`Auto().choose(params, n_devices=...)` ranks every data x fsdp x tensor x stage layout with
`shardkit.plan.plan` on the devices' hardware profile and returns the fastest one shardkit runs,
with the plan's reason. A shardkit GPT is planned as the `Transformer` it is; any other
parameter pytree as a `Dense` model of that many parameters (data and FSDP layouts only, since
only named dims can be split by tensor parallelism safely).
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from shardkit.errors import ShardkitValueError
from shardkit.plan import Dense, Hardware, Plan, Transformer, get_hardware, hardware_for, plan
from shardkit.plan.search import NoValidLayoutError, no_layout_message
from shardkit.strategies.bound import Strategy
from shardkit.strategies.core import DataParallel


@dataclasses.dataclass(frozen=True, kw_only=True)
class Auto:
    """Lets the planner choose data, FSDP, tensor and pipeline degrees (`shardkit.plan`).

    Args:
        hardware: the planner's hardware profile ("h100", "tpu-v5p", "cpu", ...) or a
            `shardkit.plan.Hardware`; default: the profile of the devices trained on.
        memory_per_device: bytes per device, replacing the profile's (e.g. to leave room).
        fraction: deprecated; scales `memory_per_device` (or the profile's memory). Use
            `memory_per_device` alone.

    Example:
        >>> import jax
        >>> params = {"w": jax.ShapeDtypeStruct((64, 64), "float32")}
        >>> strategy, why = Auto().choose(params, n_devices=8, batch=8)
        >>> strategy.mesh_axes(8)  # doctest: +SKIP
        {'fsdp': 8}

    See also: `shardkit.plan.plan`, `Hybrid`, `shardkit.strategies.from_name`.
    """

    hardware: str | Hardware | None = None
    memory_per_device: int | None = None
    fraction: float | None = None

    def __post_init__(self):
        if self.memory_per_device is not None and self.memory_per_device <= 0:
            raise ShardkitValueError(
                f"Auto(memory_per_device={self.memory_per_device}) must be a positive number "
                "of bytes; fix: Auto(memory_per_device=16 << 30), or leave it out to use the "
                "hardware profile's memory."
            )
        if self.fraction is not None:
            warnings.warn(
                "Auto(fraction=...) is deprecated and goes in the next release: the planner "
                "counts every byte itself; fix: pass memory_per_device= alone.",
                DeprecationWarning,
                stacklevel=3,
            )
            if not 0 < self.fraction <= 1:
                raise ShardkitValueError(
                    f"Auto(fraction={self.fraction}) needs 0 < fraction <= 1; fix: drop it."
                )

    def profile(self, devices: Sequence[Any] | None = None) -> Hardware:
        """The hardware profile planned for: `hardware`, else that of `devices` (default all),
        with `memory_per_device` applied. The `cpu` profile is divided among this process's
        devices that run (`Hardware.shared_by`): simulated devices time-share the host."""
        devs = list(jax.devices() if devices is None else devices)
        name = self.hardware if self.hardware is not None else hardware_for(devs)
        hw = get_hardware(name)
        memory = self.memory_per_device
        if hw.name == "cpu":  # simulated devices time-share the host's cores and memory
            running = sum(d.process_index == jax.process_index() for d in devs)
            hw = hw.shared_by(max(running, 1))
            if memory is None:
                memory = _host_bytes() / jax.local_device_count() or None
        if self.fraction is not None:
            memory = (memory or hw.hbm_bytes) * self.fraction
        return hw if memory is None else hw.replace(hbm_bytes=int(memory))

    def plan(
        self,
        workload: Any,
        *,
        devices: int | Sequence[Any],
        batch: int | None = None,
        sequence_parallel: bool = False,
        collective_matmul: bool = False,
    ) -> Plan:
        """The planner's ranking of `workload`'s layouts on `devices` (a count or the devices);
        with `sequence_parallel`, tensor-parallel rows run Megatron's sequence parallelism
        (and with `collective_matmul` too, its overlapped rings).

        Raises:
            NoValidLayoutError, DoesNotFitError, UnknownHardwareError: as `shardkit.plan.plan`.
        """
        devs = None if isinstance(devices, int) else list(devices)
        n = devices if devs is None else len(devs)
        return plan(
            workload, devices=n, hardware=self.profile(devs), batch=batch,
            sequence_parallel=sequence_parallel, collective_matmul=collective_matmul,
        )  # fmt: skip

    def choose(
        self,
        params: Any,
        *,
        n_devices: int,
        logical: Any = None,
        batch: int | None = None,
        workload: Any = None,
        precision: str = "float32",
        devices: Sequence[Any] | None = None,
        mesh: Mapping[str, int] | None = None,
    ) -> tuple[Strategy, str]:
        """Returns (the planner's fastest runnable strategy, its reason) for `params`.

        Args:
            params: pytree of arrays or ShapeDtypeStructs.
            n_devices: number of devices.
            logical: tree of logical axis names (kept for the caller's layouts; the planner
                reads shapes from `workload`).
            batch: global batch size; every layout splits it evenly (default: `n_devices`).
            workload: what the planner plans: a `shardkit.models.GPTConfig`, a
                `shardkit.plan.Transformer` or `Dense`; default a `Dense` model of `params`.
            precision: the Trainer's compute dtype ("float32" or "bfloat16"; the planner
                reads them as "fp32" and "shardkit").
            devices: the devices, for their hardware profile (default `jax.devices()`).
            mesh: the axis sizes of a mesh the user built (`dict(mesh.shape)`): the fastest
                runnable layout with exactly those degrees (its ZeRO stage and remat are
                still the planner's choice).

        Raises:
            NoValidLayoutError: when no layout splits `batch` over `n_devices`; the fix names
                fewer devices (`Trainer(..., devices=jax.devices()[:k])`) or a batch.
            DoesNotFitError: when no layout fits in memory.
        """
        del logical  # tensor-parallel choices come from the workload's shapes
        if n_devices == 1:
            return DataParallel(), "one device: nothing to split."
        batch = n_devices if batch is None else batch
        w = _workload(params, workload, batch, precision)
        try:
            planned = plan(w, devices=n_devices, hardware=self.profile(devices))
        except NoValidLayoutError:  # the same reason, with the fix a Trainer's user can type
            raise NoValidLayoutError(no_layout_message(w, n_devices, trainer=True)) from None
        if mesh is None:
            return planned.runnable_best().strategy(), planned.why()
        return _on_mesh(planned, mesh)


def _on_mesh(planned: Any, mesh: Mapping[str, int]) -> tuple[Strategy, str]:
    """The fastest runnable planned layout whose degrees are the mesh's axis sizes."""
    want = {a: int(mesh.get(a, 1)) for a in ("data", "fsdp", "tensor", "stage")}
    fits = [c for c in planned.candidates if c.runnable and all(
        getattr(c, a) == n for a, n in want.items())]  # fmt: skip
    if not fits:
        best = planned.runnable_best()
        raise ShardkitValueError(
            f"Auto: no layout the planner accepts for this model and batch runs on the given "
            f"mesh {dict(mesh)} (its best is {best.layout}); fix: drop mesh= to let Auto build "
            f"the mesh, or pass the strategy for your mesh (e.g. Hybrid(...))."
        )
    c = fits[0]
    rank = planned.candidates.index(c) + 1
    return c.strategy(), (
        f"{c.layout} is the fastest layout on the given mesh {dict(mesh)} (rank {rank} of "
        f"{len(planned.candidates)}; over all meshes: {planned.why()})"
    )


def _host_bytes() -> int:
    """The host's physical memory in bytes (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _workload(params: Any, workload: Any, batch: int, precision: str) -> Transformer | Dense:
    """The planner's workload: the given one, a GPTConfig's Transformer, or a Dense model."""
    if isinstance(workload, Transformer | Dense):
        return workload.replace(batch=batch)
    if hasattr(workload, "n_layers") and hasattr(workload, "d_model"):  # a GPTConfig
        return Transformer.from_gpt_config(workload, batch=batch, precision=precision)
    if workload is not None:
        raise ShardkitValueError(
            f"Auto: workload={workload!r} is not a GPTConfig, Transformer or Dense; fix: "
            "pass shardkit.plan.Dense(params=..., flops_per_example=...) for your model."
        )
    sizes = [math.prod(x.shape) for x in jax.tree.leaves(params)]
    n = max(1, sum(sizes))
    return Dense(
        name="model",
        params=n,
        flops_per_example=6.0 * n,  # forward 2 FLOPs per parameter per example, backward 4
        activation_bytes_per_example=0.0,  # unknown for an arbitrary model: not counted
        batch=batch,
        largest_layer_params=max(sizes, default=0),
        layers=max(1, len(sizes)),
        precision=precision,
    )
