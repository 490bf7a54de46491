"""Writing a local product into a block tile by tile, so no step holds a whole product.

``c + a @ b`` written as one expression makes XLA's CPU backend write ``a @ b`` to a fresh
buffer the size of ``c`` before adding it, and a sliced operand (``b[k0:k1, :]``) is copied
whole before the dot reads it: a K-panel step of SUMMA or of a K-sharded ring would then hold a
second output block and a second panel. :func:`add_product` instead writes the product one
tile of columns (or rows) at a time in a loop, updating ``c`` in place and slicing each operand
only as far as the tile needs, so the extra memory is one tile of the product plus the tile of
the operand it cuts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["add_product", "dot", "tile_count"]

Window = tuple[tuple[object, int], tuple[object, int]]  # ((start, size), (start, size))


def dot(a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    """``a @ b`` at full precision, accumulated in ``dtype``."""
    return jnp.dot(a, b, precision=lax.Precision.HIGHEST, preferred_element_type=dtype)


def tile_count(extent: int, want: int) -> int:
    """The largest divisor of ``extent`` that is at most ``want`` (at least 1)."""
    for t in range(max(1, min(want, extent)), 0, -1):
        if extent % t == 0:
            return t
    return 1


def _at(*starts) -> tuple[jax.Array, ...]:
    """Start indices as int32 (loop counters are int64 when x64 is on)."""
    return tuple(jnp.asarray(v, jnp.int32) for v in starts)


def _window(x: jax.Array, win: Window) -> jax.Array:
    """``x`` cut to ``win``; no copy when the window is the whole array."""
    (r0, rows), (c0, cols) = win
    if (rows, cols) == x.shape:
        return x
    return lax.dynamic_slice(x, _at(r0, c0), (rows, cols))


def _whole(x: jax.Array) -> Window:
    """The window covering all of ``x``."""
    return ((0, x.shape[0]), (0, x.shape[1]))


def add_product(
    c: jax.Array,
    a: jax.Array,
    b: jax.Array,
    *,
    tiles: int,
    axis: int,
    dtype,
    a_win: Window | None = None,
    b_win: Window | None = None,
    at: tuple[object, object] = (0, 0),
    overwrite: bool = False,
) -> jax.Array:
    """Adds ``a[a_win] @ b[b_win]`` into ``c`` at offset ``at``, ``tiles`` tiles at a time.

    ``axis=1`` cuts the product's columns (tiles of ``b``'s window), ``axis=0`` its rows
    (tiles of ``a``'s window); the other operand's window is cut once. ``tiles`` must divide the
    cut dim. ``overwrite=True`` writes the product instead of adding it (``c`` there is zero).
    Windows default to the whole operand; their starts may be traced values.
    """
    a_win = a_win or _whole(a)
    b_win = b_win or _whole(b)
    (ar0, rows), (ak0, k) = a_win
    (bk0, _), (bc0, cols) = b_win
    if axis == 1:
        a, width = _window(a, a_win), cols // tiles
    else:
        b, width = _window(b, b_win), rows // tiles

    def tile(t, c):
        start = t * width
        if axis == 1:
            part = dot(a, _window(b, ((bk0, k), (bc0 + start, width))), dtype)
            pos = _at(at[0], at[1] + start)
        else:
            part = dot(_window(a, ((ar0 + start, width), (ak0, k))), b, dtype)
            pos = _at(at[0] + start, at[1])
        if not overwrite:
            part = part + lax.dynamic_slice(c, pos, part.shape)
        return lax.dynamic_update_slice(c, part.astype(c.dtype), pos)

    if tiles == 1:
        return tile(0, c)
    return lax.fori_loop(0, tiles, tile, c)
