"""Parsing of compiled HLO text: instructions, collectives, replica groups, loops, source lines.

The text of `jax.jit(f).lower(...).compile().as_text()` is the truth about what runs: the SPMD
partitioner has inserted every collective by then. This module reads that text without JAX (it is
plain string work, so it also reads HLO saved from a GPU or TPU run):

- `parse_hlo(text)` splits it into computations and instructions, and reads the source tables
  (`FileNames`, `FunctionNames`, `FileLocations`, `StackFrames`) printed at the top;
- `execution_counts(module)` multiplies through while loops whose trip count XLA states;
- `collective_counts(text)` is the quick static count used throughout shardkit's tests;
  `collective_summary(text)` writes it on one line.

Replica groups are decoded in `shardkit.inspection.groups`. The parser lives in `hlo_parse`,
loop counts in `hlo_loops`, source attribution in `hlo_source`; this module gathers their
public names.

Example:
    >>> mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    >>> x = jax.ShapeDtypeStruct((64, 32), jnp.float32,
    ...                          sharding=NamedSharding(mesh, P("data", "model")))
    >>> compiled = jax.jit(lambda a: (a @ a.T).sum(0)).lower(x).compile()
    >>> module = parse_hlo(compiled.as_text())
    >>> [i.opcode for i in module.collectives()]
    ['all-gather', 'all-reduce', 'all-reduce']
"""

from __future__ import annotations

import collections
import re

from shardkit.inspection.hlo_loops import conditional_matches, execution_counts
from shardkit.inspection.hlo_parse import (
    COLLECTIVE_KINDS,
    ArrayShape,
    HloModule,
    Instruction,
    SourceFrame,
    parse_hlo,
    parse_shape,
)
from shardkit.inspection.hlo_source import is_library_frame, source_of, user_frame

__all__ = [
    "COLLECTIVE_KINDS",
    "ArrayShape",
    "HloModule",
    "Instruction",
    "SourceFrame",
    "collective_counts",
    "collective_summary",
    "conditional_matches",
    "execution_counts",
    "is_library_frame",
    "parse_hlo",
    "parse_shape",
    "source_of",
    "user_frame",
]

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
        >>> mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
        >>> x = jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=NamedSharding(mesh, P("x")))
        >>> compiled = jax.jit(lambda a: a * 2).lower(x).compile()
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
