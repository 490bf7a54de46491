"""The 1-D FFT over the FFT dim an all-to-all gathers, computed where it lies: two matmuls.

An all-to-all over `n` shards that gathers FFT dim X receives `t[j, .., x2, ..]`: chunk `j` is
rows `j*m .. j*m + m - 1` of X (`N = n*m`). XLA's FFT transforms minor dims only, so an FFT over
X in the natural layout (X the leading FFT dim) moves the minor dim to the end and back: two
transposes of the whole shard that, for complex data on XLA:CPU, cost as much as the rest of a
slab transform. Cooley-Tukey with N = n*m instead splits the sum over x = j*m + x2:

    y[k1 + n*k2] = sum_x2 F_m[k2, x2] w_N^(x2*k1) sum_j F_n[k1, j] t[j, x2]

for each x2 an n x n matmul over the chunk index with the twiddle folded into its matrix, then
one m x m matmul over x2 whose result [k2, k1] is natural order: only major dims move. The
inverse runs the same sums backwards with conjugate matrices and ends with the chunk index
leading, ready to be sent.

The matmuls are real: they run on the real and imaginary planes (split in the copy that cuts
a slab's chunks for sending, or in the copy that joins a pencil's received chunks; joined in
the copy that writes the result), each complex matrix acting on them as its real 2 x 2 block
form. XLA:CPU runs a real matmul about twice as
fast as the complex one with the same multiply-adds, and the forward m x m matmul is a real
m x m one (`_real_dft_rows`): half the multiply-adds again. The matrices are built in float64
on the host and rounded once. The matmuls cost O(m) per element against the FFT's O(log m),
so this route is taken for m <= MAX_M only.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

MAX_M = 128  # above it the m x m matmul costs about what the two transposes it saves do


def _dft(size: int, sign: int) -> np.ndarray:
    """The `size`-point DFT matrix, exp(sign 2 pi i a b / size), in complex128."""
    a = np.arange(size)
    return np.exp(sign * 2j * np.pi * np.outer(a, a) / size)


def _twiddle(n: int, m: int, sign: int) -> np.ndarray:
    """w_N^(sign k1 x2) for N = n*m, indexed [k1, x2]."""
    return np.exp(sign * 2j * np.pi * np.outer(np.arange(n), np.arange(m)) / (n * m))


def norm_factor(norm: str | None, size: int, inverse: bool) -> float:
    """The factor `numpy.fft` applies for `norm` to a transform of `size` points."""
    if norm == "ortho":
        return 1.0 / np.sqrt(size)
    if (norm == "forward") != inverse:
        return 1.0 / size
    return 1.0


def _planes(x: jax.Array) -> jax.Array:
    """A complex array as its real and imaginary planes, stacked on a new leading dim.

    Written as a select rather than `jnp.stack`, which XLA makes a copy of its own: the select
    fuses into the copy that consumes the planes.
    """
    shape = (2, *x.shape)
    first = jax.lax.broadcasted_iota(jnp.int32, shape, 0) == 0
    return jnp.where(
        first, jnp.broadcast_to(jnp.real(x), shape), jnp.broadcast_to(jnp.imag(x), shape)
    )


def _from_planes(p: jax.Array) -> jax.Array:
    """The complex array whose real and imaginary planes are `p[0]` and `p[1]`."""
    return jax.lax.complex(p[0], p[1])


def _block(a: np.ndarray, dtype: Any, *, planes_minor: bool) -> np.ndarray:
    """The real matrix of complex `a[.., r, c]` acting on planar vectors: `[.., 2r, 2c]`, its
    rows (plane, r) and columns (plane, c), or (r, plane) and (c, plane) if `planes_minor`."""
    out = np.empty(a.shape[:-2] + (2, a.shape[-2], 2, a.shape[-1]))
    out[..., 0, :, 0, :], out[..., 0, :, 1, :] = a.real, -a.imag
    out[..., 1, :, 0, :], out[..., 1, :, 1, :] = a.imag, a.real
    if planes_minor:
        out = np.moveaxis(out, (-4, -2), (-3, -1))
    return out.reshape(a.shape[:-2] + (2 * a.shape[-2], 2 * a.shape[-1])).astype(dtype)


def _real_dft_rows(u: jax.Array, precision: Any, plane_axis: int = 1) -> jax.Array:
    """The forward DFT over the leading dim of planar `u[x, ..]`, whose real and imaginary
    planes are dim `plane_axis` -> complex `y[k, ..]` (that dim gone).

    F = C - iS with C, S real, and row m - k of C (S) is row k (minus row k): one real m x m
    matmul computes the rows `E = C u` for k = 0 .. m//2 and `O = S u` for k = 1 .. (m-1)//2
    (the other rows of S are zero) over both planes, half the multiply-adds of the complex
    matmul; the copy that joins the planes into complex numbers forms y[k] = E - iO and
    y[m - k] = E + iO.
    """
    m = u.shape[0]
    lo, hi = m // 2 + 1, (m - 1) // 2  # rows of E, and of O
    angle = 2 * np.pi * np.outer(np.arange(m), np.arange(m)) / m
    w = np.concatenate([np.cos(angle[:lo]), np.sin(angle[1 : hi + 1])]).astype(u.dtype)
    v = jnp.dot(jnp.asarray(w), u.reshape(m, -1), precision=precision).reshape(u.shape)
    e, o = v[:lo], v[lo:]
    er, ei, o_re, o_im = (
        jax.lax.index_in_dim(a, i, plane_axis, keepdims=False)
        for a, i in ((e, 0), (e, 1), (o, 0), (o, 1))
    )
    re, im = er[1 : hi + 1], ei[1 : hi + 1]
    rows = [
        jax.lax.complex(er[:1], ei[:1]),  # k = 0
        jax.lax.complex(re + o_im, im - o_re),  # k = 1 .. (m-1)//2
        jax.lax.complex(er[hi + 1 :], ei[hi + 1 :]),  # k = m/2 for even m
        jax.lax.complex(re - o_im, im + o_re)[::-1],  # k = m - (m-1)//2 .. m-1
    ]
    return jnp.concatenate(rows)


def _chunk_dft(n: int, m: int, norm: str | None) -> np.ndarray:
    """Per x2, the forward n-point DFT over the chunk index with the twiddle and `norm`'s
    scale folded in: `h[x2, k1, j]`, complex128 (N = n*m)."""
    scale = norm_factor(norm, n * m, inverse=False)
    return (_dft(n, -1)[:, :, None] * _twiddle(n, m, -1)[:, None, :]).transpose(2, 0, 1) * scale


def forward_gathered(t: jax.Array, nb: int, norm: str | None, *, x_last: bool = False):
    """FFT over X of a received block `t[j, *batch(nb), x2, *rest]` -> `y[*batch, KX, *rest]`,
    or `y[*batch, *rest, KX]` with `x_last` (the transposed layout).

    With `x_last` the matmul over the chunk index runs with the columns `(*batch, *rest)`
    leading, so frequency k1 comes out minor and the copy that joins the planes moves only
    runs of n values: no transpose of single elements, which for complex data costs about
    2.8 plain copies on XLA:CPU.
    """
    n, m = t.shape[0], t.shape[nb + 1]
    batch, rest = t.shape[1 : nb + 1], t.shape[nb + 2 :]
    h = _chunk_dft(n, m, norm)
    hi = jax.lax.Precision.HIGHEST
    p = _planes(t)  # split in the copy that joins the received chunks
    h = jnp.asarray(_block(h, p.dtype, planes_minor=False))  # [x2, (plane, k1), (plane, j)]
    if x_last:
        cols = [*range(2, nb + 2), *range(nb + 3, p.ndim)]
        p = jnp.transpose(p, [nb + 2, *cols, 0, 1]).reshape(m, -1, 2 * n)
        u = jax.lax.dot_general(p, h, (((2,), (2,)), ((0,), (0,))), precision=hi)
        # u[x2, (*batch, *rest), (plane, k1)] -> y[k2, (*batch, *rest), k1]
        y = _real_dft_rows(u.reshape(m, -1, 2, n), hi, plane_axis=2)
        return jnp.moveaxis(y, 0, 1).reshape(batch + rest + (n * m,))
    p = jnp.transpose(p, [nb + 2, 0, 1, *range(2, nb + 2), *range(nb + 3, p.ndim)])
    p = p.reshape(m, 2 * n, -1)  # [x2, (plane, j), (*batch, *rest)]
    u = jax.lax.dot_general(h, p, (((2,), (1,)), ((0,), (0,))), precision=hi)
    # u[x2, (plane, k1), ..]: the matmul over x2 leaves frequency k1 + n*k2 at [k2, k1]
    y = _real_dft_rows(u.reshape(m, 2, n, *batch, *rest), hi)  # [k2, k1, *batch, *rest]
    y = jnp.transpose(y, [*range(2, 2 + nb), 0, 1, *range(2 + nb, y.ndim)])
    return y.reshape(batch + (n * m,) + rest)


def planes_to_send(c: jax.Array, nb: int) -> jax.Array:
    """Chunks `c[*batch(nb), x2, J, *rest]` (local rows x2 of X, chunk J for shard J) as the
    planar block to send, `p[x2, J, plane, *batch, *rest]`, for `forward_received`.

    This is one copy, the one that cuts the chunks for the all-to-all; an all-to-all that joins
    the chunks along dim 1 then hands over the matmul's `[x2, (j, plane), columns]` directly.
    """
    p = _planes(c)  # [plane, *batch, x2, J, *rest]
    return jnp.transpose(p, [nb + 1, nb + 2, 0, *range(1, nb + 1), *range(nb + 3, p.ndim)])


def forward_received(r: jax.Array, nb: int, norm: str | None) -> jax.Array:
    """FFT over X of a received planar block `r[x2, j, plane, *batch(nb), *rest]` (chunk j from
    shard j, `planes_to_send`) -> `y[*batch, KX, *rest]`."""
    m, n = r.shape[:2]
    batch, rest = r.shape[3 : 3 + nb], r.shape[3 + nb :]
    h = _chunk_dft(n, m, norm)
    hi = jax.lax.Precision.HIGHEST
    h = jnp.asarray(_block(h, r.dtype, planes_minor=True))  # [x2, (k1, plane), (j, plane)]
    u = jax.lax.dot_general(h, r.reshape(m, 2 * n, -1), (((2,), (1,)), ((0,), (0,))), precision=hi)
    # u[x2, (k1, plane), ..]: the matmul over x2 leaves frequency k1 + n*k2 at [k2, k1]
    y = _real_dft_rows(u.reshape(m, n, 2, -1), hi, plane_axis=2)  # [k2, k1, (*batch, *rest)]
    return jnp.moveaxis(y.reshape(n * m, *batch, *rest), 0, nb)


def inverse_to_chunks(y: jax.Array, n: int, nb: int, norm: str | None) -> jax.Array:
    """Inverse FFT over the leading FFT dim of `y[*batch, KX, *rest]`, returned as chunks to
    send, `t[j, *batch, x2, *rest]` with x = j*m + x2 (`n` chunks)."""
    m = y.shape[nb] // n
    batch, rest = y.shape[:nb], y.shape[nb + 1 :]
    scale = norm_factor(norm, n * m, inverse=True)
    # per k1, F_m^* with the twiddle folded in, as [k1, x2, k2]
    g = (_dft(m, 1)[None, :, :] * _twiddle(n, m, 1)[:, None, :] * scale).transpose(0, 2, 1)
    hi = jax.lax.Precision.HIGHEST
    p = _planes(y).reshape(2, *batch, m, n, *rest)  # [plane, *batch, k2, k1, *rest]
    p = jnp.transpose(p, [nb + 2, 0, nb + 1, *range(1, nb + 1), *range(nb + 3, p.ndim)])
    p = p.reshape(n, 2 * m, -1)  # [k1, (plane, k2), (*batch, *rest)]
    g = _block(g, p.dtype, planes_minor=False)
    u = jax.lax.dot_general(jnp.asarray(g), p, (((2,), (1,)), ((0,), (0,))), precision=hi)
    # u[k1, (plane, x2), ..]; F_n is symmetric: t[(j, plane), (x2, ..)]
    f = jnp.asarray(_block(_dft(n, 1), p.dtype, planes_minor=True))
    t = jnp.dot(f, u.reshape(2 * n, -1), precision=hi).reshape(n, 2, m, *batch, *rest)
    t = _from_planes(jnp.moveaxis(t, 1, 0))  # joined in the copies that chunk it for sending
    return jnp.transpose(t, [0, *range(2, 2 + nb), 1, *range(2 + nb, t.ndim)])
