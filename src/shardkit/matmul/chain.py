"""Matrix-chain planner: parenthesization and intermediate shardings with the fewest bytes moved.

For a product M_0 @ M_1 @ ... @ M_{n-1} of sharded matrices on one mesh, every intermediate
product can be left in any layout (each dim on one mesh axis or none), and every product can be
done by any fitting algorithm. :func:`chain` runs a dynamic program over intervals and result
layouts, the classic matrix-chain recurrence with layouts added to the state:

    best[i, j, s] = min over k, s_l, s_r of best[i, k, s_l] + best[k+1, j, s_r]
                    + cost(M_i..k as s_l  @  M_k+1..j as s_r  ->  s)

where ``cost`` is the cheapest hand-written algorithm for that product (bytes moved per device,
then FLOPs, then peak memory). The result is a :class:`ChainPlan`: the tree, each product's
algorithm and predicted collectives, and a jitted function that runs exactly that.

Example (seed 004, exercise 3.3): with A row-sharded and B, C, D replicated, A·B·C·D needs no
collective at all; with all four row-sharded the planner finds the cheapest gathers:

    >>> plan = shardkit.matmul.chain([A, B, C, D])
    >>> print(plan)
    >>> E = plan(A, B, C, D)
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitTypeError
from shardkit.matmul._layout import (
    MatmulLayout,
    MatmulLayoutError,
    Method,
    Spec,
    check_divisible,
    fmt_spec,
    layout_of,
    normalize_spec,
    pspec,
)
from shardkit.matmul.api import kernel
from shardkit.matmul.cost import choose

__all__ = ["ChainPlan", "ChainStep", "candidate_specs", "chain", "gspmd_chain", "product_method"]

Tree = int | tuple  # a leaf index, or (left, right)


@dataclasses.dataclass(frozen=True)
class ChainStep:
    """One product of the plan: ``left @ right`` (subtrees), how, and what it emits."""

    left: Tree
    right: Tree
    layout: MatmulLayout
    method: Method


def candidate_specs(mesh: Mesh, rows: int, cols: int) -> list[Spec]:
    """Every layout of a [rows, cols] matrix with at most one mesh axis per dim, dividing it."""
    names = [None, *mesh.axis_names]
    out = []
    for r, c in itertools.product(names, names):
        if r is not None and r == c:
            continue
        if (r is None or rows % mesh.shape[r] == 0) and (c is None or cols % mesh.shape[c] == 0):
            out.append((r, c))
    return out


@functools.lru_cache(maxsize=65536)
def _method(mesh: Mesh, m: int, k: int, n: int, isz: int, sa: Spec, sb: Spec, so: Spec) -> Method:
    return choose(MatmulLayout(mesh, m, k, n, isz, sa, sb), so)


def product_method(layout: MatmulLayout, out: Spec) -> Method:
    """The cheapest hand-written algorithm for one product into layout ``out`` (cached)."""
    L = layout
    return _method(L.mesh, L.m, L.k, L.n, L.itemsize, L.a_spec, L.b_spec, out)


def _key(m: Method) -> tuple:
    return (m.comm_bytes, m.flops, m.peak_bytes)


@dataclasses.dataclass(frozen=True)
class ChainPlan:
    """A parenthesization of a matrix chain with the layout and algorithm of every product.

    Attributes:
        tree: nested pairs of operand indices, e.g. ``((0, 1), (2, 3))``.
        steps: the products in execution order.
        out_spec: the layout of the result.
        comm_bytes: bytes each device receives over all products (ring model).
        flops: per-device FLOPs over all products.
        mesh: the mesh.

    Call it with the operands (same shapes and shardings as planned) to run it.
    """

    tree: Tree
    steps: tuple[ChainStep, ...]
    out_spec: Spec
    comm_bytes: int
    flops: int
    mesh: Mesh
    in_specs: tuple[Spec, ...]

    def counts(self) -> dict[str, int]:
        """Predicted collective executions per kind, over all products."""
        out: dict[str, int] = {}
        for s in self.steps:
            for kind, n in s.method.counts().items():
                out[kind] = out.get(kind, 0) + n
        return out

    @functools.cached_property
    def function(self) -> Callable[..., jax.Array]:
        """The jitted function running the plan: each product with its planned kernel."""
        steps = self.steps

        def run(*xs):
            vals: dict = {i: x for i, x in enumerate(xs)}
            for s in steps:
                a, b = vals[s.left], vals[s.right]
                dtype = jnp.dtype(jnp.result_type(a.dtype, b.dtype))
                vals[(s.left, s.right)] = kernel(s.layout, s.method, dtype)(a, b)
            return vals[self.tree]

        shardings = tuple(NamedSharding(self.mesh, pspec(s)) for s in self.in_specs)
        return jax.jit(
            run,
            in_shardings=shardings,
            out_shardings=NamedSharding(self.mesh, pspec(self.out_spec)),
        )

    def __call__(self, *arrays: jax.Array) -> jax.Array:
        if len(arrays) != len(self.in_specs):
            raise ShardkitTypeError(
                f"this plan multiplies {len(self.in_specs)} matrices but got {len(arrays)}; "
                "fix: pass the same matrices that were planned, in order."
            )
        return self.function(*arrays)

    def __str__(self) -> str:
        def name(t: Tree) -> str:
            if isinstance(t, int):
                return chr(ord("A") + t) if t < 26 else f"M{t}"
            return f"({name(t[0])}·{name(t[1])})"

        lines = [
            f"chain plan {name(self.tree)} on mesh {dict(self.mesh.shape)}:",
            f"  {self.comm_bytes:,} bytes moved per device, {self.flops:,} FLOPs per device",
        ]
        for s in self.steps:
            L, m = s.layout, s.method
            coll = ", ".join(f"{v} {k}" for k, v in m.counts().items()) or "no collectives"
            lines.append(
                f"  {name(s.left)} {fmt_spec(L.a_spec)} @ {name(s.right)} {fmt_spec(L.b_spec)}"
                f" -> {fmt_spec(m.out_spec)}: {m.algorithm}, {coll}, {m.comm_bytes:,} bytes"
            )
        return "\n".join(lines)


def chain(
    arrays: Sequence[jax.Array | jax.ShapeDtypeStruct],
    *,
    out_spec: object = None,
    mesh: Mesh | None = None,
) -> ChainPlan:
    """Plans ``arrays[0] @ arrays[1] @ ...`` with the fewest bytes moved, then FLOPs.

    Args:
        arrays: two or more 2-D matrices, sharded arrays or ``jax.ShapeDtypeStruct`` with a
            NamedSharding (planning never needs real data).
        out_spec: the layout wanted for the result; None lets the planner pick the cheapest.
        mesh: the mesh, when no operand carries a NamedSharding.

    Returns:
        A :class:`ChainPlan`; ``plan(*arrays)`` runs it, ``print(plan)`` shows each product's
        layout, algorithm and collectives.

    Raises:
        MatmulLayoutError: fewer than two matrices, inner dims that do not match, specs naming
            unknown mesh axes, an ``out_spec`` that does not divide the result.

    Example:
        >>> plan = shardkit.matmul.chain([A, B, C, D])   # A P('x', None), the rest P()
        >>> plan.tree, plan.comm_bytes
        ((((0, 1), 2), 3), 0)

    See also: :func:`gspmd_chain` (the compiler's left-to-right product, to compare).
    """
    if len(arrays) < 2:
        raise MatmulLayoutError(
            f"chain needs at least two matrices, got {len(arrays)}; fix: pass a list such as "
            "[A, B, C, D]."
        )
    layouts = [layout_of(arrays[i], arrays[i + 1], mesh=mesh) for i in range(len(arrays) - 1)]
    mesh = layouts[0].mesh
    for lay in layouts[1:]:
        if lay.mesh.shape != mesh.shape or lay.mesh.axis_names != mesh.axis_names:
            raise MatmulLayoutError(
                "the matrices of a chain live on different meshes; fix: jax.device_put all of "
                "them with NamedShardings on one mesh."
            )
    specs = [layouts[0].a_spec] + [lay.b_spec for lay in layouts]
    dims = [arrays[0].shape[0]] + [a.shape[1] for a in arrays]
    isz = max(lay.itemsize for lay in layouts)
    n = len(arrays)
    want = None
    if out_spec is not None:
        want = normalize_spec(out_spec, name="out_spec", mesh=mesh)
        check_divisible((dims[0], dims[n]), want, mesh, name="out_spec (result)")

    # best[(i, j)][spec] = (key, tree, steps)
    best: dict[tuple[int, int], dict[Spec, tuple]] = {}
    for i in range(n):
        best[(i, i)] = {specs[i]: ((0, 0, 0), i, ())}
    for length in range(2, n + 1):
        for i in range(n - length + 1):
            j = i + length - 1
            cell: dict[Spec, tuple] = {}
            outs = candidate_specs(mesh, dims[i], dims[j + 1])
            if want is not None and (i, j) == (0, n - 1):
                outs = [want]
            for k in range(i, j):
                for sl, (kl, tl, stl) in best[(i, k)].items():
                    for sr, (kr, tr, str_) in best[(k + 1, j)].items():
                        lay = MatmulLayout(mesh, dims[i], dims[k + 1], dims[j + 1], isz, sl, sr)
                        for so in outs:
                            m = product_method(lay, so)
                            key = tuple(a + b + c for a, b, c in zip(kl, kr, _key(m), strict=True))
                            if so not in cell or key < cell[so][0]:
                                step = ChainStep(tl, tr, lay, m)
                                cell[so] = (key, (tl, tr), stl + str_ + (step,))
            best[(i, j)] = cell
    final = best[(0, n - 1)]
    spec, (key, tree, steps) = min(final.items(), key=lambda kv: kv[1][0])
    return ChainPlan(tree, steps, spec, key[0], key[1], mesh, tuple(specs))


def gspmd_chain(arrays: Sequence[jax.Array | jax.ShapeDtypeStruct], *, out_spec: object = None):
    """Compiles the naive left-to-right ``((A @ B) @ C) @ ...`` under ``jax.jit`` (GSPMD).

    The operands keep their specs and the result gets ``out_spec`` (default replicated); every
    intermediate layout and collective is the compiler's choice. It compiles on an Auto copy of
    the mesh (same devices), since Explicit mesh axes refuse products whose contracting dims
    are sharded on both sides. Use it to compare a :class:`ChainPlan` with the default.

    Returns:
        The compiled program (``jax.stages.Compiled``); audit it with
        ``shardkit.inspection.inspect(compiled)``.
    """
    mesh0 = arrays[0].sharding.mesh
    names = mesh0.axis_names
    mesh = Mesh(mesh0.devices, names, axis_types=(AxisType.Auto,) * len(names))
    out = P() if out_spec is None else pspec(out_spec)
    args = [
        jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, a.sharding.spec))
        for a in arrays
    ]

    def run(*xs):
        return functools.reduce(jnp.matmul, xs)

    return jax.jit(run, out_shardings=NamedSharding(mesh, out)).lower(*args).compile()
