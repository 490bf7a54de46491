"""SUMMA: C[M_R, N_C] = A[M_R, K_C] @ B[K_R, N_C] on a 2-D mesh with mesh axes R x C.

K is cut into ``lcm(|R|, |C|)`` panels. For each panel, the device column that owns the A panel
broadcasts it along its mesh row, the device row that owns the B panel broadcasts it down its
mesh column, and every device adds the panel product to its C block. No device ever holds more
than its own blocks and one panel of each operand, and nothing gathers a full operand. Each
panel product is added to the C block in tiles (:func:`shardkit.matmul._tiles.add_product`),
so no step holds a second C block.

A broadcast is written as an all-reduce of the panel masked to its owner (XLA's CPU backend has
no lowering for ``lax.pbroadcast``), so the compiled program holds 2 * lcm(|R|, |C|)
all-reduces of one panel each, and no all-gather. The panels are a ``fori_loop`` (one loop body
with 2 all-reduces, run lcm(|R|, |C|) times), which keeps XLA from combining the broadcasts of
all panels into one all-reduce that would hold every panel at once.

Example:
    >>> mesh = jax.make_mesh((2, 4), ("data", "model"))
    >>> A = jax.device_put(a, NamedSharding(mesh, P("data", "model")))
    >>> B = jax.device_put(b, NamedSharding(mesh, P("data", "model")))
    >>> matmul(A, B, algorithm="summa").sharding.spec
    P('data', 'model')
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
    lcm,
    pspec,
    ring_bytes,
)
from shardkit.matmul._tiles import add_product, tile_count

__all__ = ["build_summa", "fit_summa"]


def fit_summa(L: MatmulLayout, out: Spec | None) -> Method:
    """Checks the SUMMA layout and predicts its panel broadcasts and memory.

    Raises:
        MatmulLayoutError: the mesh has fewer than 2 mesh axes, or A and B are not both
            ``P(R, C)`` over two different mesh axes, or ``out`` is not ``P(R, C)``.
    """
    if len(L.mesh.axis_names) < 2:
        raise MatmulLayoutError(
            f"algorithm='summa' needs a 2-D mesh, but the mesh has one mesh axis "
            f"{dict(L.mesh.shape)}; fix: build a 2-D mesh, e.g. jax.make_mesh((2, 4), "
            "('data', 'model')), or use algorithm='collective' on a 1-D mesh."
        )
    (r, c), (rb, cb) = L.a_spec, L.b_spec
    if r is None or c is None or r == c or (rb, cb) != (r, c):
        a = fmt_layout("A", L.a_spec, ("M", "K"))
        b = fmt_layout("B", L.b_spec, ("K", "N"))
        names = tuple(L.mesh.axis_names[:2])
        raise MatmulLayoutError(
            f"algorithm='summa' needs A[M_R, K_C] and B[K_R, N_C] over two mesh axes R, C; got "
            f"{a} and {b}; fix: put both operands on P{names} (jax.device_put(x, "
            f"NamedSharding(mesh, P{names}))), or use algorithm='auto'."
        )
    if out is not None and out != (r, c):
        raise MatmulLayoutError(
            f"algorithm='summa' returns C as {fmt_spec((r, c))}, not out_spec={fmt_spec(out)}; "
            f"fix: out_spec={fmt_spec((r, c))}, or algorithm='allgather' for other outputs."
        )
    pr, pc = L.size(r), L.size(c)
    steps = lcm(pr, pc)
    kb = L.k // steps
    a_panel = L.m // pr * kb * L.itemsize
    b_panel = kb * (L.n // pc) * L.itemsize
    coll = []
    if pc > 1:
        coll.append(
            MatmulCollective("all-reduce", c, steps, steps * ring_bytes("all-reduce", a_panel, pc))
        )
    if pr > 1:
        coll.append(
            MatmulCollective("all-reduce", r, steps, steps * ring_bytes("all-reduce", b_panel, pr))
        )
    # A broadcast holds each panel twice (the masked send buffer and the received sum); the
    # panel product is added to C in tiles of 1/P^2 of the block (P devices), each with the
    # tile of the panel it cuts.
    rows, cols = L.m // pr, L.n // pc
    options = []
    for cut, extent, other in ((0, rows, cols), (1, cols, rows)):
        tiles = tile_count(extent, (pr * pc) ** 2)
        options.append(((extent // tiles) * (other + kb) * L.itemsize, tiles, cut))
    tile_bytes, tiles, cut = min(options)
    peak = L.a_bytes + L.b_bytes + L.c_bytes((r, c)) + 2 * (a_panel + b_panel) + tile_bytes
    return Method(
        "summa",
        (r, c),
        tuple(coll),
        peak,
        2 * (L.m // pr) * L.k * (L.n // pc),
        f"SUMMA: {steps} K-panels, A panels broadcast along {c!r}, B panels along {r!r}",
        (r, c, steps, tiles, cut),
    )


def build_summa(
    L: MatmulLayout, method: Method, dtype
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """The jitted ``(A, B) -> C`` running SUMMA as fitted by :func:`fit_summa`."""
    r, c, steps, tiles, cut = method.recipe
    pr, pc = L.size(r), L.size(c)
    kb = L.k // steps
    per_col, per_row = steps // pc, steps // pr  # panels held by one device column / row

    def bcast(x, axis, owner):
        mine = lax.axis_index(axis) == owner
        return lax.psum(jnp.where(mine, x, jnp.zeros_like(x)), axis)

    def body(a, b):  # a (M/pr, K/pc), b (K/pr, N/pc)
        a, b = a.astype(dtype), b.astype(dtype)

        def step(t, acc):
            ap = lax.dynamic_slice_in_dim(a, (t % per_col) * kb, kb, axis=1)  # (M/pr, kb)
            bp = lax.dynamic_slice_in_dim(b, (t % per_row) * kb, kb, axis=0)  # (kb, N/pc)
            ap = bcast(ap, c, t // per_col)  # from device column t // per_col
            bp = bcast(bp, r, t // per_row)  # from device row t // per_row
            return add_product(acc, ap, bp, tiles=tiles, axis=cut, dtype=dtype)

        return lax.fori_loop(0, steps, step, jnp.zeros((a.shape[0], b.shape[1]), dtype))

    f = jax.shard_map(
        body,
        mesh=L.mesh,
        in_specs=(pspec((r, c)), pspec((r, c))),
        out_specs=pspec((r, c)),
        check_vma=False,
    )
    return jax.jit(f, out_shardings=NamedSharding(L.mesh, pspec((r, c))))
