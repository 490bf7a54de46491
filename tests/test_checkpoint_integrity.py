"""Checkpoints that cannot be restored corrupt: digests, fallback, nothing good deleted.

Real orbax checkpoints on real files, damaged as a disk or a person damages them: bytes flipped
in an array data file, a data file truncated or deleted, the state folder gone, the metadata
garbled, an empty newer step folder. Each time `restore` refuses the damaged checkpoint, moves
it aside (never deletes it) and restores the newest good one, bit for bit.
"""

import gc
import json
import pathlib
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.mesh import make_mesh
from shardkit.models import MLP, classification_loss
from shardkit.strategies import FSDP, DataParallel
from shardkit.train.checkpoint import (
    CheckpointCorruptError,
    Checkpointer,
    CheckpointMismatchError,
    CheckpointRejectedWarning,
    NonFiniteStateError,
    checkpoint_entries,
    checkpoint_path,
)
from shardkit.train.data import TeacherTask
from shardkit.train.integrity import fingerprint
from shardkit.train.trainer import Trainer

TASK = TeacherTask(features=16, classes=4)


def make(strategy=None):
    return Trainer(
        lambda k: MLP((16, 64, 4), rngs=nnx.Rngs(k)), optax.adam(1e-2), classification_loss,
        strategy=strategy or DataParallel(),
    )  # fmt: skip


def run(trainer, ckpt, steps):
    """Trains `steps` steps, saving when due; returns the host copy of every saved state."""
    state, saved = trainer.init(0), {}
    for i in range(steps):
        state, _ = trainer.step(state, trainer.place_batch(TASK.batch(i, batch_size=16)))
        if ckpt.save(state):
            saved[i + 1] = jax.tree.leaves(jax.device_get(state))
    ckpt.wait()
    return saved


def host(state):
    return jax.tree.leaves(jax.device_get(state))


def test_digests_do_not_depend_on_the_sharding_and_see_one_flipped_bit():
    mesh = make_mesh({"data": 8})
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    split = jax.device_put(x, NamedSharding(mesh, P("data", None)))
    whole = jax.device_put(x, NamedSharding(mesh, P()))
    tree = {"w": split, "b": jnp.arange(5, dtype=jnp.bfloat16), "i": jnp.int32(3)}
    digests, bad = fingerprint(tree)
    assert digests["w"] == fingerprint({"w": whole})[0]["w"] and bad == []
    flipped = x.copy()
    flipped.view(np.uint32)[17, 3] ^= 1 << 9
    assert fingerprint({"w": flipped})[0]["w"] != digests["w"]
    assert fingerprint({"w": x.T.copy().T})[0]["w"] == digests["w"]  # memory order is not content
    x[0, 0] = np.nan
    assert fingerprint({"w": x})[1] == ["w"]


def _data_files(step_dir: pathlib.Path) -> list[pathlib.Path]:
    files = [f for f in step_dir.glob("state/**/d/*") if f.is_file()]
    assert files, sorted(str(p) for p in step_dir.rglob("*"))
    return sorted(files, key=lambda f: f.stat().st_size)


def _flip(step_dir):
    for f in _data_files(step_dir)[-4:]:  # 16 bytes in four places of the largest data files
        raw = bytearray(f.read_bytes())
        for frac in (0.3, 0.5, 0.7, 0.9):
            at = int(len(raw) * frac)
            raw[at : at + 4] = bytes(b ^ 0xA5 for b in raw[at : at + 4])
        f.write_bytes(bytes(raw))


def _truncate(step_dir):
    for f in _data_files(step_dir)[-4:]:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _delete_data(step_dir):
    for f in _data_files(step_dir):
        f.unlink()


def _delete_state(step_dir):
    import shutil

    shutil.rmtree(step_dir / "state")


def _garble_meta(step_dir):
    meta = next(step_dir.glob("meta/*"))
    meta.write_text("{ not json")


DAMAGE = {"flip": _flip, "truncate": _truncate, "delete-data": _delete_data,
          "delete-state": _delete_state, "garble-meta": _garble_meta}  # fmt: skip


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_newest_checkpoint_is_moved_aside_and_the_previous_one_restored(tmp_path, damage):
    folder = tmp_path / "ckpt"
    ckpt = Checkpointer(folder, save_every=2, max_to_keep=3)
    saved = run(make(), ckpt, 6)
    assert ckpt.all_steps() == [2, 4, 6]  # orbax also saved step 1 first; keep 3 rotated it
    DAMAGE[damage](folder / "6")
    ckpt.close()

    ckpt = Checkpointer(folder, save_every=2, max_to_keep=3)
    with pytest.raises(CheckpointCorruptError, match="step 6"):
        ckpt.restore(make(), step=6)  # a step asked for by number fails loudly
    assert (folder / "6").exists()  # ... and is left where it is
    with pytest.warns(CheckpointRejectedWarning, match=r"step 6 .*moved it to .*ckpt.rejected"):
        state = ckpt.restore(make())
    assert int(state.step) == 4
    for a, b in zip(host(state), saved[4], strict=True):
        np.testing.assert_array_equal(a, b)  # the good checkpoint, bit for bit
    assert ckpt.all_steps() == [2, 4] and [s for s, _, _ in ckpt.rejected] == [6]
    assert (tmp_path / "ckpt.rejected" / "6").is_dir()  # kept, not deleted
    ckpt.close()


def test_a_failed_read_prints_one_error_not_an_echo_per_array(tmp_path, monkeypatch):
    # orbax closes its asyncio loop when a read fails; the reads still in flight then report to
    # the closed loop ("Event loop is closed"), which Python prints as unraisable exceptions.
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)  # the user's hook
    folder = tmp_path / "ckpt"
    ckpt = Checkpointer(folder, save_every=2)
    run(make(), ckpt, 4)
    _flip(folder / "4")
    ckpt.close()
    ckpt = Checkpointer(folder, save_every=2)
    with pytest.raises(CheckpointCorruptError, match="step 4"):
        ckpt.restore(make(), step=4)
    with pytest.warns(CheckpointRejectedWarning, match="step 4"):
        assert int(ckpt.restore(make()).step) == 2
    ckpt.close()
    time.sleep(0.5)  # the failed reads finish on tensorstore's threads
    gc.collect()
    assert [repr(a.exc_value) for a in seen] == []

    class Broken:
        def __del__(self):
            raise KeyError("any other unraisable exception")

    Broken()  # ... still reaches the user's hook
    assert [type(a.exc_value) for a in seen] == [KeyError]


def test_an_empty_newer_step_folder_does_not_stop_a_resume(tmp_path):
    folder = tmp_path / "ckpt"
    ckpt = Checkpointer(folder, save_every=2)
    saved = run(make(), ckpt, 4)
    ckpt.close()
    (folder / "8").mkdir()
    ckpt = Checkpointer(folder, save_every=2)
    with warnings.catch_warnings():  # orbax may list the folder; then it is moved aside
        warnings.simplefilter("ignore", CheckpointRejectedWarning)
        state = ckpt.restore(make())
    assert int(state.step) == 4
    for a, b in zip(host(state), saved[4], strict=True):
        np.testing.assert_array_equal(a, b)
    ckpt.close()


def test_every_checkpoint_damaged_is_one_clear_error(tmp_path):
    folder = tmp_path / "ckpt"
    ckpt = Checkpointer(folder, save_every=2)
    run(make(), ckpt, 4)
    steps = ckpt.all_steps()
    assert steps == [1, 2, 4]  # orbax saves the first step too
    ckpt.close()
    for step in steps:
        _flip(folder / str(step))
    ckpt = Checkpointer(folder, save_every=2)
    with (
        pytest.warns(CheckpointRejectedWarning),
        pytest.raises(
            CheckpointCorruptError, match=r"passes its check.*step 4.*step 2.*step 1.*fix:"
        ),
    ):
        ckpt.restore(make())
    assert sorted(p.name for p in (tmp_path / "ckpt.rejected").iterdir()) == ["1", "2", "4"]
    ckpt.close()


def test_a_non_finite_state_is_never_saved_so_rotation_keeps_the_good_ones(tmp_path):
    folder = tmp_path / "ckpt"
    trainer = make(FSDP())
    ckpt = Checkpointer(folder, save_every=1, max_to_keep=2)
    state = trainer.init(0)
    for i in range(3):
        state, _ = trainer.step(state, trainer.place_batch(TASK.batch(i, batch_size=16)))
        ckpt.save(state)
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3]
    poisoned = state._replace(
        step=state.step + 1, params=jax.tree.map(lambda p: p * jnp.nan, state.params)
    )
    with pytest.raises(
        NonFiniteStateError, match=r"step 4: .*NaN or Inf.*newest finite one is step 3"
    ):
        ckpt.save(poisoned)
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3]  # nothing written, nothing rotated out
    assert int(ckpt.restore(trainer).step) == 3
    ckpt.close()


@pytest.mark.parametrize("keep", [0, -1])  # 1.5: test_checkpoint_branch
def test_keep_must_leave_a_checkpoint(tmp_path, keep):
    with pytest.raises(ValueError, match=r"max_to_keep=.* would delete every checkpoint.*fix"):
        Checkpointer(tmp_path / "c", max_to_keep=keep)


def test_bucket_urls_stay_urls_and_local_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert str(checkpoint_path("gs://bucket/run")) == "gs://bucket/run"
    assert str(checkpoint_path("s3://bucket/run/ckpt")) == "s3://bucket/run/ckpt"
    assert str(checkpoint_path("rel/ckpt")) == str(tmp_path / "rel" / "ckpt")
    assert str(checkpoint_path(f"file://{tmp_path}/a%20b")) == str(tmp_path / "a b")
    assert not (tmp_path / "gs:").exists()


def test_a_file_url_checkpoint_saves_and_restores_where_it_names(tmp_path):
    ckpt = Checkpointer(f"file://{tmp_path}/url-ckpt", save_every=2)
    saved = run(make(), ckpt, 2)
    ckpt.close()
    assert sorted(p.name for p in (tmp_path / "url-ckpt").iterdir()) == ["1", "2"]
    ckpt = Checkpointer(f"file://{tmp_path}/url-ckpt")
    for a, b in zip(host(ckpt.restore(make())), saved[2], strict=True):
        np.testing.assert_array_equal(a, b)
    ckpt.close()


def test_old_checkpoints_without_digests_still_restore_with_a_warning(tmp_path):
    folder = tmp_path / "ckpt"
    ckpt = Checkpointer(folder, save_every=2)
    saved = run(make(), ckpt, 2)
    ckpt.close()
    meta = next((folder / "2" / "meta").glob("*"))
    data = json.loads(meta.read_text())
    data.pop("shardkit")
    meta.write_text(json.dumps(data))
    ckpt = Checkpointer(folder, save_every=2)
    with pytest.warns(CheckpointRejectedWarning, match="no digests"):
        state = ckpt.restore(make())
    for a, b in zip(host(state), saved[2], strict=True):
        np.testing.assert_array_equal(a, b)
    ckpt.close()


def test_saving_a_step_that_exists_is_a_no_op_for_the_same_state_and_an_error_otherwise(
    tmp_path,
):
    import optax
    from flax import nnx

    from shardkit.models import MLP, classification_loss
    from shardkit.strategies import DataParallel
    from shardkit.train import Checkpointer, Trainer

    trainer = Trainer(lambda k: MLP((8, 16, 4), rngs=nnx.Rngs(k)), optax.adam(1e-2),
                      classification_loss, strategy=DataParallel())  # fmt: skip
    for attempt in range(2):  # a script run twice into one folder
        state = trainer.init(0)
        ckpt = Checkpointer(tmp_path / "c")
        saved = ckpt.save(state, force=True)
        ckpt.close()
        assert saved is (attempt == 0)
    other = trainer.init(1)  # other values under the same step
    ckpt = Checkpointer(tmp_path / "c")
    with pytest.raises(ValueError, match=r"step 0 already exists .* other values; fix:"):
        ckpt.save(other, force=True)
    ckpt.close()


@pytest.mark.parametrize("digests", [{}, None, "drop-one"])
def test_metadata_that_lost_its_digests_is_not_restored_unchecked(tmp_path, digests):
    folder = tmp_path / "ckpt"
    ckpt = Checkpointer(folder, save_every=2)
    run(make(), ckpt, 4)
    ckpt.close()
    meta = next((folder / "4" / "meta").glob("*"))
    data = json.loads(meta.read_text())
    if digests == "drop-one":
        data["shardkit"]["digests"].popitem()
    else:
        data["shardkit"]["digests"] = digests
    meta.write_text(json.dumps(data))  # a flipped byte in the data would now go unseen
    ckpt = Checkpointer(folder, save_every=2)
    with pytest.warns(CheckpointRejectedWarning, match=r"step 4 .*digests of \d+ of its"):
        state = ckpt.restore(make())
    assert int(state.step) == 2 and (tmp_path / "ckpt.rejected" / "4").is_dir()
    ckpt.close()


def _dict_trainer(dtype):
    return Trainer(
        lambda key: {"w": jax.random.normal(key, (8, 16)).astype(dtype)}, optax.sgd(0.1),
        lambda p, b: jnp.mean(p["w"].astype(jnp.float32) ** 2), strategy=DataParallel(),
    )  # fmt: skip


def test_a_checkpoint_of_another_dtype_is_a_mismatch_and_stays_in_place(tmp_path):
    folder = tmp_path / "ckpt"
    ckpt = Checkpointer(folder, save_every=1)
    ckpt.save(_dict_trainer(jnp.float32).init(0), force=True)
    ckpt.close()
    ckpt = Checkpointer(folder, save_every=1)
    with pytest.raises(
        CheckpointMismatchError,
        match=r"params/w: checkpoint \(8, 16\) float32 vs model \(8, 16\) bfloat16",
    ):
        ckpt.restore(_dict_trainer(jnp.bfloat16))
    assert ckpt.all_steps() == [0] and not (tmp_path / "ckpt.rejected").exists()
    ckpt.close()


def test_a_users_folder_named_like_a_step_is_never_rotated_away(tmp_path):
    folder = tmp_path / "ckpt"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "README.txt").write_text("my notes")
    (folder / "notes.txt").write_text("mine too")
    with pytest.raises(
        ValueError, match=r"holds 1/ \(with \['README.txt'\]\), named like a checkpoint step"
    ):
        Checkpointer(folder, save_every=1, max_to_keep=1)
    assert checkpoint_entries(folder) == []  # neither is a checkpoint
    (folder / "1" / "README.txt").unlink()
    (folder / "1").rmdir()
    ckpt = Checkpointer(folder, save_every=2, max_to_keep=1)
    run(make(), ckpt, 4)
    assert sorted(p.name for p in checkpoint_entries(folder)) == ["4"]
    assert (folder / "notes.txt").read_text() == "mine too"
    ckpt.close()


def test_a_renamed_step_folder_is_not_resumed_under_the_wrong_step(tmp_path):
    """Folder 6 renamed to 9 passes its digests but would resume as step 9 (and orbax would
    then skip saves up to 9): it is refused by number, moved aside, and 4 is restored."""
    folder = tmp_path / "ckpt"
    ckpt = Checkpointer(folder, save_every=2, max_to_keep=3)
    saved = run(make(), ckpt, 6)
    ckpt.close()
    (folder / "6").rename(folder / "9")
    ckpt = Checkpointer(folder, save_every=2, max_to_keep=3)
    with pytest.raises(CheckpointCorruptError, match=r"folder 9 .* holds the state of step 6.*fix"):
        ckpt.restore(make(), step=9)
    with pytest.warns(CheckpointRejectedWarning, match="step 6"):
        state = ckpt.restore(make())
    assert int(state.step) == 4 and [s for s, _, _ in ckpt.rejected] == [9]
    for a, b in zip(host(state), saved[4], strict=True):
        np.testing.assert_array_equal(a, b)
    assert (tmp_path / "ckpt.rejected" / "9").is_dir()
    ckpt.close()
