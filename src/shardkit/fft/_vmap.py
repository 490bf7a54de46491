"""`jax.vmap` of the distributed transforms: the mapped dim becomes one more leading batch dim.

Every transform already takes leading batch dims, sharded or not (`pfft3d` on `x[B_b, X_x, Y_y,
Z]` runs one program whose all-to-alls stay within the mesh axes `x` and `y`). Under `jax.vmap`
the transform sees one batch element instead, whose layout no longer says which mesh axes shard
the mapped dim: on Explicit mesh axes the element's spec drops it (so mesh axis `b` looks unused),
on Auto mesh axes nothing can be read at all. So when `x` is mapped by `jax.vmap`, the call goes
through `jax.custom_batching.custom_vmap`, whose rule receives the whole batch with the mapped
dim first and runs the same transform on it, with the batch's own sharding (or the mapped dim's
entry from `spmd_axis_name=`, or none) in front of the element's spec.

Inside `jax.grad` or `jax.jvp` under `jax.vmap` (per-example derivatives) the transform sees a
differentiated element instead, not a mapped one: `call_differentiated` then gives the
derivative itself, as a custom JVP (the transform of the tangent) or VJP (the adjoint on the
cotangent), whose rules see the mapped values and so take `call_batched`.

Example:
    >>> mesh = jax.make_mesh((2, 2, 2), ("b", "x", "y"))
    >>> xs = jax.device_put(jnp.ones((4, 16, 16, 16)), NamedSharding(mesh, P("b", "x", "y")))
    >>> jax.vmap(shardkit.fft.pfft3d)(xs).sharding.spec     # the same program as pfft3d(xs)
    P('b', None, 'x', 'y')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from shardkit.compat import autodiff_over_vmap, is_vmap_mapped
from shardkit.fft import _layout as L

Run = Callable[..., jax.Array]  # run(x, spec=..., mesh=...): a transform with its options bound


def is_mapped(x: Any) -> bool:
    """Whether `x` is a value that the innermost `jax.vmap` maps over a dim."""
    return is_vmap_mapped(x)


def _batch_entry(x: Any, spec: P, mesh: Any) -> L.Entry:
    """The mesh axes that shard the mapped dim of `x`, whose batch elements are sharded `spec`.

    From the batch's own sharding (a concrete array, or a traced value on Explicit mesh axes),
    else from `jax.vmap(..., spmd_axis_name=...)`. Else (Auto mesh axes inside `jit`) the mesh
    axes of size > 1 that `spec` leaves unused, when the mapped dim divides into their shards:
    a transform needs every such axis to shard some dim, so they can only shard the mapped dim
    (if they do not, the partitioner reshards the batch to match, with the same result).
    Otherwise None (the mapped dim is whole).
    """
    own = L.spec_of(x.val)
    if own is not None:
        return L.normalize(own, x.val.ndim)[x.batch_dim]
    name = getattr(getattr(x._trace, "axis_data", None), "spmd_name", None)
    if name is not None:
        return L.normalize(P(tuple(name) if isinstance(name, list | tuple) else name), 1)[0]
    mesh = mesh if mesh is not None else L.mesh_of(x.val)
    if mesh is None or not mesh.axis_names:
        mesh = jax.sharding.get_abstract_mesh()
    sizes = dict(mesh.shape)
    used = {n for e in L.normalize(spec, len(x.shape)) for n in L.entry_names(e)}
    idle = tuple(n for n, size in sizes.items() if size > 1 and n not in used)
    if not idle or x.val.shape[x.batch_dim] % L.entry_size(idle, sizes):
        return None
    return idle if len(idle) > 1 else idle[0]


def call_batched(run: Run, x: Any, spec: P | None, mesh: Any, out: jax.ShapeDtypeStruct):
    """Runs `run` on the whole batch of a vmapped `x`, the mapped dim as its first batch dim.

    Args:
        run: the transform with its options bound, called as `run(a, spec=..., mesh=...)`.
        x: a value mapped by `jax.vmap` (`is_mapped(x)`).
        spec: the user's PartitionSpec of one batch element, or None to read the batch's own.
        mesh: the user's mesh, or None.
        out: shape and dtype of one batch element of the result (for tracing only).

    Returns:
        The result for one batch element, mapped by the same `jax.vmap`.
    """
    full = (
        None if spec is None else P(_batch_entry(x, spec, mesh), *L.normalize(spec, len(x.shape)))
    )

    @jax.custom_batching.custom_vmap
    def transform(a):
        # Traced for the output's shape and dtype only: under jax.vmap the rule below runs.
        del a
        return jnp.zeros(out.shape, out.dtype)

    @transform.def_vmap
    def _rule(axis_size, in_batched, a):
        del axis_size, in_batched  # `a` is mapped (is_mapped), its mapped dim moved first
        return run(a, spec=full, mesh=mesh), True

    return transform(x)


def differentiated(x: Any) -> bool:
    """Whether `x` is traced by `jax.grad` or `jax.jvp` inside a `jax.vmap` that maps it,
    directly or through more autodiff levels (a Hessian-vector product under `jax.vmap`)."""
    return autodiff_over_vmap(x) is not None


def call_differentiated(run: Callable, adjoint: Callable, x: Any) -> jax.Array:
    """`run(x)` for an `x` traced by `jax.grad` or `jax.jvp` inside a `jax.vmap` that maps it.

    The transform sees one differentiated element, whose layout no longer names the mesh axes
    of the mapped dim (so they would look unused). Its derivative is therefore given here, and
    the values its rules see are the mapped ones, which `run` transforms as one batch
    (`call_batched`): forward mode applies `run` to the tangent (the transform is linear),
    reverse mode `adjoint` (the transform the other way) to the cotangent.

    Args:
        run: the transform with its options bound.
        adjoint: its adjoint with its options bound (the VJP of a linear map).
        x: the differentiated value (`differentiated(x)`).
    """
    if autodiff_over_vmap(x) == "reverse":
        fn = jax.custom_vjp(run)
        fn.defvjp(lambda a: (run(a), None), lambda _, ct: (adjoint(ct),))
        return fn(x)
    fn = jax.custom_jvp(run)
    fn.defjvp(lambda primals, tangents: (run(primals[0]), run(tangents[0])))
    return fn(x)
