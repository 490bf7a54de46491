"""batched_solve (zero collectives) and conjugate gradients (vector-sized collectives only)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.linalg as sl
from shardkit.inspection.hlo import COLLECTIVE_KINDS, collective_counts


def make_mesh(shape, names, axis_type):
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape))


def test_batched_solve_seed_exercise(axis_type):
    """8 systems of 16 x 16, one per device, as in the seed's exercise 2."""
    mesh = make_mesh((8,), ("x",), axis_type)
    a_stack = jnp.stack([jax.random.normal(jax.random.key(i), (16, 16)) for i in range(8)])
    b_stack = jnp.stack([jax.random.normal(jax.random.key(i + 8), (16,)) for i in range(8)])
    a_stack = jax.device_put(a_stack, NamedSharding(mesh, P("x")))
    xs = sl.batched_solve(a_stack, b_stack)
    assert xs.shape == (8, 16)
    assert xs.sharding.spec[0] in ("x", ("x",))
    assert [s.data.shape for s in xs.addressable_shards] == [(1, 16)] * 8
    ref = jnp.linalg.solve(np.asarray(a_stack), np.asarray(b_stack)[..., None])[..., 0]
    np.testing.assert_allclose(xs, ref, rtol=1e-4, atol=1e-5)
    hlo = (
        jax.jit(lambda a, b: sl.batched_solve(a, b, mesh=mesh))
        .lower(a_stack, b_stack)
        .compile()
        .as_text()
    )
    assert sum(collective_counts(hlo).values()) == 0


def test_batched_solve_2d_mesh_many_rhs(axis_type):
    mesh = make_mesh((2, 4), ("x", "y"), axis_type)
    a_stack = jax.random.normal(jax.random.key(0), (16, 12, 12))
    b_stack = jax.random.normal(jax.random.key(1), (16, 12, 3))
    xs = sl.batched_solve(a_stack, b_stack, mesh=mesh)
    np.testing.assert_allclose(xs, jnp.linalg.solve(a_stack, b_stack), rtol=1e-4, atol=1e-4)
    assert xs.addressable_shards[0].data.shape == (2, 12, 3)


def test_batched_solve_errors():
    mesh = make_mesh((8,), ("x",), AxisType.Explicit)
    with pytest.raises(ValueError, match=r"a_stack: batch size 6 is not a multiple of the 8"):
        sl.batched_solve(jnp.ones((6, 4, 4)), jnp.ones((6, 4)), mesh=mesh)
    with pytest.raises(ValueError, match=r"a_stack: expected a stack of square matrices"):
        sl.batched_solve(jnp.ones((8, 4, 5)), jnp.ones((8, 4)), mesh=mesh)
    with pytest.raises(ValueError, match=r"b_stack: expected shape \(8, 4\)"):
        sl.batched_solve(jnp.ones((8, 4, 4)), jnp.ones((8, 5)), mesh=mesh)
    a_stack = jnp.stack([jnp.eye(4)] * 8).at[3].set(0.0)  # system 3 is singular
    with pytest.raises(sl.SingularMatrixError, match="system 3 of 8 has a non-finite solution"):
        sl.batched_solve(a_stack, jnp.ones((8, 4)), mesh=mesh)


def poisson_2d(m):
    """Dense 5-point Laplacian on an m x m grid (SPD, condition ~ m^2)."""
    t = 2 * np.eye(m) - np.eye(m, k=1) - np.eye(m, k=-1)
    return np.kron(t, np.eye(m)) + np.kron(np.eye(m), t)


def spd_variable_diagonal(n, seed=0):
    """SPD with a widely varying diagonal, where Jacobi preconditioning pays off."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, n)) / np.sqrt(n)
    d = np.logspace(0, 3, n)
    return np.diag(d) + 0.5 * (q @ q.T)


@pytest.mark.parametrize("precond", [None, "jacobi"])
def test_cg_matches_direct_solve(precond, axis_type):
    mesh = make_mesh((2, 4), ("x", "y"), axis_type)
    a = jnp.asarray(spd_variable_diagonal(128), jnp.float32)
    b = jnp.asarray(np.random.default_rng(1).standard_normal(128), jnp.float32)
    a_sh = jax.device_put(a, NamedSharding(mesh, P(("x", "y"), None)))
    x, info = sl.cg(a_sh, b, tol=1e-6, preconditioner=precond, maxiter=2000)
    assert bool(info.converged) and 0 < int(info.iterations) < 2000
    assert x.sharding.spec[0] == ("x", "y")
    ref = np.linalg.solve(np.asarray(a, np.float64), np.asarray(b, np.float64))
    np.testing.assert_allclose(x, ref, rtol=1e-3, atol=1e-5)
    r = np.linalg.norm(np.asarray(a, np.float64) @ np.asarray(x, np.float64) - np.asarray(b))
    assert r <= 1e-5 * np.linalg.norm(np.asarray(b)) * 5  # recurrence vs true residual drift


def test_cg_jacobi_needs_fewer_iterations_and_user_preconditioner():
    mesh = make_mesh((8,), ("x",), AxisType.Explicit)
    a = jnp.asarray(spd_variable_diagonal(128, seed=2), jnp.float32)
    b = jnp.ones(128, jnp.float32)
    _, plain = sl.cg(a, b, mesh=mesh, tol=1e-5)
    _, jac = sl.cg(a, b, mesh=mesh, tol=1e-5, preconditioner="jacobi")
    assert int(jac.iterations) < int(plain.iterations) / 2, (jac, plain)
    diag = jnp.diagonal(a)
    x, user = sl.cg(a, b, mesh=mesh, tol=1e-5, preconditioner=lambda r: r / diag)
    assert int(user.iterations) == int(jac.iterations)


def _laplacian_1d(v):
    """Matrix-free 1-D Dirichlet Laplacian (a module-level function: hashable).

    On Explicit axes shifting a sharded vector by one is refused, so the function replicates
    the vector first (its own choice of communication: N words).
    """
    mesh = jax.typeof(v).sharding.mesh
    if not mesh.empty and all(t == AxisType.Explicit for t in mesh.axis_types):
        v = jax.sharding.reshard(v, NamedSharding(mesh, P()))
    left = jnp.concatenate([jnp.zeros(1, v.dtype), v[:-1]])
    right = jnp.concatenate([v[1:], jnp.zeros(1, v.dtype)])
    return 2 * v - left - right


def test_cg_matrix_free_and_nonconvergence_reported(axis_type):
    mesh = make_mesh((8,), ("x",), axis_type)
    n = 64
    b = jnp.ones(n, jnp.float32)
    x, info = sl.cg(_laplacian_1d, b, mesh=mesh, tol=1e-6)
    dense = 2 * np.eye(n) - np.eye(n, k=1) - np.eye(n, k=-1)
    np.testing.assert_allclose(x, np.linalg.solve(dense, np.ones(n)), rtol=1e-3)
    assert int(info.iterations) <= n // 2 + 2  # CG is exact in <= #distinct eigenvalues steps
    _, short = sl.cg(_laplacian_1d, b, mesh=mesh, tol=1e-6, maxiter=3)
    assert int(short.iterations) == 3 and not bool(short.converged)


def test_cg_compiled_collectives_are_vector_sized(axis_type):
    mesh = make_mesh((8,), ("x",), axis_type)
    n = 256
    a = jax.ShapeDtypeStruct((n, n), jnp.float32, sharding=NamedSharding(mesh, P("x", None)))
    b = jax.ShapeDtypeStruct((n,), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    hlo = (
        jax.jit(lambda a, b: sl.cg(a, b, mesh=mesh, preconditioner="jacobi"))
        .lower(a, b)
        .compile()
        .as_text()
    )
    counts = collective_counts(hlo)
    assert counts["all-gather"] == 1  # the search direction, once per iteration
    assert counts["all-to-all"] == counts["collective-permute"] == 0
    kinds = "|".join(COLLECTIVE_KINDS)
    for line in hlo.splitlines():
        m = re.search(r"=\s*(\S+)\s+(" + kinds + r")(-start)?\(", line)
        if m:
            dims = re.search(r"\[([\d,]*)\]", m.group(1)).group(1)
            size = int(np.prod([int(d) for d in dims.split(",") if d]))
            assert size <= n, line  # vectors and scalars only, never the matrix


def test_cg_poisson_2d():
    mesh = make_mesh((8,), ("x",), AxisType.Auto)
    a = jnp.asarray(poisson_2d(16), jnp.float32)  # N = 256
    b = jnp.ones(256, jnp.float32)
    x, info = sl.cg(a, b, mesh=mesh, tol=1e-6)
    assert bool(info.converged)
    np.testing.assert_allclose(a @ x, b, atol=1e-4)


def test_cg_errors():
    mesh = make_mesh((8,), ("x",), AxisType.Explicit)
    a = jnp.eye(64)
    with pytest.raises(ValueError, match=r"a: expected shape \(64, 64\) to match b"):
        sl.cg(jnp.eye(32), jnp.ones(64), mesh=mesh)
    with pytest.raises(ValueError, match=r"b: expected a vector \(N,\)"):
        sl.cg(a, jnp.ones((64, 2)), mesh=mesh)
    with pytest.raises(ValueError, match="preconditioner: expected None, 'jacobi'"):
        sl.cg(a, jnp.ones(64), mesh=mesh, preconditioner="ilu")
    with pytest.raises(ValueError, match="preconditioner: 'jacobi' needs the matrix"):
        sl.cg(_laplacian_1d, jnp.ones(64), mesh=mesh, preconditioner="jacobi")
    with pytest.raises(ValueError, match="b: size 60 is not a multiple of the 8 devices"):
        sl.cg(jnp.eye(60), jnp.ones(60), mesh=mesh)
