"""Training metrics: history, throughput, an MFU estimate, and a rich progress bar."""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any


@dataclasses.dataclass
class History:
    """Per-log-interval records: step, loss, accuracy, seconds per step, tokens per second."""

    rows: list[dict[str, float]] = dataclasses.field(default_factory=list)

    def add(self, **row: float) -> None:
        self.rows.append(dict(row))

    def column(self, name: str) -> list[float]:
        return [r[name] for r in self.rows if name in r]

    def last(self, name: str, default: float = float("nan")) -> float:
        col = self.column(name)
        return col[-1] if col else default

    def median(self, name: str, default: float = 0.0) -> float:
        """The median of a column (the mean of the two middle values for an even count)."""
        col = self.column(name)
        return float(statistics.median(col)) if col else default


def host_matmul_flops(n: int = 512, repeats: int = 5) -> float:
    """Measured FLOP/s of an n x n float32 matmul on the first device (best of `repeats`).

    Simulated CPU devices share the host's cores, so this measured rate is the peak the MFU
    estimate divides by on CPU; on accelerators pass the datasheet peak instead.
    """
    import jax
    import jax.numpy as jnp

    x = jax.device_put(jnp.ones((n, n), jnp.float32), jax.devices()[0])
    f = jax.jit(lambda a: a @ a)
    f(x).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(x).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


class Progress:
    """Training progress: a rich progress bar in a terminal, plain lines in a log.

    A terminal gets the live bar (step, loss, accuracy, tokens/s, ETA). Anything else (output
    piped to a file, a SLURM log) gets one line per update, flushed at once, so the log shows
    progress while the run goes: ``step 40/200  loss 0.1234  tok/s 12,345  elapsed 3s  ETA 12s``.

    Args:
        total: steps to run.
        start: first step (when resuming).
        console: a `rich.console.Console` (its `is_terminal` picks bar or lines); None prints
            plain lines to stdout.
        enabled: False shows nothing.
    """

    def __init__(self, total: int, *, start: int = 0, console: Any = None, enabled: bool = True):
        self.total, self.console, self.enabled = total, console, enabled
        self.start, self._t0 = start, time.perf_counter()
        self._bar = None
        if console is not None and enabled and console.is_terminal:
            from rich.progress import (  # rich's progress widgets: only for a terminal
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=console,
            )
            self._task = self._bar.add_task("train", total=total, completed=start, stats="")

    def __enter__(self):
        if self._bar is not None:
            self._bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def update(self, step: int, **stats: float) -> None:
        if not self.enabled:
            return
        text = "  ".join(_fmt(k, v) for k, v in stats.items())
        if self._bar is not None:
            self._bar.update(self._task, completed=step, stats=text)
            return
        elapsed = time.perf_counter() - self._t0
        done = step - self.start
        eta = elapsed / done * (self.total - step) if done > 0 else float("nan")
        line = (
            f"step {step}/{self.total}  {text}  elapsed {_duration(elapsed)}  ETA {_duration(eta)}"
        )
        if self.console is None:
            print(line, flush=True)
        else:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            self.console.file.flush()


def _duration(seconds: float) -> str:
    if seconds != seconds:  # NaN: not known yet
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _fmt(key: str, value: float) -> str:
    if key == "skipped":  # a count of updates
        return f"{key} {int(value)}"
    if key in ("tok/s",):
        return f"{key} {value:,.0f}"
    return f"{key} {value:.4f}" if abs(value) < 100 else f"{key} {value:,.1f}"
