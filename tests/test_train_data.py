"""Data: the reversal task is deterministic and learnable only on its masked half; token files."""

import numpy as np
import pytest

from shardkit.train.data import ReverseTask, TeacherTask, TokenFile


def test_reverse_task_layout_and_determinism():
    task = ReverseTask(digits=10, length=4, seed=3)
    b = task.batch(7, batch_size=5)
    np.testing.assert_array_equal(b["inputs"], task.batch(7, batch_size=5)["inputs"])
    assert not np.array_equal(b["inputs"], task.batch(8, batch_size=5)["inputs"])
    seq = np.concatenate([b["inputs"], b["targets"][:, -1:]], axis=1)  # (B, 2n + 1)
    assert (seq[:, 4] == 10).all()  # separator
    np.testing.assert_array_equal(seq[:, 5:], seq[:, :4][:, ::-1])  # reversed digits
    np.testing.assert_array_equal(b["targets"][:, :-1], b["inputs"][:, 1:])  # shifted by one
    assert b["mask"][:, :4].sum() == 0 and (b["mask"][:, 4:] == 1).all()
    with pytest.raises(ValueError, match="digits >= 2"):
        ReverseTask(digits=1)


def test_token_file(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_bytes(bytes(range(200)) * 3)
    data = TokenFile(path=str(text), seq_len=16)
    b = data.batch(0, batch_size=4)
    assert data.vocab == 256 and b["inputs"].shape == (4, 16)
    np.testing.assert_array_equal(b["targets"][:, :-1], b["inputs"][:, 1:])
    ids = tmp_path / "ids.npy"
    np.save(ids, np.arange(100, dtype=np.int32) % 7)
    assert TokenFile(path=str(ids), seq_len=8).vocab == 7
    with pytest.raises(ValueError, match="fewer than seq_len"):
        TokenFile(path=str(ids), seq_len=100)
    with pytest.raises(FileNotFoundError, match="not found"):
        TokenFile(path=str(tmp_path / "nope.bin"))


def test_teacher_task_is_deterministic():
    a = TeacherTask(features=8, classes=3).batch(1, batch_size=4)
    b = TeacherTask(features=8, classes=3).batch(1, batch_size=4)
    np.testing.assert_array_equal(a["y"], b["y"])
    assert a["x"].shape == (4, 8) and a["y"].max() < 3
