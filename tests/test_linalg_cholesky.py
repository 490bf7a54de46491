"""Cholesky, cho_solve, triangular_solve, det/slogdet and the block-cyclic layout helpers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.linalg as sl
from shardkit.inspection.hlo import collective_counts


def make_mesh(shape, names, axis_type):
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape))


def spd(n, dtype=jnp.float32, seed=0):
    g = np.random.default_rng(seed).standard_normal((n, n))
    return jnp.asarray(g @ g.T / n + np.eye(n), dtype)


def test_layout_round_trip_and_order(axis_type):
    mesh = make_mesh((2, 4), ("x", "y"), axis_type)
    a = jnp.arange(64.0 * 64).reshape(64, 64)
    a = jax.device_put(a, NamedSharding(mesh, P(("x", "y"), None)))
    ac = sl.to_column_cyclic(a, block_size=4)
    order = sl.column_cyclic_order(64, 4, 8)
    assert order[:8].tolist() == [0, 1, 2, 3, 32, 33, 34, 35]  # device 0: blocks 0 and 8
    np.testing.assert_array_equal(ac, np.asarray(a)[:, order])
    assert ac.sharding.spec == P(None, ("x", "y"))
    back = sl.from_column_cyclic(ac, block_size=4)
    np.testing.assert_array_equal(back, a)
    assert back.sharding.is_equivalent_to(NamedSharding(mesh, P(("x", "y"), None)), 2)
    hlo = (
        jax.jit(lambda a: sl.to_column_cyclic(a, block_size=4, mesh=mesh))
        .lower(a)
        .compile()
        .as_text()
    )
    counts = collective_counts(hlo)
    assert counts["all-to-all"] == 1 and counts["all-gather"] == 0
    with pytest.raises(ValueError, match="a: size 60 is not a multiple of block_size"):
        sl.to_column_cyclic(jnp.ones((60, 60)), block_size=4, mesh=mesh)
    with pytest.raises(ValueError, match="n: 60 is not a multiple of block_size"):
        sl.column_cyclic_order(60, 4, 8)
    assert sl.padded_size(60, 4, 8) == 64


@pytest.mark.parametrize(
    "dtype,axis_type", [("float32", AxisType.Explicit), ("float64", AxisType.Auto)]
)
def test_cholesky_and_cho_solve_match_single_device(dtype, axis_type):
    with jax.enable_x64(True):
        dt = jnp.dtype(dtype)
        mesh = make_mesh((2, 4), ("x", "y"), axis_type)
        a = spd(96, dt)  # N = 96: padded to 128 internally (nb * P = 64)
        f = sl.cholesky(jax.device_put(a, NamedSharding(mesh, P(("x", "y"), None))), block_size=8)
        assert int(f.info) == 0 and f.l.dtype == dt
        tol = 1e-5 if dtype == "float32" else 1e-12
        np.testing.assert_allclose(f.unpack(), jnp.linalg.cholesky(a), atol=tol * 10)
        b = jnp.asarray(np.random.default_rng(1).standard_normal((96, 3)), dt)
        x = sl.cho_solve(f, b)
        ref = jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(a), True), b)
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        res = np.linalg.norm(a64 @ np.asarray(x) - b64)
        res_ref = np.linalg.norm(a64 @ np.asarray(ref) - b64)
        assert res <= 2 * max(res_ref, float(jnp.finfo(dt).eps)), (res, res_ref)


def test_cholesky_reads_lower_triangle_only_and_compiles_without_gather():
    mesh = make_mesh((8,), ("x",), AxisType.Explicit)
    a = spd(64, seed=4)
    lower_only = jnp.tril(a) + jnp.triu(jnp.full_like(a, 7.0), 1)  # garbage above
    f = sl.cholesky(lower_only, mesh=mesh, block_size=8)
    np.testing.assert_allclose(f.unpack(), jnp.linalg.cholesky(a), atol=1e-5)
    spec = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    hlo = (
        jax.jit(lambda a: sl.cholesky(a, mesh=mesh, block_size=16).l)
        .lower(spec)
        .compile()
        .as_text()
    )
    counts = collective_counts(hlo)
    assert counts["all-gather"] == 0 and counts["all-reduce"] == 1  # the panel, in the loop


def test_cholesky_rejects_non_spd():
    mesh = make_mesh((8,), ("x",), AxisType.Explicit)
    a = spd(64) - 3 * jnp.eye(64)  # has negative eigenvalues
    with pytest.raises(sl.NotPositiveDefiniteError, match="not symmetric positive definite"):
        sl.cholesky(a, mesh=mesh, block_size=8)
    f = sl.cholesky(a, mesh=mesh, block_size=8, check=False)
    assert int(f.info) > 0
    with pytest.raises(sl.NotPositiveDefiniteError, match=r"info=\d+"):
        sl.cho_solve(f, jnp.ones(64))
    with pytest.raises(ValueError, match=r"b: expected shape \(64,\) or \(64, k\)"):
        sl.cho_solve(sl.cholesky(spd(64), mesh=mesh, block_size=8), jnp.ones(63))


@pytest.mark.parametrize(
    "lower,transpose,unit",
    [(True, False, False), (False, False, True), (True, True, True), (False, True, False)],
)
def test_triangular_solve(lower, transpose, unit):
    """Both substitution orders of both kernels (column- and row-oriented), with and without
    a unit diagonal. Explicit axes only: the kernels run on Auto axes inside every solve."""
    mesh = make_mesh((8,), ("x",), AxisType.Explicit)
    rng = np.random.default_rng(2)
    if unit:  # the stored diagonal (100) must be ignored; small entries keep it well posed
        full = 0.05 * rng.standard_normal((64, 64)) + 100 * np.eye(64)
        t = (np.tril(full, -1) if lower else np.triu(full, 1)) + np.eye(64)
    else:
        full = rng.standard_normal((64, 64)) + 8 * np.eye(64)
        t = np.tril(full) if lower else np.triu(full)
    b = rng.standard_normal((64, 2))
    x = sl.triangular_solve(jnp.asarray(full, jnp.float32), jnp.asarray(b, jnp.float32),
                            lower=lower, transpose=transpose, unit_diagonal=unit, mesh=mesh,
                            block_size=4)  # fmt: skip
    op = t.T if transpose else t
    np.testing.assert_allclose(op @ np.asarray(x, np.float64), b, atol=2e-5)


def test_det_and_slogdet_match_single_device(axis_type):
    mesh = make_mesh((8,), ("x",), axis_type)
    rng = np.random.default_rng(5)
    for seed in range(3):  # both signs occur among these
        a = jnp.asarray(np.random.default_rng(seed).standard_normal((64, 64)), jnp.float32)
        sign, logdet = sl.slogdet(a, mesh=mesh, block_size=8)
        s_ref, l_ref = jnp.linalg.slogdet(a)
        assert float(sign) == float(s_ref)
        np.testing.assert_allclose(logdet, l_ref, rtol=1e-5)
    small = jnp.asarray(rng.standard_normal((16, 16)), jnp.float32)
    np.testing.assert_allclose(
        sl.det(small, mesh=mesh, block_size=2), jnp.linalg.det(small), rtol=1e-4
    )
    f = sl.lu(small, mesh=mesh, block_size=2)
    np.testing.assert_allclose(sl.det(f), jnp.linalg.det(small), rtol=1e-4)
    singular = small.at[:, 3].set(0.0)
    assert tuple(map(float, sl.slogdet(singular, mesh=mesh, block_size=2))) == (0.0, -np.inf)
    assert float(sl.det(singular, mesh=mesh, block_size=2)) == 0.0
