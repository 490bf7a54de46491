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
leading, ready to be sent. The matrices are built in float64 on the host and rounded once; a
matmul costs m complex multiply-adds per element, so this route is taken for m <= MAX_M only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

MAX_M = 32  # above it the m x m matmul costs more than the two transposes it saves


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


def forward_gathered(t: jax.Array, nb: int, norm: str | None) -> jax.Array:
    """FFT over X of a received block `t[j, *batch(nb), x2, *rest]` -> `y[*batch, KX, *rest]`."""
    n, m = t.shape[0], t.shape[nb + 1]
    scale = norm_factor(norm, n * m, inverse=False)
    # per x2, F_n with the twiddle folded in: h[x2, k1, j]
    h = (_dft(n, -1)[:, :, None] * _twiddle(n, m, -1)[:, None, :]).transpose(2, 0, 1) * scale
    hi = jax.lax.Precision.HIGHEST
    dims = (((2,), (0,)), ((0,), (nb + 1,)))
    u = jax.lax.dot_general(jnp.asarray(h, t.dtype), t, dims, precision=hi)
    # u[x2, k1, *batch, *rest]: one m x m matmul over x2 leaves frequency k1 + n*k2 at [k2, k1]
    v = jnp.tensordot(jnp.asarray(_dft(m, -1), t.dtype), u, axes=(1, 0), precision=hi)
    v = jnp.transpose(v, list(range(2, 2 + nb)) + [0, 1] + list(range(2 + nb, v.ndim)))
    return v.reshape(v.shape[:nb] + (n * m,) + v.shape[nb + 2 :])


def inverse_to_chunks(y: jax.Array, n: int, nb: int, norm: str | None) -> jax.Array:
    """Inverse FFT over the leading FFT dim of `y[*batch, KX, *rest]`, returned as chunks to
    send, `t[j, *batch, x2, *rest]` with x = j*m + x2 (`n` chunks)."""
    m = y.shape[nb] // n
    scale = norm_factor(norm, n * m, inverse=True)
    # per k1, F_m^* with the twiddle folded in: g[k1, k2, x2]
    g = _dft(m, 1)[None, :, :] * _twiddle(n, m, 1)[:, None, :] * scale
    hi = jax.lax.Precision.HIGHEST
    v = y.reshape(y.shape[:nb] + (m, n) + y.shape[nb + 1 :])  # [*batch, k2, k1, *rest]
    v = jnp.transpose(v, [nb + 1, nb] + list(range(nb)) + list(range(nb + 2, v.ndim)))
    # u[k1, x2, ..] = sum_k2 g[k1, k2, x2] v[k1, k2, ..]
    u = jax.lax.dot_general(jnp.asarray(g, y.dtype), v, (((1,), (1,)), ((0,), (0,))), precision=hi)
    # F_n is symmetric: t[j, x2, *batch, *rest]
    t = jnp.tensordot(jnp.asarray(_dft(n, 1), y.dtype), u, axes=(0, 0), precision=hi)
    return jnp.transpose(t, [0] + list(range(2, 2 + nb)) + [1] + list(range(2 + nb, t.ndim)))
