r"""Replica groups: the four spellings XLA prints, and the mesh axes a group spans.

A collective names the devices that communicate as groups of partition ids. XLA prints them as
explicit lists `{{0,1},{2,3}}`, as an iota `[2,4]<=[4,2]T(1,0)` (reshape, transpose, rows), as
mesh axes `mesh['axis_0'=4,'axis_1'=2] {'axis_1'}` (Shardy; optionally with
`device_ids=(...)` and sub-axes `'a':(1)2`), or as `{}` (everyone). `replica_groups` expands
any of them to lists of ids; `mesh_axes_of` finds the mesh axes along which the ids of a group
vary, since `jax.jit` gives partition id i to the device at row-major position i of the mesh.

Example:
    >>> from shardkit.inspection.hlo import parse_hlo
    >>> module = parse_hlo(
    ...     "HloModule m, num_partitions=8\n\nENTRY %main (p: f32[2]) -> f32[8] {\n"
    ...     "  %p = f32[2]{0} parameter(0)\n"
    ...     "  ROOT %ag = f32[8]{0} all-gather(%p), replica_groups=[2,4]<=[4,2]T(1,0), "
    ...     "dimensions={0}\n}\n")
    >>> instr = next(iter(module.collectives()))
    >>> replica_groups(instr, 8)
    [[0, 2, 4, 6], [1, 3, 5, 7]]
    >>> mesh_axes_of([[0, 2, 4, 6], [1, 3, 5, 7]], ("data", "model"), (4, 2), pairs=False)
    (('data',), '')
"""

from __future__ import annotations

import math
import re

from shardkit.errors import ShardkitValueError
from shardkit.inspection.hlo import Instruction


def _iota_groups(spec: str) -> list[list[int]] | None:
    """`[2,4]<=[4,2]T(1,0)` -> groups (rows of the reshaped, transposed iota)."""
    m = re.fullmatch(r"\s*\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?\s*", spec)
    if not m:
        return None
    out_dims = [int(d) for d in m.group(1).split(",")]
    in_dims = [int(d) for d in m.group(2).split(",")]
    perm = [int(d) for d in m.group(3).split(",")] if m.group(3) else list(range(len(in_dims)))
    total = math.prod(in_dims)
    # Element at transposed multi-index j has source index sum(j_k * stride[perm[k]]).
    strides = [math.prod(in_dims[i + 1 :]) for i in range(len(in_dims))]
    t_dims = [in_dims[p] for p in perm]
    flat = []
    for idx in range(total):
        rem = idx
        src = 0
        for k in range(len(t_dims) - 1, -1, -1):
            rem, j = divmod(rem, t_dims[k])
            src += j * strides[perm[k]]
        flat.append(src)
    if len(out_dims) == 1:
        return [flat]
    size = math.prod(out_dims[1:])
    return [flat[i : i + size] for i in range(0, total, size)]


class _Unreadable(ShardkitValueError):
    """Why a `mesh[...] {...}` spelling could not be read (`replica_groups` adds where)."""


class _Reader:
    """A cursor over a `mesh['a'=4,'b'=2](, device_ids=(...))? {'b'}` spelling.

    Axis names are quoted (`'data parallel'`, `'a]b'`, `'y,2'`: anything but a quote, which
    JAX cannot compile) or bare (`data`, or `0` for an axis index); a quoted name ends at the
    next quote, so no character inside it is read as a separator.
    """

    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def take(self, token: str) -> bool:
        self.skip()
        if self.text.startswith(token, self.pos):
            self.pos += len(token)
            return True
        return False

    def expect(self, token: str, what: str) -> None:
        if not self.take(token):
            raise _Unreadable(f"expected {token!r} {what} at character {self.pos}")

    def name(self, stops: str) -> str:
        """A quoted name, or a bare one running up to one of `stops`."""
        self.skip()
        if self.take("'"):
            end = self.text.find("'", self.pos)
            if end < 0:
                raise _Unreadable(f"no closing quote for the name at character {self.pos - 1}")
            out, self.pos = self.text[self.pos : end], end + 1
            return out
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in stops:
            self.pos += 1
        out = self.text[start : self.pos].strip()
        if not out:
            raise _Unreadable(f"expected a mesh axis name at character {start}")
        return out

    def integer(self, what: str) -> int:
        self.skip()
        m = re.compile(r"\d+").match(self.text, self.pos)
        if not m:
            raise _Unreadable(f"expected the {what} (an integer) at character {self.pos}")
        self.pos = m.end()
        return int(m.group())

    def balanced(self, open_: str, close: str) -> str:
        """The text up to the `close` matching an `open_` just read."""
        depth, start = 1, self.pos
        while self.pos < len(self.text):
            c = self.text[self.pos]
            depth += (c == open_) - (c == close)
            self.pos += 1
            if depth == 0:
                return self.text[start : self.pos - 1]
        raise _Unreadable(f"no closing {close!r} for the {open_!r} at character {start - 1}")


def _read_mesh(spec: str) -> tuple[list[str], list[int], str | None, list[tuple[str, int, int]]]:
    """(axis names, sizes, device_ids text or None, refs as (name, pre, size; 0 = whole))."""
    r = _Reader(spec)
    r.expect("mesh[", "to open the mesh axes")
    names, sizes = [], []
    while True:
        names.append(r.name("=]"))
        r.expect("=", f"after mesh axis {names[-1]!r}")
        sizes.append(r.integer(f"size of mesh axis {names[-1]!r}"))
        if r.take("]"):
            break
        r.expect(",", "between mesh axes")
    ids = r.balanced("(", ")") if r.take(",") and r.take("device_ids=(") else None
    r.expect("{", "to open the set of mesh axes the groups span")
    refs: list[tuple[str, int, int]] = []
    while not r.take("}"):
        if refs:
            r.expect(",", "between mesh axes")
        name, pre, size = r.name(":,}"), 1, 0
        if r.take(":("):
            pre = r.integer("sub-axis pre-size")
            r.expect(")", "after the sub-axis pre-size")
            size = r.integer("sub-axis size")
        refs.append((name, pre, size))
        r.skip()
        if r.pos >= len(spec):
            raise _Unreadable("no closing '}' for the set of mesh axes")
    return names, sizes, ids, refs


def _mesh_groups(spec: str) -> list[list[int]]:
    """`mesh['a'=4,'b'=2] {'b'}` (optionally `, device_ids=(...)`, sub-axes `'a':(1)2`)."""
    names, sizes, ids_text, named_refs = _read_mesh(spec)
    total = math.prod(sizes)
    ids = _device_ids(ids_text, total) if ids_text is not None else list(range(total))
    if ids is None or len(ids) != total:
        raise _Unreadable(f"device_ids=({ids_text}) does not list the {total} devices")
    refs = []
    for name, pre, size in named_refs:
        if name in names:
            ax = names.index(name)
        elif name.isdigit() and int(name) < len(names):  # an axis index (a mesh without names)
            ax = int(name)
        else:
            raise _Unreadable(f"mesh axis {name!r} is not one of the mesh axes {names}")
        refs.append((ax, pre, size or sizes[ax]))
    groups: dict[tuple[int, ...], list[tuple[tuple[int, ...], int]]] = {}
    for pos in range(total):
        coords = _unravel(pos, sizes)
        key = list(coords)
        sel = []
        for ax, pre, size in refs:
            # sub-axis 'a':(pre)size: pre is the product of the sub-axes major to it
            stride = sizes[ax] // (pre * size)
            part = (coords[ax] // stride) % size
            sel.append(part)
            key[ax] -= part * stride
        groups.setdefault(tuple(key), []).append((tuple(sel), ids[pos]))
    return [[d for _, d in sorted(g)] for g in groups.values()]


def _device_ids(text: str, total: int) -> list[int] | None:
    """`device_ids=(...)`: an explicit list `0,2,1,3` or an iota `[2,2,2]T(1,0,2)`."""
    text = text.strip()
    if not text.startswith("["):
        return [int(d) for d in re.findall(r"\d+", text)]
    if "<=" not in text:  # `[dims]T(perm)`: iota(total) reshaped to dims, then transposed
        text = f"[{total}]<={text}"
    groups = _iota_groups(text)
    return None if groups is None else [i for g in groups for i in g]


def _unravel(index: int, sizes: list[int] | tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for s in reversed(sizes):
        index, r = divmod(index, s)
        out.append(r)
    return tuple(reversed(out))


def replica_groups(instr: Instruction, num_partitions: int) -> list[list[int]]:
    r"""The groups of partition ids a collective runs over.

    For `collective-permute` this returns the `source_target_pairs` as two-element groups.
    An empty `replica_groups={}` means one group of all `num_partitions` partitions.

    Args:
        instr: a collective instruction.
        num_partitions: the module's partition count.

    Returns:
        A list of groups, each a list of partition ids.

    Raises:
        ValueError: when the spelling of the groups is not one XLA prints.

    Example:
        >>> from shardkit.inspection.hlo import parse_hlo
        >>> text = ("HloModule m, num_partitions=8\n\nENTRY %main (p: f32[2]) -> f32[2] {\n"
        ...         "  %p = f32[2]{0} parameter(0)\n  ROOT %r = f32[2]{0} all-reduce(%p), "
        ...         "replica_groups=[2,4]<=[4,2]T(1,0), to_apply=%add\n}\n")
        >>> replica_groups(next(iter(parse_hlo(text).collectives())), 8)
        [[0, 2, 4, 6], [1, 3, 5, 7]]
    """
    key = "source_target_pairs" if instr.kind == "collective-permute" else "replica_groups"
    raw = instr.attr(key)
    if raw is None or raw.strip() in ("{}", ""):
        return [list(range(num_partitions))] if key == "replica_groups" else []
    raw = raw.strip()
    if raw.startswith("{"):
        return [[int(x) for x in re.findall(r"\d+", g)] for g in re.findall(r"\{([^{}]*)\}", raw)]
    why = ""
    try:
        groups = _iota_groups(raw) if raw.startswith("[") else _mesh_groups(raw)
    except _Unreadable as e:
        groups, why = None, f": {e}"
    if groups is None:
        raise ShardkitValueError(
            f"{key}={raw} of %{instr.name} is not a spelling of replica groups shardkit "
            f"can read{why}. Known spellings: explicit {{{{...}}}}, iota [..]<=[..], "
            "mesh['axis'=size,...] {'axis'}; fix: report the HLO line to shardkit, or name "
            "the mesh axes with plain words (jax.make_mesh(..., ('data', 'model')))."
        )
    return groups


def mesh_axes_of(
    groups: list[list[int]], names: tuple[str, ...], sizes: tuple[int, ...], *, pairs: bool
) -> tuple[tuple[str, ...] | None, str]:
    """The mesh axes over which partition ids in the groups vary, and a partial-coverage note.

    Partition id i is the device at position `unravel(i, sizes)` of the mesh (jit assigns
    devices in the mesh's row-major order). `pairs` marks collective-permute source-target
    pairs, which span the axes they move along without covering them.
    """
    total = math.prod(sizes)
    if not groups or any(i >= total for g in groups for i in g):
        return None, ""
    varying: set[int] = set()
    for g in groups:
        coords = [_unravel(i, sizes) for i in g]
        for k in range(len(sizes)):
            if len({c[k] for c in coords}) > 1:
                varying.add(k)
    axes = tuple(names[k] for k in sorted(varying))
    if pairs:
        return axes, ""
    span = math.prod(sizes[k] for k in varying)
    if all(len(set(g)) == span for g in groups):
        return axes, ""
    return axes, f"{len(set(groups[0]))} of {span} devices"
