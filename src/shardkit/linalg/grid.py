"""LU with partial pivoting on a 2-D (P_r x P_c) block-cyclic process grid (ScaLAPACK-style).

On a 1-D column-block-cyclic layout every device receives every panel, about N^2 / 2 words
per factorization whatever the number of devices. On a 2-D grid, row block ``I`` lives on
process row ``I % P_r`` and column block ``J`` on process column ``J % P_c``, and each step
moves only pieces of the panel and of the block row:

1. **Panel** (process column of block ``j``): for each of the nb columns, the pivot is found
   with a ``pmax`` + ``pmin`` (max-location) over the row mesh axis, the pivot row and row
   ``c`` are exchanged with one ``psum`` of 2 x nb words, and the local rows are updated
   (PDGETF2). Latency-bound: 3 small collectives per column.
2. **Broadcast L** along the row of processes: one ``psum`` over the column mesh axis of the
   local (N / P_r, nb) panel (with the pivots).
3. **Row interchanges** of the whole matrix: the 2 nb rows involved are exchanged with one
   ``psum`` over the row mesh axis of (2 nb, N / P_c) words.
4. **U12 = L11^-1 A12** on the diagonal process row, broadcast down the columns with one
   ``psum`` over the row mesh axis of (nb, N / P_c) words.
5. **Local trailing update** ``A22 -= L21 U12``.

As in the 1-D path, the steps run in 4 stages whose static windows leave out the rows and
columns of finished blocks.

So a device moves about N^2 / P_r + 3 N^2 / P_c words over the factorization: O(N^2 / sqrt(P))
on a square grid instead of O(N^2). The layout is entered from row-sharded
``P((row_axis, col_axis), None)`` with one ``all_to_all`` over both mesh axes.

Triangular solves: per block, one ``psum`` of nb x k partial sums over the column mesh axis and
one ``psum`` broadcasting the solved block; the solution is replicated.

Example:
    >>> mesh = jax.make_mesh((2, 4), ("x", "y"))
    >>> x = solve(a, b, mesh=mesh, grid=("x", "y"))     # via shardkit.linalg.solve
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitValueError
from shardkit.linalg import layout
from shardkit.linalg.layout import global_index, n_chunks
from shardkit.linalg.layout2d import grid_multiple, rows_to_grid_local
from shardkit.placement import constrain

_STAGES = 4  # static shrinking windows of the step loop (as in the 1-D LU)
_CHUNKS = 4  # column chunks of the trailing update (temporaries ~ shard / _CHUNKS)


__all__: list[str] = []


def _pivot_size(x):
    """The size LAPACK's pivot search (``i?amax``) compares: |x|, or |Re x| + |Im x| for
    complex x, so the pivots equal ``getrf``'s; NaN counts as the largest, so a column holding
    one pivots on it and the factors turn non-finite (``pmax`` would return NaN, which equals
    no candidate, and leave no pivot row)."""
    size = jnp.abs(x.real) + jnp.abs(x.imag) if jnp.iscomplexobj(x) else jnp.abs(x)
    return jnp.where(jnp.isnan(size), jnp.inf, size)


def _grid_steps(a, ipiv, info, *, j0, j1, row0, col0, nb, pr, pc, row_axis, col_axis):
    """LU steps ``j0 <= j < j1`` in place; panels, U12 and the trailing update touch only the
    static local window ``a[row0:, col0:]`` (rows and columns of finished blocks are left out;
    row interchanges span whole rows)."""
    m_loc, n_loc = a.shape
    n_pad = m_loc * pr
    my_r, my_c = lax.axis_index(row_axis), lax.axis_index(col_axis)
    grow = global_index(m_loc, nb, pr, my_r)  # global row of each local row
    grow_w = grow[row0:]  # (M_w,) rows of the window
    gcol_w = global_index(n_loc, nb, pc, my_c)[col0:]  # (N_w,) columns of the window
    m_w, n_w = m_loc - row0, n_loc - col0
    chunks = n_chunks(n_w // nb)
    cw = n_w // chunks

    def panel_column(k, carry):
        pan, piv, info, r0 = carry  # pan: (M_w, nb) local window rows of the panel
        c = r0 + k
        v = jnp.where(grow_w >= c, _pivot_size(pan[:, k]), -1.0)  # candidates: rows >= c
        best = jnp.argmax(v)
        gmax = lax.pmax(v[best], row_axis)
        cand = jnp.where(v[best] == gmax, grow_w[best], n_pad)
        prow = lax.pmin(cand, row_axis)  # first row holding the max |value| (LAPACK's choice)
        # Exchange rows c and prow of the panel: one psum of both rows over the row mesh axis.
        own_c, own_p = grow_w == c, grow_w == prow
        rows2 = jnp.stack([jnp.where(own_c[:, None], pan, 0).sum(0),
                           jnp.where(own_p[:, None], pan, 0).sum(0)])  # fmt: skip
        rows2 = lax.psum(rows2, row_axis)  # (2, nb): old row c, old row prow
        pan = jnp.where(own_p[:, None], rows2[0], pan)
        pan = jnp.where(own_c[:, None], rows2[1], pan)
        pivot_row = rows2[1]  # the new row c
        pivot = pivot_row[k]
        below = (grow_w > c)[:, None]
        mult = jnp.where(pivot != 0, pan[:, k] / jnp.where(pivot != 0, pivot, 1), 0)[:, None]
        col_k = jnp.arange(nb)[None, :] == k
        right = jnp.arange(nb)[None, :] > k
        pan = jnp.where(below & col_k, mult, pan)
        pan = pan - jnp.where(below & right, mult * pivot_row[None, :], 0)
        piv = piv.at[k].set(prow.astype(piv.dtype))
        info = jnp.where((info == 0) & (pivot == 0), (c + 1).astype(info.dtype), info)
        return pan, piv, info, r0

    def step(j, carry):
        a, ipiv, info = carry
        r0 = j * nb
        owner_c = my_c == j % pc
        kcj = (j // pc) * nb
        own = lax.dynamic_slice(a, (row0, kcj), (m_w, nb))  # (M_w, nb)
        piv0 = jnp.zeros((nb,), ipiv.dtype)
        pan, piv, info_p, _ = lax.fori_loop(0, nb, panel_column, (own, piv0, info, r0))
        # Broadcast the factored panel and its pivots along the process row.
        pan = lax.psum(jnp.where(owner_c, pan, 0), col_axis)
        piv = lax.psum(jnp.where(owner_c, piv, 0), col_axis)
        info = lax.pmax(jnp.where(owner_c, info_p, 0), col_axis)
        # Composite of the nb interchanges: position t receives the row src[t].
        src = jnp.arange(n_pad, dtype=ipiv.dtype)

        def swap(i, s):
            a_i, b_i = s[r0 + i], s[piv[i]]
            return s.at[r0 + i].set(b_i).at[piv[i]].set(a_i)

        src = lax.fori_loop(0, nb, swap, src)
        t = jnp.concatenate([r0 + jnp.arange(nb, dtype=ipiv.dtype), piv])  # (2 nb,) positions
        s_t = src[t]
        owns = grow[None, :] == s_t[:, None]  # (2 nb, M_loc): which local row is each source
        mine = owns.any(1)[:, None]
        gathered = lax.psum(jnp.where(mine, a[jnp.argmax(owns, axis=1)], 0), row_axis)
        blk = t // nb
        local_t = jnp.where(blk % pr == my_r, (blk // pr) * nb + t % nb, m_loc)  # OOB: dropped
        a = a.at[local_t].set(gathered, mode="drop")  # in place: 2 nb rows at most
        # The owner's panel columns become the factored panel (rows above r0 keep U).
        cur = lax.dynamic_slice(a, (row0, kcj), (m_w, nb))
        keep = (grow_w < r0)[:, None] | ~owner_c
        a = lax.dynamic_update_slice(a, jnp.where(keep, cur, pan), (row0, kcj))
        # U12 on the diagonal process row, broadcast down the process columns.
        diag_r = my_r == j % pr
        krj = (j // pr) * nb
        l11 = lax.dynamic_slice_in_dim(pan, krj - row0, nb, axis=0)  # valid on the diagonal row
        a12 = lax.dynamic_slice(a, (krj, col0), (nb, n_w))  # (nb, N_w)
        l11_inv = lax.linalg.triangular_solve(
            jnp.where(diag_r, l11, jnp.eye(nb, dtype=a.dtype)), jnp.eye(nb, dtype=a.dtype),
            left_side=True, lower=True, unit_diagonal=True,
        )  # fmt: skip
        right = (gcol_w >= r0 + nb)[None, :]
        u12 = jnp.where(right, l11_inv @ a12, 0)
        a = lax.dynamic_update_slice(a, jnp.where(diag_r & right, u12, a12), (krj, col0))
        u12 = lax.psum(jnp.where(diag_r, u12, 0), row_axis)  # (nb, N_w)
        l21 = jnp.where((grow_w >= r0 + nb)[:, None], pan, 0)  # (M_w, nb)

        def update(ci, a):  # the trailing GEMM a column chunk at a time: small temporaries
            cols = lax.dynamic_slice(a, (row0, col0 + ci * cw), (m_w, cw))
            u = lax.dynamic_slice_in_dim(u12, ci * cw, cw, axis=1)
            return lax.dynamic_update_slice(a, cols - l21 @ u, (row0, col0 + ci * cw))

        a = lax.fori_loop(0, chunks, update, a)
        ipiv = lax.dynamic_update_slice_in_dim(ipiv, piv, r0, axis=0)
        return a, ipiv, info

    return lax.fori_loop(j0, j1, step, (a, ipiv, info))


def lu_grid_local(a, *, nb, pr, pc, row_axis, col_axis):
    """Inside ``shard_map``: LU of the local 2-D cyclic block (N/P_r, N/P_c), in place.

    With enough steps the loop runs in 4 stages whose static windows shrink (stage
    boundaries aligned to lcm(P_r, P_c) so every device shares one local offset).
    """
    m_loc, _ = a.shape
    nblk = m_loc * pr // nb
    q = math.lcm(pr, pc)
    stages = _STAGES if nblk >= 2 * _STAGES * q else 1  # small problems: one window
    bounds = sorted({(nblk * s // stages) // q * q for s in range(stages)} | {nblk})
    ipiv = jnp.zeros((nblk * nb,), jnp.int32)
    info = jnp.zeros((), jnp.int32)
    for j0, j1 in zip(bounds[:-1], bounds[1:], strict=True):
        a, ipiv, info = _grid_steps(
            a, ipiv, info, j0=j0, j1=j1, row0=(j0 // pr) * nb, col0=(j0 // pc) * nb,
            nb=nb, pr=pr, pc=pc, row_axis=row_axis, col_axis=col_axis,
        )  # fmt: skip
    return a, ipiv, info


def tri_solve_grid_local(a, b, *, nb, pr, pc, row_axis, col_axis, lower, unit_diagonal=False):
    """Inside ``shard_map``: solves ``T x = b`` with T in local 2-D cyclic blocks.

    ``b`` is replicated (Np, k); returns the replicated solution.
    """
    m_loc, n_loc = a.shape
    n_pad, k = b.shape
    nblk = n_pad // nb
    my_r, my_c = lax.axis_index(row_axis), lax.axis_index(col_axis)
    grow = global_index(m_loc, nb, pr, my_r)[:, None]
    both = (row_axis, col_axis)

    def step(t, carry):
        acc, x = carry
        j = t if lower else nblk - 1 - t
        r0 = j * nb
        krj, kcj = (j // pr) * nb, (j // pc) * nb
        diag = (my_r == j % pr) & (my_c == j % pc)
        s = lax.psum(lax.dynamic_slice_in_dim(acc, krj, nb, axis=0), col_axis)  # (nb, k)
        t_jj = lax.dynamic_slice(a, (krj, kcj), (nb, nb))
        t_jj = jnp.tril(t_jj) if lower else jnp.triu(t_jj)
        if unit_diagonal:
            t_jj = jnp.where(jnp.eye(nb, dtype=bool), 1, t_jj)  # never reads the diagonal
        t_jj = jnp.where(diag, t_jj, jnp.eye(nb, dtype=a.dtype))
        b_j = lax.dynamic_slice_in_dim(b, r0, nb, axis=0)
        x_j = lax.linalg.triangular_solve(t_jj, b_j - s, left_side=True, lower=lower)
        x_j = lax.psum(jnp.where(diag, x_j, 0), both)  # (nb, k), replicated
        col = lax.dynamic_slice_in_dim(a, kcj, nb, axis=1)  # (M_loc, nb)
        off = (grow >= r0 + nb) if lower else (grow < r0)
        acc = acc + jnp.where((my_c == j % pc) & off, col, 0) @ x_j
        return acc, lax.dynamic_update_slice_in_dim(x, x_j, r0, axis=0)

    acc = jnp.zeros((m_loc, k), b.dtype)
    _, x = lax.fori_loop(0, nblk, step, (acc, jnp.zeros_like(b)))
    return x


def lu_solve_grid_local(a, perm, b, **kw):
    """Inside ``shard_map``: ``x = U^-1 L^-1 b[perm]`` with 2-D cyclic LU factors."""
    y = tri_solve_grid_local(a, b[perm], lower=True, unit_diagonal=True, **kw)
    return tri_solve_grid_local(a, y, lower=False, **kw)


def _shard_map(f, mesh, in_specs, out_specs):
    # check_vma=False: pivot data is invariant along one mesh axis and varying along the other
    # inside the loop, which the type system cannot express for a single loop carry.
    return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def _enter(a, mesh, r, c, nb):
    pr, pc = mesh.shape[r], mesh.shape[c]
    n = max(a.shape)  # a non-square matrix is factored as the square one it pads to
    step = grid_multiple(nb, pr, pc)
    n_pad = -(-n // step) * step
    return constrain(layout.pad_identity(a, n_pad), mesh, P((r, c), None)), n_pad, pr, pc


def no_grid_grad(fn: str):
    """Raises the error for a gradient through ``fn(..., grid=...)`` (instead of NaN or JAX's
    missing rule for ``pmax``)."""
    raise ShardkitValueError(
        f"grid: gradients through {fn}(..., grid=...) are not supported: the 2-D block-cyclic "
        "factorization has no derivative rule. Fix: differentiate with the 1-D layout (drop "
        "grid=; it distributes over all mesh axes, flattened)."
    )


@functools.partial(jax.jit, static_argnames=("mesh", "grid", "nb"))
def lu_grid_jit(a, mesh, grid, nb):
    r, c = grid
    a, n_pad, pr, pc = _enter(a, mesh, r, c, nb)

    def local(a):
        a = rows_to_grid_local(a, nb=nb, pr=pr, pc=pc, axes=(r, c))
        a, ipiv, info = lu_grid_local(a, nb=nb, pr=pr, pc=pc, row_axis=r, col_axis=c)
        return a, lax.linalg.lu_pivots_to_permutation(ipiv, n_pad), ipiv, info

    return _shard_map(local, mesh, P((r, c), None), (P(r, c), P(), P(), P()))(a)


@functools.partial(jax.jit, static_argnames=("mesh", "grid", "nb"))
def lu_solve_grid_jit(packed, perm, b, mesh, grid, nb):
    r, c = grid
    pr, pc = mesh.shape[r], mesh.shape[c]
    b = constrain(jnp.pad(b.astype(packed.dtype), ((0, packed.shape[0] - b.shape[0]), (0, 0))),
                  mesh, P())  # fmt: skip
    f = functools.partial(lu_solve_grid_local, nb=nb, pr=pr, pc=pc, row_axis=r, col_axis=c)
    return _shard_map(f, mesh, (P(r, c), P(), P()), P())(packed, perm, b)


@functools.partial(jax.jit, static_argnames=("mesh", "grid", "nb"))
def solve_grid_jit(a, b, mesh, grid, nb):
    r, c = grid
    n = a.shape[0]
    a, n_pad, pr, pc = _enter(a, mesh, r, c, nb)
    b = constrain(jnp.pad(b.astype(a.dtype), ((0, n_pad - n), (0, 0))), mesh, P())

    def local(a, b):
        a = rows_to_grid_local(a, nb=nb, pr=pr, pc=pc, axes=(r, c))
        a, ipiv, info = lu_grid_local(a, nb=nb, pr=pr, pc=pc, row_axis=r, col_axis=c)
        perm = lax.linalg.lu_pivots_to_permutation(ipiv, n_pad)
        kw = dict(nb=nb, pr=pr, pc=pc, row_axis=r, col_axis=c)
        return lu_solve_grid_local(a, perm, b, **kw), info

    x, info = _shard_map(local, mesh, (P((r, c), None), P()), (P(), P()))(a, b)
    return x[:n], info
