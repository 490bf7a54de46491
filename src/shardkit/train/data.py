"""Deterministic training data: a synthetic sequence-reversal task and a token-file reader.

Batches are NumPy dicts computed from (seed, step) alone, so a resumed run sees exactly the
batches an uninterrupted run would, on any mesh. `Trainer.place_batch` puts them on devices.

Multi-process: `batch(step, batch_size=B, rows=r)` returns rows `r` of the same global batch, so
each process loads only the rows of its own devices (`Trainer.load_batch`) and the global batch
is the same whatever the process count. The token-file reader reads only those windows; the
synthetic tasks draw the global batch's random numbers (cheap) and keep the rows.

The reversal task: a sequence is `n` random digits, a separator, then the digits reversed:
`[d1 .. dn, SEP, dn .. d1]`. The model reads it shifted by one and is scored (loss mask) only on
the reversed half, which it can only predict by attending back to the right position; the
first half is random and unlearnable. Accuracy is the share of reversed tokens predicted right.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from shardkit.errors import ShardkitValueError


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReverseTask:
    """Synthetic sequence reversal; a small GPT learns it to high accuracy in minutes on CPU.

    Attributes:
        digits: distinct digit tokens (ids 0 .. digits-1); the separator is id `digits`.
        length: digits per sequence; the model's sequence length is 2 * length.
        seed: data seed; batch `step` depends only on (seed, step).

    Raises:
        ValueError: if digits < 2 or length < 1.

    Example:
        >>> task = ReverseTask(digits=8, length=4)
        >>> b = task.batch(0, batch_size=2)
        >>> b["inputs"].shape, task.vocab, task.seq_len
        ((2, 8), 9, 8)
    """

    digits: int = 10
    length: int = 8
    seed: int = 0

    def __post_init__(self):
        if self.digits < 2 or self.length < 1:
            raise ShardkitValueError(
                f"ReverseTask(digits={self.digits}, length={self.length}) needs digits >= 2 "
                "and length >= 1; fix: ReverseTask(digits=10, length=8)."
            )

    @property
    def vocab(self) -> int:
        return self.digits + 1

    @property
    def seq_len(self) -> int:
        return 2 * self.length

    def batch(self, step: int, *, batch_size: int, rows=None) -> dict[str, np.ndarray]:
        """Returns {"inputs", "targets" (int32, (B, 2n)), "mask" (float32, (B, 2n))}.

        `rows` (indices or a slice of the global batch) keeps only those rows.
        """
        rng = np.random.default_rng([self.seed, int(step)])
        digits = _rows(rng.integers(0, self.digits, (batch_size, self.length)), rows)
        n = len(digits)
        sep = np.full((n, 1), self.digits)
        seq = np.concatenate([digits, sep, digits[:, ::-1]], axis=1).astype(np.int32)
        mask = np.zeros((n, self.seq_len), np.float32)
        mask[:, self.length :] = 1.0  # targets after the separator: the reversed digits
        return {"inputs": seq[:, :-1], "targets": seq[:, 1:], "mask": mask}


def _check_ids(path: str, tokens: np.ndarray) -> None:
    """Token ids must be a 1-D integer array of ids in [0, 2^31): anything else would train
    on garbage (floats truncated, negative ids wrapped) and report success."""
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ShardkitValueError(
            f"token file {path!r} holds a {tokens.dtype} array of shape {tokens.shape}, not a "
            "1-D array of integer token ids; fix: np.save(path, ids.astype(np.int32).ravel())."
        )
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= 2**31:
        raise ShardkitValueError(
            f"token file {path!r} holds ids from {lo} to {hi}; ids must be in [0, 2^31) (the "
            "vocabulary is the largest id + 1); fix: map the ids to 0..vocab-1 before saving."
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenFile:
    """Random windows from a token file: `.npy` (integer array) or any other file as bytes.

    Attributes:
        path: a `.npy` file of token ids, or a text/binary file read as bytes (vocab 256).
        seq_len: tokens per training sequence.
        seed: batch `step` depends only on (seed, step).

    Raises:
        ValueError: if the file holds fewer than seq_len + 1 tokens, or (a .npy file) not a
            1-D array of integer ids in [0, 2^31).
        FileNotFoundError: if `path` does not exist.

    Example:
        >>> data = TokenFile(path="corpus.txt", seq_len=64)  # doctest: +SKIP
        >>> data.batch(0, batch_size=8)["inputs"].shape
        (8, 64)
    """

    path: str
    seq_len: int = 64
    seed: int = 0

    def __post_init__(self):
        tokens = self._tokens()
        n = len(tokens)
        if tokens.dtype != np.uint8:  # raw bytes are ids 0..255 by construction
            _check_ids(self.path, tokens)
        if n < self.seq_len + 1:
            raise ShardkitValueError(
                f"token file {self.path!r} holds {n} tokens, fewer than seq_len + 1 = "
                f"{self.seq_len + 1}; fix: use a longer file or a smaller seq_len."
            )

    def _tokens(self) -> np.ndarray:
        path = pathlib.Path(self.path)
        if not path.exists():
            raise FileNotFoundError(f"token file {self.path!r} not found; fix: pass a real path.")
        if path.is_file() and path.stat().st_size == 0:
            raise ShardkitValueError(
                f"token file {self.path!r} is empty; fix: a file of token ids (.npy) or raw "
                "bytes (any other suffix)."
            )
        if path.suffix == ".npy":
            tokens = np.load(path, mmap_mode="r")
            if tokens.size == 0:
                raise ShardkitValueError(
                    f"token file {self.path!r} holds no tokens (shape {tokens.shape}); fix: save "
                    "a 1-D array of token ids, np.save(path, ids)."
                )
            return tokens
        return np.memmap(path, dtype=np.uint8, mode="r")

    @property
    def vocab(self) -> int:
        """256 for a byte file; the largest id + 1 for a .npy file."""
        tokens = self._tokens()
        return 256 if tokens.dtype == np.uint8 else int(tokens.max()) + 1

    def batch(self, step: int, *, batch_size: int, rows=None) -> dict[str, np.ndarray]:
        """Returns {"inputs", "targets", "mask"} windows of `seq_len` tokens.

        `rows` (indices or a slice of the global batch): read only those rows' windows.
        """
        tokens = self._tokens()
        rng = np.random.default_rng([self.seed, int(step)])
        starts = _rows(rng.integers(0, len(tokens) - self.seq_len, batch_size), rows)
        windows = np.stack([np.asarray(tokens[s : s + self.seq_len + 1]) for s in starts])
        windows = windows.astype(np.int32)
        return {
            "inputs": windows[:, :-1],
            "targets": windows[:, 1:],
            "mask": np.ones((len(starts), self.seq_len), np.float32),
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class TeacherTask:
    """Synthetic classification: Gaussian inputs labelled by a fixed random linear teacher.

    Example:
        >>> TeacherTask(features=784, classes=10).batch(0, batch_size=4)["x"].shape
        (4, 784)
    """

    features: int = 784
    classes: int = 10
    seed: int = 0

    def batch(self, step: int, *, batch_size: int, rows=None) -> dict[str, np.ndarray]:
        """Returns {"x": float32 (B, features), "y": int32 (B,)}; `rows` keeps those rows."""
        teacher = np.random.default_rng([self.seed, 2**31]).normal(
            size=(self.features, self.classes)
        )
        x = np.random.default_rng([self.seed, int(step)]).normal(size=(batch_size, self.features))
        x = _rows(x, rows)
        return {"x": x.astype(np.float32), "y": np.argmax(x @ teacher, -1).astype(np.int32)}


def _rows(array: np.ndarray, rows) -> np.ndarray:
    """`array[rows]` (all rows when `rows` is None)."""
    return array if rows is None else array[rows]
