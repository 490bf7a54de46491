"""`shardkit.linalg` at its user boundary, as a user or a peer's test suite (numpy.linalg,
scipy.linalg) calls it: arrays committed to one device or to another mesh, factors of the wrong
kind (scipy's tuples), non-bool flags, half precision, array-likes, and the options of `cg`,
`padded_size` and `grid=`. Numbers are checked against numpy on one device (float32: relative
1e-4)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg as spl
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.linalg as sl

N = 16  # a multiple of every mesh axis size below, so arrays can be placed row-sharded
RTOL = 1e-4


def _system(seed=0):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((N, N)) + N * np.eye(N)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    return a, b


def _meshes(axis_type):
    """The 8-device mesh, and a 4-device mesh on the other half of the devices."""
    mesh = jax.make_mesh((8,), ("x",), axis_types=(axis_type,))
    other = jax.make_mesh((4,), ("y",), axis_types=(axis_type,), devices=jax.devices()[4:])
    return mesh, other


def _close(x, ref):
    np.testing.assert_allclose(np.asarray(x), ref, rtol=RTOL, atol=RTOL * np.abs(ref).max())


# -- arrays committed to devices other than the mesh's -----------------------------------------


@pytest.mark.parametrize("where", ["device 3", "other mesh"])
def test_committed_inputs_off_the_mesh_are_solved_on_it(axis_type, where):
    mesh, other = _meshes(axis_type)
    a, b = _system()
    spd = a @ a.T

    def off(x):  # committed where the mesh is not (wholly)
        if where == "device 3":
            return jax.device_put(x, jax.devices()[3])
        return jax.device_put(x, NamedSharding(other, P("y", *(None,) * (x.ndim - 1))))

    _close(sl.solve(off(a), b, mesh=mesh), np.linalg.solve(a, b))
    _close(sl.solve(a, off(b), mesh=mesh), np.linalg.solve(a, b))
    _close(sl.lu_solve(sl.lu(off(a), mesh=mesh), off(b)), np.linalg.solve(a, b))
    _close(sl.det(off(a), mesh=mesh), np.linalg.det(a.astype(np.float64)))
    _close(sl.cho_solve(sl.cholesky(off(spd), mesh=mesh), off(b)), np.linalg.solve(spd, b))
    x = sl.triangular_solve(off(np.tril(a)), off(b), lower=True, mesh=mesh)
    _close(x, spl.solve_triangular(np.tril(a), b, lower=True))
    x, info = sl.cg(off(spd), off(b), x0=off(np.zeros(N, np.float32)), mesh=mesh, tol=1e-7)
    assert bool(info.converged)
    _close(x, np.linalg.solve(spd, b))
    stack, rhs = np.stack([a] * 8), np.stack([b] * 8)
    _close(
        sl.batched_solve(off(stack), off(rhs), mesh=mesh),
        np.linalg.solve(stack, rhs[..., None])[..., 0],
    )
    _close(sl.batched_det(off(stack), mesh=mesh), np.linalg.det(stack.astype(np.float64)))


def test_a_row_sharded_array_from_another_mesh_is_moved_once():
    mesh, other = _meshes(jax.sharding.AxisType.Explicit)
    a, b = _system(1)
    x = sl.solve(jax.device_put(a, NamedSharding(other, P("y", None))), b, mesh=mesh)
    _close(x, np.linalg.solve(a, b))
    assert x.sharding.mesh.devices.size == 8  # the solution lives on the mesh passed


# -- factors of the wrong kind -----------------------------------------------------------------


def test_scipy_style_factors_are_refused_with_the_fix(axis_type):
    mesh, _ = _meshes(axis_type)
    a, b = _system(2)
    lu_piv = spl.lu_factor(a)  # scipy's (lu, piv) tuple
    with pytest.raises(TypeError, match=r"factors: expected the LUFactors of shardkit\.linalg\.lu"
                                        r", got tuple.*Fix: .*lu_solve\(lu\(a\), b\)"):  # fmt: skip
        sl.lu_solve(lu_piv, b)
    with pytest.raises(TypeError, match=r"factors: expected the LUFactors.*got ndarray"):
        sl.lu_solve(a, b)
    cho = r"factors: expected the CholeskyFactors of shardkit\.linalg\.cholesky, got tuple"
    with pytest.raises(TypeError, match=cho + r".*cho_solve\(cholesky"):
        sl.cho_solve(spl.cho_factor(a @ a.T), b)
    with pytest.raises(TypeError, match=r"factors: expected the CholeskyFactors.*got LUFactors"):
        sl.cho_solve(sl.lu(a, mesh=mesh), b)


# -- flags must be bools -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda a, b, m: sl.triangular_solve(a, b, lower="upper", mesh=m),
        lambda a, b, m: sl.triangular_solve(a, b, lower=True, transpose="N", mesh=m),
        lambda a, b, m: sl.triangular_solve(a, b, lower=True, unit_diagonal=None, mesh=m),
        lambda a, b, m: sl.solve(a, b, transpose="T", mesh=m),
        lambda a, b, m: sl.lu_solve(sl.lu(a, mesh=m), b, transpose=1),
    ],
    ids=["lower", "tri-transpose", "unit_diagonal", "solve-transpose", "lu_solve-transpose"],
)
def test_non_bool_flags_are_refused_not_read_as_truthy(call):
    """scipy's `trans='N'` means no transpose; read as truthy it would solve with A^T."""
    a, b = _system(3)
    mesh, _ = _meshes(jax.sharding.AxisType.Explicit)
    with pytest.raises(TypeError, match=r"(lower|transpose|unit_diagonal): expected True or "
                                        r"False, got .*Fix: pass"):  # fmt: skip
        call(np.tril(a), b, mesh)


def test_numpy_bools_are_flags():
    a, b = _system(4)
    mesh, _ = _meshes(jax.sharding.AxisType.Explicit)
    x = sl.triangular_solve(np.tril(a), b, lower=np.bool_(True), transpose=np.bool_(True),
                            mesh=mesh)  # fmt: skip
    _close(x, spl.solve_triangular(np.tril(a), b, lower=True, trans=1))


# -- dtypes and array-likes --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_is_refused_as_numpy_does(dtype):
    """numpy.linalg raises TypeError for float16; JAX's LAPACK calls raise a TypeError that
    names no argument (and triangular_solve ran in float16)."""
    mesh, _ = _meshes(jax.sharding.AxisType.Explicit)
    a, b = (jnp.asarray(x, dtype) for x in _system(5))
    match = r"a: expected a floating or complex dtype .*got (float16|bfloat16).*astype"
    for call in (
        lambda: sl.solve(a, b, mesh=mesh),
        lambda: sl.lu(a, mesh=mesh),
        lambda: sl.det(a, mesh=mesh),
        lambda: sl.cholesky(a, mesh=mesh),
        lambda: sl.triangular_solve(a, b, lower=True, mesh=mesh),
    ):
        with pytest.raises(TypeError, match=match):
            call()
    with pytest.raises(TypeError, match="a_stack: expected a floating .*astype"):
        sl.batched_solve(jnp.stack([a] * 8), jnp.stack([b] * 8), mesh=mesh)
    with pytest.raises(TypeError, match="a_stack: expected a floating .*astype"):
        sl.batched_lu(jnp.stack([a] * 8), mesh=mesh)


def test_python_lists_are_named_with_their_type_not_shape_zero():
    mesh, _ = _meshes(jax.sharding.AxisType.Explicit)
    a, b = _system(6)
    with pytest.raises(TypeError, match=r"a: expected an array, got list.*jnp\.asarray\(a\)"):
        sl.solve(a.tolist(), b, mesh=mesh)
    with pytest.raises(TypeError, match=r"b: expected an array, got list.*jnp\.asarray\(b\)"):
        sl.solve(a, b.tolist(), mesh=mesh)
    with pytest.raises(TypeError, match=r"a: expected an array, got list"):
        sl.cg((a @ a.T).tolist(), b, mesh=mesh)


# -- options -----------------------------------------------------------------------------------


def test_cg_names_an_initial_guess_of_the_wrong_shape():
    mesh, _ = _meshes(jax.sharding.AxisType.Explicit)
    a, b = _system(7)
    with pytest.raises(ValueError, match=r"x0: expected shape \(16,\) to match b \(16,\), got "
                                         r"\(3,\).*Fix"):  # fmt: skip
        sl.cg(a @ a.T, b, x0=np.zeros(3, np.float32), mesh=mesh)


def test_a_mesh_that_is_not_a_mesh_is_named():
    a, b = _system(8)
    with pytest.raises(TypeError, match=r"mesh: expected a jax\.sharding\.Mesh, got str.*"
                                        r"jax\.make_mesh"):  # fmt: skip
        sl.solve(a, b, mesh="x")


def test_grid_on_a_one_axis_mesh_proposes_a_two_axis_mesh():
    mesh, _ = _meshes(jax.sharding.AxisType.Explicit)
    a, b = _system(9)
    with pytest.raises(ValueError, match=r"grid: .* mesh \{'x': 8\} has 1 axis.*"
                                         r"jax\.make_mesh\(\(2, 4\)") as err:  # fmt: skip
        sl.solve(a, b, mesh=mesh, grid=("x", "x"))
    assert "grid=('x',)" not in str(err.value)  # not a one-axis grid, itself refused


@pytest.mark.parametrize("block_size", [0, -2])
def test_padded_size_names_a_bad_block_size(block_size):
    with pytest.raises(ValueError, match=r"block_size: must be a positive int"):
        sl.padded_size(10, block_size, 2)


def test_batched_solve_with_no_right_hand_side_columns(axis_type):
    mesh, _ = _meshes(axis_type)
    a, _ = _system(10)
    x = sl.batched_solve(np.stack([a] * 8), np.zeros((8, N, 0), np.float32), mesh=mesh)
    assert x.shape == (8, N, 0)


def test_cg_takes_the_mesh_of_b_when_a_is_not_placed(axis_type):
    """cg's docstring: the mesh defaults to a.sharding.mesh / b.sharding.mesh."""
    mesh, _ = _meshes(axis_type)
    a, b = _system(11)
    spd = a @ a.T
    x, info = sl.cg(spd, jax.device_put(b, NamedSharding(mesh, P("x"))), tol=1e-7)
    assert bool(info.converged)
    assert x.sharding.mesh.shape == mesh.shape
    _close(x, np.linalg.solve(spd, b))


def test_a_non_finite_right_hand_side_is_named_not_the_matrix(axis_type):
    """A finite, well-conditioned matrix with inf in b: the error names b and its row (it named
    `a`, "singular to working precision or holds inf/NaN")."""
    mesh, _ = _meshes(axis_type)
    a, b = _system(12)
    b[3] = np.inf
    spd = a @ a.T
    match = r"^b: the right-hand side holds inf or NaN \(first in row 3\).*Fix: "
    for call in (
        lambda: sl.solve(a, b, mesh=mesh),
        lambda: sl.lu_solve(sl.lu(a, mesh=mesh), b),
        lambda: sl.cho_solve(sl.cholesky(spd, mesh=mesh), b),
        lambda: sl.triangular_solve(np.tril(a), b, lower=True, mesh=mesh),
    ):
        with pytest.raises(sl.SingularMatrixError, match=match):
            call()
