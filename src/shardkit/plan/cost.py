"""The cost of one layout: memory, communication and compute per device, step time and MFU.

`evaluate(workload, hardware, data=, fsdp=, tensor=, stage=, ...)` returns a `Candidate`. The
model, per device and per optimizer step:

* memory: model state per ZeRO stage over "fsdp" (`memory.model_state_bytes`), activations per
  remat policy times the micro-batches the first pipeline stage holds, plus the block being
  differentiated (its residuals, recomputed under remat, and their cotangents), gathered
  weights (FSDP gathers one layer at a time; without remat the gathered weights stay alive
  until the backward pass), the compute-dtype copy of fp32 weights, logits at the loss, the batch;
* communication (bytes moved per device, `comm.bytes_moved`): FSDP all-gathers weights in the
  forward pass (and again in the backward pass when remat recomputes the block) and
  reduce-scatters gradients per micro-batch (ZeRO-3), or reduce-scatters gradients and
  all-gathers updated weights once per step (ZeRO-1); "data" all-reduces the gradient shard
  once per step; Megatron tensor parallelism all-reduces a b x s x h activation twice per block
  forward and once per column-parallel kernel backward (`_tp_all_reduces`); a pipeline sends
  one activation forward and one gradient back per micro-batch;
* compute: executed FLOPs (6 per matmul parameter per token + 12 x s x heads x head_dim per
  layer per token for attention; "block" remat reruns each block's forward pass but for the
  MLP-down matmul, whose output no gradient needs; "dots_no_batch" reruns attention's two
  matmuls) / (peak x mfu_ceiling);
* step time: pipeline (compute + tensor all-reduces + sends) x (m + p - 1)/m, plus the part
  of the data-parallel and FSDP traffic that compute cannot hide (a share `Hardware.overlap`
  of it hides: per-micro-batch ZeRO-3 traffic behind the whole step, the once-per-step
  gradient reduction only behind the last micro-batch), plus the optimizer update (state read
  and written at HBM bandwidth). overlap = 1 gives the scaling book's T_lower = max(compute,
  comms) for one micro-batch, overlap = 0 its T_upper = sum;
* MFU = model FLOPs (no recompute) / (step time x devices x peak).

Example:
    >>> from shardkit.plan.workload import preset
    >>> c = evaluate(preset("llama3-8b", batch=8), "h100", fsdp=8, remat="block")
    >>> c.mesh_axes, c.fits
    ({'fsdp': 8}, True)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

from shardkit.errors import ShardkitValueError
from shardkit.plan import comm, pipe
from shardkit.plan.hardware import Hardware, get_hardware
from shardkit.plan.memory import (
    ActivationMemory,
    bytes_per_param,
    get_precision,
    model_state_bytes,
    transformer_memory,
)
from shardkit.plan.runtime import Runtime, get_runtime
from shardkit.plan.workload import Dense, Transformer

AXIS_ORDER = ("stage", "data", "fsdp", "tensor")  # outermost first, as in the mesh
_COUNTERS = 8  # the train state's step and the optimizer's count, int32 each


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One layout with its predicted memory, communication, compute and step time per device.

    Attributes:
        data, fsdp, tensor, stage: degrees over the mesh axes of those names.
        zero: ZeRO stage over "fsdp" (3: params, grads and optimizer state split; 1: only
            optimizer state); 0 without an "fsdp" axis.
        microbatches: m, micro-batches per step (gradient accumulation or pipeline).
        micro_batch: b, sequences (examples) per micro-batch per device.
        remat: "none", "dots", "dots_no_batch" or "block".
        schedule: pipeline schedule ("1f1b", "gpipe", "interleaved"); "" without a pipeline.
        param_bytes, grad_bytes, opt_bytes: model state per device.
        activation_bytes: activations kept for the backward pass (+ one recomputed block).
        gathered_bytes: weights gathered or cast for compute (FSDP, fp32 -> bf16 copies).
        logits_bytes: the loss's logits (last pipeline stage).
        input_bytes: the batch shard.
        argument_bytes: held between steps: params + optimizer state + batch.
        temp_bytes: temporaries: gradients, activations, gathered weights, logits.
        peak_bytes: argument_bytes + temp_bytes.
        budget_bytes: usable device memory.
        collectives: kind -> bytes moved per device per step (inspection's formulas).
        comm_time: mesh axis -> seconds of its collectives per step.
        flops: executed FLOPs per device per step (recompute included; busiest stage).
        model_flops: model FLOPs per step, all devices (MFU's numerator).
        compute_time, bubble_time, exposed_comm_time, update_time, step_time: seconds.
        mfu: model FLOPs / (step time x devices x peak).
        hfu: executed FLOPs / (step time x peak), busiest device.
        virtual: model chunks per device under the interleaved schedule (1 otherwise).
        sequence_parallel: predicted with Megatron-style sequence parallelism on "tensor"
            (`strategy()` runs it with `Hybrid(sequence_parallel=True)`; see `evaluate`).
        collective_matmul: its blocks' tensor traffic predicted as overlapped rings
            (`Hybrid(..., collective_matmul=True)`).
        ring_hidden_time: seconds of those rings' traffic (in `comm_time["tensor"]`) hidden
            behind the matmuls they feed.
        runtime: the `shardkit.plan.runtime` name the row was predicted for ("shardkit":
            what `strategy()` runs).
        bottleneck: the largest of compute, tensor all-reduces, pipeline bubble, pipeline
            sends and fsdp/data traffic (before overlap), in words.
    """

    data: int
    fsdp: int
    tensor: int
    stage: int
    zero: int
    microbatches: int
    micro_batch: int
    remat: str
    schedule: str
    param_bytes: float
    grad_bytes: float
    opt_bytes: float
    activation_bytes: float
    gathered_bytes: float
    logits_bytes: float
    input_bytes: float
    budget_bytes: float
    collectives: dict[str, float]
    comm_time: dict[str, float]
    flops: float
    model_flops: float
    compute_time: float
    bubble_time: float
    exposed_comm_time: float
    update_time: float
    step_time: float
    mfu: float
    hfu: float
    bottleneck: str
    virtual: int = 1
    sequence_parallel: bool = False
    collective_matmul: bool = False
    ring_hidden_time: float = 0.0
    runtime: str = "shardkit"

    # -- derived ----------------------------------------------------------------------------
    @property
    def devices(self) -> int:
        return self.data * self.fsdp * self.tensor * self.stage

    @property
    def argument_bytes(self) -> float:
        """Params + optimizer state + batch + the step counters (int32 step and Adam count)."""
        return self.param_bytes + self.opt_bytes + self.input_bytes + _COUNTERS

    @property
    def temp_bytes(self) -> float:
        return self.grad_bytes + self.activation_bytes + self.gathered_bytes + self.logits_bytes

    @property
    def peak_bytes(self) -> float:
        return self.argument_bytes + self.temp_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.budget_bytes

    @property
    def margin(self) -> float:
        """Share of the usable memory left at the peak (negative: over by that share)."""
        return 1 - self.peak_bytes / self.budget_bytes

    @property
    def mesh_axes(self) -> dict[str, int]:
        """Mesh axis name -> size, outermost first, axes of size 1 dropped."""
        axes = {a: getattr(self, a) for a in AXIS_ORDER if getattr(self, a) > 1}
        return axes or {"data": 1}

    @property
    def layout(self) -> str:
        """`fsdp=32 tensor=8`-style label with the ZeRO stage when it is not 3."""
        text = " ".join(f"{k}={v}" for k, v in self.mesh_axes.items())
        if self.virtual > 1:
            text += f" (interleaved x{self.virtual})"
        text += " +SP" if self.sequence_parallel else ""
        text += "+CM" if self.collective_matmul else ""
        return text + (" (ZeRO-1)" if self.fsdp > 1 and self.zero == 1 else "")

    def strategy(self):
        """The shardkit strategy that runs this layout.

        Returns:
            `shardkit.strategies.Hybrid(data=, fsdp=, tensor=, zero=)`; with stage > 1
            `Hybrid(data=, tensor=, pipeline=Pipeline(stages=, schedule=, microbatches=,
            residuals=))` (see `shardkit.plan.pipe.strategy`).

        Raises:
            ValueError: for a row shardkit cannot run (`runnable` is False): fsdp, or
                sequence parallelism, combined with stages.

        Example:
            >>> from shardkit.plan import preset
            >>> s = evaluate(preset("llama3-8b", batch=8), "h100", fsdp=8).strategy()
            >>> s.mesh_axes(8), s.zero, s.sequence_parallel
            ({'fsdp': 8}, 3, False)
        """
        # lazy and upward: the planner imports no JAX and sits below the strategies (whose
        # `Auto` plans); a row becomes a strategy on request
        from shardkit.strategies.core import Hybrid

        if self.sequence_parallel and self.stage > 1:
            raise ShardkitValueError(
                f"layout {self.layout} was predicted with sequence parallelism inside pipeline "
                "stages, which shardkit does not run; fix: plan(..., sequence_parallel=False) "
                "or max_stage=1 for layouts shardkit runs."
            )
        zero = self.zero if self.fsdp > 1 else 3
        if self.stage == 1:
            sp = {"sequence_parallel": True} if self.sequence_parallel else {}
            if self.collective_matmul:
                sp["collective_matmul"] = True
            return Hybrid(data=self.data, fsdp=self.fsdp, tensor=self.tensor, zero=zero, **sp)
        return pipe.strategy(self)  # Hybrid(data, tensor, pipeline=Pipeline(...))

    @property
    def runnable(self) -> bool:
        """Whether shardkit can run this row (`strategy()` works); else a prediction only."""
        sp_staged = getattr(self, "sequence_parallel", False) and self.stage > 1
        return not (pipe.not_runnable(self) or sp_staged)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, derived memory totals included."""
        out = dataclasses.asdict(self)
        out.update(
            mesh_axes=self.mesh_axes,
            layout=self.layout,
            argument_bytes=self.argument_bytes,
            temp_bytes=self.temp_bytes,
            peak_bytes=self.peak_bytes,
            fits=self.fits,
            margin=self.margin,
            devices=self.devices,
        )
        return out


def _stage_params(w: Transformer, stage: int, tensor: int) -> float:
    """Parameters on the most loaded device of a (stage, tensor) shard."""
    t, h = tensor, w.d_model
    norms = w.norms * w.norm_params * h
    blocks = -(-w.layers // stage) * (w.layer_matmul_params() / t + norms)  # busiest stage
    embed = w.vocab * h / t + (w.seq * h if w.positions else 0)
    head_table = w.vocab * h / t if (not w.tied or stage > 1) else 0
    head = w.norm_params * h + head_table
    if stage == 1 or w.ends_on_every_stage:  # shardkit's executor: both on every stage
        return blocks + embed + head
    return blocks + max(embed, head)


def evaluate(
    workload: Transformer | Dense,
    hardware: str | Hardware,
    *,
    data: int = 1,
    fsdp: int = 1,
    tensor: int = 1,
    stage: int = 1,
    zero: int = 3,
    microbatches: int | None = None,
    remat: str | None = None,
    schedule: str = "1f1b",
    virtual: int = 1,
    dot_bytes: int | None = None,
    act_bytes: int | None = None,
    sequence_parallel: bool = False,
    collective_matmul: bool = False,
    runtime: str | Runtime = "shardkit",
) -> Candidate:
    """Predicts memory, communication, compute and step time for one layout.

    Args:
        workload: a `Transformer` or `Dense`; its `batch` is the global batch.
        hardware: a profile name or `Hardware`.
        data, fsdp, tensor, stage: degrees (their product is the device count).
        zero: 3 or 1 over "fsdp" (ignored when fsdp == 1).
        microbatches: m; default the stage degree (1 without a pipeline).
        remat: "none", "dots", "dots_no_batch" or "block"; default the workload's ("auto" ->
            "none").
        schedule: "1f1b", "gpipe" or "interleaved" (Megatron's interleaved 1F1B, `virtual`
            model chunks per device: bubble (p-1)/(v m + p-1), v x the sends, activations x
            (1 + (p-1)/(p v))) when stage > 1.
        virtual: chunks per device for "interleaved" (>= 2).
        dot_bytes, act_bytes: bytes per matmul output kept under "dots" remat, and per
            element of the other kept activations (default `Hardware.dot_output_bytes` and
            `activation_upcast`, else the compute dtype; 4: XLA:CPU's f32 matmuls).
        sequence_parallel: Megatron-style sequence parallelism with the tensor axis (Korthikanti
            et al.): the block and norm inputs, the loss's hidden state and the pipeline sends
            are split over "tensor" too, and each tensor all-reduce becomes an all-gather plus
            a reduce-scatter (the same bytes). shardkit runs it (`Hybrid(sequence_parallel=
            True)`), not inside pipeline stages (`Candidate.strategy` refuses those rows).
        collective_matmul: with sequence_parallel, the blocks' all-gathers and
            reduce-scatters run as rings beside the matmuls they feed (`shardkit.overlap`):
            the same bytes as collective-permutes, of which a share `Hardware.overlap` hides
            behind (tensor - 1) / tensor of the blocks' matmul time.
        runtime: the stack that runs it (`shardkit.plan.runtime`; default "shardkit").

    Raises:
        ValueError: when the batch is not divisible by data x fsdp x microbatches, or the
            layers by the stage degree.
    """
    hw, rt, m = get_hardware(hardware), get_runtime(runtime), microbatches or stage
    remat = remat or (workload.remat if workload.remat != "auto" else "none")
    replicas = data * fsdp
    b, v = _check_layout(workload, data, fsdp, tensor, stage, m, schedule, virtual)
    zero = zero if fsdp > 1 else 0
    pf = pipe.facts(schedule, stage, m, v, runtime=rt.pipeline)  # steps, in-flight, bubble
    w, prec = workload, get_precision(workload.precision)
    c, peak = prec.compute, hw.peak(prec.compute_dtype)
    wb, _, _ = bytes_per_param(prec, w.optimizer)
    sp = sequence_parallel and tensor > 1 and isinstance(w, Transformer)
    cm, devices = collective_matmul and sp and stage == 1, replicas * tensor * stage
    n_stage, mem, work, block_c, gather_calls = _model_terms(
        w, hw, b=b, m=m, data=data, fsdp=fsdp, tensor=tensor, stage=stage, zero=zero,
        remat=remat, in_flight=pf.in_flight, sp=sp, dot_bytes=dot_bytes, act_bytes=act_bytes,
        rt=rt,
    )  # fmt: skip
    state = model_state_bytes(n_stage, zero=zero, shards=max(fsdp, 1), precision=prec,
                              optimizer=w.optimizer)  # fmt: skip
    grads, gathered = _grads_and_gathered(state, mem, prec, hw, m=m, n_stage=n_stage,
                                          shards=fsdp if zero == 3 else 1)  # fmt: skip
    traffic = comm.layout_traffic(
        w, hw, transformer=isinstance(w, Transformer), data=data, fsdp=fsdp, tensor=tensor,
        stage=stage, zero=zero, remat=remat, microbatches=m, micro_batch=b, steps=pf.steps,
        stage_params=n_stage, compute_bytes=c, weight_bytes=wb, block_bytes=block_c,
        gather_calls=gather_calls, activation_bytes=work.activation_bytes,
        tp_count=work.tp_count, sequence_parallel=sp, head_on_busiest=work.head_on_busiest,
        tp_rings=work.tp_count - 2 * m if cm else 0,  # all but the head's and embedding's
        block_runs=-(-w.layers // stage) * m if isinstance(w, Transformer) else 0,
        fsdp_regather=rt.fsdp_regather, split_sends=rt.split_sends,
    )  # fmt: skip
    compute = work.flops / (peak * rt.ceiling_for(hw, prec.compute_dtype))
    compute += work.elementwise_bytes / hw.hbm_bw
    window = compute * work.block_matmul_share * (tensor - 1) / tensor if cm else 0.0  # rings
    t = _step_time(compute, traffic, pf.bubble, m, state, hw, window, rt.tensor_overlap)
    return Candidate(
        data=data, fsdp=fsdp, tensor=tensor, stage=stage, zero=zero, microbatches=m,
        micro_batch=b, remat=remat, schedule=schedule if stage > 1 else "",
        param_bytes=state.params, grad_bytes=grads, opt_bytes=state.optimizer,
        activation_bytes=mem.activations, gathered_bytes=gathered, logits_bytes=mem.logits,
        input_bytes=mem.inputs, budget_bytes=hw.usable_bytes, collectives=traffic.collectives,
        comm_time={k: x for k, x in traffic.times.items() if x}, flops=work.flops,
        model_flops=work.model_flops, compute_time=t.compute, bubble_time=t.bubble,
        exposed_comm_time=t.exposed, update_time=t.update, step_time=t.step,
        mfu=work.model_flops / (t.step * devices * peak), hfu=work.flops / (t.step * peak),
        bottleneck=t.bottleneck, virtual=v, sequence_parallel=sp, collective_matmul=cm,
        ring_hidden_time=t.hidden, runtime=rt.name,
    )  # fmt: skip


def _grads_and_gathered(state, mem, prec, hw, *, m, n_stage, shards) -> tuple[float, float]:
    """Gradient bytes held (accumulation copies included) and gathered or cast weights."""
    c = prec.compute
    # fp32 weights (no master copy): each micro-batch's gradients exist next to the
    # accumulator; with a master copy they accumulate in place into the main gradient buffer
    grads = state.grads * (2 if m > 1 and prec.master == 0 else 1)
    if m > 1 and prec.master == 0 and hw.accumulated_grad_bytes:
        # both copies held as the weight-gradient dots produce them (XLA:CPU with bf16
        # dots: bf16 under bf16 compute, `Hardware.accumulated_grad_bytes`)
        grads *= max(c, hw.accumulated_grad_bytes) / prec.grads
    gathered = mem.gathered
    if prec.params != c:  # fp32 weights cast to the compute dtype
        gathered += n_stage / shards * c
    return grads, gathered


def _model_terms(w, hw, *, b, m, data, fsdp, tensor, stage, zero, remat, in_flight, sp,
                 dot_bytes, act_bytes, rt):  # fmt: skip
    """``(parameters on the busiest device, memory, compute, the scanned blocks' weight bytes,
    FSDP gather calls per micro-batch)`` of a transformer or dense workload."""
    c = get_precision(w.precision).compute
    if isinstance(w, Transformer):
        local_layers = -(-w.layers // stage)  # the busiest stage
        layer_t = w.layer_matmul_params() / tensor + w.norms * w.norm_params * w.d_model
        mem = transformer_memory(
            w, hw, micro_batch=b, microbatches=m, tensor=tensor, stage=stage, fsdp=fsdp,
            zero=zero, remat=remat, in_flight=in_flight, local_layers=local_layers,
            layer_params=layer_t, sequence_parallel=sp, dot_bytes=dot_bytes,
            act_bytes=act_bytes, fsdp_regather=rt.fsdp_regather,
        )  # fmt: skip
        work = _transformer_compute(w, b=b, m=m, tensor=tensor, stage=stage, remat=remat,
                                    replicas=data * fsdp, local_layers=local_layers,
                                    rt=rt)  # fmt: skip
        # the scanned blocks' share of the weights; gathers: each block, then the embedding
        # and head together
        return (
            _stage_params(w, stage, tensor),
            mem,
            work,
            local_layers * layer_t * c,
            (local_layers + 1),
        )
    mem = ActivationMemory(
        activations=w.activation_bytes_per_example * b * c / 2,
        logits=0.0,
        inputs=w.input_bytes_per_example * b * m,
        gathered=2 * w.largest_layer_params * c if (fsdp > 1 and zero == 3) else 0.0,
    )
    work = _Compute(
        flops=w.flops_per_example * w.batch / (data * fsdp),
        model_flops=w.flops_per_example * w.batch,
        activation_bytes=0.0, tp_count=0, head_on_busiest=True,
    )  # fmt: skip
    return float(w.params), mem, work, float(w.params) * c, max(w.layers, 1)


def _check_layout(workload, data, fsdp, tensor, stage, m, schedule, virtual) -> tuple[int, int]:
    """``(micro-batch size, virtual chunks)`` of a layout; raises on one that cannot run."""
    replicas = data * fsdp
    if workload.batch % (replicas * m):
        raise ShardkitValueError(
            f"batch={workload.batch} is not divisible by data x fsdp x microbatches = "
            f"{data} x {fsdp} x {m}; fix: a batch that is a multiple of {replicas * m}."
        )
    v = virtual if (schedule == "interleaved" and stage > 1) else 1
    layers = getattr(workload, "layers", 0)
    if layers and stage * v > layers:
        raise ShardkitValueError(
            f"stage x virtual = {stage} x {v} exceeds layers={layers}: every pipeline chunk "
            f"needs at least one layer; fix: stage <= {layers // v}."
        )
    if v > 1 and layers % (stage * v) and not getattr(workload, "uneven_stages", False):
        raise ShardkitValueError(
            f"layers={layers} is not divisible by stage x virtual = {stage} x {v}; fix: a "
            "virtual degree that divides layers / stage, or Transformer(uneven_stages=True)."
        )
    if schedule == "interleaved" and stage > 1 and (v < 2 or m % stage):
        raise ShardkitValueError(
            f"interleaved schedule with virtual={virtual}, microbatches={m}, stage={stage}: "
            "needs virtual >= 2 and microbatches a multiple of the stage degree (Megatron); "
            f"fix: virtual=2, microbatches={max(stage, m // stage * stage)}."
        )
    if isinstance(workload, Transformer):
        if workload.heads % tensor or workload.ff % tensor:
            raise ShardkitValueError(
                f"tensor={tensor} does not divide heads={workload.heads} and d_ff="
                f"{workload.ff}; fix: a tensor degree that divides both."
            )
        if workload.layers % stage and not workload.uneven_stages:
            raise ShardkitValueError(
                f"layers={workload.layers} is not divisible by stage={stage}; fix: a stage "
                "degree that divides the layer count, or Transformer(uneven_stages=True)."
            )
    elif tensor > 1 or stage > 1:
        raise ShardkitValueError(
            f"workload {workload.name!r} is a Dense model: only data and fsdp degrees apply; "
            "fix: tensor=1, stage=1."
        )
    return workload.batch // (replicas * m), v


class _Compute(NamedTuple):
    """A layout's FLOPs per device and the tensor-parallel traffic its blocks make."""

    flops: float  # executed, recompute included
    model_flops: float  # the whole step's model FLOPs, no recompute
    activation_bytes: float  # one b x s x h activation (tensor all-reduces, pipeline sends)
    tp_count: int  # tensor all-reduces per step on the busiest device
    head_on_busiest: bool  # whether the busiest device computes the loss head
    block_matmul_share: float = 0.0  # share of `flops` in the blocks' weight matmuls
    elementwise_bytes: float = 0.0  # memory-bound traffic of the blocks' other ops


def _transformer_compute(w, *, b, m, tensor, stage, remat, replicas, local_layers,
                         rt) -> _Compute:  # fmt: skip
    c = get_precision(w.precision).compute
    tokens = w.batch * w.seq / replicas
    layer_flops = 6 * w.layer_matmul_params() + 12 * w.seq * w.q_width
    full_rerun = rt.recompute == "forward"
    if remat == "block":  # the forward pass again; XLA drops the MLP-down matmul, whose
        # output only feeds the block output (dead code when recomputing gradients' inputs),
        # and in a parallel block the output projection too; torch.utils.checkpoint reruns
        # them (`Runtime.recompute`)
        dead = w.d_model * w.ff + (w.d_model * w.q_width if w.parallel_block else 0)
        rerun = w.layer_matmul_params() - (0 if full_rerun else dead)
        layer_flops += 2 * rerun + 4 * w.seq * w.q_width
    elif remat == "dots_no_batch":  # the attention matmuls again, for their output
        layer_flops += 4 * w.seq * w.q_width
    head_flops = 6 * w.d_model * w.vocab
    flops = tokens * (local_layers * layer_flops + head_flops) / tensor
    lockstep = rt.pipeline == "lockstep"
    if lockstep and stage > 1 and remat == "block":  # the executor's residuals="recompute": each
        # backward op first reruns its stage's forward for the block inputs of all but the
        # first layer, then each block again under remat (measured: docs/plan.md)
        forward = 2 * w.layer_matmul_params() + 4 * w.seq * w.q_width
        flops += tokens * (local_layers - 1) * forward / tensor
    head_on_busiest = True
    tp_count = (local_layers * _tp_all_reduces(w, remat, full_rerun) + 2) * m
    if stage > 1 and w.ends_on_every_stage:  # shardkit's executor gathers the embedding
        tp_count -= m  # table whole: no all-reduce of the lookups (see the all-gather)
    if lockstep and stage > 1 and remat == "block":  # residuals="recompute": a stage
        # before the last runs each micro-batch's forward in its F op and again in its B
        # op (the last stage's F only hands the micro-batch on; its B runs the forward
        # with the head), so it all-reduces the forward's two per block twice and has no
        # head; the busiest device is the one with more
        first = local_layers * (_tp_all_reduces(w, remat) + 2) * m
        if first > tp_count:
            tp_count, head_on_busiest = first, False
    # norms, activations, residuals, softmax...: `Runtime.elementwise` passes over h per token
    # and block, split like the block's work and rerun with it under "block" remat
    rerun = layer_flops / (6 * w.layer_matmul_params() + 12 * w.seq * w.q_width)
    elementwise = tokens * local_layers * rt.elementwise * w.d_model * c / tensor * rerun
    return _Compute(
        flops=flops,
        model_flops=w.tokens * w.model_flops_per_token(),
        activation_bytes=c * w.seq * b * w.d_model,
        tp_count=tp_count,
        head_on_busiest=head_on_busiest,
        block_matmul_share=tokens * local_layers * 6 * w.layer_matmul_params() / tensor / flops,
        elementwise_bytes=elementwise,
    )


class _Time(NamedTuple):
    compute: float
    bubble: float
    exposed: float
    update: float
    step: float
    bottleneck: str
    hidden: float = 0.0


def _step_time(compute: float, traffic: comm.Traffic, bubble_fraction: float, m: int,
               state: Any, hw: Hardware, ring_window: float = 0.0,
               tensor_overlap: float = 0.0) -> _Time:  # fmt: skip
    """Step time: the pipeline's lockstep work stretched by its bubble, the tensor traffic
    its collective-matmul rings do not hide behind `ring_window` seconds of matmuls, the
    data-parallel and FSDP traffic compute cannot hide, and the optimizer update at HBM
    bandwidth."""
    times, across = traffic.times, traffic.across
    hidden = min(hw.overlap * traffic.rings, ring_window)
    # a runtime that overlaps the other tensor collectives with independent compute
    hidden += min(tensor_overlap * (times["tensor"] - traffic.rings), compute - hidden)
    core_work = compute + times["tensor"] - hidden + times["stage"]
    core = core_work / (1 - bubble_fraction)  # lockstep: x (m + p - 1) / m for GPipe and 1F1B
    bubble = core - core_work
    # ZeRO-3 traffic recurs per micro-batch and overlaps the whole step; the once-per-step
    # gradient reduction (and ZeRO-1's gather) waits for the last micro-batch's backward
    # pass (after the pipeline flush), so only that much compute can hide it.
    micro, micro_across = traffic.per_micro
    once = times["fsdp"] + times["data"] - micro
    once_across = across["fsdp"] + across["data"] - micro_across
    exposed = _exposed(micro, micro_across, core, hw) + _exposed(
        once, once_across, core_work / m, hw
    )
    update = 2 * (state.params + state.grads + state.optimizer) / hw.hbm_bw
    parts = {
        "compute": compute,
        "tensor all-reduces": times["tensor"] - hidden,
        "pipeline bubble": bubble,
        "pipeline sends": times["stage"],
        "fsdp/data communication": times["fsdp"] + times["data"],  # before overlap
    }
    return _Time(compute, bubble, exposed, update, core + exposed + update,
                 max(parts, key=parts.get), hidden)  # fmt: skip


def _exposed(total: float, across: float, window: float, hw: Hardware) -> float:
    """Seconds of `total` traffic (`across` of it between domains) that `window` seconds of
    compute do not hide: a share `hw.overlap` of the traffic inside fast domains and
    `hw.overlap_inter` of the traffic across them hides, at most that share of the window.
    With equal shares o this is total - o x min(total, window), the scaling book's bounds at
    o = 1 (max of compute and comms) and o = 0 (their sum).
    """
    o_in, o_across = hw.overlap, hw.inter_overlap
    hideable = o_in * (total - across) + o_across * across
    return total - min(hideable, max(o_in, o_across) * window)


def _tp_all_reduces(w: Transformer, remat: str, full_rerun: bool = False) -> int:
    """b x s x h all-reduces per block per micro-batch under Megatron tensor parallelism.

    Forward: after the attention output and the MLP-down row-parallel matmuls (2). Backward:
    the input gradients of the column-parallel q/k/v and MLP-up (and gate) matmuls are partial
    sums, one all-reduce per kernel (Megatron fuses q/k/v and gate/up: 2, as shardkit's GPT
    does by contracting its stacked q/k/v at once; separate kernels: 3 + 1 or 2). "block"
    remat reruns the attention-output all-reduce (the MLP-down one only feeds the block
    output, dead in the recomputation), or both forward ones when the runtime reruns the whole
    forward (`full_rerun`, `Runtime.recompute`).
    """
    backward = 2 if w.fused_qkv else 3 + (2 if w.gated else 1)
    return 2 + backward + ((2 if full_rerun else 1) if remat == "block" else 0)


def divisors(n: int) -> list[int]:
    """Divisors of n in increasing order."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]
