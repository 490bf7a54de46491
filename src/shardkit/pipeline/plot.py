"""Timeline pictures of pipeline schedules: devices down, time across, one box per op.

Draws a :class:`~shardkit.pipeline.simulate.Timeline` (time in cost units) or a
:class:`~shardkit.pipeline.schedule.Table` (time in lockstep steps; with two lanes each device
row is split into its F lane above and its B lane below). Forward boxes are blue, full
backward orange, input-gradient backward red, weight-gradient green; later chunks of an
interleaved schedule are drawn lighter; each box carries its micro-batch number.

Example:
    >>> from shardkit.pipeline import OneFOneB, plot, simulate, table
    >>> plot(simulate(OneFOneB(), p=4, m=8), "/tmp/1f1b.png").name
    '1f1b.png'
    >>> plot([table(OneFOneB(), 4, 8), simulate(OneFOneB(), 4, 8)], "/tmp/both.png").name
    'both.png'
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

from shardkit.errors import ShardkitTypeError, ShardkitValueError
from shardkit.pipeline.schedule import KIND_NAMES, Table
from shardkit.pipeline.simulate import Timeline

COLOURS = {"F": "#4c72b0", "B": "#dd8452", "BI": "#c44e52", "W": "#55a868"}
"""Box colour per op kind."""
_LABELS = {"F": "forward", "B": "backward", "BI": "backward (input grad)", "W": "weight grad"}


def _boxes(item: Timeline | Table) -> list[tuple[int, int, int, float, float, str, int, int]]:
    """(device, lane, lanes, start, end, kind, microbatch, chunk) for every op."""
    out = []
    if isinstance(item, Timeline):
        for d, events in enumerate(item.events):
            for e in events:
                out.append((d, 0, 1, e.start, e.end, e.op.kind, e.op.microbatch, e.op.chunk))
        return out
    for d in range(item.p):
        for step, lane, op in item.device_ops(d):
            out.append((d, lane, item.lanes, step, step + 1, op.kind, op.microbatch, op.chunk))
    return out


def _lighten(colour: str, amount: float) -> tuple[float, float, float]:
    rgb = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    return tuple(c + (1 - c) * amount for c in rgb)  # type: ignore[return-value]


def _title(item: Timeline | Table) -> str:
    v = f", v={item.virtual}" if item.virtual > 1 else ""
    if isinstance(item, Timeline):
        c = item.costs
        return (
            f"{item.schedule}: p={item.p}, m={item.m}{v}; t_f={c.t_f:g} t_b={c.t_b:g} "
            f"t_w={c.t_w:g}; makespan {item.makespan:g}, bubble {item.bubble:.1%}"
        )
    return (
        f"{item.schedule} step table: p={item.p}, m={item.m}{v}; {item.steps} steps x "
        f"{item.lanes} lane(s), idle {item.idle_fraction:.1%}"
    )


def _draw(ax, item: Timeline | Table, span: float) -> set[str]:
    kinds = set()
    for d, lane, lanes, start, end, kind, mb, chunk in _boxes(item):
        height = 0.8 / lanes
        y = d - 0.4 + lane * height
        colour = _lighten(COLOURS[kind], 0.45 * chunk / max(1, item.virtual - 1))
        if end > start:
            ax.broken_barh([(start, end - start)], (y, height), facecolors=colour, edgecolor="w")
        if (end - start) / span > 0.012:
            ax.text((start + end) / 2, y + height / 2, str(mb), ha="center", va="center",
                    fontsize=7, color="white")  # fmt: skip
        kinds.add(kind)
    ax.set_ylim(item.p - 0.5, -0.5)
    ax.set_yticks(range(item.p), [f"device {d}" for d in range(item.p)], fontsize=8)
    ax.set_xlim(0, span)
    ax.set_title(_title(item), fontsize=9, loc="left")
    ax.set_xlabel("time" if isinstance(item, Timeline) else "lockstep step", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    return kinds


def _span(item: Timeline | Table) -> float:
    return item.makespan if isinstance(item, Timeline) else float(item.steps)


def plot(
    items: Timeline | Table | Sequence[Timeline | Table],
    path: str | pathlib.Path,
    *,
    share_time: bool = True,
) -> pathlib.Path:
    """Write a PNG timeline of one schedule, or of several stacked one above the other.

    Args:
        items: a :class:`Timeline` from :func:`simulate`, a :class:`Table` from :func:`table`,
            or a sequence of them (drawn top to bottom).
        path: where to write the PNG.
        share_time: with several items, use one time axis for all (so equal lengths mean equal
            times); else each panel spans its own makespan.

    Returns:
        The path written, as a ``pathlib.Path``.

    Raises:
        TypeError: if an item is neither a Timeline nor a Table.
        ValueError: if ``path`` does not end in ``.png`` or no item is given.

    Example:
        >>> from shardkit.pipeline import GPipe, simulate
        >>> plot(simulate(GPipe(), p=2, m=4), "/tmp/gpipe.png").suffix
        '.png'
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    path = pathlib.Path(path)
    if path.suffix.lower() != ".png":
        raise ShardkitValueError(
            f"plot: path={str(path)!r} is not a .png file; fix: end it in '.png'"
        )
    seq = list(items) if isinstance(items, (list, tuple)) else [items]
    if not seq:
        raise ShardkitValueError(
            "plot: no timeline or table given; fix: pass simulate(...) or table(...)"
        )
    for i, item in enumerate(seq):
        if not isinstance(item, (Timeline, Table)):
            raise ShardkitTypeError(
                f"plot: items[{i}] is a {type(item).__name__}, not a Timeline or Table; "
                "fix: pass simulate(schedule, p, m) or table(schedule, p, m)"
            )
    spans = [_span(item) for item in seq]
    rows = [item.p for item in seq]
    fig = Figure(figsize=(11, sum(0.9 + 0.32 * r for r in rows) + 0.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(seq), 1, squeeze=False, height_ratios=[0.9 + 0.32 * r for r in rows])
    kinds = set()
    for ax, item, span in zip(axes[:, 0], seq, spans, strict=True):
        kinds |= _draw(ax, item, max(spans) if share_time else span)
    order = [k for k in KIND_NAMES.values() if k in kinds]
    fig.legend(
        handles=[Patch(color=COLOURS[k], label=_LABELS[k]) for k in order],
        loc="outside lower center",
        ncol=len(order),
        fontsize=8,
        frameon=False,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
