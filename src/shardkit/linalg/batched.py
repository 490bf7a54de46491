"""Many independent linear systems, one slice of the batch per device, with zero collectives.

A stack of B systems ``As[i] @ xs[i] = bs[i]`` is embarrassingly parallel: shard the batch
dimension over the mesh and let every device run LAPACK on its own systems. Written with
``shard_map`` so the compiled program provably holds no collective (the batch dimension is the
only sharded one), on Auto and Explicit mesh axes alike.

Example:
    >>> mesh = jax.make_mesh((8,), ("x",))
    >>> As = jax.random.normal(jax.random.key(0), (8, 16, 16))
    >>> bs = jax.random.normal(jax.random.key(1), (8, 16))
    >>> xs = batched_solve(As, bs, mesh=mesh)       # one system per device
    >>> xs.sharding.spec
    P('x', None)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitValueError
from shardkit.linalg import layout
from shardkit.linalg.det import SlogdetResult
from shardkit.linalg.layout import check_array, check_dtype, n_devices, onto_mesh
from shardkit.linalg.lu import SingularMatrixError
from shardkit.placement import constrain

__all__ = ["batched_det", "batched_lu", "batched_slogdet", "batched_solve"]


@functools.partial(jax.jit, static_argnames=("mesh", "axes", "vector"))
def _batched_jit(a_stack, b_stack, mesh, axes, vector):
    spec_a = P(axes, None, None)
    spec_b = P(axes, None) if vector else P(axes, None, None)
    dtype = jnp.result_type(a_stack.dtype, b_stack.dtype)  # as jnp.linalg.solve promotes
    a_stack = constrain(a_stack.astype(dtype), mesh, spec_a)
    b_stack = constrain(b_stack.astype(dtype), mesh, spec_b)

    def local(a, b):  # (B/P, N, N), (B/P, N[, k]): plain LAPACK per system
        return jnp.linalg.solve(a, b[..., None])[..., 0] if vector else jnp.linalg.solve(a, b)

    return jax.shard_map(local, mesh=mesh, in_specs=(spec_a, spec_b), out_specs=spec_b)(
        a_stack, b_stack
    )


def _check_stack(a_stack, *, square: bool = True) -> tuple[int, ...]:
    check_array(a_stack, "a_stack")
    shape = tuple(a_stack.shape)
    if len(shape) != 3 or (square and shape[1] != shape[2]):
        kind = "square matrices (B, N, N)" if square else "matrices (B, M, N)"
        raise ShardkitValueError(
            f"a_stack: expected a stack of {kind}, got shape {shape}. For one large matrix "
            "use the shardkit.linalg function without the batched_ prefix."
        )
    return shape


def _batch_axes(a_stack, mesh, axis_names) -> tuple[Mesh, tuple[str, ...]]:
    """The mesh and axes the batch is sharded over; B must be a multiple of their size."""
    mesh, axes = layout.resolve_mesh(a_stack, mesh, axis_names, arg="a_stack")
    p, b = n_devices(mesh, axes), a_stack.shape[0]
    if b % p:
        raise ShardkitValueError(
            f"a_stack: batch size {b} is not a multiple of the {p} devices along mesh axes "
            f"{axes} (mesh {dict(mesh.shape)}). Pad the batch to {-(-b // p) * p} systems "
            "(e.g. with identity matrices) or pass axis_names= a smaller mesh axis."
        )
    return mesh, axes


def _per_device(fn, a_stack, mesh, axes, n_out):
    """Runs ``fn`` on each device's slice of the batch: no collectives."""
    spec = P(axes)
    f = jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=(spec,) * n_out)
    return f(constrain(a_stack, mesh, P(axes, None, None)))


@functools.partial(jax.jit, static_argnames=("mesh", "axes"))
def _slogdet_jit(a_stack, mesh, axes):
    return _per_device(lambda a: tuple(jnp.linalg.slogdet(a)), a_stack, mesh, axes, 2)


@functools.partial(jax.jit, static_argnames=("mesh", "axes"))
def _lu_jit(a_stack, mesh, axes):
    return _per_device(lambda a: tuple(lax.linalg.lu(a)), a_stack, mesh, axes, 3)


def batched_slogdet(
    a_stack: jax.Array,
    *,
    mesh: Mesh | None = None,
    axis_names: str | Sequence[str] | None = None,
) -> SlogdetResult:
    """Sign and log|det| of B matrices, sharded over the batch (no collectives).

    Args:
        a_stack: (B, N, N) real or complex matrices; B a multiple of the device count along
            ``axis_names``; any sharding.
        mesh: the device mesh (default: ``a_stack.sharding.mesh`` or ``jax.set_mesh``).
        axis_names: mesh axes to shard the batch over (default: all, flattened).

    Returns:
        ``SlogdetResult(sign, logabsdet)``, each (B,) and batch-sharded, as
        ``jnp.linalg.slogdet`` gives them (for complex input ``sign`` has modulus 1).

    Raises:
        ValueError: not a (B, N, N) stack, or B is not a multiple of the device count.
        TypeError: an integer or bool dtype.

    Example:
        >>> sign, logdet = batched_slogdet(As, mesh=jax.make_mesh((8,), ("x",)))

    See also: :func:`batched_det`, :func:`shardkit.linalg.slogdet` for one large matrix.
    """
    _check_stack(a_stack)
    check_dtype(a_stack, "a_stack")
    mesh, axes = _batch_axes(a_stack, mesh, axis_names)
    return SlogdetResult(*_slogdet_jit(onto_mesh(a_stack, mesh, axes), mesh, axes))


def batched_det(
    a_stack: jax.Array,
    *,
    mesh: Mesh | None = None,
    axis_names: str | Sequence[str] | None = None,
) -> jax.Array:
    """Determinants of B matrices, sharded over the batch: ``sign * exp(logabsdet)``.

    Args and Raises: as :func:`batched_slogdet`.

    Returns:
        (B,) determinants, batch-sharded.

    Example:
        >>> d = batched_det(As, mesh=jax.make_mesh((8,), ("x",)))

    See also: :func:`batched_slogdet`, :func:`shardkit.linalg.det`.
    """
    sign, logabsdet = batched_slogdet(a_stack, mesh=mesh, axis_names=axis_names)
    return sign * jnp.exp(logabsdet)


def batched_lu(
    a_stack: jax.Array,
    *,
    mesh: Mesh | None = None,
    axis_names: str | Sequence[str] | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """LU with partial pivoting of B matrices, square or not, sharded over the batch.

    Args:
        a_stack: (B, M, N) real or complex matrices (M and N need not be equal); B a multiple
            of the device count along ``axis_names``; any sharding.
        mesh: the device mesh (default: ``a_stack.sharding.mesh`` or ``jax.set_mesh``).
        axis_names: mesh axes to shard the batch over (default: all, flattened).

    Returns:
        ``(lu, pivots, permutation)`` as ``jax.lax.linalg.lu`` gives them, batch-sharded:
        ``lu`` (B, M, N) packs L (unit lower, M x min(M, N)) and U (min(M, N) x N); ``pivots``
        (B, min(M, N)) are LAPACK's row interchanges; ``permutation`` (B, M) with
        ``a_stack[i][permutation[i]] == L @ U``.

    Raises:
        ValueError: not a (B, M, N) stack, or B is not a multiple of the device count.
        TypeError: an integer or bool dtype.

    Example:
        >>> lu, piv, perm = batched_lu(jnp.ones((8, 6, 4)), mesh=jax.make_mesh((8,), ("x",)))

    See also: :func:`shardkit.linalg.lu` for one large square matrix.
    """
    _check_stack(a_stack, square=False)
    check_dtype(a_stack, "a_stack")
    mesh, axes = _batch_axes(a_stack, mesh, axis_names)
    return _lu_jit(onto_mesh(a_stack, mesh, axes), mesh, axes)


def batched_solve(
    a_stack: jax.Array,
    b_stack: jax.Array,
    *,
    mesh: Mesh | None = None,
    axis_names: str | Sequence[str] | None = None,
    check: bool = True,
) -> jax.Array:
    """Solves B independent systems ``a_stack[i] @ x[i] = b_stack[i]``, sharded over the batch.

    Args:
        a_stack: (B, N, N) matrices; B must be a multiple of the number of devices along
            ``axis_names``. Any sharding (a batch-sharded stack is used in place; others are
            re-laid out once).
        b_stack: (B, N) right-hand sides, or (B, N, k) for k per system.
        mesh: the device mesh (default: ``a_stack.sharding.mesh`` or ``jax.set_mesh``).
        axis_names: mesh axes to shard the batch over (default: all, flattened).
        check: raise :class:`SingularMatrixError` naming the first system whose solution is not
            finite (outside ``jit`` only).

    Returns:
        x with the shape of ``b_stack``, batch-sharded ``P(axis_names, None[, None])``. The
        compiled program has no collectives.

    Raises:
        ValueError: shapes do not match, or B is not a multiple of the device count.
        SingularMatrixError: ``check`` and a system is singular.

    Example:
        >>> xs = batched_solve(As, bs, mesh=jax.make_mesh((8,), ("x",)))

    See also: :func:`shardkit.linalg.solve` for one large system.
    """
    check_array(b_stack, "b_stack")
    a_shape, b_shape = _check_stack(a_stack), tuple(b_stack.shape)
    check_dtype(a_stack, "a_stack", integers=True)  # integers promote, as in jnp.linalg.solve
    if len(b_shape) not in (2, 3) or b_shape[:2] != a_shape[:2]:
        raise ShardkitValueError(
            f"b_stack: expected shape ({a_shape[0]}, {a_shape[1]}) or ({a_shape[0]}, "
            f"{a_shape[1]}, k) to match a_stack {a_shape}, got {b_shape}."
        )
    mesh, axes = _batch_axes(a_stack, mesh, axis_names)
    a_stack, b_stack = onto_mesh(a_stack, mesh, axes), onto_mesh(b_stack, mesh, axes)
    x = _batched_jit(a_stack, b_stack, mesh, axes, len(b_shape) == 2)
    if check and x.size and not isinstance(x, jax.core.Tracer):
        bad = ~jnp.isfinite(x.reshape(a_shape[0], -1)).all(axis=1)
        if bool(bad.any()):
            i = int(jnp.argmax(bad))
            raise SingularMatrixError(
                f"a_stack: system {i} of {a_shape[0]} has a non-finite solution (the matrix "
                f"a_stack[{i}] is singular or holds inf/NaN). Check that system's inputs."
            )
    return x
