"""The planner against published training runs: predicted MFU, rank of the published layout, fit.

A published run is a mapping (one `[[run]]` table of a TOML file, `load`) with the model's
shape, the hardware and device count, the layout and settings it ran with, the stack that ran
it and the MFU it reached. `compare(run)` plans the model on that machine with those settings
(remat policy, schedule, sequence parallelism, the stack's `shardkit.plan.runtime`) and reports
the published layout's predicted MFU, its rank among the planner's layouts and whether the
planner thinks it fits. `benchmarks/plan_published.py` prints the table for the runs in
`tests/data/published_*.toml`; `tests/test_plan_published.py` holds the planner to them.

Keys of a run (Megatron's notation; see `tests/data/published_gpu.toml`): id, source, stack,
hardware, devices, slices (TPU slices over the data-centre network), dtype ("fp8" for fp8
matmuls), layers, d_model, heads, kv_heads, head_dim, d_ff, gated, parallel_block, vocab, seq,
tied, positions, batch (global, in sequences), micro_batch, data, fsdp, zero, tensor, stage,
context, virtual, schedule, sequence_parallel, recompute ("full", "selective", "none", or
MaxText's "minimal": the planner's "dots_no_batch"), mfu (model FLOPs over the bf16 peak), hfu
(optional), verified (false: settings partly inferred).

Example:
    >>> run = dict(id="toy", stack="megatron", hardware="a100", devices=8, layers=4,
    ...            d_model=1024, heads=16, vocab=32000, seq=1024, batch=64, micro_batch=8,
    ...            data=8, recompute="none", mfu=0.4)
    >>> c = compare(run)
    >>> c.layout, c.fits
    ('data=8', True)
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import tomllib
from typing import Any

from shardkit.errors import ShardkitValueError
from shardkit.plan.cost import divisors, evaluate
from shardkit.plan.hardware import get_hardware
from shardkit.plan.search import DoesNotFitError, plan
from shardkit.plan.workload import REMAT_POLICIES, Transformer

# the stack that ran a published run -> the planner runtime that predicts it
STACK_RUNTIMES = {
    "megatron": "megatron", "megatron-core": "megatron-core", "nemo": "megatron-core",
    "llama3": "megatron-core", "deepspeed": "megatron",
    "torchtitan": "torchtitan", "llm-foundry": "pytorch-fsdp", "maxtext": "maxtext",
    "palm": "maxtext", "shardkit": "shardkit",
}  # fmt: skip
# MaxText's "minimal" is JAX's dots_with_no_batch_dims_saveable (MaxText/layers/models.py)
_REMAT = {"full": "block", "selective": "dots", "minimal": "dots_no_batch", "none": "none",
          "block": "block", "dots": "dots", "dots_no_batch": "dots_no_batch"}  # fmt: skip
_SHAPE = ("layers", "d_model", "heads", "vocab", "seq", "batch", "d_ff", "kv_heads", "gated",
          "tied", "positions", "norm_params", "head_dim", "parallel_block")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One published run next to the planner's prediction of it.

    Attributes:
        id, source: the run and where its figures come from.
        hardware, devices, runtime: the machine and the planner runtime used.
        layout: the published layout in the planner's words.
        published_mfu, predicted_mfu: model-FLOP utilisation, published and predicted.
        published_hfu, predicted_hfu: hardware FLOPs (recompute included); None if not published.
        rank: 1-based rank of the published layout among the planner's layouts (None: the
            planner did not keep it).
        top: the planner's first choice.
        fits: whether the planner predicts the published configuration fits in memory.
        margin: share of usable memory left at the predicted peak (negative: over).
        candidate: the planner's `Candidate` for the published configuration (its time and
            memory breakdown).
    """

    id: str
    source: str
    hardware: str
    devices: int
    runtime: str
    layout: str
    published_mfu: float
    predicted_mfu: float
    published_hfu: float | None
    predicted_hfu: float
    rank: int | None
    top: str
    fits: bool
    margin: float
    candidate: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def ratio(self) -> float:
        """Predicted over published MFU."""
        return self.predicted_mfu / self.published_mfu


def load(*paths: str | pathlib.Path) -> list[dict[str, Any]]:
    """The `[[run]]` tables of TOML files, in order.

    Raises:
        ValueError: for a file without runs, or two runs with the same id.
    """
    runs: list[dict[str, Any]] = []
    for path in paths:
        found = tomllib.loads(pathlib.Path(path).read_text()).get("run", [])
        if not found:
            raise ShardkitValueError(f"{path}: no [[run]] tables; fix: add runs as [[run]].")
        runs.extend(found)
    ids = [r.get("id") for r in runs]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ShardkitValueError(f"published runs: id(s) {twice} appear twice; fix: rename.")
    return runs


def workload(run: dict[str, Any]) -> Transformer:
    """The run's model as a `Transformer` with its batch, remat policy and stack's habits
    (remat "auto" when the source does not say what was recomputed)."""
    shape = {k: run[k] for k in _SHAPE if k in run}
    megatron = STACK_RUNTIMES.get(run.get("stack", "shardkit"), "").startswith("megatron")
    fp8 = run.get("dtype") == "fp8"
    return Transformer(
        name=run["id"], **shape, remat=_REMAT[run["recompute"]] if "recompute" in run else "auto",
        precision="fp8" if fp8 else "megatron" if megatron else "mixed",
        uneven_stages=run.get("stack", "shardkit") != "shardkit", optimizer="adam",
    )  # fmt: skip


def not_modelled(run: dict[str, Any]) -> str:
    """Why `run` is not scored ("" when it is): context parallelism, which the planner does
    not model, or settings the source does not state (`verified = false`)."""
    if int(run.get("context", 1)) > 1:
        return f"context parallelism (context={run['context']}) is not modelled"
    if run.get("verified") is False:
        return "its settings are partly inferred (verified = false), so it is listed, not scored"
    return ""


def compare(run: dict[str, Any], **overrides: Any) -> Comparison:
    """Plans `run`'s model on its machine with its settings; see `Comparison`.

    The published configuration is evaluated as it ran; where the source does not state the
    micro-batch, the recomputation or the interleaving, the planner's fastest choice for that
    layout stands in.
    MFU is against the bf16 peak, as published (also for fp8 runs).

    Args:
        run: a published run (module docstring).
        **overrides: `plan` / `evaluate` keywords to change (e.g. `runtime="shardkit"`).

    Raises:
        ValueError: for a run missing a key the planner needs (names it), whose layout does
            not multiply to its device count, or that `not_modelled` rejects.
    """
    missing = [k for k in ("id", "hardware", "devices", "layers", "d_model", "heads", "vocab",
                           "seq", "batch", "mfu") if k not in run]  # fmt: skip
    if missing or not_modelled(run):
        why = f"lacks {missing}; fix: add them" if missing else not_modelled(run)
        raise ShardkitValueError(f"published run {run.get('id')!r}: {why}.")
    degrees = {k: int(run.get(k, 1)) for k in ("data", "fsdp", "tensor", "stage")}
    if math.prod(degrees.values()) != run["devices"]:
        raise ShardkitValueError(
            f"published run {run['id']!r}: data x fsdp x tensor x stage = {degrees} does not "
            f"multiply to devices={run['devices']}; fix: the layout's degrees."
        )
    zero = int(run.get("zero", 3 if degrees["fsdp"] > 1 else 0))
    if zero == 1 and degrees["fsdp"] == 1:  # a distributed optimizer over the data axis
        degrees["fsdp"], degrees["data"] = degrees["data"], 1
    if zero == 3 and degrees["stage"] > 1:
        # FSDP under a pipeline keeps the weights gathered across the micro-batches
        # (torchtitan turns reshard_after_forward off with pipelining; Llama 3, arXiv:
        # 2407.21783 §3.3.1, does not reshard after the forward): one gather per step,
        # the traffic of ZeRO-1
        zero = 1
    w, hw = workload(run), get_hardware(run["hardware"])
    if int(run.get("slices", 1)) > 1:  # TPU slices joined over the data-centre network
        hw = hw.replace(domain=min(hw.domain, run["devices"] // int(run["slices"])))
    runtime = STACK_RUNTIMES.get(run.get("stack", "shardkit"), "shardkit")
    # MaxText's logical axis rules shard the residual stream's embedding over "tensor": its
    # tensor parallelism keeps activations split as Megatron's sequence parallelism does
    sp = bool(run.get("sequence_parallel", False)) or runtime == "maxtext"
    settings = dict(runtime=runtime, sequence_parallel=sp)
    settings |= {k: v for k, v in overrides.items() if k != "zero"}
    c = _as_published(w, hw, run, degrees, zero, settings)
    settings |= dict(schedule=c.schedule or "1f1b")  # the published (or the fastest) one
    # the optimizer sharding the run's stack used is the one its layouts may use
    allowed = overrides.get("zero", () if zero == 0 else (zero,))
    try:
        p = plan(w, devices=run["devices"], hardware=hw, virtual=max(c.virtual, 2), zero=allowed,
                 **settings)  # fmt: skip
    except DoesNotFitError:
        rank, top = None, "(nothing fits)"
    else:
        rank, top = _rank(p, degrees, zero), p.best.layout
    bf16 = c.model_flops / (c.step_time * c.devices * hw.peak("bf16"))
    return Comparison(
        id=run["id"], source=run.get("source", ""), hardware=hw.name,
        devices=run["devices"], runtime=c.runtime, layout=c.layout,
        published_mfu=run["mfu"], predicted_mfu=bf16, published_hfu=run.get("hfu"),
        predicted_hfu=bf16 * c.hfu / c.mfu, rank=rank, top=top, fits=c.fits,
        margin=c.margin, candidate=c,
    )  # fmt: skip


def _as_published(w, hw, run, degrees, zero, settings):
    """The published configuration's `Candidate`: its remat, micro-batches and interleaving
    where stated, else the fastest that fits (the smallest peak when none does)."""
    replicas, p = degrees["data"] * degrees["fsdp"], degrees["stage"]
    per_replica = run["batch"] // replicas
    policies = [w.remat] if w.remat != "auto" else list(REMAT_POLICIES)
    rows = []
    for v in _virtuals(run, w, p):
        schedule = "interleaved" if v > 1 else run.get("schedule", "1f1b")
        schedule = "1f1b" if schedule == "interleaved" and v == 1 else schedule
        if "micro_batch" in run:
            counts = [per_replica // run["micro_batch"]]
        else:
            step = p if v > 1 else 1
            counts = [m for m in divisors(per_replica) if m >= p and m % step == 0]
        for r in policies:
            for m in counts:
                rows.append(evaluate(w, hw, **degrees, zero=zero, microbatches=m, remat=r,
                                     virtual=v, schedule=schedule, **settings))  # fmt: skip
    fitting = [c for c in rows if c.fits]
    if fitting:
        return min(fitting, key=lambda c: c.step_time)
    return min(rows, key=lambda c: c.peak_bytes)


def _virtuals(run, w, p: int) -> list[int]:
    """Interleaving degrees to try: the run's, or where the source names no schedule (or an
    interleaved one without its degree) every degree up to 8 that gives each chunk a layer."""
    if p == 1:
        return [1]
    if "virtual" in run:
        return [int(run["virtual"])]
    fits = [v for v in range(2, 9) if p * v <= w.layers and (w.layers % (p * v) == 0
                                                                or w.uneven_stages)]  # fmt: skip
    if run.get("schedule") == "interleaved":
        return fits or [2]
    return [1] if "schedule" in run else [1, *fits]


def _rank(p, degrees: dict[str, int], zero: int) -> int | None:
    """Rank of the published layout among the planner's layouts, a layout being its tensor and
    stage degrees, its data-parallel width and whether it shards the weights (ZeRO-3): how
    that width splits between "data" and a ZeRO-1 or ZeRO-3 "fsdp" axis of the same kind
    only moves optimizer state or the reduction's ring, and the planner's rows for those
    splits differ by a hundredth of a percent, so they count as one (its fastest row)."""

    def key(t, p_, width, sharded):
        return (t, p_, width, sharded)

    width = degrees["data"] * degrees["fsdp"]
    want = key(degrees["tensor"], degrees["stage"], width, degrees["fsdp"] > 1 and zero == 3)
    seen: list[tuple] = []
    for c in p.candidates:
        k = key(c.tensor, c.stage, c.data * c.fsdp, c.fsdp > 1 and c.zero == 3)
        if k not in seen:
            seen.append(k)
        if k == want:
            return len(seen)
    return None
