"""Pipeline schedules side by side at p=4 stages and m=8 micro-batches: numbers and timelines.

Prints, for each schedule, the lockstep step table the executor runs (steps x lanes, idle
share) and the event simulation of the same op orders (makespan, bubble, bubble relative to
compute, peak micro-batches in flight per device), and writes the timeline pictures used by
docs/pipeline.md. No JAX, no devices: this is pure schedule arithmetic.

Costs: one stage's forward t_f = 1, input-gradient backward t_b = 1, weight-gradient t_w = 1,
so a full backward costs 2. Interleaved chunks hold half a stage each, so their ops cost half.
"lockstep" prices the table as SPMD runs it: each step lasts as long as its slowest device.

Run: python examples/pipeline_timelines.py [OUT_DIR]   (default docs/img)

Expected output:
    p=4 m=8; costs per stage: t_f=1 t_b=1 t_w=1 (full backward 2)
    schedule        steps lanes  idle makespan bubble per-compute lockstep in-flight
    gpipe              22     1 27.3%     33.0  27.3%       37.5%     33.0 8,8,8,8
    1f1b               14     2 27.3%     33.0  27.3%       37.5%     33.0 7,5,3,1
    1f1b-unfused       22     1 27.3%     33.0  27.3%       37.5%     40.0 4,3,2,1
    interleaved-v2     38     1 15.8%     28.5  15.8%       18.8%     34.0 11,9,7,5
    zb-h1              27     1 11.1%     27.0  11.1%       12.5%     27.0 4,4,4,4
    closed forms: (p-1)/(m+p-1) = 27.3%, (p-1)/m = 37.5%, (p-1)/(v*m) = 18.8%
    wrote pipeline_schedules.png pipeline_tables.png pipeline_bubble.png
"""

import pathlib
import sys

from shardkit.pipeline import (
    Costs,
    GPipe,
    Interleaved,
    OneFOneB,
    ZeroBubbleH1,
    plot,
    simulate,
    table,
)

P, M = 4, 8
SCHEDULES = [GPipe(), OneFOneB(), OneFOneB(fused=False), Interleaved(v=2), ZeroBubbleH1()]


def costs_for(schedule) -> Costs:
    """Per-chunk costs: a chunk of an interleaved schedule holds 1/v of a stage's layers."""
    v = schedule.virtual
    return Costs(t_f=1.0 / v, t_b=1.0 / v, t_w=1.0 / v)


def bubble_curve(path: pathlib.Path) -> None:
    """Bubble share of the step against m at p=4, 8: simulated points on the closed forms."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for p, colour in ((4, "#4c72b0"), (8, "#dd8452")):
        ms = list(range(p, 4 * p + 1, p))
        ax.plot(ms, [(p - 1) / (m + p - 1) for m in ms], color=colour,
                label=f"(p-1)/(m+p-1), p={p}")  # fmt: skip
        ax.plot(ms, [1 - (m - p + 1) / m for m in ms], color=colour, ls=":",
                label=f"seed's 1-(m-p+1)/m, p={p}")  # fmt: skip
        for schedule, marker in ((GPipe(), "o"), (OneFOneB(), "x"), (ZeroBubbleH1(), "s")):
            ys = [simulate(schedule, p, m, costs_for(schedule)).bubble for m in ms]
            ax.plot(ms, ys, marker, color=colour, ls="none", mfc="none",
                    label=f"simulated {schedule.name}" if p == 4 else None)  # fmt: skip
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble share of the step")
    ax.legend(fontsize=7, ncol=2)
    fig.savefig(path, dpi=110)


def main(out_dir: pathlib.Path, *, plots: bool = True) -> None:
    print(f"p={P} m={M}; costs per stage: t_f=1 t_b=1 t_w=1 (full backward 2)")
    print(
        f"{'schedule':15} {'steps':>5} {'lanes':>5} {'idle':>5} {'makespan':>8} {'bubble':>6} "
        f"{'per-compute':>11} {'lockstep':>8} in-flight"
    )
    timelines, tables = [], []
    for schedule in SCHEDULES:
        costs = costs_for(schedule)
        t, tl = table(schedule, P, M), simulate(schedule, P, M, costs)
        tables.append(t)
        timelines.append(tl)
        print(
            f"{schedule.name:15} {t.steps:5d} {t.lanes:5d} {t.idle_fraction:5.1%} "
            f"{tl.makespan:8.1f} {tl.bubble:6.1%} {tl.bubble_over_compute:11.1%} "
            f"{t.lockstep_time(costs):8.1f} {','.join(map(str, tl.peak_in_flight))}"
        )
    print(
        f"closed forms: (p-1)/(m+p-1) = {(P - 1) / (M + P - 1):.1%}, (p-1)/m = {(P - 1) / M:.1%}"
        f", (p-1)/(v*m) = {(P - 1) / (2 * M):.1%}"
    )
    if not plots:
        return
    plot(timelines, out_dir / "pipeline_schedules.png")
    plot(tables, out_dir / "pipeline_tables.png", share_time=False)
    bubble_curve(out_dir / "pipeline_bubble.png")
    print("wrote pipeline_schedules.png pipeline_tables.png pipeline_bubble.png")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img"))
