"""Helpers shared by the models: parameters with logical names, and Explicit-mesh layouts."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.leaves import logical_names
from shardkit.placement import sequence_out


def param(init: Any, key: jax.Array, shape: tuple[int, ...], names: tuple[str | None, ...]):
    """Creates an `nnx.Param` holding `init(key, shape)` with logical axis `names`.

    The names are stored in Flax's `out_sharding` metadata with eager sharding off, so the
    model can be built without a mesh and a strategy decides the layout later.
    """
    assert len(names) == len(shape), (names, shape)
    return nnx.Param(init(key, shape, jnp.float32), out_sharding=names, eager_sharding=False)


def logical_axes(model_or_state: Any) -> dict:
    """Returns a pure dict mirroring the model's parameters, with each leaf's logical names.

    Leaves without names map to `None`.

    Args:
        model_or_state: an `nnx.Module` or an `nnx.State`.

    Returns:
        A nested dict with the same keys as `nnx.to_pure_dict(nnx.state(model))`.

    Example:
        >>> from shardkit.models import MLP
        >>> logical_axes(MLP((8, 4, 2), rngs=nnx.Rngs(0)))["layers"][0]["kernel"]
        ('embed', 'mlp')
    """
    state = model_or_state
    if isinstance(state, nnx.Module):
        state = nnx.state(state, nnx.Param)
    out: dict = {}
    leaves = jax.tree_util.tree_flatten_with_path(
        state, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )[0]
    for path, variable in leaves:
        keys = [getattr(k, "key", getattr(k, "idx", k)) for k in path]
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = logical_names(variable)
    return out


def _explicit_mesh(x: jax.Array):
    sharding = jax.typeof(x).sharding
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty:
        return None, None
    if not any(t == AxisType.Explicit for t in mesh.axis_types):
        return None, None
    return mesh, sharding.spec


def batch_out(x: jax.Array, ndim: int) -> NamedSharding | None:
    """Layout `x`'s batch (leading) sharding with all other dims replicated, on Explicit meshes.

    Used as `out_sharding` for a gather from a sharded table (a vocab-parallel embedding).
    Returns None on Auto meshes or outside a mesh: the compiler decides there.
    """
    mesh, spec = _explicit_mesh(x)
    if mesh is None:
        return None
    lead = spec[0] if len(spec) else None
    return NamedSharding(mesh, P(lead, *([None] * (ndim - 1))))


def row_parallel_out(x: jax.Array, ndim: int) -> NamedSharding | None:
    """`out_sharding` for `x @ w` contracting `x`'s last dim, needed on Explicit meshes.

    When `x`'s last (contracting) dim is sharded, as after a column-parallel layer, an
    Explicit mesh asks for the output layout: the batch layout of `x` with the partial sums
    reduced (an all-reduce, Megatron's row-parallel matmul). Otherwise returns None.
    """
    mesh, spec = _explicit_mesh(x)
    if mesh is None or len(spec) < x.ndim or spec[-1] is None:
        return None
    return sequence_out(x, ndim) or batch_out(x, ndim)  # sequence parallel: reduce-scatter
