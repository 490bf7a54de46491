"""The 1-D FFT over the FFT dim an all-to-all gathers, computed where it lies: two matmuls.

An all-to-all over `n` shards that gathers FFT dim X receives `t[j, .., x2, ..]`: chunk `j` is
rows `j*m .. j*m + m - 1` of X (`N = n*m`). XLA's FFT transforms minor dims only, so an FFT over
X in the natural layout (X the leading FFT dim) moves the minor dim to the end and back: two
transposes of the whole shard that, for complex data on XLA:CPU, cost as much as the rest of a
slab transform. Cooley-Tukey with N = n*m instead splits the sum over x = j*m + x2:

    y[k1 + n*k2] = sum_x2 F_m[k2, x2] w_N^(x2*k1) sum_j F_n[k1, j] t[j, x2]

an n x n matmul over the chunk index, then for each k1 an m x m matmul over x2 with the twiddle
folded into its matrix; writing the result [k2, k1] is natural order, and only major dims move.
The inverse runs the same steps backwards with conjugate matrices and ends with the chunk index
leading, ready to be sent. The matrices are built in float64 on the host and rounded once; a
matmul costs m complex multiply-adds per element, so this route is taken for m <= MAX_M only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

MAX_M = 32  # above it the m x m matmul costs more than the two transposes it saves


def _matrices(n: int, m: int, dtype, sign: int, scale: float):
    """F_n [k1, j] and the twiddled F_m per k1, [k1, k2, x2], as `dtype` (sign -1: forward)."""
    big = n * m
    j, x2 = np.arange(n), np.arange(m)
    f_n = np.exp(sign * 2j * np.pi * np.outer(j, j) / n)
    f_m = np.exp(sign * 2j * np.pi * np.outer(x2, x2) / m)
    twiddle = np.exp(sign * 2j * np.pi * np.outer(j, x2) / big)
    g = f_m[None, :, :] * twiddle[:, None, :] * scale
    return jnp.asarray(f_n, dtype), jnp.asarray(g, dtype)


def _scale(norm: str | None, size: int, inverse: bool) -> float:
    """The factor `numpy.fft` applies for `norm` to a transform of `size` points."""
    if norm == "ortho":
        return 1.0 / np.sqrt(size)
    if (norm == "forward") != inverse:
        return 1.0 / size
    return 1.0


def forward_gathered(t: jax.Array, nb: int, norm: str | None) -> jax.Array:
    """FFT over X of a received block `t[j, *batch(nb), x2, *rest]` -> `y[*batch, KX, *rest]`."""
    n, m = t.shape[0], t.shape[nb + 1]
    f_n, g = _matrices(n, m, t.dtype, -1, _scale(norm, n * m, inverse=False))
    hi = jax.lax.Precision.HIGHEST
    u = jnp.tensordot(f_n, t, axes=(1, 0), precision=hi)  # [k1, *batch, x2, *rest]
    v = jax.lax.dot_general(g, u, (((2,), (nb + 1,)), ((0,), (0,))), precision=hi)
    # v[k1, k2, *batch, *rest]: frequency k1 + n*k2 is stored [k2, k1] in natural order.
    perm = list(range(2, 2 + nb)) + [1, 0] + list(range(2 + nb, v.ndim))
    v = jnp.transpose(v, perm)
    return v.reshape(v.shape[:nb] + (n * m,) + v.shape[nb + 2 :])


def inverse_to_chunks(y: jax.Array, n: int, nb: int, norm: str | None) -> jax.Array:
    """Inverse FFT over the leading FFT dim of `y[*batch, KX, *rest]`, returned as chunks to
    send, `t[j, *batch, x2, *rest]` with x = j*m + x2 (`n` chunks)."""
    m = y.shape[nb] // n
    f_n, g = _matrices(n, m, y.dtype, 1, _scale(norm, n * m, inverse=True))
    hi = jax.lax.Precision.HIGHEST
    v = y.reshape(y.shape[:nb] + (m, n) + y.shape[nb + 1 :])  # [*batch, k2, k1, *rest]
    perm = [nb + 1, nb] + list(range(nb)) + list(range(nb + 2, v.ndim))
    v = jnp.transpose(v, perm)  # [k1, k2, *batch, *rest]
    # u[k1, x2, ..] = sum_k2 g[k1, k2, x2] v[k1, k2, ..]
    u = jax.lax.dot_general(g, v, (((1,), (1,)), ((0,), (0,))), precision=hi)
    t = jnp.tensordot(f_n, u, axes=(0, 0), precision=hi)  # f_n symmetric: [j, x2, *batch, *rest]
    perm = [0] + list(range(2, 2 + nb)) + [1] + list(range(2 + nb, t.ndim))
    return jnp.transpose(t, perm)
