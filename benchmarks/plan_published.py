"""The planner against published training runs: predicted vs published MFU, rank, fit.

Reads the runs in `tests/data/published_*.toml` (each with its source), plans every one with
the settings it ran with (`shardkit.plan.published.compare`) and prints one row per run: the
published layout, published and predicted MFU, their ratio, the published layout's rank among
the planner's layouts, the planner's first choice and whether the published configuration is
predicted to fit (with its memory margin). The last lines are the checks
`tests/test_plan_published.py` makes.

    python benchmarks/plan_published.py            # the table
    python benchmarks/plan_published.py --runtime shardkit   # every run as shardkit runs it
"""

from __future__ import annotations

import argparse
import pathlib
import statistics

from shardkit.plan.published import compare, load, not_modelled

DATA = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data"


def runs() -> list[dict]:
    """The published runs the planner models (`not_modelled` lists the others)."""
    return [r for r in load(*sorted(DATA.glob("published_*.toml"))) if not not_modelled(r)]


def skipped() -> list[tuple[str, str]]:
    """(id, reason) of the published runs outside the planner's model."""
    return [(r["id"], not_modelled(r)) for r in load(*sorted(DATA.glob("published_*.toml")))
            if not_modelled(r)]  # fmt: skip


def summary(rows) -> dict[str, float]:
    """The validation figures: median and worst |ratio - 1|, top-3 share, false "does not fit"."""
    errors = [abs(r.ratio - 1) for r in rows]
    return {
        "runs": len(rows),
        "median_error": statistics.median(errors),
        "worst_error": max(errors),
        "top3": sum(1 for r in rows if r.rank is not None and r.rank <= 3) / len(rows),
        "not_fit": sum(1 for r in rows if not r.fits),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default=None, help="predict every run with this runtime")
    args = parser.parse_args()
    overrides = {"runtime": args.runtime} if args.runtime else {}
    rows = [compare(run, **overrides) for run in runs()]
    head = f"{'run':34} {'hw x n':16} {'layout':40} {'pub':>5} {'pred':>5} {'ratio':>6} "
    print(head + f"{'rank':>4}  {'fits (margin)':14} planner's first choice")
    for r in rows:
        rank = "-" if r.rank is None else str(r.rank)
        fit = f"{'yes' if r.fits else 'NO'} ({r.margin:+.0%})"
        print(
            f"{r.id[:34]:34} {f'{r.hardware} x {r.devices}':16} {r.layout[:40]:40} "
            f"{r.published_mfu:5.1%} {r.predicted_mfu:5.1%} {r.ratio:6.2f} {rank:>4}  {fit:14} "
            f"{r.top}"
        )
    for run_id, reason in skipped():
        print(f"{run_id[:34]:34} not scored: {reason}")
    s = summary(rows)
    print(
        f"\n{s['runs']} runs: median |pred/pub - 1| = {s['median_error']:.1%} (target <= 8%), "
        f"worst {s['worst_error']:.1%} (target <= 25%), published layout in the top 3 for "
        f"{s['top3']:.0%} (target >= 85%), predicted not to fit: {s['not_fit']} (target 0)"
    )


if __name__ == "__main__":
    main()
