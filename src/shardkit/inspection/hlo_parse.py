"""The parser of compiled HLO text: shapes, instructions, computations and source tables.

`parse_hlo(compiled.as_text())` splits the text into computations and instructions and reads
the source tables (`FileNames`, `FunctionNames`, `FileLocations`, `StackFrames`) printed at the
top. Plain string work, no JAX: it also reads HLO saved from a GPU or TPU run. The public names
are re-exported by `shardkit.inspection.hlo`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

from shardkit.errors import ShardkitTypeError, ShardkitValueError

COLLECTIVE_KINDS = (
    "all-gather",
    "all-reduce",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
)

# Shapes

_DTYPE_BITS = {
    "pred": 8,
    "s2": 2,
    "u2": 2,
    "s4": 4,
    "u4": 4,
    "s8": 8,
    "u8": 8,
    "s16": 16,
    "u16": 16,
    "f16": 16,
    "bf16": 16,
    "s32": 32,
    "u32": 32,
    "f32": 32,
    "s64": 64,
    "u64": 64,
    "f64": 64,
    "c64": 64,
    "c128": 128,
    "token": 0,
}
_ARRAY_RE = re.compile(r"\b([a-z]+[0-9a-z]*)\[([0-9,]*)\]")


@dataclasses.dataclass(frozen=True)
class ArrayShape:
    """One array of an HLO shape: dtype name as HLO spells it (`f32`, `bf16`) and dimensions."""

    dtype: str
    dims: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Size in bytes (sub-byte types rounded up)."""
        bits = _DTYPE_BITS.get(self.dtype, 8 if self.dtype.startswith("f8") else 32)
        return (math.prod(self.dims) * bits + 7) // 8

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


def parse_shape(text: str) -> tuple[ArrayShape, ...]:
    """Arrays of an HLO shape string (`f32[8,4]{1,0}` or a tuple of them), in order.

    Example:
        >>> parse_shape("(f32[4,4]{1,0}, bf16[2]{0})")
        (ArrayShape(dtype='f32', dims=(4, 4)), ArrayShape(dtype='bf16', dims=(2,)))
    """
    out = []
    for m in _ARRAY_RE.finditer(text):
        dims = tuple(int(d) for d in m.group(2).split(",") if d)
        out.append(ArrayShape(m.group(1), dims))
    return tuple(out)


# --------------------------------------------------------------------------------------------
# Instructions and computations

_COMP_RE = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\))?\s*->\s*.*\{\s*$")
_INSTR_RE = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][a-z0-9\-]*)\((.*)$")
_NAME_RE = re.compile(r"%([\w.\-]+)")
_TRIP_RE = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_FRAME_ID_RE = re.compile(r"stack_frame_id=(\d+)")
_OP_NAME_RE = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')


@dataclasses.dataclass
class Instruction:
    """One HLO instruction, as printed.

    Attributes:
        name: instruction name without `%`.
        opcode: e.g. `all-gather`, `all-gather-start`, `while`, `fusion`.
        shape: the result shape text, e.g. `f32[64,16]{1,0}`.
        operands: names of the operands, in order.
        attrs: everything after the operand list (attributes, metadata, backend_config).
        computation: name of the computation holding it.
        is_root: whether it is the computation's ROOT.
    """

    name: str
    opcode: str
    shape: str
    operands: tuple[str, ...]
    attrs: str
    computation: str
    is_root: bool = False

    @property
    def arrays(self) -> tuple[ArrayShape, ...]:
        """Arrays of the result shape."""
        return parse_shape(self.shape)

    @property
    def op_name(self) -> str | None:
        """The `op_name` metadata (JAX's name stack, e.g. `jit(f)/dot_general`)."""
        m = _OP_NAME_RE.search(self.attrs)
        return m.group(1) if m else None

    @property
    def stack_frame_id(self) -> int | None:
        """The `stack_frame_id` metadata, an index into the module's StackFrames table."""
        m = _FRAME_ID_RE.search(self.attrs)
        return int(m.group(1)) if m else None

    def attr(self, key: str) -> str | None:
        """The raw text of attribute `key` (balanced braces kept), or None when absent."""
        return _attr_value(self.attrs, key)

    @property
    def kind(self) -> str | None:
        """The collective kind (`all-gather`, ...) for a collective or its `-start`, else None."""
        op = self.opcode[:-6] if self.opcode.endswith("-start") else self.opcode
        return op if op in COLLECTIVE_KINDS else None

    @property
    def trip_count(self) -> int | None:
        """For a while loop: the trip count XLA states in backend_config, else None."""
        m = _TRIP_RE.search(self.attrs)
        return int(m.group(1)) if m else None


@dataclasses.dataclass(frozen=True)
class SourceFrame:
    """One frame of a Python traceback recorded in the HLO source tables."""

    file: str
    line: int
    function: str
    column: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclasses.dataclass
class HloModule:
    """A parsed compiled program.

    Attributes:
        name: the module name (`jit_f`).
        entry: name of the ENTRY computation.
        computations: computation name -> its instructions, in order.
        num_partitions: SPMD partitions (devices of the mesh the program runs on).
        num_replicas: replicas (1 for jit programs).
        frames: stack frame id -> (SourceFrame, parent frame id or None).
    """

    name: str
    entry: str
    computations: dict[str, list[Instruction]]
    num_partitions: int = 1
    num_replicas: int = 1
    frames: dict[int, tuple[SourceFrame, int | None]] = dataclasses.field(default_factory=dict)

    def instructions(self):
        """All instructions of all computations."""
        for instrs in self.computations.values():
            yield from instrs

    def collectives(self) -> list[Instruction]:
        """The collective instructions (async pairs once: the `-start` half), in text order."""
        return [i for i in self.instructions() if i.kind is not None]

    def symbol(self, computation: str, name: str) -> Instruction | None:
        """The instruction `name` of `computation`, or None."""
        return self.table(computation).get(name)

    def table(self, computation: str) -> dict[str, Instruction]:
        """Instruction name -> instruction, for `computation` (empty when it does not exist)."""
        return self._tables().get(computation, {})

    def _tables(self) -> dict[str, dict[str, Instruction]]:
        tables = self.__dict__.get("_symtab")
        if tables is None:
            tables = {c: {i.name: i for i in instrs} for c, instrs in self.computations.items()}
            self.__dict__["_symtab"] = tables
        return tables

    def users(self, computation: str) -> dict[str, tuple[str, ...]]:
        """Instruction name -> names of the instructions of `computation` that use its result."""
        cache = self.__dict__.setdefault("_users", {})
        if computation not in cache:
            out: dict[str, list[str]] = {}
            for ins in self.computations.get(computation, ()):
                for op in ins.operands:
                    out.setdefault(op, []).append(ins.name)
            cache[computation] = {k: tuple(v) for k, v in out.items()}
        return cache[computation]

    def traceback(self, frame_id: int | None) -> tuple[SourceFrame, ...]:
        """The Python traceback of `frame_id`, innermost frame first."""
        out: list[SourceFrame] = []
        seen: set[int] = set()
        while frame_id is not None and frame_id in self.frames and frame_id not in seen:
            seen.add(frame_id)
            frame, frame_id = self.frames[frame_id]
            out.append(frame)
        return tuple(out)


def _matching(text: str, start: int, open_: str, close: str, quotes: str = '"') -> int:
    """Index just past the bracket closing the one at `start` (brackets inside strings quoted
    with one of `quotes` do not count; a mesh's axis names are quoted with `'`)."""
    depth = 0
    in_str = ""
    i = start
    n = len(text)
    while i < n:
        c = text[i]
        if in_str:
            if c == "\\" and in_str == '"':
                i += 1
            elif c == in_str:
                in_str = ""
        elif c in quotes:
            in_str = c
        elif c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


def _attr_value(attrs: str, key: str) -> str | None:
    m = re.search(r"(?:^|[\s,])" + re.escape(key) + r"=", attrs)
    if not m:
        return None
    i = m.end()
    if i < len(attrs) and attrs[i] == "{":
        return attrs[i : _matching(attrs, i, "{", "}")]
    if attrs.startswith("mesh[", i):
        # mesh['a'=4,'b'=2](, device_ids=(...))? {'a'}
        j = _matching(attrs, i + 4, "[", "]", quotes="'")
        if attrs.startswith(", device_ids=(", j):
            j = _matching(attrs, j + len(", device_ids="), "(", ")")
        k = attrs.find("{", j)
        return attrs[i : _matching(attrs, k, "{", "}", quotes="'")] if k >= 0 else attrs[i:j]
    j = i
    depth = 0
    while j < len(attrs):
        c = attrs[j]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            break
        j += 1
    return attrs[i:j].strip()


def _unquote(s: str) -> str:
    s = s.strip()
    if len(s) >= 2 and s[0] == '"' and s[-1] == '"':
        return json.loads(s)
    return s


def _parse_tables(lines: list[str]) -> dict[int, tuple[SourceFrame, int | None]]:
    """Reads the FileNames / FunctionNames / FileLocations / StackFrames header tables."""
    tables: dict[str, dict[int, str]] = {}
    current = None
    for line in lines:
        s = line.strip()
        if s in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            current = tables.setdefault(s, {})
            continue
        if not s:
            continue
        if current is None:
            continue
        key, _, rest = s.partition(" ")
        if not key.isdigit():
            current = None
            continue
        current[int(key)] = rest
    files = {k: _unquote(v) for k, v in tables.get("FileNames", {}).items()}
    funcs = {k: _unquote(v) for k, v in tables.get("FunctionNames", {}).items()}
    locs: dict[int, SourceFrame] = {}
    for k, v in tables.get("FileLocations", {}).items():
        f = dict(re.findall(r"(\w+)=(-?\d+)", v))
        locs[k] = SourceFrame(
            file=files.get(int(f.get("file_name_id", 0)), "?"),
            line=int(f.get("line", 0)),
            function=funcs.get(int(f.get("function_name_id", 0)), "?"),
            column=int(f["column"]) if "column" in f else None,
        )
    frames: dict[int, tuple[SourceFrame, int | None]] = {}
    for k, v in tables.get("StackFrames", {}).items():
        f = dict(re.findall(r"(\w+)=(-?\d+)", v))
        loc = locs.get(int(f.get("file_location_id", 0)))
        if loc is None:
            continue
        # The printed parent_frame_id is one more than the parent's id; 0 or 1 (itself for
        # the first frame) means "no parent".
        parent = int(f.get("parent_frame_id", 0)) - 1
        frames[k] = (loc, parent if 0 < parent < k else None)
    return frames


def parse_hlo(text: str) -> HloModule:
    """Parses the text of a compiled HLO module (`compiled.as_text()`).

    Args:
        text: HLO text with an `HloModule` header line.

    Returns:
        An `HloModule` with every computation's instructions and the source tables.

    Raises:
        ValueError: when `text` holds no HloModule (e.g. StableHLO from `lowered.as_text()`).

    Example:
        >>> mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
        >>> x = jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=NamedSharding(mesh, P("x")))
        >>> module = parse_hlo(jax.jit(lambda a: a.sum()).lower(x).compile().as_text())
        >>> module.num_partitions
        8
    """
    if not isinstance(text, str):
        raise ShardkitTypeError(
            f"parse_hlo(text=...) expects the str of compiled.as_text(); got "
            f"{type(text).__name__}; fix: parse_hlo(jax.jit(f).lower(x).compile().as_text())."
        )
    head, sep, _ = text.partition("\n")
    hm = re.search(r"HloModule\s+([\w.\-]+)", head) if sep or head else None
    if hm is None:
        hm = re.search(r"^HloModule\s+([\w.\-]+)", text, re.M)
    if hm is None:
        hint = " (this looks like StableHLO)" if "func.func" in text[:4000] else ""
        raise ShardkitValueError(
            "parse_hlo(text=...): no `HloModule` header found" + hint + "; fix: pass the text "
            "of a compiled program, jax.jit(f).lower(*args).compile().as_text(), not "
            "lowered.as_text()."
        )
    header = text[hm.start() : text.find("\n", hm.start()) if "\n" in text else len(text)]
    parts = re.search(r"num_partitions=(\d+)", header)
    reps = re.search(r"replica_count=(\d+)", header)
    lines = text.splitlines()
    comps: dict[str, list[Instruction]] = {}
    entry = ""
    current: list[Instruction] | None = None
    comp_name = ""
    table_lines: list[str] = []
    for line in lines:
        if current is None:
            if line.startswith("%") or line.startswith("ENTRY"):
                m = _COMP_RE.match(line)
                if m:
                    comp_name = m.group(2)
                    current = comps.setdefault(comp_name, [])
                    if m.group(1):
                        entry = comp_name
                    continue
            elif line and not line.startswith("HloModule"):
                table_lines.append(line)
            continue
        if line.startswith("}"):
            current = None
            continue
        m = _INSTR_RE.match(line)
        if not m:
            continue
        rest = m.group(5)
        close = _matching("(" + rest, 0, "(", ")") - 1
        operands = tuple(_NAME_RE.findall(rest[: close - 1]))
        current.append(
            Instruction(
                name=m.group(2),
                opcode=m.group(4),
                shape=m.group(3),
                operands=operands,
                attrs=rest[close:].lstrip(", "),
                computation=comp_name,
                is_root=bool(m.group(1)),
            )
        )
    if not entry and comps:
        entry = next(reversed(comps))
    return HloModule(
        name=hm.group(1),
        entry=entry,
        computations=comps,
        num_partitions=int(parts.group(1)) if parts else 1,
        num_replicas=int(reps.group(1)) if reps else 1,
        frames=_parse_tables(table_lines),
    )
