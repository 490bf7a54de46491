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
    PartitionSpec(('x',), None)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitValueError
from shardkit.linalg import layout
from shardkit.linalg.layout import n_devices
from shardkit.linalg.lu import SingularMatrixError
from shardkit.placement import constrain

__all__ = ["batched_solve"]


@functools.partial(jax.jit, static_argnames=("mesh", "axes", "vector"))
def _batched_jit(a_stack, b_stack, mesh, axes, vector):
    spec_a = P(axes, None, None)
    spec_b = P(axes, None) if vector else P(axes, None, None)
    a_stack = constrain(a_stack, mesh, spec_a)
    b_stack = constrain(b_stack.astype(a_stack.dtype), mesh, spec_b)

    def local(a, b):  # (B/P, N, N), (B/P, N[, k]): plain LAPACK per system
        return jnp.linalg.solve(a, b[..., None])[..., 0] if vector else jnp.linalg.solve(a, b)

    return jax.shard_map(local, mesh=mesh, in_specs=(spec_a, spec_b), out_specs=spec_b)(
        a_stack, b_stack
    )


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
    a_shape, b_shape = tuple(a_stack.shape), tuple(getattr(b_stack, "shape", ()))
    if len(a_shape) != 3 or a_shape[1] != a_shape[2]:
        raise ShardkitValueError(
            f"a_stack: expected a stack of square matrices (B, N, N), got shape {a_shape}. "
            "For one large matrix use shardkit.linalg.solve."
        )
    if len(b_shape) not in (2, 3) or b_shape[:2] != a_shape[:2]:
        raise ShardkitValueError(
            f"b_stack: expected shape ({a_shape[0]}, {a_shape[1]}) or ({a_shape[0]}, "
            f"{a_shape[1]}, k) to match a_stack {a_shape}, got {b_shape}."
        )
    mesh, axes = layout.resolve_mesh(a_stack, mesh, axis_names, arg="a_stack")
    p = n_devices(mesh, axes)
    if a_shape[0] % p:
        raise ShardkitValueError(
            f"a_stack: batch size {a_shape[0]} is not a multiple of the {p} devices along mesh "
            f"axes {axes} (mesh {dict(mesh.shape)}). Pad the batch to "
            f"{-(-a_shape[0] // p) * p} systems (e.g. with identity matrices) or pass "
            "axis_names= a smaller mesh axis."
        )
    x = _batched_jit(a_stack, b_stack, mesh, axes, len(b_shape) == 2)
    if check and not isinstance(x, jax.core.Tracer):
        bad = ~jnp.isfinite(x.reshape(a_shape[0], -1)).all(axis=1)
        if bool(bad.any()):
            i = int(jnp.argmax(bad))
            raise SingularMatrixError(
                f"a_stack: system {i} of {a_shape[0]} has a non-finite solution (the matrix "
                f"a_stack[{i}] is singular or holds inf/NaN). Check that system's inputs."
            )
    return x
