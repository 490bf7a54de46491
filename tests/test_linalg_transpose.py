"""``solve(..., transpose=True)`` and ``lu_solve(..., transpose=True)``: ``A^T x = b`` against
scipy, without an all-gather of A, with gradients equal to jnp's on the transposed system."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.linalg as sl
from shardkit.inspection.hlo import collective_counts

N = 90


def _system(dtype, seed=0, n=N):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, 2)).astype(dtype)
    return a, b


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
@pytest.mark.parametrize("grid", [None, ("a", "b")])
def test_solve_transpose_matches_scipy(axis_type, grid):
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(axis_type,) * 2)
    a, b = _system(np.float32, n=96)  # row-sharded over 8 devices; padded inside
    ad = jax.device_put(jnp.asarray(a), NamedSharding(mesh, P(("a", "b"), None)))
    x = sl.solve(ad, jnp.asarray(b), transpose=True, grid=grid, block_size=8)
    ref = scipy.linalg.solve(a.astype(np.float64), b, transposed=True)
    np.testing.assert_allclose(np.asarray(x), ref, rtol=2e-3, atol=2e-4)


def test_lu_solve_transpose_reuses_the_factors():
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
    a, b = _system(np.float32, seed=1)
    f = sl.lu(jnp.asarray(a), mesh=mesh, block_size=8)
    lu_piv = scipy.linalg.lu_factor(a.astype(np.float64))
    for rhs in (b, b[:, 0]):
        x = sl.lu_solve(f, jnp.asarray(rhs), transpose=True)
        np.testing.assert_allclose(np.asarray(x), scipy.linalg.lu_solve(lu_piv, rhs, trans=1),
                                   rtol=2e-3, atol=2e-4)  # fmt: skip
    with jax.set_mesh(mesh), pytest.raises(ValueError, match="transpose=True.*Fix: differentiate"):
        jax.grad(lambda v: sl.lu_solve(f, v, transpose=True).sum())(jnp.asarray(b[:, 0]))
    g = sl.lu(jnp.asarray(a), mesh=jax.make_mesh((2, 4), ("r", "c")), grid=("r", "c"),
              block_size=8)  # fmt: skip
    with pytest.raises(ValueError, match="needs 1-D factors"):
        sl.lu_solve(g, jnp.asarray(b), transpose=True)


def test_solve_transpose_gradient_matches_jnp_and_gathers_nothing():
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
    a, b = _system(np.float64, seed=2)
    a = a + 4 * np.eye(N)
    with jax.enable_x64(True), jax.set_mesh(mesh):
        a, b = jnp.asarray(a), jnp.asarray(b)
        ours = jax.grad(lambda a, b: sl.solve(a, b, transpose=True, block_size=8, mesh=mesh)
                        .sum(), (0, 1))(a, b)  # fmt: skip
        ref = jax.grad(lambda a, b: jnp.linalg.solve(a.T, b).sum(), (0, 1))(a, b)
        for g, r in zip(ours, ref, strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-9, atol=1e-12)
    spec = NamedSharding(mesh, P("x", None))
    replicated = NamedSharding(mesh, P())
    shapes = (jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=spec),
              jax.ShapeDtypeStruct((256,), jnp.float32, sharding=replicated))  # fmt: skip
    hlo = jax.jit(lambda a, b: sl.solve(a, b, transpose=True, mesh=mesh)).lower(*shapes)
    assert collective_counts(hlo.compile().as_text())["all-gather"] == 0
