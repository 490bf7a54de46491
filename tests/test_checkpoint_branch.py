"""Checkpoints of a run that goes back: a restored older step trains on, and its saves neither
vanish silently nor rotate away the checkpoint it came from; the newer steps it supersedes are
moved aside, never deleted."""

import jax
import numpy as np
import optax
import pytest

from shardkit.errors import ShardkitValueError
from shardkit.strategies import DataParallel
from shardkit.train.checkpoint import Checkpointer, CheckpointSupersededWarning
from shardkit.train.trainer import Trainer

X = np.random.default_rng(0).normal(size=(8, 4)).astype("f4")


def trainer():
    return Trainer(
        lambda k: {"w": jax.random.normal(k, (4, 2))},
        optax.sgd(0.1),
        lambda p, b: ((b["x"] @ p["w"]) ** 2).mean(),
        strategy=DataParallel(),
        devices=jax.devices()[:2],
    )


def run(t, ckpt, state, steps, scale=1.0):
    for _ in range(steps):
        state, _ = t.step(state, t.place_batch({"x": X * scale}))
        ckpt.save(state)
    ckpt.wait()
    return state


@pytest.mark.parametrize("async_save", [True, False])
def test_a_run_restored_from_an_older_step_saves_and_keeps_its_origin(tmp_path, async_save):
    t = trainer()
    ckpt = Checkpointer(tmp_path / "ckpt", save_every=2, max_to_keep=2, async_save=async_save)
    run(t, ckpt, t.init(0), 6)
    assert ckpt.all_steps() == [4, 6]
    state = ckpt.restore(t, step=4)  # go back, and train on other data
    with pytest.warns(CheckpointSupersededWarning, match=r"step 6 .*ckpt.superseded"):
        branch = run(t, ckpt, state, 2, scale=2.0)
    assert ckpt.all_steps() == [4, 6]  # step 4, the origin, is kept; 6 is the new branch's
    assert (tmp_path / "ckpt.superseded" / "6").is_dir()  # the old step 6: kept aside
    again = ckpt.restore(t)  # what --resume (or a requeued job) restores: the new branch
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(branch), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ckpt.close()


def test_saving_an_older_step_into_another_runs_folder_is_refused(tmp_path):
    t = trainer()
    ckpt = Checkpointer(tmp_path / "ckpt", save_every=2, max_to_keep=1)
    run(t, ckpt, t.init(0), 4)
    ckpt.close()
    fresh = Checkpointer(tmp_path / "ckpt", save_every=2)  # a new run, same folder, no restore
    state, _ = t.step(t.init(1), t.place_batch({"x": X}))
    state, _ = t.step(state, t.place_batch({"x": X}))
    with pytest.raises(ShardkitValueError, match=r"step 2: .*holds steps \[4\] at or after.*fix:"):
        fresh.save(state)
    assert fresh.all_steps() == [4]  # nothing moved, nothing written
    fresh.close()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_to_keep": True}, r"max_to_keep=True"),
        ({"max_to_keep": "2"}, r"max_to_keep='2' .*an int"),
        ({"max_to_keep": 0}, r"max_to_keep=0 would delete"),
        ({"save_every": 1.5}, r"save_every=1.5 .*an int"),
        ({"save_every": True}, r"save_every=True"),
        ({"save_every": 0}, r"save_every=0"),
    ],
)
def test_checkpointer_options_are_checked(tmp_path, kwargs, match):
    with pytest.raises(ShardkitValueError, match=match):
        Checkpointer(tmp_path / "x", **kwargs)


def test_numpy_integers_are_ints(tmp_path):
    ckpt = Checkpointer(tmp_path / "x", save_every=np.int64(2), max_to_keep=np.int64(2))
    ckpt.close()
