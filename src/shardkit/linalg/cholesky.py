"""Distributed Cholesky factorization ``A = L L^T`` and solves with it.

The LU skeleton without pivoting (see ``lu``): for each column block ``j`` the owner's
(N - r0, nb) panel is broadcast with one ``psum``; every device factors the diagonal block,
forms ``L21 = A21 L11^-T`` and updates its own trailing columns with ``A22 -= L21 L21^T``, the
rows of ``L21^T`` it needs being rows of the replicated panel (no further messages). Half the
flops of LU; the matrix is never gathered.

A matrix that is not symmetric positive definite makes a diagonal block fail to factor; that
is reported through ``info`` and, outside ``jit``, :class:`NotPositiveDefiniteError`.

Example:
    >>> mesh = jax.make_mesh((8,), ("x",))
    >>> g = jax.random.normal(jax.random.key(0), (128, 128))
    >>> a = g @ g.T + 128 * jnp.eye(128)
    >>> x = cho_solve(cholesky(a, mesh=mesh), jnp.ones(128))
    >>> float(jnp.abs(a @ x - 1).max()) < 1e-3
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

from shardkit.errors import ShardkitError, ShardkitTypeError
from shardkit.linalg import layout
from shardkit.linalg.layout import (
    block_size_for,
    check_matrix,
    n_chunks,
    n_devices,
    onto_mesh,
    zeros_varying,
)
from shardkit.linalg.triangular import (
    as_columns,
    first_zero_cyclic_local,
    raise_if_singular_triangle,
    real_columns,
    tangent_rhs,
    tri_matvec_local,
    tri_solve_local,
)
from shardkit.placement import constrain

__all__ = ["CholeskyFactors", "NotPositiveDefiniteError", "cho_solve", "cholesky"]


class NotPositiveDefiniteError(ShardkitError, ValueError):
    """The matrix given to :func:`cholesky` is not symmetric positive definite."""


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["l", "info"],
    meta_fields=["n", "block_size", "mesh", "axis_names"],
)
@dataclasses.dataclass(frozen=True)
class CholeskyFactors:
    """Cholesky factor ``A = L L^T`` in the column-block-cyclic layout.

    Attributes:
        l: (Np, Np) storage whose lower triangle is L (the strict upper triangle is
            unspecified), columns in ``layout.column_cyclic_order(Np, block_size, P)``,
            sharded ``P(None, axis_names)``; Np is N padded to a multiple of ``block_size * P``.
        info: int32 scalar: 0 on success; ``i > 0`` when the diagonal block starting at row
            ``i - 1`` failed to factor (A is not positive definite there).
        n, block_size, mesh, axis_names: as for :class:`~shardkit.linalg.LUFactors`.
    """

    l: jax.Array
    info: jax.Array
    n: int
    block_size: int
    mesh: Mesh
    axis_names: tuple[str, ...]

    def unpack(self) -> jax.Array:
        """Returns L as an (N, N) array in natural order (gathered: for tests and small N)."""
        natural = layout.from_column_cyclic(
            self.l, block_size=self.block_size, mesh=self.mesh, axis_names=self.axis_names
        )
        return jnp.tril(jnp.asarray(np.asarray(natural)[: self.n, : self.n]))


def _factor_panel(panel, *, r0, nb):
    """The factored (Np, nb) panel: L11 = chol(A11) at rows r0.., L21 = A21 L11^-T below, zeros
    above (the rows above r0 of ``panel`` must be zero)."""
    a11 = lax.dynamic_slice_in_dim(panel, r0, nb, axis=0)
    l11 = jnp.tril(lax.linalg.cholesky(a11, symmetrize_input=False))  # lower triangle
    l_panel = lax.linalg.triangular_solve(  # A21 L11^-H (^-T for real matrices)
        l11, panel, left_side=False, lower=True, transpose_a=True, conjugate_a=True
    )
    return lax.dynamic_update_slice_in_dim(l_panel, l11, r0, axis=0)  # exact L11


def cholesky_local(a, *, nb, p, axes):
    """Inside ``shard_map``: factors local cyclic columns (Np, Np/P) of an SPD matrix."""
    n_pad, kc = a.shape
    nblk = n_pad // nb
    d = lax.axis_index(axes)
    col_block = (jnp.arange(kc) // nb) * p + d  # global block of each local column
    gcol = col_block * nb + jnp.arange(kc) % nb  # global column of each local column
    rows = jnp.arange(n_pad)
    chunks = n_chunks(kc // nb)
    cw = kc // chunks

    def skip(panel):  # what the devices that do not own the panel contribute to its psum
        return zeros_varying(panel.shape, panel.dtype, axes)

    def step(j, carry):
        a, info = carry
        r0 = j * nb
        mine = d == j % p
        kc0 = (j // p) * nb
        own = lax.dynamic_slice_in_dim(a, kc0, nb, axis=1)  # (Np, nb)
        below = (rows >= r0)[:, None]
        # Only the owner calls LAPACK (potrf + trsm; concurrent calls from every device fight
        # over the BLAS threads on CPU); one psum hands everyone the factored panel.
        factor = functools.partial(_factor_panel, r0=r0, nb=nb)
        l_panel = lax.psum(lax.cond(mine, factor, skip, jnp.where(below, own, 0)), axes)
        l11 = lax.dynamic_slice_in_dim(l_panel, r0, nb, axis=0)
        cur = lax.dynamic_slice_in_dim(a, kc0, nb, axis=1)
        a = lax.dynamic_update_slice_in_dim(a, jnp.where(mine & below, l_panel, cur), kc0, 1)
        l21 = jnp.where((rows >= r0 + nb)[:, None], l_panel, 0)  # (Np, nb)

        def update(c, a):
            cols = lax.dynamic_slice_in_dim(a, c * cw, cw, axis=1)  # (Np, cw)
            g = lax.dynamic_slice_in_dim(gcol, c * cw, cw)
            right = (g >= r0 + nb)[None, :]
            lt = jnp.where(right, jnp.take(l_panel, g, axis=0).T.conj(), 0)  # (nb, cw): L21^H
            return lax.dynamic_update_slice_in_dim(a, cols - l21 @ lt, c * cw, axis=1)

        a = lax.fori_loop(0, chunks, update, a)
        bad = ~jnp.isfinite(l11).all() | (jnp.diagonal(l11).real <= 0).any()
        info = jnp.where((info == 0) & bad, jnp.asarray(r0 + 1, info.dtype), info)
        return a, info

    return lax.fori_loop(0, nblk, step, (a, jnp.zeros((), jnp.int32)))


@functools.partial(jax.jit, static_argnames=("mesh", "axes", "nb"))
def _cholesky_jit(a, mesh, axes, nb):
    p = n_devices(mesh, axes)
    n_pad = layout.padded_size(a.shape[0], nb, p)
    a = constrain(layout.pad_identity(a, n_pad), mesh, P(axes, None))

    def local(a):
        a = layout.rows_to_cyclic_local(a, block_size=nb, p=p, axes=axes)
        return cholesky_local(a, nb=nb, p=p, axes=axes)

    return jax.shard_map(local, mesh=mesh, in_specs=P(axes, None), out_specs=(P(None, axes), P()))(
        a
    )


def _cho_solve_local(l, b, *, nb, p, axes, keep):
    y = tri_solve_local(l, b, nb=nb, p=p, axes=axes, lower=True)  # L y = b
    x = tri_solve_local(l, y, nb=nb, p=p, axes=axes, lower=True, transpose=True, conjugate=True)
    return (x, y) if keep else x


def _cho_solve_map(l, b, mesh, axes, nb, keep):
    f = functools.partial(_cho_solve_local, nb=nb, p=n_devices(mesh, axes), axes=axes, keep=keep)
    out_specs = (P(), P()) if keep else P()
    return jax.shard_map(f, mesh=mesh, in_specs=(P(None, axes), P()), out_specs=out_specs)(l, b)


def _cho_matvec_local(l, v, *, nb, p, axes):
    """Inside ``shard_map``: ``A v = L (L^H v)`` from the cyclic storage of L."""
    kw = dict(nb=nb, p=p, axes=axes, lower=True)
    return tri_matvec_local(l, tri_matvec_local(l, v, transpose=True, conjugate=True, **kw), **kw)


def _cho_tangent_matvec_local(l, dl, x, y, *, nb, p, axes):
    """Inside ``shard_map``: ``dA x = dL y + L (dL^H x)`` for a tangent ``dl`` of the storage
    (its lower triangle is read), with ``y = L^H x``; real-linear in ``dl``, so JAX transposes
    it into the storage's cotangent."""
    kw = dict(nb=nb, p=p, axes=axes, lower=True)
    dlh_x = tri_matvec_local(dl, x, transpose=True, conjugate=True, **kw)
    return tri_matvec_local(dl, y, **kw) + tri_matvec_local(l, dlh_x, **kw)


def _cho_factors_solve(l, rhs, mesh, axes, nb):
    """``A^-1 rhs`` with the cyclic storage of L, as ``lax.custom_linear_solve``. A is Hermitian,
    so its transpose is ``conj(A)``: ``A^-T r = conj(A^-1 conj(r))``, the same two solves."""
    f = functools.partial(_cho_matvec_local, nb=nb, p=n_devices(mesh, axes), axes=axes)
    matvec = jax.shard_map(f, mesh=mesh, in_specs=(P(None, axes), P()), out_specs=P())

    def solve(_, r):
        return _cho_solve_map(l, r, mesh, axes, nb, keep=False)

    return lax.custom_linear_solve(
        functools.partial(matvec, l),
        rhs,
        solve=solve,
        transpose_solve=lambda _, r: solve(None, r.conj()).conj(),
    )


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4))
def _cho_solve_padded(l, b, mesh, axes, nb):
    """``x = L^-H L^-1 b`` with the cyclic storage of L and replicated (Np, k) b. Its JVP,
    ``dx = A^-1 (db - dA x)`` with ``dA = dL L^H + L dL^H`` and ``A^-1`` by
    :func:`_cho_factors_solve`, gives JAX the reverse mode too: for real L, ``b_bar = lam =
    A^-1 x_bar`` and ``L_bar = -tril(lam y^T + x u^T)`` with ``y = L^T x``, ``u = L^T lam``."""
    return _cho_solve_map(l, b, mesh, axes, nb, keep=False)


@functools.partial(_cho_solve_padded.defjvp, symbolic_zeros=True)
def _cho_solve_padded_jvp(mesh, axes, nb, primals, tangents):
    l, b = primals
    dl, db = tangents
    x, y = _cho_solve_map(l, b, mesh, axes, nb, keep=True)
    f = functools.partial(_cho_tangent_matvec_local, nb=nb, p=n_devices(mesh, axes), axes=axes)
    specs = (P(None, axes), P(None, axes), P(), P())

    def dax():
        return jax.shard_map(f, mesh=mesh, in_specs=specs, out_specs=P())(l, dl, x, y)

    return x, _cho_factors_solve(l, tangent_rhs(b, db, dl, dax), mesh, axes, nb)


@functools.partial(jax.jit, static_argnames=("mesh", "axes", "nb"))
def _cho_solve_jit(l, b, mesh, axes, nb):
    n = b.shape[0]
    b = constrain(jnp.pad(b.astype(l.dtype), ((0, l.shape[0] - n), (0, 0))), mesh, P())
    x = _cho_solve_padded(l, b, mesh, axes, nb)
    f = functools.partial(first_zero_cyclic_local, nb=nb, p=n_devices(mesh, axes), axes=axes)
    first = jax.shard_map(f, mesh=mesh, in_specs=P(None, axes), out_specs=P())(lax.stop_gradient(l))
    return x[:n], jnp.where(first < n, first + 1, 0)  # info = i + 1 for L[i, i] == 0


def _raise_if_not_spd(info, n: int) -> None:
    if isinstance(info, jax.core.Tracer):
        return
    i = int(info)
    if i > 0:
        raise NotPositiveDefiniteError(
            f"a: the ({n}, {n}) matrix is not symmetric positive definite: the diagonal block "
            f"starting at row {i - 1} failed to factor (info={i}). Check symmetry and "
            "eigenvalues, or use shardkit.linalg.solve (LU) for general matrices."
        )


def cholesky(
    a: jax.Array,
    *,
    block_size: int | None = None,
    mesh: Mesh | None = None,
    axis_names: str | Sequence[str] | None = None,
    check: bool = True,
) -> CholeskyFactors:
    """Cholesky factorization ``A = L L^T`` of a distributed symmetric positive definite matrix.

    Args:
        a: (N, N) symmetric (real) or Hermitian (complex) positive definite matrix, float32,
            float64, complex64 or complex128, any sharding, any N (padded internally). Only the
            lower triangle is read; ``A = L L^H``.
        block_size: panel width nb (default None: chosen from N and the device count, 32 to
            256, see :func:`~shardkit.linalg.layout.block_size_for`).
        mesh: the device mesh (default: ``a.sharding.mesh`` or ``jax.set_mesh``).
        axis_names: mesh axes to distribute the columns over (default: all, flattened).
        check: raise when A is not positive definite (outside ``jit`` only; inside, read
            ``info``).

    Returns:
        :class:`CholeskyFactors`.

    Raises:
        ValueError: ``a`` is not square, ``block_size`` is not in ``1..N``, or no mesh.
        NotPositiveDefiniteError: ``check`` and A is not positive definite.

    Example:
        >>> f = cholesky(a, mesh=jax.make_mesh((8,), ("x",)))
        >>> bool(jnp.allclose(f.unpack() @ f.unpack().T, a, atol=1e-3))
        True

    See also: :func:`cho_solve`, :func:`shardkit.linalg.lu`, :func:`shardkit.linalg.cg`.
    """
    check_matrix(a, "a")
    mesh, axes = layout.resolve_mesh(a, mesh, axis_names, arg="a")
    a = onto_mesh(a, mesh, axes)
    block_size = block_size_for(block_size, a.shape[0], n_devices(mesh, axes))
    l, info = _cholesky_jit(a, mesh, axes, block_size)
    if check:
        _raise_if_not_spd(info, a.shape[0])
    return CholeskyFactors(l, info, a.shape[0], block_size, mesh, axes)


def cho_solve(factors: CholeskyFactors, b: jax.Array, *, check: bool = True) -> jax.Array:
    """Solves ``A x = b`` with the Cholesky factors of A (``L y = b``, then ``L^H x = y``).

    Differentiable in forward and reverse mode, real or complex, in ``b`` and in the storage
    ``factors.l`` (its cotangent is the lower triangle's, in the same distributed layout).

    Args:
        factors: the result of :func:`cholesky`.
        b: (N,) or (N, k) right-hand side(s), any sharding (replicated inside: N x k words).
        check: raise when the factors report a failed factorization, a diagonal entry of L is
            exactly zero or x is not finite (outside ``jit`` only; inside, and with
            ``check=False``, x holds inf/NaN there, as in ``jax.scipy.linalg.cho_solve``).

    Returns:
        x with the shape of ``b``, replicated.

    Raises:
        ValueError: ``b`` does not match the factored matrix.
        TypeError: ``factors`` is not :func:`cholesky`'s, or ``b`` is not an array.
        NotPositiveDefiniteError: ``check`` and the factors report a failed factorization.
        SingularMatrixError: ``check`` and L has an exact zero on its diagonal or x is not
            finite.

    Example:
        >>> x = cho_solve(cholesky(a, mesh=mesh), b)

    See also: :func:`cholesky`, :func:`shardkit.linalg.triangular_solve`.
    """
    if not isinstance(factors, CholeskyFactors):
        raise ShardkitTypeError(
            f"factors: expected the CholeskyFactors of shardkit.linalg.cholesky, got "
            f"{type(factors).__name__} (scipy's cho_factor gives a (c, lower) tuple). Fix: "
            "cho_solve(cholesky(a), b)."
        )
    b2, shape = as_columns(b, factors.n, "b")
    dtype, b2, join = real_columns(onto_mesh(b2, factors.mesh), factors.l.dtype)
    if check:
        _raise_if_not_spd(factors.info, factors.n)
    x, info = _cho_solve_jit(
        factors.l.astype(dtype), b2, factors.mesh, factors.axis_names, factors.block_size
    )
    if check:
        raise_if_singular_triangle(x, info, factors.n, "L", b2, arg="factors")
    return join(x).reshape(shape)
