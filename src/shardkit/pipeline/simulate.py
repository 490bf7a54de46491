"""Event simulation of a pipeline schedule: timeline, bubble and in-flight micro-batches.

Each device runs its program order (the schedule's ``orders``, the same ops the step table
holds) one op at a time; an op starts when the device is free and the neighbour's op it needs
has ended, plus ``t_comm`` when that neighbour is another device. Nothing here runs in
lockstep: this is the timeline of an asynchronous runtime (or of an accelerator where each
stage's ops are costed on their own); :meth:`Table.lockstep_time` prices the SPMD table.

Example:
    >>> from shardkit.pipeline import Costs, GPipe, ZeroBubbleH1, simulate
    >>> tl = simulate(GPipe(), p=4, m=8)
    >>> tl.makespan, round(tl.bubble, 4)          # (m+p-1)(t_f+t_b), (p-1)/(m+p-1)
    (33.0, 0.2727)
    >>> simulate(ZeroBubbleH1(), p=4, m=8, costs=Costs(1.0, 1.0, 1.0)).idle
    (3.0, 3.0, 3.0, 3.0)
"""

from __future__ import annotations

from dataclasses import dataclass

from shardkit.errors import ShardkitRuntimeError
from shardkit.pipeline.schedule import Costs, Op, Schedule, done_keys, op_deps


@dataclass(frozen=True)
class Event:
    """One op on one device with its start and end time."""

    op: Op
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """Result of :func:`simulate`.

    Attributes:
        schedule: the schedule's name.
        p: devices; ``m``: micro-batches; ``virtual``: chunks per device.
        costs: the per-op :class:`Costs` used.
        events: per device, its :class:`Event` s in program order.
    """

    schedule: str
    p: int
    m: int
    virtual: int
    costs: Costs
    events: tuple[tuple[Event, ...], ...]

    @property
    def makespan(self) -> float:
        """Time from the first op's start to the last op's end."""
        return max((e.end for dev in self.events for e in dev), default=0.0)

    @property
    def busy(self) -> tuple[float, ...]:
        """Per device, the total time spent running ops."""
        return tuple(sum(e.end - e.start for e in dev) for dev in self.events)

    @property
    def idle(self) -> tuple[float, ...]:
        """Per device, ``makespan - busy``: waiting at the start, in between, and at the end."""
        return tuple(self.makespan - b for b in self.busy)

    @property
    def bubble(self) -> float:
        """Idle share of the step: ``sum(idle) / (p * makespan)``; GPipe: ``(p-1)/(m+p-1)``."""
        return sum(self.idle) / (self.p * self.makespan) if self.makespan else 0.0

    @property
    def bubble_over_compute(self) -> float:
        """Idle time relative to compute: ``sum(idle) / sum(busy)``; GPipe: ``(p-1)/m``.

        This is the form of Narayanan et al. (2021): ``(p-1)/(v*m)`` for the interleaved
        schedule.
        """
        busy = sum(self.busy)
        return sum(self.idle) / busy if busy else 0.0

    @property
    def peak_in_flight(self) -> tuple[int, ...]:
        """Per device, the most (micro-batch, chunk) pairs whose activations are held at once.

        A pair is held from the start of its ``F`` to the end of its ``B`` (``W`` for
        zero-bubble schedules); a release and an acquire at the same instant do not overlap.
        """
        out = []
        for dev in self.events:
            points = []
            for e in dev:
                if e.op.kind == "F":
                    points.append((e.start, 1, 1))
                elif e.op.kind in ("B", "W"):
                    points.append((e.end, 0, -1))
            held = peak = 0
            for _, _, delta in sorted(points):
                held += delta
                peak = max(peak, held)
            out.append(peak)
        return tuple(out)


def simulate(schedule: Schedule, p: int, m: int, costs: Costs | None = None) -> Timeline:
    """Run a schedule's per-device orders as an event simulation.

    Args:
        schedule: ``GPipe()``, ``OneFOneB()``, ``Interleaved(v)`` or ``ZeroBubbleH1()``.
        p: devices on the 'stage' mesh axis.
        m: micro-batches.
        costs: per-op costs of one chunk; default ``Costs(t_f=1, t_b=2, t_w=0, t_comm=0)``.
            Schedules without a split backward pay ``t_b + t_w`` per ``B``.

    Returns:
        The :class:`Timeline`.

    Raises:
        ValueError: if the schedule does not fit ``p`` and ``m`` (the message names the fix).

    Example:
        >>> from shardkit.pipeline import Interleaved
        >>> round(simulate(Interleaved(v=2), p=4, m=8).bubble_over_compute, 4)  # (p-1)/(v*m)
        0.1875
    """
    costs = Costs() if costs is None else costs
    orders = schedule.orders(p, m)
    v = schedule.virtual
    ends: dict[tuple[str, int, int], float] = {}
    free = [0.0] * p
    pos = [0] * p
    events: list[list[Event]] = [[] for _ in range(p)]
    progress = True
    while progress:
        progress = False
        for d in range(p):
            while pos[d] < len(orders[d]):
                op = orders[d][pos[d]]
                deps = op_deps(op, d, p, v)
                if any((k, i, s) not in ends for k, i, s, _ in deps):
                    break
                start = max(
                    [free[d]]
                    + [ends[k, i, s] + (costs.t_comm if s % p != d else 0.0) for k, i, s, _ in deps]
                )
                end = start + costs.of(op.kind)
                events[d].append(Event(op, start, end))
                for key in done_keys(op, d, p):
                    ends[key] = end
                free[d] = end
                pos[d] += 1
                progress = True
    if any(pos[d] < len(orders[d]) for d in range(p)):
        heads = {d: orders[d][pos[d]] for d in range(p) if pos[d] < len(orders[d])}
        raise ShardkitRuntimeError(f"{schedule.name}: orders deadlock; waiting heads {heads}")
    return Timeline(schedule.name, p, m, v, costs, tuple(tuple(e) for e in events))
