"""Checkpoints with orbax: periodic, asynchronous, atomic, keep-last-N, restore onto any mesh.

A checkpoint holds the `TrainState` (step, params, optimizer state) plus JSON metadata (model
description, strategy, mesh). Restoring takes a target `Trainer`: the saved arrays are read
straight into the target's shardings, so a state saved with FSDP on 8 devices restores with
data x tensor 4x2 or on one device. Orbax writes each step to a temporary directory and renames
it when complete, so a crash mid-save never leaves a step that loads; leftovers are cleaned up.

With several processes (`shardkit.distributed`) every process calls `save` and `restore`:
each writes and reads only the shards of its own devices into one shared directory, so a
checkpoint written by 2 processes restores in 1 or 4, onto another mesh and strategy.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Mapping
from typing import Any

import jax

from shardkit.errors import ShardkitError, ShardkitValueError
from shardkit.train.trainer import TrainState


class CheckpointMismatchError(ShardkitError, ValueError):
    """A checkpoint whose tree structure or shapes differ from the target state."""


class Checkpointer:
    """Saves and restores `TrainState`s under a directory, one sub-directory per step.

    Args:
        directory: where checkpoints go (created if missing).
        save_every: `save(state)` writes when `state.step` is a multiple of this.
        max_to_keep: keep the newest N checkpoints (None keeps all).
        async_save: write in a background thread while training continues.

    Example:
        >>> ckpt = Checkpointer("/tmp/run/ckpt", save_every=100, max_to_keep=3)
        >>> ckpt.save(state, meta={"model": "gpt"})            # doctest: +SKIP
        >>> state = ckpt.restore(trainer)                       # latest, onto trainer's mesh
        >>> ckpt.close()

    See also: `Trainer`, orbax `CheckpointManager`.
    """

    def __init__(
        self,
        directory: str | pathlib.Path,
        *,
        save_every: int = 100,
        max_to_keep: int | None = 3,
        async_save: bool = True,
    ):
        import orbax.checkpoint as ocp

        if save_every < 1:
            raise ShardkitValueError(f"save_every={save_every} must be >= 1; fix: save_every=100.")
        self.directory = pathlib.Path(directory).absolute()
        self._ocp = ocp
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=save_every,
            max_to_keep=max_to_keep,
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,
            create=True,
        )
        handlers = {
            "state": ocp.StandardCheckpointHandler(),
            "meta": ocp.JsonCheckpointHandler(),
        }
        self.manager = ocp.CheckpointManager(
            self.directory, options=options, item_handlers=handlers
        )

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, state: TrainState, *, meta: Mapping[str, Any] | None = None, force=False):
        """Saves `state` if its step is due (or `force`); returns True when a save started."""
        step = int(jax.device_get(state.step))
        args = self._ocp.args.Composite(
            state=self._ocp.args.StandardSave(_as_dict(state)),
            meta=self._ocp.args.JsonSave(dict(meta or {})),
        )
        return bool(self.manager.save(step, args=args, force=force))

    def meta(self, step: int | None = None) -> dict:
        """The JSON metadata saved with a checkpoint."""
        step = self._step(step)
        out = self.manager.restore(
            step, args=self._ocp.args.Composite(meta=self._ocp.args.JsonRestore())
        )
        return dict(out["meta"] or {})

    def restore(self, trainer: Any, step: int | None = None) -> TrainState:
        """Restores a checkpoint into `trainer`'s layouts (any mesh, any strategy).

        Args:
            trainer: the target `Trainer`; its abstract state gives shapes and shardings.
            step: which checkpoint (default the latest).

        Raises:
            FileNotFoundError: if there is no checkpoint.
            CheckpointMismatchError: if the saved tree or shapes differ from the trainer's.
        """
        step = self._step(step)
        target = _as_dict(trainer.abstract_state)
        self._check(step, target)
        args = self._ocp.args.Composite(state=self._ocp.args.StandardRestore(target))
        out = self.manager.restore(step, args=args)["state"]
        return TrainState(out["step"], out["params"], out["opt_state"])

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are on disk."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()

    def _step(self, step):
        step = self.latest_step() if step is None else step
        if step is None or step not in self.manager.all_steps():
            raise FileNotFoundError(
                f"no checkpoint{'' if step is None else f' for step {step}'} in "
                f"{self.directory}; fix: train with --checkpoint-dir {self.directory} first, "
                f"or pick one of the saved steps {self.all_steps()}."
            )
        return step

    def _check(self, step: int, target: dict) -> None:
        saved = self.manager.item_metadata(step)["state"]
        want = _shapes(target)
        have = _shapes(saved)
        missing = sorted(set(want) - set(have))
        extra = sorted(set(have) - set(want))
        wrong = sorted(p for p in set(want) & set(have) if want[p] != have[p])
        if missing or extra or wrong:
            lines = [f"  missing in checkpoint: {p} {want[p]}" for p in missing[:5]]
            lines += [f"  not in target model: {p} {have[p]}" for p in extra[:5]]
            lines += [f"  shape {p}: checkpoint {have[p]} vs model {want[p]}" for p in wrong[:5]]
            raise CheckpointMismatchError(
                f"checkpoint step {step} in {self.directory} does not match the model "
                f"({len(missing)} missing, {len(extra)} extra, {len(wrong)} reshaped leaves):\n"
                + "\n".join(lines)
                + "\nfix: restore with the model configuration it was saved with (see "
                "Checkpointer.meta()), or start fresh in another --checkpoint-dir."
            )


def _as_dict(state: TrainState) -> dict:
    return {"step": state.step, "params": state.params, "opt_state": state.opt_state}


def _shapes(tree) -> dict[str, tuple]:
    flat = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda x: hasattr(x, "shape") and not isinstance(x, dict)
    )[0]
    out = {}
    for path, leaf in flat:
        key = "/".join(
            str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path
        )
        shape = getattr(leaf, "shape", None)
        if shape is not None:
            out[key] = tuple(shape)
        else:
            out[key] = ()
    return out


def n_bytes(tree) -> int:
    """Total bytes of the arrays in `tree` (global, not per device)."""
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))
