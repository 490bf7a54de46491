"""MatmulCollective matmul: all-gather-matmul and matmul-reduce-scatter as ``ppermute`` rings.

Instead of gathering a whole operand and then multiplying, each device multiplies the block it
holds while the next block travels to it around a ring over mesh axis X of size P; after P-1
steps every block has passed. Each step's transfer is independent of that step's product, so
the compiler may overlap them. The steps are a loop, so no device ever holds more than the block
in use and the block in flight (two halves each way when bidirectional), plus one tile of the
product it is adding (see :mod:`shardkit.matmul._tiles`).

Three forms, picked from the layout (scaling-book notation):

- ``A[M_X, K] @ B[K, N_X]`` (case 4): blocks of A (or B) travel; C is ``[M, N_X]``
  (or ``[M_X, N]``).
- ``A[M, K_X] @ B[K, N]`` or ``A[M, K] @ B[K_X, N]`` (case 2): the K-sharded operand travels;
  each device accumulates its C block.
- ``A[M, K_X] @ B[K_X, N]`` (case 3), C scattered over X: partial sums travel and each device
  adds its own contribution to the block passing by (matmul-reduce-scatter).

``bidirectional=True`` splits every block in halves that travel in opposite directions
(2(P-1) collective-permutes of half the bytes, so each link direction carries half).

Example:
    >>> C = matmul(A, B, algorithm="collective")        # A P('x', None), B P(None, 'x')
    >>> C.sharding.spec
    P(None, 'x')
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding

from shardkit.matmul._layout import (
    MatmulCollective,
    MatmulLayout,
    MatmulLayoutError,
    Method,
    Spec,
    fmt_layout,
    fmt_spec,
    pspec,
)
from shardkit.matmul._tiles import add_product, tile_count
from shardkit.rings import ring_gather, ring_reduce_scatter

__all__ = ["build_collective", "fit_collective"]


def _no_fit(L: MatmulLayout, why: str, fix: str) -> MatmulLayoutError:
    a = fmt_layout("A", L.a_spec, ("M", "K"))
    b = fmt_layout("B", L.b_spec, ("K", "N"))
    return MatmulLayoutError(f"algorithm='collective' does not fit {a} @ {b}: {why}; fix: {fix}")


def fit_collective(L: MatmulLayout, out: Spec | None, *, bidirectional: bool = False) -> Method:
    """Picks the ring form for a layout and predicts its collective-permutes and memory.

    Raises:
        MatmulLayoutError: the layout needs no communication, or mixes mesh axes in a way no
            ring form covers, or ``out`` differs from the form's output, or a travelling block
            cannot be halved for ``bidirectional=True``.
    """
    (am, ak), (bk, bn) = L.a_spec, L.b_spec
    form, x = _ring_form(L, out)
    p = L.size(x)
    nat, panel, extent = _ring_output(L, form, x)
    if out is not None and out != nat:
        raise _no_fit(
            L,
            f"its ring gives C as {fmt_spec(nat)}, not out_spec={fmt_spec(out)}",
            f"out_spec={fmt_spec(nat)}, or algorithm='allgather' for other outputs",
        )
    if bidirectional and extent % 2:
        raise _no_fit(
            L,
            f"bidirectional=True halves each travelling block, but its dim has "
            f"{extent} rows/cols (odd)",
            "bidirectional=False, or an even block size",
        )
    n_perm = (p - 1) * (2 if bidirectional else 1)
    coll = (MatmulCollective("collective-permute", x, n_perm, panel * (p - 1)),) if p > 1 else ()
    a_used = (am, x if form.startswith("rs") and ak is None else ak)
    b_used = (x if form.startswith("rs") and bk is None else bk, bn)
    if form.startswith("ag"):
        a_used = (None if form == "ag_a_rows" else am, None if form == "ag_a_k" else ak)
        b_used = (None if form == "ag_b_k" else bk, None if form == "ag_b_cols" else bn)
    # Live per device: own blocks, output, the block in use and the block in flight, plus what
    # one step adds (`_step_extra`).
    extra, tiles, cut_axis = _step_extra(L, form, x, panel, bidirectional)
    peak = L.a_bytes + L.b_bytes + L.c_bytes(nat) + 2 * panel + extra * L.itemsize
    ring = "bidirectional" if bidirectional else "unidirectional"
    return Method(
        "collective",
        nat,
        coll,
        peak,
        L.flops(a_used, b_used),
        f"{_FORMS[form]}; {p - 1}-step {ring} ring over {x!r}",
        (form, x, bool(bidirectional), tiles, cut_axis),
    )


_FORMS = {
    "ag_a_rows": "all-gather-matmul: A row blocks travel",
    "ag_b_cols": "all-gather-matmul: B column blocks travel",
    "ag_a_k": "all-gather-matmul: A K-blocks travel",
    "ag_b_k": "all-gather-matmul: B K-blocks travel",
    "rs_rows": "matmul-reduce-scatter: partial C row blocks travel",
    "rs_cols": "matmul-reduce-scatter: partial C column blocks travel",
}


def _ring_form(L: MatmulLayout, out: Spec | None) -> tuple[str, str]:
    """The ring form (a key of `_FORMS`) and the mesh axis it runs over."""
    (am, ak), (bk, bn) = L.a_spec, L.b_spec
    if ak is not None and bk is not None and ak != bk:
        raise _no_fit(
            L,
            f"K is sharded over two mesh axes ({ak!r}, {bk!r})",
            "shard K of A and B over the same mesh axis, or use algorithm='allgather'",
        )
    x = ak if ak is not None else bk
    if x is None:
        if am is None or am != bn:
            raise _no_fit(
                L,
                "no dim needs communication (case 1, local product)",
                "use algorithm='allgather', which multiplies locally here",
            )
        return ("ag_a_rows" if (out is None or out == (None, am)) else "ag_b_cols"), am
    if x in (am, bn):
        raise _no_fit(L, f"mesh axis {x!r} shards K and also M or N", "use algorithm='allgather'")
    if am is not None and am == bn:
        raise _no_fit(
            L, f"mesh axis {am!r} shards both M and N besides K", "use algorithm='allgather'"
        )
    scatter = (ak is not None and bk is not None) or (out is not None and x in out)
    if scatter:
        return ("rs_rows" if (out == (x, bn) or (out is None and am is None)) else "rs_cols"), x
    return ("ag_a_k" if ak is not None else "ag_b_k"), x


def _ring_output(L: MatmulLayout, form: str, x: str) -> tuple[Spec, int, int]:
    """``(C's spec, bytes of the travelling block, the dim size a step's block covers)``."""
    (am, _), (_, bn) = L.a_spec, L.b_spec
    p = L.size(x)
    if form == "ag_a_rows":
        return (None, x), L.a_bytes, L.m // p
    if form == "ag_b_cols":
        return (x, None), L.b_bytes, L.n // p
    if form == "ag_a_k":
        return (am, bn), L.a_bytes, L.k // p
    if form == "ag_b_k":
        return (am, bn), L.b_bytes, L.k // p
    if form == "rs_rows":
        if am is not None:
            raise _no_fit(
                L,
                f"C rows are already sharded over {am!r}",
                f"out_spec=P(None, {x!r}) or algorithm='reduce_scatter'",
            )
        return (x, bn), L.c_bytes((x, bn)), L.m // p
    if bn is not None:
        raise _no_fit(
            L,
            f"C columns are already sharded over {bn!r}",
            f"out_spec=P({x!r}, None) or algorithm='reduce_scatter'",
        )
    return (am, x), L.c_bytes((am, x)), L.n // p


def _step_extra(L: MatmulLayout, form: str, x: str, panel: int, bidirectional: bool):
    """Elements one ring step adds to the live memory, and its tiling ``(extra, tiles, cut)``.

    A row form writes a product block of C; a K-form adds its product to all of C in 1/P^2
    tiles (with the tile of the stationary operand each reads); a reduce-scatter form computes
    its partial block from windows of A and B on its K block, whole or in 1/P tiles,
    whichever holds less.
    """
    (am, ak), (bk, bn) = L.a_spec, L.b_spec
    p = L.size(x)
    rows, cols = L.m // L.size(am), L.n // L.size(bn)
    kb = L.k // p
    kpiece = kb // (2 if bidirectional else 1)
    tiles, cut_axis = 1, 1 if form in ("ag_a_rows", "ag_a_k") else 0
    if form in ("ag_a_rows", "ag_b_cols"):
        extra = (L.m // p) * cols if form == "ag_a_rows" else rows * (L.n // p)
        if p == 2:  # no loop: XLA may run both steps' products before writing either
            extra *= 2
        return extra, tiles, cut_axis
    if form == "ag_a_k":
        tiles = tile_count(cols, p * p)
        return (rows + kpiece) * (cols // tiles), tiles, cut_axis
    if form == "ag_b_k":
        tiles = tile_count(rows, p * p)
        return (rows // tiles) * (cols + kpiece), tiles, cut_axis
    # the partial block (prows, pcols) reads a window of each operand on its K block
    if form == "rs_rows":
        prows, pcols = L.m // p // (2 if bidirectional else 1), cols
    else:
        prows, pcols = rows, L.n // p // (2 if bidirectional else 1)
    a_copy = 0 if (prows, kb) == (rows, L.k // L.size(ak)) else prows * kb
    b_copy = 0 if (kb, pcols) == (L.k // L.size(bk), cols) else kb * pcols
    options = [(a_copy + b_copy, 1, 0)]
    for cut, extent in ((0, prows), (1, pcols)):
        t = tile_count(extent, p)
        if t > 1:
            tile = (prows * pcols + (prows * kb if cut == 0 else kb * pcols)) // t
            options.append(((b_copy if cut == 0 else a_copy) + tile, t, cut))
    extra, tiles, cut_axis = min(options)
    if bidirectional:  # both halves' windows are live together, and tiled parts start
        extra *= 2  # from zero-filled buffers XLA cannot place in the loop carry
        extra += panel // L.itemsize // 2 if tiles > 1 else 0
    if p == 2:  # no loop: XLA may compute both steps' parts before adding either
        extra *= 2
    return extra, tiles, cut_axis


def build_collective(
    L: MatmulLayout, method: Method, dtype
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """The jitted ``(A, B) -> C`` running the ring chosen by :func:`fit_collective`."""
    form, x, bidi, tiles, cut_axis = method.recipe
    p = L.size(x)
    out = method.out_spec
    kb = L.k // p

    def body(a, b):  # local blocks
        a, b = a.astype(dtype), b.astype(dtype)
        rows, cols = a.shape[0], b.shape[1]
        if form.startswith("ag"):  # all-gather-matmul: blocks of A or B travel
            travel_a = form in ("ag_a_rows", "ag_a_k")
            dim = 0 if form in ("ag_a_rows", "ag_b_k") else 1  # the dim it is split on
            shape = {"ag_a_rows": (L.m, cols), "ag_b_cols": (rows, L.n)}.get(form, (rows, cols))

            def consume(c, piece, start):
                lhs, rhs = (piece, b) if travel_a else (a, piece)
                if form == "ag_a_rows":  # the piece gives rows start.. of C
                    kw = {"at": (start, 0), "overwrite": True}
                elif form == "ag_b_cols":  # columns start.. of C
                    kw = {"at": (0, start), "overwrite": True}
                elif form == "ag_a_k":  # a K-block: read B on its rows
                    kw = {"b_win": ((start, piece.shape[1]), (0, cols))}
                else:  # a K-block of B: read A on its columns
                    kw = {"a_win": ((0, rows), (start, piece.shape[0]))}
                return add_product(c, lhs, rhs, tiles=tiles, axis=cut_axis, dtype=dtype, **kw)

            src = a if travel_a else b
            return ring_gather(src, x, p, dim, consume, jnp.zeros(shape, dtype), bidi)
        # matmul-reduce-scatter: both operands are read on this device's K block; an operand
        # not sharded on K is read there in tiles, never copied whole.
        ka = 0 if a.shape[1] == kb else lax.axis_index(x) * kb
        kbb = 0 if b.shape[0] == kb else lax.axis_index(x) * kb
        dim = 0 if form == "rs_rows" else 1  # partial C rows (or columns) travel
        size = (L.m if dim == 0 else L.n) // p

        def contrib(start, length):  # this device's part of C rows/cols start..start+length
            r = (start, length) if dim == 0 else (0, rows)
            cl = (0, cols) if dim == 0 else (start, length)
            return add_product(
                jnp.zeros((r[1], cl[1]), dtype),
                a,
                b,
                tiles=tiles,
                axis=cut_axis,
                dtype=dtype,
                a_win=(r, (ka, kb)),
                b_win=((kbb, kb), cl),
                overwrite=True,
            )

        res = ring_reduce_scatter(contrib, x, p, size, bidi)
        return jnp.concatenate(res, axis=dim) if bidi else res

    f = jax.shard_map(
        body,
        mesh=L.mesh,
        in_specs=(pspec(L.a_spec), pspec(L.b_spec)),
        out_specs=pspec(out),
        check_vma=False,
    )
    return jax.jit(f, out_shardings=NamedSharding(L.mesh, pspec(out)))
