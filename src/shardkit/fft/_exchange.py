"""The local data movement of the distributed transforms: all-to-alls that swap which FFT dim
is sharded, and the local transposes that bring the dims an FFT runs over to the trailing
positions.

A block's FFT dims are stored in some order (`order[p]` is the FFT dim at local position
`nb + p`, after `nb` batch dims). XLA's FFT transforms minor dims only, so after each all-to-all
the block is stored with the next FFT's dims trailing. Each all-to-all sends its chunks along a
leading chunk dim: XLA then fuses the chunking into one copy before the collective and the
reassembly with the reordering into one copy after it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def trailing_order(order: list[int], dims: list[int]) -> list[int]:
    """The FFT-dim storage order after bringing `dims` to the trailing local positions.

    One dim is brought last by rotating the order (the dims after it move to the front), so a
    pencil step ends in the rolled (transposed) layout; several dims keep their relative order.
    """
    if set(order[len(order) - len(dims) :]) == set(dims):
        return list(order)
    if len(dims) == 1:
        p = order.index(dims[0])
        return order[p + 1 :] + order[: p + 1]
    return [d for d in order if d not in dims] + [d for d in order if d in dims]


def to_trailing(blk: jax.Array, order: list[int], dims: list[int], nb: int):
    """Transposes the FFT dims of `blk` so that `dims` are the trailing local dims.

    `order[p]` is the FFT dim stored at local position `nb + p`; returns the new block and order
    (see `trailing_order`).
    """
    new = trailing_order(order, dims)
    if new == order:
        return blk, order
    perm = list(range(nb)) + [nb + order.index(d) for d in new]
    return jnp.transpose(blk, perm), new


def exchange(blk, axis, n: int, order: list[int], split: int, concat: int, new: list[int], nb: int):
    """All-to-all over mesh axis `axis` (`n` shards): splits FFT dim `split`, gathers `concat`.

    Returns the block with its FFT dims stored in order `new`. Equal to a tiled
    `lax.all_to_all` followed by a transpose to `new`, but the chunk index is made the leading
    dim first: XLA then fuses the chunking into one copy before the collective and the
    reassembly with the transpose into one copy after it (a tiled all-to-all on a minor dim
    costs a slice copy, a concatenate and the transpose: one full pass over the shard more).
    """
    return reassemble(send(blk, axis, n, order, split, order, nb), order, concat, new, nb)


def send(blk, axis, n: int, order: list[int], split: int, out: list[int], nb: int):
    """Splits FFT dim `split` into `n` chunks and swaps them over mesh axis `axis`.

    Returns `t[j, ..]`, the chunk that came from shard j, its FFT dims stored in order `out`.
    The chunking and the reordering are one copy before the collective.
    """
    ps = nb + order.index(split)
    shape = blk.shape
    t = blk.reshape(shape[:ps] + (n, shape[ps] // n) + shape[ps + 1 :])
    where = {d: nb + p + (p >= order.index(split)) for p, d in enumerate(order)}
    t = jnp.transpose(t, [ps] + list(range(nb)) + [where[d] for d in out])
    return swap(t, axis)


def swap(t, axis, dim: int = 0):
    """Sends chunk `t[.., j, ..]` (`j` at `dim`) to shard j of mesh axis `axis`; returns the
    chunks received, chunk j from shard j at the same place."""
    return jax.lax.all_to_all(t, axis, dim, dim, tiled=True)


def reassemble(t, order: list[int], concat: int, new: list[int], nb: int):
    """The received chunks `t[j, ..]` (FFT dims stored in `order`) joined along FFT dim
    `concat` (chunk j is its j-th block) and stored in order `new`: one copy."""
    perm = list(range(1, nb + 1))
    sizes = list(t.shape[1 : nb + 1])
    for d in new:
        q = nb + 1 + order.index(d)
        perm += [0, q] if d == concat else [q]
        sizes.append(t.shape[q] * (t.shape[0] if d == concat else 1))
    return jnp.transpose(t, perm).reshape(sizes)
