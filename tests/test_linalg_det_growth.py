"""slogdet of Wilkinson's growth matrix (1 on the diagonal, -1 below, 1 in the last column):
det = 2^(n-1) and U's last column grows to 2^(n-1), past float32's range at n = 256.

numpy.linalg.slogdet computes float32 input in float64 (LAPACK dgetrf) and returns 176.75 cast
to float32; in float32 the LU itself overflows, so shardkit raises a clear error pointing to
float64, where it matches numpy to 1e-12 relative."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

import shardkit.linalg as sl


def wilkinson(n, dtype):
    w = np.eye(n) - np.tril(np.ones((n, n)), -1)
    w[:, -1] = 1.0
    return w.astype(dtype)


@pytest.fixture
def mesh():
    return jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))


def test_wilkinson_float64_matches_numpy(mesh):
    with jax.enable_x64(True):
        for n in (64, 256):
            w = wilkinson(n, np.float64)
            sign, logdet = sl.slogdet(jnp.asarray(w), mesh=mesh)
            s_ref, l_ref = np.linalg.slogdet(w)
            assert float(sign) == s_ref == 1.0
            np.testing.assert_allclose(float(logdet), l_ref, rtol=1e-12)  # 255 log 2 at 256


def test_wilkinson_float32_small_n_matches_numpy(mesh):
    w = wilkinson(64, np.float32)  # growth 2^63: still inside float32's range
    sign, logdet = sl.slogdet(jnp.asarray(w), mesh=mesh)
    s_ref, l_ref = np.linalg.slogdet(w)
    assert float(sign) == s_ref
    np.testing.assert_allclose(float(logdet), l_ref, rtol=1e-6)


def test_wilkinson_float32_overflow_raises_recommending_float64(mesh):
    w = jnp.asarray(wilkinson(256, np.float32))
    match = r"a: the LU factors of the \(256, 256\) float32 matrix overflowed.*float64"
    for fn in (sl.slogdet, sl.det):
        with pytest.raises(ValueError, match=match):
            fn(w, mesh=mesh)
    # inside jit nothing can raise: a non-finite result, as jnp.linalg.slogdet gives (inf)
    _, logdet = jax.jit(lambda m: sl.slogdet(m, mesh=mesh))(w)
    assert not np.isfinite(float(logdet))
