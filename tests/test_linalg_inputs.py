"""Inputs at the edge of what the linalg docs promise: the unread triangle and diagonal, a
complex right-hand side of a real matrix, non-square and non-finite input to det, complex
pivots on the 2-D grid, and numpy integers or repeated names as options. Each checked against
scipy / jax.scipy on one device."""

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
import scipy.linalg as spl
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.linalg as sl

N, NB = 64, 8


@pytest.fixture(params=[AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"])
def mesh(request):
    return jax.make_mesh((8,), ("x",), axis_types=(request.param,))


def _triangle(lower: bool, unread: float) -> tuple[np.ndarray, np.ndarray]:
    """A well-conditioned triangle, and the same with `unread` in the other triangle."""
    rng = np.random.default_rng(0)
    full = (rng.standard_normal((N, N)) + 4 * np.eye(N)).astype(np.float32)
    t = np.tril(full) if lower else np.triu(full)
    dirty = t.copy()
    dirty[np.triu_indices(N, 1) if lower else np.tril_indices(N, -1)] = unread
    return t, dirty


@pytest.mark.parametrize("unread", [np.inf, np.nan])
@pytest.mark.parametrize("lower,transpose", [(True, False), (False, False), (True, True)])
def test_triangular_solve_never_reads_the_other_triangle(mesh, unread, lower, transpose):
    t, dirty = _triangle(lower, unread)
    b = np.random.default_rng(1).standard_normal((N, 3)).astype(np.float32)
    a = jax.device_put(dirty, NamedSharding(mesh, P("x", None)))
    x = sl.triangular_solve(a, b, lower=lower, transpose=transpose, block_size=NB)
    ref = jsl.solve_triangular(t, b, lower=lower, trans=int(transpose))
    np.testing.assert_allclose(x, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


@pytest.mark.parametrize("transpose", [False, True])
def test_unit_diagonal_never_reads_the_stored_diagonal(mesh, transpose):
    rng = np.random.default_rng(2)
    t = (np.tril(rng.standard_normal((N, N)), -1) / N).astype(np.float32)
    np.fill_diagonal(t, np.inf)
    b = rng.standard_normal(N).astype(np.float32)
    x = sl.triangular_solve(t, b, lower=True, transpose=transpose, unit_diagonal=True, mesh=mesh)
    ref = jsl.solve_triangular(t, b, lower=True, trans=int(transpose), unit_diagonal=True)
    assert np.isfinite(np.asarray(ref)).all()
    np.testing.assert_allclose(x, ref, rtol=1e-4, atol=1e-5)


def test_cho_solve_ignores_the_upper_triangle_cholesky_did_not_read(mesh):
    rng = np.random.default_rng(3)
    g = rng.standard_normal((N, N)).astype(np.float32)
    s = g @ g.T + N * np.eye(N, dtype=np.float32)
    dirty = np.tril(s) + np.triu(np.full((N, N), np.nan, np.float32), 1)
    b = rng.standard_normal(N).astype(np.float32)
    x = sl.cho_solve(sl.cholesky(dirty, mesh=mesh, block_size=NB), b)
    ref = jsl.cho_solve(jsl.cho_factor(s, lower=True), b)
    np.testing.assert_allclose(x, ref, rtol=1e-4, atol=1e-5)


def _real_system(n: int = 40):
    rng = np.random.default_rng(4)
    a = (rng.standard_normal((n, n)) / 4 + 2 * np.eye(n)).astype(np.float32)
    b = (rng.standard_normal((n, 2)) + 1j * rng.standard_normal((n, 2))).astype(np.complex64)
    return a, b


@pytest.mark.parametrize("vector", [True, False], ids=["b(N,)", "b(N,k)"])
def test_a_complex_right_hand_side_of_a_real_matrix_gives_the_complex_solution(mesh, vector):
    a, b = _real_system()
    b = b[:, 0] if vector else b
    ref = jnp.linalg.solve(a, b)
    spd = a @ a.T + np.eye(len(a), dtype=np.float32)
    lower = np.tril(a)
    got = {
        "solve": (sl.solve(a, b, mesh=mesh), ref),
        "lu_solve": (sl.lu_solve(sl.lu(a, mesh=mesh), b), ref),
        "solve(transpose)": (sl.solve(a, b, mesh=mesh, transpose=True), jnp.linalg.solve(a.T, b)),
        "cho_solve": (
            sl.cho_solve(sl.cholesky(spd, mesh=mesh), b),
            jsl.cho_solve(jsl.cho_factor(spd, lower=True), b),
        ),
        "triangular_solve": (
            sl.triangular_solve(lower, b, lower=True, mesh=mesh),
            jsl.solve_triangular(lower, b, lower=True),
        ),
    }
    for name, (x, want) in got.items():
        assert x.dtype == jnp.complex64 and x.shape == b.shape, name
        np.testing.assert_allclose(x, want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_batched_solve_promotes_a_complex_right_hand_side(mesh):
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((8, 6, 6)) + 3 * np.eye(6)).astype(np.float32)
    b = (rng.standard_normal((8, 6)) + 1j * rng.standard_normal((8, 6))).astype(np.complex64)
    x = sl.batched_solve(a, b, mesh=mesh)
    ref = jnp.linalg.solve(a, b[..., None])[..., 0]
    assert x.dtype == jnp.complex64
    np.testing.assert_allclose(x, ref, rtol=1e-4, atol=1e-5)


def test_gradient_of_a_complex_right_hand_side_of_a_real_matrix_matches_jnp(mesh):
    a, b = _real_system(24)

    def loss(solve, a, b):
        return jnp.sum(jnp.abs(solve(a, b)) ** 2)

    ours = jax.grad(lambda a, b: loss(lambda a, b: sl.solve(a, b, mesh=mesh), a, b), (0, 1))
    theirs = jax.grad(lambda a, b: loss(jnp.linalg.solve, a, b), (0, 1))
    with jax.set_mesh(mesh):  # on Explicit axes jax.grad's scalar seed needs the mesh
        grads = ours(a, b)
    for g, r in zip(grads, theirs(a, b), strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-4 * float(jnp.abs(r).max()))


@pytest.mark.parametrize("fn", [sl.det, sl.slogdet])
def test_det_of_a_non_square_matrix_raises(mesh, fn):
    a = np.random.default_rng(6).standard_normal((16, 8)).astype(np.float32)
    square = r"a: expected a square matrix \(N, N\), got shape \(16, 8\)"
    with pytest.raises(ValueError, match=square):
        fn(a, mesh=mesh)
    with pytest.raises(ValueError, match=r"LUFactors are of a \(16, 8\) matrix, which has no det"):
        fn(sl.lu(a, mesh=mesh))
    with pytest.raises(ValueError, match=r"got shape \(2, 8, 8\).*batched_slogdet"):
        fn(jnp.full((2, 8, 8), jnp.nan), mesh=mesh)


def test_det_of_a_non_finite_matrix_names_the_entry_on_any_axis_type(mesh):
    a = np.eye(16, dtype=np.float32)
    a[3, 5] = -np.inf
    x = jax.device_put(a, NamedSharding(mesh, P("x", None)))
    with pytest.raises(ValueError, match=r"holds -inf at \[3, 5\]"):
        sl.slogdet(x)
    a[3, 5], a[7, 1] = 1.0, np.nan
    with pytest.raises(ValueError, match=r"holds nan at \[7, 1\]"):
        sl.det(jax.device_put(a, NamedSharding(mesh, P("x", None))))


@pytest.mark.parametrize("seed", [7, 8])
def test_complex_pivots_on_the_grid_equal_lapack(seed):
    mesh = jax.make_mesh((2, 4), ("r", "c"))
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((32, 32)) + 1j * rng.standard_normal((32, 32))).astype(np.complex64)
    f = sl.lu(a, mesh=mesh, grid=("r", "c"), block_size=4)
    np.testing.assert_array_equal(f.pivots[:32], spl.lu_factor(a)[1])


def test_numpy_integer_block_size_and_repeated_axis_names():
    mesh = jax.make_mesh((2, 4), ("r", "c"))
    a = np.random.default_rng(9).standard_normal((32, 32)).astype(np.float32) + 8 * np.eye(32)
    b = np.ones(32, np.float32)
    x = sl.solve(a, b, mesh=mesh, block_size=np.int64(4))
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"axis_names: \('r', 'r'\) names a mesh axis twice"):
        sl.solve(a, b, mesh=mesh, axis_names=("r", "r"))


def _hermitian(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))
    return (g @ g.conj().T / n + np.eye(n)).astype(np.complex64)


def test_cg_conjugates_complex_vectors(mesh):
    # b . b = 0 for this b without the conjugate: an unconjugated CG stops at x = 0
    spd = (2 * np.eye(16) - np.eye(16, k=1) - np.eye(16, k=-1)).astype(np.complex64)
    b = np.zeros(16, np.complex64)
    b[0], b[1] = 1, 1j
    for a, rhs in [(spd, b), (_hermitian(16, 10), _hermitian(16, 11)[0])]:
        x, info = sl.cg(a, rhs, mesh=mesh, tol=1e-6)
        ref = np.linalg.solve(a.astype(np.complex128), rhs)
        assert np.linalg.norm(np.asarray(x) - ref) / np.linalg.norm(ref) < 1e-5
        assert bool(info.converged) and int(info.iterations) > 0
        assert not jnp.iscomplexobj(info.residual_norm)


def test_cg_promotes_an_integer_right_hand_side(mesh):
    a = (4 * np.eye(16) - np.eye(16, k=1) - np.eye(16, k=-1)).astype(np.float32)
    b = np.arange(16, dtype=np.int32)
    x, info = sl.cg(a, b, mesh=mesh, tol=1e-6)
    assert x.dtype == np.float32 and bool(info.converged)
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-5, atol=1e-5)


def test_solves_promote_a_wider_right_hand_side_as_jnp_does():
    mesh = jax.make_mesh((8,), ("x",))
    a = (4 * np.eye(16) - np.eye(16, k=1) - np.eye(16, k=-1)).astype(np.float32)  # exact
    rng = np.random.default_rng(12)
    with jax.enable_x64(True):
        b = rng.standard_normal(16)  # float64
        ref = np.linalg.solve(a.astype(np.float64), b)
        x = sl.solve(a, b, mesh=mesh)
        assert x.dtype == jnp.linalg.solve(a, b).dtype == np.float64
        np.testing.assert_allclose(x, ref, rtol=1e-13)  # float32 would be off by ~1e-7
        lower = np.tril(a)
        x = sl.triangular_solve(lower, b, lower=True, mesh=mesh)
        assert x.dtype == np.float64
        np.testing.assert_allclose(x, spl.solve_triangular(lower, b, lower=True), rtol=1e-13)
        for factors, solver in [
            (sl.lu(a, mesh=mesh), sl.lu_solve),
            (sl.cholesky(a, mesh=mesh), sl.cho_solve),
        ]:
            assert solver(factors, b).dtype == np.float64  # factors in float32: float32 accuracy
            np.testing.assert_allclose(solver(factors, b), ref, rtol=1e-5)
        bc = (b + 1j * rng.standard_normal(16)).astype(np.complex128)
        x = sl.solve(a.astype(np.complex64), bc, mesh=mesh)
        assert x.dtype == np.complex128
        np.testing.assert_allclose(x, np.linalg.solve(a.astype(np.complex128), bc), rtol=1e-13)


@pytest.mark.parametrize("fn", ["slogdet", "det"])
def test_gradients_through_grid_det_raise_with_the_fix(fn):
    mesh = jax.make_mesh((2, 4), ("r", "c"))
    a = np.random.default_rng(13).standard_normal((32, 32)).astype(np.float32) + 8 * np.eye(32)

    def f(x):
        factors = sl.lu(x, mesh=mesh, grid=("r", "c"), block_size=4)
        return sl.slogdet(factors)[1] if fn == "slogdet" else sl.det(factors)

    want = jnp.linalg.slogdet(a)[1] if fn == "slogdet" else jnp.linalg.det(a)
    np.testing.assert_allclose(f(a), want, rtol=1e-4)
    with jax.set_mesh(mesh), pytest.raises(ValueError, match=r"lu, det or slogdet.*drop grid="):
        jax.grad(f)(a)


def test_nan_on_the_grid_gives_non_finite_factors_not_a_zero_pivot():
    mesh = jax.make_mesh((2, 4), ("r", "c"))
    a = np.random.default_rng(14).standard_normal((16, 16)).astype(np.float32) + 4 * np.eye(16)
    a[4, 9] = np.nan
    f = sl.lu(a, mesh=mesh, grid=("r", "c"), block_size=2)
    assert int(f.info) == 0  # no exactly zero pivot: the factors are NaN
    assert np.isnan(jax.jit(lambda x: sl.slogdet(x, mesh=mesh, grid=("r", "c")))(a)[1])
    with pytest.raises(sl.SingularMatrixError, match="not finite"):
        sl.solve(a, np.ones(16, np.float32), mesh=mesh, grid=("r", "c"))


@pytest.mark.parametrize("fn", ["solve", "det", "lu", "cholesky", "triangular_solve"])
def test_an_empty_matrix_is_named(mesh, fn):
    a = np.zeros((0, 0), np.float32)
    args = (a, np.zeros(0, np.float32)) if fn in ("solve", "triangular_solve") else (a,)
    options = {"lower": True} if fn == "triangular_solve" else {}
    with pytest.raises(ValueError, match=r"a: the matrix is empty \(shape \(0, 0\)\)"):
        getattr(sl, fn)(*args, mesh=mesh, **options)
