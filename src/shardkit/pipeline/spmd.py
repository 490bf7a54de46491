"""Helpers for the pipeline executor's ``shard_map`` bodies: varying types, layouts, slots.

Inside ``jax.shard_map`` with ``check_vma`` every value is typed as varying or invariant over
each manual mesh axis; :func:`vary` makes loop carries and switch outputs uniformly varying.
:func:`place` puts inputs where ``in_specs`` expects them on Explicit meshes, :func:`reduce`
sums or averages many leaves in one collective, :func:`gather` all-gathers a sharded table
into an invariant whole (its transpose is a local slice), and :func:`regroup` moves stage parameters
between the block layout of ``P('stage')`` and the chunk layout of interleaved schedules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.rings import vary as vary  # the pipeline's loop carries, typed as the rings'


def reduce(tree: Any, op: Callable, axes: Sequence[str]) -> Any:
    """Reduces all leaves of ``tree`` over ``axes`` in one (tuple) collective.

    The leaves go to one ``psum``/``pmean`` together rather than concatenated, so leaves that
    the compiler shards over other mesh axes (e.g. 'tensor') keep their layout.
    """
    leaves, treedef = jax.tree.flatten(tree)
    if not leaves or not axes:
        return tree
    return jax.tree.unflatten(treedef, op(leaves, tuple(axes)))


def gather(x: Any, spec: Sequence[Any]) -> Any:
    """All-gathers ``x`` (inside shard_map) over the mesh axes of ``spec``, dim by dim.

    The result is invariant over those mesh axes, so its transpose is a local slice: the
    cotangent of a gathered table is cut back to each device's piece with no collective.

    Example:
        >>> # in_specs P("tensor", None): the [V / t, D] piece -> the whole [V, D] table
        >>> table = gather(piece, P("tensor", None))
    """
    for dim, entry in enumerate(spec):
        names = tuple(n for n in (entry if isinstance(entry, tuple) else (entry,)) if n)
        if names:
            x = lax.all_gather(x, names, axis=dim, tiled=True, to="invarying")
    return x


def index(tree: Any, i: Any) -> Any:
    return jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, i, 0, keepdims=False), tree)


def put(tree: Any, i: Any, val: Any) -> Any:
    return jax.tree.map(lambda a, b: lax.dynamic_update_index_in_dim(a, b, i, 0), tree, val)


def buffer(proto: Any, n: int) -> Any:
    """A buffer of ``n`` slots shaped like ``proto`` (zeros, same sharding and vma)."""
    return jax.tree.map(lambda a: jnp.broadcast_to(jnp.zeros_like(a), (n, *a.shape)), proto)


def is_explicit(mesh) -> bool:
    return any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ()))


def spec_without(x: Any, axes: Sequence[str]) -> tuple:
    """The Explicit-mesh spec of ``x``, one entry per dim, with mesh axes ``axes`` removed."""
    cur = tuple(jax.typeof(x).sharding.spec)
    cur += (None,) * (x.ndim - len(cur))
    out = []
    for entry in cur:
        names = entry if isinstance(entry, tuple) else (entry,)
        keep = tuple(n for n in names if n is not None and n not in axes)
        out.append(keep[0] if len(keep) == 1 else (keep or None))
    return tuple(out)


def place(x: Any, mesh, manual: dict[int, Any], manual_axes: Sequence[str]) -> Any:
    """On an Explicit mesh, reshard ``x`` so its manual mesh axes sit where shard_map expects.

    ``manual`` maps array dim -> the manual spec entry; other dims keep their own sharding
    minus the manual axes. On an Auto mesh nothing is needed.
    """
    if not is_explicit(mesh):
        return x
    cur = tuple(jax.typeof(x).sharding.spec)
    cur += (None,) * (x.ndim - len(cur))
    new = [manual.get(dim, e) for dim, e in enumerate(spec_without(x, manual_axes))]
    spec = P(*new)
    if tuple(spec) == cur:
        return x
    return jax.sharding.reshard(x, NamedSharding(mesh, spec))


def free_explicit_axes(mesh, manual_axes: Sequence[str]) -> tuple[str, ...]:
    """The Explicit mesh axes that a partial-manual shard_map over ``manual_axes`` leaves free."""
    types = dict(zip(mesh.axis_names, getattr(mesh, "axis_types", ()), strict=False))
    return tuple(
        a for a in mesh.axis_names if a not in manual_axes and types.get(a) == AxisType.Explicit
    )


def keep_free_axes(call: Callable, mesh, manual_axes: Sequence[str], args: tuple, out_specs) -> Any:
    """Runs ``call(abstract_mesh, *args)`` (a partial-manual shard_map) so that the Explicit mesh
    axes it leaves free keep their sharding across the shard_map boundary.

    JAX lowers a partial-manual shard_map on a mesh without Auto axes with closed dimension
    shardings, so a free Explicit axis (e.g. 'tensor') is replicated at the boundary: every
    tensor-split input is all-gathered on entry and every output on exit (then sliced again
    inside). Running the shard_map under ``jax.sharding.auto_axes`` over those axes leaves the
    dimensions open and the compiler keeps the layout; ``out_specs`` (a tree of
    ``PartitionSpec`` over the outputs) restores the Explicit types afterwards.
    """
    free = free_explicit_axes(mesh, manual_axes)
    if not free:
        return call(mesh, *args)

    def inner(*a):
        # the concrete devices with the region's axis types: a shard_map on the abstract mesh
        # alone leaves the program no device assignment when no input is on `mesh` yet
        types = jax.sharding.get_abstract_mesh().axis_types
        return call(Mesh(mesh.devices, mesh.axis_names, axis_types=types), *a)

    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        return jax.sharding.auto_axes(inner, axes=free, out_sharding=out_specs)(*args)


def spec_of(x: Any) -> P:
    """``x``'s PartitionSpec on an Explicit mesh (``P()`` when it has none)."""
    spec = getattr(jax.typeof(x).sharding, "spec", None)
    return P(*spec) if spec is not None else P()


def regroup(tree: Any, p: int, v: int, stage_axis: str, *, to_chunks: bool) -> Any:
    """Moves stage parameters between the block layout and the chunk layout (inside shard_map).

    Block layout (how ``P('stage')`` splits the ``p*v`` model stages): device ``a`` holds
    stages ``a*v .. a*v+v-1``. Chunk layout (what the schedules run): device ``d`` holds
    stages ``c*p + d`` for chunks ``c = 0 .. v-1``. For each (chunk ``c``, block slot ``b``)
    the devices that exchange form a partial permutation, so ``v**2`` ppermutes of one stage
    each move every stage once, with no all-gather. With ``v = 1`` both layouts agree.
    """
    if v == 1:
        return tree
    moves = []  # (c, b, [(block device, chunk device)])
    for c in range(v):
        for b in range(v):
            pairs = [((c * p + d) // v, d) for d in range(p) if (c * p + d) % v == b]
            if pairs:
                moves.append((c, b, pairs))

    def move(x, pairs):
        if all(src == dst for src, dst in pairs):  # stays on its device: no collective
            here = jnp.isin(lax.axis_index(stage_axis), jnp.array([src for src, _ in pairs]))
            return jnp.where(here, x, jnp.zeros_like(x))
        return lax.ppermute(x, stage_axis, pairs)

    def one(a):  # a: [v, ...] local
        out = [jnp.zeros_like(a[0]) for _ in range(v)]
        for c, b, pairs in moves:
            if to_chunks:
                out[c] = out[c] + move(a[b], pairs)
            else:
                out[b] = out[b] + move(a[c], [(d, s) for s, d in pairs])
        return jnp.stack(out)

    return jax.tree.map(one, tree)
