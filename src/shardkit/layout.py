"""Layout views: where each piece of an array lives, for any rank.

``show(x)`` draws the device grid of an N-D array. ``jax.debug.visualize_array_sharding``
refuses arrays above 2-D; here two dims are displayed (the sharded ones first) and the others
are folded: an unsharded dim is simply not drawn (each cell spans it whole), a sharded one
splits the picture into panels, one per block. A note under the picture says which dims were
folded. Output goes to the terminal with rich (colour only on a TTY), or to HTML for notebooks
and reports.

Tables: :func:`shard_table` (device, process, index slices, shard shape, bytes) and
:func:`tree_table` (leaf path, shape, dtype, spec in ``W[A_data, B_model]`` notation, bytes per
device); :func:`diff_specs` lists the leaves whose specs differ between two trees.
"""

from __future__ import annotations

import html
import itertools
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from shardkit.common import format_bytes
from shardkit.errors import ShardkitTypeError, ShardkitValueError
from shardkit.leaves import is_variable, leaf_path_items
from shardkit.linter import lint

__all__ = [
    "Layout",
    "diff_specs",
    "format_bytes",
    "layout_of",
    "shard_table",
    "show",
    "spec_notation",
    "tree_table",
]

_DIM_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_PALETTE = [
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
    "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f",
]  # fmt: skip


def spec_notation(
    shape_or_names: Sequence[int] | Sequence[str] | int, spec: PartitionSpec, *, name: str = "W"
) -> str:
    """A spec in scaling-book notation: ``W[A_data, B]`` means dim A split over mesh axis
    ``data`` and dim B whole; several mesh axes on one dim read ``A_{data,model}``.

    Args:
      shape_or_names: the array's shape (dims are lettered A, B, C...), its rank, or one name
        per dim (``("batch", "embed")``).
      spec: the PartitionSpec.
      name: the array's name in the notation.

    Example:
      >>> spec_notation((16, 16), P("data", "model"))
      'W[A_data, B_model]'
      >>> spec_notation(("D", "F"), P(None, ("x", "y")))
      'W[D, F_{x,y}]'
    """
    if isinstance(shape_or_names, (int, np.integer)):
        rank = int(shape_or_names)
        if rank < 0:
            raise ShardkitValueError(
                f"spec_notation: rank {rank} is negative; fix: pass the array's rank, shape or "
                "one name per dim."
            )
    elif all(isinstance(s, str) for s in shape_or_names) and len(shape_or_names):
        rank = None
    else:
        rank = len(shape_or_names)
    if rank is None:
        dims = list(shape_or_names)
    elif rank <= len(_DIM_LETTERS):
        dims = list(_DIM_LETTERS[:rank])
    else:  # beyond Z the dims are numbered
        dims = [f"D{i}" for i in range(rank)]
    if isinstance(spec, str) or not isinstance(spec, (PartitionSpec, tuple, list)):
        raise ShardkitTypeError(
            f"spec_notation: spec is {type(spec).__name__} {spec!r}, not a PartitionSpec; "
            f"fix: spec_notation(shape, P({spec!r}))."
        )
    if len(spec) > len(dims):
        raise ShardkitValueError(
            f"spec_notation: spec {spec} has {len(spec)} entries but the array has "
            f"{len(dims)} dims; fix: one spec entry per dim at most."
        )
    parts = []
    for i, d in enumerate(dims):
        entry = spec[i] if i < len(spec) else None
        if entry is None or entry is PartitionSpec.UNCONSTRAINED:
            parts.append(d)
        elif isinstance(entry, str):
            parts.append(f"{d}_{entry}")
        else:
            axes = tuple(entry)
            parts.append(f"{d}_{axes[0]}" if len(axes) == 1 else f"{d}_{{{','.join(axes)}}}")
    return f"{name}[{', '.join(parts)}]"


@dataclass(frozen=True)
class Layout:
    """An array's layout: global shape, sharding, and each device's index slices."""

    shape: tuple[int, ...]
    dtype: np.dtype
    sharding: Any
    indices: dict[Any, tuple[slice, ...]]

    @property
    def spec(self) -> PartitionSpec | None:
        return getattr(self.sharding, "spec", None)

    def block(self, device: Any) -> tuple[tuple[int, int], ...]:
        """``(start, stop)`` per dim of ``device``'s shard."""
        return tuple(
            (s.start or 0, self.shape[i] if s.stop is None else s.stop)
            for i, s in enumerate(self.indices[device])
        )


def _parse_dtype(dtype: Any) -> np.dtype:
    import jax.numpy as jnp

    try:
        return np.dtype(jnp.dtype(dtype))
    except TypeError:
        msg = f"show/layout_of: dtype={dtype!r} is not a dtype; fix: dtype='float32'."
        raise ShardkitTypeError(msg) from None


def _parse_shape(shape: Any) -> tuple[int, ...]:
    """`shape` as a tuple of ints >= 0, or an error naming it."""
    ok = isinstance(shape, (Sequence, np.ndarray)) and all(
        isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in shape
    )
    if not ok or any(s < 0 for s in shape):
        why = "has a negative size" if ok else "is not a sequence of integer sizes"
        raise ShardkitValueError(
            f"show/layout_of: shape={shape!r} {why}; fix: sizes >= 0, e.g. shape=(8, 4), or "
            "shape=(8,) for one dim."
        )
    return tuple(int(s) for s in shape)


def layout_of(
    x: Any = None,
    *,
    shape: Sequence[int] | None = None,
    dtype: Any = "float32",
    sharding: Any = None,
    mesh: Any = None,
    spec: PartitionSpec | None = None,
) -> Layout:
    """The :class:`Layout` of an array, or of a (shape, sharding | mesh + spec) pair.

    Raises:
      TypeError: ``x`` has no sharding and no shape/sharding was given.
      ValueError: the spec does not fit the shape or mesh (message from :func:`shardkit.lint`).
    """
    if x is not None:
        if not hasattr(x, "sharding") or not hasattr(x, "shape"):
            raise ShardkitTypeError(
                f"show/layout_of: expected a jax.Array (or ShapeDtypeStruct with a sharding), "
                f"got {type(x).__name__}; fix: jax.device_put(x, NamedSharding(mesh, spec)), or "
                "pass shape= with mesh= and spec=."
            )
        shape, dtype, sharding = tuple(x.shape), x.dtype, x.sharding
    else:
        if shape is None:
            raise ShardkitTypeError(
                "show/layout_of: pass an array, or shape= with sharding= or mesh=+spec=."
            )
        shape = _parse_shape(shape)
        if sharding is None:
            if mesh is None:
                raise ShardkitTypeError(
                    "show/layout_of: shape= needs sharding= or mesh= (and spec=)."
                )
            spec = PartitionSpec() if spec is None else spec
            if not isinstance(spec, PartitionSpec):
                raise ShardkitTypeError(
                    f"show/layout_of: spec is {type(spec).__name__} {spec!r}, not a "
                    f"PartitionSpec; fix: spec=P({spec!r})."
                    if isinstance(spec, str)
                    else f"show/layout_of: spec is {type(spec).__name__}, not a PartitionSpec; "
                    "fix: spec=P('data', None)."
                )
            if not isinstance(mesh, (jax.sharding.Mesh, jax.sharding.AbstractMesh)):
                fix = "not a jax.sharding.Mesh; fix: mesh=shardkit.make_mesh({'data': 8})."
                raise ShardkitTypeError(f"show/layout_of: mesh is {type(mesh).__name__}, {fix}")
            leaf = {"array": jax.ShapeDtypeStruct(shape, _parse_dtype(dtype))}
            lint(leaf, spec, mesh).raise_if_errors()
            sharding = NamedSharding(mesh, spec)
    if sharding is None:
        raise ShardkitTypeError("show/layout_of: this array has no sharding to show.")
    if not isinstance(sharding, Sharding):
        raise ShardkitTypeError(
            f"show/layout_of: sharding={sharding!r} is not a jax.sharding.Sharding; fix: "
            "sharding=NamedSharding(mesh, P('data')), or mesh= with spec=."
        )
    indices = dict(sharding.devices_indices_map(tuple(shape)))
    return Layout(tuple(shape), _parse_dtype(dtype), sharding, indices)


def _device_label(d: Any) -> str:
    plat = getattr(d, "platform", "dev")
    return f"{plat.upper() if plat == 'tpu' else plat} {d.id}"


def _grid(layout: Layout, dims: Sequence[int] | None):
    """Display dims, panel dims, and {panel key: {(row block, col block): [devices]}}."""
    nd = len(layout.shape)
    blocks = {d: layout.block(d) for d in layout.indices}
    ranges = [sorted({b[i] for b in blocks.values()}) for i in range(nd)]
    sharded = [i for i in range(nd) if len(ranges[i]) > 1]
    if dims is None:
        shown = (
            sharded[:2]
            if len(sharded) >= 2
            else sorted(
                set(sharded) | set(range(max(nd - 2, 0), nd)), key=lambda i: (i not in sharded, i)
            )[:2]
        )
        shown = sorted(shown)
    else:
        dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
        is_int = lambda d: isinstance(d, (int, np.integer)) and not isinstance(d, bool)
        wrong = [d for d in dims if not is_int(d) or not -nd <= d < nd]
        if wrong:  # a rank-0 array has no dims: leave dims out
            raise ShardkitValueError(
                f"dims={dims}: dim {wrong[0]!r} is out of range for a rank-{nd} array; fix: "
                + (f"integer dims in {-nd}..{nd - 1}." if nd else "leave dims out.")
            )
        shown = [int(d) % nd for d in dims]
        if len(set(shown)) != len(shown) or len(shown) > 2:
            raise ShardkitValueError(
                f"dims={dims}: pick at most two distinct dims of a rank-{nd} array."
            )
    panel_dims = [i for i in sharded if i not in shown]
    folded = [i for i in range(nd) if i not in shown and i not in panel_dims]
    panels: dict[tuple, dict[tuple, list]] = {}
    for dev, b in blocks.items():
        pkey = tuple(b[i] for i in panel_dims)
        rkey = b[shown[0]] if len(shown) == 2 else (0, 1)
        ckey = b[shown[-1]] if shown else (0, 1)
        panels.setdefault(pkey, {}).setdefault((rkey, ckey), []).append(dev)
    return shown, panel_dims, folded, ranges, panels


_SHORT_DTYPES = {
    "float32": "f32", "float64": "f64", "bfloat16": "bf16", "float16": "f16", "int32": "i32",
    "int64": "i64", "complex64": "c64", "complex128": "c128",
}  # fmt: skip


def _header(layout: Layout, name: str) -> str:
    dt = layout.dtype.name
    short = _SHORT_DTYPES.get(dt, dt)
    spec = layout.spec
    note = f"  {spec_notation(layout.shape, spec, name=name)}" if spec is not None else ""
    mesh = getattr(layout.sharding, "mesh", None)
    mesh_txt = (
        "  mesh " + ", ".join(f"{k}={v}" for k, v in mesh.shape.items()) if mesh is not None else ""
    )
    return f"{name}: {short}[{','.join(map(str, layout.shape))}]{note}{mesh_txt}"


def _fold_note(layout: Layout, shown, panel_dims, folded) -> str | None:
    nd = len(layout.shape)
    if nd <= 2 and not panel_dims:
        return None
    letters = [_DIM_LETTERS[i] for i in range(nd)]
    parts = [f"showing dims {', '.join(f'{letters[i]} (dim {i})' for i in shown)}"]
    if folded:
        parts.append(
            "folded unsharded dims " + ", ".join(f"{letters[i]} (dim {i})" for i in folded)
        )
    if panel_dims:
        parts.append(
            "one panel per block of sharded dims "
            + ", ".join(f"{letters[i]} (dim {i})" for i in panel_dims)
        )
    return "note: rank-" + str(nd) + " array; " + "; ".join(parts) + "."


def _cells(layout, shown, ranges, cell_map):
    rows = ranges[shown[0]] if len(shown) == 2 else [(0, 1)]
    cols = ranges[shown[-1]] if shown else [(0, 1)]
    table = []
    for r in rows:
        line = []
        for c in cols:
            devs = sorted(cell_map.get((r, c), []), key=lambda d: d.id)
            line.append(devs)
        table.append(line)
    return rows, cols, table


def _range_txt(letter: str, r: tuple[int, int]) -> str:
    return f"{letter} {r[0]}:{r[1]}"


def _render_text(layout: Layout, name: str, dims) -> str:
    shown, panel_dims, folded, ranges, panels = _grid(layout, dims)
    out = [_header(layout, name)]
    for pkey in sorted(panels):
        if panel_dims:
            out.append(
                "panel "
                + ", ".join(_range_txt(_DIM_LETTERS[i], r) for i, r in zip(panel_dims, pkey))
            )
        rows, cols, table = _cells(layout, shown, ranges, panels[pkey])
        labels = [
            ", ".join(_device_label(d) for d in devs) if devs else "-"
            for line in table
            for devs in line
        ]
        w = max(len(s) for s in labels) + 2
        rl = _DIM_LETTERS[shown[0]] if len(shown) == 2 else ""
        cl = _DIM_LETTERS[shown[-1]] if shown else ""
        row_labels = [_range_txt(rl, r) if rl else "" for r in rows]
        col_labels = [_range_txt(cl, c) if cl else "" for c in cols]
        w = max(w, *(len(c) + 2 for c in col_labels))
        lw = max(len(s) for s in row_labels) + 1 if rl else 0
        out.append((" " * lw + " " + " ".join(c.center(w) for c in col_labels)).rstrip())
        sep = " " * lw + "+" + "+".join("-" * w for _ in cols) + "+"
        out.append(sep)
        for rlab, line in zip(row_labels, table, strict=True):
            cells = [(", ".join(_device_label(d) for d in devs) or "-") for devs in line]
            out.append(rlab.ljust(lw) + "|" + "|".join(c.center(w) for c in cells) + "|")
            out.append(sep)
    note = _fold_note(layout, shown, panel_dims, folded)
    if note:
        out.append(note)
    return "\n".join(out)


def _render_rich(layout: Layout, name: str, dims):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    shown, panel_dims, folded, ranges, panels = _grid(layout, dims)
    items: list[Any] = [Text(_header(layout, name), style="bold")]
    for pkey in sorted(panels):
        rows, cols, table = _cells(layout, shown, ranges, panels[pkey])
        title = (
            "panel " + ", ".join(_range_txt(_DIM_LETTERS[i], r) for i, r in zip(panel_dims, pkey))
            if panel_dims
            else None
        )
        t = Table(show_header=True, show_lines=True, title=title, title_justify="left")
        rl = _DIM_LETTERS[shown[0]] if len(shown) == 2 else ""
        cl = _DIM_LETTERS[shown[-1]] if shown else ""
        t.add_column("")
        for c in cols:
            t.add_column(_range_txt(cl, c) if cl else "", justify="center")
        for r, line in zip(rows, table, strict=True):
            cells = []
            for devs in line:
                label = ", ".join(_device_label(d) for d in devs) or "-"
                color = _PALETTE[devs[0].id % len(_PALETTE)] if devs else "white"
                cells.append(Text(label, style=f"black on {color}"))
            t.add_row(_range_txt(rl, r) if rl else "", *cells)
        items.append(t)
    note = _fold_note(layout, shown, panel_dims, folded)
    if note:
        items.append(Text(note, style="italic"))
    return Group(*items)


def _render_html(layout: Layout, name: str, dims) -> str:
    shown, panel_dims, folded, ranges, panels = _grid(layout, dims)
    out = [f"<div class='shardkit-layout'><div><b>{html.escape(_header(layout, name))}</b></div>"]
    for pkey in sorted(panels):
        rows, cols, table = _cells(layout, shown, ranges, panels[pkey])
        if panel_dims:
            label = ", ".join(_range_txt(_DIM_LETTERS[i], r) for i, r in zip(panel_dims, pkey))
            out.append(f"<div>panel {html.escape(label)}</div>")
        out.append("<table style='border-collapse:collapse;margin:4px 0'>")
        rl = _DIM_LETTERS[shown[0]] if len(shown) == 2 else ""
        cl = _DIM_LETTERS[shown[-1]] if shown else ""
        head = "<th></th>" if rl else ""
        if cl:  # index ranges on the columns and rows, as the text view has them
            th = "<th style='padding:2px 8px;font-family:monospace;font-weight:normal'>"
            head += "".join(f"{th}{html.escape(_range_txt(cl, c))}</th>" for c in cols)
            out.append(f"<tr>{head}</tr>")
        for r, line in zip(rows, table, strict=True):
            out.append("<tr>")
            if rl:
                out.append(
                    "<th style='padding:2px 8px;font-family:monospace;font-weight:normal'>"
                    f"{html.escape(_range_txt(rl, r))}</th>"
                )
            for devs in line:
                color = _PALETTE[devs[0].id % len(_PALETTE)] if devs else "#fff"
                label = html.escape(", ".join(_device_label(d) for d in devs) or "-")
                out.append(
                    f"<td style='border:1px solid #333;padding:6px 10px;background:{color};"
                    f"text-align:center;font-family:monospace'>{label}</td>"
                )
            out.append("</tr>")
        out.append("</table>")
    note = _fold_note(layout, shown, panel_dims, folded)
    if note:
        out.append(f"<div><i>{html.escape(note)}</i></div>")
    out.append("</div>")
    return "".join(out)


def show(
    x: Any = None,
    *,
    shape: Sequence[int] | None = None,
    dtype: Any = "float32",
    sharding: Any = None,
    mesh: Any = None,
    spec: PartitionSpec | None = None,
    dims: Sequence[int] | None = None,
    name: str = "x",
    format: str = "terminal",
    file: TextIO | None = None,
) -> str | None:
    """Shows which device holds which block of an array of any rank.

    Args:
      x: a sharded ``jax.Array`` (or ``ShapeDtypeStruct`` with a sharding). Or leave it out
        and pass ``shape=`` with ``sharding=`` or ``mesh=`` + ``spec=``.
      dims: the two dims to draw (default: the sharded ones first). Other dims are folded;
        a note says which.
      name: the array's name in the header.
      format: ``"terminal"`` (rich; colour only on a TTY), ``"text"`` (plain text, returned and
        printed) or ``"html"`` (returned, not printed).
      file: where to print (default ``sys.stdout``).

    Returns:
      The text or HTML for ``"text"``/``"html"``; ``None`` for ``"terminal"``.

    Raises:
      TypeError: nothing to show. ValueError: bad ``dims``, or a spec that does not fit.

    Example:
      >>> mesh = make_mesh({"data": 4, "model": 2})
      >>> show(shape=(8, 8, 4), mesh=mesh, spec=P("data", None, "model"), format="text")

    See also: :func:`shard_table`, ``jax.debug.visualize_array_sharding`` (2-D only).
    """
    layout = layout_of(x, shape=shape, dtype=dtype, sharding=sharding, mesh=mesh, spec=spec)
    if format == "html":
        return _render_html(layout, name, dims)
    file = sys.stdout if file is None else file
    if format == "text":
        text = _render_text(layout, name, dims)
        print(text, file=file)
        return text
    if format != "terminal":
        raise ShardkitValueError(f"format={format!r}: use 'terminal', 'text' or 'html'.")
    from rich.console import Console

    Console(file=file, highlight=False).print(_render_rich(layout, name, dims))
    return None


def shard_table(x: Any = None, **kwargs: Any) -> list[dict[str, Any]]:
    """One row per device: device, process, index slices, shard shape, bytes.

    Accepts what :func:`layout_of` accepts. Print it with :func:`format_rows`.
    """
    layout = layout_of(x, **kwargs)
    rows = []
    for dev in sorted(layout.indices, key=lambda d: d.id):
        b = layout.block(dev)
        shard_shape = tuple(hi - lo for lo, hi in b)
        rows.append(
            {
                "device": _device_label(dev),
                "process": dev.process_index,
                "index": "[" + ", ".join(f"{lo}:{hi}" for lo, hi in b) + "]",
                "shard_shape": shard_shape,
                "bytes": int(math.prod(shard_shape)) * layout.dtype.itemsize,
            }
        )
    return rows


def tree_table(tree: Any, specs: Any = None, mesh: Any = None) -> list[dict[str, Any]]:
    """One row per leaf: path, shape, dtype, spec notation, bytes per device.

    Args:
      tree: a pytree of arrays (their shardings are read) or ShapeDtypeStructs.
      specs: a tree of PartitionSpec or a :class:`~shardkit.Rules` (default: the arrays' own).
      mesh: needed with ``specs`` to compute bytes per device.
    """
    leaves = leaf_path_items(tree)
    if specs is None:
        own, meshes = [], []
        for _, leaf in leaves:
            sh = getattr(leaf, "sharding", None)
            own.append(getattr(sh, "spec", PartitionSpec()))
            if getattr(sh, "mesh", None) is not None and sh.mesh not in meshes:
                meshes.append(sh.mesh)
        if mesh is None and len(meshes) == 1:  # leaves on several meshes: each read on its own
            mesh = meshes[0]
        report = lint(tree, jax.tree.structure(tree, is_leaf=is_variable).unflatten(own), mesh)
    else:
        report = lint(tree, specs, mesh)
    problems: dict[str, list[str]] = {}
    for f in report.errors:  # a layout that cannot be placed says so in its row
        problems.setdefault(f.path, []).append(f.code)
    rows = [
        {
            "path": leaf.path,
            "shape": leaf.shape,
            "dtype": leaf.dtype,
            "spec": _row_spec(leaf.shape, leaf.spec, problems.get(leaf.path, [])),
            "bytes_per_device": leaf.bytes_per_device,
        }
        for leaf in report.leaves
    ]
    if specs is None:  # each array on its own mesh: its own shard's bytes
        for row, (_, x) in zip(rows, leaves, strict=True):
            sharding = getattr(x, "sharding", None)
            if hasattr(sharding, "shard_shape"):
                row["bytes_per_device"] = math.prod(sharding.shard_shape(row["shape"])) * (
                    x.dtype.itemsize
                )
    return rows


def _row_spec(shape: tuple[int, ...], spec: PartitionSpec | None, errors: list[str]) -> str:
    """A tree_table row's spec: its notation, with the lint errors that stop it, if any."""
    if spec is None:
        return "(unmatched)"
    text = spec_notation(shape, spec, name="") if len(spec) <= len(shape) else str(spec)
    return f"{text} (error: {', '.join(errors)})" if errors else text


def format_rows(rows: Sequence[Mapping[str, Any]], *, title: str | None = None) -> str:
    """Plain-text table of dict rows (bytes columns human-readable)."""
    if not rows:
        return (title + "\n" if title else "") + "(empty)"
    cols = list(rows[0])
    cells = [[format_bytes(r[c]) if "bytes" in c else str(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = [title] if title else []
    lines.append("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def diff_specs(a: Any, b: Any) -> list[tuple[str, PartitionSpec | None, PartitionSpec | None]]:
    """Leaves whose specs differ between two spec trees (or trees of sharded arrays).

    Returns ``[(path, spec in a, spec in b)]``; a leaf missing on one side shows ``None``.
    Specs are compared after dropping trailing ``None`` entries (``P('x')`` == ``P('x', None)``).
    """

    def specs_of(tree):
        out = {}
        for path, leaf in leaf_path_items(tree):
            if isinstance(leaf, PartitionSpec):
                out[path] = leaf
            elif isinstance(leaf, Sharding):  # a NamedSharding compares by its spec
                out[path] = getattr(leaf, "spec", None)
            elif hasattr(leaf, "sharding"):
                out[path] = getattr(leaf.sharding, "spec", None)
            else:
                out[path] = None
        return out

    def norm(s):
        if s is None:
            return None
        t = list(s)
        while t and t[-1] is None:
            t.pop()
        return tuple(t)

    sa, sb = specs_of(_specs_as_leaves(a)), specs_of(_specs_as_leaves(b))
    return [
        (p, sa.get(p), sb.get(p))
        for p in list(dict.fromkeys(itertools.chain(sa, sb)))
        if norm(sa.get(p)) != norm(sb.get(p))
    ]


def _specs_as_leaves(tree: Any) -> Any:
    return jax.tree.map(lambda x: x, tree, is_leaf=lambda x: isinstance(x, PartitionSpec))
