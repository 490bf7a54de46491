"""Distributed LU, lu_solve and solve: accuracy against one device, layout, HLO, memory, errors."""

import importlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.linalg as sl
from shardkit.inspection.hlo import collective_counts

solve_mod = importlib.import_module("shardkit.linalg.solve")
MESHES = {"1d": ((8,), ("x",)), "2d": ((2, 4), ("x", "y"))}


def make_mesh(kind, axis_type):
    shape, names = MESHES[kind]
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape))


def relres(a, x, b):
    """||Ax - b|| / (||A|| ||x|| + ||b||) in float64 on the host (2-norms)."""
    a, x, b = (np.asarray(v, np.float64) for v in (a, x, b))
    r = np.linalg.norm(a @ x - b)
    return r / (np.linalg.norm(a, 2) * np.linalg.norm(x) + np.linalg.norm(b))


def check_vs_reference(a, b, x, dtype):
    """Asserts the residual is within 2x of single-device jnp.linalg.solve (floor: eps)."""
    ref = jnp.linalg.solve(jnp.asarray(np.asarray(a)), jnp.asarray(np.asarray(b)))
    r_ref, r = relres(a, ref, b), relres(a, x, b)
    eps = float(jnp.finfo(dtype).eps)
    assert r <= 2 * max(r_ref, eps), (r, r_ref)
    return r, r_ref


def random_system(n, dtype, seed=0, k=None):
    ka, kb = jax.random.split(jax.random.key(seed))
    a = jax.random.normal(ka, (n, n), dtype)
    b = jax.random.normal(kb, (n,) if k is None else (n, k), dtype)
    return a, b


@pytest.mark.parametrize("kind", ["1d", "2d"])
def test_solve_random_matches_single_device(kind, axis_type):
    mesh = make_mesh(kind, axis_type)
    axes = MESHES[kind][1]
    a, b = random_system(128, jnp.float32)
    a = jax.device_put(a, NamedSharding(mesh, P(axes, None)))
    x = sl.solve(a, b, block_size=8)
    assert x.shape == (128,)
    assert x.sharding.is_fully_replicated
    check_vs_reference(a, b, x, jnp.float32)


def test_lu_factors_reconstruct_and_layout():
    mesh = make_mesh("1d", AxisType.Explicit)  # lu on Auto axes runs inside every Auto solve
    a, _ = random_system(64, jnp.float32, seed=3)
    f = sl.lu(jax.device_put(a, NamedSharding(mesh, P("x", None))), block_size=4)
    assert f.lu.sharding.spec == P(None, ("x",))
    assert f.lu.addressable_shards[0].data.shape == (64, 8)  # N x N/P per device
    assert int(f.info) == 0
    perm, lower, upper = f.unpack()
    np.testing.assert_allclose(np.asarray(a)[np.asarray(perm)], lower @ upper, atol=2e-5)
    # Partial pivoting: every multiplier is at most 1 in magnitude.
    assert float(jnp.abs(lower).max()) <= 1.0 + 1e-6
    # Same pivots as LAPACK getrf on one device.
    _, _, perm_ref = jax.lax.linalg.lu(jnp.asarray(np.asarray(a)))
    np.testing.assert_array_equal(perm, perm_ref)


def _pivot_matrices(n):
    rng = np.random.default_rng(0)
    zero_lead = rng.standard_normal((n, n))
    zero_lead[0, 0] = 0.0
    tiny_lead = rng.standard_normal((n, n))
    tiny_lead[np.arange(n), np.arange(n)] = 1e-20
    perm_identity = np.eye(n)[rng.permutation(n)]
    # [[0, B], [C, 0]]: every leading principal minor of the first half is singular, so LU
    # without pivoting divides by zero at the first step.
    h = n // 2
    block = np.zeros((n, n))
    block[:h, h:] = rng.standard_normal((h, h)) + 4 * np.eye(h)
    block[h:, :h] = rng.standard_normal((h, h)) + 4 * np.eye(h)
    return {"zero_lead": zero_lead, "tiny_lead": tiny_lead, "perm_identity": perm_identity,
            "block_antidiag": block}  # fmt: skip


@pytest.mark.parametrize("name", ["zero_lead", "tiny_lead", "perm_identity", "block_antidiag"])
def test_solve_matrices_that_need_pivoting(name, axis_type):
    mesh = make_mesh("1d", axis_type)
    a = jnp.asarray(_pivot_matrices(96)[name], jnp.float32)  # sharded, padded to 128
    b = jnp.arange(96, dtype=jnp.float32) / 96
    x = sl.solve(jax.device_put(a, NamedSharding(mesh, P("x", None))), b, block_size=8)
    r, r_ref = check_vs_reference(a, b, x, jnp.float32)
    assert r < 1e-5, (name, r, r_ref)


def _ill_conditioned(n, cond, dtype, seed=0):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((n, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    s = np.logspace(0, -np.log10(cond), n)
    return jnp.asarray((u * s) @ v.T, dtype)


@pytest.mark.parametrize(
    "dtype,cond,kind",
    [("float32", 1e5, AxisType.Explicit), ("float64", 1e12, AxisType.Auto)],
)
def test_solve_ill_conditioned_float32_float64(dtype, cond, kind):
    with jax.enable_x64(True):
        dt = jnp.dtype(dtype)
        mesh = make_mesh("2d", kind)
        a = _ill_conditioned(96, cond, dt)
        b = jnp.asarray(np.random.default_rng(1).standard_normal(96), dt)
        measured = np.linalg.cond(np.asarray(a, np.float64))
        assert measured > cond / 10, measured  # the matrix really is ill-conditioned
        x = sl.solve(jax.device_put(a, NamedSharding(mesh, P(("x", "y"), None))), b, block_size=4)
        assert x.dtype == dt
        r, r_ref = check_vs_reference(a, b, x, dt)
        assert r < 50 * float(jnp.finfo(dt).eps), (f"cond={measured:.1e}", r, r_ref)


@pytest.mark.parametrize("n,nb", [(100, 8), (72, 32)])
def test_solve_sizes_not_multiple_of_block_are_padded(n, nb):
    mesh = make_mesh("1d", AxisType.Explicit)
    a, b = random_system(n, jnp.float32, seed=n)
    x = sl.solve(a, b, mesh=mesh, block_size=nb)  # a replicated: N need not divide P
    assert x.shape == (n,)
    check_vs_reference(a, b, x, jnp.float32)


def test_solve_many_rhs_sharded_b_and_lu_solve_reuse():
    mesh = make_mesh("2d", AxisType.Explicit)
    a, b = random_system(128, jnp.float32, seed=7, k=5)
    a = jax.device_put(a, NamedSharding(mesh, P(("x", "y"), None)))
    b = jax.device_put(b, NamedSharding(mesh, P(("x", "y"), None)))
    x = sl.solve(a, b, block_size=16)
    assert x.shape == (128, 5)
    check_vs_reference(a, b, x, jnp.float32)
    f = sl.lu(a, block_size=16)
    np.testing.assert_allclose(sl.lu_solve(f, b), x, rtol=1e-5, atol=1e-5)
    b1 = b[:, 0]
    np.testing.assert_allclose(sl.lu_solve(f, b1), x[:, 0], rtol=1e-5, atol=1e-5)


def test_solve_second_call_does_not_recompile():
    mesh = make_mesh("1d", AxisType.Explicit)
    a, b = random_system(64, jnp.float32, seed=11)
    sl.solve(a, b, mesh=mesh, block_size=8)
    size = solve_mod._solve_jit._cache_size()
    sl.solve(a + 1.0, b, mesh=mesh, block_size=8)
    assert solve_mod._solve_jit._cache_size() == size


def _collective_sizes(hlo):
    """Element counts of each collective's result (tuples summed)."""
    sizes = []
    kinds = "all-reduce|all-gather|all-to-all|collective-permute|reduce-scatter"
    for line in hlo.splitlines():
        m = re.search(r"=\s*(\(.*?\)|\S+)\s+(" + kinds + r")(-start)?\(", line)
        if m:
            dims = re.findall(r"\[([\d,]*)\]", m.group(1))
            sizes.append((m.group(2), sum(int(np.prod([int(d) for d in s.split(",") if d]))
                                          for s in dims)))  # fmt: skip
    return sizes


@pytest.mark.parametrize("kind,axis_type", [("1d", AxisType.Explicit), ("2d", AxisType.Auto)])
def test_compiled_solve_has_no_all_gather_and_small_collectives(kind, axis_type):
    mesh = make_mesh(kind, axis_type)
    axes = MESHES[kind][1]
    n, nb = 256, 16
    a = jax.ShapeDtypeStruct((n, n), jnp.float32, sharding=NamedSharding(mesh, P(axes, None)))
    b = jax.ShapeDtypeStruct((n,), jnp.float32, sharding=NamedSharding(mesh, P()))
    f = jax.jit(lambda a, b: sl.solve(a, b, block_size=nb, mesh=mesh))
    hlo = f.lower(a, b).compile().as_text()
    counts = collective_counts(hlo)
    assert counts["all-gather"] == 0
    assert counts["all-to-all"] == 1  # entering the layout, once per block column (in a loop)
    assert counts["all-reduce"] >= 3  # panel broadcasts and the substitutions
    sizes = _collective_sizes(hlo)  # at most a panel with L11^-1 and 3 index rows
    assert sizes and all(s <= max((n + nb + 3) * nb, n) for _, s in sizes), sizes


def _branch_computations(hlo):
    """Names of the computations that are branches of a ``conditional``."""
    return {name for group in re.findall(r"branch_computations=\{([^}]*)\}", hlo)
            for name in re.findall(r"%([\w.\-]+)", group)}  # fmt: skip


def _computations_calling(hlo, target):
    """Names of the computations whose body calls the custom call ``target``."""
    names, current = set(), None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%([\w.\-]+) ", line)
        if head:
            current = head.group(1)
        elif f'custom_call_target="{target}' in line:
            names.add(current)
    return names


@pytest.mark.parametrize(
    "kernel,targets",
    [
        (lambda a, b, mesh: sl.solve(a, b, mesh=mesh), ("lapack_sgetrf", "lapack_strsm")),
        (lambda a, b, mesh: sl.cho_solve(sl.cholesky(a, mesh=mesh, check=False), b, check=False),
         ("lapack_spotrf", "lapack_strsm")),
    ],
    ids=["lu", "cholesky"],
)  # fmt: skip
def test_only_the_panel_owner_calls_lapack(kernel, targets):
    """One LAPACK call per step, not one per device: on CPU eight concurrent calls fought over
    the BLAS threads (a 2048 x 64 LU panel took 28 ms instead of 1 ms; Cholesky at N = 2048 was
    27x one device). Every getrf/potrf/trsm must sit in a branch of a conditional, so the
    other devices skip it."""
    mesh = make_mesh("1d", AxisType.Explicit)
    n = 256
    a = jax.ShapeDtypeStruct((n, n), jnp.float32, sharding=NamedSharding(mesh, P("x", None)))
    b = jax.ShapeDtypeStruct((n,), jnp.float32, sharding=NamedSharding(mesh, P()))
    hlo = jax.jit(lambda a, b: kernel(a, b, mesh)).lower(a, b).compile().as_text()
    branches = _branch_computations(hlo)
    for target in targets:
        callers = _computations_calling(hlo, target)
        assert callers, f"no {target} call found"
        assert callers <= branches, (target, callers - branches)


def test_per_device_memory_at_n2048_compile_only():
    mesh = make_mesh("1d", AxisType.Explicit)
    n = 2048
    a = jax.ShapeDtypeStruct((n, n), jnp.float32, sharding=NamedSharding(mesh, P("x", None)))
    b = jax.ShapeDtypeStruct((n,), jnp.float32, sharding=NamedSharding(mesh, P()))
    compiled = jax.jit(lambda a, b: sl.solve(a, b, mesh=mesh)).lower(a, b).compile()
    local = n * n * 4 / 8  # bytes of one device's shard of A
    mem = compiled.memory_analysis()
    assert mem.argument_size_in_bytes <= 1.01 * local + 4 * n
    assert mem.temp_size_in_bytes <= 3.0 * local, mem.temp_size_in_bytes / local
    assert collective_counts(compiled.as_text())["all-gather"] == 0


def test_singular_matrix_raises_and_reports_info():
    mesh = make_mesh("1d", AxisType.Explicit)
    a = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    a[:, 10] = 0.0  # a zero column: U[10, 10] == 0 exactly
    with pytest.raises(sl.SingularMatrixError, match=r"singular: U\[10, 10\] is exactly zero"):
        sl.solve(jnp.asarray(a), jnp.ones(64), mesh=mesh, block_size=8)
    f = sl.lu(jnp.asarray(a), mesh=mesh, block_size=8)
    assert int(f.info) == 11
    with pytest.raises(sl.SingularMatrixError, match="info=11"):
        sl.lu_solve(f, jnp.ones(64))
    # Inside jit nothing can raise: info is returned instead.
    x, info = jax.jit(lambda a: sl.solve(a, jnp.ones(64), mesh=mesh, block_size=8,
                                         return_info=True))(jnp.asarray(a))  # fmt: skip
    assert int(info) == 11
    zero_row = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    zero_row[40] = 0.0  # stays zero under elimination: the last pivot is exactly zero
    with pytest.raises(sl.SingularMatrixError, match=r"U\[63, 63\] is exactly zero"):
        sl.solve(jnp.asarray(zero_row), jnp.ones(64), mesh=mesh, block_size=8)
    nan = np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32)
    nan[5, 7] = np.nan
    with pytest.raises(sl.SingularMatrixError, match="solution .* is not finite"):
        sl.solve(jnp.asarray(nan), jnp.ones(64), mesh=mesh, block_size=8)


def test_bad_inputs_raise_clear_errors():
    mesh = make_mesh("1d", AxisType.Explicit)
    a, b = random_system(64, jnp.float32)
    with pytest.raises(ValueError, match=r"a: expected a square matrix \(N, N\), got shape"):
        sl.solve(a[:, :32], b, mesh=mesh)
    with pytest.raises(ValueError, match=r"b: expected shape \(64,\) or \(64, k\)"):
        sl.solve(a, b[:10], mesh=mesh)
    with pytest.raises(ValueError, match="block_size: 128 is larger than the matrix size"):
        sl.lu(a, mesh=mesh, block_size=128)
    with pytest.raises(ValueError, match="block_size: must be a positive int"):
        sl.lu(a, mesh=mesh, block_size=0)
    with pytest.raises(TypeError, match="a: expected a floating or complex dtype"):
        sl.lu(jnp.ones((64, 64), jnp.int32), mesh=mesh)
    with pytest.raises(ValueError, match="a: no mesh found"):
        sl.solve(np.asarray(a), b)
    with pytest.raises(ValueError, match="axis_names: mesh axis 'z' is not in the mesh"):
        sl.solve(a, b, mesh=mesh, axis_names="z")


@pytest.mark.parametrize(
    "shape,dtype,kind",
    [
        ((40, 24), np.float64, "1d"),
        ((24, 40), np.float32, "1d"),
        ((37, 5), np.complex128, "1d"),
        ((6, 50), np.complex64, "1d"),
        ((40, 24), np.float64, "2d-grid"),
        ((9, 30), np.float32, "2d-grid"),
    ],
)
def test_non_square_lu_equals_scipy(shape, dtype, kind, axis_type):
    """An M x N matrix (tall or wide): scipy.linalg.lu's P, L (M, K), U (K, N), K = min(M, N)."""
    mesh = make_mesh("2d" if kind == "2d-grid" else kind, axis_type)
    grid = ("x", "y") if kind == "2d-grid" else None
    rng = np.random.default_rng(sum(shape))
    a = rng.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        a = a + 1j * rng.standard_normal(shape)
    a = a.astype(dtype)
    with jax.enable_x64(dtype in (np.float64, np.complex128)):
        arr = jnp.asarray(a)
        if shape[0] % 8 == 0:  # row-sharded when it divides, like a user's matrix
            arr = jax.device_put(a, NamedSharding(mesh, P(mesh.axis_names, None)))
        f = sl.lu(arr, mesh=mesh, grid=grid, block_size=4 if grid else None)
        perm, lower, upper = (np.asarray(v) for v in f.unpack())
        p_ref, l_ref, u_ref = scipy.linalg.lu(a)
        k = min(shape)
        assert lower.shape == (shape[0], k) and upper.shape == (k, shape[1])
        tol = 1e-4 if dtype in (np.float32, np.complex64) else 1e-10
        np.testing.assert_allclose(a[perm], lower @ upper, atol=tol * np.abs(a).max())
        np.testing.assert_array_equal(perm, np.argmax(p_ref, axis=0))  # the same pivots
        np.testing.assert_allclose(lower, l_ref, atol=tol)
        np.testing.assert_allclose(upper, u_ref, atol=tol * np.abs(a).max())
        assert int(f.info) == 0
        with pytest.raises(
            ValueError, match=rf"factors: lu_solve needs .* a \({shape[0]}, {shape[1]}\) matrix"
        ):
            sl.lu_solve(f, jnp.ones(shape[0], dtype))


def test_non_square_lu_reports_its_own_zero_pivots_only():
    mesh = make_mesh("1d", AxisType.Explicit)
    tall = np.ones((16, 4), np.float32)  # rank 1: U[1, 1] is exactly zero
    assert int(sl.lu(jnp.asarray(tall), mesh=mesh).info) == 2
    wide = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    assert int(sl.lu(jnp.asarray(wide), mesh=mesh).info) == 0  # not the padding's zero rows
    with pytest.raises(ValueError, match=r"a: expected a matrix \(M, N\), got shape \(2, 3, 4\)"):
        sl.lu(jnp.ones((2, 3, 4)), mesh=mesh)


@pytest.mark.parametrize("n", [1, 3, 5, 16, 31])
def test_small_matrices_work_with_the_default_block_size(n):
    # the default panel width (32) is capped at N: any N works without choosing one
    mesh = make_mesh("1d", AxisType.Explicit)
    rng = np.random.default_rng(n)
    a = rng.normal(size=(n, n)).astype(np.float32) + n * np.eye(n, dtype=np.float32)
    b = rng.normal(size=n).astype(np.float32)
    x = sl.solve(jnp.asarray(a), jnp.asarray(b), mesh=mesh)
    check_vs_reference(a, b, x, jnp.float32)
    sign, logdet = np.linalg.slogdet(a.astype(np.float64))
    got_sign, got_logdet = sl.slogdet(jnp.asarray(a), mesh=mesh)
    assert float(got_sign) == sign and float(got_logdet) == pytest.approx(logdet, rel=1e-5)
    upper = np.triu(a)
    t = sl.triangular_solve(jnp.asarray(upper), jnp.asarray(b), lower=False, mesh=mesh)
    check_vs_reference(upper, b, t, jnp.float32)
    spd = a @ a.T + n * np.eye(n, dtype=np.float32)
    c = sl.cho_solve(sl.cholesky(jnp.asarray(spd), mesh=mesh), jnp.asarray(b))
    check_vs_reference(spd, b, c, jnp.float32)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_det_of_a_matrix_with_non_finite_entries_raises(bad):
    mesh = make_mesh("1d", AxisType.Explicit)
    a = np.eye(64, dtype=np.float32)
    a[3, 5] = bad
    for fn in (sl.det, sl.slogdet):
        with pytest.raises(ValueError, match=rf"holds {bad} at \[3, 5\].*fix"):
            fn(jnp.asarray(a), mesh=mesh)
    # inside jit nothing can raise: a non-finite result, as jnp.linalg.slogdet gives
    _, logdet = jax.jit(lambda m: sl.slogdet(m, mesh=mesh))(jnp.asarray(a))
    assert not np.isfinite(float(logdet))
