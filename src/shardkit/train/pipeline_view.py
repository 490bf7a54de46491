"""What a pipelined training step runs, for the console and the report: the schedule's
lockstep table (the one the executor scans over), its idle share, and the simulator's bubble.
"""

from __future__ import annotations

import pathlib
from typing import Any

from shardkit.pipeline import Costs, table
from shardkit.pipeline.plot import plot
from shardkit.pipeline.simulate import simulate


def pipeline_rows(pipe: Any, out_dir: str | pathlib.Path | None = None) -> dict[str, str]:
    """Rows describing `pipe`'s schedule; with `out_dir`, also writes `pipeline.png`.

    The measured bubble is the idle share of the executed step table (idle (step, device,
    lane) slots over all); the simulated one comes from `shardkit.pipeline.simulate` with
    t_f = t_b = t_w = 1 (a full backward costs t_b + t_w, ZB-H1's split halves 1 each); GPipe
    and 1F1B both give (p-1)/(m+p-1), interleaved (p-1)/(v*m+p-1).

    Example:
        >>> from shardkit.strategies import Pipeline
        >>> pipeline_rows(Pipeline(stages=4, schedule="gpipe", microbatches=8))["bubble"]
        'executed table 0.273 idle; simulator 0.273; (p-1)/(m+p-1) = 0.273'
    """
    p, m, schedule = pipe.stages, pipe.microbatches, pipe.schedule
    steps = table(schedule, p, m)
    sim = simulate(schedule, p, m, costs=Costs(t_f=1.0, t_b=1.0, t_w=1.0))
    v = pipe.virtual
    if v > 1:
        formula = f"; (p-1)/(v*m+p-1) = {(p - 1) / (v * m + p - 1):.3f}"
    elif schedule.name.startswith(("gpipe", "1f1b")):
        formula = f"; (p-1)/(m+p-1) = {(p - 1) / (m + p - 1):.3f}"
    else:
        formula = ""  # zero-bubble: W ops fill the bubble; see docs/pipeline.md
    rows = {
        "schedule": f"{schedule.name}: p={p} stages, m={m} micro-batches, v={v}",
        "step table": f"{steps.steps} lockstep steps x {steps.lanes} lane(s) per device",
        "bubble": f"executed table {steps.idle_fraction:.3f} idle; simulator {sim.bubble:.3f}"
        + formula,
        "peak micro-batches in flight": ", ".join(str(n) for n in sim.peak_in_flight),
    }
    if out_dir is not None:
        path = pathlib.Path(out_dir)
        path.mkdir(parents=True, exist_ok=True)
        plot(steps, path / "pipeline.png")
        rows["plot"] = "pipeline.png"
    return rows
