"""`Plan.verify`: compile the top layouts and print predicted next to compiled.

For each of a plan's top layouts that shardkit runs (`Candidate.runnable`; rows combining fsdp
with pipeline stages are predictions only and are skipped), shardkit's GPT training step (the
`Trainer` with AdamW) is compiled for that mesh with `shardkit.verify.measurement.measure_gpt`: on
a real simulated mesh when enough devices exist, otherwise on an `AbstractMesh` of the full
size (16,384 devices and more compile on one CPU).
Nothing is allocated.

The compiled model is shardkit's GPT with the workload's sizes: learned positions, an untied
output head, RMS norms with a scale, attention that keeps its probabilities. When the planned
workload differs (a tied head, SwiGLU, grouped-query attention, flash attention, ...), the
layout is predicted again for the model that is compiled, so the comparison is always
prediction vs compiler for the same program; the notes list the differences.

Checked per layout, per device, with the relative error (predicted - compiled) / compiled:

============================  =====================================================  =====
quantity                      compiled figure                                        bound
============================  =====================================================  =====
arguments                     `memory_analysis().argument_size_in_bytes`             1%
peak (arguments + temps)      arguments + outputs - aliased + temporaries            15%
collective bytes, per kind    `shardkit.inspect`, ring formulas, CPU-normalised      5%
FLOPs                         `cost_analysis()["flops"]`                             5%
============================  =====================================================  =====

Pipelined layouts compile the Trainer with `Candidate.strategy()`'s `Pipeline` (the SPMD
executor of `shardkit.pipeline`). XLA counts the matmuls of every branch of the executor's
per-lane `lax.switch` (idle, forward, forward + head, backward, backward + head) at every
step, so for them the compiled FLOPs are steps x (2 x (F + B) + head) per device, not the
m x (F + B + head) the busiest device executes; the prediction is converted to that count
(`compiled_flops`) and the output says so.

With gradient accumulation (m micro-batches, no pipeline) shardkit's Trainer keeps each
micro-batch's gradients unreduced along the batch axes no parameter is split over ("data";
"fsdp" too under ZeRO-1), sums them in float32 and reduces the sums once per step
(`shardkit.train.accumulate`). The planner counts those reductions once per step too, but on
gradients of the compute dtype (2 bytes in bf16). Those rows compare the Trainer's 4 bytes
(`trainer_collectives`) and the output says so: it is the step's own traffic, not an XLA:CPU
habit; the planner's step time keeps 2.

The peak is judged at 15% with remat "block" or "dots" and at 20% without remat
(`BOUNDS["peak_none"]`: the stash JAX's linearisation keeps per primitive is modelled more
coarsely, docs/plan.md mechanism (8)). Collective bytes are compared after undoing XLA:CPU's f32
upcast of bf16 collectives and its all-reduce-then-slice for ZeRO gradients (see
`shardkit.verify.measurement`); the output says so.

Example:
    >>> p = plan(GPTConfig(vocab=64, d_model=64, n_layers=2, n_heads=4, seq_len=16,
    ...                    remat="block"), devices=8, hardware="cpu", batch=16)
    >>> result = p.verify(top=2)          # prints a table per layout
    >>> result.max_errors()["arguments"] < 0.01
    True
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

from shardkit.collectives import bytes_moved
from shardkit.common import format_bytes
from shardkit.errors import ShardkitTypeError, ShardkitValueError
from shardkit.models import GPTConfig
from shardkit.plan.cost import evaluate
from shardkit.plan.hardware import cpu_habits, get_hardware
from shardkit.plan.memory import get_precision
from shardkit.plan.pipe import facts
from shardkit.plan.workload import Transformer
from shardkit.verify import measurement as measure_module

_F32_NOTE = (
    "pipelined layouts with a tensor axis are compiled and predicted in float32: XLA:CPU aborts "
    "compiling their bf16 step (a CHECK in its all-reduce promotion pass)"
)
# "peak_none": the peak without remat, whose stash follows JAX's linearisation per primitive
# (docs/plan.md, mechanism (8)); it is modelled more coarsely than block and dots remat
BOUNDS = {
    "arguments": 0.01,
    "peak": 0.15,
    "peak_none": 0.20,
    "collectives": 0.05,
    "flops": 0.05,
}
_KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


@dataclasses.dataclass(frozen=True)
class Row:
    """One quantity of one layout: predicted, compiled, relative error and its bound.

    Attributes:
        quantity: "arguments", "peak", a collective kind, "collectives" (all kinds) or "flops".
        predicted: the planner's figure (bytes, or FLOPs), per device per step.
        compiled: the compiler's figure.
        bound: the largest allowed |relative error|, or None when not judged.
    """

    quantity: str
    predicted: float
    compiled: float
    bound: float | None

    @property
    def error(self) -> float:
        """(predicted - compiled) / compiled; 0 when both are 0, inf when only compiled is."""
        if self.compiled == 0:
            return 0.0 if self.predicted == 0 else float("inf")
        return (self.predicted - self.compiled) / self.compiled

    @property
    def ok(self) -> bool:
        return self.bound is None or abs(self.error) <= self.bound


@dataclasses.dataclass(frozen=True)
class Check:
    """Predicted vs compiled for one layout.

    Attributes:
        candidate: the planned layout (a `Candidate`).
        predicted: the layout predicted for the compiled model (same as `candidate` when the
            workload is shardkit's GPT already).
        measurement: the compiler's figures (`shardkit.verify.measurement.Measurement`).
        rows: one `Row` per quantity.
    """

    candidate: Any
    predicted: Any
    measurement: Any
    rows: tuple[Row, ...]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def row(self, quantity: str) -> Row:
        """The row of one quantity.

        Raises:
            KeyError: when the layout has no such row (e.g. no all-gather).
        """
        for r in self.rows:
            if r.quantity == quantity:
                return r
        raise KeyError(f"no row {quantity!r}; rows: {[r.quantity for r in self.rows]}")


@dataclasses.dataclass(frozen=True)
class Verification:
    """The result of `Plan.verify`: one `Check` per compiled layout, and notes."""

    title: str
    checks: tuple[Check, ...]
    notes: tuple[str, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def max_errors(self) -> dict[str, float]:
        """Largest |relative error| per quantity over the checked layouts."""
        out: dict[str, float] = {}
        for c in self.checks:
            for r in c.rows:
                key = r.quantity if r.quantity in BOUNDS else "collectives"
                out[key] = max(out.get(key, 0.0), abs(r.error))
        return out

    def render(self) -> str:
        """Plain-text tables, one per layout, then the notes."""
        lines = [self.title]
        for i, c in enumerate(self.checks, 1):
            cand, m = c.candidate, c.measurement
            where = "AbstractMesh" if m.abstract else "simulated mesh"
            lines.append(
                f"#{i} {cand.layout}, remat={cand.remat}, micro-batches {cand.microbatches}: "
                f"compiled on a {where} of {_devices(m.mesh)} in {m.compile_seconds:.1f} s"
            )
            lines.append(
                f"  {'quantity':<22}{'predicted':>13}{'compiled':>13}{'error':>9}{'bound':>7}"
            )
            for r in c.rows:
                fmt = _flops if r.quantity == "flops" else functools.partial(format_bytes, digits=2)
                bound = f"{r.bound:.0%}" if r.bound is not None else "-"
                mark = "" if r.bound is None else ("  ok" if r.ok else "  OUT")
                lines.append(
                    f"  {_LABELS.get(r.quantity, r.quantity):<22}{fmt(r.predicted):>13}"
                    f"{fmt(r.compiled):>13}{_pct(r.error):>9}{bound:>7}{mark}"
                )
        lines.extend(f"note: {n}" for n in self.notes)
        lines.append(f"verified {len(self.checks)} layout(s) in {self.seconds:.1f} s")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: per layout the rows, plus notes and the largest errors."""
        return {
            "title": self.title,
            "ok": self.ok,
            "seconds": self.seconds,
            "notes": list(self.notes),
            "max_errors": self.max_errors(),
            "layouts": [
                {
                    "layout": c.candidate.layout,
                    "remat": c.candidate.remat,
                    "microbatches": c.candidate.microbatches,
                    "mesh": c.measurement.mesh,
                    "abstract": c.measurement.abstract,
                    "compile_seconds": c.measurement.compile_seconds,
                    "rows": [
                        {
                            "quantity": r.quantity,
                            "predicted": r.predicted,
                            "compiled": r.compiled,
                            "error": r.error,
                            "bound": r.bound,
                            "ok": r.ok,
                        }
                        for r in c.rows
                    ],
                }
                for c in self.checks
            ],
        }


_LABELS = {"peak": "peak (args + temps)", "collectives": "collectives, all"}


def _devices(mesh: dict[str, int]) -> str:
    return " x ".join(f"{k}={v}" for k, v in mesh.items())


def _pct(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:+.1%}"


def _flops(x: float) -> str:
    for unit, div in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if abs(x) >= div:
            return f"{x / div:.3g} {unit}"
    return f"{x:.3g}"


# -- the compiled model --------------------------------------------------------------------
def compiled_model(workload: Any, remat: str, tensor: int = 1) -> tuple[Any, Any, list[str]]:
    """(GPTConfig, Transformer of that GPT, differences from `workload` in words).

    A vocabulary the tensor degree does not divide is padded up to a multiple of it (as
    Megatron pads GPT-3's 50,257), so the embedding and head split over "tensor" as planned;
    shardkit would otherwise leave them replicated.

    Raises:
        TypeError: for a workload that is not a `Transformer` (nothing to compile).
    """

    if not isinstance(workload, Transformer):
        raise ShardkitTypeError(
            f"Plan.verify compiles shardkit's GPT, but workload {workload.name!r} is a "
            f"{type(workload).__name__} with no model to compile; fix: compile your own step "
            "with shardkit.verify.measure(jax.jit(step, ...), *abstract_args, mesh=...)."
        )
    w = workload
    vocab = -(-w.vocab // tensor) * tensor
    cfg = GPTConfig(vocab=vocab, d_model=w.d_model, n_layers=w.layers, n_heads=w.heads,
                    d_ff=w.ff, seq_len=w.seq, remat=remat)  # fmt: skip
    fp32 = get_precision(w.precision).compute == 4
    twin = Transformer.from_gpt_config(
        cfg, batch=w.batch, name=w.name, precision="fp32" if fp32 else "shardkit"
    )
    diffs = [f"vocabulary {w.vocab} -> {vocab} (padded to a multiple of tensor={tensor})"]
    diffs = diffs if vocab != w.vocab else []
    for field, label in (
        ("tied", "tied output head"),
        ("fused_qkv", "fused q/k/v projection"),
        ("gated", "SwiGLU MLP"),
        ("kv_heads", "key/value heads"),
        ("head_dim", "head width"),
        ("norm_params", "norm parameters per channel"),
        ("positions", "learned positions"),
        ("attention", "attention"),
        ("dropout", "dropout"),
        ("precision", "precision"),
        ("optimizer", "optimizer"),
        ("logits_bytes", "bytes per logit at the loss"),
        ("input_bytes_per_token", "batch bytes per token"),
    ):
        a, b = getattr(w, field), getattr(twin, field)
        if field == "kv_heads":
            a, b = w.kv, twin.kv
        if field == "head_dim":
            a, b = w.hd, twin.hd
        if field == "precision":
            a, b = getattr(a, "name", a), getattr(b, "name", b)
        if field == "optimizer" and {str(a).lower(), str(b).lower()} <= {"adam", "adamw"}:
            continue
        if a != b:
            diffs.append(f"{label} {a} -> {b}")
    return cfg, twin, diffs


def compiled_flops(pred: Any, workload: Any) -> float:
    """The planner's FLOPs as XLA counts a pipelined step (every lax.switch branch taken).

    A pipelined step executes m x (F + B + head) on the last stage; the compiled program holds,
    per lane, the branches idle, F, F + head, B, B + head (each kind with a last-stage twin),
    and `matmul_flops` counts all of them at each of the table's steps:
    steps x (2 x (F + B) + head). Without a pipeline: `pred.flops`.
    """
    if pred.stage == 1:
        return pred.flops

    steps = facts(pred.schedule, pred.stage, pred.microbatches, pred.virtual).steps
    tokens = workload.seq * pred.micro_batch
    head = 6 * workload.d_model * workload.vocab * tokens / pred.tensor  # per micro-batch
    per_micro = pred.flops / pred.microbatches  # F + B + head on the last stage
    return steps * (2 * (per_micro - head) + head)


def gradient_reductions(pred: Any, workload: Any) -> dict[str, float]:
    """Bytes of the gradient reductions the planner counts once per step, per kind.

    The all-reduce of the gradient shard over "data" and, under ZeRO-1, the reduce-scatter
    over "fsdp" (`shardkit.plan.comm.layout_traffic`), on the compute dtype's gradients of the
    device's parameters. Empty for a pipelined layout.
    """
    if pred.stage > 1:
        return {}
    prec = get_precision(workload.precision)
    # the parameters of the device's tensor shard: param_bytes is them over ZeRO-3's split
    params = pred.param_bytes * (pred.fsdp if pred.zero == 3 else 1) / prec.params
    grads = params * prec.compute
    out = {"all-reduce": bytes_moved("all-reduce", grads / pred.fsdp, pred.data)}
    if pred.zero == 1:
        out["reduce-scatter"] = bytes_moved("reduce-scatter", grads, pred.fsdp)
    return {k: v for k, v in out.items() if v}


_ACCUMULATOR_BYTES = 4  # shardkit.train.accumulate sums micro-batch gradients in float32


def trainer_collectives(pred: Any, workload: Any) -> dict[str, float]:
    """The planner's collectives per kind, in the bytes shardkit's Trainer sends.

    Under gradient accumulation (m > 1 micro-batches, no pipeline) the Trainer reduces the
    float32 sums of the micro-batches' gradients once per step (`shardkit.train.accumulate`):
    the `gradient_reductions` the planner counts on gradients of the compute dtype carry 4
    bytes per gradient. Otherwise (and in float32) `pred.collectives`.

    Example:
        >>> c = evaluate(w, "cpu", data=2, fsdp=4, microbatches=4)   # bf16 compute
        >>> extra = trainer_collectives(c, w)["all-reduce"] - c.collectives["all-reduce"]
        >>> extra == gradient_reductions(c, w)["all-reduce"]  # 4 bytes, not 2
        True
    """
    out = dict(pred.collectives)
    if pred.stage > 1 or pred.microbatches == 1:
        return out
    scale = _ACCUMULATOR_BYTES / get_precision(workload.precision).compute
    for kind, nbytes in gradient_reductions(pred, workload).items():
        out[kind] = out.get(kind, 0.0) + (scale - 1) * nbytes
    return out


def _rows(pred: Any, m: Any, workload: Any = None) -> tuple[Row, ...]:
    peak_bound = {"block": BOUNDS["peak"], "dots": BOUNDS["peak"], "none": BOUNDS["peak_none"]}.get(
        pred.remat
    )
    rows = [
        Row("arguments", pred.argument_bytes, m.argument_bytes, BOUNDS["arguments"]),
        Row("peak", pred.peak_bytes, m.peak_bytes, peak_bound),
    ]
    collectives = trainer_collectives(pred, workload) if workload is not None else (
        pred.collectives
    )  # fmt: skip
    kinds = [k for k in _KINDS if collectives.get(k) or m.collectives.get(k, {}).get("bytes")]
    total = m.collective_bytes
    for k in kinds:
        compiled = m.collectives.get(k, {}).get("bytes", 0.0)
        predicted = collectives.get(k, 0.0)
        # a kind under 1% of the traffic (the loss's scalar all-reduce) is shown, not judged
        small = max(compiled, predicted) < 0.01 * total
        rows.append(Row(k, predicted, compiled, None if small else BOUNDS["collectives"]))
    if kinds:
        rows.append(Row("collectives", sum(collectives.values()), total, BOUNDS["collectives"]))
    if m.flops is not None:
        predicted = compiled_flops(pred, workload) if workload is not None else pred.flops
        rows.append(Row("flops", predicted, m.flops, BOUNDS["flops"]))
    return tuple(rows)


def verify(
    plan: Any,
    top: int = 3,
    *,
    candidates: list | None = None,
    abstract: bool | None = None,
    quiet: bool = False,
) -> Verification:
    """Compiles the plan's top layouts with shardkit's GPT and prints predicted vs compiled.

    Args:
        plan: a `shardkit.plan.Plan` of a `Transformer` workload.
        top: how many layouts to compile (the fastest ones shardkit runs).
        candidates: compile these `Candidate`s instead of the top ones.
        abstract: force (True) or forbid (False) the AbstractMesh path; default: only when
            the plan has more devices than this process.
        quiet: do not print.

    Returns:
        A `Verification` (`.ok`, `.max_errors()`, `.render()`, `.to_dict()`).

    Raises:
        TypeError: for a workload with no model to compile (a `Dense`).
        ValueError: when no layout can be compiled (all are predictions only).

    Example:
        >>> plan("gpt3-175b", devices=1024, hardware="h100").verify(top=1)
    """

    cpu = get_hardware("cpu")  # the running XLA:CPU's habits (`hardware.cpu_habits`)
    # predicted with the compiling backend's habits (XLA:CPU with f32 dots keeps bf16 matmul
    # outputs and activations in f32; with bf16 dots only the norms' inputs and the weight
    # gradients); the plan's ranking keeps the target hardware's
    backend = plan.hardware.replace(**cpu_habits())

    t0 = time.perf_counter()
    chosen, skipped = _chosen(plan, top, candidates)
    checks, notes, differences = [], [], []
    counted: dict[str, list[str]] = {}
    for c in chosen:
        check, diffs, f32 = _check(plan.workload, c, backend, abstract)
        checks.append(check)
        differences += [d for d in diffs if d not in differences]
        if f32 and _F32_NOTE not in notes:
            notes.append(_F32_NOTE)
        for n in check.measurement.notes:  # "18 collective(s) ...": one per kind, summed
            count, _, rest = n.partition(" ")
            if count.isdigit():
                counted.setdefault(rest, []).append(count)
            elif n not in notes:
                notes.append(n)
    notes[:0] = [
        f"{sum(map(int, c))} {rest}, over {len(c)} layout(s)" for rest, c in counted.items()
    ]
    if differences:
        notes.insert(
            0,
            "compiled as shardkit's GPT, predicted again for it: " + "; ".join(differences),
        )
    notes += _notes(plan, checks, skipped, cpu)
    title = (
        f"verify: {plan.workload.name} on {plan.devices} x {plan.hardware.name}, batch "
        f"{plan.workload.batch}: predicted vs compiled (XLA:CPU), per device per step"
    )
    result = Verification(title, tuple(checks), tuple(notes), time.perf_counter() - t0)
    if not quiet:
        print(result.render())
    return result


def _chosen(plan: Any, top: int, candidates: list | None) -> tuple[list, list]:
    """The layouts to compile (runnable ones) and the top ones skipped (predictions only)."""
    pool = list(candidates) if candidates is not None else list(plan.candidates)
    chosen = [c for c in pool if c.runnable][: max(top, 0) if candidates is None else None]
    skipped = [c for c in (pool[:top] if candidates is None else pool) if not c.runnable]
    if not chosen:
        raise ShardkitValueError(
            f"none of the {len(pool)} layouts can be compiled: all are predictions only "
            "(fsdp inside pipeline stages, or sequence parallelism); fix: plan with "
            "zero=() or max_stage=1, or pass candidates=[plan.find(data=..., stage=...)]."
        )
    return chosen, skipped


def _check(workload: Any, c: Any, backend: Any, abstract: bool | None):
    """One layout predicted for the compiling backend and compiled: ``(Check, the model's
    differences from the workload, whether it was moved to float32)``."""
    cfg, twin, diffs = compiled_model(workload, c.remat, c.tensor)
    f32 = c.stage > 1 and c.tensor > 1 and get_precision(twin.precision).name != "fp32"
    if f32:
        # XLA:CPU aborts the process compiling the pipelined step with a tensor axis in
        # bf16 (a CHECK in its all-reduce promotion pass): compile and predict it in f32
        twin = twin.replace(precision="fp32")
    # memory as the compiled backend keeps it: XLA:CPU holds bf16 matmul outputs in f32
    pred = evaluate(twin, backend, data=c.data, fsdp=c.fsdp, tensor=c.tensor,
                    stage=c.stage, zero=c.zero or 3, microbatches=c.microbatches,
                    remat=c.remat, schedule=c.schedule or "1f1b", virtual=c.virtual,
                    dot_bytes=backend.dot_output_bytes, sequence_parallel=c.sequence_parallel,
                    collective_matmul=c.collective_matmul)  # fmt: skip
    precision = "float32" if get_precision(twin.precision).name == "fp32" else "bfloat16"
    m = measure_module.measure_gpt(cfg, c.strategy(), devices=c.devices, batch=twin.batch,
                                   grad_accum=c.microbatches if c.stage == 1 else 1,
                                   precision=precision, abstract=abstract)  # fmt: skip
    return Check(candidate=c, predicted=pred, measurement=m, rows=_rows(pred, m, twin)), diffs, f32


def _notes(plan: Any, checks: list, skipped: list, cpu: Any) -> list[str]:
    """What a reader of the comparison must know: skipped rows, FLOP counting of pipelined
    steps, and the compiling backend's memory habits."""
    notes = []
    if skipped:
        notes.append(
            "not compiled (predictions only: shardkit does not run them): "
            + ", ".join(c.layout for c in skipped)
        )
    if any(c.candidate.stage > 1 for c in checks):
        notes.append(
            "pipelined layouts: compiled FLOPs count every branch of the executor's lax.switch "
            "at every step, steps x (2 x (F + B) + head); the prediction is converted to that "
            "count (the last stage executes m x (F + B + head))"
        )
    accumulated = [
        c for c in checks
        if c.predicted.stage == 1 and c.predicted.microbatches > 1
        and (c.predicted.data > 1 or c.predicted.zero == 1)
        and get_precision(plan.workload.precision).compute < _ACCUMULATOR_BYTES
    ]  # fmt: skip
    if accumulated:
        layouts = ", ".join(f"{c.candidate.layout}: m = {c.predicted.microbatches}"
                            for c in accumulated)  # fmt: skip
        notes.append(
            f"gradient accumulation ({layouts}): shardkit's Trainer reduces the float32 sums of "
            "the micro-batches' gradients once per step (the all-reduce over 'data', ZeRO-1's "
            "reduce-scatter), 4 bytes per gradient where the planner counts the compute "
            "dtype's; the prediction is converted to the Trainer's bytes (the planner's step "
            "time keeps its own)"
        )
    if any(c.predicted.remat == "dots" for c in checks) and cpu.dot_output_bytes:
        notes.append(
            "memory predicted for the backend compiled: XLA:CPU keeps bf16 matmul outputs in "
            f"f32 ({cpu.dot_output_bytes} bytes per element) where GPUs and TPUs keep 2"
        )
    if get_precision(plan.workload.precision).compute < 4:
        if cpu.activation_upcast:
            notes.append(
                "memory predicted for the backend compiled: XLA:CPU runs bf16 matmuls in f32 "
                "and keeps bf16 block inputs, the residual stream and the backward working "
                f"set in f32 ({cpu.activation_upcast} bytes per element; "
                "Hardware.activation_upcast), where GPUs and TPUs keep 2"
            )
        else:
            notes.append(
                "memory predicted for the backend compiled: XLA:CPU runs bf16 matmuls in "
                "bf16 and keeps activations in bf16 (Hardware.activation_upcast unset) but "
                f"both norms' inputs in f32 ({cpu.norm_input_bytes} bytes per element; "
                "Hardware.norm_input_bytes) and a gathered block's weight gradients in f32 "
                f"({cpu.gathered_bytes}; Hardware.gathered_bytes)"
            )
    notes.append(
        "collective bytes: per device per step, ring formulas; XLA:CPU's f32 upcast of bf16 "
        "collectives and its all-reduce-then-slice for ZeRO gradients are normalised to what "
        "GPU/TPU backends emit (raw figures in each Measurement)"
    )
    return notes
