"""Layout changes inside `jit` that work on Auto, Explicit and mixed mesh axes.

On Auto axes a layout is a hint (`jax.lax.with_sharding_constraint`); on Explicit axes it is
part of the array's type and changes with `jax.sharding.reshard`. Neither call accepts the
other kind of axis, and a constraint that names no Explicit axis leaves an Explicit split in
place, so `constrain` splits the wanted spec in two: the Explicit axes go to `reshard`, the Auto
axes to `with_sharding_constraint`. Manual axes (inside `shard_map`) are left alone. On a mixed
mesh a dim split over both kinds has its Explicit axes first (they are part of the type; the
constraint adds the Auto ones after them).

Sequence parallelism's layouts live here too, so models (which import no strategy) can mark
their residual stream: `split_sequence`, `gather_sequence`, `split_heads` and `sequence_out`
act only while a step is traced inside `sequence_parallel` (the Trainer enters it for
`TensorParallel(sequence_parallel=True)` and `Hybrid(..., sequence_parallel=True)`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import Any

import jax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitValueError

__all__ = [
    "constrain",
    "constrain_tree",
    "gather_sequence",
    "SequenceLayout",
    "sequence_batch",
    "sequence_layout",
    "sequence_out",
    "sequence_parallel",
    "split_heads",
    "split_sequence",
]


def _keep(spec: Sequence[Any], axes: set[str]) -> P:
    """`spec` with only the mesh axes in `axes` left (`P.UNCONSTRAINED` entries stay)."""
    out = []
    for entry in spec:
        if entry is P.UNCONSTRAINED:
            out.append(entry)
            continue
        names = entry if isinstance(entry, tuple) else (entry,)
        kept = tuple(a for a in names if a is not None and a in axes)
        out.append(kept if len(kept) > 1 else (kept[0] if kept else None))
    return P(*out)


def _check_names(mesh: Any, names: Sequence[Any], where: str) -> None:
    """Raises unless every name is a mesh axis of `mesh`, named once (`_keep` would drop an
    unknown one: the dim silently whole)."""
    seen: set[Any] = set()
    for name in names:
        if name not in mesh.axis_names:
            raise ShardkitValueError(
                f"{where} names mesh axis {name!r}, but the mesh has axes {dict(mesh.shape)}; "
                f"fix: use one of {tuple(mesh.axis_names)}, or None to keep the dim whole."
            )
        if name in seen:
            raise ShardkitValueError(
                f"{where} names mesh axis {name!r} twice (mesh {dict(mesh.shape)}); fix: split "
                f"the dims over each mesh axis at most once."
            )
        seen.add(name)


def _checked_spec(mesh: Any, spec: P | Sequence[Any] | str) -> tuple[Any, ...]:
    """`spec`'s entries (a bare string is one mesh axis, as `P("data")`; each letter of it
    was taken for a mesh axis), checked by `_check_names`."""
    entries = (spec,) if isinstance(spec, str) else tuple(spec)
    names = [
        n
        for e in entries
        if e is not None and e is not P.UNCONSTRAINED
        for n in (e if isinstance(e, tuple) else (e,))
    ]
    _check_names(mesh, names, f"constrain: spec {P(*entries)}")
    return entries


def _explicit_part(x: Any, spec: tuple[Any, ...], explicit: set[str]) -> P:
    """The Explicit axes of `spec`; an unconstrained dim keeps the split of `x`'s type."""
    current = tuple(getattr(jax.typeof(x).sharding, "spec", ()))
    entries = [
        (current[i] if i < len(current) else None) if e is P.UNCONSTRAINED else e
        for i, e in enumerate(spec)
    ]
    return _keep(entries, explicit)


def constrain(x: jax.Array, mesh: Any, spec: P | Sequence[Any]) -> jax.Array:
    """Lays `x` out as `spec` on `mesh` inside `jit`, whatever the mesh's axis types.

    Args:
        x: an array (or tracer).
        mesh: a `Mesh` or `AbstractMesh`.
        spec: a `PartitionSpec`, a sequence of its entries, or one mesh axis name. A
            `P.UNCONSTRAINED` entry leaves the dim to the compiler on Auto axes and as it is
            on Explicit ones.

    Raises:
        ValueError: `spec` names a mesh axis `mesh` lacks, or one twice; (JAX's) it is longer
            than `x`'s rank, or splits a dim over Explicit mesh axes that do not divide it.

    Example:
        >>> y = jax.jit(lambda x: constrain(x, mesh, P("data", None)))(x)  # doctest: +SKIP
    """
    spec = _checked_spec(mesh, spec)
    kinds = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))
    explicit = {a for a, t in kinds.items() if t == AxisType.Explicit}
    auto = {a for a, t in kinds.items() if t == AxisType.Auto}
    if explicit:
        want = _explicit_part(x, spec, explicit)
        x = jax.sharding.reshard(x, NamedSharding(mesh, want))
    if auto:
        x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, _keep(spec, auto)))
    return x


def constrain_tree(tree: Any, mesh: Any, specs: Any) -> Any:
    """`constrain` over a pytree, with a tree of `PartitionSpec`s mirroring it."""
    return jax.tree.map(
        lambda x, s: constrain(x, mesh, s), tree, specs, is_leaf=lambda s: isinstance(s, P)
    )


# Sequence parallelism (Megatron-style): while a step is traced inside `sequence_parallel`, the
# residual stream (B, T, D) between tensor-parallel regions is split over the sequence along
# the tensor axis; models mark it with `split_sequence`, gather it before column-parallel
# matmuls with `gather_sequence`, and give row-parallel matmuls `sequence_out`, so the
# tensor all-reduce becomes a reduce-scatter after them and an all-gather before.
_SEQUENCE: contextvars.ContextVar[tuple[Any, str, Any, bool] | None] = contextvars.ContextVar(
    "shardkit_sequence_parallel", default=None
)


@contextlib.contextmanager
def sequence_parallel(
    mesh: Any, axis: str = "tensor", batch: Sequence[str] = (), *, collective_matmul: bool = False
) -> Iterator[None]:
    """Turns on sequence parallelism over mesh axis `axis` for models traced inside; `batch`
    names the mesh axes the activations' batch dim is split over (kept as it is).
    `collective_matmul=True` makes `shardkit.overlap`'s matmuls rings whose transfers overlap
    their products.

    Raises:
        ValueError: `axis` or a `batch` name is not a mesh axis of `mesh`, or `axis` is also in
            `batch`."""
    batch = _checked_axes(mesh, axis, batch)
    token = _SEQUENCE.set((mesh, axis, batch, bool(collective_matmul)))
    try:
        yield
    finally:
        _SEQUENCE.reset(token)


def _checked_axes(mesh: Any, axis: str, batch: Sequence[str] | str) -> tuple[str, ...]:
    """`batch` as a tuple (a bare string is one mesh axis), once `axis` and `batch` are known
    to be distinct mesh axes of `mesh` (a misspelt `axis` turned sequence parallelism off
    without a word)."""
    batch = (batch,) if isinstance(batch, str) else tuple(batch)
    _check_names(mesh, (*batch, axis), f"sequence_parallel(axis={axis!r}, batch={batch})")
    return batch


# the batch axes of the activations while a vmap's spmd_axis_name holds the others
_BATCH: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "shardkit_sequence_batch", default=None
)


@contextlib.contextmanager
def sequence_batch(batch: Sequence[str]) -> Iterator[None]:
    """Within it, `sequence_parallel`'s activations have their batch dim split over `batch`
    only (under a `vmap` whose ``spmd_axis_name`` holds the other batch axes), whatever
    batch axes a `sequence_parallel` entered inside names."""
    token = _BATCH.set(tuple(batch))
    try:
        yield
    finally:
        _BATCH.reset(token)


def _sequence_spec(x: jax.Array, seq: str | None) -> tuple[Any, P, bool] | None:
    """(mesh, spec, explicit) laying `x` (B, T, ...) with its sequence dim as `seq`; None
    outside `sequence_parallel`, or when the sequence does not split evenly."""
    ctx = _SEQUENCE.get()
    if ctx is None or x.ndim < 3:
        return None
    mesh, axis, batch, _ = ctx
    batch = batch if _BATCH.get() is None else _BATCH.get()
    size = dict(mesh.shape).get(axis, 1)
    if size == 1 or x.shape[1] % size:
        return None
    # the axis types where the model is traced (an `auto_axes` region makes Explicit ones Auto)
    current = jax.sharding.get_abstract_mesh()
    where = mesh if current is None or current.empty else current
    explicit = dict(zip(where.axis_names, where.axis_types, strict=True)).get(axis) == (
        AxisType.Explicit
    )
    if explicit:  # the batch layout is part of the type: keep it
        current = getattr(jax.typeof(x).sharding, "spec", P())
        lead = current[0] if len(current) else None
    else:  # the batch axes, stated: left open, the compiler may move "tensor" onto the batch
        lead = batch[0] if len(batch) == 1 else (batch or None)
        if x.shape[0] % math.prod(dict(mesh.shape)[b] for b in batch):
            lead = None  # a batch the batch axes do not divide stays whole
    return mesh, P(lead, seq, *([None] * (x.ndim - 2))), explicit


@dataclasses.dataclass(frozen=True)
class SequenceLayout:
    """Where `sequence_layout` puts an activation (B, T, ...) under `sequence_parallel`.

    Attributes:
        mesh: the mesh of the step.
        axis: the tensor axis the sequence is split over.
        spec: the activation's layout with its sequence split (its batch dim as it is).
        explicit: whether `axis` is Explicit where the model is traced.
        collective_matmul: whether tensor-parallel matmuls run as overlapped rings.
    """

    mesh: Any
    axis: str
    spec: P
    explicit: bool
    collective_matmul: bool


def sequence_layout(x: jax.Array) -> SequenceLayout | None:
    """How `x` (B, T, ...) is laid out with its sequence split under `sequence_parallel`;
    None outside it, or when the sequence does not split evenly over the tensor axis."""
    ctx = _SEQUENCE.get()
    found = None if ctx is None else _sequence_spec(x, ctx[1])
    if found is None:
        return None
    return SequenceLayout(found[0], ctx[1], found[1], found[2], ctx[3])


def split_sequence(x: jax.Array) -> jax.Array:
    """`x` (B, T, D), the residual stream, split over the sequence along the tensor axis
    under `sequence_parallel`; `x` unchanged otherwise."""
    found = _sequence_spec(x, _SEQUENCE.get()[1] if _SEQUENCE.get() else None)
    return x if found is None else _lay(x, *found)


def gather_sequence(x: jax.Array) -> jax.Array:
    """`x` (B, T, D) with its whole sequence on every tensor rank (before a column-parallel
    matmul) under `sequence_parallel`; `x` unchanged otherwise."""
    found = _sequence_spec(x, None)
    return x if found is None else _lay(x, *found)


def split_heads(x: jax.Array, dim: int) -> jax.Array:
    """`x` (B, T, ...) with dim `dim` (heads, or the MLP's hidden units) split over the tensor
    axis and the sequence whole, under `sequence_parallel` on Auto axes; `x` otherwise.

    Pins the tensor-parallel region's layout so the backward pass keeps it too (its
    cotangents carry the same constraint): without it the compiler may move the split onto
    the sequence, the dim the stream around the region is split over, and pay all-to-alls.
    """
    found = _sequence_spec(x, None)
    if found is None or found[2] or x.shape[dim] % dict(found[0].shape)[_SEQUENCE.get()[1]]:
        return x
    mesh, spec, _ = found
    entries = list(spec)
    entries[dim] = _SEQUENCE.get()[1]
    return _lay(x, mesh, P(*entries), False)


def sequence_out(x: jax.Array, ndim: int) -> NamedSharding | None:
    """`out_sharding` of a row-parallel matmul on an Explicit mesh under `sequence_parallel`:
    the result (B, T, ...) of rank `ndim` split over the sequence (a reduce-scatter of the
    partial sums). None on Auto axes or outside `sequence_parallel`."""
    ctx = _SEQUENCE.get()
    if ctx is None or ndim < 3:
        return None
    found = _sequence_spec(x, ctx[1])  # x: the matmul's input, (B, T, ...) like the result
    if found is None or not found[2]:
        return None
    mesh, spec, _ = found
    return NamedSharding(mesh, P(*spec[:2], *([None] * (ndim - 2))))


def _lay(x: jax.Array, mesh: Any, spec: P, explicit: bool) -> jax.Array:
    if explicit:
        return jax.sharding.reshard(x, NamedSharding(mesh, spec))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
