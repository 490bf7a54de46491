"""Partition rules and the linter: specs mirror the tree, every finding names its leaf."""

import math

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.linter import (
    DuplicateMeshAxisError,
    IndivisibleShardingError,
    SpecRankError,
    UnknownMeshAxisError,
    UnmatchedLeafError,
    lint,
)
from shardkit.mesh import make_mesh
from shardkit.rules import Rules, ShardingRuleError, path_str, shard

f32 = jnp.float32


def sds(*shape, dtype=f32):
    return jax.ShapeDtypeStruct(shape, dtype)


PARAMS = {
    "embed": {"embedding": sds(64, 16)},
    "layers": [
        {"attn": {"q": {"kernel": sds(16, 32)}, "out": {"kernel": sds(32, 16)}}},
        {"attn": {"q": {"kernel": sds(16, 32)}, "out": {"kernel": sds(32, 16)}}},
    ],
    "ln": {"scale": sds(16)},
}
RULES = Rules(
    [
        (r"embedding", P("vocab", None)),
        (r"attn/q/kernel", P(None, "heads")),
        (r"attn/out/kernel", P("heads", None)),
    ],
    logical={"vocab": "model", "heads": "model"},
    default=P(),
)


def test_specs_mirror_tree_and_translate_logical_names(axis_type):
    mesh = make_mesh({"data": 4, "model": 2}, axis_types=axis_type)
    specs = RULES.specs(PARAMS, mesh)
    assert jax.tree.structure(specs, is_leaf=lambda x: isinstance(x, P)) == jax.tree.structure(
        jax.tree.map(lambda _: 0, PARAMS)
    )
    assert specs["embed"]["embedding"] == P("model", None)
    assert specs["layers"][1]["attn"]["q"]["kernel"] == P(None, "model")
    assert specs["layers"][0]["attn"]["out"]["kernel"] == P("model", None)
    assert specs["ln"]["scale"] == P()


def test_first_match_wins_and_path_strings():
    rules = Rules([(r"kernel", P("a")), (r"q/kernel", P("b"))], default=P())
    assert rules.match("layers/0/attn/q/kernel").spec == P("a")
    assert rules.match("layers/0/attn/q/kernel").source == "rule 0: kernel"
    keypath = (jax.tree_util.DictKey("layers"), jax.tree_util.SequenceKey(3))
    assert path_str(keypath) == "layers/3"


def test_shard_places_arrays_with_the_promised_shards(axis_type):
    mesh = make_mesh({"data": 4, "model": 2}, axis_types=axis_type)
    params = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), PARAMS)
    placed = shard(params, RULES, mesh)
    q = placed["layers"][0]["attn"]["q"]["kernel"]
    assert q.sharding == NamedSharding(mesh, P(None, "model"))
    assert {s.data.shape for s in q.addressable_shards} == {(16, 16)}
    np.testing.assert_array_equal(np.asarray(q), np.ones((16, 32)))


def test_nnx_logical_annotations():
    class Block(nnx.Module):
        def __init__(self, rngs):
            init = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("embed", "mlp"))
            self.up = nnx.Linear(16, 64, kernel_init=init, rngs=rngs)
            self.down = nnx.Linear(64, 16, rngs=rngs)

    with nnx.use_eager_sharding(False):
        model = nnx.eval_shape(lambda: Block(nnx.Rngs(0)))
    state = nnx.state(model)
    rules = Rules([(r"down/kernel", P("model", None))], logical={"embed": None, "mlp": "model"},
                  default=P())  # fmt: skip
    mesh = make_mesh({"data": 4, "model": 2})
    specs = rules.specs(state, mesh)
    assert specs["up"]["kernel"].get_value() == P(None, "model")
    assert specs["down"]["kernel"].get_value() == P("model", None)
    assert specs["up"]["bias"].get_value() == P()
    report = lint(state, rules, mesh)
    assert report.ok
    assert [x.path for x in report.leaves] == ["down/bias", "down/kernel", "up/bias", "up/kernel"]
    assert report.leaves[3].source == "logical"


def test_lint_summary_bytes_and_replication():
    mesh = make_mesh({"data": 4, "model": 2})
    report = lint(PARAMS, RULES, mesh)
    assert report.ok
    total = (64 * 16 + 2 * (16 * 32 + 32 * 16) + 16) * 4
    assert report.bytes_global == total
    per_dev = (64 * 16 // 2 + 2 * (16 * 32 // 2 + 32 * 16 // 2) + 16) * 4
    assert report.bytes_per_device == per_dev
    assert report.replicated_fraction == pytest.approx(16 * 4 / per_dev)
    assert [x.path for x in report.largest_replicated()] == ["ln/scale"]
    # 8 devices each hold per_dev bytes; everything beyond one copy of each leaf is redundant
    assert report.redundant_fraction == pytest.approx(1 - total / (8 * per_dev))
    text = str(report)
    assert "0 errors" in text and "ln/scale" in text
    assert report.to_dict()["bytes_per_device"] == per_dev


def test_lint_reports_every_problem_with_its_path():
    mesh = make_mesh({"data": 4, "model": 2})
    tree = {
        "a": sds(6, 16),  # indivisible on data
        "b": sds(8, 8),  # unknown axis
        "c": sds(8, 8),  # duplicate axis
        "d": sds(8),  # rank too large
        "e": sds(4, 4),  # unmatched
    }
    rules = Rules(
        [("a", P("data")), ("b", P("nope")), ("c", P("model", "model")), ("d", P(None, "data"))]
    )
    report = lint(tree, rules, mesh)
    codes = {(f.path, f.code) for f in report.findings}
    assert codes == {
        ("a", "indivisible"),
        ("b", "unknown-axis"),
        ("c", "duplicate-axis"),
        ("d", "rank"),
        ("e", "unmatched"),
    }
    assert not report.ok
    ind = next(f for f in report.findings if f.code == "indivisible")
    assert "dim 0 has size 6" in ind.message and "'data' (size 4)" in ind.message
    assert "pad dim 0 to 8 (+2)" in ind.message
    assert "{'data': 2, 'model': 4}" in ind.message  # nearest mesh shape that divides


@pytest.mark.parametrize(
    "tree, rules, error, match",
    [
        ({"w": sds(6, 4)}, Rules([("w", P("data"))]), IndivisibleShardingError,
         r"leaf 'w' shape \(6, 4\).*'data' \(size 4\).*fix: .*pad dim 0 to 8"),
        ({"w": sds(8, 4)}, Rules([("w", P("data", "data"))]), DuplicateMeshAxisError,
         r"leaf 'w'.*mesh axis 'data' is used on more than one dim.*fix"),
        ({"w": sds(8, 4)}, Rules([("w", P("expert"))]), UnknownMeshAxisError,
         r"mesh axis 'expert' is not in the mesh \{'data': 4, 'model': 2\}.*fix: use one of"),
        ({"w": sds(8)}, Rules([("w", P("data", "model"))]), SpecRankError,
         r"leaf 'w' shape \(8,\).*2 entries but the array has rank 1.*fix"),
        ({"w": sds(8)}, Rules([("v", P())]), UnmatchedLeafError,
         r"leaf 'w' shape \(8,\) is matched by no partition rule.*default=P\(\)"),
        ({"w": sds(8, 6)}, Rules([("w", P(None, ("data", "model")))]), IndivisibleShardingError,
         r"dim 1 has size 6.*'data' \(size 4\) x 'model' \(size 2\) \(product 8\)"),
    ],
)  # fmt: skip
def test_specs_raise_precise_errors(tree, rules, error, match):
    mesh = make_mesh({"data": 4, "model": 2})
    with pytest.raises(error, match=match):
        rules.specs(tree, mesh)


def test_several_errors_are_counted_in_the_raised_message():
    mesh = make_mesh({"data": 4, "model": 2})
    rules = Rules([("a", P("x")), ("b", P("y"))])
    with pytest.raises(UnknownMeshAxisError, match=r"1 more problem: run shardkit.lint"):
        rules.specs({"a": sds(8), "b": sds(8)}, mesh)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (([("a", P()), "oops"],), {}, r"rules\[1\] = 'oops' is not a \(pattern, PartitionSpec\)"),
        (([("(", P())],), {}, r"rules\[0\]: pattern '\(' is not a valid regex"),
        (([(3, P())],), {}, r"pattern 3 must be a string"),
        (([("a", "data")],), {}, r"expected a PartitionSpec, got str"),
        (([],), {"logical": {"embed": 3}}, r"logical\['embed'\] = 3"),
    ],
)
def test_bad_rules(args, kwargs, match):
    with pytest.raises(ShardingRuleError, match=match):
        Rules(*args, **kwargs)


def test_spec_tree_must_match_tree():
    with pytest.raises(ShardingRuleError, match=r"does not mirror the tree.*\['a', 'b'\]"):
        lint({"a": sds(4), "b": sds(4)}, {"a": P()}, {"x": 2})


def test_shard_needs_mesh_for_specs():
    with pytest.raises(ShardingRuleError, match="needs mesh="):
        shard({"a": jnp.ones(4)}, P("x"))
    with pytest.raises(ShardingRuleError, match="needs a mesh"):
        RULES.shardings(PARAMS, None)


# Random shapes, specs and meshes: lint/specs either succeed or raise one documented error.
_AXES = ["a", "b", "c", "zz"]


@st.composite
def _case(draw):
    n_axes = draw(st.integers(1, 3))
    sizes = draw(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=n_axes, max_size=n_axes))
    mesh = dict(zip(_AXES[:n_axes], sizes))
    rank = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(1, 12), min_size=rank, max_size=rank)))
    entry = st.one_of(
        st.none(), st.sampled_from(_AXES), st.lists(st.sampled_from(_AXES), max_size=2).map(tuple)
    )
    spec = P(*draw(st.lists(entry, max_size=5)))
    return mesh, shape, spec


@settings(max_examples=300, deadline=None)
@given(_case())
def test_random_layouts_never_crash(case):
    mesh, shape, spec = case
    tree = {"w": sds(*shape)}
    report = lint(tree, Rules([("w", spec)]), mesh)
    codes = {f.code for f in report.findings}
    assert codes <= {"indivisible", "unknown-axis", "duplicate-axis", "rank"}
    axes = [a for e in spec if e is not None for a in ((e,) if isinstance(e, str) else e)]
    expect_ok = (
        len(spec) <= len(shape)
        and len(axes) == len(set(axes))
        and all(a in mesh for a in axes)
        and all(
            shape[d] % math.prod(mesh[a] for a in ((e,) if isinstance(e, str) else e)) == 0
            for d, e in enumerate(spec)
            if e is not None
        )
    )
    assert report.ok == expect_ok
    if report.ok:
        assert Rules([("w", spec)]).specs(tree, mesh)["w"] == spec
    else:
        with pytest.raises(ShardingRuleError):
            Rules([("w", spec)]).specs(tree, mesh)


def test_exported_names_do_not_collide_with_submodules():
    import importlib
    import importlib.util

    import shardkit

    for name, (_, attr) in shardkit._EXPORTS.items():
        if attr is not None:
            assert importlib.util.find_spec(f"shardkit.{name}") is None, name
    importlib.import_module("shardkit.linter")
    assert callable(shardkit.lint) and shardkit.lint.__name__ == "lint"


def test_registered_dataclass_and_scalar_leaves():
    import dataclasses

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Params:
        kernel: jax.Array
        step: jax.Array

    mesh = make_mesh({"data": 8}, axis_types="auto")
    tree = Params(kernel=jnp.ones((16, 4)), step=jnp.asarray(3))
    rules = Rules([(r"^kernel$", P("data")), (r"^step$", P())])
    specs = rules.specs(tree, mesh)
    assert specs.kernel == P("data") and specs.step == P()
    placed = shard(tree, rules, mesh)
    assert placed.kernel.sharding.spec == P("data") and int(placed.step) == 3
    assert lint({"n": 3.0}, Rules(default=P()), mesh).leaves[0].shape == ()


def test_shard_nnx_state_keeps_variables(axis_type):
    model = nnx.Linear(16, 8, rngs=nnx.Rngs(0))
    state = nnx.state(model)
    mesh = make_mesh({"data": 4, "model": 2}, axis_types=axis_type)
    rules = Rules([(r"kernel", P(None, "model")), (r"bias", P("model"))])
    placed = shard(state, rules, mesh)
    kernel = placed["kernel"].get_value()
    assert kernel.sharding.spec == P(None, "model")
    np.testing.assert_allclose(np.asarray(kernel), np.asarray(model.kernel.get_value()))


def test_lint_with_its_first_two_arguments_swapped_says_so():
    from shardkit import ShardingRuleError, lint

    params = {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32)}
    specs = {"w": P("data", None)}
    assert lint(params, specs, {"data": 8}).ok
    with pytest.raises(ShardingRuleError, match=r"swapped; fix: lint\(params, specs, mesh\)"):
        lint(specs, params, {"data": 8})


def test_every_submodule_the_docs_name_is_an_attribute_after_import_shardkit():
    import subprocess
    import sys

    code = (
        "import shardkit as sk\n"
        "assert callable(sk.inspection.compiled_layout)\n"
        "assert callable(sk.layout.format_rows)\n"
        "assert callable(sk.matmul.gspmd_chain)\n"
        "assert sk.verify.__name__ == 'shardkit.verify'\n"
        "try:\n    sk.not_a_module\nexcept AttributeError:\n    pass\n"
        "else:\n    raise SystemExit(1)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
