"""Layout changes inside `jit` that work on Auto, Explicit and mixed mesh axes.

On Auto axes a layout is a hint (`jax.lax.with_sharding_constraint`); on Explicit axes it is
part of the array's type and changes with `jax.sharding.reshard`. Neither call accepts the
other kind of axis, and a constraint that names no Explicit axis leaves an Explicit split in
place, so `constrain` splits the wanted spec in two: the Explicit axes go to `reshard`, the Auto
axes to `with_sharding_constraint`. Manual axes (inside `shard_map`) are left alone. On a mixed
mesh a dim split over both kinds has its Explicit axes first (they are part of the type; the
constraint adds the Auto ones after them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["constrain", "constrain_tree"]


def _keep(spec: Sequence[Any], axes: set[str]) -> P:
    """`spec` with only the mesh axes in `axes` left."""
    out = []
    for entry in spec:
        names = entry if isinstance(entry, tuple) else (entry,)
        kept = tuple(a for a in names if a is not None and a in axes)
        out.append(kept if len(kept) > 1 else (kept[0] if kept else None))
    return P(*out)


def constrain(x: jax.Array, mesh: Any, spec: P | Sequence[Any]) -> jax.Array:
    """Lays `x` out as `spec` on `mesh` inside `jit`, whatever the mesh's axis types.

    Args:
        x: an array (or tracer).
        mesh: a `Mesh` or `AbstractMesh`.
        spec: a `PartitionSpec` or a sequence of its entries.

    Example:
        >>> y = jax.jit(lambda x: constrain(x, mesh, P("data", None)))(x)  # doctest: +SKIP
    """
    kinds = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))
    explicit = {a for a, t in kinds.items() if t == AxisType.Explicit}
    auto = {a for a, t in kinds.items() if t == AxisType.Auto}
    if explicit:
        x = jax.sharding.reshard(x, NamedSharding(mesh, _keep(spec, explicit)))
    if auto:
        x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, _keep(spec, auto)))
    return x


def constrain_tree(tree: Any, mesh: Any, specs: Any) -> Any:
    """`constrain` over a pytree, with a tree of `PartitionSpec`s mirroring it."""
    return jax.tree.map(
        lambda x, s: constrain(x, mesh, s), tree, specs, is_leaf=lambda s: isinstance(s, P)
    )
