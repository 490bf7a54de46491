"""`assert_collectives`: the audit as an assertion for users' own tests.

A sharded program's communication is part of its contract: "the forward pass all-gathers
nothing", "the pencil FFT does exactly two all-to-alls", "no collective moves more than 1 MiB".
`assert_collectives` compiles the function, audits it with `shardkit.inspect`, and raises a
`CollectiveAssertionError` (an `AssertionError`, so pytest shows it as a failed assert) whose
message lists each offending collective with its bytes and source line.

Example:
    >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
    >>> def test_fft_does_not_gather():
    ...     x = jax.ShapeDtypeStruct((64, 64, 64), jnp.complex64,
    ...                              sharding=NamedSharding(mesh, P("x", "y")))
    ...     shardkit.assert_collectives(shardkit.fft.pfft3d, x, forbid=["all-gather"],
    ...                                 expect={"all-to-all": 2})
    >>> test_fft_does_not_gather()    # pytest would collect and run it
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from shardkit.errors import ShardkitError, ShardkitValueError
from shardkit.inspection.audit import inspect
from shardkit.inspection.hlo import COLLECTIVE_KINDS
from shardkit.inspection.options import check_byte_bound
from shardkit.inspection.report import Collective, Report


class CollectiveAssertionError(ShardkitError, AssertionError):
    """A compiled program's collectives break what `assert_collectives` was told.

    Attributes:
        report: the full `Report` of the program.
        problems: one line per broken expectation.
    """

    def __init__(self, message: str, *, report: Report, problems: list[str]):
        super().__init__(message)
        self.report = report
        self.problems = problems


def _check_kinds(kinds: Iterable[str], arg: str) -> None:
    for k in kinds:
        if k not in COLLECTIVE_KINDS:
            raise ShardkitValueError(
                f"assert_collectives({arg}=...): unknown collective kind {k!r}; fix: use one "
                f"of {', '.join(COLLECTIVE_KINDS)}."
            )


def _is_int(v: Any) -> bool:
    """An int or numpy integer, not a bool (`True` is no count)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool | np.bool_)


def _check_expect(expect: Mapping[str, int] | None) -> dict[str, int]:
    """`expect` as a dict of known kinds to counts >= 0 (ints or numpy integers)."""
    expect = dict(expect or {})
    _check_kinds(expect, "expect")
    for k, v in expect.items():
        if not _is_int(v) or v < 0:
            raise ShardkitValueError(
                f"assert_collectives(expect={{{k!r}: {v!r}}}): a count must be an int >= 0, got "
                f'{type(v).__name__} {v!r}; fix: expect={{"{k}": 2}}.'
            )
    return {k: int(v) for k, v in expect.items()}


_LOWER_BOUND = "a lower bound"
_UNKNOWN_FIX = (
    "fix: give the loop a static length (jax.lax.fori_loop with Python int bounds, or "
    "jax.lax.scan with length=), so XLA states its trip count; or assert only what does not "
    "depend on it: forbid= and max_bytes= (bytes per execution)."
)


def _loop_of(c: Collective) -> str:
    """Why `c`'s count is unknown: the while loop around it (by JAX's name stack), its HLO
    computation and its source line."""
    parts = (c.op_name or "").split("/")
    ends = [i for i, p in enumerate(parts) if p == "while" or p.startswith("while[")]
    loop = f"the while loop {'/'.join(parts[: ends[-1] + 1])}" if ends else "a while loop"
    return (
        f"{c.kind} %{c.name} runs inside {loop} (HLO computation %{c.computation}) at "
        f"{c.where}, which has no trip count XLA states, so it is counted once"
    )


def _unknown(cs: Iterable[Collective]) -> str:
    """`""`, or the note that a count over `cs` is only a lower bound, and why."""
    loops = list(dict.fromkeys(_loop_of(c) for c in cs if c.count is None))
    return f" ({_LOWER_BOUND}: {'; '.join(loops)})" if loops else ""


def _problems(
    report: Report,
    forbid: list[str],
    expect: dict[str, int],
    max_bytes: float | None,
    max_total_bytes: float | None,
) -> Iterator[tuple[str, tuple[Collective, ...]]]:
    """(what is broken, the collectives that break it) for each failed expectation. A count
    or total over a loop of unknown trip count is a lower bound, so asserting it fails."""
    for kind in forbid:
        cs = report.of_kind(kind)
        if cs:
            yield f"forbidden {kind}: {len(cs)} found", cs
    for kind, want in expect.items():
        cs = report.of_kind(kind)
        got = sum(c.count if c.count is not None else 1 for c in cs)
        note = _unknown(cs)
        if note:
            yield f"expected {want} {kind} per call, found at least {got}{note}", cs
        elif got != want:
            yield f"expected {want} {kind} per call, found {got}", cs
    if max_bytes is not None:
        cs = tuple(c for c in report.collectives if c.bytes_moved > max_bytes)
        if cs:
            yield f"{len(cs)} collective(s) move more than {max_bytes:,.0f} bytes", cs
    if max_total_bytes is None:
        return
    total, note = report.total_bytes, _unknown(report.collectives)
    if note:
        yield (
            f"max_total_bytes={max_total_bytes:,.0f}: all collectives move at least "
            f"{total:,.0f} bytes per device per call{note}",
            report.collectives,
        )
    elif total > max_total_bytes:
        yield (
            f"all collectives move {total:,.0f} bytes per device per call, more than "
            f"{max_total_bytes:,.0f}",
            report.collectives,
        )


def assert_collectives(
    fn: Any,
    *args: Any,
    forbid: Iterable[str] | None = (),
    expect: Mapping[str, int] | None = None,
    max_bytes: float | None = None,
    max_total_bytes: float | None = None,
    mesh: Any = None,
    **kwargs: Any,
) -> Report:
    """Compiles `fn` for `args` and asserts facts about its collectives.

    Counts are executions per call: static occurrences times the loop trip counts XLA states.
    A collective in a loop without a stated trip count (a `lax.while_loop` with a
    data-dependent condition) has only a lower bound on its count, so an `expect=` of its kind
    and a `max_total_bytes=` fail, naming the loop; `forbid=` and `max_bytes=` (bytes per
    execution) do not depend on counts and are checked as usual.

    Args:
        fn: a function, a jitted function, or a `Lowered`/`Compiled` object.
        *args: arrays or `jax.ShapeDtypeStruct`s (with shardings) to compile for.
        forbid: collective kinds that must not appear at all, e.g. `["all-gather"]` (None:
            nothing forbidden).
        expect: exact executions per call by kind, e.g. `{"all-to-all": 2}` (ints or numpy
            integers); kinds not listed are unconstrained (list `{"all-reduce": 0}` to forbid
            by count).
        max_bytes: the most bytes per device any single collective execution may move (a
            number, e.g. `2**20`).
        max_total_bytes: the most bytes per device all collectives together may move per call.
        mesh: the mesh to decode against (default: the program's own).
        **kwargs: keyword arguments for `fn`.

    Returns:
        The `Report`, for further checks.

    Raises:
        CollectiveAssertionError: when an expectation fails, or depends on a loop count XLA
            does not state; the message lists the offending collectives with bytes and
            source lines.
        ValueError: for an unknown collective kind in `forbid` or `expect`, a count that is
            not an int >= 0, a negative byte bound, or a `mesh` other than the arguments'.
        TypeError: a byte bound that is not a number (e.g. the string `"1MiB"`).

    Example:
        >>> mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
        >>> x = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("x")))
        >>> report = shardkit.assert_collectives(lambda x: jnp.tanh(x) * 2, x,
        ...                                      forbid=["all-gather"], max_bytes=2**20)
        >>> report.counts()
        {}

    See also:
        `shardkit.inspect`.
    """
    forbid = [forbid] if isinstance(forbid, str) else list(forbid or ())
    _check_kinds(forbid, "forbid")
    expect = _check_expect(expect)
    check_byte_bound(max_bytes, "max_bytes", "assert_collectives")
    check_byte_bound(max_total_bytes, "max_total_bytes", "assert_collectives")
    report = inspect(fn, *args, mesh=mesh, **kwargs)
    problems: list[str] = []
    lines: list[str] = []
    for problem, cs in _problems(report, forbid, expect, max_bytes, max_total_bytes):
        problems.append(problem)
        lines.extend([problem, *("  " + c.describe() for c in cs)])
    if any(_LOWER_BOUND in p for p in problems):
        lines.append(_UNKNOWN_FIX)
    if problems:
        raise CollectiveAssertionError(
            f"{report.name}: collectives differ from what was asserted:\n" + "\n".join(lines),
            report=report,
            problems=problems,
        )
    return report
