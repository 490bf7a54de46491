"""Batched LU and determinants: B independent matrices sharded over the batch, each equal to
LAPACK on one device (numpy / scipy), with no collectives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.linalg as sl
from shardkit.inspection.hlo import collective_counts


def _mesh(axis_type):
    return jax.make_mesh((2, 4), ("a", "b"), axis_types=(axis_type,) * 2)


def _stack(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64])
def test_batched_slogdet_and_det_match_numpy(axis_type, dtype):
    mesh = _mesh(axis_type)
    a = _stack((16, 12, 12), dtype, seed=1)
    a[3] = 0  # a singular system: sign 0, logabsdet -inf as numpy
    with jax.enable_x64(dtype == np.float64):
        x = jax.device_put(jnp.asarray(a), NamedSharding(mesh, P(("a", "b"), None, None)))
        sign, logdet = sl.batched_slogdet(x)
        d = sl.batched_det(x)
        ref_sign, ref_logdet = np.linalg.slogdet(a.astype(np.complex128 if a.dtype.kind == "c"
                                                          else np.float64))  # fmt: skip
        rtol = 1e-4 if dtype in (np.float32, np.complex64) else 1e-10
        np.testing.assert_allclose(np.asarray(sign), ref_sign, rtol=rtol, atol=rtol)
        finite = np.isfinite(ref_logdet)
        np.testing.assert_allclose(np.asarray(logdet)[finite], ref_logdet[finite], rtol=rtol)
        assert np.asarray(logdet)[3] == -np.inf
        np.testing.assert_allclose(np.asarray(d), np.linalg.det(a.astype(np.complex128)),
                                   rtol=10 * rtol, atol=1e-30)  # fmt: skip
        assert sign.sharding.spec == P(("a", "b"))


@pytest.mark.parametrize("shape", [(8, 6, 4), (8, 4, 6), (16, 5, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_batched_lu_non_square_matches_scipy(shape, dtype):
    mesh = _mesh(AxisType.Explicit)
    a = _stack(shape, dtype, seed=2)
    out = sl.batched_lu(jnp.asarray(a), mesh=mesh)
    assert out[0].sharding.spec == P(("a", "b"), None, None)
    lu, piv, perm = map(np.asarray, out)
    k = min(shape[1:])
    for i in range(shape[0]):
        p_ref, l_ref, u_ref = scipy.linalg.lu(a[i])
        packed = lu[i]
        lower = np.tril(packed, -1)[:, :k] + np.eye(shape[1], k)
        upper = np.triu(packed)[:k]
        np.testing.assert_allclose(lower, l_ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(upper, u_ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(a[i][perm[i]], lower @ upper, atol=1e-5)
    assert piv.shape == (shape[0], k) and perm.shape == shape[:2]


def test_batched_programs_have_no_collectives():
    mesh = _mesh(AxisType.Auto)
    spec = NamedSharding(mesh, P(("a", "b"), None, None))
    a = jax.ShapeDtypeStruct((16, 32, 32), jnp.float32, sharding=spec)
    for fn in (sl.batched_slogdet, sl.batched_lu):
        hlo = jax.jit(lambda a, fn=fn: fn(a, mesh=mesh)).lower(a).compile().as_text()
        assert not any(collective_counts(hlo).values()), fn.__name__


def test_batched_bad_inputs_raise_clear_errors():
    mesh = _mesh(AxisType.Explicit)
    with pytest.raises(ValueError, match=r"batch size 6 is not a multiple of the 8 devices.*8"):
        sl.batched_slogdet(jnp.ones((6, 4, 4)), mesh=mesh)
    with pytest.raises(ValueError, match=r"square matrices \(B, N, N\), got shape \(8, 4, 3\)"):
        sl.batched_det(jnp.ones((8, 4, 3)), mesh=mesh)
    with pytest.raises(ValueError, match=r"matrices \(B, M, N\), got shape \(4, 4\)"):
        sl.batched_lu(jnp.ones((4, 4)), mesh=mesh)
    with pytest.raises(TypeError, match=r"int32.*astype"):
        sl.batched_lu(jnp.ones((8, 4, 4), jnp.int32), mesh=mesh)
