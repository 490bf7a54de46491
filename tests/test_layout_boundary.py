"""The layout APIs at the boundary: users' trees (PRNG keys, None leaves, NamedShardings), bad
meshes and bad arguments. Each case failed before, with a raw error or a wrong answer."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit as sk
from shardkit.errors import ShardingRuleError, ShardkitValueError
from shardkit.mesh import MeshError


@pytest.fixture
def mesh():
    return sk.make_mesh({"data": 4, "model": 2})


class Net(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(16, 64, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)  # holds a typed PRNG key


def test_a_tree_with_prng_keys_lints_shards_and_builds_as_arrays_do(mesh):
    tree = {"w": jnp.arange(32.0).reshape(8, 4), "rng": jax.random.key(3)}
    rules = sk.Rules([("w", P("data"))], default=P())
    assert rules.specs(tree, mesh) == {"w": P("data"), "rng": P()}
    report = sk.lint(tree, rules, mesh)
    assert report.ok and report.bytes_global == 32 * 4 + 8  # a threefry key is 8 bytes
    placed = sk.shard(tree, rules, mesh)
    np.testing.assert_array_equal(
        jax.random.key_data(placed["rng"]), jax.random.key_data(jax.random.key(3))
    )
    assert placed["w"].sharding.spec == P("data")
    row = next(r for r in sk.tree_table(tree, rules.specs(tree, mesh), mesh) if r["path"] == "rng")
    assert row["bytes_per_device"] == 8
    model = sk.sharded_model(lambda: Net(nnx.Rngs(0)), sk.Rules(default=P()), mesh)
    assert isinstance(model, Net) and model.lin.kernel[...].shape == (16, 64)


def test_specs_from_rules_with_none_leaves_lint_and_a_mismatched_tree_is_named(mesh):
    params = {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32), "b": None}  # a missing bias
    specs = sk.Rules([("w", P("data"))], default=P()).specs(params, mesh)
    assert sk.lint(params, specs, mesh).ok
    assert [r["spec"] for r in sk.tree_table(params, specs, mesh)] == ["[A_data, B]"]
    tree = {"a": jax.ShapeDtypeStruct((8,), jnp.float32), "b": jax.ShapeDtypeStruct((3,), "f4")}
    with pytest.raises(ShardingRuleError, match=r"does not mirror the tree.*\['a', 'b'\].*fix"):
        sk.lint(tree, {"x": P("data"), "y": P()}, mesh)  # same leaf count, other keys


def test_named_sharding_trees_compare_and_lint_by_their_specs(mesh):
    a = {"w": NamedSharding(mesh, P("data", None))}
    b = {"w": NamedSharding(mesh, P(None, "model"))}
    assert sk.diff_specs(a, b) == [("w", P("data", None), P(None, "model"))]
    assert sk.diff_specs(a, {"w": NamedSharding(mesh, P("data"))}) == []
    report = sk.lint({"w": jax.ShapeDtypeStruct((8, 4), jnp.float32)}, a, mesh)
    assert report.ok and report.bytes_per_device == 2 * 4 * 4


def test_unconstrained_entries_pass_through_rules(mesh):
    tree = {"w": jax.ShapeDtypeStruct((3, 8), jnp.float32)}
    rules = sk.Rules([("w", P(P.UNCONSTRAINED, "model"))], logical={"x": "data"})
    assert rules.specs(tree, mesh) == {"w": P(P.UNCONSTRAINED, "model")}


def test_make_mesh_refuses_repeated_devices_and_non_devices():
    d = jax.devices()
    with pytest.raises(MeshError, match=r"device\(s\) \[0, 1\] more than once.*fix"):
        sk.make_mesh({"a": 2, "b": 2}, devices=[d[0], d[0], d[1], d[1]])
    with pytest.raises(MeshError, match=r"holds 0 \(int\), not a JAX device.*fix"):
        sk.make_mesh({"a": 2}, devices=[0, 1])
    grid = sk.make_mesh({"a": 2, "b": 4}, devices=np.array(d).reshape(2, 4))  # 8, not 2
    assert dict(grid.shape) == {"a": 2, "b": 4}
    assert dict(sk.make_mesh(8, ("a",)).shape) == {"a": 8}


def test_lint_without_a_mesh_does_not_call_a_split_leaf_replicated():
    report = sk.lint({"w": jax.ShapeDtypeStruct((1024, 1024), jnp.float32)}, P("data", "model"))
    assert "per-device bytes unknown (no mesh given)" in report.summary()
    assert not report.largest_replicated()
    one = sk.lint({"w": jax.ShapeDtypeStruct((4,), jnp.float32)}, P())
    assert [x.path for x in one.largest_replicated()] == ["w"]


@pytest.mark.parametrize("bad", [{"data": 0}, {"data": -4}, {"data": 2.5}, "data"])
def test_lint_names_a_bad_mesh(bad):
    with pytest.raises(ShardingRuleError, match="mesh: .*fix"):
        sk.lint({"w": jax.ShapeDtypeStruct((8,), jnp.float32)}, P("data"), bad)


def test_tree_table_uses_each_arrays_own_mesh_and_flags_what_cannot_be_placed(mesh):
    pair = sk.make_mesh({"x": 2}, devices=jax.devices()[6:])
    tree = {
        "a": jax.device_put(jnp.zeros(8), NamedSharding(mesh, P("data"))),
        "b": jax.device_put(jnp.zeros(8), NamedSharding(pair, P("x"))),
    }
    rows = {r["path"]: r["bytes_per_device"] for r in sk.tree_table(tree)}
    assert rows == {k: v.addressable_shards[0].data.nbytes for k, v in tree.items()}
    bad = {"w": jax.ShapeDtypeStruct((6, 4), jnp.float32)}
    row = sk.tree_table(bad, {"w": P("data")}, mesh)[0]
    assert row["spec"] == "[A_data, B] (error: indivisible)"


def test_show_and_spec_notation_refuse_what_does_not_exist(mesh):
    with pytest.raises(ShardkitValueError, match=r"dim 5 is out of range for a rank-2 array"):
        sk.show(shape=(8, 4), mesh=mesh, spec=P("data", "model"), dims=(5,), format="text")
    with pytest.raises(ShardkitValueError, match=r"dim 1 is out of range for a rank-1"):
        sk.show(shape=(8,), mesh=mesh, spec=P("data"), dims=(0, 1), format="text")
    with pytest.raises(ShardkitValueError, match="negative size"):
        sk.shard_table(shape=(-8, 4), mesh=mesh, spec=P("data"))
    assert "dims B (dim 1)" in sk.show(
        shape=(8, 4, 2), mesh=mesh, spec=P("data"), dims=1, format="text"
    )
    with pytest.raises(ShardkitValueError, match="has 2 entries but the array has 1 dims"):
        sk.spec_notation((4,), P("data", "model"))
    with pytest.raises(ShardkitValueError, match="negative"):
        sk.spec_notation(-1, P())
    assert sk.spec_notation(27, P()).endswith("D25, D26]")  # beyond Z: numbered, not repeated


def test_a_string_where_a_spec_or_mesh_goes_and_a_pytree_for_sharded_model_are_named(mesh):
    tree = {"w": jnp.ones((8, 4))}
    with pytest.raises(ShardingRuleError, match=r"string 'data'; fix: P\('data'\)"):
        sk.lint(tree, "data", mesh)  # read as a spec of 4 entries before
    with pytest.raises(ShardingRuleError, match=r"string 'data'; fix: P\('data'\)"):
        sk.shard(tree, "data", mesh)
    with pytest.raises(ShardingRuleError, match="mesh is str 'data', not a Mesh"):
        sk.shard(tree, P("data"), "data")
    with pytest.raises(TypeError, match=r"spec=P\('data'\)"):
        sk.show(shape=(8,), mesh=mesh, spec="data", format="text")
    with pytest.raises(ShardingRuleError, match="returned a dict, not an nnx.Module.*shard"):
        sk.sharded_model(lambda: {"w": jnp.ones(3)}, sk.Rules(default=P()), mesh)
    with pytest.raises(ShardingRuleError, match="rules is a dict, not a shardkit.Rules"):
        sk.sharded_model(lambda: Net(nnx.Rngs(0)), {"w": P()}, mesh)


def test_an_abstract_mesh_is_described_and_has_no_table(mesh):
    assert (
        sk.describe_mesh(mesh.abstract_mesh)
        == "Mesh(data=4, model=2; explicit; abstract, no devices)"
    )
    with pytest.raises(MeshError, match="no devices to lay out; fix"):
        sk.mesh_table(mesh.abstract_mesh)


def test_a_leaf_that_is_no_array_is_a_lint_error_not_a_crash_in_device_put(mesh):
    """An Equinox module holds its activation functions as leaves: lint said 0 errors, then
    shard failed inside device_put."""
    model = eqx.nn.MLP(4, 4, 8, 1, key=jax.random.key(0))
    report = sk.lint(model, P(), mesh)
    assert {f.code for f in report.errors} == {"not-array"}
    assert "leaf 'activation' is custom_jvp, not an array" in report.errors[0].message
    with pytest.raises(ShardingRuleError, match=r"not an array.*eqx.filter\(model, eqx.is_array\)"):
        sk.shard(model, sk.Rules(default=P()), mesh)
    assert sk.lint(eqx.filter(model, eqx.is_array), P(), mesh).ok
    assert not sk.lint({"act": "relu"}, P(), mesh).ok
