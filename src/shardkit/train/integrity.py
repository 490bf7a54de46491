"""Content digests of a training state that do not depend on how it is sharded.

A checkpoint records, for every array, two 32-bit sums over its elements' bit patterns, each
element weighted by a function of its flat index (`fingerprint`). Integer addition modulo 2^32
is exact and order-free, so the sums are the same whether the array sits on one device or is
split over 8 or over several processes, and they can be checked after restoring onto any mesh.
Changing any one element changes the first sum (its weight 2i+1 is odd, hence invertible modulo
2^32); the second, with other weights and rotated bits, guards against changes that cancel in
the first. The same pass says whether every floating-point value is finite.

This is a guard against silent corruption (a flipped byte in a data file, a truncated shard),
not a cryptographic hash.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from shardkit.common import path_str

__all__ = ["fingerprint"]

_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


def _bits(x: jax.Array) -> jax.Array:
    """The elements' bit patterns as uint32 (8-byte types as a trailing pair of words).

    No reshape: an array split over Explicit mesh axes keeps its layout, and each device sums
    its own part.
    """
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):  # a typed PRNG key: its key data
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    size = x.dtype.itemsize
    if size in _UINT:
        return jax.lax.bitcast_convert_type(x, _UINT[size]).astype(jnp.uint32)
    return jax.lax.bitcast_convert_type(x, jnp.uint32)


def _flat_index(shape: tuple[int, ...]) -> jax.Array:
    """Each element's row-major position, modulo 2^32, built from iotas (no reshape)."""
    index = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for d in reversed(range(len(shape))):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, d) * jnp.uint32(stride)
        stride = stride * shape[d] % 2**32
    return index


def _leaf_digest(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    bits = _bits(x)
    i = _flat_index(bits.shape)
    s1 = jnp.sum(bits * (2 * i + 1), dtype=jnp.uint32)
    rotated = (bits << 7) | (bits >> 25)
    mixed = (rotated ^ (i * jnp.uint32(0x9E3779B9))) * jnp.uint32(0x85EBCA6B)
    s2 = jnp.sum(mixed, dtype=jnp.uint32)
    inexact = jnp.issubdtype(x.dtype, jnp.inexact)  # (a PRNG key is not)
    finite = jnp.all(jnp.isfinite(x)) if inexact else jnp.bool_(True)
    return s1, s2, finite


@jax.jit
def _digests(leaves: list[jax.Array]) -> list[tuple[jax.Array, jax.Array, jax.Array]]:
    return [_leaf_digest(x) for x in leaves]


def fingerprint(tree: Any) -> tuple[dict[str, str], list[str]]:
    """Per-array digests of `tree` and the paths of arrays holding NaN or Inf.

    Args:
        tree: a pytree of JAX or NumPy arrays (sharded or not, over any processes).

    Returns:
        `({"params/blocks/q": "89ab01cd-3f2e1a0b", ...}, ["params/w", ...])`: a digest per
        leaf (hex of the two sums) and the leaves with non-finite values.

    Example:
        >>> digests, bad = fingerprint({"w": jnp.ones((4, 4))})
        >>> list(digests), bad
        (['w'], [])
    """
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    if not flat:
        return {}, []
    paths = [path_str(p) for p, _ in flat]
    sums = jax.device_get(_digests([jnp.asarray(x) for _, x in flat]))
    digests = {p: f"{int(a):08x}-{int(b):08x}" for p, (a, b, _) in zip(paths, sums, strict=True)}
    bad = [p for p, (_, _, ok) in zip(paths, sums, strict=True) if not bool(np.asarray(ok))]
    return digests, bad
