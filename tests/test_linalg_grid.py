"""LU and solve on a 2-D (P_r x P_c) block-cyclic process grid."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.linalg as sl
from shardkit.inspection import hlo
from shardkit.inspection.audit import collectives_of
from shardkit.inspection.hlo import collective_counts

GRID = ("x", "y")


def make_mesh(shape, axis_type):
    return jax.make_mesh(shape, GRID, axis_types=(axis_type,) * 2)


def relres(a, x, b):
    a, x, b = (np.asarray(v, np.float64) for v in (a, x, b))
    r = np.linalg.norm(a @ x - b)
    return r / (np.linalg.norm(a, 2) * np.linalg.norm(x) + np.linalg.norm(b))


@pytest.mark.parametrize("shape,axis_type", [((2, 4), AxisType.Auto), ((4, 2), AxisType.Explicit)])
def test_grid_lu_matches_lapack_and_solves(shape, axis_type):
    mesh = make_mesh(shape, axis_type)
    a = jax.random.normal(jax.random.key(0), (64, 64))
    b = jax.random.normal(jax.random.key(1), (64, 2))
    a = jax.device_put(a, NamedSharding(mesh, P(GRID, None)))
    f = sl.lu(a, block_size=4, grid=GRID)
    assert f.lu.sharding.spec == P("x", "y")  # 2-D block-cyclic storage
    assert int(f.info) == 0
    perm, lower, upper = f.unpack()
    _, _, perm_ref = jax.lax.linalg.lu(jnp.asarray(np.asarray(a)))
    np.testing.assert_array_equal(perm, perm_ref)  # the same pivots as LAPACK getrf
    np.testing.assert_allclose(np.asarray(a)[np.asarray(perm)], lower @ upper, atol=2e-5)
    x = sl.lu_solve(f, b)
    ref = jnp.linalg.solve(np.asarray(a), np.asarray(b))
    assert relres(a, x, b) <= 2 * max(relres(a, ref, b), 1.2e-7)
    np.testing.assert_allclose(sl.solve(a, b, block_size=4, grid=GRID), x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_grid_solve_needs_pivoting(dtype):
    with jax.enable_x64(True):
        dt = jnp.dtype(dtype)
        mesh = make_mesh((2, 4), AxisType.Explicit)
        rng = np.random.default_rng(0)
        h = 32
        a = np.zeros((64, 64))  # [[0, B], [C, 0]]: no-pivot LU divides by zero at once
        a[:h, h:] = rng.standard_normal((h, h)) + 4 * np.eye(h)
        a[h:, :h] = rng.standard_normal((h, h)) + 4 * np.eye(h)
        a[0, 0] = 1e-30
        a, b = jnp.asarray(a, dt), jnp.asarray(rng.standard_normal(64), dt)
        x = sl.solve(a, b, mesh=mesh, block_size=4, grid=GRID)
        assert x.dtype == dt
        ref = jnp.linalg.solve(a, b)
        eps = float(jnp.finfo(dt).eps)
        assert relres(a, x, b) <= 2 * max(relres(a, ref, b), eps)
        assert relres(a, x, b) < 20 * eps


def _collectives(text, mesh):
    """(kind, element count, replica-group size) of each collective, read by shardkit's HLO
    reader (every version's replica-group spelling)."""
    module = hlo.parse_hlo(text)
    out = []
    for c in collectives_of(module, tuple(mesh.axis_names), tuple(mesh.axis_sizes)):
        size = sum(math.prod(a.dims) for s in c.result_shapes for a in hlo.parse_shape(s))
        out.append((c.kind, size, c.group_size))
    return out


def test_grid_compiled_collectives_move_pieces_not_panels():
    mesh = make_mesh((2, 4), AxisType.Explicit)
    n, nb = 256, 8
    a = jax.ShapeDtypeStruct((n, n), jnp.float32, sharding=NamedSharding(mesh, P(GRID, None)))
    b = jax.ShapeDtypeStruct((n,), jnp.float32, sharding=NamedSharding(mesh, P()))
    compiled = (
        jax.jit(lambda a, b: sl.solve(a, b, mesh=mesh, block_size=nb, grid=GRID))
        .lower(a, b)
        .compile()
    )
    text = compiled.as_text()
    assert collective_counts(text)["all-gather"] == 0
    colls = _collectives(text, mesh)
    big = [c for c in colls if c[0] == "all-reduce" and c[1] > n]
    # The factorization's large messages: the L panel along a process row (at most N/P_r x nb
    # over the 4 devices of the row) and swapped rows / U12 down a process column (2 nb x
    # N/P_c and at most nb x N/P_c over its 2 devices): never a full N x nb panel. The loop
    # runs in stages with shrinking windows, so the panel and U12 messages come in sizes.
    for full in [("all-reduce", n // 2 * nb, 4), ("all-reduce", 2 * nb * n // 4, 2),
                 ("all-reduce", nb * n // 4, 2)]:  # fmt: skip
        assert full in big, (full, big)
    assert all(s <= (n // 2 * nb if g == 4 else 2 * nb * n // 4) for _, s, g in big), big
    assert {g for _, _, g in big} == {2, 4}
    assert all(size <= n * nb for _, size, _ in colls)


def test_grid_memory_at_n2048_compile_only():
    mesh = make_mesh((2, 4), AxisType.Explicit)
    n = 2048
    a = jax.ShapeDtypeStruct((n, n), jnp.float32, sharding=NamedSharding(mesh, P(GRID, None)))
    b = jax.ShapeDtypeStruct((n,), jnp.float32, sharding=NamedSharding(mesh, P()))
    compiled = jax.jit(lambda a, b: sl.solve(a, b, mesh=mesh, grid=GRID)).lower(a, b).compile()
    local = n * n * 4 / 8
    assert compiled.memory_analysis().temp_size_in_bytes <= 3.0 * local


def test_grid_singular_and_bad_grid():
    mesh = make_mesh((2, 4), AxisType.Explicit)
    a = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    a[:, 5] = 0.0
    f = sl.lu(jnp.asarray(a), mesh=mesh, block_size=4, grid=GRID)
    assert int(f.info) == 6
    with pytest.raises(sl.SingularMatrixError, match=r"U\[5, 5\] is exactly zero"):
        sl.solve(jnp.asarray(a), jnp.ones(64), mesh=mesh, block_size=4, grid=GRID)
    with pytest.raises(ValueError, match="grid: mesh axis 'z' is not in the mesh"):
        sl.solve(jnp.asarray(a), jnp.ones(64), mesh=mesh, grid=("x", "z"))
    with pytest.raises(ValueError, match="grid: expected two different mesh axis names"):
        sl.lu(jnp.asarray(a), mesh=mesh, grid=("x", "x"))


def test_grid_slogdet_matches_single_device():
    mesh = make_mesh((2, 4), AxisType.Auto)  # the LU program compiled above is reused
    for seed in range(2):
        a = jnp.asarray(np.random.default_rng(seed).standard_normal((64, 64)), jnp.float32)
        sign, logdet = sl.slogdet(a, mesh=mesh, block_size=4, grid=GRID)
        s_ref, l_ref = jnp.linalg.slogdet(a)
        assert float(sign) == float(s_ref)
        np.testing.assert_allclose(logdet, l_ref, rtol=1e-5)
        # det takes grid= as slogdet does (it raised TypeError)
        d = sl.det(a / 2, mesh=mesh, block_size=4, grid=GRID)
        np.testing.assert_allclose(d, jnp.linalg.det(a / 2), rtol=1e-4)


def test_block_cyclic_2d_layout_round_trip(axis_type):
    mesh = make_mesh((4, 2), axis_type)
    a = jnp.arange(128.0 * 128).reshape(128, 128)
    a = jax.device_put(a, NamedSharding(mesh, P(GRID, None)))
    s = sl.to_block_cyclic_2d(a, block_size=4, grid=GRID)
    rows, cols = sl.block_cyclic_2d_orders(128, 4, 4, 2)
    assert rows[:8].tolist() == [0, 1, 2, 3, 16, 17, 18, 19]  # process row 0: blocks 0, 4, ..
    assert cols[:8].tolist() == [0, 1, 2, 3, 8, 9, 10, 11]  # process column 0: blocks 0, 2, ..
    np.testing.assert_array_equal(s, np.asarray(a)[np.ix_(rows, cols)])
    assert s.sharding.spec == P("x", "y")
    np.testing.assert_array_equal(sl.from_block_cyclic_2d(s, block_size=4, grid=GRID), a)
    hlo = (
        jax.jit(lambda a: sl.to_block_cyclic_2d(a, block_size=4, grid=GRID, mesh=mesh))
        .lower(a)
        .compile()
        .as_text()
    )
    counts = collective_counts(hlo)
    assert counts["all-to-all"] == 1 and counts["all-gather"] == 0
    with pytest.raises(ValueError, match=r"a: size 64 is not a multiple of block_size \* P \* P_r"):
        sl.to_block_cyclic_2d(jnp.ones((64, 64)), block_size=4, grid=GRID, mesh=mesh)
