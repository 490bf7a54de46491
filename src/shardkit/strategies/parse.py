"""Strategies from names and mesh-axis dicts, as used by `shardkit train` and TOML configs."""

from __future__ import annotations

from collections.abc import Mapping

from shardkit.errors import ShardkitValueError
from shardkit.strategies.auto import Auto
from shardkit.strategies.core import FSDP, DataParallel, Hybrid, TensorParallel
from shardkit.strategies.pipeline import Pipeline

NAMES = ("auto", "dp", "fsdp", "zero1", "tp", "hybrid")
MESH_AXES = ("data", "fsdp", "tensor", "stage")


def _sequence_parallel(name: str, key: str, wanted: bool, overlap: bool) -> dict[str, bool]:
    if overlap and not wanted:
        raise ShardkitValueError(
            "--collective-matmul overlaps the all-gathers and reduce-scatters of sequence "
            "parallelism, which is off; fix: add --sequence-parallel."
        )
    if wanted and key in ("dp", "fsdp", "zero1"):
        raise ShardkitValueError(
            f"sequence parallelism splits the sequence over the tensor axis, which strategy "
            f"{name!r} has not; fix: --strategy tp, or --strategy hybrid with a tensor axis "
            "(e.g. --mesh data=4,tensor=2)."
        )
    out = {"sequence_parallel": True} if wanted else {}
    return out | ({"collective_matmul": True} if overlap else {})


def _check_zero(name: str, key: str, mesh: Mapping[str, int], zero: int | None) -> None:
    """A ZeRO stage applies to the "fsdp" axis of "fsdp" and "hybrid" (and is 1 for "zero1")."""
    if zero is None:
        return
    if zero not in (1, 3):
        raise ShardkitValueError(
            f"--zero {zero} is not a ZeRO stage shardkit runs; fix: --zero 3 (params, grads and "
            "optimizer state split over fsdp) or --zero 1 (only the optimizer state)."
        )
    if key == "auto":
        raise ShardkitValueError(
            f"strategy 'auto' chooses the ZeRO stage with the layout; fix: drop --zero {zero}, or "
            f"run a layout yourself, e.g. --strategy hybrid --mesh fsdp=4,tensor=2 --zero {zero}."
        )
    if key == "zero1" and zero != 1:
        raise ShardkitValueError(
            f"strategy 'zero1' is ZeRO-1 but --zero {zero} was given; fix: --strategy fsdp "
            f"--zero {zero}, or drop --zero."
        )
    if key in ("dp", "tp") or (key == "hybrid" and int(mesh.get("fsdp", 1)) == 1):
        where = ""
        if key == "hybrid":
            where = f" with mesh {dict(mesh) or 'data=-1,tensor=2 (its default)'}"
        raise ShardkitValueError(
            f"--zero {zero} sets the ZeRO stage of the fsdp axis, which strategy {name!r}{where} "
            f"has not; fix: add an fsdp axis, e.g. --strategy hybrid --mesh fsdp=4,tensor=2 "
            f"--zero {zero}."
        )


def _hybrid(degrees: Mapping[str, int], zero: int, pipeline, sp: dict) -> Hybrid:
    """The `Hybrid` of mesh-axis `degrees` (the "stage" axis is the `pipeline`)."""
    axes = {a: int(degrees.get(a, 1)) for a in MESH_AXES if a != "stage"}
    return Hybrid(**axes, zero=zero, pipeline=pipeline, **sp)


def from_name(
    name: str,
    *,
    mesh: Mapping[str, int] | None = None,
    schedule: str | None = None,
    microbatches: int | None = None,
    residuals: str | None = None,
    sequence_parallel: bool = False,
    collective_matmul: bool = False,
    zero: int | None = None,
):
    """Builds a strategy from a short name and optional mesh axis sizes.

    Args:
        name: one of "auto", "dp", "fsdp" (ZeRO-3), "zero1", "tp", "hybrid".
        mesh: mesh axis sizes such as {"data": 4, "tensor": 2}; axes must be among
            "data", "fsdp", "tensor", "stage". With "hybrid" it sets the degrees (default
            {"data": -1, "tensor": 2}); with other names it may only name that strategy's axis.
            "stage" > 1 adds a `Pipeline` degree.
        schedule: pipeline schedule name ("gpipe", "1f1b", "interleaved", "zb-h1",
            "zb-h1-fused"; default "1f1b"); needs "stage" in `mesh`.
        microbatches: pipeline micro-batches per step (default 2 x stage); needs "stage".
        residuals: "recompute" (default) or "stash" (see `Pipeline`); needs "stage".
        sequence_parallel: Megatron's sequence parallelism with the tensor axis ("tp" and
            "hybrid"; "auto" passes it to the chosen layout when that has a tensor axis).
        collective_matmul: with sequence_parallel, the tensor-parallel matmuls as overlapped
            rings (`Hybrid(collective_matmul=True)`).
        zero: ZeRO stage of the "fsdp" axis for "fsdp" and "hybrid" (3: parameters,
            gradients and optimizer state split; 1: only the optimizer state); None: 3.

    Raises:
        ValueError: for an unknown name or mesh axis, an axis the strategy does not use,
            pipeline options without a "stage" axis, or a `zero` with no "fsdp" axis to apply to.

    Example:
        >>> from_name("hybrid", mesh={"fsdp": 4, "tensor": 2}).mesh_axes(8)
        {'fsdp': 4, 'tensor': 2}
        >>> from_name("hybrid", mesh={"data": 2, "stage": 4}, schedule="gpipe").pipeline.stages
        4
        >>> from_name("hybrid", mesh={"fsdp": 4, "tensor": 2}, zero=1).zero
        1
    """
    key = name.strip().lower()
    if key not in NAMES:
        raise ShardkitValueError(f"unknown strategy {name!r}; fix: use one of {', '.join(NAMES)}.")
    mesh = dict(mesh or {})
    for axis, size in mesh.items():
        if axis not in MESH_AXES:
            raise ShardkitValueError(
                f"unknown mesh axis {axis!r} (size {size}) for strategy {name!r}; fix: name "
                f"mesh axes from {', '.join(MESH_AXES)}, e.g. --mesh data=4,tensor=2."
            )
    stages = int(mesh.get("stage", 1))
    if stages < 1:
        raise ShardkitValueError(
            f"mesh axis 'stage' has size {stages}; the pipeline needs a fixed stage count; "
            "fix: --mesh data=2,stage=4."
        )
    options = {"--schedule": schedule, "--microbatches": microbatches, "--residuals": residuals}
    given = [flag for flag, value in options.items() if value is not None]
    if stages == 1 and given:
        given = given[0]
        raise ShardkitValueError(
            f"{given} configures pipeline stages but the mesh {mesh or '{}'} has no 'stage' "
            "axis > 1; fix: add the stage count to the mesh, e.g. --strategy hybrid "
            "--mesh data=2,stage=4."
        )
    sp = _sequence_parallel(name, key, sequence_parallel, collective_matmul)
    _check_zero(name, key, mesh, zero)
    zero = 1 if key == "zero1" else (zero or 3)
    if key == "hybrid":
        pipeline = None
        if stages > 1:
            pipeline = Pipeline(stages=stages, schedule=schedule, microbatches=microbatches,
                                residuals=residuals or "recompute")  # fmt: skip
        return _hybrid(mesh or {"data": -1, "tensor": 2}, zero, pipeline, sp)
    if key == "auto":
        if mesh:
            raise ShardkitValueError(
                "strategy 'auto' chooses the mesh itself; fix: drop --mesh or use "
                "--strategy hybrid with it."
            )
        return Auto()
    axis = {"dp": "data", "fsdp": "fsdp", "zero1": "fsdp", "tp": "tensor"}[key]
    extra = set(mesh) - {axis}
    if extra:
        raise ShardkitValueError(
            f"strategy {name!r} uses only mesh axis {axis!r}, got {sorted(extra)}; fix: use "
            f"--strategy hybrid to combine axes, e.g. --strategy hybrid --mesh {axis}=2,"
            f"{sorted(extra)[0]}=4."
        )
    size = int(mesh.get(axis, -1))
    if key == "dp":
        return DataParallel(data=size)
    if key == "tp":
        return TensorParallel(tensor=size, **sp)
    return FSDP(fsdp=size, zero=zero)
