"""TensorBoard scalars and `jax.profiler` traces for `shardkit train`.

`ScalarWriter(folder)` writes each logged row (loss, accuracy, tokens/s, step time, MFU,
memory) as TensorBoard event files through tensorboardX (`pip install shardkit[tensorboard]`),
readable by `tensorboard --logdir folder`. `ProfileWindow("10:20", folder)` captures a
`jax.profiler` trace of steps 10 to 19 (open it with TensorBoard's profile plugin or Perfetto).
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping

import jax

from shardkit.errors import ShardkitValueError

__all__ = ["ProfileWindow", "ScalarWriter"]

# a row's keys -> TensorBoard tag names
_TAGS = {
    "loss": "train/loss",
    "accuracy": "train/accuracy",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "throughput/tokens_per_s",
    "step_time": "throughput/step_time_s",
    "mfu": "throughput/mfu",
    "memory_bytes": "memory/bytes_per_device",
}


class ScalarWriter:
    """Writes logged rows as TensorBoard scalars under `folder` (one event file per run).

    Raises:
        ShardkitValueError: tensorboardX is not installed (with the install line).
    """

    def __init__(self, folder: str | pathlib.Path):
        try:
            from tensorboardX import SummaryWriter  # optional: only with --tensorboard
        except ImportError as e:
            raise ShardkitValueError(
                "--tensorboard needs tensorboardX, which is not installed; fix: "
                "pip install 'shardkit[tensorboard]' (or pip install tensorboardX)."
            ) from e
        self.folder = pathlib.Path(folder)
        self._writer = SummaryWriter(str(self.folder))

    def write(self, step: int, row: Mapping[str, float]) -> None:
        for key, value in row.items():
            if key in _TAGS and value == value:  # NaN (unknown) is left out
                self._writer.add_scalar(_TAGS[key], float(value), global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class ProfileWindow:
    """Starts a `jax.profiler` trace before step START and stops it after step STOP - 1."""

    def __init__(self, window: tuple[int, int] | None, folder: str | pathlib.Path):
        self.window, self.folder, self.active = window, pathlib.Path(folder), False

    def before(self, step: int) -> None:
        if self.window is not None and step == self.window[0] and not self.active:
            self.folder.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.folder))
            self.active = True

    def after(self, step: int, outputs) -> None:
        """Called with the finished step's number (1-based) and its outputs."""
        if self.active and step >= self.window[1]:
            self.stop(outputs)

    def stop(self, outputs=None) -> None:
        if self.active:
            if outputs is not None:
                jax.block_until_ready(outputs)  # the traced steps' work ends inside the trace
            jax.profiler.stop_trace()
            self.active = False
