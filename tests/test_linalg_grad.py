"""Gradients through solve, lu_solve, cho_solve and triangular_solve against single-device JAX.

Each test differentiates a scalar loss ``<w, x>`` (w random, so every entry of the cotangent
differs) with respect to the matrix (or its factor storage) and the right-hand side, and compares
with ``jax.grad`` of ``jnp.linalg.solve`` / ``jax.scipy.linalg.lu_solve`` / ``cho_solve`` /
``solve_triangular`` on one device. Tolerance: ``rtol`` of 2e-4 (float32) or 1e-10 (float64),
with ``atol`` the same multiple of the reference's largest entry. The matrices are well
conditioned (condition number below 20), so both sides agree to a few ulps times N.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.linalg as sl
from shardkit.inspection.hlo import collective_counts

N, NB = 48, 8  # padded to 64 inside: the identity padding is differentiated through too
TOL = {"float32": 2e-4, "float64": 1e-10}


def make_mesh(axis_type, shape=(8,), names=("x",)):
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape))


def system(dtype, k, seed=0):
    """A well-conditioned (N, N) matrix, a right-hand side (N,) or (N, k) and loss weights."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((N, N)) / np.sqrt(N) + 2 * np.eye(N)
    shape = (N,) if k is None else (N, k)
    b, w = rng.standard_normal(shape), rng.standard_normal(shape)
    return (jnp.asarray(v, dtype) for v in (a, b, w))


def assert_close(got, ref, dtype):
    tol = TOL[dtype]
    ref = np.asarray(ref, np.float64)
    np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=tol,
                               atol=tol * np.abs(ref).max())  # fmt: skip


def natural(storage, factors):
    """Column-block-cyclic storage (Np, Np) -> natural (N, N) order (host, for comparison)."""
    n_pad = storage.shape[0]
    order = sl.column_cyclic_order(n_pad, factors.block_size, len(factors.mesh.devices.flat))
    out = np.empty(storage.shape, storage.dtype)
    out[:, order] = np.asarray(storage)
    return out[: factors.n, : factors.n]


def to_storage(m, storage):
    """Natural (N, N) -> the column-block-cyclic layout of the factors' `storage` (zero in the
    padding), sharded like it: the inverse of `natural`."""
    out = np.zeros(storage.shape, m.dtype)
    out[:N, :N] = np.asarray(m)
    order = sl.column_cyclic_order(storage.shape[0], NB, 8)
    return jax.device_put(jnp.asarray(out[:, order]), storage.sharding)


def complexify(dtype, rng, *arrays):
    """The arrays in `dtype`, with random imaginary parts when it is complex."""
    if dtype.startswith("complex"):
        arrays = [v + 0.3j * jnp.asarray(rng.standard_normal(v.shape)) for v in arrays]
    return [v.astype(dtype) for v in arrays]


@pytest.mark.parametrize("dtype,k", [("float32", None), ("float64", 3)])
def test_solve_grad_matches_jnp(dtype, k, axis_type):
    with jax.enable_x64(True):
        mesh = make_mesh(axis_type)
        a, b, w = system(dtype, k)
        ref = jax.grad(lambda a, b: jnp.vdot(w, jnp.linalg.solve(a, b)), (0, 1))(a, b)
        a_s = jax.device_put(a, NamedSharding(mesh, P("x", None)))

        def loss(a, b):
            return jnp.vdot(w, sl.solve(a, b, block_size=NB))

        with jax.set_mesh(mesh):  # Explicit axes: jax.grad's scalar seed needs the mesh
            ga, gb = jax.grad(loss, (0, 1))(a_s, b)
            ga_jit, gb_jit = jax.jit(jax.grad(loss, (0, 1)))(a_s, b)
        assert_close(ga, ref[0], dtype)
        assert_close(gb, ref[1], dtype)
        assert ga.dtype == a.dtype and gb.shape == b.shape
        assert ga.sharding.is_equivalent_to(a_s.sharding, 2)  # formed sharded like A
        assert_close(ga_jit, ref[0], dtype)
        assert_close(gb_jit, ref[1], dtype)


@pytest.mark.parametrize("dtype,k", [("float32", None), ("complex128", 2)])
def test_solve_forward_mode_matches_jnp(dtype, k, axis_type):
    """jax.jvp, jacfwd and forward-over-reverse (the derivative of the gradient along dA)."""
    with jax.enable_x64(True):
        mesh = make_mesh(axis_type)
        a, b, w = system(dtype, k)
        rng = np.random.default_rng(7)
        da = jnp.asarray(rng.standard_normal(a.shape), dtype)
        db = jnp.asarray(rng.standard_normal(b.shape), dtype)
        a_s = jax.device_put(a, NamedSharding(mesh, P("x", None)))

        def grad_a(solve, a):
            return jax.grad(lambda a: jnp.vdot(w, solve(a, b)).real)(a)

        ours = lambda a, b: sl.solve(a, b, block_size=NB)  # noqa: E731
        ref_x, ref_dx = jax.jvp(jnp.linalg.solve, (a, b), (da, db))
        holo = dtype.startswith("complex")  # the solve is holomorphic in b
        ref_jac = jax.jacfwd(lambda b: jnp.linalg.solve(a, b), holomorphic=holo)(b)
        ref_hvp = jax.jvp(lambda a: grad_a(jnp.linalg.solve, a), (a,), (da,))[1]
        with jax.set_mesh(mesh):
            x, dx = jax.jvp(ours, (a_s, b), (da, db))
            _, dx_jit = jax.jit(lambda a, b: jax.jvp(ours, (a, b), (da, db)))(a_s, b)
            jac = jax.jacfwd(lambda b: ours(a_s, b), holomorphic=holo)(b)
            hvp = jax.jvp(lambda a: grad_a(ours, a), (a_s,), (da,))[1]
        tol = "float32" if dtype == "float32" else "float64"
        pairs = [(x, ref_x), (dx, ref_dx), (dx_jit, ref_dx), (jac, ref_jac), (hvp, ref_hvp)]
        for got, ref in pairs:
            assert got.shape == ref.shape and got.dtype == ref.dtype
            np.testing.assert_allclose(got, ref, rtol=TOL[tol], atol=TOL[tol] * np.abs(ref).max())


def test_forward_mode_in_one_argument_skips_the_other_ones_work(axis_type):
    """A tangent JAX knows to be zero costs nothing: forward mode in b alone makes no dA x
    (one distributed matvec and its all-reduces fewer) and still equals jnp's; in A alone too."""
    mesh = make_mesh(axis_type)
    a, b, _ = system("float32", 2)
    rng = np.random.default_rng(3)
    da, db = (jnp.asarray(rng.standard_normal(v.shape), jnp.float32) for v in (a, b))
    a_s = jax.device_put(a, NamedSharding(mesh, P("x", None)))
    ours = lambda a, b: sl.solve(a, b, block_size=NB)  # noqa: E731
    in_b = lambda a, b, db: jax.jvp(lambda b: ours(a, b), (b,), (db,))  # noqa: E731
    in_a = lambda a, b, da: jax.jvp(lambda a: ours(a, b), (a,), (da,))  # noqa: E731
    both = lambda a, b, da, db: jax.jvp(ours, (a, b), (da, db))  # noqa: E731
    with jax.set_mesh(mesh):
        counts = {name: collective_counts(jax.jit(f).lower(*args).compile().as_text())
                  for name, f, args in (("b", in_b, (a_s, b, db)), ("a", in_a, (a_s, b, da)),
                                        ("both", both, (a_s, b, da, db)))}  # fmt: skip
        got_b, got_a = in_b(a_s, b, db)[1], in_a(a_s, b, da)[1]
    assert counts["b"]["all-reduce"] < counts["both"]["all-reduce"], counts
    assert sum(counts["b"].values()) < sum(counts["a"].values()), counts
    assert_close(got_b, jax.jvp(lambda b: jnp.linalg.solve(a, b), (b,), (db,))[1], "float32")
    assert_close(got_a, jax.jvp(lambda a: jnp.linalg.solve(a, b), (a,), (da,))[1], "float32")


def test_solve_value_and_grad_on_a_2d_mesh_flattened():
    mesh = make_mesh(AxisType.Explicit, (2, 4), ("x", "y"))
    a, b, w = system("float32", 2, seed=1)
    a_s = jax.device_put(a, NamedSharding(mesh, P(("x", "y"), None)))
    f = jax.jit(jax.value_and_grad(lambda a: jnp.vdot(w, sl.solve(a, b, block_size=NB))))
    with jax.set_mesh(mesh):
        val, ga = f(a_s)
    ref_val, ref = jax.value_and_grad(lambda a: jnp.vdot(w, jnp.linalg.solve(a, b)))(a)
    np.testing.assert_allclose(val, ref_val, rtol=2e-5)
    assert_close(ga, ref, "float32")


def test_solve_grad_with_grid_raises_a_clear_error():
    mesh = make_mesh(AxisType.Explicit, (2, 4), ("x", "y"))
    a, b, _ = system("float32", None)
    x = sl.solve(a, b, mesh=mesh, grid=("x", "y"), block_size=4)  # the primal still works
    np.testing.assert_allclose(x, jnp.linalg.solve(a, b), rtol=1e-4, atol=1e-5)
    f = sl.lu(a, mesh=mesh, grid=("x", "y"), block_size=4)
    with jax.set_mesh(mesh):
        with pytest.raises(
            ValueError, match=r"grid: gradients through solve\(\.\.\., grid=.*Fix: differentiate"
        ):
            jax.grad(lambda a: sl.solve(a, b, mesh=mesh, grid=("x", "y"), block_size=4).sum())(a)
        with pytest.raises(
            ValueError, match=r"grid: gradients through lu_solve.*Fix: differentiate"
        ):
            jax.grad(lambda b: sl.lu_solve(f, b).sum())(b)


@pytest.mark.parametrize("dtype,k", [("float32", None), ("float64", 2)])
def test_lu_solve_grad_matches_jax_scipy(dtype, k, axis_type):
    """d/db and d/d(packed LU storage), against jax.scipy.linalg.lu_solve on the same factors."""
    with jax.enable_x64(True):
        mesh = make_mesh(axis_type)
        a, b, w = system(dtype, k, seed=2)
        f = sl.lu(jax.device_put(a, NamedSharding(mesh, P("x", None))), block_size=NB)
        packed = jnp.asarray(natural(f.lu, f))  # LAPACK's packed form of the same factors
        piv = jnp.asarray(np.asarray(f.pivots)[:N])

        def ref_loss(lu, b):
            return jnp.vdot(w, jax.scipy.linalg.lu_solve((lu, piv), b))

        ref = jax.grad(ref_loss, (0, 1))(packed, b)

        def loss(storage, b):
            return jnp.vdot(w, sl.lu_solve(dataclasses.replace(f, lu=storage), b))

        for fn in (loss, jax.jit(loss)):
            with jax.set_mesh(mesh):
                g_lu, gb = jax.grad(fn, (0, 1))(f.lu, b)
            assert g_lu.sharding.is_equivalent_to(f.lu.sharding, 2)
            assert_close(natural(g_lu, f), ref[0], dtype)
            assert_close(gb, ref[1], dtype)
        # the whole factors pytree: the integer fields get no gradient, the storage its own
        with jax.set_mesh(mesh):
            g = jax.grad(lambda f: jnp.vdot(w, sl.lu_solve(f, b)), allow_int=True)(f)
        assert_close(natural(g.lu, f), ref[0], dtype)


@pytest.mark.parametrize("dtype,k", [("float32", 2), ("complex128", None)])
def test_lu_solve_forward_mode_matches_jax_scipy(dtype, k, axis_type):
    """jax.jvp (tangents in the LU storage and in b), jacfwd in b, and forward-over-reverse."""
    with jax.enable_x64(True):
        mesh = make_mesh(axis_type)
        a, b, _ = system("float64", k, seed=5)
        rng = np.random.default_rng(6)
        a, b = complexify(dtype, rng, a, b)
        f = sl.lu(jax.device_put(a, NamedSharding(mesh, P("x", None))), block_size=NB)
        packed = jnp.asarray(natural(f.lu, f))
        piv = jnp.asarray(np.asarray(f.pivots)[:N])
        d_packed = jnp.asarray(rng.standard_normal((N, N)) / N, dtype)
        db = jnp.asarray(rng.standard_normal(b.shape), dtype)
        d_storage = to_storage(d_packed, f.lu)  # the same tangent, in the cyclic layout

        def ref(lu, b):
            return jax.scipy.linalg.lu_solve((lu, piv), b)

        def ours(storage, b):
            return sl.lu_solve(dataclasses.replace(f, lu=storage), b)

        ref_x, ref_dx = jax.jvp(ref, (packed, b), (d_packed, db))
        holo = dtype.startswith("complex")
        ref_jac = jax.jacfwd(lambda b: ref(packed, b), holomorphic=holo)(b)
        w = jnp.ones(b.shape, dtype)
        ref_hvp = jax.jvp(lambda b: jax.grad(lambda s: jnp.vdot(w, ref(s, b)).real)(packed),
                          (b,), (db,))[1]  # fmt: skip
        tol = "float32" if dtype in ("float32", "complex64") else "float64"
        with jax.set_mesh(mesh):
            x, dx = jax.jvp(ours, (f.lu, b), (d_storage, db))
            _, dx_jit = jax.jit(lambda s, b: jax.jvp(ours, (s, b), (d_storage, db)))(f.lu, b)
            jac = jax.jacfwd(lambda b: ours(f.lu, b), holomorphic=holo)(b)
            hvp = jax.jvp(lambda b: jax.grad(lambda s: jnp.vdot(w, ours(s, b)).real)(f.lu),
                          (b,), (db,))[1]  # fmt: skip
        for got, want in ((x, ref_x), (dx, ref_dx), (dx_jit, ref_dx), (jac, ref_jac)):
            assert_close(np.asarray(got).real, np.asarray(want).real, tol)
            assert_close(np.asarray(got).imag, np.asarray(want).imag, tol)
        assert_close(natural(hvp, f).real, np.asarray(ref_hvp).real, tol)
        assert_close(natural(hvp, f).imag, np.asarray(ref_hvp).imag, tol)


@pytest.mark.parametrize("dtype,k", [("float32", None), ("float64", 2)])
def test_cho_solve_grad_matches_jax_scipy(dtype, k, axis_type):
    with jax.enable_x64(True):
        mesh = make_mesh(axis_type)
        a, b, w = system(dtype, k, seed=3)
        a = a @ a.T  # symmetric positive definite, condition below 20
        f = sl.cholesky(jax.device_put(a, NamedSharding(mesh, P("x", None))), block_size=NB)
        c = jnp.linalg.cholesky(a)

        def ref_loss(c, b):
            return jnp.vdot(w, jax.scipy.linalg.cho_solve((c, True), b))

        ref = jax.grad(ref_loss, (0, 1))(c, b)

        def loss(storage, b):
            return jnp.vdot(w, sl.cho_solve(dataclasses.replace(f, l=storage), b))

        for fn in (loss, jax.jit(loss)):
            with jax.set_mesh(mesh):
                g_l, gb = jax.grad(fn, (0, 1))(f.l, b)
            assert g_l.sharding.is_equivalent_to(f.l.sharding, 2)
            assert_close(np.tril(natural(g_l, f)), ref[0], dtype)
            assert_close(np.triu(natural(g_l, f), 1), np.zeros((N, N)), dtype)  # not read
            assert_close(gb, ref[1], dtype)


@pytest.mark.parametrize("dtype,k", [("float64", 2), ("complex128", None), ("complex64", 2)])
def test_cho_solve_forward_mode_and_complex_gradients_match_jax_scipy(dtype, k, axis_type):
    """jax.jvp (tangents in the storage of L and in b), jacfwd in b, and jax.grad for complex
    (Hermitian) factors, against jax.scipy.linalg.cho_solve on the same factor."""
    with jax.enable_x64(True):
        mesh = make_mesh(axis_type)
        a, b, w = system("float64", k, seed=7)
        rng = np.random.default_rng(8)
        a, b, w = complexify(dtype, rng, a, b, w)
        a = a @ a.conj().T  # Hermitian positive definite, well conditioned
        f = sl.cholesky(jax.device_put(a, NamedSharding(mesh, P("x", None))), block_size=NB)
        c = jnp.asarray(np.tril(natural(f.l, f)))  # the same factor, natural order
        dc = jnp.asarray(np.tril(rng.standard_normal((N, N))) / N, dtype)
        db = jnp.asarray(rng.standard_normal(b.shape), dtype)
        d_storage = to_storage(dc, f.l)  # the same tangent, in the cyclic layout

        def ref(c, b):
            return jax.scipy.linalg.cho_solve((c, True), b)

        def ours(storage, b):
            return sl.cho_solve(dataclasses.replace(f, l=storage), b)

        def loss(fn):
            return lambda s, b: jnp.real(jnp.vdot(w, fn(s, b)))

        holo = dtype.startswith("complex")
        ref_x, ref_dx = jax.jvp(ref, (c, b), (dc, db))
        ref_jac = jax.jacfwd(lambda b: ref(c, b), holomorphic=holo)(b)
        ref_g = jax.grad(loss(ref), (0, 1))(c, b)
        with jax.set_mesh(mesh):
            x, dx = jax.jvp(ours, (f.l, b), (d_storage, db))
            jac = jax.jacfwd(lambda b: ours(f.l, b), holomorphic=holo)(b)
            g_l, gb = jax.grad(loss(ours), (0, 1))(f.l, b)
        tol = "float32" if dtype == "complex64" else "float64"
        pairs = [(x, ref_x), (dx, ref_dx), (jac, ref_jac), (gb, ref_g[1])]
        pairs.append((np.tril(natural(g_l, f)), ref_g[0]))
        for got, want in pairs:
            assert_close(np.asarray(got).real, np.asarray(want).real, tol)
            assert_close(np.asarray(got).imag, np.asarray(want).imag, tol)
        assert not np.asarray(np.triu(natural(g_l, f), 1)).any()  # the upper triangle is not read


@pytest.mark.parametrize(
    "lower,transpose,unit,k",
    [(True, False, False, None), (False, False, True, 2), (True, True, True, None),
     (False, True, False, 2)],
)  # fmt: skip
def test_triangular_solve_grad_matches_solve_triangular(lower, transpose, unit, k, axis_type):
    """The other triangle holds garbage: its gradient must be zero, as the diagonal's is
    with ``unit_diagonal``."""
    mesh = make_mesh(axis_type)
    full, b, w = system("float32", k, seed=4)
    full = full + 0.3  # nonzero everywhere, so the masks are visible

    def ref_loss(t, b):
        x = jax.scipy.linalg.solve_triangular(t, b, trans=int(transpose), lower=lower,
                                              unit_diagonal=unit)  # fmt: skip
        return jnp.vdot(w, x)

    ref = jax.grad(ref_loss, (0, 1))(full, b)
    t_s = jax.device_put(full, NamedSharding(mesh, P("x", None)))

    def loss(t, b):
        x = sl.triangular_solve(t, b, lower=lower, transpose=transpose, unit_diagonal=unit,
                                block_size=NB)  # fmt: skip
        return jnp.vdot(w, x)

    for fn in (loss, jax.jit(loss)):
        with jax.set_mesh(mesh):
            gt, gb = jax.grad(fn, (0, 1))(t_s, b)
        assert gt.sharding.is_equivalent_to(t_s.sharding, 2)
        assert_close(gt, ref[0], "float32")
        assert_close(gb, ref[1], "float32")
    gt = np.asarray(gt)
    assert np.abs(np.triu(gt, 1) if lower else np.tril(gt, -1)).max() == 0.0
    if unit:
        assert np.abs(np.diagonal(gt)).max() == 0.0


@pytest.mark.parametrize(
    "lower,transpose,unit", [(True, False, False), (False, True, True), (True, True, True)]
)
def test_triangular_solve_forward_mode_matches_solve_triangular(lower, transpose, unit):
    """jax.jvp (the tangent of the other triangle, and of a unit diagonal, changes nothing)
    and forward-over-reverse along dT."""
    mesh = make_mesh(AxisType.Explicit)
    full, b, w = system("float32", 2, seed=5)
    full = full + 0.3
    rng = np.random.default_rng(8)
    dt = jnp.asarray(rng.standard_normal(full.shape), jnp.float32)
    db = jnp.asarray(rng.standard_normal(b.shape), jnp.float32)
    kw = dict(lower=lower, unit_diagonal=unit)

    def ref(t, b):
        return jax.scipy.linalg.solve_triangular(t, b, trans=int(transpose), **kw)

    def ours(t, b):
        return sl.triangular_solve(t, b, transpose=transpose, block_size=NB, **kw)

    def grad_t(solve, t):
        return jax.grad(lambda t: jnp.vdot(w, solve(t, b)))(t)

    t_s = jax.device_put(full, NamedSharding(mesh, P("x", None)))
    with jax.set_mesh(mesh):
        x, dx = jax.jvp(ours, (t_s, b), (dt, db))
        hvp = jax.jvp(lambda t: grad_t(ours, t), (t_s,), (dt,))[1]
    ref_x, ref_dx = jax.jvp(ref, (full, b), (dt, db))
    ref_hvp = jax.jvp(lambda t: grad_t(ref, t), (full,), (dt,))[1]
    for got, want in ((x, ref_x), (dx, ref_dx), (hvp, ref_hvp)):
        assert_close(got, want, "float32")
