"""A strategy resolved against one mesh: `strategy.bind(mesh)` and the `Strategy` protocol.

A strategy (`Hybrid`, `FSDP`, ...) is a few degrees; on a mesh it becomes layouts. Binding does
that once: the mesh's axis sizes, the batch axes, the pipeline (checked against the "stage"
axis), the expected collectives and the one-line description are computed when bound and read
from the `BoundStrategy` afterwards by the `Trainer`, the pipelined step and the planner's
checks, instead of each asking the strategy about the mesh again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from shardkit.placement import sequence_parallel
from shardkit.strategies.pipeline import Pipeline

__all__ = ["BoundStrategy", "ExpectedCollectives", "Strategy"]


@dataclasses.dataclass(frozen=True)
class ExpectedCollectives:
    """The collective kinds a strategy's compiled training step must and may contain.

    Attributes:
        required: groups of alternatives; each group needs at least one kind present
            (e.g. `{"reduce-scatter", "all-reduce"}` for FSDP gradients, since XLA:CPU may
            emit an all-reduce where a GPU emits a reduce-scatter).
        allowed: every kind that may appear; any other kind is a finding.
        why: one line per required group, for reports.
    """

    required: tuple[frozenset[str], ...]
    allowed: frozenset[str]
    why: tuple[str, ...] = ()

    def check(self, counts: Mapping[str, int]) -> list[str]:
        """Returns human-readable problems (empty when `counts` matches)."""
        present = {k for k, n in counts.items() if n}
        problems = []
        for group, reason in zip(self.required, self.why, strict=True):
            if not present & group:
                problems.append(f"missing {' or '.join(sorted(group))} ({reason})")
        for kind in sorted(present - self.allowed):
            problems.append(f"unexpected {kind} x{counts[kind]}")
        return problems


@runtime_checkable
class Strategy(Protocol):
    """What the `Trainer` and the planner need of a parallelism strategy.

    `DataParallel`, `FSDP`, `TensorParallel` and `Hybrid` implement it; a strategy of your
    own does too when it has these members (`isinstance(s, Strategy)` checks their presence).
    """

    zero: int
    pipeline: Pipeline | None

    def degrees(self, n_devices: int) -> dict[str, int]: ...
    def mesh_axes(self, n_devices: int) -> dict[str, int]: ...
    def make_mesh(self, devices: Sequence[Any] | None = None, *, axis_types: str = "auto"): ...
    def bind(self, mesh: Any) -> BoundStrategy: ...
    def batch_axes(self, mesh: Any) -> tuple[str, ...]: ...
    def batch_spec(self, mesh: Any, ndim: int = 2) -> P: ...
    def param_specs(self, params: Any, mesh: Any, *, logical: Any = None) -> Any: ...
    def opt_state_specs(self, params: Any, mesh: Any, *, logical: Any = None) -> Any: ...
    def compute_spec(self, spec: P) -> P: ...
    def expected_collectives(self, mesh: Any) -> ExpectedCollectives: ...
    def describe(self, mesh: Any) -> str: ...


@dataclasses.dataclass(frozen=True, eq=False)
class BoundStrategy:
    """A strategy on one mesh (`strategy.bind(mesh)`): everything that depends on both.

    Attributes:
        strategy: the strategy.
        mesh: the `Mesh` or `AbstractMesh` it is bound to.
        axis_sizes: mesh axis name -> size (read-only).
        batch_axes: mesh axes that split the batch ("data" then "fsdp"), sizes above 1.
        pipeline: the strategy's `Pipeline` when it has more than one stage (the mesh's
            "stage" axis has that size), else None.
        expected: the collectives its compiled training step must and may contain.
        description: one line: the strategy, mesh shape and what is split where.
        explicit: whether any mesh axis is Explicit (layout changes use `reshard`).

    Example:
        >>> from shardkit.strategies import Hybrid
        >>> s = Hybrid(fsdp=4, tensor=2)
        >>> b = s.bind(s.make_mesh())
        >>> dict(b.axis_sizes), b.batch_axes, b.batch_spec(3)
        ({'fsdp': 4, 'tensor': 2}, ('fsdp',), PartitionSpec('fsdp', None, None))
    """

    strategy: Strategy
    mesh: Any
    axis_sizes: Mapping[str, int]
    batch_axes: tuple[str, ...]
    pipeline: Pipeline | None
    expected: ExpectedCollectives
    description: str
    explicit: bool

    @classmethod
    def of(cls, strategy: Strategy, mesh: Any) -> BoundStrategy:
        """Binds `strategy` to `mesh` (what `strategy.bind(mesh)` returns)."""
        pipe = strategy.pipeline if strategy.pipeline and strategy.pipeline.stages > 1 else None
        return cls(
            strategy=strategy,
            mesh=mesh,
            axis_sizes=types.MappingProxyType({str(k): int(v) for k, v in mesh.shape.items()}),
            batch_axes=strategy.batch_axes(mesh),
            pipeline=pipe,
            expected=strategy.expected_collectives(mesh),
            description=strategy.describe(mesh),
            explicit=any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ())),
        )

    @property
    def sequence_parallel(self) -> bool:
        """Whether the residual stream is split over the sequence along "tensor"."""
        return bool(getattr(self.strategy, "sequence_parallel", False)) and self.size("tensor") > 1

    def model_context(self):
        """The context a model is traced in: `shardkit.placement.sequence_parallel` when the
        strategy asks for it (and the mesh has a tensor axis), else nothing."""
        if self.sequence_parallel:
            overlap = bool(getattr(self.strategy, "collective_matmul", False))
            return sequence_parallel(
                self.mesh, "tensor", self.batch_axes, collective_matmul=overlap
            )
        return contextlib.nullcontext()

    def size(self, axis: str) -> int:
        """The size of mesh axis `axis` (1 when the mesh has no such axis)."""
        return self.axis_sizes.get(axis, 1)

    @property
    def stages(self) -> int:
        """Pipeline stages (devices along "stage"); 1 without a pipeline."""
        return self.pipeline.stages if self.pipeline is not None else 1

    @property
    def batch_split(self) -> int:
        """How many ways the batch is split (the product of the batch axes' sizes)."""
        n = 1
        for axis in self.batch_axes:
            n *= self.axis_sizes[axis]
        return n

    def batch_spec(self, ndim: int = 2) -> P:
        """PartitionSpec of an input batch of rank `ndim`: batch dim split, others not."""
        return self.strategy.batch_spec(self.mesh, ndim)

    def param_specs(self, params: Any, *, logical: Any = None) -> Any:
        """PartitionSpecs of a parameter tree on this mesh (see the strategy's)."""
        return self.strategy.param_specs(params, self.mesh, logical=logical)

    def opt_state_specs(self, params: Any, *, logical: Any = None) -> Any:
        """PartitionSpecs of per-parameter optimizer state on this mesh."""
        return self.strategy.opt_state_specs(params, self.mesh, logical=logical)

    def compute_spec(self, spec: P) -> P:
        """The layout a parameter has while used in compute."""
        return self.strategy.compute_spec(spec)

    def layout(self) -> dict[str, Any]:
        """The planner's degrees of this binding: `shardkit.plan.evaluate(w, hw, **layout)`.

        Example:
            >>> Hybrid(data=2, tensor=4).bind(mesh).layout()  # doctest: +SKIP
            {'data': 2, 'fsdp': 1, 'tensor': 4, 'stage': 1, 'zero': 3}
        """
        out = {a: self.size(a) for a in ("data", "fsdp", "tensor", "stage")}
        out["zero"] = self.strategy.zero
        if self.pipeline is not None:
            out["microbatches"] = self.pipeline.microbatches
            out["schedule"] = self.pipeline.schedule.name
        if self.sequence_parallel:
            out["sequence_parallel"] = True
            out["collective_matmul"] = bool(getattr(self.strategy, "collective_matmul", False))
        return out
