"""Pytree leaves as shardkit reads them: paths, shapes and dtypes, and Flax NNX Variables.

An NNX Variable is kept whole as a leaf (its value and its logical-axis annotation travel
together); Flax is looked up in ``sys.modules`` only, so importing shardkit never imports it.
"""

from __future__ import annotations

import sys
from typing import Any

import jax
import numpy as np

from shardkit.common import path_str

__all__ = ["is_variable", "leaf_path_items", "leaf_shape_dtype", "leaf_value", "logical_names"]


def is_variable(x: Any) -> bool:
    """Whether ``x`` is a Flax NNX Variable (False when Flax NNX was never imported)."""
    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(x, nnx.Variable)


def leaf_value(x: Any) -> Any:
    """The array inside an NNX Variable, else ``x`` itself."""
    if is_variable(x):
        return x.get_value() if hasattr(x, "get_value") else x.value
    return x


def leaf_shape_dtype(x: Any) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of an array-like leaf (array, ShapeDtypeStruct, NNX Variable, scalar).

    A typed PRNG key (`jax.random.key`, NNX's Rngs streams) keeps its key dtype, which NumPy
    does not know; its `itemsize` is the key's bytes."""
    v = leaf_value(x)
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        shape = tuple(int(d) for d in v.shape)
        if jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key):
            return shape, v.dtype
        return shape, np.dtype(v.dtype)
    a = np.asarray(v)
    return a.shape, a.dtype


def logical_names(x: Any) -> tuple[str | None, ...] | None:
    """Logical axis names an NNX Variable carries (``nnx.with_partitioning`` / ``sharding=``)."""
    if not is_variable(x):
        return None
    meta = x.get_metadata() if hasattr(x, "get_metadata") else {}
    for key in ("out_sharding", "sharding_names", "sharding"):
        names = meta.get(key)
        if names:
            return tuple(names)
    return None


def leaf_path_items(tree: Any) -> list[tuple[str, Any]]:
    """``[(path string, leaf)]`` for a pytree, NNX Variables kept whole as leaves."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_variable)
    return [(path_str(p), leaf) for p, leaf in flat]
