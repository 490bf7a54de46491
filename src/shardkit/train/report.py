"""The HTML report of a training run: plan, layouts, audit tables, loss and throughput PNGs."""

from __future__ import annotations

import html
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from shardkit.compat import version_line
from shardkit.train.metrics import History


def plot_history(history: History, out_dir: pathlib.Path) -> dict[str, str]:
    """Writes loss.png and throughput.png (matplotlib, Agg backend); returns their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = history.column("step")
    files = {}
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=110)
    ax.plot(steps, history.column("loss"), label="loss", color="tab:blue")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    if history.column("accuracy"):
        ax2 = ax.twinx()
        ax2.plot(steps, history.column("accuracy"), label="accuracy", color="tab:green")
        ax2.set_ylabel("accuracy")
        ax2.set_ylim(0, 1.02)
    ax.set_title("training loss and accuracy")
    fig.tight_layout()
    fig.savefig(out_dir / "loss.png")
    plt.close(fig)
    files["loss"] = "loss.png"
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=110)
    ax.plot(steps, history.column("tokens_per_s"), color="tab:orange")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens / s")
    ax.set_title("throughput")
    fig.tight_layout()
    fig.savefig(out_dir / "throughput.png")
    plt.close(fig)
    files["throughput"] = "throughput.png"
    return files


def _pipeline_section(rows: Mapping[str, str] | None) -> list[str]:
    if not rows:
        return []
    items = [{"item": k, "value": v} for k, v in rows.items() if k != "plot"]
    out = ["<h2>Pipeline schedule</h2>", _table(items)]
    if rows.get("plot"):
        out.append(f'<img src="{html.escape(rows["plot"])}" alt="pipeline schedule timeline">')
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


_STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3} code,pre{background:#f6f6f6;padding:2px 4px}
.ok{color:#1a7f37}.bad{color:#c62828}
"""


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
    (out / "metrics.json").write_text(json.dumps(history.rows, indent=1))
    verdict = (
        '<p class="ok">The compiled step holds exactly the strategy\'s expected collectives.</p>'
        if not collective_problems
        else "<ul>"
        + "".join(f'<li class="bad">{html.escape(p)}</li>' for p in collective_problems)
        + "</ul>"
    )
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>shardkit train report</title>",
        f"<style>{_STYLE}</style></head><body><h1>shardkit train</h1>",
        f"<p>{html.escape(version_line())}</p>",
        "<h2>Summary</h2>",
        _table([{"metric": k, "value": v} for k, v in summary.items()]),
        "<h2>Plan</h2>",
        _table([{"item": k, "value": v} for k, v in plan.items()]),
        "<h2>Curves</h2>",
        "".join(f'<img src="{f}" alt="{k}"> ' for k, f in plots.items()),
        *_pipeline_section(pipeline),
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
    if audit_html:
        parts += ["<h3>Every collective</h3>", audit_html]
    if config:
        parts += [
            "<h2>Configuration</h2>",
            f"<pre>{html.escape(json.dumps(config, indent=1))}</pre>",
        ]
    parts.append("</body></html>")
    path = out / "report.html"
    path.write_text("\n".join(parts))
    return path
