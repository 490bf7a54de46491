"""Sharded training: `Trainer`, checkpoints that reshard, data, metrics, the `shardkit train` run.

Names are imported on first use so `shardkit train --help` does not start JAX.

Example:
    >>> import optax
    >>> from flax import nnx
    >>> from shardkit.models import GPT, GPTConfig, lm_loss
    >>> from shardkit.strategies import Hybrid
    >>> from shardkit.train import Trainer, ReverseTask
    >>> task = ReverseTask(digits=15, length=8)
    >>> cfg = GPTConfig(vocab=task.vocab, d_model=32, n_layers=2, n_heads=4, seq_len=16)
    >>> trainer = Trainer(lambda k: GPT(cfg, rngs=nnx.Rngs(k)), optax.adam(3e-3), lm_loss,
    ...                   strategy=Hybrid(fsdp=4, tensor=2))
    >>> state = trainer.init(0)
    >>> state, metrics = trainer.step(state, trainer.place_batch(task.batch(0, batch_size=16)))
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Trainer": "shardkit.train.trainer",
    "TrainState": "shardkit.train.trainer",
    "BatchSizeError": "shardkit.train.batches",
    "Linen": "shardkit.train.adapters",
    "ImportReport": "shardkit.train.orbax_io",
    "import_orbax": "shardkit.train.orbax_io",
    "export_orbax": "shardkit.train.orbax_io",
    "Checkpointer": "shardkit.train.checkpoint",
    "CheckpointMismatchError": "shardkit.train.checkpoint",
    "CheckpointCorruptError": "shardkit.train.checkpoint",
    "CheckpointRejectedWarning": "shardkit.train.checkpoint",
    "NonFiniteStateError": "shardkit.train.checkpoint",
    "TrainingDivergedError": "shardkit.train.guard",
    "RunInterrupted": "shardkit.train.guard",
    "RunLock": "shardkit.train.lock",
    "RunLockedError": "shardkit.train.lock",
    "ReverseTask": "shardkit.train.data",
    "TokenFile": "shardkit.train.data",
    "TeacherTask": "shardkit.train.data",
    "TrainConfig": "shardkit.train.config",
    "train": "shardkit.train.run",
    "RunResult": "shardkit.train.run",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'shardkit.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
