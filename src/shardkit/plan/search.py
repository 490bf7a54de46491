"""The search: every data x fsdp x tensor x stage layout, ranked by predicted step time.

`plan(workload, devices=, hardware=, batch=)` enumerates the degrees whose product is the
device count and that the shapes allow (tensor divides the heads and F, stage divides the
layers, data x fsdp x micro-batches divides the batch), the ZeRO stage over "fsdp" (3 or 1;
only 1 under a pipeline, since ZeRO-3 would gather the weights once per micro-batch), the remat
policy and the micro-batch count. Each layout keeps its fastest variant that fits in memory;
layouts are ranked by predicted step time.

Example:
    >>> p = plan("llama3-8b", devices=8, hardware="h100", batch=8)
    >>> p.best.mesh_axes
    {'fsdp': 8}
"""

from __future__ import annotations

import difflib
import json
import math
import numbers
from typing import Any

from shardkit.common import format_bytes as _size
from shardkit.errors import ShardkitError, ShardkitTypeError, ShardkitValueError
from shardkit.plan import pipe
from shardkit.plan.checks import checked
from shardkit.plan.cost import Candidate, divisors, evaluate
from shardkit.plan.hardware import Hardware, get_hardware
from shardkit.plan.memory import model_state_bytes
from shardkit.plan.report import render, table, why
from shardkit.plan.runtime import Runtime, get_runtime
from shardkit.plan.workload import REMAT_POLICIES, Dense, Transformer, check_remat, preset


class NoValidLayoutError(ShardkitError, ValueError):
    """No data x fsdp x tensor x stage factorization of the device count fits the shapes."""


class DoesNotFitError(ShardkitError, ValueError):
    """Every layout needs more memory per device than the hardware has."""


def _as_workload(workload: Any, batch: int | None) -> Transformer | Dense:
    if isinstance(workload, str):
        workload = preset(workload)
    elif hasattr(workload, "n_layers") and hasattr(workload, "d_model"):  # a GPTConfig
        workload = Transformer.from_gpt_config(workload, batch=batch or 8)
    if not isinstance(workload, Transformer | Dense):
        raise ShardkitTypeError(
            f"workload {workload!r} is not a Transformer, Dense, preset name or GPTConfig; "
            "fix: shardkit.plan.Transformer.preset('gpt3-175b')."
        )
    return workload.replace(batch=batch) if batch is not None else workload


def _model_splits(w: Transformer | Dense, n: int, max_stage: int | None):
    """(tensor, stage) degrees of `n` devices that the shapes allow: tensor divides the heads
    and d_ff, every stage holds at least one layer (equal stages unless uneven)."""
    for t in divisors(n):
        if isinstance(w, Dense) and t > 1:
            continue
        if isinstance(w, Transformer) and (w.heads % t or w.ff % t or (w.kv % t and t % w.kv)):
            continue
        for p in divisors(n // t):
            if (isinstance(w, Dense) and p > 1) or (max_stage and p > max_stage):
                continue
            if isinstance(w, Transformer) and (
                p > w.layers or (w.layers % p and not w.uneven_stages)
            ):
                continue
            yield t, p


def _layouts(w: Transformer | Dense, n: int, max_stage: int | None):
    """(data, fsdp, tensor, stage) tuples allowed by the shapes and the batch."""
    out = []
    for t, p in _model_splits(w, n, max_stage):
        for f in divisors(n // (t * p)):
            d = n // (t * p * f)
            if w.batch % (d * f) == 0 and (p == 1 or w.batch // (d * f) >= p):
                out.append((d, f, t, p))
    return out


def plan(
    workload: Any,
    *,
    devices: int,
    hardware: str | Hardware = "h100",
    batch: int | None = None,
    remat: str | None = None,
    schedule: str = "1f1b",
    virtual: int = 2,
    max_stage: int | None = None,
    zero: tuple[int, ...] = (3, 1),
    sequence_parallel: bool = False,
    collective_matmul: bool = False,
    runtime: str | Runtime = "shardkit",
) -> Plan:
    """Ranks every layout of `workload` on `devices` chips of `hardware` by step time.

    Args:
        workload: a `Transformer`, `Dense`, preset name ("gpt3-175b", "llama3-8b", ...) or a
            shardkit `GPTConfig`.
        devices: number of chips.
        hardware: profile name ("h100", "a100", "tpu-v5p", "cpu", ...) or `Hardware`.
        batch: global batch in sequences (default: the workload's).
        remat: fix the remat policy ("none", "dots", "dots_no_batch", "block"), or "auto"
            (the search chooses); None (the default): the workload's.
        schedule: pipeline schedule for stage > 1 ("1f1b", "gpipe", "interleaved" or
            "zb-h1"; `shardkit.plan.pipe`: the schedules shardkit's pipeline runs).
        virtual: model chunks per device for the interleaved schedule.
        max_stage: largest pipeline degree to consider (1: no pipeline).
        zero: ZeRO stages allowed over an "fsdp" axis (3 and/or 1); () allows no "fsdp"
            axis (plain data parallelism replicates the state, as Megatron-LM without its
            distributed optimizer).
        sequence_parallel: predict tensor-parallel layouts with Megatron-style sequence
            parallelism (block inputs split over "tensor" too; see `evaluate`), to compare
            with published runs that used it; `strategy()` runs such rows with
            `Hybrid(sequence_parallel=True)` (not inside pipeline stages).
        collective_matmul: with sequence_parallel, predict the blocks' tensor traffic as
            overlapped collective-matmul rings (`Hybrid(collective_matmul=True)`).
        runtime: the software the layouts run on (`shardkit.plan.runtime`): "shardkit"
            (default: what `strategy()` runs), or "megatron", "torchtitan", "pytorch-fsdp",
            "maxtext" (or a `Runtime`) to predict another stack's runs, e.g. a published one.

    Returns:
        A `Plan`; `plan.best` is the fastest layout that fits.

    Raises:
        ValueError: before the search, for `devices`, `batch`, `virtual` or `max_stage` not a
            positive int (not a bool, nor a float, even 16.0), `zero` not a tuple of 1 and 3,
            an unknown `remat` or `schedule`; the message names the argument and the fix.
        NoValidLayoutError: when no factorization of `devices` suits the shapes and batch.
        DoesNotFitError: when no layout fits in memory (says by how much and what would fit).
        UnknownHardwareError: for an unknown hardware name (lists the known ones).

    Example:
        >>> p = plan("gpt3-175b", devices=1024, hardware="a100", batch=1536)
        >>> p.best.layout
        'stage=2 fsdp=64 tensor=8 (ZeRO-1)'
        >>> p.rank(p.find(data=8, tensor=8, stage=16))  # Megatron's layout, with ZeRO allowed
        20
    """
    devices, batch, allowed = _check_arguments(devices, batch, zero, remat)
    if collective_matmul and not sequence_parallel:
        raise ShardkitValueError(
            "plan(collective_matmul=True) overlaps sequence parallelism's all-gathers and "
            "reduce-scatters, and sequence_parallel is off; fix: plan(..., "
            "sequence_parallel=True, collective_matmul=True) (--sequence-parallel)."
        )
    virtual, max_stage = _check_options(schedule, virtual, max_stage)
    hw = get_hardware(hardware)
    w = _as_workload(workload, batch)
    layouts = _layouts(w, devices, max_stage)
    if not layouts:
        raise NoValidLayoutError(no_layout_message(w, devices, max_stage))
    remat = w.remat if remat is None else remat
    policies = REMAT_POLICIES if remat == "auto" else [remat]
    best: dict[tuple, Candidate] = {}
    smallest: Candidate | None = None
    evaluated = 0
    sched = (schedule, virtual, sequence_parallel, collective_matmul, get_runtime(runtime))
    for c in _variants(w, hw, layouts, policies, allowed, sched):
        evaluated += 1
        if smallest is None or c.peak_bytes < smallest.peak_bytes:
            smallest = c
        if not c.fits:
            continue
        key = (c.data, c.fsdp, c.tensor, c.stage, c.zero, c.remat)
        if key not in best or c.step_time < best[key].step_time:
            best[key] = c
    if not best:
        more = _devices_that_fit(w, hw, devices, policies, allowed, sched, max_stage)
        msg = _no_fit_message(w, hw, devices, smallest, policies, more, 3 in allowed)
        raise DoesNotFitError(msg)
    fastest: dict[tuple, Candidate] = {}  # one row per layout: its fastest remat policy
    for key, c in best.items():
        if key[:5] not in fastest or c.step_time < fastest[key[:5]].step_time:
            fastest[key[:5]] = c
    best = fastest
    ranked = sorted(best.values(), key=lambda c: c.step_time)
    return Plan(workload=w, hardware=hw, devices=devices, candidates=ranked,
                evaluated=evaluated)  # fmt: skip


def _variants(w, hw, layouts, policies, allowed, sched):
    """Every (layout, ZeRO stage, remat, micro-batch count) candidate, costed.

    Without a pipeline only the fewest micro-batches that fit are kept per policy: more of
    them only repeat FSDP traffic.
    """
    for d, f, t, p in layouts:
        per_replica = w.batch // (d * f)
        ms = [m for m in divisors(per_replica) if p == 1 or m >= p]
        if p > 1 and sched[0] == "interleaved":
            ms = [m for m in ms if m % p == 0]
            if isinstance(w, Transformer) and (
                p * sched[1] > w.layers or (w.layers % (p * sched[1]) and not w.uneven_stages)
            ):
                continue  # each device holds `virtual` chunks of at least one layer
        # ZeRO-3 under a pipeline would gather the weights once per micro-batch: not tried
        zeros = [0] if f == 1 else [z for z in (3, 1) if z in allowed and (z == 1 or p == 1)]
        for z in zeros:
            for policy in policies:
                for m in ms:
                    c = evaluate(w, hw, data=d, fsdp=f, tensor=t, stage=p, zero=z,
                                 microbatches=m, remat=policy, schedule=sched[0],
                                 virtual=sched[1], sequence_parallel=sched[2],
                                 collective_matmul=sched[3], runtime=sched[4])  # fmt: skip
                    yield c
                    if p == 1 and c.fits:
                        break


def _check_arguments(devices: Any, batch: Any, zero: Any, remat: Any):
    """`devices` and `batch` as ints, the ZeRO stages `zero` allows as a tuple of ints; raises
    on any of them, or `remat`, that no plan could use (`checks.checked`)."""
    devices = checked(devices, "devices", "count", where="plan: ")
    batch = checked(batch, "batch", "count", where="plan: ", need="positive (an int)",
                    optional="the default: the workload's batch")  # fmt: skip
    if remat is not None:
        check_remat(remat, "plan: ")
    if isinstance(zero, tuple | list) and all(
        isinstance(z, numbers.Integral) and not isinstance(z, bool) and z in (1, 3) for z in zero
    ):
        return devices, batch, tuple(int(z) for z in zero)
    fix = "zero=(3, 1) (both), zero=(3,), zero=(1,) or zero=() (no fsdp axis)"
    if isinstance(zero, numbers.Integral) and not isinstance(zero, bool) and zero in (1, 3):
        fix = f"zero=({zero},) (a tuple of stages), or zero=(3, 1) to allow both"
    raise ShardkitValueError(
        f"plan: zero={zero!r} must be a tuple of ZeRO stages over 'fsdp': allowed stages are "
        f"1 and 3 (() allows no fsdp axis); fix: {fix}."
    )


def _check_options(schedule: str, virtual: int, max_stage: int | None) -> tuple[int, int | None]:
    """Raises on pipeline options that no layout could use, before the search; returns
    `virtual` and `max_stage` as ints."""
    pipe.schedule_object(schedule)  # an unknown name raises, naming the known ones
    fix = "max_stage=1 (no pipeline), or leave it None to try every pipeline degree"
    max_stage = checked(max_stage, "max_stage", "count", where="plan: ", fix=fix,
                        optional="the default: every pipeline degree")  # fmt: skip
    virtual = checked(virtual, "virtual", "count", where="plan: ", fix="virtual=2")
    if schedule == "interleaved" and virtual < 2:
        raise ShardkitValueError(
            f"schedule='interleaved' with virtual={virtual}: the interleaved schedule gives "
            "each device at least 2 model chunks; fix: virtual=2 (--virtual 2), or "
            "schedule='1f1b' for one chunk per device."
        )
    return virtual, max_stage


def _devices_that_fit(w, hw, n, policies, allowed, sched, max_stage) -> int | None:
    """The smallest n x 2^k (k <= 6) device count on which some layout fits, or None."""
    for k in range(1, 7):
        layouts = _layouts(w, n << k, max_stage)
        if any(c.fits for c in _variants(w, hw, layouts, policies, allowed, sched)):
            return n << k
    return None


def _batch_multiple(w, n: int, max_stage: int | None) -> int:
    """The smallest data x fsdp replica count that the shapes allow on `n` devices: every
    batch that is a multiple of it (and holds a micro-batch per stage) has a layout."""
    return min((n // (t * p) for t, p in _model_splits(w, n, max_stage)), default=n)


def no_layout_message(w, n: int, max_stage: int | None = None, *, trainer: bool = False) -> str:
    """Why no layout of `n` devices suits `w` and its batch, ending with the fix.

    Speaks of the degrees the planner tries for `w`: data x fsdp only for a `Dense` model,
    tensor and stage too for a `Transformer`. With `trainer` (Auto choosing for a `Trainer`),
    the fix names fewer of the `n` devices, as `Trainer(..., devices=jax.devices()[:k])`.
    """
    k = _batch_multiple(w, n, max_stage)
    lo = w.batch // k
    multiples = [b * k for b in range(max(1, lo - 64), lo + 66)]  # the nearest ones
    fits = [b for b in multiples if _layouts(w.replace(batch=b), n, max_stage)]
    below = [b for b in fits if b < w.batch][-1:]
    batches = " or ".join(map(str, below + [b for b in fits if b > w.batch][:1])) or str(k * n)
    if isinstance(w, Transformer):
        shape = f"heads={w.heads}, kv_heads={w.kv}, d_ff={w.ff}, layers={w.layers}, "
        rule = "data x fsdp must divide the batch, tensor must divide the heads and d_ff, stage "
        rule += "the layers"
        split = f"data x fsdp = {k} with the widest tensor x stage the shapes allow"
    else:
        shape, split = "", f"data x fsdp = all {n} devices"
        rule = "a Dense model is split over data x fsdp only (no tensor or pipeline split), "
        rule += "and data x fsdp must divide the batch"
        if trainer:
            rule = "Auto splits a model other than shardkit's GPT over data x fsdp only (tensor "
            rule += "parallelism needs a strategy that names the dims to split), and data x "
            rule += "fsdp must divide the batch"
    if trainer:
        fewer = [c for c in range(n - 1, 0, -1) if _layouts(w, c, max_stage)][:3] or [1]
        also = f"; {' or '.join(map(str, fewer[1:]))} work too" if fewer[1:] else ""
        devices = f"train on {fewer[0]} devices (Trainer(..., devices=jax.devices()[:{fewer[0]}])"
        devices += f"{also})"
        batch = f"a batch that is a multiple of {k} (the Trainer's batch_size; {split})"
    else:
        near = [c for c in range(max(1, n - 16), n + 17) if c != n and _layouts(w, c, max_stage)]
        near = sorted(sorted(near, key=lambda c: (abs(c - n), c))[:4])
        devices = f"use {' or '.join(map(str, near)) or 'a power of two'} devices"
        batch = f"a batch that is a multiple of {k} ({split})"
    return (
        f"no layout of {n} devices suits {w.name!r} ({shape}batch={w.batch}): {rule}; fix: "
        f"{devices}, or {batch}, e.g. {batches}."
    )


def _no_fit_message(w, hw: Hardware, n: int, smallest, policies, more, zero3: bool) -> str:
    budget = hw.usable_bytes
    state3 = model_state_bytes(w.n_params(), zero=3, shards=n, precision=w.precision,
                               optimizer=w.optimizer).total  # fmt: skip
    need = smallest.peak_bytes if smallest else state3
    fixes = []
    fit = f"a layout fits on {more} devices" if more else f"no layout fits on up to {n << 6}"
    if state3 > budget:
        state_devices = 2 ** math.ceil(math.log2(state3 * n / budget))
        fixes.append(
            f"more devices: the model state alone (ZeRO-3 over all {n}) is {_size(state3)} per "
            f"device, so the state alone needs at least {state_devices} devices; {fit}"
        )
    else:
        fixes.append(
            f"more devices (ZeRO-3 state over {n} is {_size(state3)}; the rest is activations, "
            f"split further by tensor or pipeline degrees): {fit}"
        )
    if "block" not in policies:
        fixes.append("remat='block' (keeps one block input per layer)")
    fixes.append(
        "ZeRO-3 over an fsdp axis is already among the layouts tried"
        if zero3
        else "allow ZeRO-3 (zero=(3, 1), --zero 3,1): it splits weights and gradients too"
    )
    if smallest is not None and smallest.micro_batch > 1:
        fixes.append(f"a smaller batch per device (micro-batch {smallest.micro_batch})")
    else:
        fixes.append("a smaller batch or shorter sequences (micro-batch is already 1)")
    detail = ""
    if smallest is not None:
        detail = (
            f"; the smallest layout ({smallest.layout}, remat={smallest.remat}) needs "
            f"{_size(smallest.peak_bytes)}: state "
            f"{_size(smallest.param_bytes + smallest.opt_bytes)}"
            f" + gradients {_size(smallest.grad_bytes)} + activations "
            f"{_size(smallest.activation_bytes + smallest.logits_bytes)}"
        )
    return (
        f"{w.name!r} fits on no layout of {n} x {hw.name}: it needs at least {_size(need)} per "
        f"device but {_size(budget)} is usable ({hw.memory_fraction:.0%} of "
        f"{_size(hw.hbm_bytes)}), {_size(need - budget)} ({need / budget:.1f}x) too much{detail}. "
        f"fix: {'; '.join(fixes)}."
    )


# what `Plan.find` matches on: the degrees, then a row's settings
_FIND_KEYS = ("data", "fsdp", "tensor", "stage", "zero", "remat", "microbatches", "micro_batch",
              "schedule", "virtual", "sequence_parallel", "collective_matmul",
              "runtime")  # fmt: skip


class Plan:
    """Ranked layouts for one workload on one machine.

    Attributes:
        workload: the `Transformer` or `Dense` planned.
        hardware: the `Hardware` profile.
        devices: number of chips.
        candidates: layouts that fit, fastest first (one per data/fsdp/tensor/stage/ZeRO).
        evaluated: how many (layout, remat, micro-batch) variants were costed.

    `print(plan)` shows the ranked table and why the top row wins; `plan.best.strategy()`
    is the shardkit strategy of the top row; `plan.to_json()` has everything.
    """

    def __init__(self, *, workload, hardware, devices, candidates, evaluated):
        self.workload, self.hardware, self.devices = workload, hardware, devices
        self.candidates: list[Candidate] = list(candidates)
        self.evaluated = evaluated

    @property
    def best(self) -> Candidate:
        """The fastest layout that fits."""
        return self.candidates[0]

    def runnable_best(self) -> Candidate:
        """The fastest layout that shardkit runs (`Candidate.runnable`).

        Rows combining fsdp, or sequence parallelism, with pipeline stages are predictions
        only; they are passed over.

        Raises:
            NoValidLayoutError: when no row is runnable (names the fix).
        """
        for c in self.candidates:
            if c.runnable:
                return c
        sp = any(getattr(c, "sequence_parallel", False) and c.stage > 1 for c in self.candidates)
        why = "sequence parallelism inside pipeline stages" if sp else "fsdp inside pipeline stages"
        fix = "drop --sequence-parallel (or give a batch that splits without stages), or " * sp
        raise NoValidLayoutError(
            f"none of the {len(self.candidates)} planned layouts can be run by shardkit ({why}"
            f", e.g. {self.candidates[0].layout}); fix: {fix}--strategy hybrid with --mesh "
            "data=...,stage=..., or plan(..., max_stage=1)."
        )

    def top(self, n: int = 5) -> list[Candidate]:
        return self.candidates[:n]

    def find(self, **degrees) -> Candidate | None:
        """The ranked candidate with these degrees (e.g. `find(fsdp=32, tensor=8)`), or None.

        Degrees not given are 1; `zero`, `remat`, `microbatches` and the other names in
        `_FIND_KEYS` (a row's settings) narrow the match further.

        Raises:
            ValueError: for a name that is no degree or setting of a row (lists the known
                ones), e.g. `find(datas=8)`.
        """
        unknown = sorted(set(degrees) - set(_FIND_KEYS))
        if unknown:
            given = ", ".join(f"{k}={degrees[k]!r}" for k in unknown)
            near = [difflib.get_close_matches(k, _FIND_KEYS, n=1) for k in unknown]
            fix = ", ".join(f"{m[0]}={degrees[k]!r}" for k, m in zip(unknown, near) if m)
            raise ShardkitValueError(
                f"Plan.find({given}): no such degree or setting; known: {', '.join(_FIND_KEYS)}; "
                f"fix: find({fix or 'data=..., fsdp=..., tensor=..., stage=...'})."
            )
        want = {"data": 1, "fsdp": 1, "tensor": 1, "stage": 1} | degrees
        zero = want.pop("zero", None)
        for c in self.candidates:
            if all(getattr(c, k) == v for k, v in want.items()) and zero in (None, c.zero):
                return c
        return None

    def rank(self, candidate: Candidate | None) -> int | None:
        """1-based rank of `candidate` (None if absent)."""
        return None if candidate is None else self.candidates.index(candidate) + 1

    def verify(self, top: int = 3, **kwargs):
        """Compiles the top layouts with shardkit's GPT and prints predicted next to compiled:
        ``shardkit.verify.verify(self, top=top, **kwargs)``.

        The planner itself is pure arithmetic; compiling real steps lives in `shardkit.verify`,
        above it. This convenience is the planner's one import of that layer, on call
        (`tests/test_architecture.py` names it).
        """
        from shardkit.verify import verify  # the planner's one upward import, on call

        return verify(self, top=top, **kwargs)

    def why(self) -> str:
        """One paragraph: why the top layout wins, in numbers."""
        return why(self)

    def table(self, top: int = 8):
        """A rich `Table` of the top layouts."""
        return table(self, top=top)

    def render(self, top: int = 8, width: int = 160) -> str:
        """The table and the why paragraph as plain text."""
        return render(self, top=top, width=width)

    def __str__(self) -> str:
        return self.render()

    def __repr__(self) -> str:
        return (
            f"Plan({self.workload.name!r} on {self.devices} x {self.hardware.name}: "
            f"{len(self.candidates)} layouts fit, best {self.best.layout})"
        )

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        import dataclasses

        w = dataclasses.asdict(self.workload)
        w["precision"] = str(getattr(self.workload.precision, "name", self.workload.precision))
        return {
            "workload": w,
            "n_params": self.workload.n_params(),
            "hardware": self.hardware.name,
            "devices": self.devices,
            "evaluated": self.evaluated,
            "why": self.why(),
            "candidates": [c.to_dict() for c in self.candidates[:top]],
        }

    def to_json(self, top: int | None = None, **kwargs) -> str:
        """The plan as JSON (all fitting layouts, or the first `top`)."""
        return json.dumps(self.to_dict(top), **({"indent": 2} | kwargs))
