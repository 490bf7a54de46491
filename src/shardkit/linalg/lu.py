"""Distributed LU factorization with partial pivoting, and solves with its factors.

Algorithm (right-looking, blocked, 1-D column-block-cyclic; see ``layout``): for each column
block ``j`` with first row ``r0 = j * nb``,

1. the device that owns block ``j`` factors its panel rows ``r0:`` with LAPACK's partial
   pivoting (one ``getrf`` per step, not one per device: on CPU, concurrent LAPACK calls from
   every device fight over the BLAS threads and cost 30x more) and forms ``L11^-1``;
2. one ``psum`` hands every device the factored panel, ``L11^-1`` and the pivots together
   ((N - r0 + nb + 3) x nb words, the other devices contributing zeros: the largest collective
   of the factorization);
3. every device swaps the pivot rows of its own columns (one gather and one scatter of 2 nb
   rows; each device owns whole columns, so swaps need no messages), forms its block row of U
   with L11^-1, and updates its trailing columns with local GEMMs, a column chunk at a time.

The steps run in ``lax.fori_loop`` stages (one per 64 rows of N, up to 32) whose static
windows ``a[j0 * nb:, ...]`` shrink with the stage's first step, so the trailing GEMMs do close
to the exact 2/3 N^3 / P flops per device (5% more with 32 stages, 10% with 16) while the
compiled program stays one loop body per stage; per-device memory stays a small multiple of
the local shard N^2 / P, and the program holds one panel all-reduce per stage body, one
all-to-all to enter the layout, and never an all-gather of the matrix.

Triangular solves with the factors run block by block in storage order: per block, one
``psum`` of an (nb, k) partial sum; the owner of the block solves its diagonal triangle; one
final ``psum`` of the (N, k) solution replicates it. ``solve`` does the forward substitution
during the factorization instead (every device holds each panel), without messages.

Example:
    >>> mesh = jax.make_mesh((8,), ("x",))
    >>> a = jax.random.normal(jax.random.key(0), (256, 256))
    >>> b = jax.random.normal(jax.random.key(1), (256,))
    >>> x = solve(a, b, mesh=mesh)
    >>> float(jnp.linalg.norm(a @ x - b) / jnp.linalg.norm(b)) < 1e-4
    True
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitError
from shardkit.linalg import layout
from shardkit.linalg.grid import lu_grid_jit, no_grid_grad
from shardkit.linalg.layout import (
    block_size_for,
    check_matrix,
    n_chunks,
    n_devices,
    onto_mesh,
    zeros_varying,
)
from shardkit.linalg.layout2d import check_grid, grid_orders
from shardkit.placement import constrain

__all__ = ["LUFactors", "SingularMatrixError", "lu", "raise_if_singular"]

_STAGES = 32  # most static shrinking windows of the step loop (one per step up to 32 steps)
_ROWS_PER_STAGE = 64  # fewer stages below N = 2048: each is a loop body to compile (~0.4 s)


class SingularMatrixError(ShardkitError, ValueError):
    """An exactly zero pivot was met: the matrix is singular (in working precision)."""


def raise_if_singular(
    x, info, n: int, *, what: str, entry: str, fix: str, arg: str = "a", rhs=None
) -> None:
    """Raises :class:`SingularMatrixError` when ``info > 0`` (``entry[info-1, info-1]`` of the
    (n, n) ``what`` is exactly zero) or the solution ``x`` is not finite; both messages start
    with the argument ``arg`` that holds the matrix and end with ``fix``, unless the (N, k)
    right-hand side ``rhs`` holds inf or NaN: then the message names ``b`` and the row. Nothing
    inside ``jit``: the arrays are traced there (callers read ``info``)."""
    if isinstance(x, jax.core.Tracer) or isinstance(info, jax.core.Tracer):
        return
    i = int(info)
    if i > 0:
        raise SingularMatrixError(
            f"{arg}: the ({n}, {n}) {what} is singular: {entry}[{i - 1}, {i - 1}] is exactly zero "
            f"(info={i}). {fix}"
        )
    if not bool(jnp.isfinite(x).all()):
        finite_rows = None if rhs is None else jnp.isfinite(rhs).all(axis=1)  # reductions only
        if finite_rows is not None and not bool(finite_rows.all()):
            raise SingularMatrixError(
                f"b: the right-hand side holds inf or NaN (first in row "
                f"{int(jnp.argmin(finite_rows))}), so the solution of the ({n}, {n}) system is "
                "not finite. Fix: replace the non-finite entries of b (check=False returns "
                "the non-finite solution)."
            )
        raise SingularMatrixError(
            f"{arg}: the solution of the ({n}, {n}) system is not finite (the {what} is singular "
            f"to working precision or holds inf/NaN). {fix}"
        )


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["lu", "perm", "pivots", "info"],
    meta_fields=["n", "block_size", "mesh", "axis_names", "grid", "m"],
)
@dataclasses.dataclass(frozen=True)
class LUFactors:
    """LU factors ``A[perm] = L @ U`` of an N x N (or M x N) matrix in the column-block-cyclic
    layout.

    Attributes:
        lu: (Np, Np) storage: L (unit lower, diagonal not stored) and U packed LAPACK-style,
            columns in ``layout.column_cyclic_order(Np, block_size, P)``, sharded
            ``P(None, axis_names)``. ``Np`` is N padded to a multiple of ``block_size * P``
            (the padding is an identity block).
        perm: (Np,) int32 row permutation, replicated.
        pivots: (Np,) int32 LAPACK row interchanges (row ``i`` swapped with ``pivots[i]``).
        info: int32 scalar, LAPACK ``getrf`` convention: 0 on success, ``i > 0`` when ``U[i-1,
            i-1]`` is exactly zero (the matrix is singular; solves would divide by zero).
        n: the unpadded size N (the number of columns).
        block_size: nb.
        mesh: the device mesh.
        axis_names: the mesh axes the columns are distributed over.
        grid: ``(row_axis, col_axis)`` for factors on a 2-D process grid (then ``lu`` is in the
            2-D block-cyclic layout, sharded ``P(row_axis, col_axis)``), else None.
        m: the number of rows M when the matrix is not square (it was factored as the
            max(M, N) square matrix it pads to with zeros), else None.
    """

    lu: jax.Array
    perm: jax.Array
    pivots: jax.Array
    info: jax.Array
    n: int
    block_size: int
    mesh: Mesh
    axis_names: tuple[str, ...]
    grid: tuple[str, str] | None = None
    m: int | None = None

    def unpack(self) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Returns ``(perm, L, U)`` as (N,), (N, N), (N, N) arrays in natural order; for an
        M x N matrix (M,), (M, K), (K, N) with K = min(M, N), as ``scipy.linalg.lu`` shapes
        them.

        Gathers the factors: meant for tests and small matrices.
        """
        n_pad = self.lu.shape[0]
        if self.grid is None:
            rows = np.arange(n_pad)
            cols = layout.column_cyclic_order(
                n_pad, self.block_size, n_devices(self.mesh, self.axis_names)
            )
        else:
            pr, pc = (self.mesh.shape[a] for a in self.grid)
            rows, cols = grid_orders(n_pad, self.block_size, pr, pc)
        natural = np.empty(self.lu.shape, self.lu.dtype)
        natural[np.ix_(rows, cols)] = np.asarray(self.lu)  # gathered on the host
        m = self.n if self.m is None else self.m
        k = min(m, self.n)
        packed = jnp.asarray(natural[:m, : self.n])
        lower = jnp.tril(packed[:, :k], -1) + jnp.eye(m, k, dtype=packed.dtype)
        return jnp.asarray(np.asarray(self.perm)[:m]), lower, jnp.triu(packed[:k])


def _factor_panel(panel, *, nb):
    """LU of one (M, nb) panel, packed with what the other devices need into one buffer.

    Returns an (M + nb + 3, nb) array: the packed panel factors, ``L11^-1`` (nb, nb), the
    pivots and the source rows ``perm[t]`` of the interchanges (2 rows) for
    ``t = [0..nb) ++ pivots``, the indices as numbers of the panel's dtype (exact below 2^24
    rows in float32), so no other device runs the pivots-to-permutation loop.
    """
    lu_p, piv, perm = lax.linalg.lu(panel)
    l11_inv = lax.linalg.triangular_solve(
        lu_p[:nb, :nb], jnp.eye(nb, dtype=panel.dtype), left_side=True, lower=True,
        unit_diagonal=True,
    )  # fmt: skip
    src = perm[jnp.concatenate([jnp.arange(nb), piv])].reshape(2, nb)
    indices = jnp.concatenate([piv[None, :], src], axis=0).astype(panel.dtype)
    return jnp.concatenate([lu_p, l11_inv, indices], axis=0)


def _lu_steps(a, ipiv, info, rhs, *, j0, j1, row0, col0, nb, p, axes, col_block):
    """Runs LU steps ``j0 <= j < j1`` in place on ``a``, touching only the static window
    ``a[row0:, col0:]`` for the panel and trailing update (row swaps span whole rows)."""
    m = a.shape[0] - row0  # rows of the window
    chunks = n_chunks((a.shape[1] - col0) // nb)
    cw = (a.shape[1] - col0) // chunks  # columns per trailing-update chunk
    rows = jnp.arange(m) + row0  # global row of each window row, (M,)
    d = lax.axis_index(axes)

    def step(j, carry):
        a, ipiv, info, rhs = carry
        r0 = j * nb
        lr0 = r0 - row0  # row offset of the panel inside the window
        mine = d == j % p
        kc = (j // p) * nb  # local column of block j on its owner
        below = (rows >= r0)[:, None]
        # Only the owner factors the panel (LAPACK, once per step, not once per device); one
        # psum hands everyone the factors, L11^-1, the pivots and the interchanges together.
        own = lax.dynamic_slice(a, (row0, kc), (m, nb))  # (M, nb)
        # Rows r0.. first (a row gather: jnp.roll by a traced shift concatenates two copies);
        # a stage of one step starts at its window's first row and needs no rotation.
        if aligned:
            rolled = own
        else:
            rolled = jnp.where((rows < a.shape[0] - lr0)[:, None], own[(rows - row0 + lr0) % m], 0)
        packed = lax.cond(
            mine,
            functools.partial(_factor_panel, nb=nb),
            lambda x: zeros_varying((m + nb + 3, nb), x.dtype, axes),
            rolled,
        )
        packed = lax.psum(packed, axes)  # (M + nb + 3, nb), the same on all devices
        lu_p, l11_inv = packed[:m], packed[m : m + nb]
        indices = packed[m + nb :].real.astype(jnp.int32)  # relative to row r0
        piv, src = indices[0], indices[1:].reshape(-1)
        unrolled = lu_p if aligned else lu_p[(rows - row0 - lr0) % m]  # (M, nb), window order
        # Row interchanges of the whole local rows: the rows at r0 + t for t in
        # {0..nb-1} U {piv} receive the rows r0 + src; one gather and one scatter.
        t = jnp.concatenate([jnp.arange(nb), piv])  # (2 nb,)
        a = a.at[r0 + t].set(a[r0 + src], unique_indices=False)
        # The owner's panel columns become the factored panel (rows above r0 keep U).
        cur = lax.dynamic_slice(a, (row0, kc), (m, nb))
        a = lax.dynamic_update_slice(a, jnp.where(mine & below, unrolled, cur), (row0, kc))
        # U12 = L11^-1 A12 right of the panel and the trailing update, one column chunk at a
        # time so that the GEMM temporaries stay a fraction of the shard.
        l21 = jnp.where((rows >= r0 + nb)[:, None], unrolled, 0)  # (M, nb)

        def update(c, a):
            c0 = col0 + c * cw
            cols = lax.dynamic_slice(a, (row0, c0), (m, cw))  # (M, cw)
            right = (lax.dynamic_slice_in_dim(col_block, c0, cw) > j)[None, :]  # (1, cw)
            a12 = lax.dynamic_slice_in_dim(cols, lr0, nb, axis=0)  # (nb, cw)
            u12 = jnp.where(right, l11_inv @ a12, 0)  # (nb, cw)
            cols = lax.dynamic_update_slice_in_dim(cols, jnp.where(right, u12, a12), lr0, axis=0)
            return lax.dynamic_update_slice(a, cols - l21 @ u12, (row0, c0))

        a = lax.fori_loop(0, chunks, update, a)
        # Forward substitution on the replicated right-hand sides rides along: the panel
        # (L11, L21) is on every device, so y = L^-1 P b costs no messages.
        rhs = rhs.at[r0 + t].set(rhs[r0 + src], unique_indices=False)
        y = l11_inv @ lax.dynamic_slice_in_dim(rhs, r0, nb, axis=0)  # (nb, k)
        rhs = lax.dynamic_update_slice_in_dim(rhs, y, r0, axis=0)
        rhs = rhs.at[row0:].add(-(l21 @ y))
        ipiv = lax.dynamic_update_slice_in_dim(ipiv, (piv + r0).astype(ipiv.dtype), r0, axis=0)
        zero = jnp.diagonal(lu_p[:nb, :nb]) == 0
        first = (r0 + jnp.argmax(zero) + 1).astype(info.dtype)
        info = jnp.where((info == 0) & zero.any(), first, info)
        return a, ipiv, info, rhs

    aligned = j1 - j0 == 1  # one step: j = j0 is static and its panel starts at row0
    if aligned:
        return step(j0, (a, ipiv, info, rhs))
    return lax.fori_loop(j0, j1, step, (a, ipiv, info, rhs))


def lu_local(a, *, nb, p, axes, rhs=None):
    """Inside ``shard_map``: factors local cyclic columns (Np, Np/P) in place.

    With ``rhs`` (replicated (Np, k)), also returns ``L^-1 P rhs`` (forward substitution
    done during the factorization, without collectives); else returns an (Np, 0) array.
    """
    n_pad, kc = a.shape
    nblk = n_pad // nb
    rhs = jnp.zeros((n_pad, 0), a.dtype) if rhs is None else rhs
    # Each stage is one more compiled loop body; below N = 64 * 32 the flops a finer window
    # saves are worth less than its compile time (N = 1024: 16 stages compile in 17 s, 32 in
    # 28 s, and run no faster).
    stages = min(nblk, _STAGES, max(1, n_pad // _ROWS_PER_STAGE))
    d = lax.axis_index(axes)
    col_block = (jnp.arange(kc) // nb) * p + d  # global block of each local column
    ipiv = jnp.zeros((n_pad,), jnp.int32)
    info = jnp.zeros((), jnp.int32)
    # Stage boundaries in steps. A stage's column window starts at local block j0 // P on every
    # device; the few columns there of blocks <= j are masked in the update.
    bounds = sorted({nblk * s // stages for s in range(stages)} | {nblk})
    for j0, j1 in zip(bounds[:-1], bounds[1:], strict=True):
        a, ipiv, info, rhs = _lu_steps(
            a, ipiv, info, rhs, j0=j0, j1=j1, row0=j0 * nb, col0=(j0 // p) * nb,
            nb=nb, p=p, axes=axes, col_block=col_block,
        )  # fmt: skip
    return a, ipiv, info, rhs


@functools.partial(jax.jit, static_argnames=("mesh", "axes", "nb"))
def _lu_jit(a, mesh, axes, nb):
    p = n_devices(mesh, axes)
    n_pad = layout.padded_size(max(a.shape), nb, p)  # M x N: factored as max(M, N) square
    a = constrain(layout.pad_identity(a, n_pad), mesh, P(axes, None))

    def local(a):
        a = layout.rows_to_cyclic_local(a, block_size=nb, p=p, axes=axes)
        a, ipiv, info, _ = lu_local(a, nb=nb, p=p, axes=axes)
        return a, lax.linalg.lu_pivots_to_permutation(ipiv, n_pad), ipiv, info

    return jax.shard_map(
        local, mesh=mesh, in_specs=P(axes, None), out_specs=(P(None, axes), P(), P(), P())
    )(a)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _lu_grid(a, mesh, grid, nb):
    """The 2-D grid LU; differentiating it (e.g. ``det``) raises the error with the fix."""
    return lu_grid_jit(a, mesh, grid, nb)


_lu_grid.defvjp(
    lambda a, mesh, grid, nb: (lu_grid_jit(a, mesh, grid, nb), None),
    lambda mesh, grid, nb, res, ct: no_grid_grad("lu, det or slogdet"),
)


def lu(
    a: jax.Array,
    *,
    block_size: int | None = None,
    mesh: Mesh | None = None,
    axis_names: str | Sequence[str] | None = None,
    grid: tuple[str, str] | None = None,
) -> LUFactors:
    """LU factorization with partial pivoting of a distributed matrix, square or not.

    Right-looking blocked LU on a 1-D column-block-cyclic layout over ``axis_names`` (all mesh
    axes by default, so it runs on 1-D and 2-D meshes alike). The matrix is never gathered: the
    largest collective is an (N, nb) panel all-reduce per block.

    Args:
        a: (N, N) float32, float64, complex64 or complex128 matrix, any sharding (row-sharded
            ``P(axes, None)`` enters the layout with one all-to-all). N need not be a multiple
            of anything: the matrix is padded with an identity block to a multiple of
            ``block_size * P``. An (M, N) matrix is factored as the max(M, N) square matrix
            it makes with zero columns (M > N) or zero rows (M < N), whose first min(M, N)
            steps pivot exactly as LAPACK's ``getrf`` on ``a``; it costs that square's
            factorization.
        block_size: panel width nb (default None: chosen from N and the device count, 32 to
            256, see :func:`~shardkit.linalg.layout.block_size_for`). Larger nb means fewer,
            larger collectives and local GEMMs, but a longer panel factorization per step.
        mesh: the device mesh (default: ``a.sharding.mesh`` or the mesh set by
            ``jax.set_mesh``); Auto and Explicit axis types both work.
        axis_names: mesh axes to distribute the columns over (default: all, flattened).
        grid: ``(row_axis, col_axis)``: factor on a 2-D block-cyclic process grid over those
            two mesh axes instead (ScaLAPACK-style; communication per device falls as
            N^2 / sqrt(P)). N is padded to a multiple of ``nb * P * P_r``.

    Returns:
        :class:`LUFactors` with ``a[perm] == L @ U``. ``info > 0`` flags an exactly zero pivot
        (LAPACK ``getrf`` convention); :func:`solve` and :func:`lu_solve` raise on it. Factors
        of a non-square matrix unpack to L (M, K) and U (K, N), K = min(M, N), and solve
        nothing.

    Raises:
        ValueError: ``a`` is not 2-D, ``block_size`` is not in ``1..max(M, N)``, or no mesh.
        TypeError: ``a`` is not a floating or complex array.

    Example:
        >>> f = lu(a, mesh=jax.make_mesh((8,), ("x",)))
        >>> perm, l, u = f.unpack()
        >>> bool(jnp.allclose(a[perm], l @ u, atol=1e-4))
        True

    See also: :func:`lu_solve`, :func:`solve`, :func:`shardkit.linalg.det`.
    """
    check_matrix(a, "a", square=False, stacked="batched_lu")
    mesh, axes = layout.resolve_mesh(a, mesh, axis_names, arg="a")
    a = onto_mesh(a, mesh, axes)
    (m, n), s = a.shape, max(a.shape)
    block_size = block_size_for(block_size, s, n_devices(mesh, axes))
    if grid is not None:
        grid = check_grid(mesh, grid)
        packed, perm, pivots, info = _lu_grid(a, mesh, grid, block_size)
        axes = grid
    else:
        packed, perm, pivots, info = _lu_jit(a, mesh, axes, block_size)
    if m != n:  # the zero rows or columns padding to S x S make zero pivots past min(M, N)
        info = jnp.where(info > min(m, n), 0, info)
    return LUFactors(
        packed, perm, pivots, info, n, block_size, mesh, axes, grid, None if m == n else m
    )
