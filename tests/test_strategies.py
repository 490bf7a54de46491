"""Strategies: mesh axes, specs from logical names and patterns, expected collectives, errors."""

import os

import jax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from shardkit.models import GPT, GPTConfig, logical_axes
from shardkit.plan import DoesNotFitError, Transformer, evaluate, get_hardware, plan
from shardkit.strategies import (
    FSDP,
    Auto,
    DataParallel,
    Hybrid,
    TensorParallel,
    UnmatchedLeafError,
    from_name,
)

CFG = GPTConfig(vocab=16, d_model=32, n_layers=2, n_heads=4, seq_len=16)


@pytest.fixture(scope="module")
def gpt():
    model = nnx.eval_shape(lambda: GPT(CFG, rngs=nnx.Rngs(0)))
    return nnx.to_pure_dict(nnx.state(model, nnx.Param)), logical_axes(model)


def test_mesh_axes():
    assert DataParallel().mesh_axes(8) == {"data": 8}
    assert FSDP().mesh_axes(8) == {"fsdp": 8}
    assert TensorParallel(tensor=4).mesh_axes(4) == {"tensor": 4}
    assert Hybrid(data=2, fsdp=2, tensor=2).mesh_axes(8) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert Hybrid(fsdp=-1, tensor=2).mesh_axes(8) == {"fsdp": 4, "tensor": 2}
    assert DataParallel().mesh_axes(1) == {"data": 1}
    mesh = Hybrid(data=2, tensor=-1).make_mesh(axis_types="explicit")
    assert dict(mesh.shape) == {"data": 2, "tensor": 4}
    assert mesh.axis_types == (jax.sharding.AxisType.Explicit,) * 2


def test_specs_follow_logical_names(axis_type, gpt):
    params, logical = gpt
    kind = "explicit" if axis_type == jax.sharding.AxisType.Explicit else "auto"
    s = Hybrid(data=2, fsdp=2, tensor=2)
    mesh = s.make_mesh(axis_types=kind)
    specs = s.param_specs(params, mesh, logical=logical)
    # Megatron: q/k/v and up column-parallel, out and down row-parallel, vocab-parallel ends
    assert specs["blocks"]["q"] == P(None, "fsdp", "tensor", None)
    assert specs["blocks"]["out"] == P(None, "tensor", None, "fsdp")
    assert specs["blocks"]["up"] == P(None, "fsdp", "tensor")
    assert specs["blocks"]["down"] == P(None, "tensor", "fsdp")
    assert specs["embedding"] == P("tensor", "fsdp")
    assert specs["head"] == P("fsdp", "tensor")
    # the stacked "layers" axis is never split
    assert all(
        sp[0] is None for sp in jax.tree.leaves(specs["blocks"], is_leaf=lambda x: isinstance(x, P))
    )
    assert s.batch_spec(mesh, 2) == P(("data", "fsdp"), None)
    assert s.compute_spec(P("fsdp", "tensor")) == P(None, "tensor")
    assert s.compute_spec(P(("data", "fsdp"), None)) == P("data", None)


def test_zero1_splits_only_optimizer_state(gpt):
    params, logical = gpt
    s = FSDP(zero=1)
    mesh = s.make_mesh()
    assert s.param_specs(params, mesh, logical=logical)["blocks"]["up"] == P(None, None, None)
    assert s.opt_state_specs(params, mesh, logical=logical)["blocks"]["up"] == P(None, None, "fsdp")


def test_fsdp_picks_largest_divisible_dim_and_skips_indivisible():
    s = FSDP()
    mesh = s.make_mesh()
    tree = {
        "w": jax.ShapeDtypeStruct((24, 64), "float32"),
        "odd": jax.ShapeDtypeStruct((3, 5), "float32"),
    }
    specs = s.param_specs(tree, mesh)
    assert specs == {"w": P(None, "fsdp"), "odd": P(None, None)}


def test_tensor_rules_for_plain_pytrees():
    s = TensorParallel(tensor_rules=((r"up", 1), (r"down", 0), (r".*", None)))
    mesh = s.make_mesh()
    tree = {
        "up": jax.ShapeDtypeStruct((16, 64), "float32"),
        "down": jax.ShapeDtypeStruct((64, 16), "float32"),
        "bias": jax.ShapeDtypeStruct((16,), "float32"),
    }
    assert s.param_specs(tree, mesh) == {
        "up": P(None, "tensor"),
        "down": P("tensor", None),
        "bias": P(None),
    }


def test_leaf_no_rule_matches_is_a_clear_error():
    tree = {"w": jax.ShapeDtypeStruct((16, 64), "float32")}
    s = TensorParallel(tensor_rules=((r"up", 1),))
    with pytest.raises(UnmatchedLeafError, match=r"leaf 'w' \(shape \(16, 64\)\).*fix"):
        s.param_specs(tree, s.make_mesh())
    with pytest.raises(UnmatchedLeafError, match="no logical axis names.*tensor_rules"):
        TensorParallel().param_specs(tree, TensorParallel().make_mesh())


@pytest.mark.parametrize("dim", [2, 5, -3])
def test_a_tensor_rule_dim_the_leaf_lacks_is_named_not_wrapped(dim):
    tree = {"up": jax.ShapeDtypeStruct((16, 64), "float32")}
    s = TensorParallel(tensor_rules=((r"up", dim),))
    with pytest.raises(
        ValueError, match=rf"splits dim {dim} of leaf 'up', which has 2 dims.*-2\.\.1"
    ):
        s.param_specs(tree, s.make_mesh())
    assert TensorParallel(tensor_rules=((r"up", -1),)).param_specs(tree, s.make_mesh()) == {
        "up": P(None, "tensor")
    }


def test_expected_collectives():
    dp = DataParallel()
    e = dp.expected_collectives(dp.make_mesh())
    assert e.check({"all-reduce": 3}) == []
    assert e.check({"all-reduce": 3, "all-gather": 2}) == ["unexpected all-gather x2"]
    assert e.check({}) == ["missing all-reduce or reduce-scatter (gradients summed over the "
                           "batch-split axes)"]  # fmt: skip
    f = FSDP()
    e = f.expected_collectives(f.make_mesh())
    assert e.check({"all-gather": 4, "reduce-scatter": 4}) == []
    assert "missing all-gather" in e.check({"all-reduce": 4})[0]
    one = DataParallel()
    e = one.expected_collectives(one.make_mesh(jax.devices()[:1]))
    assert e.required == () and e.check({"all-reduce": 1}) == ["unexpected all-reduce x1"]


def test_auto_is_the_planner(gpt):
    # Auto() returns the planner's fastest runnable layout and the plan's reason
    params, logical = gpt
    s, why = Auto().choose(params, n_devices=8, logical=logical, workload=CFG, batch=16)
    w = Transformer.from_gpt_config(CFG, batch=16, precision="fp32")
    planned = plan(w, devices=8, hardware=Auto().profile())
    assert s == planned.runnable_best().strategy() and why == planned.why()
    # the 8 simulated devices share the host's memory: each gets an eighth of it
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert Auto().profile().hbm_bytes == pytest.approx(host / 8, rel=1e-6)
    # ... and its cores: the devices that run divide the cpu profile's peak among them
    cpu = get_hardware("cpu")
    assert Auto().profile().peak("fp32") == pytest.approx(cpu.peak("fp32") / 8)
    assert Auto().profile(jax.devices()[:2]).peak("fp32") == pytest.approx(cpu.peak("fp32") / 2)
    # any pytree: a Dense model of its parameters; less memory moves it to ZeRO-3
    s, why = Auto().choose(params, n_devices=8)
    assert s.fsdp == 8 and s.zero == 1 and "ZeRO-1" in why
    s, why = Auto(memory_per_device=200_000).choose(params, n_devices=8)
    assert s.fsdp == 8 and s.zero == 3 and "ZeRO-3" in why
    with pytest.raises(DoesNotFitError, match=r"fits on no layout of 8 x cpu.*KiB"):
        Auto(memory_per_device=1 << 16).choose(params, n_devices=8)
    assert Auto().choose(params, n_devices=1)[0] == DataParallel()
    with pytest.raises(ValueError, match="batch=6.*a batch that is a multiple of 8"):
        Auto().choose(params, n_devices=8, logical=logical, batch=6)
    with pytest.raises(ValueError, match=r"memory_per_device=0.*fix"):
        Auto(memory_per_device=0)
    with pytest.warns(DeprecationWarning, match="memory_per_device"):
        assert Auto(fraction=0.5).profile().hbm_bytes == Auto().profile().hbm_bytes // 2


def test_from_name():
    assert from_name("dp") == DataParallel()
    assert from_name("zero1", mesh={"fsdp": 8}) == FSDP(fsdp=8, zero=1)
    assert from_name("hybrid", mesh={"data": 2, "fsdp": 2, "tensor": 2}) == Hybrid(
        data=2, fsdp=2, tensor=2
    )
    assert from_name("auto") == Auto()
    with pytest.raises(ValueError, match="unknown strategy 'ring'.*fix"):
        from_name("ring")
    with pytest.raises(ValueError, match="unknown mesh axis 'model'"):
        from_name("hybrid", mesh={"model": 2})
    with pytest.raises(ValueError, match="uses only mesh axis 'data'"):
        from_name("dp", mesh={"tensor": 2})
    with pytest.raises(ValueError, match="chooses the mesh itself"):
        from_name("auto", mesh={"data": 8})


def test_from_name_sets_the_zero_stage_of_the_fsdp_axis():
    """`shardkit train --zero` runs the planner's ZeRO-1 rows (`fsdp=4 tensor=2 (ZeRO-1)`)."""
    assert from_name("hybrid", mesh={"fsdp": 4, "tensor": 2}, zero=1) == Hybrid(
        fsdp=4, tensor=2, zero=1
    )
    assert from_name("fsdp", zero=1) == FSDP(zero=1) and from_name("fsdp", zero=3) == FSDP()
    assert from_name("zero1", zero=1) == FSDP(zero=1)
    assert from_name("hybrid", mesh={"fsdp": 8}).zero == 3  # the default stays ZeRO-3
    cases = [
        ({"name": "fsdp", "zero": 2}, "--zero 2 is not a ZeRO stage.*fix: --zero 3"),
        ({"name": "auto", "zero": 1}, "'auto' chooses the ZeRO stage.*fix: drop --zero 1"),
        ({"name": "zero1", "zero": 3}, "'zero1' is ZeRO-1 but --zero 3.*fix"),
        ({"name": "dp", "zero": 1}, "strategy 'dp' has not; fix: add an fsdp axis"),
        ({"name": "hybrid", "zero": 1}, "data=-1,tensor=2 \\(its default\\) has not"),
        ({"name": "hybrid", "mesh": {"data": 4, "tensor": 2}, "zero": 3}, "'tensor': 2}"),
    ]
    for kwargs, says in cases:
        with pytest.raises(ValueError, match=says):
            from_name(**kwargs)


def test_bad_degrees_are_clear_errors():
    with pytest.raises(ValueError, match="zero=2 is not a supported ZeRO stage"):
        FSDP(zero=2)
    with pytest.raises(ValueError, match="only one degree may be -1"):
        Hybrid(data=-1, fsdp=-1)
    with pytest.raises(ValueError, match="data=0 must be a positive degree"):
        DataParallel(data=0)
    with pytest.raises(ValueError, match="needs 12 devices .* 8 are available"):
        Hybrid(data=3, tensor=4).mesh_axes(8)
    with pytest.raises(ValueError, match="does not divide 8 devices"):
        Hybrid(data=3, tensor=-1).mesh_axes(8)


def test_every_strategy_degenerates_cleanly_to_one_device(gpt):
    params, logical = gpt
    for s in (DataParallel(), FSDP(), FSDP(zero=1), TensorParallel(), Hybrid(fsdp=-1)):
        mesh = s.make_mesh(jax.devices()[:1])
        assert dict(mesh.shape) == {"data": 1}
        specs = jax.tree.leaves(
            s.param_specs(params, mesh, logical=logical), is_leaf=lambda x: isinstance(x, P)
        )
        assert all(all(e is None for e in sp) for sp in specs)  # nothing split
        assert s.expected_collectives(mesh).required == ()


def test_hybrid_with_shardkit_rules_for_any_pytree():
    from shardkit.rules import Rules

    tree = {
        "enc": {"w": jax.ShapeDtypeStruct((16, 64), "float32")},
        "b": jax.ShapeDtypeStruct((64,), "float32"),
    }
    rules = Rules([(r"enc/w", P("fsdp", "tensor")), (r".*", P())])
    s = Hybrid(fsdp=4, tensor=2, rules=rules)
    mesh = s.make_mesh()
    assert s.param_specs(tree, mesh) == {"enc": {"w": P("fsdp", "tensor")}, "b": P()}
    z1 = Hybrid(fsdp=4, tensor=2, zero=1, rules=rules)
    assert z1.param_specs(tree, mesh)["enc"]["w"] == P(None, "tensor")
    assert z1.opt_state_specs(tree, mesh)["enc"]["w"] == P("fsdp", "tensor")
    with pytest.raises(ValueError, match="enc/w"):  # the foundation's unmatched-leaf error
        Hybrid(fsdp=4, tensor=2, rules=Rules([(r"^b$", P())])).param_specs(tree, mesh)


def test_bind_resolves_a_strategy_against_a_mesh_once(gpt):
    import dataclasses

    from shardkit.strategies import BoundStrategy, Pipeline, Strategy

    params, logical = gpt
    s = Hybrid(fsdp=4, tensor=2)
    mesh = s.make_mesh()
    b = s.bind(mesh)
    assert isinstance(b, BoundStrategy) and isinstance(s, Strategy)
    assert dict(b.axis_sizes) == {"fsdp": 4, "tensor": 2} and b.size("data") == 1
    assert b.batch_axes == ("fsdp",) and b.batch_split == 4 and b.stages == 1
    assert b.batch_spec(3) == P("fsdp", None, None)
    assert b.param_specs(params, logical=logical) == s.param_specs(params, mesh, logical=logical)
    assert b.expected == s.expected_collectives(mesh) and b.description == s.describe(mesh)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.mesh = None
    with pytest.raises(TypeError):
        b.axis_sizes["fsdp"] = 8  # read-only
    # the planner reads the same degrees
    w = Transformer.from_gpt_config(CFG, batch=16)
    c = evaluate(w, "cpu", **b.layout())
    assert c.mesh_axes == s.mesh_axes(8) and c.strategy() == Hybrid(fsdp=4, tensor=2, zero=3)
    # a pipeline is checked against the mesh's 'stage' axis when bound
    piped = Hybrid(data=2, pipeline=Pipeline(stages=4, microbatches=4))
    pb = piped.bind(piped.make_mesh())
    assert pb.stages == 4 and pb.layout()["microbatches"] == 4
    with pytest.raises(ValueError, match=r"Pipeline\(stages=4\) but the mesh .* no 'stage' axis"):
        piped.bind(DataParallel().make_mesh())
