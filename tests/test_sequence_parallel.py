"""Sequence parallelism (Megatron): the single-device numbers, the split residual stream,
the planner's rows, and clear errors where it does not apply.

float32 sums in another order: losses agree to 1e-6, gradients to 2e-5 relative.
"""

import optax
import pytest
from flax import nnx
from reference import assert_equal_to, single_device

from shardkit.inspection import inspect
from shardkit.models import GPT, GPTConfig, lm_loss
from shardkit.plan import Transformer, evaluate
from shardkit.strategies import Hybrid, Pipeline, TensorParallel
from shardkit.strategies.parse import from_name
from shardkit.train import ReverseTask, Trainer

TASK = ReverseTask(digits=15, length=8)  # sequence length 16: splits over tensor = 2, 4, 8
CFG = GPTConfig(vocab=TASK.vocab, d_model=32, n_layers=2, n_heads=8, seq_len=TASK.seq_len)
BATCH = 16
CASES = {
    "tp8": TensorParallel(sequence_parallel=True),
    "data2-tensor4": Hybrid(data=2, tensor=4, sequence_parallel=True),
    "fsdp2-tensor4": Hybrid(fsdp=2, tensor=4, sequence_parallel=True),
    "data2-fsdp2-tensor2-zero1": Hybrid(data=2, fsdp=2, tensor=2, zero=1, sequence_parallel=True),
    # collective matmul: the tensor-parallel matmuls as overlapped rings (shardkit.overlap)
    "tp8-overlap": TensorParallel(sequence_parallel=True, collective_matmul=True),
    "data2-tensor4-overlap": Hybrid(data=2, tensor=4, sequence_parallel=True,
                                    collective_matmul=True),
    "fsdp2-tensor4-overlap": Hybrid(fsdp=2, tensor=4, sequence_parallel=True,
                                    collective_matmul=True),
}  # fmt: skip


def trainer_for(strategy, **kw):
    return Trainer(
        lambda k: GPT(CFG, rngs=nnx.Rngs(k)), optax.adam(1e-2), lm_loss, strategy=strategy, **kw
    )


@pytest.fixture(scope="module")
def reference():
    return single_device(trainer_for, TASK.batch(0, batch_size=BATCH))


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_sequence_parallel_gradients_equal_the_single_device_ones(name, axis_types, reference):
    trainer = trainer_for(CASES[name], axis_types=axis_types)
    assert "sequence parallel" in trainer.bound.description
    state = trainer.init(0)
    batch = trainer.place_batch(TASK.batch(0, batch_size=BATCH))
    (loss, _), grads = trainer.loss_and_grads(state.params, batch)
    assert_equal_to(reference, loss, grads)


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
@pytest.mark.parametrize("name", ["data2-tensor4", "data2-tensor4-overlap"])
def test_sequence_parallel_with_gradient_accumulation(name, axis_types, reference):
    trainer = trainer_for(CASES[name], axis_types=axis_types, grad_accum=4)
    state = trainer.init(0)
    batch = trainer.place_batch(TASK.batch(0, batch_size=BATCH))
    (loss, _), grads = trainer.loss_and_grads(state.params, batch)
    assert_equal_to(reference, loss, grads)


def test_the_residual_stream_is_split_over_the_sequence():
    """Per device, the activations a step keeps are smaller with sequence parallelism: the
    block inputs and norms hold T / tensor positions, not all T."""
    cfg = GPTConfig(vocab=TASK.vocab, d_model=128, n_layers=4, n_heads=8, seq_len=TASK.seq_len,
                    remat="block")  # fmt: skip

    def temp_bytes(strategy):
        trainer = Trainer(lambda k: GPT(cfg, rngs=nnx.Rngs(k)), optax.adam(1e-2), lm_loss,
                          strategy=strategy)  # fmt: skip
        batch = trainer.place_batch(TASK.batch(0, batch_size=64))
        return inspect(trainer.compile_step(batch), mesh=trainer.mesh).memory.temp_bytes

    plain, split = temp_bytes(TensorParallel()), temp_bytes(TensorParallel(sequence_parallel=True))
    assert split < 0.8 * plain, (split, plain)


def test_where_sequence_parallelism_does_not_apply_the_error_says_so():
    with pytest.raises(ValueError, match="sequence parallelism splits the sequence over the "
                                         "tensor axis.*fix: --strategy tp"):  # fmt: skip
        from_name("dp", sequence_parallel=True)
    with pytest.raises(ValueError, match="inside pipeline stages is not supported"):
        Hybrid(data=2, tensor=2, pipeline=Pipeline(stages=2), sequence_parallel=True)
    assert from_name("tp", sequence_parallel=True).sequence_parallel
    assert from_name("hybrid", mesh={"data": 2, "tensor": 4}, sequence_parallel=True).tensor == 4


def test_the_planner_runs_its_sequence_parallel_rows():
    from shardkit.plan import Transformer, plan

    w = Transformer(layers=2, d_model=32, heads=8, vocab=16, seq=16, batch=16)
    p = plan(w, devices=8, hardware="cpu", sequence_parallel=True, max_stage=1)
    row = next(c for c in p.candidates if c.tensor > 1)
    assert row.sequence_parallel and row.runnable
    strategy = row.strategy()
    assert strategy.sequence_parallel and strategy.mesh_axes(8) == row.mesh_axes


def test_collective_matmul_runs_the_tensor_traffic_as_rings():
    trainer = trainer_for(CASES["tp8-overlap"])
    assert "collective matmul" in trainer.bound.description
    batch = trainer.place_batch(TASK.batch(0, batch_size=BATCH))
    kinds = inspect(trainer.compile_step(batch), mesh=trainer.mesh).by_kind()
    # 2 layers x 4 rings forward (before q/k/v and the MLP, after the attention output and
    # the MLP) and their 4 transposes backward, 7 steps each over tensor = 8; the head's
    # and embedding's collectives stay as they are
    assert kinds["collective-permute"]["count"] == 2 * 4 * 2 * 7
    expected = trainer.strategy.expected_collectives(trainer.mesh)
    assert frozenset({"collective-permute"}) in expected.required
    # the planner predicts the run with the same settings (`shardkit train`'s step audit)
    w = Transformer.from_gpt_config(CFG, batch=BATCH)
    assert evaluate(w, "cpu", **trainer.bound.layout()).layout == "tensor=8 +SP+CM"


def test_collective_matmul_without_sequence_parallelism_says_how_to_fix():
    with pytest.raises(ValueError, match="sequence_parallel=True, collective_matmul=True"):
        TensorParallel(collective_matmul=True)
    with pytest.raises(ValueError, match="sequence_parallel=True, collective_matmul=True"):
        Hybrid(data=2, tensor=4, collective_matmul=True)
    with pytest.raises(ValueError, match="--sequence-parallel"):
        from_name("tp", collective_matmul=True)


def test_auto_names_sequence_parallelism_when_it_is_what_keeps_every_layout_from_running():
    """The error blamed fsdp inside stages for a plan whose only layout was tensor + SP."""
    from shardkit.plan import NoValidLayoutError, Transformer, plan

    w = Transformer(name="t", layers=2, d_model=64, heads=4, vocab=16, seq=16, batch=7)
    planned = plan(w, devices=8, hardware="cpu", sequence_parallel=True)
    with pytest.raises(NoValidLayoutError, match=r"sequence parallelism inside pipeline stages"):
        planned.runnable_best()
