"""The planner's pipeline terms, taken from `shardkit.pipeline`: what the executor runs.

A pipelined row of the planner (stage > 1) names a schedule; this module maps it onto the
`shardkit.pipeline` schedule the `Trainer` runs and reads that schedule's own facts, so the
planner and the SPMD executor agree:

- `steps`: lockstep steps of the schedule's step table (`table(...).steps`, the executor's scan
  length); each step sends one activation forward and one gradient back along "stage", so the
  collective-permute traffic is 2 x steps x one activation, idle lanes included;
- `in_flight`: micro-batches whose activations the busiest device holds at once
  (`table(...).peak_in_flight`), in units of one stage's layers (an interleaved chunk counts
  1/v): fused 1F1B holds min(m, 2p - 1), not textbook 1F1B's min(m, p);
- `bubble`: idle share of the lockstep step table with a backward twice as long as a forward
  (`Table.bubble`): (p-1)/(m+p-1) for GPipe and 1F1B; more than the event simulator's for
  the interleaved and zero-bubble schedules, whose ops do not line up in lockstep.

GPipe and fused 1F1B use their closed forms (`tests/test_plan_pipeline.py` checks them against
the table and the simulator on a grid); the other schedules build the table once per (p, m, v).

Example:
    >>> f = facts("1f1b", stages=4, microbatches=8)
    >>> f.steps, f.in_flight, round(f.bubble, 4)
    (14, 7.0, 0.2727)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from shardkit.errors import ShardkitValueError
from shardkit.pipeline import Costs, table
from shardkit.pipeline.names import schedule_from_name

SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1")
"""Planner schedule names; each is the `shardkit.strategies.Pipeline` schedule of that name."""


@dataclasses.dataclass(frozen=True)
class PipelineFacts:
    """What one schedule does at (p, m, v), as the executor runs it.

    Attributes:
        schedule: planner name ("1f1b", "gpipe", "interleaved", "zb-h1").
        stages, microbatches, virtual: p, m, v.
        steps: lockstep steps of the step table.
        lanes: ops per device per step (2 for fused 1F1B).
        in_flight_pairs: most (micro-batch, chunk) pairs the busiest device holds at once.
        in_flight: the same in stage units (pairs / v): multiply one micro-batch's
            activations of a whole stage by it.
        bubble: idle share of the lockstep step time (backward = 2 x forward).
    """

    schedule: str
    stages: int
    microbatches: int
    virtual: int
    steps: int
    lanes: int
    in_flight_pairs: int
    in_flight: float
    bubble: float


def schedule_object(name: str, virtual: int = 2) -> Any:
    """The `shardkit.pipeline` schedule for a planner schedule name.

    Raises:
        ValueError: for an unknown name (lists the known ones).

    Example:
        >>> schedule_object("interleaved", virtual=2).name
        'interleaved-v2'
    """
    if name not in SCHEDULES:
        raise ShardkitValueError(
            f"unknown pipeline schedule {name!r}; fix: one of {', '.join(SCHEDULES)}."
        )
    return schedule_from_name(name, virtual=virtual)


def facts(
    schedule: str, stages: int, microbatches: int, virtual: int = 1, runtime: str = "lockstep"
) -> PipelineFacts:
    """Steps, in-flight micro-batches and bubble of `schedule` at (p, m, v).

    Args:
        schedule: "1f1b" (fused, shardkit's default), "gpipe", "interleaved" or "zb-h1".
        stages: p, devices along "stage".
        microbatches: m.
        virtual: chunks per device for "interleaved" (ignored otherwise).
        runtime: "lockstep" (shardkit's executor: the step table) or "async" (a point-to-
            point runtime such as Megatron-LM's or torchtitan's: `async_facts`).

    Raises:
        ValueError: for an unknown schedule, or (p, m, v) the schedule cannot run (the
            schedule's own message, with its fix).

    Example:
        >>> facts("gpipe", stages=4, microbatches=8).in_flight
        8.0
    """
    v = virtual if schedule == "interleaved" else 1
    if runtime == "async":
        schedule_object(schedule, virtual=max(v, 2)).check(int(stages), int(microbatches))
        return async_facts(schedule, int(stages), int(microbatches), int(v))
    return _facts(schedule, int(stages), int(microbatches), int(v))


def async_facts(schedule: str, p: int, m: int, v: int = 1) -> PipelineFacts:
    """The textbook schedules as point-to-point runtimes run them (Narayanan et al. 2021,
    arXiv:2104.04473, §2.2; Qi et al. 2023, arXiv:2401.10241, for ZB-H1).

    Each stage runs its own op list and waits only for its neighbours: the bubble is
    (p - 1) / (v m) of the ideal time, i.e. (p - 1) / (v m + p - 1) of the step (ZB-H1 a third
    of 1F1B's); 1F1B holds min(m, p) micro-batches, interleaved p + (p - 1) / v stage-units
    (Megatron's p (1 + (p - 1) / (p v))), GPipe m; every micro-batch crosses each of a device's
    v chunks once forward and once backward (`steps` = v m send pairs).

    Example:
        >>> f = async_facts("interleaved", 8, 64, 4)
        >>> f.in_flight, round(f.bubble, 4)
        (9.75, 0.0266)
    """
    if p == 1:
        return PipelineFacts(schedule, 1, m, 1, m, 1, 1, 1.0, 0.0)
    bubble = (p - 1) / (v * m + p - 1)
    if schedule == "gpipe":
        return PipelineFacts(schedule, p, m, 1, m, 1, m, float(m), bubble)
    if schedule == "interleaved":
        pairs = min(v * m, v * p + p - 1)
        return PipelineFacts(schedule, p, m, v, v * m, 1, pairs, pairs / v, bubble)
    if schedule == "zb-h1":
        bubble = (p - 1) / (3 * m + p - 1)
    return PipelineFacts(schedule, p, m, 1, m, 1, min(m, p), float(min(m, p)), bubble)


@functools.lru_cache(maxsize=4096)
def _facts(schedule: str, p: int, m: int, v: int) -> PipelineFacts:
    if p == 1:
        return PipelineFacts(schedule, 1, m, 1, m, 1, 1, 1.0, 0.0)
    sched = schedule_object(schedule, virtual=v)
    sched.check(p, m)
    bubble = (p - 1) / (m + p - 1)
    if schedule == "gpipe":  # all forwards, then all backwards; one lane
        return PipelineFacts(schedule, p, m, 1, 2 * (m + p - 1), 1, m, float(m), bubble)
    if schedule == "1f1b":  # fused: F(j) at step d + j, B(j) at 2p - 2 - d + j, two lanes
        pairs = min(m, 2 * p - 1)
        return PipelineFacts(schedule, p, m, 1, m + 2 * p - 2, 2, pairs, float(pairs), bubble)
    t = table(sched, p, m)
    # backward = 2 x forward; the zero-bubble split gives its input and weight halves 1 each
    costs = Costs(t_f=1.0, t_b=1.0, t_w=1.0) if schedule == "zb-h1" else Costs(t_f=1.0, t_b=2.0)
    pairs = max(t.peak_in_flight)
    return PipelineFacts(
        schedule, p, m, v, t.steps, t.lanes, pairs, pairs / v, float(t.bubble(costs))
    )


def strategy(candidate: Any, residuals: str | None = None) -> Any:
    """`Hybrid(data=, tensor=, pipeline=Pipeline(...))` for a pipelined planner row.

    The row's remat policy picks the executor's backward: "block" runs `residuals="recompute"`
    (each backward op reruns its stage's forward; the stage input waits per in-flight
    micro-batch), the others `residuals="stash"` (the forward's matmul outputs wait, nothing
    is recomputed), which is what the planner's memory and FLOPs assume for that policy.

    Args:
        candidate: a `Candidate` with stage > 1.
        residuals: override ("stash" or "recompute").

    Raises:
        ValueError: for a row with an "fsdp" degree as well as stages (the Trainer does not
            run FSDP inside pipeline stages: such rows are predictions only).

    Example:
        >>> from shardkit.plan import Transformer, evaluate
        >>> w = Transformer(layers=4, d_model=64, heads=4, vocab=64, seq=16, batch=16)
        >>> s = strategy(evaluate(w, "cpu", data=2, stage=4, microbatches=4))
        >>> s.mesh_axes(8), s.pipeline.schedule.name
        ({'stage': 4, 'data': 2}, '1f1b')
    """
    # lazy and upward: the planner imports no JAX and sits below the strategies (whose
    # `Auto` plans); a row becomes a strategy on request
    from shardkit.strategies.core import Hybrid
    from shardkit.strategies.pipeline import Pipeline  # (as above)

    reason = not_runnable(candidate)
    if reason:
        raise ShardkitValueError(reason)
    pipe = Pipeline(
        stages=candidate.stage,
        schedule=schedule_object(candidate.schedule or "1f1b", virtual=candidate.virtual),
        microbatches=candidate.microbatches,
        residuals=residuals or ("recompute" if candidate.remat == "block" else "stash"),
    )
    return Hybrid(data=candidate.data, tensor=candidate.tensor, pipeline=pipe)


def not_runnable(candidate: Any) -> str:
    """Why shardkit cannot run a planner row ("" when it can).

    Example:
        >>> from shardkit.plan import Transformer, evaluate
        >>> w = Transformer(layers=4, d_model=64, heads=4, vocab=64, seq=16, batch=16)
        >>> not_runnable(evaluate(w, "cpu", fsdp=2, stage=4, zero=1, microbatches=4))[:29]
        'layout stage=4 fsdp=2 (ZeRO-1'
    """
    runtime = getattr(candidate, "runtime", "shardkit")
    if candidate.stage > 1 and runtime != "shardkit":
        return (
            f"layout {candidate.layout} was predicted for the {runtime!r} runtime's pipeline, "
            "not shardkit's lockstep executor; fix: plan(..., runtime='shardkit') for rows "
            "shardkit runs."
        )
    if candidate.stage > 1 and candidate.fsdp > 1:
        return (
            f"layout {candidate.layout} is a prediction only: the Trainer does not run FSDP "
            f"(fsdp={candidate.fsdp}) inside pipeline stages (stage={candidate.stage}); fix: "
            "pick a row without fsdp (plan.find(data=..., stage=...)), or plan with "
            "zero=() so pipelined rows split the batch over data."
        )
    return ""
