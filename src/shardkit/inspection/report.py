"""The audit `Report`: collectives, memory, FLOPs, warnings; as a table, text, dict/JSON, HTML.

A `Report` is plain data (frozen dataclasses of ints, strings and tuples) built by
`shardkit.inspect`. Rendering is separate from building: `to_text()` for logs, `to_dict()` /
`to_json()` for machines, `to_html()` for reports, and `__rich__` so `rich.print(report)` shows a
coloured table. `str(report)` is the plain text.

Byte counts are per device, for one execution of a collective, with ring-algorithm formulas
(`FORMULAS`); `total_bytes` multiplies by how many times the collective runs per call.

Example:
    >>> mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    >>> a = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("x")))
    >>> report = shardkit.inspect(lambda a: a @ a.T, a)
    >>> print(report)                 # plain text
    jit__lambda on mesh x=8 (cpu): 1 collectives, 7.0 KiB per device per call
    #  kind        shape      mesh axes  n  bytes/exec  count  total    source
    0  all-gather  f32[32,8]  x          8  7.0 KiB     1      7.0 KiB  ...
    ...
    >>> report.to_dict()["totals"]["by_kind"]["all-gather"]
    {'count': 1, 'bytes': 7168, 'count_known': True}
"""

from __future__ import annotations

import dataclasses
import html
import json
from typing import Any

from shardkit.collectives import FORMULAS
from shardkit.common import format_bytes
from shardkit.inspection.hlo import SourceFrame


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a compiled program.

    Attributes:
        kind: `all-gather`, `all-reduce`, `reduce-scatter`, `all-to-all`, `collective-permute`
            or `collective-broadcast` (an async `-start`/`-done` pair is one collective).
        name: the HLO instruction name.
        dtype: element type as HLO spells it (`f32`, `bf16`).
        shapes: per-device operand shapes, e.g. `("f32[16,64]",)` (tuple collectives have several).
        result_shapes: per-device result shapes.
        buffer_bytes: the bytes the formula applies to (the gathered result for an all-gather,
            the operands otherwise).
        bytes_moved: bytes each device sends for one execution (`FORMULAS[kind]`).
        group_size: n, devices per replica group (for a permute: the size of the mesh axes
            it moves along).
        num_groups: number of replica groups (source-target pairs for a permute).
        axes: the mesh axes the groups span, e.g. `("model",)`; None when the groups are not
            a product of mesh axes (`partial` explains).
        partial: empty, or a note when the groups cover only part of those mesh axes.
        count: executions per call (static occurrences times loop trip counts), None if a loop
            around it has no trip count XLA states.
        source: the user's frame (file, line, function), library frames skipped; None if the
            program carries no source information.
        traceback: the full recorded traceback, innermost first.
        op_name: JAX's name stack, e.g. `jit(f)/dot_general`.
        upcast_from: the narrower dtype converted to `dtype` just before the collective
            (XLA:CPU runs bf16 collectives in f32), else None.
        computation: the HLO computation holding it (a loop body for scans).
    """

    kind: str
    name: str
    dtype: str
    shapes: tuple[str, ...]
    result_shapes: tuple[str, ...]
    buffer_bytes: int
    bytes_moved: float
    group_size: int
    num_groups: int
    axes: tuple[str, ...] | None
    partial: str
    count: int | None
    source: SourceFrame | None
    traceback: tuple[SourceFrame, ...]
    op_name: str | None
    upcast_from: str | None
    computation: str

    @property
    def formula(self) -> str:
        """The per-device bytes formula used for `bytes_moved`."""
        return FORMULAS[self.kind]

    @property
    def total_bytes(self) -> float:
        """`bytes_moved` times `count` (times 1 when the count is unknown)."""
        return self.bytes_moved * (self.count if self.count is not None else 1)

    @property
    def axes_label(self) -> str:
        """The mesh axes as text: `data`, `data,model`, `-` for none, `?` when undecodable."""
        if self.axes is None:
            return "?"
        label = ",".join(self.axes) if self.axes else "-"
        return f"{label} ({self.partial})" if self.partial else label

    @property
    def where(self) -> str:
        """The user's source location as `file:line (function)`, or `?`."""
        if self.source is None:
            return "?"
        return f"{self.source.file}:{self.source.line} ({self.source.function})"

    def describe(self) -> str:
        """One line: kind, shape, axes, bytes, count and source."""
        count = "unknown" if self.count is None else str(self.count)
        shapes = _join_shapes(self.shapes)
        if self.result_shapes and self.result_shapes != self.shapes:
            shapes += " -> " + _join_shapes(self.result_shapes)
        return (
            f"{self.kind} {shapes} over {self.axes_label} (n={self.group_size}): "
            f"{format_bytes(self.bytes_moved)} per device x {count} at {self.where}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {
            "kind": self.kind,
            "name": self.name,
            "dtype": self.dtype,
            "shapes": list(self.shapes),
            "result_shapes": list(self.result_shapes),
            "buffer_bytes": self.buffer_bytes,
            "bytes_moved": _num(self.bytes_moved),
            "formula": self.formula,
            "group_size": self.group_size,
            "num_groups": self.num_groups,
            "axes": None if self.axes is None else list(self.axes),
            "partial": self.partial,
            "count": self.count,
            "total_bytes": _num(self.total_bytes),
            "source": None if self.source is None else dataclasses.asdict(self.source),
            "traceback": [str(f) for f in self.traceback],
            "op_name": self.op_name,
            "upcast_from": self.upcast_from,
            "computation": self.computation,
        }


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """Per-device memory of a compiled program, from `compiled.memory_analysis()`.

    `total_bytes` is arguments + outputs - aliased + temporaries (generated code excluded).
    """

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    generated_code_bytes: int

    @property
    def total_bytes(self) -> int:
        """Peak-style total: arguments + outputs - aliased + temporaries."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    def to_dict(self) -> dict[str, int]:
        """JSON-ready fields, total included."""
        return {**dataclasses.asdict(self), "total_bytes": self.total_bytes}


@dataclasses.dataclass(frozen=True)
class Cost:
    """Per-device cost from `compiled.cost_analysis()` (None where XLA gives no figure)."""

    flops: float | None
    bytes_accessed: float | None
    transcendentals: float | None

    def to_dict(self) -> dict[str, float | None]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Finding:
    """A warning of the audit.

    Attributes:
        code: `implicit-gather`, `replicated-output`, `large-collective` or `upcast`.
        message: what happened, where, and what to do.
        collective: index into `Report.collectives` when the warning is about one.
    """

    code: str
    message: str
    collective: int | None = None


@dataclasses.dataclass(frozen=True)
class Report:
    """What the compiler did with a function: the result of `shardkit.inspect`.

    Attributes:
        name: the program's name (`jit_train_step`).
        mesh: mesh axis name -> size.
        platform: the backend compiled for (`cpu`, `gpu`, `tpu`).
        collectives: every collective, in program order.
        memory: per-device memory (None when the backend gives none).
        cost: per-device FLOPs and bytes accessed.
        warnings: findings (implicit gathers, replicated outputs, large collectives, upcasts).
        layout: input/output shardings, requested vs compiled (a `CompiledLayout`), or None.
        parse_seconds: time spent reading the compiled text.
        compile_seconds: time spent lowering and compiling (None if given a compiled object).
    """

    name: str
    mesh: dict[str, int]
    platform: str
    collectives: tuple[Collective, ...]
    memory: MemoryStats | None
    cost: Cost
    warnings: tuple[Finding, ...]
    layout: Any = None
    parse_seconds: float = 0.0
    compile_seconds: float | None = None

    # -- queries -------------------------------------------------------------------------
    def of_kind(self, kind: str) -> tuple[Collective, ...]:
        """The collectives of one kind."""
        return tuple(c for c in self.collectives if c.kind == kind)

    def counts(self) -> dict[str, int | None]:
        """Executions per call by kind (None when a loop count is unknown)."""
        return {k: v["count"] if v["count_known"] else None for k, v in self.by_kind().items()}

    @property
    def total_bytes(self) -> float:
        """Bytes each device sends per call, all collectives (unknown loop counts taken as 1)."""
        return sum(c.total_bytes for c in self.collectives)

    def by_kind(self) -> dict[str, dict[str, Any]]:
        """Totals per collective kind: executions, bytes per device, whether counts are known."""
        return _totals(self.collectives, lambda c: c.kind)

    def by_axis(self) -> dict[str, dict[str, Any]]:
        """Totals per set of mesh axes (`data`, `data,model`, ...)."""
        return _totals(self.collectives, lambda c: c.axes_label)

    # -- renderings ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of everything in the report."""
        return {
            "name": self.name,
            "mesh": dict(self.mesh),
            "platform": self.platform,
            "collectives": [c.to_dict() for c in self.collectives],
            "totals": {
                "by_kind": self.by_kind(),
                "by_axis": self.by_axis(),
                "bytes": _num(self.total_bytes),
            },
            "memory": None if self.memory is None else self.memory.to_dict(),
            "cost": self.cost.to_dict(),
            "warnings": [dataclasses.asdict(w) for w in self.warnings],
            "layout": None if self.layout is None else self.layout.to_dict(),
            "parse_seconds": self.parse_seconds,
            "compile_seconds": self.compile_seconds,
        }

    def to_json(self, **kwargs: Any) -> str:
        """`to_dict()` as JSON text (kwargs go to `json.dumps`, e.g. `indent=2`)."""
        return json.dumps(self.to_dict(), **kwargs)

    def to_text(self) -> str:
        """The report as plain text (what `str(report)` gives)."""
        return _text(self)

    def to_html(self) -> str:
        """An HTML fragment (a `<div>` with tables), for notebooks and HTML reports."""
        return _html(self)

    def _repr_html_(self) -> str:
        return self.to_html()

    def __str__(self) -> str:
        return self.to_text()

    def __rich__(self) -> Any:
        return _rich(self)


# --------------------------------------------------------------------------------------------
# helpers


def _join_shapes(shapes: tuple[str, ...]) -> str:
    """`f32[8,8]`, or `8 x f32[8,1,8]` for a tuple of equal shapes, else comma-joined."""
    if len(shapes) > 1 and len(set(shapes)) == 1:
        return f"{len(shapes)} x {shapes[0]}"
    return ", ".join(shapes)


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


def _fmt_num(x: float | None) -> str:
    if x is None:
        return "?"
    for unit, div in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f} {unit}"
    return f"{x:.0f}"


def _totals(collectives, key) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for c in collectives:
        t = out.setdefault(key(c), {"count": 0, "bytes": 0, "count_known": True})
        t["count"] += c.count if c.count is not None else 1
        t["bytes"] = _num(t["bytes"] + c.total_bytes)
        t["count_known"] = t["count_known"] and c.count is not None
    return out


_HEADER = ("#", "kind", "shape", "mesh axes", "n", "bytes/exec", "count", "total", "source")


def _rows(report: Report) -> list[tuple[str, ...]]:
    rows = []
    for i, c in enumerate(report.collectives):
        shape = _join_shapes(c.shapes)
        if c.upcast_from:
            shape += f" (from {c.upcast_from})"
        rows.append(
            (
                str(i),
                c.kind,
                shape,
                c.axes_label,
                str(c.group_size),
                format_bytes(c.bytes_moved),
                "unknown" if c.count is None else str(c.count),
                format_bytes(c.total_bytes) + ("+" if c.count is None else ""),
                _short_source(c),
            )
        )
    return rows


def _short_source(c: Collective) -> str:
    if c.source is None:
        return "?"
    file = c.source.file.replace("\\", "/").rsplit("/", 1)[-1]
    return f"{file}:{c.source.line} ({c.source.function})"


def _summary_lines(report: Report) -> list[str]:
    lines = []
    m = report.memory
    if m is not None:
        lines.append(
            "memory per device: "
            f"arguments {format_bytes(m.argument_bytes)}, outputs {format_bytes(m.output_bytes)}, "
            f"aliased {format_bytes(m.alias_bytes)}, temporaries {format_bytes(m.temp_bytes)}, "
            f"total {format_bytes(m.total_bytes)}"
        )
    c = report.cost
    lines.append(
        f"cost per device: {_fmt_num(c.flops)}FLOP, {format_bytes(c.bytes_accessed)} accessed"
    )
    return lines


def _totals_lines(report: Report) -> list[str]:
    lines = []
    for title, totals in (("by kind", report.by_kind()), ("by mesh axes", report.by_axis())):
        parts = [
            f"{k} {v['count']}{'' if v['count_known'] else '+'}x = {format_bytes(v['bytes'])}"
            for k, v in totals.items()
        ]
        lines.append(f"totals {title}: " + ("; ".join(parts) if parts else "none"))
    return lines


def _text(report: Report) -> str:
    mesh = " x ".join(f"{k}={v}" for k, v in report.mesh.items()) or "-"
    lines = [
        f"{report.name} on mesh {mesh} ({report.platform}): "
        f"{len(report.collectives)} collectives, {format_bytes(report.total_bytes)} per device "
        "per call"
    ]
    rows = _rows(report)
    if rows:
        widths = [max(len(r[i]) for r in [_HEADER, *rows]) for i in range(len(_HEADER))]
        for r in [_HEADER, *rows]:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)))
        lines.extend(_totals_lines(report))
        lines.append("bytes/exec per device, ring formulas: " + _formula_note(report))
    lines.extend(_summary_lines(report))
    changed = _layout_changes(report)
    if changed:
        lines.append(_LAYOUT_TITLE + ":")
        lines.extend("  " + line for line in changed)
    for w in report.warnings:
        lines.append(f"warning [{w.code}]: {w.message}")
    return "\n".join(lines)


_LAYOUT_TITLE = "layout changed by the compiler"


def _layout_changes(report: Report) -> list[str]:
    """One line per input or output whose compiled layout is not the one requested."""
    if report.layout is None:
        return []
    return [e.describe() for e in report.layout.changed()]


def _formula_note(report: Report) -> str:
    kinds = dict.fromkeys(c.kind for c in report.collectives)
    return "; ".join(f"{k} {FORMULAS[k]}" for k in kinds)


def _html(report: Report) -> str:
    e = html.escape
    mesh = " &times; ".join(f"{e(k)}={v}" for k, v in report.mesh.items()) or "-"
    out = [
        '<div class="shardkit-report">',
        f"<h3>{e(report.name)} on mesh {mesh} ({e(report.platform)})</h3>",
    ]
    rows = _rows(report)
    if rows:
        out.append("<table><thead><tr>")
        out.extend(f"<th>{e(h)}</th>" for h in _HEADER)
        out.append("</tr></thead><tbody>")
        for r, c in zip(rows, report.collectives, strict=True):
            cells = list(r)
            out.append(
                "<tr>"
                + "".join(
                    f'<td title="{e(c.where)}">{e(x)}</td>'
                    if i == len(cells) - 1
                    else f"<td>{e(x)}</td>"
                    for i, x in enumerate(cells)
                )
                + "</tr>"
            )
        out.append("</tbody></table>")
        out.extend(f"<p>{e(line)}</p>" for line in _totals_lines(report))
    out.extend(f"<p>{e(line)}</p>" for line in _summary_lines(report))
    changed = _layout_changes(report)
    if changed:
        out.append(f'<p>{_LAYOUT_TITLE}:</p>\n<ul class="layout">')
        out.extend(f"<li>{e(line)}</li>" for line in changed)
        out.append("</ul>")
    if report.warnings:
        out.append("<ul>")
        out.extend(
            f'<li class="warning"><b>{e(w.code)}</b>: {e(w.message)}</li>' for w in report.warnings
        )
        out.append("</ul>")
    out.append("</div>")
    return "\n".join(out)


def _rich(report: Report) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    mesh = " x ".join(f"{k}={v}" for k, v in report.mesh.items()) or "-"
    table = Table(
        title=f"{report.name} on mesh {mesh} ({report.platform})",
        caption="bytes per device, ring formulas: " + _formula_note(report)
        if report.collectives
        else None,
    )
    for h in _HEADER:
        table.add_column(
            h, justify="right" if h in ("#", "n", "count") else "left", overflow="fold"
        )
    for r in _rows(report):
        table.add_row(*r)
    parts: list[Any] = [table]
    parts.extend(Text(line) for line in _totals_lines(report) if report.collectives)
    parts.extend(Text(line) for line in _summary_lines(report))
    changed = _layout_changes(report)
    if changed:
        parts.append(Text(_LAYOUT_TITLE + ":"))
        parts.extend(Text("  " + line) for line in changed)
    parts.extend(Text(f"warning [{w.code}]: {w.message}", style="yellow") for w in report.warnings)
    return Group(*parts)
