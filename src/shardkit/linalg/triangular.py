"""Blocked triangular solves on a distributed triangular matrix (column-block-cyclic layout).

``T x = b`` with T lower (forward) or upper (backward), or ``T^T x = b``, for one or many
right-hand sides. The matrix stays distributed; the right-hand side and the solution are
replicated (they are N x k, small next to the N x N matrix).

* ``T x = b`` (column-oriented): every device keeps a partial sum ``acc = sum_i T[:, i] x_i``
  over the blocks it owns. For block ``j``, one ``psum`` of ``acc[rows of j]`` (nb x k words)
  gives the owner of block ``j`` what it needs to solve its diagonal triangle; only the owner
  keeps ``x_j``. One final ``psum`` of the (N, k) solution replicates it.
* ``T^T x = b`` (row-oriented): the owner of block ``j`` forms ``T[:, j]^T x`` from the part of
  ``x`` already solved, solves its diagonal triangle and broadcasts ``x_j`` with one ``psum``
  of nb x k words.

Either way the compiled loop holds one collective of nb x k words, and the matrix is never
gathered.

Example:
    >>> mesh = jax.make_mesh((8,), ("x",))
    >>> t = jnp.tril(jax.random.normal(jax.random.key(0), (128, 128))) + 16 * jnp.eye(128)
    >>> x = triangular_solve(t, jnp.ones(128), lower=True, mesh=mesh)
    >>> float(jnp.abs(t @ x - 1).max()) < 1e-4
    True
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitValueError
from shardkit.linalg import layout
from shardkit.linalg.layout import (
    block_size_for,
    check_array,
    check_flag,
    check_matrix,
    global_index,
    n_devices,
    onto_mesh,
    zeros_varying,
)
from shardkit.linalg.lu import raise_if_singular
from shardkit.placement import constrain

__all__ = ["triangular_solve"]


def _diag_solve(t_jj, rhs, *, lower, transpose, unit_diagonal, conjugate=False):
    """Solves with one (nb, nb) diagonal block, masking the other triangle explicitly."""
    t_jj = jnp.tril(t_jj) if lower else jnp.triu(t_jj)
    if unit_diagonal:
        t_jj = jnp.where(jnp.eye(t_jj.shape[0], dtype=bool), 1, t_jj)  # never reads it
    return lax.linalg.triangular_solve(
        t_jj, rhs, left_side=True, lower=lower, transpose_a=transpose, conjugate_a=conjugate
    )


def tri_solve_local(
    a, b, *, nb, p, axes, lower, transpose=False, unit_diagonal=False, conjugate=False
):
    """Inside ``shard_map``: solves ``op(T) x = b`` with T in local cyclic columns (Np, Np/P).

    ``op(T)`` is T, ``T^T`` (``transpose``) or ``T^H`` (``transpose`` and ``conjugate``).

    ``b`` is replicated (Np, k); returns the replicated (Np, k) solution. The triangle of T
    named by ``lower`` is used; the other entries of ``a`` are ignored (so packed LU storage
    works for both factors).
    """
    n_pad, k = b.shape
    nblk = n_pad // nb
    d = lax.axis_index(axes)
    rows = jnp.arange(n_pad)[:, None]
    forward = lower != transpose  # the solve order over the blocks
    solve_diag = functools.partial(
        _diag_solve, lower=lower, transpose=transpose, unit_diagonal=unit_diagonal,
        conjugate=conjugate,
    )  # fmt: skip

    def block(t):
        j = t if forward else nblk - 1 - t
        r0 = j * nb
        mine = d == j % p
        col = lax.dynamic_slice_in_dim(a, (j // p) * nb, nb, axis=1)  # (Np, nb) on the owner
        t_jj = lax.dynamic_slice_in_dim(col, r0, nb, axis=0)  # (nb, nb)
        b_j = lax.dynamic_slice_in_dim(b, r0, nb, axis=0)  # (nb, k)
        off = (rows >= r0 + nb) if lower else (rows < r0)  # off-diagonal part of the column
        # a non-owner's `col` is another column block, whose unread triangle may hold inf or
        # NaN: masked, not multiplied by its zero x_j (0 * inf is NaN)
        return j, r0, mine, col, t_jj, b_j, jnp.where(off & mine, col, 0)

    def owner_solve(mine, t_jj, rhs):  # only the block's owner calls the BLAS solve
        zeros = functools.partial(zeros_varying, rhs.shape, rhs.dtype, axes)
        return lax.cond(mine, lambda r: solve_diag(t_jj, r), lambda r: zeros(), rhs)

    if not transpose:

        def step(t, carry):
            acc, x = carry
            j, r0, mine, col, t_jj, b_j, off_col = block(t)
            s = lax.psum(lax.dynamic_slice_in_dim(acc, r0, nb, axis=0), axes)  # (nb, k)
            x_j = owner_solve(mine, t_jj, b_j - s)
            acc = acc + off_col @ x_j  # (Np, k); zero on non-owners
            return acc, lax.dynamic_update_slice_in_dim(x, x_j, r0, axis=0)

        zeros = zeros_varying((n_pad, k), b.dtype, axes)
        _, x = lax.fori_loop(0, nblk, step, (zeros, zeros))
        return lax.psum(x, axes)

    def step_t(t, x):
        j, r0, mine, col, t_jj, b_j, off_col = block(t)
        off_col = off_col.conj() if conjugate else off_col
        s = off_col.T @ x  # (nb, k): contributions of the blocks solved so far
        x_j = lax.psum(owner_solve(mine, t_jj, b_j - s), axes)
        return lax.dynamic_update_slice_in_dim(x, x_j, r0, axis=0)

    return lax.fori_loop(0, nblk, step_t, jnp.zeros_like(b))


def as_columns(b, n: int, arg: str) -> tuple[jax.Array, tuple[int, ...]]:
    """Validates a right-hand side (N,) or (N, k) and returns it as (N, k) plus its shape."""
    check_array(b, arg)
    shape = tuple(b.shape)
    if len(shape) not in (1, 2) or shape[0] != n:
        raise ShardkitValueError(
            f"{arg}: expected shape ({n},) or ({n}, k) to match the ({n}, {n}) matrix, got "
            f"{shape}. Pass one right-hand side as a vector or several as columns."
        )
    return (b[:, None] if len(shape) == 1 else b), shape


def real_columns(b2: jax.Array, a_dtype) -> tuple[Any, jax.Array, Callable[[jax.Array], jax.Array]]:
    """The dtype a solve of ``b2`` (N, k) by a matrix of ``a_dtype`` computes in, as
    ``jnp.linalg.solve`` promotes (float32 with float64 is float64, integers are floats), and
    ``b2`` in it: a complex right-hand side of a real matrix becomes the real (N, 2k)
    ``[Re b, Im b]`` so the solve and its factors stay real, with the function that joins the
    solution's halves (the result is complex). Returns ``(matrix dtype, b2, join)``; cast the
    matrix or its factors to that dtype."""
    a_dtype = jax.dtypes.canonicalize_dtype(a_dtype)  # a numpy float64 without x64: float32
    full = layout.solve_dtype(a_dtype, b2.dtype)
    b2 = b2.astype(full)
    if not jnp.iscomplexobj(b2) or jnp.issubdtype(a_dtype, jnp.complexfloating):
        return full, b2, lambda x: x
    k = b2.shape[1]
    real = jnp.finfo(full).dtype  # the real dtype of the same precision
    joined = jnp.concatenate([b2.real, b2.imag], axis=1)
    return real, joined, lambda x: lax.complex(x[:, :k], x[:, k:])


def triangle_mask(rows, cols, *, lower, unit_diagonal):
    """True on the entries a triangular solve reads: the triangle, without the diagonal when
    ``unit_diagonal``."""
    if lower:
        return rows > cols if unit_diagonal else rows >= cols
    return rows < cols if unit_diagonal else rows <= cols


def tri_matvec_local(
    a, v, *, nb, p, axes, lower, unit_diagonal=False, transpose=False, conjugate=False
):
    """Inside ``shard_map``: ``op(T) v`` for the triangle of the cyclic storage (Np, Np/P) that a
    solve with ``lower`` / ``unit_diagonal`` reads (without the unit diagonal's ``v``); ``op``
    as in :func:`tri_solve_local`. ``v`` replicated (Np, k); one psum of an (Np, k) sum."""
    gcol = global_index(a.shape[1], nb, p, lax.axis_index(axes))
    rows = jnp.arange(a.shape[0])[:, None]
    t = jnp.where(triangle_mask(rows, gcol[None, :], lower=lower, unit_diagonal=unit_diagonal),
                  a, 0)  # fmt: skip
    if not transpose:
        return lax.psum(t @ v[gcol], axes)
    t = t.conj() if conjugate else t
    return lax.psum(jnp.zeros_like(v).at[gcol].set(t.T @ v, unique_indices=True), axes)


def _tri_primal_local(a, b, *, nb, p, axes, keep, **kw):
    a = layout.rows_to_cyclic_local(a, block_size=nb, p=p, axes=axes)
    x = tri_solve_local(a, b, nb=nb, p=p, axes=axes, **kw)
    return (x, a) if keep else x


def _tri_map(a, b, mesh, axes, nb, flags, keep):
    lower, transpose, unit_diagonal = flags
    f = functools.partial(
        _tri_primal_local, nb=nb, p=n_devices(mesh, axes), axes=axes, keep=keep, lower=lower,
        transpose=transpose, unit_diagonal=unit_diagonal,
    )  # fmt: skip
    out_specs = (P(), P(None, axes)) if keep else P()
    return jax.shard_map(f, mesh=mesh, in_specs=(P(axes, None), P()), out_specs=out_specs)(a, b)


def matvec_rows_local(a, v, *, p, axes, transpose=False):
    """Inside ``shard_map``: ``A v`` (or ``A^T v`` with ``transpose``) replicated, for this
    device's rows (Np/P, Np) of a row-sharded A and a replicated (Np, k) v (one psum of Np x k
    words). Linear in ``a`` and in ``v``: in ``a``, JAX transposes it into this device's rows of an
    outer product, so a matrix cotangent is formed row-sharded, never gathered."""
    r = a.shape[0]
    me = lax.axis_index(axes)
    if transpose:
        return lax.psum(a.T @ lax.dynamic_slice_in_dim(v, me * r, r, axis=0), axes)
    full = zeros_varying((r * p,) + v.shape[1:], jnp.result_type(a, v), axes)
    return lax.psum(lax.dynamic_update_slice_in_dim(full, a @ v, me * r, axis=0), axes)


def _op_matvec_local(a, v, *, p, axes, flags, identity):
    """Inside ``shard_map``: ``op(T) v`` for the triangle T that a solve of ``flags`` reads from
    the rows ``a`` (entries outside it are not T's; a unit diagonal is not read: ``identity``
    adds it, as T has and its tangent dT has not); ``A v`` for the whole rows when ``flags`` is
    None."""
    if flags is None:
        return matvec_rows_local(a, v, p=p, axes=axes)
    lower, transpose, unit_diagonal = flags
    r, n_pad = a.shape
    rows = lax.axis_index(axes) * r + jnp.arange(r)[:, None]
    mask = triangle_mask(rows, jnp.arange(n_pad)[None, :], lower=lower,
                         unit_diagonal=unit_diagonal)  # fmt: skip
    out = matvec_rows_local(jnp.where(mask, a, 0), v, p=p, axes=axes, transpose=transpose)
    return out + v if unit_diagonal and identity else out


def op_matvec(mesh, axes, flags=None, *, identity=True):
    """``(rows of A, v) -> op(T) v`` for a row-sharded ``P(axes, None)`` A and a replicated v:
    the triangle T of a solve with ``flags`` ``(lower, transpose, unit_diagonal)``, or the whole
    matrix (``A v``) when ``flags`` is None."""
    f = functools.partial(_op_matvec_local, p=n_devices(mesh, axes), axes=axes, flags=flags,
                          identity=identity)  # fmt: skip
    return jax.shard_map(f, mesh=mesh, in_specs=(P(axes, None), P()), out_specs=P())


def tangent_rhs(b, db, da, dax):
    """``db - dA x``, the right-hand side of a solve's JVP ``dx = A^-1 (db - dA x)``, for a
    rule defined with ``symbolic_zeros=True``: a tangent JAX knows to be zero costs nothing
    (``dax()``, the distributed ``dA x``, is not called for a zero ``da``; forward mode in b
    alone then makes only the solve's collectives)."""
    rhs = jnp.zeros_like(b) if isinstance(db, SymbolicZero) else db
    return rhs if isinstance(da, SymbolicZero) else rhs - dax()


def _cyclic_solve(a_cyclic, b, mesh, axes, nb, flags):
    """``op(T)^-1 b`` with T already in the column-block-cyclic storage."""
    lower, transpose, unit_diagonal = flags
    f = functools.partial(
        tri_solve_local, nb=nb, p=n_devices(mesh, axes), axes=axes, lower=lower,
        transpose=transpose, unit_diagonal=unit_diagonal,
    )  # fmt: skip
    return jax.shard_map(f, mesh=mesh, in_specs=(P(None, axes), P()), out_specs=P())(a_cyclic, b)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4, 5))
def _tri_padded(a, b, mesh, axes, nb, flags):
    """``op(T) x = b`` for the padded, row-sharded T and replicated (Np, k) b. Its JVP,
    ``dx = op(T)^-1 (db - op(dT) x)`` with dT masked to the triangle read, solves on the cyclic
    storage of the forward pass through ``lax.custom_linear_solve``, whose transpose (the solve
    with ``op(T)^T`` on the same storage) gives JAX the reverse mode: ``b_bar = lam`` and
    ``T_bar = -lam x^T`` (``-x lam^T`` for ``T^T``), masked and row-sharded like T."""
    return _tri_map(a, b, mesh, axes, nb, flags, keep=False)


@functools.partial(_tri_padded.defjvp, symbolic_zeros=True)
def _tri_padded_jvp(mesh, axes, nb, flags, primals, tangents):
    a, b = primals
    da, db = tangents
    x, a_cyclic = _tri_map(a, b, mesh, axes, nb, flags, keep=True)
    lower, transpose, unit_diagonal = flags
    rhs = tangent_rhs(b, db, da, lambda: op_matvec(mesh, axes, flags, identity=False)(da, x))
    dx = lax.custom_linear_solve(
        functools.partial(op_matvec(mesh, axes, flags), a),
        rhs,
        solve=lambda _, r: _cyclic_solve(a_cyclic, r, mesh, axes, nb, flags),
        transpose_solve=lambda _, r: _cyclic_solve(
            a_cyclic, r, mesh, axes, nb, (lower, not transpose, unit_diagonal)
        ),
    )
    return x, dx


def first_zero_rows_local(a, *, p, axes):
    """Inside ``shard_map``: the first ``i`` with ``a[i, i] == 0`` for row-sharded (Np/P, Np)
    ``a``, or Np when there is none (replicated int32)."""
    r, n_pad = a.shape
    grow = lax.axis_index(axes) * r + jnp.arange(r)  # global row of each local row
    diag = jnp.take_along_axis(a, grow[:, None], axis=1)[:, 0]  # (Np/P,)
    return lax.pmin(jnp.min(jnp.where(diag == 0, grow, n_pad)).astype(jnp.int32), axes)


def first_zero_cyclic_local(a, *, nb, p, axes):
    """Inside ``shard_map``: the first ``i`` with ``a[i, i] == 0`` for column-block-cyclic
    (Np, Np/P) storage, or Np when there is none (replicated int32)."""
    n_pad, kc = a.shape
    gcol = global_index(kc, nb, p, lax.axis_index(axes))  # global column of each local one
    diag = a[gcol, jnp.arange(kc)]  # (Np/P,)
    return lax.pmin(jnp.min(jnp.where(diag == 0, gcol, n_pad)).astype(jnp.int32), axes)


def raise_if_singular_triangle(x, info, n: int, name: str, rhs, arg: str = "a") -> None:
    """:func:`~shardkit.linalg.lu.raise_if_singular` for a triangle ``a`` or a Cholesky factor
    ``L`` (``name``) passed as argument ``arg``, whose fix is a nonzero diagonal or
    ``check=False``."""
    what = "triangle" if name == "a" else "Cholesky factor"
    fix = (
        "Fix: make the diagonal nonzero (or use float64), or pass check=False to get JAX's "
        "inf/NaN result instead."
    )
    raise_if_singular(x, info, n, what=what, entry=name, fix=fix, arg=arg, rhs=rhs)


@functools.partial(
    jax.jit, static_argnames=("mesh", "axes", "nb", "lower", "transpose", "unit_diagonal")
)
def _tri_jit(a, b, mesh, axes, nb, lower, transpose, unit_diagonal):
    n = a.shape[0]
    n_pad = layout.padded_size(n, nb, n_devices(mesh, axes))
    a = constrain(layout.pad_identity(a, n_pad), mesh, P(axes, None))
    b = constrain(jnp.pad(b.astype(a.dtype), ((0, n_pad - n), (0, 0))), mesh, P())
    x = _tri_padded(a, b, mesh, axes, nb, (lower, transpose, unit_diagonal))
    if unit_diagonal:
        return x[:n], jnp.zeros((), jnp.int32)  # the stored diagonal is not read
    f = functools.partial(first_zero_rows_local, p=n_devices(mesh, axes), axes=axes)
    first = jax.shard_map(f, mesh=mesh, in_specs=P(axes, None), out_specs=P())(lax.stop_gradient(a))
    return x[:n], jnp.where(first < n, first + 1, 0)  # LAPACK trtrs: info = i + 1


def triangular_solve(
    a: jax.Array,
    b: jax.Array,
    *,
    lower: bool,
    transpose: bool = False,
    unit_diagonal: bool = False,
    block_size: int | None = None,
    mesh: Mesh | None = None,
    axis_names: str | Sequence[str] | None = None,
    check: bool = True,
) -> jax.Array:
    """Solves ``op(A) x = b`` for a distributed triangular A (left side), without gathering A.

    Differentiable (forward and reverse mode) in ``a`` and ``b``: the rules solve with
    ``op(A)^T`` on the same distributed storage; ``a``'s cotangent is masked to the triangle
    that is read.

    Args:
        a: (N, N) triangular matrix, any sharding; only the triangle named by ``lower`` is read.
        b: (N,) or (N, k) right-hand side(s), any sharding (replicated inside: N x k words).
        lower: True for lower triangular A, False for upper.
        transpose: solve with ``A.T`` instead of A.
        unit_diagonal: assume ones on the diagonal (the stored diagonal is ignored).
        block_size: block size nb of the column-block-cyclic layout (default None: chosen
            from N, see :func:`~shardkit.linalg.layout.block_size_for`).
        mesh: the device mesh (default: ``a.sharding.mesh`` or ``jax.set_mesh``).
        axis_names: mesh axes to distribute over (default: all, flattened).
        check: raise :class:`~shardkit.linalg.SingularMatrixError` when a diagonal entry of
            the triangle is exactly zero or x is not finite (outside ``jit`` only; inside,
            and with ``check=False``, x holds inf/NaN there, as in
            ``jax.scipy.linalg.solve_triangular``).

    Returns:
        x with the shape of ``b``, replicated.

    Raises:
        ValueError: ``a`` is not square, ``b`` does not match it, or no mesh.
        TypeError: ``a`` or ``b`` is not a float32/64 or complex64/128 array, or ``lower``,
            ``transpose`` or ``unit_diagonal`` is not a bool (scipy's ``trans='N'``).
        SingularMatrixError: ``check`` and the triangle is singular or x is not finite.

    Example:
        >>> x = triangular_solve(jnp.triu(a), b, lower=False, mesh=mesh)

    See also: :func:`shardkit.linalg.lu_solve`, :func:`shardkit.linalg.cho_solve`.
    """

    check_matrix(a, "a")
    b2, shape = as_columns(b, a.shape[0], "b")
    lower, transpose = check_flag(lower, "lower"), check_flag(transpose, "transpose")
    unit_diagonal = check_flag(unit_diagonal, "unit_diagonal")
    mesh, axes = layout.resolve_mesh(a, mesh, axis_names, arg="a")
    a, b2 = onto_mesh(a, mesh, axes), onto_mesh(b2, mesh)
    dtype, b2, join = real_columns(b2, a.dtype)
    a = a.astype(dtype)
    block_size = block_size_for(block_size, a.shape[0], n_devices(mesh, axes))
    x, info = _tri_jit(a, b2, mesh, axes, block_size, lower, transpose, unit_diagonal)
    if check:
        raise_if_singular_triangle(x, info, a.shape[0], "a", b2)
    return join(x).reshape(shape)
