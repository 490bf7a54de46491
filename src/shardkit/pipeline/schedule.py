"""Pipeline schedules: per-device op orders and the lockstep step table the executor runs.

A schedule says, for ``p`` devices on the 'stage' mesh axis and ``m`` micro-batches, in which
order each device runs its forward (``F``), backward (``B``), or split backward (``BI`` input
gradient, ``W`` weight gradient) ops. :func:`table` packs these orders into lockstep steps: the
``[T, p, L, 3]`` integer array of (kind code, micro-batch, chunk) that the SPMD executor scans
over, one row per step, so the timeline that is plotted is the one that runs.

Virtual stages: with ``v`` chunks per device the model has ``p * v`` stages; virtual stage ``s``
lives on device ``s % p`` as chunk ``s // p`` (Megatron's interleaved order). With ``v = 1``
stage ``s`` is device ``s``.

Lockstep contract of a :class:`Table`: an op at step ``t`` may use a value a neighbour produced
at step ``t'`` only if ``t' < t`` (it is sent by ``ppermute`` at the end of step ``t'``). Within a
device, program order is kept; within one step the lanes run in order 0, 1, so a lane-1 op may
use what lane 0 produced in the same step on the same device.

Example:
    >>> from shardkit.pipeline import GPipe, OneFOneB, table
    >>> table(GPipe(), p=4, m=8).steps
    22
    >>> t = table(OneFOneB(), p=4, m=8)
    >>> t.steps, t.lanes, t.ops.shape
    (14, 2, (14, 4, 2, 3))
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from shardkit.errors import ShardkitRuntimeError, ShardkitTypeError, ShardkitValueError

IDLE = 0
"""Kind code of an empty lane slot (its micro-batch and chunk entries are 0)."""
F = 1
"""Kind code of a forward op."""
B = 2
"""Kind code of a full backward op (input and weight gradients)."""
BI = 3
"""Kind code of an input-gradient-only backward op (zero-bubble schedules)."""
W = 4
"""Kind code of a weight-gradient-only op (zero-bubble schedules)."""

KIND_CODES = {"F": F, "B": B, "BI": BI, "W": W}
"""Op kind name -> integer code used in :attr:`Table.ops`."""
KIND_NAMES = {code: name for name, code in KIND_CODES.items()}


@dataclass(frozen=True)
class Costs:
    """Per-op costs of one chunk (virtual stage), in any time unit.

    Args:
        t_f: forward.
        t_b: backward; for zero-bubble schedules the input-gradient part ``BI`` only.
        t_w: weight-gradient part ``W``; a full ``B`` of the other schedules costs
            ``t_b + t_w``.
        t_comm: latency of a point-to-point send between neighbouring devices.

    Example:
        >>> Costs(t_f=1.0, t_b=1.0, t_w=1.0)
        Costs(t_f=1.0, t_b=1.0, t_w=1.0, t_comm=0.0)
    """

    t_f: float = 1.0
    t_b: float = 2.0
    t_w: float = 0.0
    t_comm: float = 0.0

    def __post_init__(self):
        for name in ("t_f", "t_b", "t_w", "t_comm"):
            value = getattr(self, name)
            if not value >= 0:
                raise ShardkitValueError(
                    f"Costs: {name}={value!r} must be >= 0; fix: pass {name}=0.0 or more"
                )

    def of(self, kind: str) -> float:
        """Cost of one op of ``kind`` ("F", "B", "BI" or "W")."""
        return {"F": self.t_f, "B": self.t_b + self.t_w, "BI": self.t_b, "W": self.t_w}[kind]


@dataclass(frozen=True)
class Op:
    """One op of a pipeline schedule on one device.

    Args:
        kind: "F" forward, "B" full backward, "BI" input-gradient backward, "W" weight gradient.
        microbatch: micro-batch index, ``0 <= microbatch < m``.
        chunk: virtual stage index on the device, ``0 <= chunk < v``; the op runs model stage
            ``chunk * p + device``.

    Example:
        >>> Op("F", 3)
        Op(kind='F', microbatch=3, chunk=0)
    """

    kind: str
    microbatch: int
    chunk: int = 0

    def __post_init__(self):
        if self.kind not in KIND_CODES:
            raise ShardkitValueError(
                f"Op kind={self.kind!r} is not one of {sorted(KIND_CODES)}; "
                "fix: use 'F', 'B', 'BI' or 'W'"
            )

    @property
    def code(self) -> int:
        """The integer kind code (:data:`F`, :data:`B`, :data:`BI` or :data:`W`)."""
        return KIND_CODES[self.kind]


class Schedule(Protocol):
    """What every schedule provides (see :class:`GPipe`, :class:`OneFOneB`, ...)."""

    name: str
    virtual: int
    lanes: int

    def orders(self, p: int, m: int) -> list[list[Op]]: ...

    def check(self, p: int, m: int, layers: int | None = None) -> None: ...


def _check_common(name: str, p: int, m: int, v: int, layers: int | None) -> None:
    for arg, value in (("p", p), ("m", m)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise ShardkitTypeError(f"{name}: {arg}={value!r} must be an int; fix: pass an integer")
    if p < 1:
        raise ShardkitValueError(
            f"{name}: p={p} pipeline stages; a pipeline needs p >= 1; "
            "fix: give the 'stage' mesh axis a size of at least 1"
        )
    if m < 1:
        raise ShardkitValueError(f"{name}: m={m} micro-batches; fix: use microbatches >= 1")
    if layers is not None and layers % (p * v):
        raise ShardkitValueError(
            f"{name}: {layers} layers do not split into p*v = {p}*{v} = {p * v} stages; "
            f"fix: use a stage count that divides {layers} (e.g. p*v = "
            f"{_divisors_hint(layers)}) or change the number of layers"
        )


def _divisors_hint(n: int) -> str:
    return ", ".join(str(k) for k in range(1, n + 1) if n % k == 0)


def _one_f_one_b(p: int, m: int, d: int, warmup: int, bkind: str = "B") -> list[Op]:
    """Forwards 0..warmup-1, then alternate B(k), F(warmup + k), then the remaining B's."""
    warmup = min(m, warmup)
    order = [Op("F", j) for j in range(warmup)]
    for k in range(m):
        order.append(Op(bkind, k))
        if warmup + k < m:
            order.append(Op("F", warmup + k))
    return order


@dataclass(frozen=True)
class GPipe:
    """All forwards, then all backwards (last micro-batch first, as autodiff runs them).

    Holds ``m`` micro-batches in flight per device; bubble ``(p-1)/(m+p-1)``; any ``m >= 1``.

    Example:
        >>> [str(o.kind) + str(o.microbatch) for o in GPipe().orders(2, 2)[0]]
        ['F0', 'F1', 'B1', 'B0']
    """

    name: str = dataclasses.field(default="gpipe", init=False)
    virtual: int = dataclasses.field(default=1, init=False)
    lanes: int = dataclasses.field(default=1, init=False)

    def check(self, p: int, m: int, layers: int | None = None) -> None:
        """Raise ``ValueError`` with a fix if ``p``, ``m`` or ``layers`` do not fit."""
        _check_common("GPipe", p, m, 1, layers)

    def orders(self, p: int, m: int) -> list[list[Op]]:
        """Per-device program order: ``F0..F(m-1), B(m-1)..B0`` on every device."""
        self.check(p, m)
        return [
            [Op("F", j) for j in range(m)] + [Op("B", j) for j in reversed(range(m))]
            for _ in range(p)
        ]


@dataclass(frozen=True)
class OneFOneB:
    """One-forward-one-backward (PipeDream-Flush), by default fused into two lanes per step.

    Fused (``fused=True``, the default): every lockstep step carries one forward lane and one
    backward lane; device ``d`` runs ``F(j)`` at step ``d + j`` and ``B(j)`` at step
    ``2p - 2 - d + j``, so the table has ``m + 2p - 2`` steps, each costing ``t_f + t_b`` in
    steady state: GPipe's time with at most ``2(p-1-d) + 1 <= 2p - 1`` micro-batches in flight
    on device ``d``. Textbook (``fused=False``): one op per step, ``p - d`` warm-up forwards,
    at most ``p - d <= p`` in flight, but a lockstep step then mixes F and B costs.

    Example:
        >>> [o.kind + str(o.microbatch) for o in OneFOneB(fused=False).orders(2, 3)[0]]
        ['F0', 'F1', 'B0', 'F2', 'B1', 'B2']
    """

    fused: bool = True
    name: str = dataclasses.field(init=False)
    virtual: int = dataclasses.field(default=1, init=False)
    lanes: int = dataclasses.field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "name", "1f1b" if self.fused else "1f1b-unfused")
        object.__setattr__(self, "lanes", 2 if self.fused else 1)

    def check(self, p: int, m: int, layers: int | None = None) -> None:
        """Raise ``ValueError`` with a fix if ``p``, ``m`` or ``layers`` do not fit."""
        _check_common("OneFOneB", p, m, 1, layers)

    def orders(self, p: int, m: int) -> list[list[Op]]:
        """Per-device program order (for the fused form: the table's steps, lane 0 first)."""
        self.check(p, m)
        return [
            _one_f_one_b(p, m, d, 2 * (p - 1 - d) + 1 if self.fused else p - d) for d in range(p)
        ]


@dataclass(frozen=True)
class Interleaved:
    """Interleaved 1F1B (Megatron): ``v`` chunks per device, micro-batches in groups of ``p``.

    Virtual stage ``s`` is chunk ``s // p`` on device ``s % p``; activations go round the ring
    ``v`` times. Bubble relative to ideal compute ``(p-1)/(v*m)``; needs ``m % p == 0``.

    Example:
        >>> [(o.kind, o.microbatch, o.chunk) for o in Interleaved(v=2).orders(2, 2)[1]][:4]
        [('F', 0, 0), ('F', 1, 0), ('F', 0, 1), ('B', 0, 1)]
    """

    v: int = 2
    name: str = dataclasses.field(init=False)
    virtual: int = dataclasses.field(init=False)
    lanes: int = dataclasses.field(default=1, init=False)

    def __post_init__(self):
        if not isinstance(self.v, int) or self.v < 1:
            raise ShardkitValueError(
                f"Interleaved: v={self.v!r} virtual stages per device; fix: use an int v >= 1 "
                "(v=2 is the usual choice)"
            )
        object.__setattr__(self, "name", f"interleaved-v{self.v}")
        object.__setattr__(self, "virtual", self.v)

    def check(self, p: int, m: int, layers: int | None = None) -> None:
        """Raise ``ValueError`` with a fix if ``m % p != 0`` or ``p``/``layers`` do not fit."""
        _check_common(f"Interleaved(v={self.v})", p, m, self.v, layers)
        if m < p:
            raise ShardkitValueError(
                f"Interleaved(v={self.v}): m={m} micro-batches < p={p} stages; micro-batches go "
                f"round the ring in groups of p, so m must be a multiple of p; "
                f"fix: use microbatches={p} (or a larger multiple of {p})"
            )
        if m % p:
            lo, hi = m - m % p, m - m % p + p
            raise ShardkitValueError(
                f"Interleaved(v={self.v}): m={m} micro-batches is not a multiple of p={p} "
                f"stages (micro-batches go round the ring in groups of p); "
                f"fix: use microbatches={hi} or {lo}"
            )

    def _op(self, kind: str, k: int, p: int) -> Op:
        group, r = divmod(k, p * self.v)
        chunk = r // p if kind == "F" else self.v - 1 - r // p
        return Op(kind, group * p + r % p, chunk)

    def orders(self, p: int, m: int) -> list[list[Op]]:
        """Megatron's order: ``2(p-1-d) + (v-1)p`` warm-up forwards, then F/B pairs."""
        self.check(p, m)
        total = m * self.v
        out = []
        for d in range(p):
            warmup = min(total, 2 * (p - 1 - d) + (self.v - 1) * p)
            order = [self._op("F", k, p) for k in range(warmup)]
            for k in range(total - warmup):
                order += [self._op("F", warmup + k, p), self._op("B", k, p)]
            order += [self._op("B", k, p) for k in range(total - warmup, total)]
            out.append(order)
        return out


@dataclass(frozen=True)
class ZeroBubbleH1:
    """Zero-bubble H1 (Qi et al. 2023): backward split into ``BI`` and ``W``, W's fill bubbles.

    Textbook (``fused=False``, the default): 1F1B order with ``B`` replaced by ``BI``; on
    device ``d`` the weight gradient ``W(j)`` runs right after ``BI(j + d)`` (the leftover ``d``
    W's at the end fill the cool-down), so each device holds at most ``p`` micro-batches, as
    1F1B. Idle time per device is ``(p-1)(t_f + t_b - t_w)`` against 1F1B's
    ``(p-1)(t_f + t_b + t_w)``; the table has ``3m + p - 1`` one-op steps.

    Fused (``fused=True``): three lanes per lockstep step, an ``F`` lane, a ``BI`` lane and a
    ``W`` lane, in fused 1F1B's order (``2(p-1-d) + 1`` warm-up forwards on device ``d``): the
    ``BI`` chain runs at fused 1F1B's steps and ``W(j)`` in the same step as ``BI(j + d)``
    (the leftover W's run in the cool-down, where the ``F`` lane is idle). The table has fused
    1F1B's ``m + 2p - 2`` steps instead of ``3m + p - 1``, with ``2p - 1 - d`` micro-batches in
    flight on device ``d``. Its lockstep time with ``t_f = t_b = t_w`` is ``3m + 2(p-1)``
    units, between textbook ZB-H1's ``3m + p - 1`` and fused 1F1B's ``3(m + p - 1)``; the
    event simulation's idle time is textbook ZB-H1's. Both forms need ``m >= p`` (with fewer
    there are too few W's to fill the bubbles).

    Example:
        >>> [o.kind + str(o.microbatch) for o in ZeroBubbleH1().orders(2, 2)[1]]
        ['F0', 'BI0', 'F1', 'BI1', 'W0', 'W1']
        >>> table(ZeroBubbleH1(fused=True), p=4, m=8).steps   # m + 2p - 2
        14
    """

    fused: bool = False
    name: str = dataclasses.field(init=False)
    virtual: int = dataclasses.field(default=1, init=False)
    lanes: int = dataclasses.field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "name", "zb-h1-fused" if self.fused else "zb-h1")
        object.__setattr__(self, "lanes", 3 if self.fused else 1)

    def check(self, p: int, m: int, layers: int | None = None) -> None:
        """Raise ``ValueError`` with a fix if ``p``, ``m`` or ``layers`` do not fit."""
        _check_common("ZeroBubbleH1", p, m, 1, layers)
        if m < p:
            raise ShardkitValueError(
                f"ZeroBubbleH1: m={m} micro-batches < p={p} stages; its weight-gradient ops fill "
                f"the bubbles only when m >= p (with fewer it is slower than OneFOneB); "
                f"fix: use microbatches={p} or more, or schedule=OneFOneB()"
            )

    def orders(self, p: int, m: int) -> list[list[Op]]:
        """Per-device program order: F, BI, W with W(j) after BI(j + d) on device d."""
        self.check(p, m)
        out = []
        for d in range(p):
            warmup = 2 * (p - 1 - d) + 1 if self.fused else p - d
            order = []
            for op in _one_f_one_b(p, m, d, warmup, bkind="BI"):
                order.append(op)
                if op.kind == "BI" and op.microbatch - d >= 0:
                    order.append(Op("W", op.microbatch - d))
            order += [Op("W", j) for j in range(max(0, m - d), m)]
            out.append(order)
        return out


def _lane(op: Op, lanes: int) -> int:
    """Lane of ``op`` in a table of ``lanes`` lanes: F 0, then B/BI 1, then W 2 (if 3 lanes)."""
    if lanes == 1 or op.kind == "F":
        return 0
    return 2 if lanes == 3 and op.kind == "W" else 1


def op_deps(op: Op, d: int, p: int, v: int) -> list[tuple[str, int, int, bool]]:
    """(kind, microbatch, stage, remote) of the ops ``op`` on device ``d`` waits for.

    ``kind`` is "F" or "G" (the gradient-producing backward: B or BI) or "BI".
    """
    s = op.chunk * p + d
    last = p * v - 1
    i = op.microbatch
    if op.kind == "F":
        return [] if s == 0 else [("F", i, s - 1, True)]
    if op.kind in ("B", "BI"):
        deps = [("F", i, s, False)]
        if s < last:
            deps.append(("G", i, s + 1, True))
        return deps
    return [("BI", i, s, False)]  # W


def done_keys(op: Op, d: int, p: int) -> list[tuple[str, int, int]]:
    s = op.chunk * p + d
    if op.kind == "F":
        return [("F", op.microbatch, s)]
    if op.kind == "B":
        return [("G", op.microbatch, s)]
    if op.kind == "BI":
        return [("G", op.microbatch, s), ("BI", op.microbatch, s)]
    return [("W", op.microbatch, s)]


@dataclass(frozen=True, eq=False)
class Table:
    """The lockstep step table of a schedule, as the SPMD executor runs it.

    Attributes:
        schedule: the schedule's name.
        p: devices (pipeline stages on the 'stage' mesh axis).
        m: micro-batches.
        virtual: chunks (virtual stages) per device, ``v``.
        ops: ``np.int32`` array ``[steps, p, lanes, 3]`` of (kind code, micro-batch, chunk);
            an empty slot is ``(IDLE, 0, 0)``.

    Example:
        >>> t = table(GPipe(), p=2, m=2)
        >>> t.steps, t.lanes, round(t.idle_fraction, 4)
        (6, 1, 0.3333)
        >>> t.ops[:, 1, 0, 0].tolist()   # device 1: idle, F, F, B, B, idle
        [0, 1, 1, 2, 2, 0]
    """

    schedule: str
    p: int
    m: int
    virtual: int
    ops: np.ndarray

    def __post_init__(self):
        self.ops.flags.writeable = False  # a table is a value: share it, never edit it

    @property
    def steps(self) -> int:
        """Number of lockstep steps ``T`` (the executor's scan length)."""
        return int(self.ops.shape[0])

    @property
    def lanes(self) -> int:
        """Ops per device per step ``L``: 1, or 2 for the fused 1F1B (F lane, B lane)."""
        return int(self.ops.shape[2])

    def device_ops(self, d: int) -> list[tuple[int, int, Op]]:
        """(step, lane, op) of device ``d`` in program order."""
        out = []
        for t in range(self.steps):
            for lane in range(self.lanes):
                k, i, c = (int(x) for x in self.ops[t, d, lane])
                if k != IDLE:
                    out.append((t, lane, Op(KIND_NAMES[k], i, c)))
        return out

    def lockstep_time(self, costs: Costs | None = None) -> float:
        """Time of the table when every step lasts as long as its slowest device.

        A device runs its lanes one after the other, so a step costs
        ``max_d sum_lanes cost(op)``; ``B`` costs ``t_b + t_w``, ``BI`` ``t_b``, ``W`` ``t_w``.
        ``costs=None`` counts every op as 1. Communication is not modelled here.
        """
        per_op = _per_op(costs)
        step = per_op[self.ops[..., 0]].sum(axis=2).max(axis=1)  # (T,)
        return float(step.sum())

    def bubble(self, costs: Costs | None = None) -> float:
        """Idle share of :meth:`lockstep_time` averaged over devices (``costs=None``: ops = 1)."""
        per_op = _per_op(costs)
        busy = per_op[self.ops[..., 0]].sum() / self.p
        total = self.lockstep_time(costs)
        return float(1.0 - busy / total) if total else 0.0

    @property
    def idle_fraction(self) -> float:
        """Idle share of the table with every op costing one unit.

        With one lane this is idle ``(step, device)`` slots / all slots. With two lanes a step
        in which some device runs both lanes counts as two units, as in the event simulator
        with ``t_f = t_b``, so the fused 1F1B scores GPipe's ``(p-1)/(m+p-1)``
        (:attr:`slot_idle_fraction` counts the raw slots).
        """
        return self.bubble(None)

    @property
    def slot_idle_fraction(self) -> float:
        """Idle ``(step, device, lane)`` slots over all slots (equals :attr:`idle_fraction`
        with one lane; ``(2p-2)/(m+2p-2)`` for the fused 1F1B, whose lanes are short ops)."""
        return float((self.ops[..., 0] == IDLE).mean())

    @property
    def peak_in_flight(self) -> tuple[int, ...]:
        """Per device, the most (micro-batch, chunk) pairs forwarded but not yet released.

        A pair is held from its ``F`` step through its ``B`` (or ``W``) step inclusive.
        """
        out = []
        for d in range(self.p):
            held, peak = set(), 0
            for _, _, op in self.device_ops(d):
                key = (op.microbatch, op.chunk)
                if op.kind == "F":
                    held.add(key)
                    peak = max(peak, len(held))
                elif op.kind in ("B", "W"):
                    held.discard(key)
            out.append(peak)
        return tuple(out)


def _per_op(costs: Costs | None) -> np.ndarray:
    per_op = np.zeros(5)
    for name, code in KIND_CODES.items():
        per_op[code] = 1.0 if costs is None else costs.of(name)
    return per_op


def table(schedule: Schedule, p: int, m: int) -> Table:
    """Pack a schedule's per-device orders into lockstep steps, as early as the contract allows.

    Each step, every device takes the next ops of its program order while they are ready (a
    neighbour's input produced at an earlier step; the device's own earlier ops done earlier or
    in an earlier lane of this step) and their lanes increase (lane 0 = F, lane 1 = the rest
    when ``schedule.lanes == 2``).

    Args:
        schedule: ``GPipe()``, ``OneFOneB()``, ``Interleaved(v)`` or ``ZeroBubbleH1()``.
        p: devices on the 'stage' mesh axis.
        m: micro-batches.

    Returns:
        The :class:`Table`.

    Raises:
        ValueError: if the schedule does not fit ``p`` and ``m`` (the message names the fix).

    Example:
        >>> table(OneFOneB(), p=4, m=8).steps   # m + 2p - 2
        14
    """
    schedule.check(p, m)
    orders = schedule.orders(p, m)
    lanes, v = schedule.lanes, schedule.virtual
    done: dict[tuple[str, int, int], int] = {}
    pos = [0] * p
    rows = []
    t = 0
    while any(pos[d] < len(orders[d]) for d in range(p)):
        row = np.zeros((p, lanes, 3), np.int32)
        finished: list[tuple[str, int, int]] = []
        for d in range(p):
            local: set[tuple[str, int, int]] = set()
            last_lane = -1
            while pos[d] < len(orders[d]):
                op = orders[d][pos[d]]
                lane = _lane(op, lanes)
                if lane <= last_lane:
                    break
                ready = all(
                    done.get((k, i, s), t) < t or (not remote and (k, i, s) in local)
                    for k, i, s, remote in op_deps(op, d, p, v)
                )
                if not ready:
                    break
                row[d, lane] = (op.code, op.microbatch, op.chunk)
                keys = done_keys(op, d, p)
                local.update(keys)
                finished += keys
                pos[d] += 1
                last_lane = lane
        if not finished:
            heads = {d: orders[d][pos[d]] for d in range(p) if pos[d] < len(orders[d])}
            raise ShardkitRuntimeError(
                f"{schedule.name}: orders deadlock at step {t}; heads {heads}"
            )
        for key in finished:
            done[key] = t
        rows.append(row)
        t += 1
    return Table(schedule.name, p, m, v, np.stack(rows))
