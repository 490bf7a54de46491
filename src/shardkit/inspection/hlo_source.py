"""Source attribution: the user's file and line for an instruction of a parsed HLO module,
from the stack-frame tables XLA prints (library frames skipped). The public names are
re-exported by `shardkit.inspection.hlo`."""

from __future__ import annotations

import re
import sysconfig

from shardkit.inspection.hlo_parse import HloModule, Instruction, SourceFrame

_SPMD_GENERATED = 'is_spmd_generated="true"'
_SOURCE_RE = re.compile(r'source_file="((?:[^"\\]|\\.)*)"\s+source_line=(\d+)')


_LIB_MARKERS = ("/site-packages/", "/dist-packages/", "/jax/_src/", "/jaxlib/")


def _stdlib() -> str:
    try:
        return sysconfig.get_paths()["stdlib"]
    except (KeyError, OSError):  # pragma: no cover - exotic interpreters
        return "\0"


_STDLIB = _stdlib()
# console-script launchers (`.venv/bin/shardkit`) and the CLI's command modules call the user's
# function; they are never the user's code
_SCRIPTS = (sysconfig.get_paths().get("scripts") or "\0").replace("\\", "/").rstrip("/") + "/"
_COMMAND = re.compile(r"/shardkit/(?:\w+/)?command\.py$")


def _is_machinery(file: str) -> bool:
    """shardkit's audit and CLI, and console-script launchers: callers, never the code."""
    return (
        file.startswith(_SCRIPTS)
        or "/shardkit/inspection/" in file
        or file.endswith("/shardkit/cli.py")
        or bool(_COMMAND.search(file))
    )


def is_library_frame(frame: SourceFrame) -> bool:
    """True for frames inside JAX, installed packages, the stdlib, console-script launchers,
    or shardkit's audit and CLI."""
    f = frame.file.replace("\\", "/")
    return (
        any(m in f for m in _LIB_MARKERS)
        or f.startswith(_STDLIB)
        or _is_machinery(f)
        or f.startswith("<frozen")
    )


def user_frame(traceback: tuple[SourceFrame, ...]) -> SourceFrame | None:
    """The innermost frame of `traceback` that is the user's code (library frames skipped);
    without one, the innermost library frame outside shardkit's audit, CLI and launchers; None
    when only those remain (a library function audited on its own, whose frames JAX hides)."""
    for frame in traceback:
        if not is_library_frame(frame):
            return frame
    for frame in traceback:
        if not _is_machinery(frame.file.replace("\\", "/")):
            return frame
    return None


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
    table = module.table(instr.computation)
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
