"""Singular triangles: triangular_solve and cho_solve raise like solve (check=True), or give
JAX's inf/NaN with check=False and inside jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

import shardkit.linalg as sl

N, NB = 64, 8


@pytest.fixture
def mesh():
    return jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))


def triangle(lower, zero_at):
    rng = np.random.default_rng(0)
    full = rng.standard_normal((N, N)) + 4 * np.eye(N)
    t = np.tril(full) if lower else np.triu(full)
    t[zero_at, zero_at] = 0.0  # exactly singular
    return jnp.asarray(t, jnp.float32)


@pytest.mark.parametrize("lower,transpose,zero_at", [(True, False, 5), (False, True, 40)])
def test_triangular_solve_of_a_singular_triangle_raises(mesh, lower, transpose, zero_at):
    t = triangle(lower, zero_at)
    b = jnp.ones(N, jnp.float32)
    kw = dict(lower=lower, transpose=transpose, mesh=mesh, block_size=NB)
    match = rf"a: the \(64, 64\) triangle is singular: a\[{zero_at}, {zero_at}\] is exactly zero"
    with pytest.raises(sl.SingularMatrixError, match=match + r".*check=False"):
        sl.triangular_solve(t, b, **kw)
    # check=False: JAX's behaviour, inf/NaN, as jax.scipy.linalg.solve_triangular gives
    ref = jax.scipy.linalg.solve_triangular(t, b, lower=lower, trans=int(transpose))
    x = sl.triangular_solve(t, b, check=False, **kw)
    assert not np.isfinite(np.asarray(ref)).all() and not np.isfinite(np.asarray(x)).all()
    # inside jit nothing can raise: the same non-finite result
    x_jit = jax.jit(lambda t: sl.triangular_solve(t, b, **kw))(t)
    assert not np.isfinite(np.asarray(x_jit)).all()
    # a unit diagonal ignores the stored zero: no error, the reference's answer
    x_unit = sl.triangular_solve(t, b, unit_diagonal=True, **kw)
    ref_unit = jax.scipy.linalg.solve_triangular(
        t, b, lower=lower, trans=int(transpose), unit_diagonal=True
    )
    np.testing.assert_allclose(
        x_unit, ref_unit, rtol=1e-4, atol=1e-4 * float(jnp.abs(ref_unit).max())
    )


def test_triangular_solve_with_inf_entries_raises(mesh):
    t = np.asarray(triangle(True, 0)).copy()
    t[0, 0], t[9, 3] = 2.0, np.inf
    with pytest.raises(sl.SingularMatrixError, match=r"solution .* is not finite.*check=False"):
        sl.triangular_solve(jnp.asarray(t), jnp.ones(N), lower=True, mesh=mesh, block_size=NB)


def test_cho_solve_with_a_zero_on_the_diagonal_of_l_raises(mesh):
    l = np.asarray(triangle(True, 17))
    storage = sl.to_column_cyclic(jnp.asarray(l), block_size=NB, mesh=mesh)
    f = sl.CholeskyFactors(storage, jnp.zeros((), jnp.int32), N, NB, mesh, ("x",))
    b = jnp.ones(N, jnp.float32)
    match = r"factors: the \(64, 64\) Cholesky factor is singular: L\[17, 17\] is exactly zero"
    with pytest.raises(sl.SingularMatrixError, match=match + r".*check=False"):
        sl.cho_solve(f, b)
    ref = jax.scipy.linalg.cho_solve((jnp.asarray(l), True), b)
    x = sl.cho_solve(f, b, check=False)
    assert not np.isfinite(np.asarray(ref)).all() and not np.isfinite(np.asarray(x)).all()
    x_jit = jax.jit(lambda f: sl.cho_solve(f, b))(f)
    assert not np.isfinite(np.asarray(x_jit)).all()
    # a regular factor still solves, and check=False changes nothing there
    good = l.copy()
    good[17, 17] = 3.0
    g = sl.CholeskyFactors(sl.to_column_cyclic(jnp.asarray(good), block_size=NB, mesh=mesh),
                           jnp.zeros((), jnp.int32), N, NB, mesh, ("x",))  # fmt: skip
    ref = jax.scipy.linalg.cho_solve((jnp.asarray(good), True), b)
    for check in (True, False):
        np.testing.assert_allclose(sl.cho_solve(g, b, check=check), ref, rtol=1e-4,
                                   atol=1e-4 * float(jnp.abs(ref).max()))  # fmt: skip


def test_lu_solve_with_factors_of_a_singular_matrix_names_the_factors(mesh):
    # column 20 is zero: the factorization itself completes (info = 21, as LAPACK's getrf
    # reports), and the solve with those factors says which argument is at fault
    a = np.asarray(triangle(True, 3)) + np.eye(N, dtype=np.float32)
    a[:, 20] = 0.0
    factors = sl.lu(jnp.asarray(a), mesh=mesh, block_size=NB)
    assert int(factors.info) == 21
    match = r"factors: the \(64, 64\) matrix is singular: U\[20, 20\] is exactly zero"
    with pytest.raises(sl.SingularMatrixError, match=match):
        sl.lu_solve(factors, jnp.ones(N, jnp.float32))
    with pytest.raises(sl.SingularMatrixError, match=r"a: the \(64, 64\) matrix is singular"):
        sl.solve(jnp.asarray(a), jnp.ones(N, jnp.float32), mesh=mesh, block_size=NB)
