"""Ring passes over one mesh axis inside `shard_map`: the building blocks of collective matmuls.

`ring_gather` hands each device every block of an array split over the axis, one block per
step, while the next block travels (an all-gather consumed as it arrives); `ring_reduce_scatter`
adds each device's contribution to partial sums travelling around the ring (a reduce-scatter
produced as it goes). Each step's transfer is independent of that step's computation, so the
compiler may overlap them. The steps are a `fori_loop`: one block in use and one in flight.

`shardkit.matmul`'s "collective" algorithm and tensor parallelism's overlapped matmuls
(`shardkit.overlap`) are built on them. Both differentiate: the transpose of a ring gather is
a ring reduce-scatter and the other way round.
"""

from __future__ import annotations

import numbers

import jax
from jax import lax

from shardkit.errors import ShardkitValueError

__all__ = ["ring_gather", "ring_reduce_scatter", "vary"]


def _check_ring(what: str, axis, p: int) -> None:
    """Raises unless `axis` is a mesh axis bound here (inside `shard_map`) of size `p`."""
    try:
        size = lax.axis_size(axis)
    except NameError:
        raise ShardkitValueError(
            f"{what}: mesh axis {axis!r} is not bound here: the ring runs inside jax.shard_map "
            f"over a mesh with that axis; fix: call it in the body of jax.shard_map(f, "
            f"mesh=mesh, in_specs=..., out_specs=...) whose mesh has {axis!r}."
        ) from None
    if isinstance(p, bool) or not isinstance(p, numbers.Integral) or p != size:
        raise ShardkitValueError(
            f"{what}: p={p!r} but mesh axis {axis!r} has size {size}; a ring over another "
            f"count skips or repeats blocks; fix: p={size} (jax.lax.axis_size({axis!r}))."
        )


def vary(tree, axes):
    """`tree` with every leaf typed as varying over the mesh axes `axes` (a name or a
    sequence), pcast where it is not yet: a loop carry that a `ppermute` makes varying must
    start so under `shard_map(..., check_vma=True)`, whose carry types must not change."""
    axes = (axes,) if isinstance(axes, str) else tuple(axes)

    def one(v):
        missing = tuple(a for a in axes if a not in jax.typeof(v).manual_axis_type.varying)
        return lax.pcast(v, missing, to="varying") if missing else v

    return jax.tree.map(one, tree)


def ring_gather(x, axis: str, p: int, dim: int, consume, acc, bidirectional: bool):
    """Passes blocks of ``x`` (split on ``dim``) around the ring; ``consume(acc, piece, start)``
    receives each piece with its start offset in the full (gathered) dim.

    The P-1 steps are a ``fori_loop``: one loop body holds the collective-permute(s), so the
    compiler keeps one block in flight and one in use, and cannot hoist all transfers (or all
    products) to the front, which would hold every block at once.
    """
    _check_ring("ring_gather", axis, p)
    if not -x.ndim <= dim < x.ndim:
        raise ShardkitValueError(
            f"ring_gather: dim={dim} is not a dim of the block {tuple(x.shape)}; fix: the dim "
            f"of x split over mesh axis {axis!r}, in {-x.ndim}..{x.ndim - 1}."
        )
    x, acc = vary(x, axis), vary(acc, axis)
    idx = lax.axis_index(axis)
    size = x.shape[dim]
    fwd = [(i, (i + 1) % p) for i in range(p)]
    bwd = [(i, (i - 1) % p) for i in range(p)]
    if not bidirectional:

        def step(s, carry):
            acc, cur = carry  # cur is block idx - (s - 1)
            nxt = lax.ppermute(cur, axis, fwd)  # in flight during the product below
            return consume(acc, cur, ((idx - s + 1) % p) * size), nxt

        acc, cur = lax.fori_loop(1, p, step, (acc, x))
        return consume(acc, cur, ((idx - p + 1) % p) * size)
    half = size // 2

    def step2(s, carry):
        acc, cur_f, cur_b = carry  # first half of block idx - (s-1), second half of idx + (s-1)
        nxt_f = lax.ppermute(cur_f, axis, fwd)
        nxt_b = lax.ppermute(cur_b, axis, bwd)
        acc = consume(acc, cur_f, ((idx - s + 1) % p) * size)
        acc = consume(acc, cur_b, ((idx + s - 1) % p) * size + half)
        return acc, nxt_f, nxt_b

    cur_f = lax.slice_in_dim(x, 0, half, axis=dim)
    cur_b = lax.slice_in_dim(x, half, size, axis=dim)
    acc, cur_f, cur_b = lax.fori_loop(1, p, step2, (acc, cur_f, cur_b))
    acc = consume(acc, cur_f, ((idx - p + 1) % p) * size)
    return consume(acc, cur_b, ((idx + p - 1) % p) * size + half)


def ring_reduce_scatter(contrib, axis: str, p: int, size: int, bidirectional: bool):
    """``contrib(start, length)`` is this device's partial C slice; returns the own block.

    At step s device i adds its part of block i-s-1 to the partial sum arriving from i-1, so
    after P-1 steps it holds the full sum of block i. The steps are a ``fori_loop`` (see
    :func:`ring_gather`).
    """
    _check_ring("ring_reduce_scatter", axis, p)
    if bidirectional and size % 2:
        raise ShardkitValueError(
            f"ring_reduce_scatter: bidirectional=True halves each block, but size={size} is "
            "odd (the last row would be dropped); fix: bidirectional=False, or an even block "
            "size."
        )
    idx = lax.axis_index(axis)
    fwd = [(i, (i + 1) % p) for i in range(p)]
    bwd = [(i, (i - 1) % p) for i in range(p)]
    if not bidirectional:

        def step(s, acc):
            part = contrib(((idx - s - 1) % p) * size, size)  # independent of the transfer
            return lax.ppermute(acc, axis, fwd) + part

        init = vary(contrib(((idx - 1) % p) * size, size), axis)
        return lax.fori_loop(1, p, step, init)
    half = size // 2

    def step2(s, carry):
        acc_f, acc_b = carry
        part_f = contrib(((idx - s - 1) % p) * size, half)
        part_b = contrib(((idx + s + 1) % p) * size + half, half)
        return lax.ppermute(acc_f, axis, fwd) + part_f, lax.ppermute(acc_b, axis, bwd) + part_b

    init = (contrib(((idx - 1) % p) * size, half), contrib(((idx + 1) % p) * size + half, half))
    init = vary(init, axis)
    return lax.fori_loop(1, p, step2, init)
