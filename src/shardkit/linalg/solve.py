"""Linear solves ``A x = b`` with the distributed LU factorization.

:func:`solve` factors and solves in one compiled program; :func:`lu_solve` reuses factors from
:func:`~shardkit.linalg.lu` for new right-hand sides. Singular matrices are reported, not
answered with silent NaNs: an exactly zero pivot sets ``info`` (LAPACK convention), and outside
``jit`` both functions raise :class:`~shardkit.linalg.SingularMatrixError` when ``info > 0`` or
the solution is not finite. Inside a user's ``jit`` nothing can raise: call :func:`lu` and read
``factors.info``, or use ``solve(..., return_info=True)``.

Example:
    >>> mesh = jax.make_mesh((8,), ("x",))
    >>> a = jax.random.normal(jax.random.key(0), (200, 200))
    >>> x = solve(a, jnp.ones(200), mesh=mesh)     # N = 200 is padded internally
    >>> x.shape
    (200,)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitTypeError, ShardkitValueError
from shardkit.linalg import layout
from shardkit.linalg.grid import lu_solve_grid_jit, no_grid_grad, solve_grid_jit
from shardkit.linalg.layout import (
    block_size_for,
    check_flag,
    check_matrix,
    n_devices,
    onto_mesh,
)
from shardkit.linalg.layout2d import check_grid
from shardkit.linalg.lu import LUFactors, lu_local, raise_if_singular
from shardkit.linalg.triangular import (
    as_columns,
    op_matvec,
    real_columns,
    tangent_rhs,
    tri_matvec_local,
    tri_solve_local,
)
from shardkit.placement import constrain

__all__ = ["lu_solve", "solve"]


def _lu_adjoint_local(a, x_bar, *, nb, p, axes):
    """Inside ``shard_map``: the adjoint solve ``A^T lam = x_bar`` with the LU factors of
    ``A[perm] = L U``: ``z = U^-T x_bar``, ``w = L^-T z`` and ``lam = w[perm^-1]``.

    Returns ``(w, z)``; ``w`` is ``lam[perm]``, the permuted cotangent the factors need.
    """
    kw = dict(nb=nb, p=p, axes=axes, transpose=True)
    z = tri_solve_local(a, x_bar, lower=False, **kw)  # (Np, k)
    return tri_solve_local(a, z, lower=True, unit_diagonal=True, **kw), z


def _unpermute(w, perm):
    """``lam`` with ``lam[perm] = w`` (the inverse row permutation), replicated."""
    return jnp.zeros_like(w).at[perm].set(w, unique_indices=True)


def _solve_local(a, b, *, nb, p, axes, keep):
    a = layout.rows_to_cyclic_local(a, block_size=nb, p=p, axes=axes)
    a, ipiv, info, y = lu_local(a, nb=nb, p=p, axes=axes, rhs=b)  # y = L^-1 P b
    x = tri_solve_local(a, y, nb=nb, p=p, axes=axes, lower=False)
    if not keep:
        return x, info
    return x, info, a, lax.linalg.lu_pivots_to_permutation(ipiv, b.shape[0])


def _solve_map(a, b, mesh, axes, nb, keep):
    f = functools.partial(_solve_local, nb=nb, p=n_devices(mesh, axes), axes=axes, keep=keep)
    out_specs = (P(), P(), P(None, axes), P()) if keep else (P(), P())
    return jax.shard_map(f, mesh=mesh, in_specs=(P(axes, None), P()), out_specs=out_specs)(a, b)


def _lu_inverse(matvec, packed, perm, rhs, mesh, axes, nb):
    """``A^-1 rhs`` with A's cyclic LU storage, as ``lax.custom_linear_solve``: linear in
    ``rhs`` with its transpose ``A^-T`` (the transposed solve with the same factors), so JAX
    transposes it for reverse mode; ``matvec`` (``v -> A v``) serves higher derivatives."""
    return lax.custom_linear_solve(
        matvec,
        rhs,
        solve=lambda _, r: _lu_solve_map(packed, perm, r, mesh, axes, nb, keep=False),
        transpose_solve=lambda _, r: _lu_solve_t_map(packed, perm, r, mesh, axes, nb),
    )


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4))
def _solve_padded(a, b, mesh, axes, nb):
    """``(x, info)`` for the padded, row-sharded A and replicated (Np, k) b. Its JVP reuses the
    LU factors: ``dx = A^-1 (db - dA x)`` by :func:`_lu_inverse`, which JAX transposes for
    the gradients: ``b_bar = A^-T x_bar`` (two transposed triangular solves) and
    ``A_bar = -b_bar x^T``, formed row-sharded like A (the transposed ``matvec``)."""
    return _solve_map(a, b, mesh, axes, nb, keep=False)


@functools.partial(_solve_padded.defjvp, symbolic_zeros=True)
def _solve_padded_jvp(mesh, axes, nb, primals, tangents):
    a, b = primals
    da, db = tangents
    x, info, packed, perm = _solve_map(a, b, mesh, axes, nb, keep=True)
    mv = op_matvec(mesh, axes)  # (rows of A, v) -> A v
    rhs = tangent_rhs(b, db, da, lambda: mv(da, x))
    matvec = functools.partial(mv, a)
    dx = _lu_inverse(matvec, packed, perm, rhs, mesh, axes, nb)
    return (x, info), (dx, np.zeros(info.shape, jax.dtypes.float0))


def _lu_solve_local(a, perm, b, *, nb, p, axes, keep):
    b = b[perm]  # (Np, k) replicated: apply the row permutation
    kw = dict(nb=nb, p=p, axes=axes)
    y = tri_solve_local(a, b, lower=True, unit_diagonal=True, **kw)
    x = tri_solve_local(a, y, lower=False, **kw)
    return (x, y) if keep else x


def _lu_solve_map(packed, perm, b, mesh, axes, nb, keep):
    f = functools.partial(_lu_solve_local, nb=nb, p=n_devices(mesh, axes), axes=axes, keep=keep)
    out_specs = (P(), P()) if keep else P()
    return jax.shard_map(f, mesh=mesh, in_specs=(P(None, axes), P(), P()), out_specs=out_specs)(
        packed, perm, b
    )


def _lu_matvec_local(a, perm, v, *, nb, p, axes):
    """Inside ``shard_map``: ``A v = P^T L U v`` from the cyclic LU storage of ``A[perm]``."""
    kw = dict(nb=nb, p=p, axes=axes, lower=True, unit_diagonal=True)
    u = tri_matvec_local(a, v, nb=nb, p=p, axes=axes, lower=False, unit_diagonal=False)
    return _unpermute(u + tri_matvec_local(a, u, **kw), perm)


def _lu_tangent_matvec_local(a, perm, da, x, y, *, nb, p, axes):
    """Inside ``shard_map``: ``dA x = P^T (dL y + L dU x)`` for a tangent ``da`` of the LU
    storage (``dL`` below its diagonal, ``dU`` on and above it), with ``y = U x``; linear in
    ``da``, so JAX transposes it into the storage's cotangent."""
    kw = dict(nb=nb, p=p, axes=axes, lower=True, unit_diagonal=True)
    du_x = tri_matvec_local(da, x, nb=nb, p=p, axes=axes, lower=False, unit_diagonal=False)
    r = tri_matvec_local(da, y, **kw) + du_x + tri_matvec_local(a, du_x, **kw)
    return _unpermute(r, perm)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4, 5))
def _lu_solve_padded(packed, perm, b, mesh, axes, nb):
    """``x = U^-1 L^-1 b[perm]`` with the cyclic LU storage. Its JVP, ``dx = A^-1 (db - dA x)``
    with ``dA x`` from the storage's tangent (:func:`_lu_tangent_matvec_local`) and ``A^-1`` by
    :func:`_lu_inverse`, gives JAX the reverse mode too: ``b_bar = lam = A^-T x_bar`` and
    the storage's cotangent ``-w y^T`` below the diagonal (L) and ``-z x^T`` on and above it
    (U), with ``y = L^-1 b[perm]``, ``z = U^-T x_bar`` and ``w = L^-T z``."""
    return _lu_solve_map(packed, perm, b, mesh, axes, nb, keep=False)


@functools.partial(_lu_solve_padded.defjvp, symbolic_zeros=True)
def _lu_solve_padded_jvp(mesh, axes, nb, primals, tangents):
    packed, perm, b = primals
    dpacked, _, db = tangents
    x, y = _lu_solve_map(packed, perm, b, mesh, axes, nb, keep=True)
    kw = dict(nb=nb, p=n_devices(mesh, axes), axes=axes)
    storage = P(None, axes)

    def dax():  # dA x from the storage's tangent
        return jax.shard_map(
            functools.partial(_lu_tangent_matvec_local, **kw),
            mesh=mesh, in_specs=(storage, P(), storage, P(), P()), out_specs=P(),
        )(packed, perm, dpacked, x, y)  # fmt: skip

    matvec = jax.shard_map(
        functools.partial(_lu_matvec_local, **kw),
        mesh=mesh, in_specs=(storage, P(), P()), out_specs=P(),
    )  # fmt: skip
    matvec = functools.partial(matvec, packed, perm)  # v -> A v from the factors
    return x, _lu_inverse(matvec, packed, perm, tangent_rhs(b, db, dpacked, dax), mesh, axes, nb)


def _lu_solve_t_local(a, perm, b, *, nb, p, axes):
    w, _ = _lu_adjoint_local(a, b, nb=nb, p=p, axes=axes)
    return _unpermute(w, perm)  # A^T x = b: x = P^T L^-T U^-T b


def _lu_solve_t_map(packed, perm, b, mesh, axes, nb):
    f = functools.partial(_lu_solve_t_local, nb=nb, p=n_devices(mesh, axes), axes=axes)
    specs = (P(None, axes), P(), P())
    return jax.shard_map(f, mesh=mesh, in_specs=specs, out_specs=P())(packed, perm, b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _lu_solve_t_padded(packed, perm, b, mesh, axes, nb):
    """``x = A^-T b`` with the cyclic LU storage of A; differentiating it raises."""
    return _lu_solve_t_map(packed, perm, b, mesh, axes, nb)


def _no_transposed_grad(*_):
    raise ShardkitValueError(
        "lu_solve: gradients through lu_solve(..., transpose=True) are not supported. Fix: "
        "differentiate solve(a, b, transpose=True), which has them."
    )


_lu_solve_t_padded.defvjp(
    lambda *args: (_lu_solve_t_padded(*args), None), lambda *args: _no_transposed_grad()
)


@functools.partial(jax.jit, static_argnames=("mesh", "axes", "nb", "transpose"))
def _lu_solve_jit(packed, perm, b, mesh, axes, nb, transpose=False):
    n_pad = packed.shape[0]
    b = constrain(jnp.pad(b.astype(packed.dtype), ((0, n_pad - b.shape[0]), (0, 0))), mesh, P())
    if transpose:
        return _lu_solve_t_padded(packed, perm, b, mesh, axes, nb)
    return _lu_solve_padded(packed, perm, b, mesh, axes, nb)


@functools.partial(jax.jit, static_argnames=("mesh", "axes", "nb"))
def _solve_jit(a, b, mesh, axes, nb):
    n = a.shape[0]
    n_pad = layout.padded_size(n, nb, n_devices(mesh, axes))
    a = constrain(layout.pad_identity(a, n_pad), mesh, P(axes, None))
    b = constrain(jnp.pad(b.astype(a.dtype), ((0, n_pad - n), (0, 0))), mesh, P())
    x, info = _solve_padded(a, b, mesh, axes, nb)
    return x[:n], info


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _solve_grid(a, b, mesh, grid, nb):
    """The 2-D grid solve; differentiating it raises (instead of NaN)."""
    return solve_grid_jit(a, b, mesh, grid, nb)


_solve_grid.defvjp(
    lambda a, b, mesh, grid, nb: (solve_grid_jit(a, b, mesh, grid, nb), None),
    lambda mesh, grid, nb, res, ct: no_grid_grad("solve"),
)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _lu_solve_grid(packed, perm, b, mesh, grid, nb):
    """The 2-D grid ``lu_solve``; differentiating it raises (instead of NaN)."""
    return lu_solve_grid_jit(packed, perm, b, mesh, grid, nb)


_lu_solve_grid.defvjp(
    lambda packed, perm, b, mesh, grid, nb: (
        lu_solve_grid_jit(packed, perm, b, mesh, grid, nb),
        None,
    ),  # fmt: skip
    lambda mesh, grid, nb, res, ct: no_grid_grad("lu_solve"),
)


_SINGULAR_FIX = (
    "Fix: check the matrix for dependent rows or columns or use float64, or use a "
    "least-squares method (jnp.linalg.lstsq) instead."
)


def _raise_if_singular(x: jax.Array, info: jax.Array, n: int, rhs, arg: str = "a") -> None:
    raise_if_singular(x, info, n, what="matrix", entry="U", fix=_SINGULAR_FIX, arg=arg, rhs=rhs)


def lu_solve(
    factors: LUFactors, b: jax.Array, *, check: bool = True, transpose: bool = False
) -> jax.Array:
    """Solves ``A x = b`` (or ``A^T x = b``) with distributed LU factors of A.

    Differentiable in forward and reverse mode in ``b`` and in the storage ``factors.lu`` (the
    1-D layout, without ``transpose``), with rules that reuse the factors.

    Args:
        factors: the result of :func:`~shardkit.linalg.lu`.
        b: (N,) or (N, k) right-hand side(s), any sharding (replicated inside: N x k words).
        transpose: solve ``A^T x = b`` with the same factors (``U^T``, then ``L^T`` solves
            and the inverse row permutation; not differentiable: differentiate
            :func:`solve` with ``transpose=True``). 1-D factors only.
        check: raise when the factors say A is singular or x is not finite (skipped when
            traced inside ``jit``; read ``factors.info`` there).

    Returns:
        x with the shape of ``b``, replicated.

    Raises:
        ValueError: ``b`` does not match the factored matrix.
        TypeError: ``factors`` is not :func:`~shardkit.linalg.lu`'s (scipy's ``(lu, piv)``
            tuple), ``b`` is not an array, or ``transpose`` is not a bool.
        SingularMatrixError: ``check`` and ``factors.info > 0``, x is not finite, or ``b``
            holds inf or NaN.

    Example:
        >>> f = lu(a, mesh=mesh)
        >>> x1, x2 = lu_solve(f, b1), lu_solve(f, b2)     # one factorization, two solves

    See also: :func:`solve`, :func:`~shardkit.linalg.lu`.
    """
    if not isinstance(factors, LUFactors):
        raise ShardkitTypeError(
            f"factors: expected the LUFactors of shardkit.linalg.lu, got "
            f"{type(factors).__name__} (scipy's lu_factor gives a (lu, piv) tuple). Fix: "
            "lu_solve(lu(a), b), or solve(a, b) for one right-hand side."
        )
    transpose = check_flag(transpose, "transpose")
    if factors.m is not None:
        raise ShardkitValueError(
            f"factors: lu_solve needs the LU factors of a square matrix; these are of a "
            f"({factors.m}, {factors.n}) matrix, which has no unique solution. Fix: solve a "
            "square system, e.g. the normal equations (A^H A) x = A^H b, or use a least-squares "
            "solver."
        )
    b2, shape = as_columns(b, factors.n, "b")
    dtype, b2, join = real_columns(onto_mesh(b2, factors.mesh), factors.lu.dtype)
    packed = factors.lu.astype(dtype)
    if transpose and factors.grid is not None:
        raise ShardkitValueError(
            "transpose: lu_solve(..., transpose=True) needs 1-D factors; these are on the 2-D "
            f"grid {factors.grid}. Fix: factor without grid= (lu(a)), or use solve(a, b, "
            "transpose=True, grid=...)."
        )
    if factors.grid is not None:
        x = _lu_solve_grid(packed, factors.perm, b2, factors.mesh, factors.grid, factors.block_size)
    else:
        x = _lu_solve_jit(
            packed, factors.perm, b2, factors.mesh, factors.axis_names, factors.block_size,
            transpose,
        )  # fmt: skip
    x = x[: factors.n]
    if check:
        _raise_if_singular(x, factors.info, factors.n, b2, arg="factors")
    return join(x).reshape(shape)


def solve(
    a: jax.Array,
    b: jax.Array,
    *,
    block_size: int | None = None,
    mesh: Mesh | None = None,
    axis_names: str | Sequence[str] | None = None,
    check: bool = True,
    return_info: bool = False,
    grid: tuple[str, str] | None = None,
    transpose: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Solves ``A x = b`` for a distributed square matrix A with LU and partial pivoting.

    The drop-in for ``jnp.linalg.solve`` on a sharded matrix: that one all-gathers the whole
    matrix onto every device (and raises ``ShardingTypeError`` on Explicit axes); this one
    keeps A distributed (see :func:`~shardkit.linalg.lu` for the algorithm).

    Args:
        a: (N, N) float32, float64, complex64 or complex128 matrix, any sharding; any N
            (padded internally).
        b: (N,) or (N, k) right-hand side(s), any sharding (replicated inside: N x k words).
        block_size: panel width nb (default None: chosen from N and the device count, 32 to
            256, see :func:`~shardkit.linalg.layout.block_size_for`).
        mesh: the device mesh (default: ``a.sharding.mesh`` or ``jax.set_mesh``); Auto and
            Explicit axis types both work.
        axis_names: mesh axes to distribute over (default: all, flattened).
        check: raise :class:`SingularMatrixError` on a zero pivot or a non-finite solution
            (outside ``jit`` only).
        return_info: also return the int32 ``info`` (0, or ``i`` when ``U[i-1, i-1] == 0``),
            the way to detect singular matrices inside ``jit``.
        grid: ``(row_axis, col_axis)``: use the 2-D block-cyclic LU over those two mesh axes
            (see :func:`~shardkit.linalg.lu`).
        transpose: solve ``A^T x = b`` (``scipy.linalg.solve(..., transposed=True)``, ``trans=1``
            of ``lu_solve``). A is transposed distributed (one all-to-all of its shard, never
            gathered) and then factored; differentiable like the plain solve.

    Returns:
        x with the shape of ``b``, replicated; ``(x, info)`` when ``return_info``.

    Raises:
        ValueError: ``a`` is not square, ``b`` does not match, ``block_size`` is not in
            ``1..N``, or no mesh.
        TypeError: ``a`` or ``b`` is not a float32/64 or complex64/128 array (a list, half
            precision), ``transpose`` is not a bool, or ``mesh`` is not a mesh.
        SingularMatrixError: ``check`` and the matrix is singular, or ``b`` holds inf or NaN.

    Example:
        >>> mesh = jax.make_mesh((8,), ("x",))
        >>> a = jax.device_put(a, jax.NamedSharding(mesh, P("x", None)))
        >>> x = solve(a, b)

    See also: :func:`lu_solve`, :func:`~shardkit.linalg.cg`, :func:`~shardkit.linalg.batched_solve`.
    """
    check_matrix(a, "a", stacked="batched_solve")
    b2, shape = as_columns(b, a.shape[0], "b")
    transpose = check_flag(transpose, "transpose")
    mesh, axes = layout.resolve_mesh(a, mesh, axis_names, arg="a")
    a, b2 = onto_mesh(a, mesh, axes), onto_mesh(b2, mesh)
    dtype, b2, join = real_columns(b2, a.dtype)
    a = a.astype(dtype)
    block_size = block_size_for(block_size, a.shape[0], n_devices(mesh, axes))
    if transpose:  # the layout change that follows moves the transposed shards (all-to-all)
        a = a.T
    if grid is not None:
        x, info = _solve_grid(a, b2, mesh, check_grid(mesh, grid), block_size)
    else:
        x, info = _solve_jit(a, b2, mesh, axes, block_size)
    if check:
        _raise_if_singular(x, info, a.shape[0], b2)
    x = join(x).reshape(shape)
    return (x, info) if return_info else x
