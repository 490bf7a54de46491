"""Cost model for sharded matmuls: bytes moved, peak memory, FLOPs; auto choice; explain.

Each hand-written algorithm predicts, for a layout, the collectives it emits and the bytes each
device receives in them (ring model: an all-gather of a local block of S bytes over P devices
receives S(P-1); a reduce-scatter of S bytes receives S(P-1)/P; an all-reduce twice that; a
collective-permute its block). ``"auto"`` ranks the algorithms that fit by bytes moved, then
peak per-device memory, then FLOPs, then a fixed order (allgather, reduce_scatter, collective,
summa). ``"gspmd"`` is never picked by auto: its collectives are the compiler's choice, which is
exactly what the hand-written kernels make explicit.

Example:
    >>> print(explain(A, B))          # A[64, 64] P(None, 'x'), B[64, 64] P('x', None)
    C = A[M, K_x] @ B[K_x, N] on mesh {'x': 8}, 64x64 @ 64x64, 4 B/element
    algorithm                    bytes moved  peak bytes  collectives           output
    allgather                         28,672      53,248  2 all-gather          P(None, None)
    reduce_scatter                    14,336      22,528  1 reduce-scatter      P('x', None)
    collective                        14,336      10,240  7 collective-permute  P('x', None) <-
    ...  (chosen: collective; columns narrowed here)
"""

from __future__ import annotations

import dataclasses

import jax

from shardkit.errors import ShardkitValueError
from shardkit.matmul._layout import (
    MatmulLayout,
    MatmulLayoutError,
    Method,
    Spec,
    fmt_layout,
    fmt_spec,
    layout_of,
    normalize_spec,
)
from shardkit.matmul.cases import fit_allgather, fit_gspmd, fit_reduce_scatter
from shardkit.matmul.collective import fit_collective
from shardkit.matmul.summa import fit_summa

__all__ = ["ALGORITHMS", "Explanation", "candidates", "choose", "explain", "fit"]

ALGORITHMS = ("auto", "gspmd", "allgather", "reduce_scatter", "collective", "summa")
_ORDER = ("allgather", "reduce_scatter", "collective", "summa")


def fit(
    L: MatmulLayout, algorithm: str, out: Spec | None, *, bidirectional: bool = False
) -> Method:
    """The :class:`Method` of one named algorithm on layout ``L``.

    Raises:
        MatmulLayoutError: the algorithm does not fit the layout (the message says why and what
            to change).
        ValueError: unknown algorithm name.
    """
    if algorithm == "allgather":
        return fit_allgather(L, out)
    if algorithm == "reduce_scatter":
        return fit_reduce_scatter(L, out)
    if algorithm == "collective":
        return fit_collective(L, out, bidirectional=bidirectional)
    if algorithm == "summa":
        return fit_summa(L, out)
    if algorithm == "gspmd":
        return fit_gspmd(L, out)
    if algorithm == "auto":
        return choose(L, out)
    raise ShardkitValueError(
        f"algorithm={algorithm!r} is not one of {ALGORITHMS}; fix: algorithm='auto' lets "
        "shardkit pick by bytes moved and peak memory."
    )


def candidates(L: MatmulLayout, out: Spec | None) -> list[tuple[str, Method | MatmulLayoutError]]:
    """Every hand-written algorithm with its Method, or the reason it does not fit."""
    result: list[tuple[str, Method | MatmulLayoutError]] = []
    for name in _ORDER:
        variants = [False, True] if name == "collective" else [False]
        for bidi in variants:
            label = name + (" (bidirectional)" if bidi else "")
            try:
                result.append((label, fit(L, name, out, bidirectional=bidi)))
            except MatmulLayoutError as e:
                result.append((label, e))
    return result


def _rank(item: tuple[str, Method]) -> tuple:
    label, m = item
    return (
        m.comm_bytes,
        m.peak_bytes,
        m.flops,
        "bidirectional" in label,
        _ORDER.index(m.algorithm),
    )


def choose(L: MatmulLayout, out: Spec | None) -> Method:
    """The fitting algorithm with the fewest bytes moved (then lowest peak memory, FLOPs).

    ``"allgather"`` fits every layout, so a choice always exists. MatmulCollective matmul is ranked
    by its unidirectional form; pass ``algorithm="collective", bidirectional=True`` to force the
    other.
    """
    rows = candidates(L, out)
    fits = [(lb, m) for lb, m in rows if isinstance(m, Method) and "bidirectional" not in lb]
    if not fits:  # only a bad out_spec gets here: allgather's error says what is wrong
        raise next(e for lb, e in rows if lb == "allgather")
    return min(fits, key=_rank)[1]


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Why ``algorithm="auto"`` picks what it picks, for one layout.

    Attributes:
        layout: the product's shapes and specs.
        chosen: the Method auto runs.
        rows: every algorithm with its Method, or the error saying why it does not fit.
    """

    layout: MatmulLayout
    chosen: Method
    rows: tuple[tuple[str, Method | MatmulLayoutError], ...]

    def __str__(self) -> str:
        L = self.layout
        head = (
            f"C = {fmt_layout('A', L.a_spec, ('M', 'K'))} @ {fmt_layout('B', L.b_spec, ('K', 'N'))}"
            f" on mesh {dict(L.mesh.shape)}, {L.m}x{L.k} @ {L.k}x{L.n}, {L.itemsize} B/element"
        )
        lines = [
            head,
            f"{'algorithm':<28}{'bytes moved':>12}{'peak bytes':>12}  {'collectives':<34}output",
        ]
        for label, m in self.rows:
            if isinstance(m, Method):
                coll = ", ".join(f"{v} {k}" for k, v in m.counts().items()) or "none"
                mark = " <- chosen" if m == self.chosen else ""
                lines.append(
                    f"{label:<28}{m.comm_bytes:>12,}{m.peak_bytes:>12,}  {coll:<34}"
                    f"{fmt_spec(m.out_spec)}{mark}"
                )
            else:
                reason = str(m).split("; fix:")[0]
                lines.append(f"{label:<28}{'-':>12}{'-':>12}  does not fit: {reason}")
        lines.append(
            f"chosen: {self.chosen.algorithm}: {self.chosen.detail} (fewest bytes "
            "moved, then lowest peak memory)"
        )
        return "\n".join(lines)


def explain(
    a: jax.Array | jax.ShapeDtypeStruct,
    b: jax.Array | jax.ShapeDtypeStruct,
    *,
    out_spec: object = None,
    mesh: jax.sharding.Mesh | None = None,
) -> Explanation:
    """Says which algorithm ``matmul(a, b, algorithm="auto")`` runs and why.

    Args:
        a: A[M, K], a sharded array or a ``jax.ShapeDtypeStruct`` with a NamedSharding.
        b: B[K, N], likewise.
        out_spec: the wanted PartitionSpec of C, or None for each algorithm's own.
        mesh: the mesh, when neither operand carries a NamedSharding.

    Returns:
        An :class:`Explanation`; ``str()`` of it is a table of every algorithm with bytes moved,
        peak bytes, collectives and output spec, or the reason it does not fit.

    Raises:
        MatmulLayoutError: shapes or specs are invalid (see :func:`shardkit.matmul.matmul`).

    Example:
        >>> print(shardkit.matmul.explain(A, B))

    See also: :func:`shardkit.matmul.matmul`.
    """
    L = layout_of(a, b, mesh=mesh)
    out = None if out_spec is None else normalize_spec(out_spec, name="out_spec", mesh=L.mesh)
    return Explanation(L, choose(L, out), tuple(candidates(L, out)))
