"""The 3-D pencil route: gather Y, one local 2-D FFT over Y and Z, then gather X over both axes.

With the FFT dims sharded `x[X_a, Y_b, Z]` over two mesh axes of size > 1, and X dividing by
a * b, the forward complex pencil transforms run

    all-to-all over b (split X, gather Y)           ->  x[X_ab, Y, Z]     2-D FFT over Y and Z
    all-to-all over (a, b) (split Y over a and
        Z over b, gather X)                         ->  x[X, Y_a, Z_b]    FFT over X

The first all-to-all splits the leading local dim and gathers Y in whole rows of Z: its copies
move contiguous blocks, and the 2-D FFT runs over the two trailing dims with no transpose. The
second lands chunk j, rows j*m .. j*m + m - 1 of X (m = X / (a*b)), where X lies in the natural
layout: the FFT over X runs there as two matmuls (`_dft`) when m <= `_dft.MAX_M`, in both
layouts (in the transposed layout `[Y_a, Z_b, X]` the matmuls leave X last). Otherwise the copy
that joins the chunks also moves X last for the FFT (the natural layout then moves it back).
The per-axis route (`_complex`) needs a local rotation before each 1-D FFT and, in the natural
layout, a transpose after the last; on XLA:CPU a transpose that moves the minor dim of a
complex shard costs about 2.8 plain copies.

Traffic: the all-to-all over (a, b) sends (a - 1)/a of the shard across mesh axis a, as the
per-axis route's all-to-all over a does, and (b - 1)/(a*b) of the shard more within mesh axis b.

The inverse transforms keep the per-axis route. Run backwards, this route's transposes land
before the all-to-alls instead of after them, and on 8 CPU devices its inverse measured 5-15 %
slower than the per-axis one at 256^3 (within noise at 128^3), which also moves fewer bytes.
Both routes lay the spectrum out alike, so either inverse undoes either forward transform.
"""

from __future__ import annotations

import jax.numpy as jnp

from shardkit.fft import _dft as D
from shardkit.fft import _exchange as E
from shardkit.fft import _layout as L

_NATURAL = [0, 1, 2]  # FFT dims X, Y, Z stored in numpy's order


def _axes(entries: tuple, mesh_shape: dict[str, int]) -> tuple[tuple, tuple[int, int]]:
    """The mesh axes of X and Y, and their sizes (a, b)."""
    ea, eb = entries[len(entries) - 3 : len(entries) - 1]
    return (ea, eb), (L.entry_size(ea, mesh_shape), L.entry_size(eb, mesh_shape))


def applies(shape: tuple, entries: tuple, k: int, mesh_shape: dict) -> bool:
    """Whether the forward transform of a local block of `shape`, sharded `entries`, takes this
    route: a 3-D pencil whose X divides by a * b."""
    if k != 3:
        return False
    _, (a, b) = _axes(entries, mesh_shape)
    return a > 1 and b > 1 and shape[len(shape) - 3] % b == 0  # X = a * shape[nb]


def _pack(blk, nb: int, a: int, b: int):
    """`[*B, x2, Y, Z]` -> `[a*b, *B, x2, Y/a, Z/b]`: chunk i*b + j is Y block i, Z block j."""
    *batch, xl, y, z = blk.shape
    t = blk.reshape(*batch, xl, a, y // a, b, z // b)
    perm = [nb + 1, nb + 3, *range(nb), nb, nb + 2, nb + 4]
    return jnp.transpose(t, perm).reshape(a * b, *batch, xl, y // a, z // b)


def forward(blk, entries: tuple, mesh_shape: dict, *, layout: str, norm):
    """Local body of the forward transform of `blk[*B, X_a, Y_b, Z]` (see the module)."""
    (ea, eb), (a, b) = _axes(entries, mesh_shape)
    nb = blk.ndim - 3
    blk = E.exchange(blk, eb, b, _NATURAL, 0, 1, _NATURAL, nb)  # [*B, X_ab, Y, Z]
    blk = jnp.fft.fftn(blk, axes=(nb + 1, nb + 2), norm=norm)
    t = E.swap(_pack(blk, nb, a, b), L.entry_names(ea) + L.entry_names(eb))
    # t[j, *B, x2, Y_a, Z_b]: X = j*m + x2 in natural order
    if t.shape[nb + 1] <= D.MAX_M:
        return D.forward_gathered(t, nb, norm, x_last=layout == "transposed")
    y = jnp.fft.fft(E.reassemble(t, _NATURAL, 0, [1, 2, 0], nb), axis=-1, norm=norm)
    return y if layout == "transposed" else jnp.moveaxis(y, -1, nb)
