"""Parallelism strategies as small frozen values.

Every strategy reduces to three degrees over named mesh axes plus a ZeRO stage:

* "data": batch split, parameters replicated, one gradient all-reduce per step;
* "fsdp": batch split and parameters (ZeRO-3) or only optimizer state (ZeRO-1) split;
  parameters are all-gathered for compute and gradients reduce-scattered (or all-reduced);
* "tensor": Megatron tensor parallelism from logical axis names: "mlp", "heads" and "vocab"
  dims split (column-parallel in, row-parallel out, vocab-parallel embedding and loss);
* "stage": pipeline parallelism (`Hybrid(pipeline=Pipeline(stages=p))`): the stacked "layers"
  axis split into consecutive stages, activations passed between neighbours.

`DataParallel`, `FSDP` and `TensorParallel` are one-axis cases of `Hybrid`; combining them is
`Hybrid(data=2, fsdp=2, tensor=2)`, not a subclass tree. Per-leaf layouts live in
`strategies.layouts`; the checks `bind` makes against a given mesh in `strategies.mesh_fit`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitValueError
from shardkit.linter import UnmatchedLeafError as UnmatchedLeafError
from shardkit.mesh import fill_rest, make_mesh
from shardkit.strategies.bound import BoundStrategy, ExpectedCollectives
from shardkit.strategies.layouts import NEVER_SHARDED as NEVER_SHARDED
from shardkit.strategies.layouts import TENSOR_AXIS_NAMES as TENSOR_AXIS_NAMES
from shardkit.strategies.layouts import TENSOR_NAMES as TENSOR_NAMES
from shardkit.strategies.layouts import axis_size as _size
from shardkit.strategies.layouts import drop_axis, map_specs
from shardkit.strategies.layouts import leaf_spec as leaf_spec
from shardkit.strategies.layouts import tensor_request as tensor_request
from shardkit.strategies.mesh_fit import check_mesh
from shardkit.strategies.pipeline import Pipeline


class _Base:
    """Shared behaviour; subclasses define `degrees(n_devices)` and `name`."""

    zero: int = 3
    pipeline: Any = None  # a `Pipeline` when the strategy has a "stage" degree

    def __repr__(self) -> str:
        # the one-axis strategies leave out `rules` when unset (their repr names them in errors)
        fields = [f for f in dataclasses.fields(self) if f.repr]  # type: ignore[arg-type]
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields
                 if not (f.name == "rules" and self.rules is None)]  # fmt: skip
        return f"{type(self).__name__}({', '.join(shown)})"

    # -- mesh -----------------------------------------------------------------------------
    def degrees(self, n_devices: int) -> dict[str, int]:  # pragma: no cover - abstract
        raise NotImplementedError

    def mesh_axes(self, n_devices: int) -> dict[str, int]:
        """Mesh axis names and sizes for `n_devices`, axes of size 1 dropped.

        Raises:
            ValueError: if the degrees do not multiply to `n_devices`.
        """
        degrees = self.degrees(n_devices)
        total = math.prod(degrees.values())
        if total != n_devices:
            raise ShardkitValueError(
                f"{self!r} needs {total} devices ({_fmt(degrees)}) but {n_devices} are "
                f"available; fix: choose degrees whose product is {n_devices}, or -1 for one "
                "of them to take the rest."
            )
        axes = {k: v for k, v in degrees.items() if v > 1}
        return axes or {"data": 1}

    def make_mesh(self, devices: Sequence[Any] | None = None, *, axis_types: str = "auto"):
        """Builds the `jax.sharding.Mesh` for this strategy over `devices` (default: all).

        Args:
            devices: devices to use; default `jax.devices()`.
            axis_types: "auto" or "explicit" (JAX's `AxisType`).
        """
        devices = list(jax.devices() if devices is None else devices)
        if axis_types not in ("auto", "explicit"):
            raise ShardkitValueError(
                f"axis_types={axis_types!r} is not 'auto' or 'explicit'; fix: axis_types='auto'."
            )
        return make_mesh(self.mesh_axes(len(devices)), axis_types=axis_types, devices=devices)

    def bind(self, mesh) -> BoundStrategy:
        """This strategy resolved against `mesh` once: sizes, batch axes, pipeline, specs.

        Args:
            mesh: a `Mesh` or `AbstractMesh` (e.g. from `make_mesh`).

        Raises:
            ValueError: when the mesh does not run the strategy as written (names the fix):
                pipeline stages the "stage" axis does not have, a mesh axis the strategy
                splits over that the mesh lacks, or an explicit degree (`Hybrid(tensor=4)`,
                `FSDP(fsdp=8)`) that is not its mesh axis's size. Degrees left unset (or -1)
                take the mesh's sizes.

        Example:
            >>> b = FSDP().bind(FSDP().make_mesh())
            >>> b.batch_axes, b.size("fsdp")
            (('fsdp',), 8)
        """
        check_mesh(self, {str(k): int(v) for k, v in dict(mesh.shape).items()})
        return BoundStrategy.of(self, mesh)

    # -- layouts --------------------------------------------------------------------------
    def batch_axes(self, mesh) -> tuple[str, ...]:
        """Mesh axes the batch dimension is split over ("data" then "fsdp")."""
        return tuple(a for a in ("data", "fsdp") if _size(mesh, a) > 1)

    def batch_spec(self, mesh, ndim: int = 2) -> P:
        """PartitionSpec of an input batch of rank `ndim`: batch dim split, others not."""
        axes = self.batch_axes(mesh)
        lead = axes if len(axes) > 1 else (axes[0] if axes else None)
        return P(lead, *([None] * (ndim - 1)))

    def param_specs(self, params: Any, mesh, *, logical: Any = None) -> Any:
        """PartitionSpecs for a parameter tree (arrays or `jax.ShapeDtypeStruct`s).

        Args:
            params: pytree of arrays or ShapeDtypeStructs.
            mesh: the mesh from `make_mesh` (or any mesh with these axis names).
            logical: optional tree mirroring `params` with logical axis names per leaf
                (`shardkit.models.logical_axes(model)`); without it, tensor parallelism
                falls back to `tensor_rules` name patterns.

        Returns:
            A tree of `PartitionSpec` mirroring `params`.
        """
        return map_specs(self, params, mesh, logical, for_optimizer=False)

    def opt_state_specs(self, params: Any, mesh, *, logical: Any = None) -> Any:
        """PartitionSpecs for per-parameter optimizer state (e.g. Adam's mu and nu).

        Same as `param_specs` except under ZeRO-1, where optimizer state is split over
        "fsdp" while the parameters stay replicated.
        """
        return map_specs(self, params, mesh, logical, for_optimizer=True)

    def compute_spec(self, spec: P) -> P:
        """The layout a parameter has while used in compute: "fsdp" removed (all-gathered)."""
        return P(*(drop_axis(entry, "fsdp") for entry in spec))

    def expected_collectives(self, mesh) -> ExpectedCollectives:
        """Collective kinds the compiled training step must (and may) contain on `mesh`."""
        required, why, allowed = [], [], set()
        batch_split = any(_size(mesh, a) > 1 for a in ("data", "fsdp"))
        fsdp = _size(mesh, "fsdp") > 1
        if batch_split:
            required.append(frozenset({"all-reduce", "reduce-scatter"}))
            why.append("gradients summed over the batch-split axes")
            allowed |= {"all-reduce", "reduce-scatter"}
        if fsdp:
            required.append(frozenset({"all-gather"}))
            why.append(
                "parameters all-gathered for compute (ZeRO-3)"
                if self.zero == 3
                else "updated parameter shards all-gathered (ZeRO-1)"
            )
            allowed |= {"all-gather"}
        if _size(mesh, "tensor") > 1:
            required.append(frozenset({"all-reduce"}))
            why.append("row-parallel partial sums reduced over 'tensor' (Megatron)")
            # the vocab-parallel loss gathers scores; layout changes may use all-to-all
            allowed |= {"all-reduce", "all-gather", "reduce-scatter", "all-to-all"}
            if getattr(self, "collective_matmul", False):
                required.append(frozenset({"collective-permute"}))
                why.append("tensor-parallel matmuls' slices passed around a ring over 'tensor'")
                allowed |= {"collective-permute"}
        if _size(mesh, "stage") > 1:
            required.append(frozenset({"collective-permute"}))
            why.append("activations and their gradients passed between neighbouring stages")
            allowed |= {"collective-permute", "all-reduce"}  # + loss and last-stage grads summed
        return ExpectedCollectives(tuple(required), frozenset(allowed), tuple(why))

    def describe(self, mesh) -> str:
        """One line: the strategy, mesh shape and what is split where."""
        parts = []
        if _size(mesh, "data") > 1:
            parts.append(f"data x{_size(mesh, 'data')} (batch split, params replicated)")
        if _size(mesh, "fsdp") > 1:
            what = "params+grads+optimizer" if self.zero == 3 else "optimizer state"
            parts.append(f"fsdp x{_size(mesh, 'fsdp')} (ZeRO-{self.zero}: {what} split)")
        if _size(mesh, "tensor") > 1:
            sp = ", sequence parallel" if getattr(self, "sequence_parallel", False) else ""
            sp += ", collective matmul" if getattr(self, "collective_matmul", False) else ""
            parts.append(f"tensor x{_size(mesh, 'tensor')} (Megatron: heads/mlp/vocab split{sp})")
        if self.pipeline is not None and _size(mesh, "stage") > 1:
            parts.append(self.pipeline.describe())
        return f"{self!r}: " + ("; ".join(parts) or "single device, nothing split")


def _fmt(degrees: Mapping[str, int]) -> str:
    return " x ".join(f"{k}={v}" for k, v in degrees.items())


def _check_degrees(sizes: Mapping[str, int]) -> None:
    for k, v in sizes.items():
        if not isinstance(v, int) or (v != -1 and v < 1):
            raise ShardkitValueError(
                f"{k}={v!r} must be a positive degree or -1 (the rest); fix: {k}=-1."
            )
    free = [k for k, v in sizes.items() if v == -1]
    if len(free) > 1:
        raise ShardkitValueError(
            f"only one degree may be -1, got {', '.join(free)}; fix: give all but one a size."
        )


def _resolve(n_devices: int, sizes: Mapping[str, int]) -> dict[str, int]:
    """Checks the degrees, then fills a single -1 degree with the remaining devices."""
    _check_degrees(sizes)
    return fill_rest(sizes, n_devices)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Hybrid(_Base):
    """Composes data, FSDP, tensor and pipeline parallelism over a 1-D to 4-D mesh.

    Args:
        data: data-parallel degree (mesh axis "data").
        fsdp: FSDP degree (mesh axis "fsdp").
        tensor: tensor-parallel degree (mesh axis "tensor").
        zero: 3 (params, grads and optimizer state split over "fsdp") or 1 (only optimizer
            state split).
        tensor_rules: for models without logical names, ((path regex, dim or None), ...),
            first match wins; dim is the dimension split over "tensor".
        rules: a `shardkit.Rules` that gives every parameter's PartitionSpec over the mesh
            axes "data", "fsdp", "tensor" instead of the automatic layouts (optimizer state
            follows; with zero=1 parameters drop "fsdp"). Unmatched leaves are its errors.
            Rules that never name "fsdp" leave the automatic FSDP split on for the dims they
            leave whole (`shardkit.strategies.layouts`).
        pipeline: a `Pipeline(stages=p, schedule=..., microbatches=m)` adds mesh axis "stage"
            (outermost): the stacked layers are split into stages and `Trainer` runs the
            schedule. Combines with data and tensor, not with fsdp.
        sequence_parallel: Megatron's sequence parallelism: between tensor-parallel regions
            the residual stream (norms, residual adds) is split over the sequence along
            "tensor", so each row-parallel all-reduce becomes a reduce-scatter and an
            all-gather before the next column-parallel matmul (same bytes, 1/tensor of the
            activations per device). Models mark the stream with
            `shardkit.placement.split_sequence` and write their tensor-parallel matmuls
            with `shardkit.overlap` (`shardkit.models.GPT` does). Not combined with a
            pipeline.
        collective_matmul: with sequence_parallel, run the tensor-parallel matmuls as rings
            over "tensor" whose transfers overlap their products (`shardkit.overlap`:
            all-gather-matmul before the column-parallel matmuls, matmul-reduce-scatter after
            the row-parallel ones; same bytes, as collective-permutes). Models call
            `shardkit.overlap.all_gather_matmul` / `matmul_reduce_scatter` (GPT does).

    One degree may be -1 to take the remaining devices.

    Raises:
        ValueError: on a degree < 1 other than -1, two -1 degrees, zero not in {1, 3}, a
            pipeline that is not a `Pipeline`, or fsdp combined with a pipeline.

    Example:
        >>> s = Hybrid(fsdp=-1, tensor=2)
        >>> s.mesh_axes(8)
        {'fsdp': 4, 'tensor': 2}
        >>> from shardkit.strategies import Pipeline
        >>> Hybrid(data=2, tensor=2, pipeline=Pipeline(stages=2)).mesh_axes(8)
        {'stage': 2, 'data': 2, 'tensor': 2}

    See also: `DataParallel`, `FSDP`, `TensorParallel`, `Auto`.
    """

    data: int = 1
    fsdp: int = 1
    tensor: int = 1
    zero: int = 3
    tensor_rules: tuple[tuple[str, int | None], ...] | None = None
    rules: Any = None
    pipeline: Any = None
    sequence_parallel: bool = False
    collective_matmul: bool = False

    def __post_init__(self):
        _check_zero(self.zero)
        _check_degrees({"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor})
        _check_collective_matmul(self)
        if self.pipeline is not None:
            _check_pipeline(self)
            if self.sequence_parallel:
                raise ShardkitValueError(
                    "Hybrid(sequence_parallel=True, pipeline=...): sequence parallelism inside "
                    "pipeline stages is not supported; fix: drop one of them."
                )

    def degrees(self, n_devices: int) -> dict[str, int]:
        sizes = {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}
        if self.pipeline is not None:
            sizes = {"stage": self.pipeline.stages, **sizes}
        return _resolve(n_devices, sizes)


def _check_pipeline(strategy) -> None:
    if not isinstance(strategy.pipeline, Pipeline):
        raise ShardkitValueError(
            f"Hybrid(pipeline={strategy.pipeline!r}) is not a Pipeline; fix: "
            "Hybrid(data=2, pipeline=Pipeline(stages=4, microbatches=8))."
        )
    if strategy.fsdp != 1:
        raise ShardkitValueError(
            f"Hybrid(fsdp={strategy.fsdp}, pipeline=Pipeline(stages={strategy.pipeline.stages}))"
            ": FSDP inside pipeline stages is not supported; fix: split the batch with data= "
            "instead of fsdp=, e.g. Hybrid(data=2, pipeline=Pipeline(stages=4))."
        )


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class DataParallel(_Base):
    """Data parallelism: batch split over "data", parameters and optimizer state replicated.

    Expected collectives: one gradient all-reduce (no parameter all-gather).

    Example:
        >>> DataParallel().mesh_axes(8)
        {'data': 8}
    """

    data: int = -1
    rules: Any = None  # a shardkit.Rules giving every layout (see Hybrid)

    def __post_init__(self):
        _check_degrees({"data": self.data})

    def degrees(self, n_devices: int) -> dict[str, int]:
        return _resolve(n_devices, {"data": self.data})


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class FSDP(_Base):
    """Fully sharded data parallelism over mesh axis "fsdp" (ZeRO-3 or ZeRO-1).

    Each leaf is split along its largest dimension divisible by the axis size (the stacked
    "layers" axis excluded); leaves with no such dimension stay replicated.

    Args:
        fsdp: degree (-1: all devices).
        zero: 3 splits parameters, gradients and optimizer state (parameters all-gathered for
            compute, gradients reduce-scattered); 1 splits only the optimizer state.

    Example:
        >>> FSDP(zero=1).mesh_axes(8)
        {'fsdp': 8}
    """

    fsdp: int = -1
    zero: int = 3
    rules: Any = None  # a shardkit.Rules giving every layout (see Hybrid)

    def __post_init__(self):
        _check_zero(self.zero)
        _check_degrees({"fsdp": self.fsdp})

    def degrees(self, n_devices: int) -> dict[str, int]:
        return _resolve(n_devices, {"fsdp": self.fsdp})


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class TensorParallel(_Base):
    """Megatron tensor parallelism over mesh axis "tensor"; the batch is not split.

    Dims named "mlp", "heads" or "vocab" are split: q/k/v and the MLP up-projection are
    column-parallel, the attention output and MLP down-projection row-parallel (one
    all-reduce each), the embedding and output head vocab-parallel.

    Args:
        tensor: degree (-1: all devices).
        tensor_rules: name patterns for models without logical names (see `Hybrid`).
        sequence_parallel: Megatron's sequence parallelism (see `Hybrid`).
        collective_matmul: overlapped tensor-parallel matmuls, with sequence_parallel (see
            `Hybrid`).

    Example:
        >>> TensorParallel().mesh_axes(4)
        {'tensor': 4}
    """

    tensor: int = -1
    tensor_rules: tuple[tuple[str, int | None], ...] | None = None
    rules: Any = None  # a shardkit.Rules giving every layout (see Hybrid)
    sequence_parallel: bool = False
    collective_matmul: bool = False

    def __post_init__(self):
        _check_degrees({"tensor": self.tensor})
        _check_collective_matmul(self)

    def degrees(self, n_devices: int) -> dict[str, int]:
        return _resolve(n_devices, {"tensor": self.tensor})


def _check_collective_matmul(strategy) -> None:
    if strategy.collective_matmul and not strategy.sequence_parallel:
        name = type(strategy).__name__
        raise ShardkitValueError(
            f"{name}(collective_matmul=True) overlaps the all-gather and reduce-scatter that "
            f"sequence parallelism puts around the tensor-parallel matmuls, and "
            f"sequence_parallel is off; fix: {name}(sequence_parallel=True, "
            "collective_matmul=True)."
        )


def _check_zero(zero):
    if zero not in (1, 3):
        raise ShardkitValueError(
            f"zero={zero!r} is not a supported ZeRO stage; fix: zero=3 (split params, grads "
            "and optimizer state) or zero=1 (split only optimizer state)."
        )
