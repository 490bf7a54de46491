"""Parsing of compiled HLO text: collectives and their properties."""

from __future__ import annotations

import collections
import re

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

    Example:
        >>> compiled = jax.jit(f).lower(x).compile()
        >>> collective_counts(compiled.as_text())["all-gather"]
        0
    """
    counts: collections.Counter[str] = collections.Counter({k: 0 for k in COLLECTIVE_KINDS})
    for line in hlo_text.splitlines():
        m = _OP_RE.search(line)
        if m:
            counts[m.group(1)] += 1
    return counts
