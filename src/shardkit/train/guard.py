"""What keeps a `shardkit train` run from being lost: folders, stops, signals, the metrics log.

* `claim_output`: a new run never takes another run's checkpoints or outputs without being
  asked; `hold_locks`: one run at a time per checkpoint folder (and per --out);
* `diverged` / `interrupted`: the one-line errors of a NaN/Inf stop and of a signal (after a
  save), with the exit code the command returns;
* `StopSignals`: SIGINT/SIGTERM become a flag the loop reads at the next step boundary;
  `StopAtOnce`: outside the loop they end the run at once with one line (its exit code);
* `MetricsLog`: each logged row appended to `metrics.jsonl` as it is logged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import signal
import threading
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from shardkit.common import format_bytes
from shardkit.errors import ShardkitError, ShardkitValueError
from shardkit.train.checkpoint import (
    Checkpointer,
    NonFiniteStateError,
    checkpoint_entries,
    checkpoint_path,
)
from shardkit.train.config import TrainConfig
from shardkit.train.lock import RunLock


class TrainingDivergedError(ShardkitError, FloatingPointError):
    """The loss or gradient norm became NaN or Inf; training stopped, nothing saved since."""


class RunInterrupted(ShardkitError, KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the run after saving a checkpoint; `exit_code` is 128 + the
    signal number (130, 143)."""

    def __init__(self, message: str, *, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def holds_checkpoints(folder: Any) -> bool:
    """Whether `folder` (a path or a "gs://" / "s3://" URL) holds checkpoints (step folders or
    unfinished saves; a user's own files do not count)."""
    return bool(checkpoint_entries(folder))


# what a run writes into --out besides its checkpoints (`metrics.jsonl` as it goes)
OUTPUT_FILES = ("metrics.jsonl", "summary.json", "metrics.json", "report.html")
_PLOTS = ("loss.png", "throughput.png")


def earlier_outputs(out: str | pathlib.Path) -> list[str]:
    """The files an earlier run wrote into `out` (an empty `metrics.jsonl` does not count)."""
    folder = pathlib.Path(out)
    return [n for n in OUTPUT_FILES if (folder / n).is_file() and (folder / n).stat().st_size]


def remove_outputs(out: str | pathlib.Path) -> list[str]:
    """Deletes what an earlier run wrote into `out` (--overwrite; checkpoints apart and a
    user's own files stay); returns the names deleted."""
    folder, gone = pathlib.Path(out), []
    for name in (*OUTPUT_FILES, *_PLOTS):
        if (folder / name).is_file():
            (folder / name).unlink()
            gone.append(name)
    return gone


def claim_output(cfg: TrainConfig) -> tuple[TrainConfig, str | None]:
    """The run's folders, never taking another run's checkpoints or outputs unasked.

    Without --resume, a checkpoint folder that holds checkpoints, or an --out that holds an
    earlier run's metrics, summary or report, is replaced only with --overwrite; under the
    default --out the run moves to the first free numbered folder (shardkit-train-2, -3,
    ...); an explicit folder is refused. Returns the config to use and a line saying what
    happened (None when nothing did).
    """
    folder = checkpoint_path(cfg.checkpoints)
    has_checkpoints, outputs = holds_checkpoints(folder), earlier_outputs(cfg.out)
    if cfg.resume:
        _refuse_resume_without_checkpoints(cfg, folder, has_checkpoints, outputs)
        return cfg, None
    if not has_checkpoints and not outputs:
        return cfg, None
    what = "checkpoints" if has_checkpoints else "outputs"
    if cfg.overwrite:
        where = folder if has_checkpoints else cfg.out
        return cfg, f"--overwrite: replacing the earlier run's {what} in {where}"
    default_out = TrainConfig.__dataclass_fields__["out"].default
    if cfg.checkpoint_dir is None and cfg.out == default_out:
        n = 2
        while pathlib.Path(f"{cfg.out}-{n}").exists():
            n += 1
        if jax.process_count() > 1:  # process 0 may have made its folder already: its choice
            n = int(multihost_utils.broadcast_one_to_all(np.int32(n)))
        new = dataclasses.replace(cfg, out=f"{cfg.out}-{n}")
        return new, (
            f"{cfg.out} holds an earlier run's {what}; this run writes to {new.out} "
            f"(--resume continues the earlier run, --overwrite replaces it)"
        )
    if has_checkpoints:
        raise ShardkitValueError(
            f"checkpoint folder {folder} already holds another run's checkpoints (steps "
            f"{sorted(p.name for p in checkpoint_entries(folder))[:5]}); fix: --resume to "
            "continue that run, --overwrite to replace it, or another --out / --checkpoint-dir."
        )
    raise ShardkitValueError(
        f"--out {cfg.out} already holds an earlier run's outputs ({', '.join(outputs)}), which "
        "this run would write over; fix: --resume to continue that run, --overwrite to replace "
        "them, or another --out."
    )


def _refuse_resume_without_checkpoints(cfg, folder, has_checkpoints, outputs) -> None:
    """--resume with no checkpoint, into an --out holding a finished run's summary or report:
    starting at step 0 would write over that run (its checkpoints are elsewhere or gone). A
    metrics log alone is a run lost before its first checkpoint: that one starts over."""
    finished = [n for n in outputs if n != "metrics.jsonl"]
    if has_checkpoints or not finished:
        return
    raise ShardkitValueError(
        f"--resume: {folder} holds no checkpoint, but --out {cfg.out} holds a finished run's "
        f"outputs ({', '.join(outputs)}), which starting at step 0 would write over; fix: "
        "--checkpoint-dir of that run's checkpoints, --overwrite to replace it, or another --out."
    )


def _available_bytes() -> int | None:
    """The host memory the kernel says is available (`MemAvailable`), None where unknown."""
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def refuse_host_overflow(compiled: Any) -> None:
    """Refuses, on CPU, a compiled step whose temporaries on all the simulated devices (which
    share the host's memory) exceed what the host has available: the kernel would otherwise
    kill the run at its first step without a word."""
    mem = compiled.memory_analysis() if jax.default_backend() == "cpu" else None
    available = _available_bytes()
    if mem is None or available is None:
        return
    n = jax.local_device_count()
    alias = getattr(mem, "alias_size_in_bytes", 0)
    need = n * (mem.temp_size_in_bytes + mem.output_size_in_bytes - alias)
    if need <= available:
        return
    raise ShardkitValueError(
        f"the compiled training step needs {format_bytes(need / n)} of temporaries per device, "
        f"{format_bytes(need)} for the {n} simulated devices that share this host, which has "
        f"{format_bytes(available)} available: the kernel would kill the run; fix: a smaller "
        "--batch or sequence (--length / --seq-len), --remat block, or fewer --devices."
    )


def already_done(cfg: TrainConfig, step: int) -> str:
    """The line for a run resumed at or past its last step: nothing is left to train."""
    return (
        f"the checkpoint in {cfg.checkpoints} is at step {step}, and --steps is {cfg.steps}: "
        "nothing to train; the run's summary, metrics and report are left as they are "
        f"(to train further: --resume --steps {max(step, cfg.steps) + 100})"
    )


def nothing_to_resume(ckpt: Checkpointer) -> str:
    """For --resume with no checkpoint in the folder: the line to print, as a first run of a
    job that always passes --resume starts at step 0. If earlier checkpoints were moved aside
    as failing their checks, starting over would silently replace that run: refused."""
    rejected = ckpt.rejected_dir
    if rejected.is_dir() and any(rejected.iterdir()):
        raise ShardkitValueError(
            f"--resume: no checkpoint left in {ckpt.directory}; the earlier ones failed their "
            f"checks and are in {rejected}, so this would start over at step 0; fix: move one "
            f"back by hand, or move {rejected} away once you have kept what you need and run "
            "again to start over."
        )
    return f"no checkpoint in {ckpt.directory} yet: starting at step 0"


def diverged(lr: float, ckpt: Checkpointer, step: int, m: dict) -> TrainingDivergedError:
    """The error that stops a run whose loss or gradient norm became NaN/Inf at `step`."""
    ckpt.wait()
    last = ckpt.latest_step()
    where = f"step {last} in {ckpt.directory}" if last is not None else "none yet"
    seen = ", ".join(f"{k} {m[k]:g}" for k in ("loss", "grad_norm") if k in m) or "NaN/Inf state"
    return TrainingDivergedError(
        f"step {step}: {seen}: training stopped, nothing saved since; the last good checkpoint "
        f"is {where}. Likely cause: a learning rate too high for this model and batch "
        f"(--lr {lr:g}) or bad values in the data; fix: --resume with a lower --lr, "
        "or --on-nonfinite skip to drop such steps."
    )


def interrupted(ckpt: Checkpointer, meta: dict, state: Any, signum: int) -> RunInterrupted:
    """Saves the state (unless NaN/Inf), waits for the save, and says where it is."""
    step = int(jax.device_get(state.step))
    with contextlib.suppress(NonFiniteStateError):  # the newest finite one stays the newest
        ckpt.save(state, meta=meta, force=step not in ckpt.all_steps())
    ckpt.wait()
    name = signal.Signals(signum).name
    return RunInterrupted(
        f"{name} at step {step}: saved checkpoint step {ckpt.latest_step()} in "
        f"{ckpt.directory}; continue with --resume.",
        exit_code=128 + signum,
    )


class MetricsLog:
    """Appends each logged row to a JSON Lines file (None: nothing written).

    A run that starts at step `start` keeps only the earlier rows already in the file: none
    for a fresh run, those up to the checkpoint it resumed from otherwise (a run killed after
    its last checkpoint logged steps that the resumed run logs again).
    """

    def __init__(self, path: pathlib.Path | None, *, start: int = 0):
        self.path = path
        self.earlier: list[dict] = []  # the rows kept, parsed: the resumed run's history so far
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if start and path.exists():
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    row = json.loads(line)
                    if row["step"] <= start:
                        kept.append(line + "\n")
                        self.earlier.append(row)
        path.write_text("".join(kept))

    def write(self, row: dict) -> None:
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")


class _SignalScope:
    """SIGINT and SIGTERM go to `self._handle` within the block, in a single process only:
    with several, JAX's preemption service owns SIGTERM and tells every rank at the same step
    (`reached_preemption_sync_point`); a rank stopping alone would hang the others."""

    _old: dict

    def _handle(self, signum, frame) -> None:
        raise NotImplementedError

    def __enter__(self):
        self._old = {}
        if threading.current_thread() is threading.main_thread() and jax.process_count() == 1:
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)


class StopSignals(_SignalScope):
    """Within the block (one process), SIGINT and SIGTERM set `signum` instead of stopping the
    process at once; the loop saves at the next step boundary. A second signal stops at once."""

    def __init__(self):
        self.signum = 0
        self._old: dict = {}

    def _handle(self, signum, frame):
        if self.signum:  # second signal: the user insists
            signal.signal(signum, self._old.get(signum, signal.SIG_DFL))
            signal.raise_signal(signum)
        self.signum = signum


# what `StopAtOnce` says (after the signal's name) before the loop, and after it
BEFORE_FIRST_STEP = (
    "before the first step: nothing was trained or saved; fix: run the command again."
)


def after_last_step(ckpt: Checkpointer) -> str:
    """What a signal after the training loop (evaluation, audit, report) leaves behind."""
    return (
        f"after the last step: its checkpoint is saved in {ckpt.directory}, but the summary and "
        "report were not written (--resume finds the run finished and writes nothing); fix: "
        "--overwrite trains it again with them."
    )


def hold_locks(cfg: TrainConfig) -> list[RunLock]:
    """The run's locks, held: its checkpoint folder, and its --out when the checkpoints are
    elsewhere (two runs with one --out would write one metrics log). Process 0 only; none in
    a bucket (no atomic create there)."""
    if jax.process_index() != 0:
        return []
    locks = []
    try:
        if "://" not in cfg.checkpoints:
            locks.append(RunLock(cfg.checkpoints).acquire())
        if cfg.checkpoint_dir is not None:
            locks.append(RunLock(cfg.out, name="run.lock").acquire())
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks


class StopAtOnce(_SignalScope):
    """Within the block (one process), SIGINT and SIGTERM raise `RunInterrupted` at once: one
    line saying `when` they came, exit status 128 + the signal, the `finally` blocks (the run
    lock) run. `StopSignals` takes over for the training loop; a second signal stops at once.

    Example:
        >>> with StopAtOnce("before the first step") as stop:   # doctest: +SKIP
        ...     compile_step()
        ...     stop.when = "after the last step"
    """

    def __init__(self, when: str):
        self.when = when
        self._old: dict = {}
        self._fired = False

    def _handle(self, signum, frame):
        if self._fired:  # second signal while cleaning up: the user insists
            signal.signal(signum, self._old.get(signum, signal.SIG_DFL))
            signal.raise_signal(signum)
            return
        self._fired = True
        raise RunInterrupted(
            f"{signal.Signals(signum).name} {self.when}", exit_code=128 + int(signum)
        )
