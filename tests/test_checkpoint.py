"""Checkpoints: exact resume, restore onto other meshes and strategies, clear mismatch errors."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from shardkit.models import GPT, GPTConfig, lm_loss
from shardkit.strategies import FSDP, DataParallel, Hybrid, TensorParallel
from shardkit.train.checkpoint import Checkpointer, CheckpointMismatchError
from shardkit.train.data import ReverseTask
from shardkit.train.trainer import Trainer

TASK = ReverseTask(digits=15, length=8)
CFG = GPTConfig(vocab=TASK.vocab, d_model=32, n_layers=2, n_heads=4, seq_len=TASK.seq_len)


def make(strategy, cfg=CFG, **kw):
    return Trainer(
        lambda k: GPT(cfg, rngs=nnx.Rngs(k)), optax.adam(1e-2), lm_loss, strategy=strategy, **kw
    )


def train(trainer, state, start, stop):
    losses = []
    for i in range(start, stop):
        state, m = trainer.step(state, trainer.place_batch(TASK.batch(i, batch_size=8)))
        losses.append(float(m["loss"]))
    return state, losses


def host(tree):
    return jax.tree.leaves(jax.device_get(tree))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An FSDP run on 8 devices: 6 uninterrupted steps, and a checkpoint after step 3."""
    folder = tmp_path_factory.mktemp("ckpt")
    trainer = make(FSDP())
    full, full_losses = train(trainer, trainer.init(0), 0, 6)
    ckpt = Checkpointer(folder, save_every=3)
    state, first = train(trainer, trainer.init(0), 0, 3)
    assert ckpt.save(state, meta={"strategy": "fsdp"})
    ckpt.wait()
    yield {
        "trainer": trainer,
        "ckpt": ckpt,
        "at3": host(state),
        "full": host(full),
        "losses": full_losses,
        "first": first,
    }
    ckpt.close()


def test_resume_is_bit_exact_on_the_same_mesh(saved):
    trainer = saved["trainer"]
    resumed = saved["ckpt"].restore(make(FSDP()))
    assert int(resumed.step) == 3
    resumed, rest = train(trainer, resumed, 3, 6)
    assert saved["first"] + rest == saved["losses"]  # bit for bit
    for a, b in zip(host(resumed), saved["full"]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "target",
    ["hybrid-4x2-explicit", "one-device", "tensor-8"],
)
def test_restore_onto_another_mesh_and_strategy(saved, target):
    ckpt = saved["ckpt"]
    if target == "hybrid-4x2-explicit":
        dest = make(Hybrid(data=4, tensor=2), axis_types="explicit")
    elif target == "one-device":
        dest = make(DataParallel(), devices=jax.devices()[:1])
    else:
        dest = make(TensorParallel())
    restored = ckpt.restore(dest)
    assert ckpt.meta() == {"strategy": "fsdp"}
    for a, b in zip(host(restored), saved["at3"]):
        np.testing.assert_array_equal(a, b)  # restore is exact
    for leaf, spec in zip(jax.tree.leaves(restored.params), jax.tree.leaves(dest.param_specs)):
        assert leaf.sharding.spec == spec and leaf.sharding.mesh == dest.mesh
    # training continues like the source run (float32, different reduction order: 1e-5)
    _, after = train(dest, restored, 3, 4)
    np.testing.assert_allclose(after, saved["losses"][3:4], rtol=1e-5)


def test_checkpoint_from_another_model_is_a_clear_error(tmp_path):
    trainer = make(DataParallel())
    ckpt = Checkpointer(tmp_path)
    ckpt.save(trainer.init(0), force=True)
    ckpt.wait()
    other = make(DataParallel(), cfg=GPTConfig(vocab=16, d_model=16, n_layers=2, n_heads=4))
    with pytest.raises(CheckpointMismatchError, match=r"does not match the model.*reshaped"):
        ckpt.restore(other)
    ckpt.close()


def test_missing_checkpoint_and_bad_options(tmp_path):
    ckpt = Checkpointer(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        ckpt.restore(make(DataParallel()))
    with pytest.raises(ValueError, match="save_every=0"):
        Checkpointer(tmp_path / "x", save_every=0)


def test_keep_last_n_and_unfinished_saves_are_ignored(tmp_path):
    trainer = make(DataParallel(), devices=jax.devices()[:1])
    ckpt = Checkpointer(tmp_path, save_every=1, max_to_keep=2)
    state = trainer.init(0)
    for i in range(4):
        state, _ = train(trainer, state, i, i + 1)
        ckpt.save(state)
    ckpt.wait()
    assert ckpt.all_steps() == [3, 4]
    ckpt.close()
    # a save killed half-way leaves only a temporary folder: never listed, cleaned up
    (tmp_path / "5.orbax-checkpoint-tmp-1").mkdir()
    (tmp_path / "5.orbax-checkpoint-tmp-1" / "junk").write_text("partial")
    again = Checkpointer(tmp_path, save_every=1)
    assert again.latest_step() == 4
    assert int(again.restore(trainer).step) == 4
    again.close()
