# ruff: noqa: F722  (jaxtyping shape strings are not Python expressions)
"""Halo exchange over the sharded dims of a grid: ghost cells for stencils and particle-mesh codes.

A stencil or a cloud-in-cell kernel near a shard's edge needs cells its neighbour holds.
`halo_exchange` gives every shard `width` ghost cells on both sides of each sharded dim, copied
from the neighbouring shards with `lax.ppermute` (two per sharded dim, one each way). Doing the
dims one after the other also fills the corners: the second exchange sends slabs that already
hold the first one's ghosts, so a diagonal neighbour's cells arrive in two hops. At the domain's
edges the ghosts wrap around (`periodic=True`) or are zero.

`halo_accumulate` is its adjoint: each shard's ghost cells are added into the neighbour that owns
them, and the ghosts are dropped. A cloud-in-cell paint deposits into the padded local grid and
accumulates; a read-out exchanges first and reads the padded grid. Dims that are whole on every
device (or sharded over a mesh axis of size 1) get no ghosts: index them modulo their size.

The padded array is an ordinary sharded array: along a dim of size N sharded n ways each shard
holds N / n + 2 * width cells, so its global size is N + 2 * width * n, with the input's spec.

Example:
    >>> mesh = jax.make_mesh((2, 4), ("x", "y"))
    >>> f = jax.device_put(jnp.ones((16, 16)), NamedSharding(mesh, P("x", "y")))
    >>> g = shardkit.fft.halo_exchange(f, 1)        # each shard: (8 + 2, 4 + 2)
    >>> g.shape, g.sharding.spec
    ((20, 24), P('x', 'y'))
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Shaped

from shardkit.errors import ShardkitTypeError, ShardkitValueError
from shardkit.fft import _layout as L


def _perm(n: int, shift: int, periodic: bool) -> list[tuple[int, int]]:
    """ppermute pairs sending shard i to i + shift (dropped past the edges unless periodic)."""
    pairs = [(i, i + shift) for i in range(n)]
    if periodic:
        return [(i, j % n) for i, j in pairs]
    return [(i, j) for i, j in pairs if 0 <= j < n]


def _take(blk, dim: int, start: int, stop: int):
    return jax.lax.slice_in_dim(blk, start, stop, axis=dim)


def _exchange_dim(blk, dim: int, axis, n: int, w: int, periodic: bool):
    """Pads `blk` along `dim` with `w` ghost cells from the neighbours over mesh axis `axis`."""
    size = blk.shape[dim]
    from_left = jax.lax.ppermute(_take(blk, dim, size - w, size), axis, _perm(n, 1, periodic))
    from_right = jax.lax.ppermute(_take(blk, dim, 0, w), axis, _perm(n, -1, periodic))
    return jnp.concatenate([from_left, blk, from_right], axis=dim)  # (.., w + size + w, ..)


def _accumulate_dim(blk, dim: int, axis, n: int, w: int, periodic: bool):
    """Adds the `w` ghost cells on each side of `dim` into the neighbour that owns them."""
    size = blk.shape[dim]
    inner = _take(blk, dim, w, size - w)  # (.., size - 2w, ..)
    # the right neighbour's left ghosts are my last w cells; the left one's right ghosts my first
    from_right = jax.lax.ppermute(_take(blk, dim, 0, w), axis, _perm(n, -1, periodic))
    from_left = jax.lax.ppermute(_take(blk, dim, size - w, size), axis, _perm(n, 1, periodic))
    index = [slice(None)] * blk.ndim
    index[dim] = slice(0, w)
    inner = inner.at[tuple(index)].add(from_left)
    index[dim] = slice(inner.shape[dim] - w, inner.shape[dim])
    return inner.at[tuple(index)].add(from_right)


@functools.partial(jax.jit, static_argnames=("mesh", "entries", "width", "periodic", "adjoint"))
def _halo(x, *, mesh, entries, width, periodic, adjoint):
    sizes = dict(mesh.shape)
    dims = [d for d, e in enumerate(entries) if L.entry_size(e, sizes) > 1]

    def body(blk):
        for d in reversed(dims) if adjoint else dims:  # the adjoint runs the steps backwards
            n = L.entry_size(entries[d], sizes)
            step = _accumulate_dim if adjoint else _exchange_dim
            blk = step(blk, d, entries[d], n, width, periodic)
        return blk

    spec = P(*entries)
    return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)(x)


def _check(x, width: Any, periodic: Any, fname: str, spec, mesh, padded: bool):
    """Validates `width`, `periodic` and the layout of `x`; returns `x` (placed on the mesh as
    `spec=` says if it was on none, `L.resolve_placed`), the mesh and the spec entries."""
    if isinstance(width, bool) or not isinstance(width, int) or width < 0:
        raise ShardkitValueError(
            f"{fname}: width={width!r} must be a non-negative int (ghost cells on each side of "
            f"every sharded dim); fix: pass e.g. width=1 for cloud-in-cell."
        )
    if not isinstance(periodic, bool | np.bool_):
        raise ShardkitTypeError(
            f"{fname}: periodic={periodic!r} is a {type(periodic).__name__}, not a bool; fix: "
            f"pass periodic=True (wrap around at the domain's edges) or periodic=False (zeros)."
        )
    x, mesh, entries = L.resolve_placed(x, spec, mesh, fname)
    sizes = dict(mesh.shape)
    if not any(L.entry_size(e, sizes) > 1 for e in entries):
        raise ShardkitValueError(
            f"{fname}: x (shape {tuple(x.shape)}, spec {P(*entries)}) is not sharded over mesh "
            f"{sizes}, so no shard has a neighbour to exchange with; fix: shard x first, e.g. "
            f"jax.device_put(x, NamedSharding(mesh, P('x'))), or pad a replicated array with "
            f"jnp.pad(x, {width}, mode='wrap')."
        )
    for d, e in enumerate(entries):
        n = L.entry_size(e, sizes)
        L.check_divisible(tuple(x.shape), d, e, mesh, fname, "it is sharded over that mesh axis")
        local = x.shape[d] // n
        need = 3 * width if padded else width
        if n > 1 and local < need:
            what = "a padded shard holds 2 * width ghosts and" if padded else "each shard"
            raise ShardkitValueError(
                f"{fname}: dim {d} of x (shape {tuple(x.shape)}) has {local} cells per shard "
                f"over mesh axis {e!r} (size {n}), but {what} must hold at least {need} cells "
                f"for width={width}; fix: use width <= {local // 3 if padded else local}, or "
                f"fewer shards along dim {d}."
            )
    return x, mesh, entries


def halo_exchange(
    x: Shaped[Array, "*shape"],
    width: int,
    *,
    periodic: bool = True,
    spec: P | None = None,
    mesh: Any = None,
) -> Shaped[Array, "*padded"]:
    """Pads every shard with `width` ghost cells from its neighbours on each sharded dim.

    Two `ppermute`s per sharded dim (one each way), corners included; no gather. A dim of size
    N sharded n ways comes back with N / n + 2 * width cells per shard (global size
    N + 2 * width * n) and the input's spec; whole dims are unchanged.

    Args:
        x: array of any rank (a 2-D or 3-D grid) sharded over one or more dims.
        width: ghost cells on each side, 0 <= width <= cells per shard.
        periodic: wrap around at the domain's edges (True) or fill the ghosts there with zeros.
        spec: the PartitionSpec of `x`, needed only inside `jit` on Auto mesh axes.
        mesh: the mesh of `x` when it cannot be read from `x` or from `jax.set_mesh`.

    Returns:
        The padded array: shard i along a sharded dim holds the last `width` cells of shard
        i - 1, its own cells, then the first `width` cells of shard i + 1.

    Raises:
        ValueError: a negative or non-int `width`, a shard smaller than `width`, `x` not
            sharded or a dim that does not divide into its shards.

    Example:
        >>> g = shardkit.fft.halo_exchange(f, 1, periodic=False)   # f sharded P('x', 'y')
        >>> lap = g[:-2, 1:-1] + g[2:, 1:-1] - 2 * g[1:-1, 1:-1]  # per shard, in shard_map

    See also:
        `halo_accumulate` (the adjoint), `pfft3d`.
    """
    x, mesh, entries = _check(x, width, periodic, "halo_exchange", spec, mesh, padded=False)
    if width == 0:
        return x
    return _halo(x, mesh=mesh, entries=entries, width=width, periodic=periodic, adjoint=False)


def halo_accumulate(
    x: Shaped[Array, "*padded"],
    width: int,
    *,
    periodic: bool = True,
    spec: P | None = None,
    mesh: Any = None,
) -> Shaped[Array, "*shape"]:
    """Adds every shard's ghost cells into the neighbour that owns them and drops the ghosts.

    The adjoint of `halo_exchange` (the same `ppermute`s, backwards): a cloud-in-cell paint
    deposits into the padded local grid, then this sums the deposits that crossed a shard edge.
    At the domain's edges the ghosts wrap around (`periodic=True`) or are discarded.

    Args:
        x: a padded array, as `halo_exchange` returns: each shard holds `width` ghost cells on
            each side of every sharded dim.
        width: ghost cells on each side.
        periodic: wrap around at the domain's edges (True) or drop what falls outside.
        spec: the PartitionSpec of `x`, needed only inside `jit` on Auto mesh axes.
        mesh: the mesh of `x` when it cannot be read from `x` or from `jax.set_mesh`.

    Returns:
        The unpadded array (N / n cells per shard along a dim sharded n ways), same spec.

    Raises:
        ValueError: as `halo_exchange`, and a padded shard smaller than 3 * `width`.

    Example:
        >>> rho = shardkit.fft.halo_accumulate(padded_deposits, 1)   # see examples/particle_mesh.py

    See also:
        `halo_exchange`.
    """
    x, mesh, entries = _check(x, width, periodic, "halo_accumulate", spec, mesh, padded=True)
    if width == 0:
        return x
    return _halo(x, mesh=mesh, entries=entries, width=width, periodic=periodic, adjoint=True)
