"""Gradient accumulation: one gradient reduction per step, the single-device numbers.

Every case compares with one device computing the whole batch at once (grad_accum=1).
float32 sums in another order: losses agree to ~1e-6, gradients to 2e-5 relative.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from reference import assert_equal_to, single_device

from shardkit.inspection import inspect
from shardkit.models import GPT, GPTConfig, lm_loss
from shardkit.strategies import FSDP, DataParallel, Hybrid, TensorParallel
from shardkit.train import ReverseTask, Trainer

TASK = ReverseTask(digits=15, length=8)
CFG = GPTConfig(vocab=TASK.vocab, d_model=32, n_layers=2, n_heads=4, seq_len=TASK.seq_len)
BATCH, ACCUM = 32, 4
STRATEGIES = {
    "dp": DataParallel(),
    "zero1": FSDP(zero=1),
    "zero3": FSDP(),
    "tp": TensorParallel(),
    "hybrid-zero3": Hybrid(data=2, fsdp=2, tensor=2),
    "hybrid-zero1": Hybrid(data=2, fsdp=2, tensor=2, zero=1),
}


def trainer_for(strategy, **kw):
    return Trainer(
        lambda k: GPT(CFG, rngs=nnx.Rngs(k)), optax.adam(1e-2), lm_loss, strategy=strategy, **kw
    )


@pytest.fixture(scope="module")
def reference():
    return single_device(trainer_for, TASK.batch(0, batch_size=BATCH))


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_accumulated_gradients_equal_the_single_device_ones(name, axis_types, reference):
    trainer = trainer_for(STRATEGIES[name], grad_accum=ACCUM, axis_types=axis_types)
    state = trainer.init(0)
    batch = trainer.place_batch(TASK.batch(0, batch_size=BATCH))
    (loss, _), grads = trainer.loss_and_grads(state.params, batch)
    assert_equal_to(reference, loss, grads)


def gradient_bytes(strategy, accum, axis_types="auto"):
    """Bytes each device sends per step in all-reduces and reduce-scatters (loops counted)."""
    trainer = trainer_for(strategy, grad_accum=accum, axis_types=axis_types)
    batch = trainer.place_batch(TASK.batch(0, batch_size=BATCH))
    report = inspect(trainer.compile_step(batch), mesh=trainer.mesh)
    kinds = report.by_kind()
    return sum(kinds.get(k, {"bytes": 0})["bytes"] for k in ("all-reduce", "reduce-scatter"))


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
@pytest.mark.parametrize("name", ["dp", "zero1"])
def test_gradients_are_reduced_once_per_step(name, axis_types):
    """4 micro-batches reduce the gradients once: the reduction bytes of one micro-batch,
    where reducing each micro-batch's gradients would send 4x."""
    once = gradient_bytes(STRATEGIES[name], 1, axis_types)
    accumulated = gradient_bytes(STRATEGIES[name], ACCUM, axis_types)
    params = 4 * CFG.n_params()
    assert once > params  # the gradients' all-reduce is in there: 2(n-1)/n x P
    assert accumulated == pytest.approx(once, rel=0.01), (accumulated, once)


def test_zero3_reduces_per_micro_batch_and_says_why():
    trainer = trainer_for(FSDP(), grad_accum=ACCUM)
    assert any("once per micro-batch" in n and "ZeRO-3" in n for n in trainer.notes)
    assert gradient_bytes(FSDP(), ACCUM) == pytest.approx(4 * gradient_bytes(FSDP(), 1), rel=0.01)
    # ZeRO-1 over fsdp and data, or tensor parallelism alone (no batch axis): nothing to note
    for name in ("hybrid-zero1", "tp", "dp"):
        notes = trainer_for(STRATEGIES[name], grad_accum=ACCUM).notes
        assert not any("micro-batch" in n for n in notes), (name, notes)


class Normed(nnx.Module):
    """A model with non-trained state (BatchNorm statistics)."""

    def __init__(self, rngs):
        self.linear = nnx.Linear(8, 4, rngs=rngs)
        self.norm = nnx.BatchNorm(4, rngs=rngs)

    def __call__(self, x):
        return self.norm(self.linear(x))


def test_a_model_with_state_reduces_per_micro_batch_and_says_why():
    trainer = Trainer(
        lambda k: Normed(nnx.Rngs(k)), optax.sgd(0.1),
        lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean(),
        strategy=DataParallel(), grad_accum=2,
    )  # fmt: skip
    assert any("non-trained state" in n for n in trainer.notes), trainer.notes
    state = trainer.init(0)
    rng = np.random.default_rng(0)
    batch = {"x": rng.normal(size=(16, 8)).astype("f4"), "y": rng.normal(size=(16, 4)).astype("f4")}
    state, metrics = trainer.step(state, trainer.place_batch(batch))
    assert np.isfinite(float(metrics["loss"]))


def _class_frequencies(params, batch):
    """A linear classifier whose metrics are a vector (class frequencies) and a matrix."""
    logits = batch["x"] @ params["w"]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    freq = jnp.stack([jnp.mean(batch["y"] == c) for c in range(4)])
    return loss, {"class_freq": freq, "outer": jnp.outer(freq, freq), "loss_copy": loss}


@pytest.mark.parametrize("name", ["dp", "zero1", "zero3", "hybrid-zero1"])
def test_vector_metrics_are_averaged_over_micro_batches_not_summed_over_elements(name):
    rng = np.random.default_rng(0)
    batch = {"x": rng.normal(size=(32, 16)).astype("f4"), "y": rng.integers(0, 4, 32)}
    batch["y"] = batch["y"].astype("i4")
    want = np.bincount(batch["y"], minlength=4) / 32
    strategy = STRATEGIES[name] if name != "hybrid-zero1" else Hybrid(data=2, fsdp=4, zero=1)
    init = lambda k: {"w": jax.random.normal(k, (16, 4)) * 0.3}  # noqa: E731
    got = {}
    for accum in (1, 2, 4):
        trainer = Trainer(init, optax.adam(1e-2), _class_frequencies, strategy=strategy,
                          grad_accum=accum)  # fmt: skip
        _, metrics = trainer.step(trainer.init(0), trainer.place_batch(batch))
        got[accum] = {k: np.asarray(v) for k, v in metrics.items()}
    for metrics in got.values():  # means over equal pieces of the batch: the whole's
        np.testing.assert_allclose(metrics["class_freq"], want, rtol=1e-6)
        np.testing.assert_allclose(metrics["loss_copy"], got[1]["loss_copy"], rtol=1e-5)
        outer = metrics["outer"]  # a mean of outer products of frequencies: within [0, 1]
        assert outer.shape == (4, 4) and outer.max() <= 1 and np.allclose(outer, outer.T)
