"""The four sharding cases of a matmul, by hand with ``shard_map``, and by the compiler.

For C[M, N] = A[M, K] @ B[K, N] (scaling-book notation, ``A[M_X, K]`` = rows over mesh axis X):

1. no contracting dim sharded: each device multiplies its blocks, no communication;
2. one operand sharded on K: all-gather it along K first (``"allgather"``);
3. both operands sharded on K over the same mesh axis X: local products give a partial sum
   ``C{U_X}``, then an all-reduce, or a reduce-scatter when the output is sharded over X
   (``"reduce_scatter"``);
4. the same mesh axis on M of A and N of B: all-gather one of them (the smaller by default).

``"allgather"`` handles every layout (it gathers whatever stands in the way); its output is then
gathered or sliced to ``out_spec``. ``"gspmd"`` leaves all of it to the compiler.

Example:
    >>> A = jax.device_put(a, NamedSharding(mesh, P("x", None)))
    >>> B = jax.device_put(b, NamedSharding(mesh, P("x", None)))
    >>> fit_allgather(layout_of(A, B), None).counts()
    {'all-gather': 1}
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, NamedSharding

from shardkit.matmul._layout import (
    MatmulCollective,
    MatmulLayout,
    MatmulLayoutError,
    Method,
    Spec,
    fmt_layout,
    fmt_spec,
    pspec,
    ring_bytes,
)

__all__ = ["fit_allgather", "fit_gspmd", "fit_reduce_scatter", "run_recipe"]


def _check_out(out: Spec) -> None:
    if out[0] is not None and out[0] == out[1]:
        raise MatmulLayoutError(
            f"out_spec {fmt_spec(out)} uses mesh axis {out[0]!r} on both dims; fix: shard "
            f"one dim of C over it, e.g. P({out[0]!r}, None)."
        )


def _fix_output(L: MatmulLayout, nat: Spec, out: Spec, coll: list, recipe: list) -> int:
    """Gathers then slices C from ``nat`` to ``out``; returns the peak extra bytes."""
    cur = list(nat)
    extra = 0
    for d in (0, 1):
        if cur[d] is not None and cur[d] != out[d]:
            before = L.c_bytes(tuple(cur))
            coll.append(
                MatmulCollective(
                    "all-gather", cur[d], 1, ring_bytes("all-gather", before, L.size(cur[d]))
                )
            )
            recipe.append(("gather", "C", d, cur[d]))
            cur[d] = None
            extra = max(extra, L.c_bytes(tuple(cur)))
    for d in (0, 1):
        if out[d] is not None and cur[d] is None:
            if out[d] in cur:
                raise MatmulLayoutError(
                    f"out_spec {fmt_spec(out)} cannot be reached from the product's layout "
                    f"{fmt_spec(nat)} by gathering and slicing; fix: use algorithm='gspmd'."
                )
            recipe.append(("slice", "C", d, out[d]))
            cur[d] = out[d]
    return extra


def fit_allgather(L: MatmulLayout, out: Spec | None) -> Method:
    """Cases 1, 2 and 4: all-gather what blocks a local product, multiply, fix the output.

    Raises:
        MatmulLayoutError: ``out`` names one mesh axis twice.
    """
    (am, ak), (bk, bn) = L.a_spec, L.b_spec
    coll: list[MatmulCollective] = []
    recipe: list[tuple] = []
    a2, b2 = [am, ak], [bk, bn]
    peak = L.a_bytes + L.b_bytes
    notes = []
    if ak is not None:
        coll.append(
            MatmulCollective("all-gather", ak, 1, ring_bytes("all-gather", L.a_bytes, L.size(ak)))
        )
        recipe.append(("gather", "A", 1, ak))
        a2[1] = None
        notes.append(f"all-gather A over {ak!r} on K")
    if bk is not None:
        coll.append(
            MatmulCollective("all-gather", bk, 1, ring_bytes("all-gather", L.b_bytes, L.size(bk)))
        )
        recipe.append(("gather", "B", 0, bk))
        b2[0] = None
        notes.append(f"all-gather B over {bk!r} on K")
    if am is not None and am == bn:
        a_now = L.local_bytes(L.m, L.k, tuple(a2))
        b_now = L.local_bytes(L.k, L.n, tuple(b2))
        gather_a = out[1] == am if out is not None and am in out else a_now <= b_now
        if gather_a:
            coll.append(
                MatmulCollective("all-gather", am, 1, ring_bytes("all-gather", a_now, L.size(am)))
            )
            recipe.append(("gather", "A", 0, am))
            a2[0] = None
            notes.append(f"all-gather A over {am!r} on M (case 4)")
        else:
            coll.append(
                MatmulCollective("all-gather", bn, 1, ring_bytes("all-gather", b_now, L.size(bn)))
            )
            recipe.append(("gather", "B", 1, bn))
            b2[1] = None
            notes.append(f"all-gather B over {bn!r} on N (case 4)")
    if a2 != [am, ak]:
        peak += L.local_bytes(L.m, L.k, tuple(a2))
    if b2 != [bk, bn]:
        peak += L.local_bytes(L.k, L.n, tuple(b2))
    recipe.append(("dot",))
    nat: Spec = (a2[0], b2[1])
    out = nat if out is None else out
    _check_out(out)
    peak += L.c_bytes(nat)
    peak += _fix_output(L, nat, out, coll, recipe)
    if out != nat:
        peak += L.c_bytes(out)
    detail = ", ".join(notes) if notes else "local product (case 1), no communication"
    return Method(
        "allgather",
        out,
        tuple(coll),
        peak,
        L.flops(tuple(a2), tuple(b2)),
        detail,
        tuple(recipe),
    )


def fit_reduce_scatter(L: MatmulLayout, out: Spec | None) -> Method:
    """Case 3: local products of K-blocks, then reduce-scatter (or all-reduce) over that axis.

    An operand not sharded on K is sliced locally on K, which costs no communication.

    Raises:
        MatmulLayoutError: K is sharded over no mesh axis, or over different mesh axes in A and
            B, or that mesh axis already shards M or N, or ``out`` cannot be reached.
    """
    (am, ak), (bk, bn) = L.a_spec, L.b_spec
    a_txt, b_txt = fmt_layout("A", L.a_spec, ("M", "K")), fmt_layout("B", L.b_spec, ("K", "N"))
    if ak is None and bk is None:
        raise MatmulLayoutError(
            f"algorithm='reduce_scatter' needs the contracting dim K sharded, but {a_txt} and "
            f"{b_txt} leave K whole; fix: algorithm='allgather' (no communication needed here), "
            "or shard K: A P(None, 'x') and B P('x', None)."
        )
    if ak is not None and bk is not None and ak != bk:
        raise MatmulLayoutError(
            f"algorithm='reduce_scatter': K is sharded over different mesh axes in {a_txt} "
            f"({ak!r}, size {L.size(ak)}) and {b_txt} ({bk!r}, size {L.size(bk)}); fix: shard "
            "K of both operands over the same mesh axis, or use algorithm='allgather'."
        )
    x = ak if ak is not None else bk
    if x in (am, bn) or (am is not None and am == bn):
        raise MatmulLayoutError(
            f"algorithm='reduce_scatter' cannot split K over mesh axis {x!r} in {a_txt} @ "
            f"{b_txt}: a mesh axis would shard two dims of one product; fix: "
            "algorithm='allgather', or keep M and N off that mesh axis."
        )
    coll: list[MatmulCollective] = []
    recipe: list[tuple] = []
    if ak is None:
        recipe.append(("slice", "A", 1, x))
    if bk is None:
        recipe.append(("slice", "B", 0, x))
    recipe.append(("dot",))
    nat = [am, bn]
    partial_bytes = L.c_bytes((am, bn))
    if out is None:
        out = (x, bn) if am is None else (am, x) if bn is None else (am, bn)
    _check_out(out)
    if x in out and nat[out.index(x)] is None:
        d = out.index(x)
        coll.append(
            MatmulCollective(
                "reduce-scatter", x, 1, ring_bytes("reduce-scatter", partial_bytes, L.size(x))
            )
        )
        recipe.append(("psum_scatter", "C", d, x))
        nat[d] = x
        detail = f"local K-block products, reduce-scatter over {x!r} on dim {d} (case 3)"
    else:
        coll.append(
            MatmulCollective("all-reduce", x, 1, ring_bytes("all-reduce", partial_bytes, L.size(x)))
        )
        recipe.append(("psum", "C", 0, x))
        detail = f"local K-block products, all-reduce over {x!r} (case 3)"
    nat_t: Spec = (nat[0], nat[1])
    peak = L.a_bytes + L.b_bytes + partial_bytes + L.c_bytes(nat_t)
    if nat_t[1] == x and (am, bn)[1] is None:  # scattering columns transposes the partial sum
        peak += partial_bytes
    peak += _fix_output(L, nat_t, out, coll, recipe)
    a_used = (am, x)
    b_used = (x, bn)
    return Method(
        "reduce_scatter",
        out,
        tuple(coll),
        peak,
        L.flops(a_used, b_used),
        detail,
        tuple(recipe),
    )


def fit_gspmd(L: MatmulLayout, out: Spec | None) -> Method:
    """``jnp.matmul`` under ``jax.jit`` with the output sharding given; the compiler communicates.

    Its collectives are whatever the partitioner picks, so none are predicted here.
    """
    (am, _), (_, bn) = L.a_spec, L.b_spec
    if out is None:
        out = (am, bn) if am != bn or am is None else (am, None)
    _check_out(out)
    return Method(
        "gspmd",
        out,
        (),
        L.a_bytes + L.b_bytes + L.c_bytes(out),
        L.flops(L.a_spec, L.b_spec),
        "jnp.matmul under jit; the compiler (GSPMD/Shardy) inserts the collectives",
        (("gspmd",),),
    )


def _local_dot(a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    return jnp.dot(
        a.astype(dtype),
        b.astype(dtype),
        precision=lax.Precision.HIGHEST,
        preferred_element_type=dtype,
    )


def _slice(x: jax.Array, dim: int, axis: str, p: int) -> jax.Array:
    size = x.shape[dim] // p
    return lax.dynamic_slice_in_dim(x, lax.axis_index(axis) * size, size, axis=dim)


def run_recipe(
    L: MatmulLayout, method: Method, dtype
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """Builds the jitted function ``(A, B) -> C`` that runs ``method`` on layout ``L``."""
    mesh, out = L.mesh, method.out_spec
    if method.recipe == (("gspmd",),):
        out_sharding = NamedSharding(mesh, pspec(out))
        explicit = all(t == AxisType.Explicit for t in mesh.axis_types)

        def gspmd(a, b):
            a, b = a.astype(dtype), b.astype(dtype)
            if explicit:
                return jnp.matmul(a, b, out_sharding=out_sharding, precision=lax.Precision.HIGHEST)
            c = jnp.matmul(a, b, precision=lax.Precision.HIGHEST)
            return lax.with_sharding_constraint(c, out_sharding)

        return jax.jit(gspmd, out_shardings=out_sharding)

    def body(a, b):
        vals = {"A": a, "B": b}
        for step in method.recipe:
            if step[0] == "dot":
                vals["C"] = _local_dot(vals["A"], vals["B"], dtype)
                continue
            op, name, dim, axis = step
            x = vals[name]
            if op == "gather":
                x = lax.all_gather(x, axis, axis=dim, tiled=True)
            elif op == "slice":
                x = _slice(x, dim, axis, L.size(axis))
            elif op == "psum":
                x = lax.psum(x, axis)
            elif op == "psum_scatter":
                x = lax.psum_scatter(x, axis, scatter_dimension=dim, tiled=True)
            else:  # pragma: no cover - recipes are built in this module
                raise AssertionError(op)
            vals[name] = x
        return vals["C"]

    f = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(pspec(L.a_spec), pspec(L.b_spec)),
        out_specs=pspec(out),
        check_vma=False,
    )
    return jax.jit(f, out_shardings=NamedSharding(mesh, pspec(out)))
