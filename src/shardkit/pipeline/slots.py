"""Buffer slots for a step table: where each in-flight activation, gradient and residual lives.

The SPMD executor keeps, per device, small buffers of received activations (``x``),
received output gradients (``g``) and, with ``residuals="stash"``, the backward residuals of
forwarded micro-batches (``res``; the last model stage has its own pool ``last`` because its
residuals include the loss head's). Each value occupies a slot from the moment it is written
until its last read; :func:`plan` colours these intervals greedily (optimal for intervals), so
a buffer has as many slots as the schedule has values alive at once on the busiest device, plus
one trash slot that absorbs the writes of idle lanes.

Time points within a step: lane ``l`` reads at ``2 (t (L+1) + l)``, writes just after, and the
values received by ``ppermute`` land at the end of the step, so a slot read by lane 1 at step
``t`` may be refilled from step ``t``'s receive, and lane 1 may read what lane 0 wrote in the
same step.

Example:
    >>> from shardkit.pipeline import OneFOneB, table
    >>> pl = plan(table(OneFOneB(), p=4, m=8), stash=False)
    >>> pl.x_slots, pl.g_slots
    (5, 1)
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from shardkit.errors import ShardkitRuntimeError
from shardkit.pipeline.schedule import BI, IDLE, B, F, Table, W

# per-lane columns
KIND, MB, CHUNK, XR, GR, RR, RW, LR, LW, GXI, CR, CW, LCR, LCW = range(14)
LANE_COLS = 14
# per-(step, device) columns, after the lanes
RX, RG, FLANE, BLANE = range(4)


class LaneRow(NamedTuple):
    """What one lane of one device does at one step, and where its values live (slot
    indices; the trash slot, index = slot count, where a lane writes or reads nothing)."""

    kind: Any  # F, B, BI, W or IDLE
    mb: Any  # micro-batch
    chunk: Any  # the device's model chunk (interleaved schedules)
    x_read: Any  # received activation read
    g_read: Any  # received gradient read
    res_read: Any  # stashed residuals read (backward)
    res_write: Any  # residuals written (forward)
    last_read: Any  # the last stage's residuals read
    last_write: Any  # the last stage's residuals written
    gx_index: Any  # where the input cotangent goes (m: nowhere)
    cut_read: Any  # what BI handed W, read by W
    cut_write: Any  # ... written by BI
    last_cut_read: Any
    last_cut_write: Any


class StepRow(NamedTuple):
    """One step of the table on one device: its lanes, then where what arrives lands and which
    lane's output is sent forward and backward."""

    lanes: tuple[LaneRow, ...]
    x_recv: Any
    g_recv: Any
    fwd_lane: Any
    bwd_lane: Any


@dataclasses.dataclass(frozen=True)
class SlotPlan:
    """Slot assignment of a :class:`~shardkit.pipeline.Table` for the executor.

    Attributes:
        table: the step table.
        stash: whether backward residuals are stashed (else the backward recomputes them).
        cols: ``int32 [T, p, lanes * LANE_COLS + 4]``: per lane (kind, micro-batch, chunk,
            x read slot, g read slot, res read slot, res write slot, last-res read slot,
            last-res write slot, g_xs index, cut read slot, cut write slot, last-stage cut
            read slot, last-stage cut write slot), then (x receive slot, g receive slot, lane whose
            output goes forward, lane whose output goes backward). Unused entries point at the
            trash slot (index = slot count), and the g_xs index at ``m``.
        x_slots, g_slots, res_slots, last_slots: slots per pool, trash excluded.
        lane_kinds: the kind codes that occur in each lane.
        cut_slots, last_cut_slots: with ``stash`` and a split backward (``BI`` + ``W``), slots
            for what ``BI`` hands to ``W`` (see :mod:`.split`), trash excluded; else 0.
    """

    table: Table
    stash: bool
    cols: np.ndarray
    x_slots: int
    g_slots: int
    res_slots: int
    last_slots: int
    lane_kinds: tuple[frozenset, ...]
    cut_slots: int = 0
    last_cut_slots: int = 0

    def rows(self) -> StepRow:
        """`cols` with names: a `StepRow` whose leaves are ``int32 [T, p]`` arrays, for the
        executor to scan over."""
        lanes = self.table.lanes
        tail = lanes * LANE_COLS
        return StepRow(
            lanes=tuple(
                LaneRow(*(self.cols[:, :, lane * LANE_COLS + j] for j in range(LANE_COLS)))
                for lane in range(lanes)
            ),
            x_recv=self.cols[:, :, tail + RX],
            g_recv=self.cols[:, :, tail + RG],
            fwd_lane=self.cols[:, :, tail + FLANE],
            bwd_lane=self.cols[:, :, tail + BLANE],
        )


def _colour(intervals: dict) -> tuple[dict, int]:
    """Greedy interval colouring: key -> slot, number of slots. Intervals are [start, end]."""
    free_at: list[int] = []  # per slot: the last read time of its current value
    out = {}
    for key, (start, end) in sorted(intervals.items(), key=lambda kv: (kv[1][0], kv[1][1])):
        for slot, busy in enumerate(free_at):
            if busy < start:
                free_at[slot] = end
                out[key] = slot
                break
        else:
            out[key] = len(free_at)
            free_at.append(end)
    return out, len(free_at)


def plan(tbl: Table, *, stash: bool) -> SlotPlan:
    """Assigns buffer slots to every value of ``tbl`` and packs the executor's columns.

    Args:
        tbl: the step table from :func:`shardkit.pipeline.table`.
        stash: keep backward residuals from the forward (else keep only the stage input).

    Returns:
        The :class:`SlotPlan`.

    Raises:
        RuntimeError: the table breaks the lockstep contract (a value used at or before the
            step that sends it).
    """
    at, lane_kinds = _positions(tbl)
    pools = _intervals(tbl, at, stash)  # x, g, res, last, cut, last cut
    coloured = [_colour_per_device(iv, tbl.p) for iv in pools]
    nx, ng, nr, nl, nc, nlc = (n for _, n in coloured)
    return SlotPlan(
        table=tbl,
        stash=stash,
        cols=_pack(tbl, [slots for slots, _ in coloured], (nx, ng, nr, nl, nc, nlc)),
        x_slots=nx,
        g_slots=ng,
        res_slots=nr,
        last_slots=nl,
        lane_kinds=tuple(frozenset(k) for k in lane_kinds),
        cut_slots=nc,
        last_cut_slots=nlc,
    )


def _time(tbl: Table):
    """Time points within the table: lane reads ``rd(t, lane)``, receives ``recv(t)``."""
    width = tbl.lanes + 1

    def rd(t, lane):
        return 2 * (t * width + lane)

    def recv(t):
        return 2 * (t * width + tbl.lanes) + 1

    return rd, recv


def _positions(tbl: Table) -> tuple[dict, list[set]]:
    """``(kind, micro-batch, model stage) -> (step, lane)`` of every op, and each lane's kinds."""
    ops = tbl.ops
    T, p, L, _ = ops.shape
    at: dict[tuple[int, int, int], tuple[int, int]] = {}  # (kind, i, s) -> (t, lane)
    lane_kinds: list[set] = [set() for _ in range(L)]
    for t in range(T):
        for d in range(p):
            for lane in range(L):
                k, i, c = (int(z) for z in ops[t, d, lane])
                lane_kinds[lane].add(k)
                if k == IDLE:
                    continue
                key = (F if k == F else (W if k == W else B), i, c * p + d)
                if key in at:
                    raise ShardkitRuntimeError(
                        f"{tbl.schedule}: op {key} appears twice in the table"
                    )
                at[key] = (t, lane)
    return at, lane_kinds


def _intervals(tbl: Table, at: dict, stash: bool) -> tuple[dict, ...]:
    """Live intervals ``(device, micro-batch, model stage) -> (written, last read)`` of the
    received activations, received gradients, residuals, the last stage's residuals, and the
    cuts BI hands to W (the last stage's apart)."""
    p, m, S = tbl.p, tbl.m, tbl.p * tbl.virtual
    rd, recv = _time(tbl)

    def uses(i, s, with_x):
        out = []
        if with_x:
            out.append(rd(*at[(F, i, s)]))
        for k in (B, W):
            if (k, i, s) in at:
                out.append(rd(*at[(k, i, s)]))
        return out

    def need(key, what):
        if key not in at:
            raise ShardkitRuntimeError(f"{tbl.schedule}: {what} {key} is missing from the table")
        return at[key]

    xs_iv, gs_iv, res_iv, last_iv, cut_iv, lcut_iv = ({} for _ in range(6))
    for i in range(m):
        for s in range(S):
            d = s % p
            tf, lf = need((F, i, s), "forward")
            need((B, i, s), "backward")
            if s > 0:
                ts, _ = need((F, i, s - 1), "forward")
                if ts >= tf:
                    raise ShardkitRuntimeError(
                        f"{tbl.schedule}: F(mb {i}, stage {s}) at step {tf} uses the "
                        f"activation sent at step {ts}; the table breaks the lockstep contract"
                    )
                reads = [rd(tf, lf)] if stash else uses(i, s, True)
                xs_iv[(d, i, s)] = (recv(ts), max(reads))
            if s < S - 1:
                tb, _ = need((B, i, s + 1), "backward")
                if tb >= at[(B, i, s)][0]:
                    raise ShardkitRuntimeError(
                        f"{tbl.schedule}: backward of (mb {i}, stage {s}) at step "
                        f"{at[(B, i, s)][0]} uses the gradient sent at step {tb}; the table "
                        "breaks the lockstep contract"
                    )
                gs_iv[(d, i, s)] = (recv(tb), max(uses(i, s, False)))
            if stash:
                pool = last_iv if s == S - 1 else res_iv
                pool[(d, i, s)] = (rd(tf, lf) + 1, max(uses(i, s, False)))
                if (W, i, s) in at:  # BI's cut waits for W
                    pool = lcut_iv if s == S - 1 else cut_iv
                    pool[(d, i, s)] = (rd(*at[(B, i, s)]) + 1, rd(*at[(W, i, s)]))
    return xs_iv, gs_iv, res_iv, last_iv, cut_iv, lcut_iv


def _colour_per_device(iv: dict, p: int) -> tuple[dict, int]:
    """Slots per device (each device's intervals coloured apart), and the most any needs."""
    slots, count = {}, 0
    for d in range(p):
        got, n = _colour({k: val for k, val in iv.items() if k[0] == d})
        slots.update(got)
        count = max(count, n)
    return slots, count


def _pack(tbl: Table, slots: list[dict], counts: tuple[int, ...]) -> np.ndarray:
    """The executor's ``int32 [T, p, lanes * LANE_COLS + 4]`` columns (see `SlotPlan.cols`)."""
    ops = tbl.ops
    T, p, L, _ = ops.shape
    m = tbl.m
    xsl, gsl, rsl, lsl, csl, lcsl = slots
    nx, ng, nr, nl, nc, nlc = counts
    cols = np.zeros((T, p, L * LANE_COLS + 4), np.int32)
    tail = L * LANE_COLS
    for t in range(T):
        for d in range(p):
            flane = blane = None
            for lane in range(L):
                k, i, c = (int(z) for z in ops[t, d, lane])
                s = c * p + d
                row = [k, i, c, nx, ng, nr, nr, nl, nl, m, nc, nc, nlc, nlc]
                if k != IDLE:
                    key = (d, i, s)
                    row[XR] = xsl.get(key, nx)
                    row[GR] = gsl.get(key, ng)
                    if k == F:
                        row[RW], row[LW] = rsl.get(key, nr), lsl.get(key, nl)
                        if flane is not None:
                            raise ShardkitRuntimeError(
                                f"{tbl.schedule}: two forwards at ({t}, {d})"
                            )
                        flane = lane
                    else:
                        row[RR], row[LR] = rsl.get(key, nr), lsl.get(key, nl)
                    if k == BI:
                        row[CW], row[LCW] = csl.get(key, nc), lcsl.get(key, nlc)
                    if k == W:
                        row[CR], row[LCR] = csl.get(key, nc), lcsl.get(key, nlc)
                    if k in (B, BI):
                        if blane is not None:
                            raise ShardkitRuntimeError(
                                f"{tbl.schedule}: two backwards at ({t}, {d})"
                            )
                        blane = lane
                        if s == 0:
                            row[GXI] = i
                cols[t, d, lane * LANE_COLS : (lane + 1) * LANE_COLS] = row
            cols[t, d, tail + FLANE] = flane or 0
            cols[t, d, tail + BLANE] = blane or 0
            cols[t, d, tail + RX], cols[t, d, tail + RG] = _received(tbl, t, d, xsl, gsl, nx, ng)
    return cols


def _received(tbl: Table, t: int, d: int, xsl: dict, gsl: dict, nx: int, ng: int):
    """The slots where device ``d``'s activation and gradient received at the end of step
    ``t`` land (the trash slots when nothing arrives)."""
    ops, p, L, S = tbl.ops, tbl.p, tbl.lanes, tbl.p * tbl.virtual
    rx, rg = nx, ng
    src = (d - 1) % p
    for lane in range(L):
        k, i, c = (int(z) for z in ops[t, src, lane])
        s = c * p + src
        if k == F and s + 1 < S and (s + 1) % p == d:
            rx = xsl[(d, i, s + 1)]
    src = (d + 1) % p
    for lane in range(L):
        k, i, c = (int(z) for z in ops[t, src, lane])
        s = c * p + src
        if k in (B, BI) and s >= 1 and (s - 1) % p == d:
            rg = gsl[(d, i, s - 1)]
    return rx, rg
