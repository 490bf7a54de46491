"""The HTML report of a training run: plan, layouts, audit tables, loss and throughput plots.

One self-contained file: the plots are inside it as data URIs (it works copied or mailed);
the PNG files are written beside it too.
"""

from __future__ import annotations

import base64
import html
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from shardkit.common import html_page
from shardkit.compat import version_line
from shardkit.train.metrics import History


def plot_history(history: History, out_dir: pathlib.Path) -> dict[str, dict[str, str]]:
    """Writes loss.png and throughput.png (matplotlib, Agg backend).

    Returns, per plot, its file name, a description and its legend's labels (read back from
    the drawn legend), which the report puts in the image's alt text and `data-legend`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = history.column("step")
    files = {}
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=110)
    lines = ax.plot(steps, history.column("loss"), label="training loss", color="tab:blue")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (log scale)")
    ax.set_yscale("log")
    if history.column("accuracy"):
        ax2 = ax.twinx()
        lines += ax2.plot(steps, history.column("accuracy"), label="accuracy", color="tab:green")
        ax2.set_ylabel("accuracy")
        ax2.set_ylim(0, 1.02)
    legend = ax.legend(lines, [x.get_label() for x in lines], loc="center right")
    ax.set_title("training loss and accuracy")
    files["loss"] = _save(fig, out_dir / "loss.png", legend, "training loss and accuracy by step")
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=110)
    ax.plot(steps, history.column("tokens_per_s"), color="tab:orange", label="tokens / s")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens / s")
    ax.set_title("throughput")
    legend = ax.legend(loc="lower right")
    files["throughput"] = _save(
        fig, out_dir / "throughput.png", legend, "tokens per second by step"
    )
    return files


def _save(fig, path: pathlib.Path, legend, what: str) -> dict[str, str]:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    labels = ", ".join(t.get_text() for t in legend.get_texts())
    return {"file": path.name, "alt": what, "legend": labels}


def _img(path: pathlib.Path, alt: str, legend: str = "") -> str:
    """An <img> holding the PNG itself (a data URI): the report works copied or mailed."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    extra = f' data-legend="{html.escape(legend)}"' if legend else ""
    text = alt + (f"; legend: {legend}" if legend else "")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(text)}"{extra}>'


def _pipeline_section(rows: Mapping[str, str] | None, out_dir: pathlib.Path) -> list[str]:
    if not rows:
        return []
    items = [{"item": k, "value": v} for k, v in rows.items() if k != "plot"]
    out = ["<h2>Pipeline schedule</h2>", _table(items)]
    plot = out_dir / rows["plot"] if rows.get("plot") else None
    if plot is not None and plot.exists():
        out.append(_img(plot, "pipeline schedule timeline"))
    return out


def _table(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "<p>(none)</p>"
    cols = list(rows[0])
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(r[c]))}</td>" for c in cols) + "</tr>" for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def write_metrics(out_dir: str | pathlib.Path, history: History) -> pathlib.Path:
    """Writes the logged rows as `metrics.json` into `out_dir` (with or without the report)."""
    path = pathlib.Path(out_dir) / "metrics.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(history.rows, indent=1))
    return path


def write_report(
    out_dir: str | pathlib.Path,
    *,
    summary: Mapping[str, Any],
    plan: Mapping[str, str],
    layout_rows: Sequence[Mapping[str, Any]],
    lint_summary: str,
    collective_rows: Sequence[Mapping[str, Any]],
    collective_problems: Sequence[str],
    memory_rows: Sequence[Mapping[str, Any]],
    history: History,
    audit_html: str | None = None,
    audit_notes: Sequence[str] = (),
    config: Mapping[str, Any] | None = None,
    pipeline: Mapping[str, str] | None = None,
) -> pathlib.Path:
    """Writes `report.html` (+ PNG plots and `metrics.json`) into `out_dir`; returns its path.

    `pipeline` (from `shardkit.train.pipeline_view.pipeline_rows`) adds a section with the
    schedule, its bubble and, under the key "plot", the timeline PNG's file name.
    """
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = plot_history(history, out) if history.rows else {}
    write_metrics(out, history)
    verdict = (
        '<p class="ok">The compiled step holds exactly the strategy\'s expected collectives.</p>'
        if not collective_problems
        else "<ul>"
        + "".join(f'<li class="bad">{html.escape(p)}</li>' for p in collective_problems)
        + "</ul>"
    )
    parts = [
        "<h1>shardkit train</h1>",
        f"<p>{html.escape(version_line())}</p>",
        "<h2>Summary</h2>",
        _table([{"metric": k, "value": v} for k, v in summary.items()]),
        "<h2>Plan</h2>",
        _table([{"item": k, "value": v} for k, v in plan.items()]),
        "<h2>Curves</h2>",
        " ".join(_img(out / p["file"], p["alt"], p["legend"]) for p in plots.values()),
        *_pipeline_section(pipeline, out),
        "<h2>Parameter layouts</h2>",
        f"<pre>{html.escape(lint_summary)}</pre>",
        _table(layout_rows),
        "<h2>Audit of the compiled step</h2>",
        "<h3>Collectives: compiled vs expected</h3>",
        _table(collective_rows),
        verdict,
        "<h3>Memory per device</h3>",
        _table(memory_rows),
    ]
    if audit_notes:
        parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in audit_notes) + "</ul>")
    if audit_html:
        parts += ["<h3>Every collective</h3>", audit_html]
    if config:
        parts += [
            "<h2>Configuration</h2>",
            f"<pre>{html.escape(json.dumps(config, indent=1))}</pre>",
        ]
    path = out / "report.html"
    path.write_text(html_page("shardkit train report", "\n".join(parts)))
    return path
