"""The pencil engine of the 3-D complex transforms: a 2-D FFT between two all-to-alls.

XLA:CPU runs an FFT over the trailing dims of an array only, and a local transpose of a whole
shard is nearly as dear as a 1-D FFT over it (the shard of a 128^3 grid on 8 CPU devices: 2.3x
a plain copy, against 2.8x for the FFT), while a 2-D FFT over two trailing dims handles the
strided dim inside the FFT library with no transpose. So with `x[X_a, Y_b, Z]` (both mesh axes
of size > 1) the pencil runs

    all-to-all over b (split X, gather Y)          ->   x[X_ab, Y, Z]      2-D FFT over Y, Z
    all-to-all over (a, b) (split Y over a and
        Z over b, gather X)                        ->   x[X, Y_a, Z_b]     FFT over X

The first all-to-all splits the leading local dim and gathers whole rows, so its copies are
plain ones; the second lands the blocks of X in order along the leading local dim. The
transposed layout `[Y_a, Z_b, X]` then costs one local transpose (fused into the all-to-all's
unpacking copy) where rotating after each all-to-all costs two, and the natural layout
`[X, Y_a, Z_b]` costs the transposes around its last 1-D FFT (XLA transposes X last for the
FFT and back), as many as the rotations alone cost before. The inverse runs the same steps
backwards. It needs X to divide by a * b; `_complex` falls back to rotating after each
all-to-all when it does not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _pack(blk, nb: int, a: int, b: int):
    """`[B, X_l, Y, Z]` -> `[a * b, B, X_l, Y/a, Z/b]`: block (i, j) = Y block i, Z block j."""
    *batch, xl, y, z = blk.shape
    blk = blk.reshape(*batch, xl, a, y // a, b, z // b)
    perm = [nb + 1, nb + 3, *range(nb), nb, nb + 2, nb + 4]
    return jnp.transpose(blk, perm).reshape(a * b, *batch, xl, y // a, z // b)


def _unpack(blk, nb: int, a: int, b: int):
    """The inverse of `_pack`: `[a * b, B, X_l, Y/a, Z/b]` -> `[B, X_l, Y, Z]`."""
    _, *rest = blk.shape
    batch, (xl, ya, zb) = rest[:nb], rest[nb:]
    blk = blk.reshape(a, b, *batch, xl, ya, zb)
    perm = [*range(2, nb + 2), nb + 2, 0, nb + 3, 1, nb + 4]
    return jnp.transpose(blk, perm).reshape(*batch, xl, a * ya, b * zb)


def _chunks_to(blk, nb: int, layout: str):
    """`[a * b, B, X_l, Y_l, Z_l]` (X in blocks) -> `[B, X, Y_l, Z_l]` or `[B, Y_l, Z_l, X]`."""
    n, *rest = blk.shape
    batch, (xl, yl, zl) = rest[:nb], rest[nb:]
    if layout == "natural":
        perm = [*range(1, nb + 1), 0, nb + 1, nb + 2, nb + 3]
        return jnp.transpose(blk, perm).reshape(*batch, n * xl, yl, zl)
    perm = [*range(1, nb + 1), nb + 2, nb + 3, 0, nb + 1]
    return jnp.transpose(blk, perm).reshape(*batch, yl, zl, n * xl)


def _to_chunks(blk, nb: int, n: int, layout: str):
    """The inverse of `_chunks_to`: X cut into `n` blocks, the block index leading."""
    if layout == "natural":
        *batch, x, yl, zl = blk.shape
        blk = blk.reshape(*batch, n, x // n, yl, zl)
        perm = [nb, *range(nb), nb + 1, nb + 2, nb + 3]
    else:
        *batch, yl, zl, x = blk.shape
        blk = blk.reshape(*batch, yl, zl, n, x // n)
        perm = [nb + 2, *range(nb), nb + 3, nb, nb + 1]
    return jnp.transpose(blk, perm)


def usable(shape: tuple, k: int, sizes: tuple[int, int]) -> bool:
    """Whether the engine applies: a 3-D pencil whose first FFT dim divides by a * b."""
    a, b = sizes
    return k == 3 and a > 1 and b > 1 and shape[len(shape) - 3] % (a * b) == 0


def forward(blk, *, axes: tuple, sizes: tuple[int, int], layout: str, norm):
    """Local body of the forward pencil transform of `blk[B, X_a, Y_b, Z]` (see the module)."""
    (ax_a, ax_b), (a, b) = axes, sizes
    nb = blk.ndim - 3
    blk = jax.lax.all_to_all(blk, ax_b, nb, nb + 1, tiled=True)  # [B, X_ab, Y, Z]
    blk = jnp.fft.fftn(blk, axes=(nb + 1, nb + 2), norm=norm)
    blk = jax.lax.all_to_all(_pack(blk, nb, a, b), (ax_a, ax_b), 0, 0, tiled=True)
    blk = _chunks_to(blk, nb, layout)  # [B, X, Y_a, Z_b] or [B, Y_a, Z_b, X]
    return jnp.fft.fft(blk, axis=nb if layout == "natural" else -1, norm=norm)


def inverse(blk, *, axes: tuple, sizes: tuple[int, int], layout: str, norm):
    """Local body of the inverse: the forward steps backwards, back to `[B, X_a, Y_b, Z]`."""
    (ax_a, ax_b), (a, b) = axes, sizes
    nb = blk.ndim - 3
    blk = jnp.fft.ifft(blk, axis=nb if layout == "natural" else -1, norm=norm)
    blk = _to_chunks(blk, nb, a * b, layout)  # [a * b, B, X_l, Y_a, Z_b]
    blk = jax.lax.all_to_all(blk, (ax_a, ax_b), 0, 0, tiled=True)
    blk = _unpack(blk, nb, a, b)  # [B, X_ab, Y, Z]
    blk = jnp.fft.ifftn(blk, axes=(nb + 1, nb + 2), norm=norm)
    return jax.lax.all_to_all(blk, ax_b, nb + 1, nb, tiled=True)  # [B, X_a, Y_b, Z]
