"""The tables `shardkit train` prints and puts in its report: each parameter's layout."""

from __future__ import annotations

import math
from typing import Any

import jax
from rich.table import Table

from shardkit.common import format_bytes, path_str
from shardkit.layout import spec_notation


def layout_rows(trainer) -> list[dict[str, Any]]:
    """One row per parameter: path, shape, logical names, layout, bytes per device."""
    sizes = trainer.bound.axis_sizes
    flat = jax.tree_util.tree_flatten_with_path(trainer.abstract_params)[0]
    specs = jax.tree.leaves(trainer.param_specs, is_leaf=lambda x: isinstance(x, tuple))
    names = (
        jax.tree.structure(trainer.abstract_params).flatten_up_to(trainer.logical)
        if trainer.logical is not None
        else [None] * len(flat)
    )
    rows = []
    for (path, leaf), spec, logical in zip(flat, specs, names, strict=True):
        split = math.prod(
            sizes[a] for e in spec if e for a in (e if isinstance(e, tuple) else (e,))
        )
        rows.append(
            {
                "parameter": path_str(path),
                "shape": "x".join(map(str, leaf.shape)),
                "logical": ",".join(str(n) for n in logical) if logical else "-",
                "layout": spec_notation(leaf.shape, spec, name=""),
                "bytes/device": format_bytes(math.prod(leaf.shape) * leaf.dtype.itemsize // split),
            }
        )
    return rows


def print_table(console: Any, rows: list[dict[str, Any]], title: str) -> None:
    """Prints dict rows as a rich table (bytes columns right-aligned); no rows: one line
    saying so (a one-device step has no collectives)."""
    if not rows:
        console.print(f"{title}: none", markup=False, highlight=False)
        return
    table = Table(title=title, title_justify="left", show_lines=False)
    for col in rows[0]:
        table.add_column(col, justify="right" if "bytes" in col else "left")
    for r in rows:
        table.add_row(*(str(v) for v in r.values()))
    console.print(table)
