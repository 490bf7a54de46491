"""Complex matrices in the distributed LU, solves, determinants, triangular solves and the
Hermitian Cholesky, each against numpy / scipy on one device (complex64 and complex128), and
gradients of the complex solve against jnp.linalg.solve's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from jax.sharding import AxisType

import shardkit.linalg as sl

N = 100  # not a multiple of the block size times the devices: padded internally


def _mesh(axis_type=AxisType.Explicit):
    return jax.make_mesh((8,), ("x",), axis_types=(axis_type,))


def _complex(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def _tol(dtype):
    return 1e-4 if dtype == np.complex64 else 1e-11


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
def test_complex_lu_solve_and_slogdet_match_numpy(dtype, axis_type):
    mesh = _mesh(axis_type)
    a, b = _complex((N, N), dtype, 0), _complex((N, 3), dtype, 1)
    with jax.enable_x64(dtype == np.complex128):
        x = np.asarray(sl.solve(jnp.asarray(a), jnp.asarray(b), mesh=mesh, block_size=8))
        assert x.dtype == dtype
        np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=100 * _tol(dtype))
        f = sl.lu(jnp.asarray(a), mesh=mesh, block_size=8)
        perm, lower, upper = (np.asarray(v) for v in f.unpack())
        np.testing.assert_allclose(lower @ upper, a[perm], atol=10 * _tol(dtype))
        p_ref, _, _ = scipy.linalg.lu(a)  # a = p_ref @ l @ u: the same pivots as LAPACK
        np.testing.assert_array_equal(np.argmax(p_ref, axis=0), perm)
        xs = np.asarray(sl.lu_solve(f, jnp.asarray(b[:, 0])))
        np.testing.assert_allclose(xs, np.linalg.solve(a, b[:, 0]), rtol=100 * _tol(dtype))
        sign, logdet = sl.slogdet(jnp.asarray(a), mesh=mesh, block_size=8)
        ref_sign, ref_logdet = np.linalg.slogdet(a.astype(np.complex128))
        np.testing.assert_allclose(complex(sign), ref_sign, atol=10 * _tol(dtype))
        np.testing.assert_allclose(float(logdet), ref_logdet, rtol=_tol(dtype))
        assert logdet.dtype == np.finfo(dtype).dtype  # real, as jnp.linalg.slogdet's
        small = a / 4  # |det| within float32's range
        d = complex(sl.det(jnp.asarray(small), mesh=mesh, block_size=8))
        np.testing.assert_allclose(d, np.linalg.det(small.astype(np.complex128)), rtol=1e-3)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("lower,transpose", [(True, False), (False, False), (True, True)])
def test_complex_triangular_solve_matches_scipy(dtype, lower, transpose):
    t = _complex((N, N), dtype, 2) + 8 * np.eye(N, dtype=dtype)
    t = np.tril(t) if lower else np.triu(t)
    b = _complex((N,), dtype, 3)
    with jax.enable_x64(dtype == np.complex128):
        x = sl.triangular_solve(jnp.asarray(t), jnp.asarray(b), lower=lower, transpose=transpose,
                                mesh=_mesh(), block_size=8)  # fmt: skip
        ref = scipy.linalg.solve_triangular(t, b, lower=lower, trans=1 if transpose else 0)
        np.testing.assert_allclose(np.asarray(x), ref, rtol=10 * _tol(dtype))


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_complex_hermitian_cholesky_and_cho_solve(dtype):
    g = _complex((N, N), dtype, 4)
    h = (g @ g.conj().T / N + np.eye(N)).astype(dtype)  # Hermitian positive definite
    b = _complex((N, 2), dtype, 5)
    with jax.enable_x64(dtype == np.complex128):
        f = sl.cholesky(jnp.asarray(h), mesh=_mesh(), block_size=8)
        lower = np.asarray(f.unpack())
        np.testing.assert_allclose(lower, np.linalg.cholesky(h), atol=10 * _tol(dtype))
        x = np.asarray(sl.cho_solve(f, jnp.asarray(b)))
        np.testing.assert_allclose(x, scipy.linalg.cho_solve((np.linalg.cholesky(h), True), b),
                                   rtol=100 * _tol(dtype))  # fmt: skip
        # complex gradients are JAX's (as jax.scipy's cho_solve has them)
        c = jnp.asarray(np.linalg.cholesky(h))
        ref = jax.grad(lambda v: jnp.abs(jax.scipy.linalg.cho_solve((c, True), v)).sum())
        with jax.set_mesh(f.mesh):  # jax.grad's scalar seed on Explicit axes
            got = jax.grad(lambda v: jnp.abs(sl.cho_solve(f, v)).sum())(jnp.asarray(b))
        want = np.asarray(ref(jnp.asarray(b)))
        np.testing.assert_allclose(np.asarray(got), want, rtol=100 * _tol(dtype),
                                   atol=100 * _tol(dtype) * np.abs(want).max())  # fmt: skip


def test_complex_solve_gradient_matches_jnp():
    mesh = _mesh()
    a = jnp.asarray(_complex((N, N), np.complex64, 6) + 4 * np.eye(N))
    b = jnp.asarray(_complex((N,), np.complex64, 7))

    def loss(solver):
        return lambda a, b: jnp.sum(jnp.abs(solver(a, b)) ** 2)

    with jax.set_mesh(mesh):  # Explicit axes: jax.grad's scalar seed needs the mesh
        ours = jax.grad(loss(lambda a, b: sl.solve(a, b, mesh=mesh, block_size=8)), (0, 1))(a, b)
    ref = jax.grad(loss(jnp.linalg.solve), (0, 1))(a, b)
    for g, r in zip(ours, ref, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=2e-3, atol=2e-4)
