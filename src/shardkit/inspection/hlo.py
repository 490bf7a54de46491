"""Parsing of compiled HLO text: instructions, collectives, replica groups, loops, source lines.

The text of `jax.jit(f).lower(...).compile().as_text()` is the truth about what runs: the SPMD
partitioner has inserted every collective by then. This module reads that text without JAX (it is
plain string work, so it also reads HLO saved from a GPU or TPU run):

- `parse_hlo(text)` splits it into computations and instructions, and reads the source tables
  (`FileNames`, `FunctionNames`, `FileLocations`, `StackFrames`) printed at the top;
- `execution_counts(module)` multiplies through while loops whose trip count XLA states;
- `collective_counts(text)` is the quick static count used throughout shardkit's tests;
  `collective_summary(text)` writes it on one line.

Replica groups are decoded in `shardkit.inspection.groups`.

Example:
    >>> module = parse_hlo(compiled.as_text())
    >>> [i.opcode for i in module.collectives()]
    ['all-gather', 'all-reduce']
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import re
import sysconfig
from collections.abc import Mapping, Sequence

COLLECTIVE_KINDS = (
    "all-gather",
    "all-reduce",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
)

# An instruction line: `%name = <type> kind(` or `kind-start(`; the `-done` half of an async
# pair is not counted again. Types may be tuples, so match the op name after the `=` loosely.
_OP_RE = re.compile(
    r"=\s.*?\s(" + "|".join(re.escape(k) for k in COLLECTIVE_KINDS) + r")(?:-start)?\("
)


def collective_counts(hlo_text: str) -> collections.Counter[str]:
    """Counts the collective instructions in compiled HLO text, async pairs once.

    Occurrences are static: a collective inside a while loop counts once here (the audit in
    `shardkit.inspect` multiplies by trip counts).

    Args:
        hlo_text: the text of a compiled program, `compiled.as_text()`.

    Returns:
        A Counter with a key for each of `COLLECTIVE_KINDS` (zero when absent).

    Example:
        >>> compiled = jax.jit(f).lower(x).compile()
        >>> collective_counts(compiled.as_text())["all-gather"]
        0

    See also:
        `parse_hlo`, `shardkit.inspect`.
    """
    counts: collections.Counter[str] = collections.Counter({k: 0 for k in COLLECTIVE_KINDS})
    for line in hlo_text.splitlines():
        m = _OP_RE.search(line)
        if m:
            counts[m.group(1)] += 1
    return counts


def collective_summary(hlo_text: str) -> str:
    """The collectives of compiled HLO text in one line, e.g. ``'all-reduce x1'`` or ``'none'``.

    Counts are static, as in :func:`collective_counts`.
    """
    counts = collective_counts(hlo_text)
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()) if v) or "none"


# --------------------------------------------------------------------------------------------
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
_SPMD_GENERATED = 'is_spmd_generated="true"'
_SOURCE_RE = re.compile(r'source_file="((?:[^"\\]|\\.)*)"\s+source_line=(\d+)')
_CALLEE_RE = re.compile(
    r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
)
_BRANCHES_RE = re.compile(r"\bbranch_computations=\{([^}]*)\}")


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
        table = self._tables().get(computation)
        return table.get(name) if table else None

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


def _matching(text: str, start: int, open_: str, close: str) -> int:
    """Index just past the bracket closing the one at `start`."""
    depth = 0
    in_str = False
    i = start
    n = len(text)
    while i < n:
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
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
        j = _matching(attrs, i + 4, "[", "]")
        if attrs.startswith(", device_ids=(", j):
            j = _matching(attrs, j + len(", device_ids="), "(", ")")
        k = attrs.find("{", j)
        return attrs[i : _matching(attrs, k, "{", "}")] if k >= 0 else attrs[i:j]
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
        >>> module = parse_hlo(jax.jit(f).lower(x).compile().as_text())
        >>> module.num_partitions
        8
    """
    if not isinstance(text, str):
        raise TypeError(
            f"parse_hlo(text=...) expects the str of compiled.as_text(); got "
            f"{type(text).__name__}. Fix: parse_hlo(jax.jit(f).lower(x).compile().as_text())."
        )
    head, sep, _ = text.partition("\n")
    hm = re.search(r"HloModule\s+([\w.\-]+)", head) if sep or head else None
    if hm is None:
        hm = re.search(r"^HloModule\s+([\w.\-]+)", text, re.M)
    if hm is None:
        hint = " (this looks like StableHLO)" if "func.func" in text[:4000] else ""
        raise ValueError(
            "parse_hlo(text=...): no `HloModule` header found" + hint + ". Fix: pass the text "
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


# --------------------------------------------------------------------------------------------
# Execution counts through loops


def conditional_matches(module: HloModule, key: str) -> list[Instruction]:
    """The `conditional` instructions that `key` names, in text order.

    A key names a conditional by its instruction name (`conditional.3`) or by one component
    of its `op_name` (JAX's name stack, e.g. the `jax.named_scope` it was traced under:
    `jit(f)/while/body/lane0/cond` has components `jit(f)`, `while`, `body`, `lane0`, `cond`).

    Example:
        >>> [c.name for c in conditional_matches(parse_hlo(text), "lane0")]
        ['conditional.7']
    """
    return [
        ins
        for ins in module.instructions()
        if ins.opcode == "conditional"
        and (ins.name == key or key in (ins.op_name or "").split("/"))
    ]


def _branches(ins: Instruction) -> list[str]:
    """Branch computations of a conditional, by branch index (false, true for a predicate)."""
    b = _BRANCHES_RE.search(ins.attrs)
    if b:
        return _NAME_RE.findall(b.group(1)) or [n.strip() for n in b.group(1).split(",")]
    named = dict(_CALLEE_RE.findall(ins.attrs))
    return [named[r] for r in ("false_computation", "true_computation") if r in named]


def _branch_weights(
    module: HloModule, branch_counts: Mapping[str, Sequence[int]]
) -> dict[tuple[str, str], tuple[int, ...]]:
    """(computation, conditional name) -> executions per branch, checked against the text."""
    out: dict[tuple[str, str], tuple[int, ...]] = {}
    for key, weights in branch_counts.items():
        weights = tuple(int(w) for w in weights)
        found = conditional_matches(module, key)
        if not found:
            names = sorted({i.op_name or i.name for i in module.instructions()
                            if i.opcode == "conditional"})  # fmt: skip
            raise ValueError(
                f"execution_counts(branch_counts=...): key {key!r} names no conditional of "
                f"module {module.name} (its conditionals: {names[:6] or 'none'}). Fix: key by "
                "an instruction name or an op_name component, e.g. the jax.named_scope the "
                "lax.switch runs under."
            )
        if min(weights, default=-1) < 0 or not sum(weights):
            raise ValueError(
                f"execution_counts(branch_counts=...): branch_counts[{key!r}] = {weights} "
                "must be executions per branch, >= 0 and not all 0. Fix: count how often "
                "each branch index is taken, e.g. numpy.bincount(indices, minlength=n)."
            )
        for ins in found:
            n = len(_branches(ins))
            if n != len(weights):
                raise ValueError(
                    f"execution_counts(branch_counts=...): branch_counts[{key!r}] has "
                    f"{len(weights)} counts but conditional {ins.name} has {n} branches. Fix: "
                    f"give one count per branch, in branch-index order ({n} values)."
                )
            where = (ins.computation, ins.name)
            if where in out and out[where] != weights:
                raise ValueError(
                    f"execution_counts(branch_counts=...): conditional {ins.name} is named by "
                    f"two keys with different counts ({out[where]} and {weights}). Fix: key "
                    "each conditional once."
                )
            out[where] = weights
    return out


def execution_counts(
    module: HloModule, branch_counts: Mapping[str, Sequence[int]] | None = None
) -> dict[str, int | None]:
    """How many times each computation runs per call of the ENTRY computation.

    While bodies run `known_trip_count` times per execution of the loop (conditions once more);
    when XLA states no trip count the result is None ("unknown"). Branches of a conditional
    count as if taken (an upper bound) unless `branch_counts` says how often each is taken.
    Fusion and reducer computations get their caller's count.

    Args:
        module: a parsed program.
        branch_counts: conditional key -> executions per branch (branch-index order; false,
            true for a predicated conditional), for conditionals whose branch is chosen by
            data, e.g. a `lax.switch` over a table inside a `lax.scan`. Of every sum(counts)
            executions of the conditional, branch k runs counts[k] times; a key is an
            instruction name or an `op_name` component (`conditional_matches`). Counts are
            exact when the conditional's executions are a multiple of sum(counts) (a
            conditional in the body of a scan over a table of sum(counts) rows), else rounded.

    Raises:
        ValueError: a key names no conditional, has the wrong number of counts, or counts
            below 0 or all 0.

    Example:
        >>> execution_counts(parse_hlo(text))["region_0.4_spmd"]   # body of a 5-step scan
        5
        >>> # a switch in that body taking branch 1 twice and branch 0 three times
        >>> execution_counts(parse_hlo(text), {"lane0": (3, 2)})["branch_1_fn.9"]
        2
    """
    weights = _branch_weights(module, branch_counts or {})
    calls: dict[str, list[tuple[str, str, Instruction, int]]] = collections.defaultdict(list)
    for comp, instrs in module.computations.items():
        for ins in instrs:
            if "=" not in ins.attrs or ins.opcode.endswith(("-done", "-update")):
                continue  # the -done/-update half of an async op names the same callee
            if ins.opcode == "conditional":
                for k, callee in enumerate(_branches(ins)):
                    calls[callee].append((comp, "branch", ins, k))
                continue
            for role, callee in _CALLEE_RE.findall(ins.attrs):
                calls[callee].append((comp, role, ins, 0))
    counts: dict[str, int | None] = {}
    visiting: set[str] = set()

    def count(comp: str) -> int | None:
        if comp in counts:
            return counts[comp]
        if comp == module.entry:
            return 1
        if comp in visiting:  # recursion cannot happen in HLO; be safe
            return None
        visiting.add(comp)
        total: int | None = 0
        for caller, role, ins, k in calls.get(comp, []):
            c = count(caller)
            w = weights.get((caller, ins.name)) if role == "branch" else None
            if role in ("body", "condition"):
                trip = ins.trip_count
                mult = None if trip is None else trip + (role == "condition")
            else:
                mult = 1
            if c is None or mult is None or total is None:
                total = None
            elif w is not None:
                total += (2 * c * w[k] + sum(w)) // (2 * sum(w))  # c x w[k] / sum(w), rounded
            else:
                total += c * mult
        visiting.discard(comp)
        counts[comp] = total
        return total

    for comp in module.computations:
        counts[comp] = count(comp)
    return counts


# --------------------------------------------------------------------------------------------
# Source attribution

_LIB_MARKERS = ("/site-packages/", "/dist-packages/", "/jax/_src/", "/jaxlib/")


def _stdlib() -> str:
    try:
        return sysconfig.get_paths()["stdlib"]
    except (KeyError, OSError):  # pragma: no cover - exotic interpreters
        return "\0"


_STDLIB = _stdlib()


def is_library_frame(frame: SourceFrame) -> bool:
    """True for frames inside JAX, installed packages, the stdlib, or shardkit's audit and CLI."""
    f = frame.file.replace("\\", "/")
    return (
        any(m in f for m in _LIB_MARKERS)
        or f.startswith(_STDLIB)
        or "/shardkit/inspection/" in f
        or f.endswith("/shardkit/cli.py")
        or f.startswith("<frozen")
    )


def user_frame(traceback: tuple[SourceFrame, ...]) -> SourceFrame | None:
    """The innermost frame of `traceback` that is the user's code (library frames skipped)."""
    for frame in traceback:
        if not is_library_frame(frame):
            return frame
    return traceback[0] if traceback else None


def _own_source(module: HloModule, instr: Instruction) -> tuple[SourceFrame, ...]:
    tb = module.traceback(instr.stack_frame_id)
    if tb:
        return tb
    m = _SOURCE_RE.search(instr.attrs)
    if m:
        return (SourceFrame(file=m.group(1), line=int(m.group(2)), function="?"),)
    return ()


def source_of(module: HloModule, instr: Instruction) -> tuple[SourceFrame, ...]:
    """The traceback recorded for `instr`, innermost first (old `source_file=` form too).

    A collective the partitioner inserted (``is_spmd_generated``) may carry no source of its
    own: under Shardy (JAX 0.12) an all-gather that reshards an argument for a matmul is tagged
    only with the argument's name. It is then attributed to the nearest instruction that
    consumes its result and has a source (the op that needed the data moved), else to the
    nearest producer of its operands that has one (the op whose partial result it reduces).
    """
    tb = _own_source(module, instr)
    if tb or _SPMD_GENERATED not in instr.attrs:
        return tb
    table = module._tables().get(instr.computation, {})  # noqa: SLF001 - same module
    users = module.users(instr.computation)
    # consumers: through further inserted collectives (a gather over y, then over x, then the
    # FFT that needed both); producers: never through another collective
    for step, through in ((lambda i: users.get(i.name, ()), True), (lambda i: i.operands, False)):
        seen, frontier = {instr.name}, [instr]
        while frontier:
            nxt = []
            for ins in frontier:
                for name in step(ins):
                    other = table.get(name)
                    if other is None or name in seen:
                        continue
                    seen.add(name)
                    if other.kind is not None and not through:
                        continue
                    tb = _own_source(module, other)
                    if tb:
                        return tb
                    nxt.append(other)
            frontier = nxt
    return ()
