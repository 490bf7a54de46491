"""Checkpoints with orbax: periodic, asynchronous, atomic, keep-last-N, restore onto any mesh.

A checkpoint holds the `TrainState` (step, params, optimizer state) plus JSON metadata (model
description, strategy, mesh). Restoring takes a target `Trainer`: the saved arrays are read
straight into the target's shardings, so a state saved with FSDP on 8 devices restores with
data x tensor 4x2 or on one device. Orbax writes each step to a temporary directory and renames
it when complete, so a crash mid-save never leaves a step that loads; leftovers are cleaned up.

With several processes (`shardkit.distributed`) every process calls `save` and `restore`:
each writes and reads only the shards of its own devices into one shared directory, so a
checkpoint written by 2 processes restores in 1 or 4, onto another mesh and strategy.

Nothing is restored unchecked and nothing good is thrown away:

* every save records a digest of each array (`shardkit.train.integrity`, independent of the
  sharding); `restore` recomputes them on the restored arrays, so a flipped byte, a truncated
  or missing data file or garbled metadata is caught. Without an explicit step, restore falls
  back to the newest checkpoint that passes, and moves each failing one aside into the sibling
  folder `<directory>.rejected/` (never deleted), with a `CheckpointRejectedWarning` naming it;
* a state holding NaN or Inf is never saved (`NonFiniteStateError`), so rotation (`max_to_keep`
  >= 1) only ever drops older finite checkpoints and the newest finite one is always kept;
* directories are `etils.epath` paths, so "gs://bucket/run" and "s3://..." reach the bucket
  (with the matching filesystem package installed) and local paths stay local.
"""

from __future__ import annotations

import math
import numbers
import pathlib
import sys
import traceback
import urllib.parse
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from shardkit.common import path_str
from shardkit.errors import ShardkitError, ShardkitValueError
from shardkit.train.integrity import fingerprint
from shardkit.train.trainer import TrainState

_FORMAT = 1  # the layout of shardkit's entry in a checkpoint's metadata


class CheckpointMismatchError(ShardkitError, ValueError):
    """A checkpoint whose tree structure or shapes differ from the target state."""


class CheckpointCorruptError(ShardkitError, ValueError):
    """A checkpoint that cannot be read or whose arrays fail their recorded digests."""


class NonFiniteStateError(ShardkitError, ValueError):
    """A training state with NaN or Inf values, which is never saved as a checkpoint."""


class CheckpointSupersededWarning(ShardkitError, UserWarning):
    """Checkpoints newer than a step saved after restoring an older one (a run that went back)
    were moved aside into `<directory>.superseded/`, kept, not deleted."""


class CheckpointRejectedWarning(ShardkitError, UserWarning):
    """A checkpoint was not restored as it is: it failed its check (moved aside, an older one
    used instead), or it has no digests to check (written by an earlier shardkit)."""


def _is_closed_loop_echo(args: Any) -> bool:
    """Whether an unraisable exception is a read of a failed orbax restore reporting to the
    asyncio loop orbax has already closed (tensorstore's threads call `call_soon_threadsafe`)."""
    error = args.exc_value
    if not isinstance(error, RuntimeError) or str(error) != "Event loop is closed":
        return False
    frames = traceback.extract_tb(args.exc_traceback or error.__traceback__)
    return any(f.name == "call_soon_threadsafe" for f in frames)


def _drop_closed_loop_echoes() -> None:
    """Makes `sys.unraisablehook` drop the echoes of a failed read (`_is_closed_loop_echo`).

    orbax reads a checkpoint inside an asyncio loop and closes the loop when a read fails; the
    reads still in flight finish later on tensorstore's threads and report to the closed loop,
    and Python prints each as "Exception ignored ... RuntimeError: Event loop is closed", up
    to one per array, even after `restore` has returned. The failure itself is reported once
    (`CheckpointCorruptError` or the rejection warning), so these echoes are dropped; every
    other unraisable exception reaches the hook that was in place. Installed once per process
    (again if the hook has been replaced since) by each `restore`.
    """
    previous = sys.unraisablehook
    if getattr(previous, "_shardkit_drops_closed_loop_echoes", False):
        return

    def hook(args: Any) -> None:
        if not _is_closed_loop_echo(args):
            previous(args)

    hook._shardkit_drops_closed_loop_echoes = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def checkpoint_path(directory: str | pathlib.Path | epath.Path) -> epath.Path:
    """The checkpoint directory as an `etils.epath.Path`: "gs://", "s3://" (orbax writes
    there through tensorstore), "file://" URLs and plain paths (local, absolute).

    Example:
        >>> str(checkpoint_path("gs://bucket/run"))
        'gs://bucket/run'
    """
    text = str(directory)
    if text.startswith("file://"):  # a local filesystem URL: the path it names
        text = urllib.parse.unquote(urllib.parse.urlparse(text).path)
    elif "://" in text:
        return epath.Path(text)
    return epath.Path(pathlib.Path(text).absolute())


_ORBAX_ENTRIES = ("state", "meta", "_CHECKPOINT_METADATA", "commit_success.txt")


def _scan(directory: epath.Path) -> tuple[list[epath.Path], list[epath.Path]]:
    """One listing of a checkpoint folder: (its checkpoint entries, `foreign_steps`)."""
    entries, foreign = [], []
    for p in directory.iterdir() if directory.is_dir() else []:
        if not p.is_dir():
            continue
        if p.name.isdigit():
            names = {c.name for c in p.iterdir()}
            (foreign if names and not names & set(_ORBAX_ENTRIES) else entries).append(p)
        elif ".orbax-checkpoint-tmp" in p.name:
            entries.append(p)
    return entries, foreign


def checkpoint_entries(directory: Any) -> list[epath.Path]:
    """The entries of a checkpoint folder that are checkpoints: step folders (integer names,
    written by orbax) and unfinished saves (`<step>.orbax-checkpoint-tmp-*`). A user's own
    files and folders are not among them (see `foreign_steps`)."""
    return _scan(checkpoint_path(directory))[0]


def foreign_steps(directory: Any) -> list[epath.Path]:
    """Folders named like a checkpoint step that hold something but nothing orbax writes: a
    user's own folder ("1/", "2024/") that rotation (`max_to_keep`) would delete."""
    return _scan(checkpoint_path(directory))[1]


def refuse_foreign_steps(directory: Any) -> list[epath.Path]:
    """Raises when `foreign_steps` finds a user's folder among the checkpoint steps; returns
    the `checkpoint_entries` otherwise (from the same listing)."""
    directory = checkpoint_path(directory)
    entries, foreign = _scan(directory)
    if foreign:
        held = sorted(c.name for c in foreign[0].iterdir())[:3]
        raise ShardkitValueError(
            f"checkpoint folder {directory} holds {foreign[0].name}/ (with {held}), named like a "
            f"checkpoint step but not one: keeping the newest checkpoints would delete it; fix: "
            f"move it out of {directory}, or use another --checkpoint-dir."
        )
    return entries


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
        directory: str | pathlib.Path | epath.Path,
        *,
        save_every: int = 100,
        max_to_keep: int | None = 3,
        async_save: bool = True,
    ):
        save_every = _count("save_every", save_every, "save_every=100")
        if max_to_keep is not None:
            max_to_keep = _count("max_to_keep", max_to_keep, "max_to_keep=3, or None to keep all")
        if max_to_keep is not None and max_to_keep < 1:
            raise ShardkitValueError(
                f"max_to_keep={max_to_keep!r} would delete every checkpoint, including the one "
                "being resumed from; fix: max_to_keep=1 or more (--keep 3), or None to keep all."
            )
        if save_every < 1:
            raise ShardkitValueError(f"save_every={save_every} must be >= 1; fix: save_every=100.")
        self.save_every = save_every
        self._restored: int | None = None  # the step this Checkpointer last restored
        self.directory = checkpoint_path(directory)
        refuse_foreign_steps(self.directory)
        self.rejected: list[tuple[int, str, str]] = []  # (step, why, where it was moved)
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
        """Saves `state` if its step is due (or `force`); returns True when a save started.

        The metadata gets a digest of every array, checked by `restore`.

        Saving a step already on disk again is a no-op when the values are the same (a script
        run twice) and an error when they differ. After `restore(trainer, step=N)` of an older
        step, the first save of the run that goes on from it moves the newer steps aside into
        `<directory>.superseded/` (kept, with a `CheckpointSupersededWarning`): the newest
        checkpoint is then the new run's, and rotation never drops step N for them. A state
        that does not descend from such a restore is refused when newer steps exist.

        Raises:
            NonFiniteStateError: when the state holds NaN or Inf (nothing is written, so the
                newest finite checkpoint stays the newest).
            ValueError: the step exists in the folder with other values, or newer steps
                exist and this Checkpointer did not restore the older one it goes on from.
        """
        step = int(jax.device_get(state.step))
        latest = self.latest_step()
        due = self.manager.should_save(step) or (
            step % self.save_every == 0 and latest is not None and latest >= step
        )  # orbax's own check says no to any step at or before the latest on disk
        if not (force or due):
            return False
        digests, bad = fingerprint(_as_dict(state))
        if bad:
            raise NonFiniteStateError(
                f"step {step}: {len(bad)} arrays hold NaN or Inf ({', '.join(bad[:3])}), so no "
                f"checkpoint was written; the newest finite one is step {self.latest_step()} in "
                f"{self.directory}; fix: resume from it with a lower learning rate."
            )
        steps = self.all_steps()
        if step in steps:  # e.g. a script run twice into one folder
            saved = (self._shardkit_entry_quiet(step) or {}).get("digests")
            if saved == digests:
                return False  # this very state is already on disk
        later = [s for s in steps if s >= step]
        if later:
            self._supersede(step, later)
        entry = {"format": _FORMAT, "step": step, "digests": digests}
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(_as_dict(state)),
            meta=ocp.args.JsonSave({**dict(meta or {}), "shardkit": entry}),
        )
        return bool(self.manager.save(step, args=args, force=True))  # due, decided above

    def meta(self, step: int | None = None) -> dict:
        """The JSON metadata saved with a checkpoint (as given to `save`)."""
        meta = self._raw_meta(self._step(step))
        meta.pop("shardkit", None)
        return meta

    def _raw_meta(self, step: int) -> dict:
        out = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out["meta"] or {})

    def restore(self, trainer: Any, step: int | None = None) -> TrainState:
        """Restores a checkpoint into `trainer`'s layouts (any mesh, any strategy), checked.

        Every array is compared with the digest recorded when it was saved. Without `step`,
        the newest checkpoint that passes is restored: each newer one that fails is moved
        aside into `<directory>.rejected/` (kept, never deleted), listed in `self.rejected`
        and announced with a `CheckpointRejectedWarning`.

        Args:
            trainer: the target `Trainer`; its abstract state gives shapes and shardings.
            step: which checkpoint (default: the newest that passes its check).

        Raises:
            FileNotFoundError: if there is no checkpoint.
            CheckpointMismatchError: if the saved tree or shapes differ from the trainer's.
            CheckpointCorruptError: if `step` (or, without it, every checkpoint) fails.
        """
        _drop_closed_loop_echoes()
        if step is not None:
            state = self._restore_checked(self._step(step), trainer)
            self._restored = step
            return state
        self._step(None)  # raises FileNotFoundError when there is none
        for candidate in sorted(self.all_steps(), reverse=True):
            try:
                state = self._restore_checked(candidate, trainer)
                self._restored = candidate
                return state
            except CheckpointCorruptError as e:
                self._reject(candidate, str(e))
        raise CheckpointCorruptError(
            f"no checkpoint in {self.directory} passes its check; the failing ones are in "
            f"{self.rejected_dir}: "
            + "; ".join(f"step {s}: {why}" for s, why, _ in self.rejected)
            + "; fix: start a new run (--overwrite), or restore one by hand from there."
        )

    def _restore_checked(self, step: int, trainer: Any) -> TrainState:
        target = _as_dict(trainer.abstract_state)
        self._check(step, target)
        entry = self._shardkit_entry(step)
        args = ocp.args.Composite(state=ocp.args.StandardRestore(target))
        try:
            out = self.manager.restore(step, args=args)["state"]
        except Exception as e:  # noqa: BLE001 - orbax and tensorstore raise many kinds
            raise CheckpointCorruptError(
                f"checkpoint step {step} in {self.directory} cannot be read "
                f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
            ) from e
        digests, bad = fingerprint(out)
        saved = None if entry is None else entry.get("digests")
        if entry is not None and (not isinstance(saved, dict) or set(saved) != set(digests)):
            n = len(saved) if isinstance(saved, dict) else 0
            raise CheckpointCorruptError(
                f"checkpoint step {step} in {self.directory}: its metadata records digests of "
                f"{n} of its {len(digests)} arrays, so its content cannot be checked"
            )
        if saved is not None:
            wrong = sorted(p for p in saved if digests.get(p) != saved[p])
            if wrong:
                raise CheckpointCorruptError(
                    f"checkpoint step {step} in {self.directory}: {len(wrong)} arrays differ from "
                    f"the digests recorded when it was saved ({', '.join(wrong[:3])})"
                )
        saved_step = None if entry is None else entry.get("step")
        if saved_step is not None and saved_step != step:  # digests match: the name lies
            raise CheckpointCorruptError(
                f"checkpoint folder {step} in {self.directory} holds the state of step "
                f"{saved_step} (renamed or copied over?); resuming it as step {step} would "
                f"misnumber the run; fix: give it back its name, {saved_step}"
            )
        if bad:
            raise CheckpointCorruptError(
                f"checkpoint step {step} in {self.directory} holds NaN or Inf in "
                f"{', '.join(bad[:3])}"
            )
        return TrainState(out["step"], out["params"], out["opt_state"], out.get("model_state"))

    def _shardkit_entry(self, step: int) -> dict | None:
        """shardkit's metadata entry of `step` (None for checkpoints written before digests)."""
        try:
            meta = self._raw_meta(step)
        except Exception as e:  # noqa: BLE001 - a garbled or missing JSON file
            raise CheckpointCorruptError(
                f"checkpoint step {step} in {self.directory}: its metadata "
                f"{self.directory / str(step) / 'meta'} cannot be read ({type(e).__name__})"
            ) from e
        entry = meta.get("shardkit")
        if entry is None:
            warnings.warn(
                f"checkpoint step {step} in {self.directory} has no digests (written by an "
                "earlier shardkit, or its metadata lost shardkit's entry): restored without a "
                "content check.",
                CheckpointRejectedWarning,
                stacklevel=4,
            )
        return entry

    def _shardkit_entry_quiet(self, step: int) -> dict | None:
        try:
            return self._raw_meta(step).get("shardkit")
        except Exception:  # noqa: BLE001 - unreadable metadata: treated as other values
            return None

    @property
    def rejected_dir(self) -> epath.Path:
        """The sibling folder that failing checkpoints are moved into (never deleted)."""
        return self.directory.parent / f"{self.directory.name}.rejected"

    @property
    def superseded_dir(self) -> epath.Path:
        """The sibling folder that steps a restored older step goes on from are moved into."""
        return self.directory.parent / f"{self.directory.name}.superseded"

    def _move_aside(self, step: int, folder: epath.Path) -> epath.Path:
        """Moves checkpoint `step` into `folder` (process 0 moves, every process waits)."""
        dest = folder / str(step)
        if jax.process_index() == 0:
            folder.mkdir(parents=True, exist_ok=True)
            n = 1
            while dest.exists():
                n += 1
                dest = folder / f"{step}-{n}"
            (self.directory / str(step)).rename(dest)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"shardkit: checkpoint {step} moved aside")
        self.manager.reload()
        return dest

    def _supersede(self, step: int, later: list[int]) -> None:
        """Moves the steps at or after `step` aside, if the run goes on from a restore of an
        older step, and raises otherwise."""
        if self._restored is None or self._restored >= min(later):
            what = (
                f"step {step} already exists in {self.directory} and holds other values"
                if later == [step]
                else f"step {step}: {self.directory} holds steps {later} at or after it, from "
                "another run"
            )
            raise ShardkitValueError(
                f"checkpoint {what}; fix: save into a new folder (or start "
                f"the run with --overwrite), go on from the newest with ckpt.restore(trainer), "
                f"or from an older one with ckpt.restore(trainer, step=N), which moves the "
                f"later steps aside when the run saves."
            )
        self.manager.wait_until_finished()
        moved = [str(self._move_aside(s, self.superseded_dir)) for s in later]
        warnings.warn(
            f"step {step} goes on from step {self._restored}: the checkpoints "
            f"{', '.join(f'step {s}' for s in later)} of the run before were moved to "
            f"{', '.join(moved)} (kept, not deleted).",
            CheckpointSupersededWarning,
            stacklevel=3,
        )

    def _reject(self, step: int, why: str) -> None:
        """Moves a failing checkpoint aside into `rejected_dir`, and says so."""
        dest = self._move_aside(step, self.rejected_dir)
        self.rejected.append((step, why, str(dest)))
        warnings.warn(
            f"{why}; moved it to {dest} and fell back to an older checkpoint.",
            CheckpointRejectedWarning,
            stacklevel=3,
        )

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
        try:
            saved = self.manager.item_metadata(step)["state"]
        except Exception as e:  # noqa: BLE001 - a garbled or missing metadata file
            raise CheckpointCorruptError(
                f"checkpoint step {step} in {self.directory}: its array metadata cannot be "
                f"read ({type(e).__name__})"
            ) from e
        if saved is None:
            raise CheckpointCorruptError(
                f"checkpoint step {step} in {self.directory} has no state/ item"
            )
        want = _shapes(target)
        have = _shapes(saved)
        missing = sorted(set(want) - set(have))
        extra = sorted(set(have) - set(want))
        wrong = sorted(p for p in set(want) & set(have) if not _same_leaf(want[p], have[p]))
        if missing or extra or wrong:
            show = lambda leaf: " ".join(str(x) for x in leaf if x is not None)  # noqa: E731
            lines = [f"  missing in checkpoint: {p} {show(want[p])}" for p in missing[:5]]
            lines += [f"  not in target model: {p} {show(have[p])}" for p in extra[:5]]
            lines += [
                f"  {p}: checkpoint {show(have[p])} vs model {show(want[p])}" for p in wrong[:5]
            ]
            raise CheckpointMismatchError(
                f"checkpoint step {step} in {self.directory} does not match the model "
                f"({len(missing)} missing, {len(extra)} extra, {len(wrong)} reshaped or "
                f"retyped leaves):\n"
                + "\n".join(lines)
                + "\nfix: restore with the model configuration it was saved with (see "
                "Checkpointer.meta()), or start fresh in another --checkpoint-dir."
            )


def _as_dict(state: TrainState) -> dict:
    out = {"step": state.step, "params": state.params, "opt_state": state.opt_state}
    if state.model_state is not None:  # BatchNorm statistics, RNG streams
        out["model_state"] = state.model_state
    return out


def _shapes(tree) -> dict[str, tuple]:
    """Each leaf's `(shape, dtype name or None)`, by path."""
    flat = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda x: hasattr(x, "shape") and not isinstance(x, dict)
    )[0]
    out = {}
    for path, leaf in flat:
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            leaf = jax.eval_shape(jax.random.key_data, leaf)  # saved as its key data
            dtype = leaf.dtype
        shape = getattr(leaf, "shape", None)
        name = None if dtype is None else str(jax.numpy.dtype(dtype))
        out[path_str(path)] = (tuple(shape) if shape is not None else (), name)
    return out


def _same_leaf(want: tuple, have: tuple) -> bool:
    """Same shape, and the same dtype where both are known (restoring would cast otherwise,
    and the cast values would fail their digests as if corrupt)."""
    return want[0] == have[0] and (None in (want[1], have[1]) or want[1] == have[1])


def n_bytes(tree) -> int:
    """Total bytes of the arrays in `tree` (global, not per device)."""
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _count(name: str, value: Any, fix: str) -> int:
    """`value` as an int count (a Python or NumPy integer, not a bool), else an error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ShardkitValueError(
            f"{name}={value!r} ({type(value).__name__}) must be an int; fix: {fix}."
        )
    return int(value)
