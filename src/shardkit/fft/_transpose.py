# ruff: noqa: F722  (jaxtyping shape strings are not Python expressions)
"""Pencil transposes: the all-to-all steps of the 3-D transforms, public for spectral codes.

A pencil keeps one dim of the field whole on every device and stores it last; the other two
are sharded. For a field `f[X, Y, Z]` (numpy order) on mesh axes `a`, `b`:

    Z-pencil  f[X_a, Y_b, Z]                          the input of pfft3d
    Y-pencil  g[Z_b, X_a, Y] = jnp.transpose(f, (2, 0, 1))
    X-pencil  h[Y_a, Z_b, X] = jnp.transpose(f, (1, 2, 0))   pfft3d(..., layout="transposed")

`transpose_zy` and `transpose_yx` move one pencil on (`jnp.transpose(x, (2, 0, 1))`, one
all-to-all over the mesh axis of dim 1), `transpose_yz` and `transpose_xy` move it back
(`jnp.transpose(x, (1, 2, 0))`, one all-to-all over the mesh axis of dim 0). The local
rotation that keeps the whole dim last is the one `pfft3d` does between its FFTs, and fuses
into the all-to-all's copies. A mesh axis of size 1 (a slab) needs no all-to-all: the step is
then a local transpose. Leading dims are batch dims and keep their sharding.

Example:
    >>> mesh = jax.make_mesh((2, 4), ("a", "b"))
    >>> f = jax.device_put(jnp.ones((16, 16, 16)), NamedSharding(mesh, P("a", "b")))
    >>> g = shardkit.fft.transpose_zy(f)        # g[Z_b, X_a, Y]
    >>> g.sharding.spec
    P('b', 'a', None)
    >>> shardkit.fft.transpose_yz(g).sharding.spec
    P('a', 'b', None)
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Shaped

from shardkit.fft import _layout as L
from shardkit.fft import _partitioned as PT
from shardkit.fft import _vmap as V
from shardkit.fft._exchange import exchange, to_trailing, trailing_order


def _out_entries(entries: tuple) -> tuple:
    """PartitionSpec entries after one step: the two sharded pencil dims swap their mesh axes."""
    nb = len(entries) - 3
    a, b = entries[nb], entries[nb + 1]
    return entries[:nb] + (b, a, None)


def _local(entries: tuple, mesh_shape: dict, forward: bool):
    """The per-shard program of one step on an input sharded `entries`: (body, in_spec,
    out_spec)."""
    nb = len(entries) - 3
    axis = entries[nb + 1] if forward else entries[nb]  # the mesh axis the all-to-all runs over
    n = L.entry_size(axis, mesh_shape)

    def body(blk):  # forward: [.., X_a, Y_b, Z] -> [.., X_a, Y, Z_b] -> [.., Z_b, X_a, Y]
        gather, whole = (1, 1) if forward else (0, 0)
        if n == 1:
            return to_trailing(blk, [0, 1, 2], [whole], nb)[0]
        new = trailing_order([0, 1, 2], [whole])
        return exchange(blk, axis, n, [0, 1, 2], 2, gather, new, nb)

    return body, P(*entries), P(*_out_entries(entries))


@functools.partial(jax.jit, static_argnames=("mesh", "entries", "forward", "given"))
def _step(x, *, mesh, entries, forward, given):
    body, in_spec, out_spec = _local(entries, dict(mesh.shape), forward)
    return L.shard_map_as_given(body, mesh, given, in_spec, out_spec)(x)


def _check(shape: tuple, entries: tuple, mesh, forward: bool, fname: str) -> None:
    """Raises ValueError unless one step can run on an input of `shape` sharded `entries`."""
    L.check_fft_entries(entries, mesh, 3, fname, shape=shape)
    nb = len(entries) - 3
    split_by = entries[nb + 1] if forward else entries[nb]
    for d, e in enumerate(entries):
        L.check_divisible(shape, d, e, mesh, fname, "it is sharded over that mesh axis")
    L.check_divisible(
        shape,
        nb + 2,
        split_by,
        mesh,
        fname,
        f"the all-to-all splits the whole last dim over the mesh axis of dim {nb + int(forward)}",
    )


@functools.lru_cache(maxsize=64)  # one op per signature: eager calls then hit jit's cache
def _partitioned(shape: tuple, forward: bool, fname: str, cotangent: bool = False):
    """One step on a traced input on Auto mesh axes whose sharding XLA's partitioner chooses
    (`_partitioned`); its adjoint is the step the other way (a permutation's inverse), applied to
    a cotangent (`PT.op`'s `cotangent`)."""
    nb = len(shape) - 3
    batch = tuple(range(nb))
    perm = batch + ((nb + 2, nb, nb + 1) if forward else (nb + 1, nb + 2, nb))
    out_shape = tuple(shape[p] for p in perm)

    def plan(mesh, entries):
        _check(shape, entries, mesh, forward, fname)
        return _local(entries, dict(mesh.shape), forward)

    rule = PT.moved_rule(shape, out_shape, {nb: nb + 1, nb + 1: nb})  # the two axes swap dims
    op = PT.op(
        plan=plan, reference=lambda a: jnp.transpose(a, perm), rule=rule, fname=fname,
        cotangent=cotangent,
    )  # fmt: skip
    return PT.linear(
        op,
        lambda: _partitioned(out_shape, not forward, fname, cotangent=True),
        lambda b: _partitioned(b, forward, fname, cotangent),
    )


def _transpose(x, *, forward: bool, spec, mesh, fname: str):
    """Validates and runs one pencil step (forward: roll the dims right, else left)."""
    L.check_rank(x, 3, fname)
    if V.is_mapped(x):  # under jax.vmap: one program over the whole batch
        shape = L.roll(tuple(x.shape), 3, -1 if forward else 1)
        run = functools.partial(_transpose, forward=forward, fname=fname)
        return V.call_batched(run, x, spec, mesh, jax.ShapeDtypeStruct(shape, x.dtype))
    if V.differentiated(x):  # jax.grad or jax.jvp under jax.vmap: derivatives of the batch
        run = functools.partial(_transpose, forward=forward, spec=spec, mesh=mesh, fname=fname)
        back = functools.partial(_transpose, forward=not forward, spec=None, mesh=mesh, fname=fname)
        return V.call_differentiated(run, back, x)
    if PT.applies(x, spec):  # inside jit on Auto axes: XLA's partitioner lays x out
        return _partitioned(tuple(x.shape), forward, fname)(x)
    x, mesh, given = L.resolve_placed(x, spec, mesh, fname)
    entries = L.whole_if_trivial(given, dict(mesh.shape))
    _check(tuple(x.shape), entries, mesh, forward, fname)
    return _step(x, mesh=mesh, entries=entries, forward=forward, given=given)


def transpose_zy(
    x: Shaped[Array, "*batch x y z"], *, spec: P | None = None, mesh: Any = None
) -> Shaped[Array, "*batch z x y"]:
    """Z-pencil to Y-pencil: `f[X_a, Y_b, Z] -> jnp.transpose(f, (2, 0, 1))`, as `g[Z_b, X_a, Y]`.

    One all-to-all over mesh axis `b` (none if `b` has size 1); never gathers.

    Args:
        x: array of rank >= 3, its last dim whole and the two dims before it sharded over at
            most one mesh axis each (leading dims are batch dims).
        spec: the PartitionSpec of `x`; optional, as for `pfft3d`.
        mesh: the mesh of `x` when it cannot be read from `x` or from `jax.set_mesh`.
    Returns:
        `jnp.transpose(x, (..., -1, -3, -2))` with spec `P(b, a, None)`.

    Raises:
        ValueError: rank < 3, the last dim sharded, a dim that does not divide into its shards
            (the last dim must divide by the size of `b`), `x` not sharded.

    Example:
        >>> g = shardkit.fft.transpose_zy(f)          # f sharded P('a', 'b')
        >>> bool(np.array_equal(g, np.transpose(f, (2, 0, 1)))), g.sharding.spec
        (True, P('b', 'a', None))

    See also:
        `transpose_yz` (inverse), `transpose_yx`, `pfft3d`.
    """
    return _transpose(x, forward=True, spec=spec, mesh=mesh, fname="transpose_zy")


def transpose_yz(
    x: Shaped[Array, "*batch z x y"], *, spec: P | None = None, mesh: Any = None
) -> Shaped[Array, "*batch x y z"]:
    """Y-pencil to Z-pencil, the inverse of `transpose_zy`: `g[Z_b, X_a, Y] -> f[X_a, Y_b, Z]`.

    One all-to-all over the mesh axis of dim 0 (`b`); never gathers.

    Args:
        x: array of rank >= 3, its last dim whole and the two dims before it sharded over at
            most one mesh axis each (leading dims are batch dims).
        spec: the PartitionSpec of `x`; optional, as for `pfft3d`.
        mesh: the mesh of `x` when it cannot be read from `x` or from `jax.set_mesh`.
    Returns:
        `jnp.transpose(x, (..., -2, -1, -3))` with the two sharded dims' mesh axes swapped back.

    Raises:
        ValueError: as `transpose_zy`.

    Example:
        >>> f2 = shardkit.fft.transpose_yz(shardkit.fft.transpose_zy(f))   # f, sharded as f

    See also:
        `transpose_zy`, `transpose_xy`.
    """
    return _transpose(x, forward=False, spec=spec, mesh=mesh, fname="transpose_yz")


def transpose_yx(
    x: Shaped[Array, "*batch z x y"], *, spec: P | None = None, mesh: Any = None
) -> Shaped[Array, "*batch y z x"]:
    """Y-pencil to X-pencil: `g[Z_b, X_a, Y] -> jnp.transpose(g, (2, 0, 1))`, as `h[Y_a, Z_b, X]`.

    The same step as `transpose_zy`, one pencil on: one all-to-all over the mesh axis of dim 1
    (`a`). `transpose_yx(transpose_zy(f))` is `jnp.transpose(f, (1, 2, 0))` sharded like `f`,
    the layout of `pfft3d(..., layout="transposed")`.

    Args:
        x: array of rank >= 3, its last dim whole and the two dims before it sharded over at
            most one mesh axis each (leading dims are batch dims).
        spec: the PartitionSpec of `x`; optional, as for `pfft3d`.
        mesh: the mesh of `x` when it cannot be read from `x` or from `jax.set_mesh`.
    Returns:
        `jnp.transpose(x, (..., -1, -3, -2))` with the two sharded dims' mesh axes swapped.

    Raises:
        ValueError: as `transpose_zy`.

    Example:
        >>> h = shardkit.fft.transpose_yx(shardkit.fft.transpose_zy(f))
        >>> h.sharding.spec                            # f was P('a', 'b')
        P('a', 'b', None)

    See also:
        `transpose_xy` (inverse), `transpose_zy`.
    """
    return _transpose(x, forward=True, spec=spec, mesh=mesh, fname="transpose_yx")


def transpose_xy(
    x: Shaped[Array, "*batch y z x"], *, spec: P | None = None, mesh: Any = None
) -> Shaped[Array, "*batch z x y"]:
    """X-pencil to Y-pencil, the inverse of `transpose_yx`: `h[Y_a, Z_b, X] -> g[Z_b, X_a, Y]`.

    One all-to-all over the mesh axis of dim 0 (`a`); never gathers.

    Args:
        x: array of rank >= 3, its last dim whole and the two dims before it sharded over at
            most one mesh axis each (leading dims are batch dims).
        spec: the PartitionSpec of `x`; optional, as for `pfft3d`.
        mesh: the mesh of `x` when it cannot be read from `x` or from `jax.set_mesh`.
    Returns:
        `jnp.transpose(x, (..., -2, -1, -3))` with the two sharded dims' mesh axes swapped.

    Raises:
        ValueError: as `transpose_zy`.

    Example:
        >>> g2 = shardkit.fft.transpose_xy(shardkit.fft.transpose_yx(g))   # g, sharded as g

    See also:
        `transpose_yx`, `transpose_yz`.
    """
    return _transpose(x, forward=False, spec=spec, mesh=mesh, fname="transpose_xy")
