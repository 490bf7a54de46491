"""Conjugate gradients on a row-sharded operator, with vector-sized collectives only.

All vectors (x, r, p, z) are sharded ``P(axis_names)``: each device keeps N/P entries. With a
row-sharded matrix ``A[N_X, N]`` one iteration costs

* one ``all_gather`` of the N-vector p (each device needs all of it for its rows of A p),
* two ``psum`` of scalars (``p . Ap``, and ``r . r`` with ``r . z`` as one pair),

and never moves the matrix. ``jnp`` CG (``jax.scipy.sparse.linalg.cg``) on the same sharded
matrix also only gathers the vector on Auto axes, but raises ``ShardingTypeError`` on Explicit
axes; this one works on both. A matrix-free operator (a function on global vectors) works too:
its own communication is then up to it.

Preconditioning: ``preconditioner="jacobi"`` divides by the diagonal of A (computed once,
locally); or pass a function ``z = M(r)`` on global vectors that approximates ``A^-1 r``.

Example:
    >>> mesh = jax.make_mesh((8,), ("x",))
    >>> n = 256
    >>> a = 2 * jnp.eye(n) - jnp.eye(n, k=1) - jnp.eye(n, k=-1)      # 1-D Poisson, SPD
    >>> x, info = cg(a, jnp.ones(n), mesh=mesh, tol=1e-6)
    >>> int(info.iterations) <= n, bool(info.converged)
    (True, True)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitValueError
from shardkit.linalg import layout
from shardkit.linalg.layout import check_array, n_devices, onto_mesh
from shardkit.placement import constrain

__all__ = ["CGInfo", "cg"]


class CGInfo(NamedTuple):
    """What :func:`cg` did.

    Attributes:
        iterations: int32 number of iterations run.
        residual_norm: ``||b - A x||`` of the recurrence residual at exit.
        converged: whether ``residual_norm <= max(tol * ||b||, atol)``.
    """

    iterations: jax.Array
    residual_norm: jax.Array
    converged: jax.Array


def _matvec_local(a, x, *, axes):
    x_full = lax.all_gather(x, axes, tiled=True)  # (N,): the only vector-sized message
    return a @ x_full  # (N/P,)


def _dot_local(x, y, *, axes):
    """``x^H y`` (conjugating ``x``, as the Hermitian CG needs; a no-op for real data)."""
    return lax.psum(jnp.sum(jnp.conj(x) * y), axes)


def _dots_local(r, z, *, axes):
    """``(r^H r, r^H z)`` in one scalar-pair ``psum``."""
    rc = jnp.conj(r)
    return lax.psum(jnp.stack([jnp.sum(rc * r), jnp.sum(rc * z)]), axes)


def _norm(squared):
    """The norm from ``v^H v``, whose imaginary part is zero (rounding aside)."""
    return jnp.sqrt(jnp.real(squared))


def _diag_local(a, *, axes):
    rows = a.shape[0]
    start = lax.axis_index(axes) * rows
    block = lax.dynamic_slice_in_dim(a, start, rows, axis=1)  # (N/P, N/P) diagonal block
    return jnp.diagonal(block)


@functools.partial(
    jax.jit, static_argnames=("matvec", "precond", "mesh", "axes", "maxiter", "jacobi")
)
def _cg_jit(a, b, x0, tol, atol, matvec, precond, mesh, axes, maxiter, jacobi):
    vec = P(axes)
    smap = functools.partial(jax.shard_map, mesh=mesh)
    dot = smap(functools.partial(_dot_local, axes=axes), in_specs=(vec, vec), out_specs=P())
    dots = smap(functools.partial(_dots_local, axes=axes), in_specs=(vec, vec), out_specs=P())
    dtype = layout.solve_dtype(b.dtype) if a is None else layout.solve_dtype(a.dtype, b.dtype)
    if a is not None:
        a = constrain(a.astype(dtype), mesh, P(axes, None))
        mv = smap(functools.partial(_matvec_local, axes=axes), in_specs=(P(axes, None), vec),
                  out_specs=vec)  # fmt: skip
        op = functools.partial(mv, a)
    else:
        op = lambda v: constrain(matvec(v), mesh, vec)
    if jacobi:
        diag = smap(functools.partial(_diag_local, axes=axes), in_specs=P(axes, None),
                    out_specs=vec)(a)  # fmt: skip
        m_inv = lambda r: r / diag
    elif precond is not None:
        m_inv = lambda r: constrain(precond(r), mesh, vec)
    else:
        m_inv = lambda r: r

    b = constrain(b.astype(dtype), mesh, vec)
    x = constrain(x0.astype(dtype), mesh, vec)
    r = b - op(x)
    z = m_inv(r)
    rr, rz = dots(r, z)
    bound = jnp.maximum(tol * _norm(dot(b, b)), atol)

    def cond(c):
        return (c[-1] < maxiter) & (_norm(c[3]) > bound)

    def body(c):  # collectives: 1 all-gather of p (in op), 2 psums of scalars
        x, r, p, rr, rz, k = c
        ap = op(p)
        alpha = rz / dot(p, ap)
        x = x + alpha * p
        r = r - alpha * ap
        z = m_inv(r)
        rr, rz_new = dots(r, z)
        p = z + (rz_new / rz) * p
        return x, r, p, rr, rz_new, k + 1

    x, r, _, rr, _, k = lax.while_loop(cond, body, (x, r, z, rr, rz, jnp.zeros((), jnp.int32)))
    rnorm = _norm(rr)
    return x, CGInfo(k, rnorm, rnorm <= bound)


def cg(
    a: jax.Array | Callable[[jax.Array], jax.Array],
    b: jax.Array,
    *,
    x0: jax.Array | None = None,
    tol: float = 1e-5,
    atol: float = 0.0,
    maxiter: int | None = None,
    preconditioner: str | Callable[[jax.Array], jax.Array] | None = None,
    mesh: Mesh | None = None,
    axis_names: str | Sequence[str] | None = None,
) -> tuple[jax.Array, CGInfo]:
    """Solves ``A x = b`` for symmetric (complex: Hermitian) positive definite A by
    (preconditioned) conjugate gradients, with only vector- and scalar-sized collectives per
    iteration. A matrix ``a`` and ``b`` compute in their promoted dtype (integers as floats),
    as ``jnp.linalg.solve`` promotes.

    Args:
        a: (N, N) SPD matrix (any sharding; used row-sharded ``P(axis_names, None)``), or a
            function ``v -> A v`` on global N-vectors (matrix-free; must be hashable, e.g. a
            module-level function).
        b: (N,) right-hand side; N must be a multiple of the device count.
        x0: initial guess (default zeros).
        tol: relative tolerance: stop when ``||r|| <= max(tol * ||b||, atol)``.
        atol: absolute tolerance.
        maxiter: iteration limit (default 10 * N).
        preconditioner: None, ``"jacobi"`` (matrix ``a`` only), or a function
            ``r -> M^-1 r`` on global vectors.
        mesh: the device mesh (default: ``a.sharding.mesh``/``b.sharding.mesh`` or
            ``jax.set_mesh``).
        axis_names: mesh axes to shard vectors and rows over (default: all, flattened).

    Returns:
        ``(x, info)``: x sharded ``P(axis_names)``, and :class:`CGInfo` (iterations,
        residual_norm, converged). Not converging is reported in ``info``, not raised.

    Raises:
        ValueError: shapes do not match, N is not a multiple of the device count, an unknown
            preconditioner, "jacobi" with a matrix-free operator, or ``x0`` is not of ``b``'s
            shape.
        TypeError: ``a`` or ``b`` is not an array (a list), or ``mesh`` is not a mesh.

    Example:
        >>> x, info = cg(a, b, mesh=mesh, preconditioner="jacobi")

    See also: :func:`shardkit.linalg.cho_solve` (direct SPD solve), :func:`shardkit.linalg.solve`.
    """
    matrix = not callable(a)
    for arg, value in (("a", a), ("b", b), ("x0", x0)) if matrix else (("b", b), ("x0", x0)):
        if value is not None:
            check_array(value, arg)
    b_shape = tuple(b.shape)
    if len(b_shape) != 1:
        raise ShardkitValueError(
            f"b: expected a vector (N,), got shape {b_shape}. Solve one rhs at a time."
        )
    n = b_shape[0]
    if matrix and tuple(a.shape) != (n, n):
        raise ShardkitValueError(
            f"a: expected shape ({n}, {n}) to match b {b_shape}, got {tuple(a.shape)}. "
            "Pass the square SPD matrix of the system, or a function v -> A v."
        )
    if preconditioner not in (None, "jacobi") and not callable(preconditioner):
        raise ShardkitValueError(
            f"preconditioner: expected None, 'jacobi' or a function r -> M^-1 r, got "
            f"{preconditioner!r}. Try preconditioner='jacobi'."
        )
    if preconditioner == "jacobi" and not matrix:
        raise ShardkitValueError(
            "preconditioner: 'jacobi' needs the matrix, but a is a function. Pass the matrix, "
            "or a function r -> r / diag(A) as preconditioner."
        )
    placed = [
        x
        for x in ((a, b) if matrix else (b,))
        if isinstance(getattr(x, "sharding", None), NamedSharding)
    ]
    source = placed[0] if placed else (a if matrix else b)  # a's mesh, else b's (documented)
    mesh, axes = layout.resolve_mesh(source, mesh, axis_names, arg="a")
    p = n_devices(mesh, axes)
    if n % p:
        raise ShardkitValueError(
            f"b: size {n} is not a multiple of the {p} devices along mesh axes {axes} "
            f"(mesh {dict(mesh.shape)}). Pad the system to {-(-n // p) * p} (e.g. identity rows)."
        )
    if x0 is not None and tuple(x0.shape) != b_shape:
        raise ShardkitValueError(
            f"x0: expected shape {b_shape} to match b {b_shape}, got {tuple(x0.shape)}. Fix: "
            "pass an initial guess of b's shape, or leave x0=None (zeros)."
        )
    a, b = (onto_mesh(a, mesh, axes) if matrix else a), onto_mesh(b, mesh, axes)
    x0 = jnp.zeros((n,), b.dtype) if x0 is None else onto_mesh(x0, mesh, axes)
    maxiter = 10 * n if maxiter is None else int(maxiter)
    return _cg_jit(
        a if matrix else None, b, x0, tol, atol,
        None if matrix else a,
        preconditioner if callable(preconditioner) else None,
        mesh, axes, maxiter, preconditioner == "jacobi",
    )  # fmt: skip
