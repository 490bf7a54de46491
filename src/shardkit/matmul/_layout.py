"""Layouts of a sharded product C = A @ B: validation, predicted collectives, helpers.

A layout is the pair of 2-D PartitionSpecs of A[M, K] and B[K, N] on one mesh, written as
tuples of two entries (a mesh axis name or None). Every algorithm module turns a layout into a
:class:`Method` (output spec, the collectives it will emit, peak memory) or raises
:class:`MatmulLayoutError` saying why the layout does not fit and what to change.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.collectives import bytes_moved
from shardkit.errors import ShardkitError
from shardkit.mesh import concrete_mesh

Spec = tuple[str | None, str | None]


class MatmulLayoutError(ShardkitError, ValueError):
    """The operands' shapes or shardings do not fit the requested matmul algorithm."""


@dataclasses.dataclass(frozen=True)
class MatmulCollective:
    """One kind of collective an algorithm emits.

    Attributes:
        kind: HLO name ("all-gather", "all-reduce", "reduce-scatter", "collective-permute").
        axis: the mesh axis it runs over.
        count: how many such instructions the compiled program holds.
        nbytes: bytes each device receives over all ``count`` instructions (ring model).
    """

    kind: str
    axis: str
    count: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Method:
    """How one algorithm computes a given layout: output spec, collectives, memory, FLOPs.

    Attributes:
        algorithm: algorithm name, as passed to ``matmul(..., algorithm=)``.
        out_spec: PartitionSpec entries of the result C[M, N].
        collectives: the collectives the compiled program holds.
        peak_bytes: predicted peak per-device bytes (operands, output, live temporaries).
        flops: per-device floating point operations of the local products.
        detail: one line saying what the algorithm does for this layout.
    """

    algorithm: str
    out_spec: Spec
    collectives: tuple[MatmulCollective, ...]
    peak_bytes: int
    flops: int
    detail: str
    # Hashable description of the steps, read by the kernel that runs this method.
    recipe: tuple = ()

    @property
    def comm_bytes(self) -> int:
        """Bytes received per device, summed over all collectives."""
        return sum(c.nbytes for c in self.collectives)

    def counts(self) -> dict[str, int]:
        """Number of HLO instructions per collective kind."""
        out: dict[str, int] = {}
        for c in self.collectives:
            out[c.kind] = out.get(c.kind, 0) + c.count
        return out


@dataclasses.dataclass(frozen=True)
class MatmulLayout:
    """Shapes, dtype and specs of one product C[M, N] = A[M, K] @ B[K, N] on a mesh."""

    mesh: Mesh
    m: int
    k: int
    n: int
    itemsize: int
    a_spec: Spec
    b_spec: Spec

    def size(self, axis: str | None) -> int:
        """Size of a mesh axis; 1 for None."""
        return 1 if axis is None else int(self.mesh.shape[axis])

    def local_bytes(self, rows: int, cols: int, spec: Spec) -> int:
        """Per-device bytes of a [rows, cols] array with ``spec``."""
        return rows // self.size(spec[0]) * (cols // self.size(spec[1])) * self.itemsize

    @property
    def a_bytes(self) -> int:
        return self.local_bytes(self.m, self.k, self.a_spec)

    @property
    def b_bytes(self) -> int:
        return self.local_bytes(self.k, self.n, self.b_spec)

    def c_bytes(self, spec: Spec) -> int:
        return self.local_bytes(self.m, self.n, spec)

    def flops(self, a_spec: Spec, b_spec: Spec) -> int:
        """Per-device FLOPs of the local product of operands held as ``a_spec`` x ``b_spec``."""
        m = self.m // self.size(a_spec[0])
        n = self.n // self.size(b_spec[1])
        k = self.k // max(self.size(a_spec[1]), self.size(b_spec[0]))
        return 2 * m * k * n


def fmt_spec(spec: Sequence[str | None]) -> str:
    """``('x', None)`` -> ``P('x', None)``."""
    return "P(" + ", ".join(repr(e) for e in spec) + ")"


def fmt_layout(name: str, spec: Spec, dims: tuple[str, str]) -> str:
    """Scaling-book notation: ``A[M_x, K]``."""
    parts = [d if s is None else f"{d}_{s}" for d, s in zip(dims, spec, strict=True)]
    return f"{name}[{', '.join(parts)}]"


def normalize_spec(spec: object, *, name: str, mesh: Mesh) -> Spec:
    """Turns a PartitionSpec (or tuple) of a 2-D operand into a 2-tuple of axis names.

    Raises:
        MatmulLayoutError: the spec is a string, names a mesh axis the mesh lacks, has more
            than two entries, or puts several mesh axes on one dim.
    """
    if isinstance(spec, str):  # tuple('model') would be five one-letter axis names
        raise MatmulLayoutError(
            f"{name}: spec is the string {spec!r}, not a PartitionSpec; fix: "
            f"P({spec!r}, None) to shard rows over it, or P(None, {spec!r}) for columns."
        )
    entries = tuple(spec) if spec is not None else ()
    if len(entries) > 2:
        raise MatmulLayoutError(
            f"{name}: spec {fmt_spec(entries)} has {len(entries)} entries but a matmul operand "
            "is 2-D; fix: pass a spec with at most two entries, e.g. P('x', None)."
        )
    out: list[str | None] = []
    for e in entries + (None,) * (2 - len(entries)):
        if isinstance(e, tuple):
            if len(e) > 1:
                raise MatmulLayoutError(
                    f"{name}: spec {fmt_spec(entries)} shards one dim over several mesh axes "
                    f"{e}; shardkit's matmul kernels take one mesh axis per dim; fix: use "
                    "algorithm='gspmd', or reshape the mesh so one mesh axis covers those devices."
                )
            e = e[0] if e else None
        if e is not None and e not in mesh.shape:
            raise MatmulLayoutError(
                f"{name}: spec {fmt_spec(entries)} names mesh axis {e!r}, but the mesh has "
                f"mesh axes {dict(mesh.shape)}; fix: use one of {tuple(mesh.axis_names)} or None."
            )
        out.append(e)
    return (out[0], out[1])


def check_divisible(shape: tuple[int, int], spec: Spec, mesh: Mesh, *, name: str) -> None:
    """Raises MatmulLayoutError when a dim is not divisible by its mesh axis size."""
    for d, (size, axis) in enumerate(zip(shape, spec, strict=True)):
        if axis is not None and size % mesh.shape[axis]:
            raise MatmulLayoutError(
                f"{name}: dim {d} has size {size}, not divisible by mesh axis {axis!r} of size "
                f"{mesh.shape[axis]} (shape {shape}, spec {fmt_spec(spec)}); fix: pad dim {d} "
                f"to a multiple of {mesh.shape[axis]} or leave it unsharded (None)."
            )


def _sharding_of(x: object, name: str) -> NamedSharding | None:
    """The NamedSharding of an array, ShapeDtypeStruct or (Explicit-axes) tracer, else None."""
    if isinstance(x, jax.core.Tracer):
        s = jax.typeof(x).sharding
        if not isinstance(s, NamedSharding) or not s.mesh.axis_names:
            return None
        if any(t != AxisType.Explicit for t in s.mesh.axis_types):
            raise MatmulLayoutError(
                f"{name} is traced (inside jax.jit, jax.grad or jax.vmap) on a mesh with Auto axes "
                f"{dict(s.mesh.shape)}, where its layout is not part of its type; fix: call "
                "shardkit.matmul outside jit, or use a mesh with Explicit axes "
                "(jax.make_mesh's default)."
            )
        return s
    s = getattr(x, "sharding", None)
    return s if isinstance(s, NamedSharding) else None


def layout_of(
    a: jax.Array | jax.ShapeDtypeStruct,
    b: jax.Array | jax.ShapeDtypeStruct,
    *,
    mesh: Mesh | None = None,
    a_spec: object = None,
    b_spec: object = None,
) -> MatmulLayout:
    """Reads and validates the layout of A @ B from the operands' NamedShardings.

    Raises:
        MatmulLayoutError: operands that are not arrays, non-2-D operands, mismatched inner
            dims, no mesh, operands on different meshes, unknown mesh axes, indivisible dims.
    """
    for name, x in (("A", a), ("B", b)):
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise MatmulLayoutError(
                f"{name} is a {type(x).__name__}, not an array; fix: pass a jax.Array (e.g. "
                f"jax.device_put(jnp.asarray({name}), NamedSharding(mesh, P('x', None)))) or a "
                "jax.ShapeDtypeStruct."
            )
        if len(x.shape) != 2:
            raise MatmulLayoutError(
                f"{name} has shape {tuple(x.shape)}; matmul takes 2-D operands; fix: reshape "
                f"{name} to 2-D (fold batch dims into rows) or use jnp.matmul for batched products."
            )
    if a.shape[1] != b.shape[0]:
        raise MatmulLayoutError(
            f"inner dims differ: A has shape {tuple(a.shape)} and B has shape {tuple(b.shape)} "
            f"(A.shape[1]={a.shape[1]} != B.shape[0]={b.shape[0]}); fix: transpose one operand "
            "or pass matrices whose inner dims match."
        )
    sa_, sb_ = _sharding_of(a, "A"), _sharding_of(b, "B")
    meshes = [s.mesh for s in (sa_, sb_) if s is not None]
    given = mesh
    if mesh is None:
        if not meshes:
            traced = any(isinstance(x, jax.core.Tracer) for x in (a, b))
            where = (
                "inside jax.jit, where only Explicit mesh axes carry a layout in the type"
                if traced
                else "so there is no mesh to run on"
            )
            raise MatmulLayoutError(
                f"neither A nor B has a NamedSharding, {where}; fix: "
                "jax.device_put(A, NamedSharding(mesh, P('x', None))) first (on a mesh with "
                "Explicit axes when calling inside jit)."
            )
        mesh = concrete_mesh(meshes[0])  # jax.set_mesh's, for a tracer's abstract mesh
    for s in (sa_, sb_):
        if s is not None and not _same_mesh(s.mesh, mesh):
            where = {"A": sa_, "B": sb_}
            shown = ", ".join(f"{k}: {_describe(v.mesh)}" for k, v in where.items() if v)
            if given is not None:
                shown += f", mesh=: {_describe(given)}"
            raise MatmulLayoutError(
                f"A and B live on different meshes ({shown}); fix: jax.device_put both "
                "operands with NamedShardings on the same mesh."
            )

    def spec_of(s: NamedSharding | None, given: object) -> object:
        if given is not None:
            return given
        return s.spec if s is not None else P()

    sa = normalize_spec(spec_of(sa_, a_spec), name="A", mesh=mesh)
    sb = normalize_spec(spec_of(sb_, b_spec), name="B", mesh=mesh)
    check_divisible(tuple(a.shape), sa, mesh, name="A")
    check_divisible(tuple(b.shape), sb, mesh, name="B")
    dtype = jnp.result_type(a.dtype, b.dtype)
    return MatmulLayout(mesh, a.shape[0], a.shape[1], b.shape[1], dtype.itemsize, sa, sb)


def _device_ids(mesh: Any) -> tuple[int, ...] | None:
    """The ids of a concrete mesh's devices in mesh order; None for an abstract mesh."""
    try:
        return tuple(int(d.id) for d in mesh.devices.flat)
    except Exception:  # noqa: BLE001 - an AbstractMesh (inside jit) has no devices
        return None


def _same_mesh(m: Any, n: Any) -> bool:
    """Same axis names and sizes, and the same devices where both meshes have them."""
    ids = _device_ids(m), _device_ids(n)
    same_devices = None in ids or ids[0] == ids[1]
    return m.axis_names == n.axis_names and dict(m.shape) == dict(n.shape) and same_devices


def _describe(mesh: Any) -> str:
    ids = _device_ids(mesh)
    return f"{dict(mesh.shape)}" + ("" if ids is None else f" on devices {list(ids)}")


def pspec(spec: Sequence[str | None]) -> P:
    """The PartitionSpec of a layout tuple, one entry per dim: ``('x', None)`` -> P('x', None).

    JAX itself returns either form (``P('x',)`` or ``P('x', None)``) for the same layout, and
    NamedShardings with the two forms compare unequal: compare layouts with
    ``sharding.is_equivalent_to(other, ndim)``.
    """
    return P(*spec)


def ring_bytes(kind: str, local: int, p: int) -> int:
    """Bytes one device receives in a ring collective over p devices.

    ``local`` is the per-device input for all-gather (output p times larger) and the
    per-device input for all-reduce / reduce-scatter (the full partial sum).
    """
    full = local * p if kind == "all-gather" else local
    return int(bytes_moved(kind, full, p))  # the shared formulas (shardkit.collectives)


def lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


Layout = MatmulLayout  # its name in earlier releases (shardkit.layout has a Layout too)
