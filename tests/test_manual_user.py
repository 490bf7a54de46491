"""Placement, pipeline and matmul at the user's boundary: bad spec trees, shardings on another
mesh, inputs not yet placed, empty and non-array operands."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit as sk
from shardkit.linter import (
    DuplicateMeshAxisError,
    IndivisibleShardingError,
    SpecRankError,
    UnknownMeshAxisError,
)
from shardkit.matmul import MatmulLayoutError
from shardkit.pipeline import (
    GPipe,
    OneFOneB,
    gpipe_value_and_grad,
    pipeline_value_and_grad,
    reference_value_and_grad,
)
from shardkit.rules import ShardingRuleError, shard


def _mesh(axis_type, shape=(2, 4), names=("dp", "tp")):
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape))


# --------------------------------------------------------------------------- shard(tree, specs)


@pytest.mark.parametrize(
    "tree, specs, error, match",
    [
        ({"w": jnp.ones((8, 16))}, {"w": P("model")}, UnknownMeshAxisError, r"leaf 'w'.*'model'"),
        ({"w": jnp.ones((6, 16))}, {"w": P("tp")}, IndivisibleShardingError, r"size 6.*'tp'"),
        ({"s": jnp.float32(1.0)}, P("tp"), SpecRankError, r"leaf 's' shape \(\).*fix"),
        ({"w": jnp.ones((8, 16))}, {"w": P("tp", "tp")}, DuplicateMeshAxisError, r"leaf 'w'"),
        (
            {"w": jnp.ones((8, 16)), "v": jnp.ones(4)},
            {"w": P("tp")},
            ShardingRuleError,
            r"shardings tree does not mirror the tree \(.*key sets is \[?'?v'?\]?\); fix",
        ),
    ],
)
def test_shard_spec_errors_name_the_leaf(axis_type, tree, specs, error, match):
    mesh = _mesh(axis_type)
    with pytest.raises(error, match=match):
        shard(tree, specs, mesh)


def test_shard_named_sharding_tree_checked_without_mesh(axis_type):
    mesh = _mesh(axis_type)
    with pytest.raises(IndivisibleShardingError, match=r"leaf 'w' shape \(6, 16\).*\{'dp': 2"):
        shard({"w": jnp.ones((6, 16))}, {"w": NamedSharding(mesh, P("tp"))})


def test_shard_refuses_sharding_on_another_mesh(axis_type):
    mesh = _mesh(axis_type)
    other = jax.make_mesh((8,), ("x",), axis_types=(axis_type,))
    with pytest.raises(ShardingRuleError, match=r"mesh \{'x': 8\}.*mesh= is \{'dp': 2, 'tp': 4\}"):
        shard({"w": jnp.ones((8, 16))}, NamedSharding(other, P("x")), mesh)


def test_shard_prefix_spec_tree_places_every_leaf(axis_type):
    mesh = _mesh(axis_type)
    tree = {"layer": {"w": jnp.arange(32.0).reshape(8, 4), "b": jnp.ones(8)}, "none": None}
    out = shard(tree, {"layer": P("tp"), "none": None}, mesh)
    for name in ("w", "b"):
        assert out["layer"][name].sharding.is_equivalent_to(
            NamedSharding(mesh, P("tp")), tree["layer"][name].ndim
        )
        assert out["layer"][name].addressable_shards[0].data.shape[0] == 2
    np.testing.assert_array_equal(out["layer"]["w"], tree["layer"]["w"])
    assert out["none"] is None


# --------------------------------------------------------------------------- pipeline


def _stage(w, x):
    return jnp.tanh(x @ w["w"] + w["b"])


def _last(lp, y, t):
    return jnp.mean((y @ lp - t) ** 2)


@pytest.mark.parametrize("engine", ["1f1b", "gpipe", "autodiff"])
def test_pipeline_with_a_free_mesh_axis_takes_unplaced_inputs(axis_type, engine):
    """A mesh axis outside stage/data_axes ('tensor') with inputs not yet on the mesh: the
    Explicit mesh raised JAX's "Length of device assignment 1 is not equal to ... 8"."""
    mesh = jax.make_mesh((2, 4), ("stage", "tensor"), axis_types=(axis_type,) * 2)
    k = jax.random.split(jax.random.key(0), 5)
    sp = {"w": jax.random.normal(k[0], (2, 8, 8)) / 3, "b": jax.random.normal(k[1], (2, 8))}
    lp = jax.random.normal(k[2], (8, 2))
    xs, ts = jax.random.normal(k[3], (4, 4, 8)), jax.random.normal(k[4], (4, 4, 2))
    if engine == "autodiff":
        f = gpipe_value_and_grad(_stage, _last, mesh=mesh, microbatches=4)
    else:
        schedule = OneFOneB() if engine == "1f1b" else GPipe()
        f = pipeline_value_and_grad(_stage, _last, mesh=mesh, schedule=schedule, microbatches=4)
    got = jax.jit(f)(sp, lp, xs, ts)
    want = jax.jit(reference_value_and_grad(_stage, _last))(sp, lp, xs, ts)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- matmul


@pytest.mark.parametrize("shape", [(0, 32, 24), (16, 0, 24), (16, 32, 0)])
@pytest.mark.parametrize("algorithm", ["auto", "allgather", "collective", "gspmd"])
def test_matmul_of_empty_operands_is_laid_out_zeros(axis_type, shape, algorithm):
    mesh = jax.make_mesh((8,), ("x",), axis_types=(axis_type,))
    m, k, n = shape
    a = jax.device_put(jnp.ones((m, k)), NamedSharding(mesh, P("x", None)))
    b = jax.device_put(jnp.ones((k, n)), NamedSharding(mesh, P(None, "x")))
    c = sk.matmul(a, b, algorithm=algorithm)
    want = jnp.matmul(jnp.ones((m, k)), jnp.ones((k, n)))
    assert c.shape == want.shape and c.dtype == want.dtype
    if c.size:  # K = 0: zeros (JAX 0.10 cannot read a sharded zero-size array back)
        np.testing.assert_array_equal(np.asarray(c), np.asarray(want))
    method, _ = sk.matmul.compile_matmul(a, b, algorithm=algorithm)
    assert c.sharding.is_equivalent_to(NamedSharding(mesh, P(*method.out_spec)), 2)


def test_matmul_refuses_a_list_operand(axis_type):
    mesh = jax.make_mesh((8,), ("x",), axis_types=(axis_type,))
    a = jax.device_put(jnp.ones((16, 32)), NamedSharding(mesh, P("x", None)))
    with pytest.raises(MatmulLayoutError, match=r"B is a list, not an array; fix: "):
        sk.matmul(a, [[1.0] * 24] * 32)


@pytest.mark.parametrize("out_spec", ["x", "model"])
def test_matmul_refuses_a_string_out_spec(axis_type, out_spec):
    mesh = _mesh(axis_type, (8,), ("x",))
    a = jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P("x", None)))
    b = jax.device_put(jnp.ones((8, 16)), NamedSharding(mesh, P()))
    with pytest.raises(
        MatmulLayoutError, match=rf"string '{out_spec}'.*fix: P\('{out_spec}', None\)"
    ):
        sk.matmul(a, b, out_spec=out_spec)


@pytest.mark.parametrize(
    "algorithm", ["auto", "allgather", "reduce_scatter", "collective", "gspmd"]
)
def test_grad_through_matmul_on_explicit_axes_matches_jnp(algorithm):
    mesh = _mesh(jax.sharding.AxisType.Explicit, (8,), ("x",))
    ka, kb = jax.random.split(jax.random.key(3))
    a_host, b_host = jax.random.normal(ka, (16, 32)), jax.random.normal(kb, (32, 24))
    specs = {
        "reduce_scatter": (P(None, "x"), P("x", None)),
        "collective": (P("x", None), P(None, "x")),
    }
    a_spec, b_spec = specs.get(algorithm, (P("x", None), P()))
    a = jax.device_put(a_host, NamedSharding(mesh, a_spec))
    b = jax.device_put(b_host, NamedSharding(mesh, b_spec))

    def loss(matmul, a, b):
        return jnp.sum(jnp.tanh(matmul(a, b)))

    with jax.set_mesh(mesh):
        ga, gb = jax.grad(
            lambda a, b: loss(lambda x, y: sk.matmul(x, y, algorithm=algorithm), a, b), (0, 1)
        )(a, b)
    ra, rb = jax.grad(lambda a, b: loss(jnp.matmul, a, b), (0, 1))(a_host, b_host)
    np.testing.assert_allclose(np.asarray(ga), np.asarray(ra), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gb), np.asarray(rb), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch_axis", [None, "b"])
@pytest.mark.parametrize("algorithm", ["auto", "allgather", "gspmd"])
def test_vmap_over_matmul_keeps_or_refuses_the_batch_axis(batch_axis, algorithm):
    mesh = _mesh(jax.sharding.AxisType.Explicit, (2, 4), ("b", "x"))
    a_host = jax.random.normal(jax.random.key(0), (4, 16, 8))
    b_host = jax.random.normal(jax.random.key(1), (8, 16))
    a = jax.device_put(a_host, NamedSharding(mesh, P(batch_axis, "x", None)))
    b = jax.device_put(b_host, NamedSharding(mesh, P()))
    with jax.set_mesh(mesh):
        run = jax.vmap(lambda a: sk.matmul(a, b, algorithm=algorithm))
        if batch_axis and algorithm != "gspmd":
            with pytest.raises(
                MatmulLayoutError, match=r"mapped by jax.vmap.*'b'.*fix: algorithm='gspmd'"
            ):
                run(a)
            return
        c = run(a)
    np.testing.assert_allclose(np.asarray(c), np.asarray(a_host @ b_host), rtol=1e-5, atol=1e-5)
