"""Trainer: every strategy on 8 devices (Auto and Explicit) matches the 1-device reference."""

import math

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from shardkit.inspection.hlo import collective_counts
from shardkit.models import GPT, MLP, GPTConfig, classification_loss, lm_loss
from shardkit.plan import Transformer, plan
from shardkit.strategies import FSDP, Auto, DataParallel, Hybrid, TensorParallel
from shardkit.train.data import ReverseTask, TeacherTask
from shardkit.train.trainer import BatchSizeError, Trainer

TASK = ReverseTask(digits=15, length=8)  # vocab 16, sequence 16: every dim divides by 8
CFG = GPTConfig(vocab=TASK.vocab, d_model=32, n_layers=2, n_heads=8, seq_len=TASK.seq_len)
STEPS, BATCH = 10, 16
# float32, same math, different reduction order across devices: losses agree to ~1e-6.
RTOL, ATOL = 1e-5, 1e-6

STRATEGIES = {
    "dp": DataParallel(),
    "fsdp": FSDP(),
    "zero1": FSDP(zero=1),
    "tp": TensorParallel(),
    "hybrid": Hybrid(data=2, fsdp=2, tensor=2),
    "auto": Auto(),
}


def gpt_trainer(strategy, **kw):
    return Trainer(
        lambda k: GPT(CFG, rngs=nnx.Rngs(k)), optax.adam(1e-2), lm_loss, strategy=strategy, **kw
    )


def run(trainer, steps=STEPS, batch=BATCH):
    state = trainer.init(0)
    losses = []
    for i in range(steps):
        state, metrics = trainer.step(state, trainer.place_batch(TASK.batch(i, batch_size=batch)))
        losses.append(float(metrics["loss"]))
    return state, np.array(losses)


@pytest.fixture(scope="module")
def reference():
    state, losses = run(gpt_trainer(DataParallel(), devices=jax.devices()[:1]))
    return jax.device_get(state.params), losses


def per_device_bytes(tree):
    return sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree))


def total_bytes(tree):
    return sum(x.nbytes for x in jax.tree.leaves(tree))


# Every strategy on Auto axes; on Explicit axes the three whose model code differs there
# (FSDP's reshards, Megatron's row-parallel out_sharding, and all three axes at once).
CASES = [(name, "auto") for name in STRATEGIES] + [
    (name, "explicit") for name in ("fsdp", "tp", "hybrid")
]


@pytest.mark.parametrize(("name", "kind"), CASES)
def test_strategy_matches_single_device(name, kind, reference):
    ref_params, ref_losses = reference
    trainer = gpt_trainer(STRATEGIES[name], axis_types=kind)
    assert trainer.mesh.size == 8
    state, losses = run(trainer)
    # 1. numbers: the loss trajectory and final parameters equal the 1-device run
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL, atol=ATOL)
    assert losses[-1] < losses[0]
    for a, b in zip(jax.tree.leaves(jax.device_get(state.params)), jax.tree.leaves(ref_params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    # 2. layouts: every leaf carries the strategy's spec; bytes per device follow from it
    for leaf, spec in zip(jax.tree.leaves(state.params), jax.tree.leaves(trainer.param_specs)):
        assert leaf.sharding.spec == spec
    mesh_sizes = dict(trainer.mesh.shape)
    expected = sum(
        math.prod(x.shape)
        * 4
        // math.prod(mesh_sizes[a] for e in s if e for a in (e if isinstance(e, tuple) else (e,)))
        for x, s in zip(jax.tree.leaves(state.params), jax.tree.leaves(trainer.param_specs))
    )
    assert per_device_bytes(state.params) == expected
    total = total_bytes(state.params)
    opt_arrays = [x for x in jax.tree.leaves(state.opt_state) if x.ndim]
    if name == "dp":
        assert per_device_bytes(state.params) == total
    if name == "auto":  # the planner's choice here: ZeRO-1 over 8 (optimizer state split)
        assert trainer.strategy == Hybrid(fsdp=8, zero=1)
        assert per_device_bytes(state.params) == total
        assert per_device_bytes(opt_arrays) == 2 * total // 8
    if name == "fsdp":
        assert per_device_bytes(state.params) == total // 8
        assert per_device_bytes(opt_arrays) == 2 * total // 8
    if name == "zero1":
        assert per_device_bytes(state.params) == total
        assert per_device_bytes(opt_arrays) == 2 * total // 8
    if name == "hybrid":
        q = state.params["blocks"]["q"]
        assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
        assert q.addressable_shards[0].data.shape == (2, 16, 4, 4)
    # 3. the compiled step holds exactly the strategy's collectives
    batch = trainer.place_batch(TASK.batch(0, batch_size=BATCH))
    counts = collective_counts(trainer.compile_step(batch).as_text())
    assert trainer.strategy.expected_collectives(trainer.mesh).check(counts) == []
    if name in ("dp", "zero1"):
        assert counts["all-reduce"] >= 1
    if name == "dp":
        assert counts["all-gather"] == 0  # parameters are never gathered
    if name == "fsdp":
        assert counts["all-gather"] >= 1
    # 4. no recompilation: one compiled step served all ten calls
    assert len(trainer._compiled) == 1


def test_init_is_born_sharded():
    trainer = gpt_trainer(FSDP())
    stats = trainer.compiled_init().memory_analysis()
    full = sum(math.prod(x.shape) * 4 for x in jax.tree.leaves(trainer.abstract_params))
    # params + Adam mu and nu, split 8 ways, plus counters and per-buffer alignment
    n_buffers = len(jax.tree.leaves(trainer.abstract_state))
    assert 3 * full // 8 <= stats.output_size_in_bytes <= 3 * full // 8 + 64 * n_buffers
    assert stats.temp_size_in_bytes < full


def test_auto_is_the_planners_choice_and_the_clis():
    # Python's Auto() and `shardkit train --strategy auto` ask the same planner
    from shardkit.train.config import TrainConfig
    from shardkit.train.run import build_trainer

    cfg = TrainConfig(strategy="auto", batch=BATCH, d_model=32, n_layers=2, n_heads=8)
    cli_trainer, _, model_cfg = build_trainer(cfg)
    trainer = Trainer(lambda k: GPT(model_cfg, rngs=nnx.Rngs(k)), optax.adam(1e-2), lm_loss,
                      strategy=Auto(), batch_size=BATCH)  # fmt: skip
    planned = plan(Transformer.from_gpt_config(model_cfg, batch=BATCH, precision="float32"),
                   devices=8, hardware=Auto().profile())  # fmt: skip
    assert trainer.strategy == cli_trainer.strategy == planned.runnable_best().strategy()
    assert trainer.strategy_reason == cli_trainer.strategy_reason == planned.why()
    assert "predicted fastest" in trainer.strategy_reason


def test_grad_accumulation_matches_full_batch(reference):
    trainer = gpt_trainer(Hybrid(data=2, fsdp=2, tensor=2), grad_accum=2)
    _, losses = run(trainer, steps=4)
    np.testing.assert_allclose(losses, reference[1][:4], rtol=1e-5, atol=1e-6)


def test_bf16_mixed_precision_keeps_fp32_master_weights(reference):
    trainer = gpt_trainer(FSDP(), compute_dtype="bfloat16")
    state, losses = run(trainer, steps=4)
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(state.params))
    # bfloat16 has an 8-bit mantissa: losses agree with float32 to a few 1e-2
    np.testing.assert_allclose(losses, reference[1][:4], rtol=3e-2)


def test_mlp_and_plain_pytree_models():
    task = TeacherTask(features=16, classes=4)
    trainer = Trainer(
        lambda k: MLP((16, 32, 4), rngs=nnx.Rngs(k)),
        optax.sgd(0.1),
        classification_loss,
        strategy=Hybrid(data=4, tensor=2),
    )
    state = trainer.init(0)
    assert state.params["layers"][0]["kernel"].sharding.spec == jax.sharding.PartitionSpec(
        None, "tensor"
    )

    def init(key):
        return {"w": jax.random.normal(key, (16, 4)) * 0.1}

    def loss(params, batch):
        logits = batch["x"] @ params["w"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    from shardkit.rules import Rules

    rules = Rules([(r"^w$", jax.sharding.PartitionSpec("fsdp", "tensor"))])
    plain = Trainer(init, optax.sgd(0.1), loss, strategy=Hybrid(fsdp=4, tensor=2, rules=rules))
    pstate = plain.init(0)
    assert pstate.params["w"].sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    first = None
    for i in range(5):
        pstate, m = plain.step(pstate, plain.place_batch(task.batch(i, batch_size=16)))
        first = first if first is not None else float(m["loss"])
    assert float(m["loss"]) < first


def test_batch_not_divisible_is_a_clear_error():
    trainer = gpt_trainer(Hybrid(data=2, fsdp=2, tensor=2), grad_accum=2)
    with pytest.raises(BatchSizeError, match=r"batch size 6 is not divisible by 8 .*fix"):
        trainer.place_batch(TASK.batch(0, batch_size=6))


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="grad_accum=0"):
        gpt_trainer(DataParallel(), grad_accum=0)
    with pytest.raises(ValueError, match="compute_dtype='fp8'"):
        gpt_trainer(DataParallel(), compute_dtype="fp8")
    with pytest.raises(ValueError, match="needs 2 devices .* 8 are available"):
        gpt_trainer(TensorParallel(tensor=2))


def test_fsdp_gathers_one_layer_at_a_time_with_block_remat():
    from shardkit.inspection import inspect

    # weights must outweigh activations for the memory check to mean something
    cfg = GPTConfig(vocab=16, d_model=128, n_layers=4, n_heads=8, seq_len=16, remat="block")
    trainer = Trainer(
        lambda k: GPT(cfg, rngs=nnx.Rngs(k)), optax.adam(1e-2), lm_loss, strategy=FSDP()
    )
    batch = trainer.place_batch(TASK.batch(0, batch_size=BATCH))
    compiled = trainer.compile_step(batch)
    counts = inspect(compiled, mesh=trainer.mesh).counts()
    # 4 unstacked leaves gathered once; 8 stacked leaves gathered per layer, forward and again
    # in the recomputed backward (ZeRO-3's 3x parameter traffic)
    assert counts["all-gather"] == 4 + 8 * cfg.n_layers * 2
    full = 4 * cfg.n_params()
    # temporaries (gathered weights, activations, gradient buffers) stay well below one
    # full copy of the weights: layers are never all gathered at once
    assert compiled.memory_analysis().temp_size_in_bytes < 0.8 * full


def test_a_mesh_without_the_strategys_axes_is_an_error_not_a_silent_replica():
    from shardkit.mesh import make_mesh

    with pytest.raises(ValueError, match=r"FSDP\(fsdp=-1, zero=3\) splits over mesh axis 'fsdp', "
                       r"which the mesh \{'x': 8\} lacks.*fix:"):  # fmt: skip
        gpt_trainer(FSDP(), mesh=make_mesh({"x": 8}, axis_types="auto"))
    with pytest.raises(ValueError, match=r"'data' and 'tensor'"):
        gpt_trainer(Hybrid(data=2, tensor=4), mesh=make_mesh({"fsdp": 8}, axis_types="auto"))
    one = gpt_trainer(DataParallel(), mesh=make_mesh({"x": 1}, devices=jax.devices()[:1]))
    assert one.mesh.size == 1  # nothing to split on one device: allowed


def test_the_step_audit_takes_out_only_the_strategys_own_collectives():
    import dataclasses

    from shardkit.inspection import inspect
    from shardkit.inspection.report import Finding
    from shardkit.train.step_audit import strategy_owned

    trainer = Trainer(lambda k: MLP((64, 128, 8), rngs=nnx.Rngs(k)), optax.adam(1e-3),
                      classification_loss, strategy=FSDP())  # fmt: skip
    batch = trainer.place_batch({"x": np.ones((16, 64), "f4"), "y": np.zeros(16, "i4")})
    report = inspect(trainer.compile_step(batch), mesh=trainer.mesh)
    gathers = [w for w in report.warnings if w.code == "implicit-gather"]
    assert gathers  # the generic audit flags FSDP's parameter gathers
    foreign = Finding("large-collective", "a real problem", 0)
    odd = Finding("implicit-gather", "not a parameter's size", None)
    report = dataclasses.replace(report, warnings=report.warnings + (foreign, odd))
    kept, lines = strategy_owned(trainer, report)
    assert list(kept.warnings) == [foreign, odd]  # real ones stay
    assert any("all-gather" in x and "(FSDP)" in x for x in lines)
