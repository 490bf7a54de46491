"""Memory per device: model state per ZeRO stage, activations per remat policy, pipeline buffers.

Model state (Rajbhandari et al., ZeRO, arXiv:1910.02054). With w, g bytes per weight and
gradient and o bytes of optimizer state per parameter (the fp32 master copy counts as
optimizer state), over N shards:

=======  ================================
stage    bytes per device
=======  ================================
0 (DP)   (w + g + o) Ψ
1        (w + g) Ψ + o Ψ / N
2        w Ψ + (g + o) Ψ / N
3        (w + g + o) Ψ / N
=======  ================================

Mixed-precision Adam is w = g = 2, o = 4 + 4 + 4 = 12: 16 bytes per parameter, so ZeRO-1 is
4Ψ + 12Ψ/N, ZeRO-2 2Ψ + 14Ψ/N, ZeRO-3 16Ψ/N (not the 12 bytes of seed 002's example).
Megatron and DeepSpeed keep fp32 gradients (g = 4 or 6): 18 bytes per parameter.

Activations, bytes per block per micro-batch (Korthikanti et al., arXiv:2205.05198, Table 2,
adapted): with dropout and naive attention a block keeps sbh(34 + 5as/h) at 16 bits; without
dropout masks (3 of them) and with flash attention (no s x s tensors, only an f32 row
log-sum-exp) it keeps sbh x 32 for F = 4h. `layer_activation_bytes` writes it out per tensor
for any F, GQA and gated MLPs; tensor parallelism splits the attention and MLP tensors but not
the block and norm inputs (sbh(8 + 24/t) without dropout) unless sequence parallelism splits
those too. Remat policies: "none" keeps all of it; "dots" (JAX's `dots_saveable`) keeps the
block input and every matmul output; "dots_no_batch" (JAX's `dots_with_no_batch_dims_saveable`,
MaxText's "minimal") keeps the block input and the weight matmuls' outputs, but not the
attention matmuls' (they have batch dimensions; a flash kernel's output is no dot at all), so
the attention output is recomputed; "block" keeps only the block input, and recomputes one
block at a time in the backward pass.

Pipeline schedules hold several micro-batches in flight on the first stage: GPipe m, 1F1B
min(m, p) (PipeDream-Flush), interleaved 1F1B x (1 + (p-1)/(p v)) (Narayanan et al. 2021).

Closed forms of other tools are reimplemented here from their published formulas, for parity
tests: `deepspeed_zero2_estimate` / `deepspeed_zero3_estimate` (DeepSpeed
`estimate_zero{2,3}_model_states_mem_needs`, docs "Memory Requirements") and
`megatron_theoretical_memory` (Megatron-LM `theoretical_memory_usage.py`).

Example:
    >>> s = model_state_bytes(7.5e9, zero=3, shards=64, precision="mixed")
    >>> round(s.total / 1e9, 3)
    1.875
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from shardkit.errors import ShardkitValueError


@dataclasses.dataclass(frozen=True)
class Precision:
    """Bytes per parameter and per activation element.

    Attributes:
        name: label.
        params: bytes per stored weight.
        grads: bytes per gradient.
        master: bytes of an fp32 master copy (0 when the stored weights are fp32 already).
        compute: bytes per activation element and per communicated element.
        compute_dtype: dtype name of compute (selects the peak FLOP/s).
    """

    name: str
    params: int
    grads: int
    master: int
    compute: int
    compute_dtype: str = "bf16"


PRECISIONS: dict[str, Precision] = {
    # bf16 weights and grads + fp32 master, m, v: the ZeRO paper's 16 B/param
    "mixed": Precision("mixed", params=2, grads=2, master=4, compute=2),
    # shardkit's Trainer(compute_dtype="bfloat16"): fp32 weights cast to bf16 for compute
    "shardkit": Precision("shardkit", params=4, grads=4, master=0, compute=2),
    # Megatron-LM / DeepSpeed ZeRO-3: bf16 weights, fp32 main grads, fp32 master: 18 B/param
    "megatron": Precision("megatron", params=2, grads=4, master=4, compute=2),
    "fp32": Precision("fp32", params=4, grads=4, master=0, compute=4, compute_dtype="fp32"),
    # Transformer Engine fp8 under Megatron-LM / NeMo: the "megatron" state, bf16 activations,
    # matmuls at the fp8 peak
    "fp8": Precision("fp8", params=2, grads=4, master=4, compute=2, compute_dtype="fp8"),
}

# the Trainer's names (its compute dtype, `shardkit train --precision`) for the same settings
PRECISION_ALIASES = {"float32": "fp32", "f32": "fp32", "bfloat16": "shardkit", "bf16": "shardkit"}

_OPTIMIZER_BYTES = {"adam": 8, "adamw": 8, "lamb": 8, "sgd": 4, "none": 0}


def get_precision(precision: str | Precision) -> Precision:
    """The `Precision` called `precision` (or `precision` itself).

    The Trainer's names mean its settings: "float32" is "fp32", "bfloat16" (bf16 compute on
    fp32 weights) is "shardkit" (`PRECISION_ALIASES`).

    Raises:
        ValueError: for an unknown name (the message lists the known ones).
    """
    if isinstance(precision, Precision):
        return precision
    precision = PRECISION_ALIASES.get(precision, precision)
    if precision not in PRECISIONS:
        raise ShardkitValueError(
            f"unknown precision {precision!r}; known: {', '.join(sorted(PRECISIONS))} (and the "
            f"Trainer's {', '.join(sorted(PRECISION_ALIASES))}); "
            "fix: precision='mixed' (bf16 weights + fp32 master, 16 B/param with Adam)."
        )
    return PRECISIONS[precision]


def optimizer_bytes(optimizer: str) -> int:
    """Optimizer-state bytes per parameter, master copy excluded (Adam: m and v in fp32 = 8).

    Raises:
        ValueError: for an unknown optimizer.
    """
    key = optimizer.lower()
    if key not in _OPTIMIZER_BYTES:
        raise ShardkitValueError(
            f"unknown optimizer {optimizer!r}; known: {', '.join(sorted(_OPTIMIZER_BYTES))}; "
            "fix: optimizer='adam'."
        )
    return _OPTIMIZER_BYTES[key]


@dataclasses.dataclass(frozen=True)
class StateBytes:
    """Model-state bytes on one device."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def bytes_per_param(precision: str | Precision = "mixed", optimizer: str = "adam"):
    """(w, g, o): weight, gradient and optimizer-state (incl. master copy) bytes per param."""
    p = get_precision(precision)
    return p.params, p.grads, p.master + optimizer_bytes(optimizer)


def model_state_bytes(
    n_params: float,
    *,
    zero: int,
    shards: int,
    precision: str | Precision = "mixed",
    optimizer: str = "adam",
) -> StateBytes:
    """Parameters, gradients and optimizer state per device under ZeRO stage `zero`.

    Args:
        n_params: parameters held by this group of `shards` devices (Ψ).
        zero: 0 (plain data parallel), 1, 2 or 3.
        shards: N, the devices the state is split over.
        precision: see `Precision`.
        optimizer: "adam", "sgd", ...

    Raises:
        ValueError: for a stage outside 0-3 or shards < 1.

    Example:
        >>> model_state_bytes(7.5e9, zero=0, shards=64).total / 1e9
        120.0
    """
    if zero not in (0, 1, 2, 3) or shards < 1:
        raise ShardkitValueError(
            f"zero={zero}, shards={shards}: the ZeRO stage must be 0-3 and shards >= 1; "
            "fix: zero=3, shards=<devices the state is split over>."
        )
    w, g, o = bytes_per_param(precision, optimizer)
    n = shards
    split = {0: (1, 1, 1), 1: (1, 1, n), 2: (1, n, n), 3: (n, n, n)}[zero]
    return StateBytes(n_params * w / split[0], n_params * g / split[1], n_params * o / split[2])


# -- activations ---------------------------------------------------------------------------
def layer_activation_bytes(
    w: Any,
    *,
    micro_batch: int,
    tensor: int = 1,
    remat: str = "none",
    sequence_parallel: bool = False,
    dot_bytes: int | None = None,
    act_bytes: int | None = None,
) -> float:
    """Bytes one transformer block keeps for its backward pass, per device, per micro-batch.

    Args:
        w: a `shardkit.plan.Transformer`.
        micro_batch: sequences per micro-batch on this device (b).
        tensor: tensor-parallel degree (t).
        remat: "none", "dots", "dots_no_batch" or "block" (see the module docstring).
        sequence_parallel: split the block and norm inputs over `tensor` too (Megatron SP).
        dot_bytes: bytes per matmul output kept under "dots" (see `activation_terms`).
        act_bytes: bytes per element of the other kept activations (see `activation_terms`).

    Example:
        >>> from shardkit.plan.workload import Transformer
        >>> w = Transformer(layers=1, d_model=1024, heads=16, vocab=8, seq=512)
        >>> layer_activation_bytes(w, micro_batch=1) / (512 * 1024)  # sbh x 32, + f32 LSE
        32.0625
    """
    repl, split = activation_terms(
        w, micro_batch=micro_batch, remat=remat, dot_bytes=dot_bytes, act_bytes=act_bytes
    )
    return repl / (tensor if sequence_parallel else 1) + split / tensor


def activation_terms(
    w: Any,
    *,
    micro_batch: int,
    remat: str = "none",
    dot_bytes: int | None = None,
    act_bytes: int | None = None,
) -> tuple[float, float]:
    """(replicated, splittable) bytes a block keeps per micro-batch, before tensor parallelism.

    "replicated" are the block and norm inputs/outputs that Megatron tensor parallelism leaves
    whole on every device of the tensor axis (sequence parallelism splits them); "splittable"
    are the per-head and per-F-column tensors, split over the tensor axis.

    `dot_bytes` is the size of a matmul output kept under "dots" (default: the compute
    dtype; XLA:CPU runs bf16 matmuls in f32 and keeps f32 outputs, 4). `act_bytes` is the
    size of every other kept element (default the compute dtype; XLA:CPU keeps bf16 block
    inputs, norms and the residual stream in f32, 4: `Hardware.activation_upcast`).

    Raises:
        ValueError: for an unknown remat policy.
    """
    c = max(get_precision(w.precision).compute, act_bytes or 0)
    tok = w.seq * micro_batch
    h, f, a = w.d_model, w.ff, w.heads
    qkv = tok * (w.q_width + 2 * w.kv_width)
    s2 = a * w.seq * w.seq * micro_batch  # elements of one s x s tensor per head
    if remat == "none":  # norm inputs and outputs (two of each, one in a parallel block)
        repl = 2 * w.norms * c * tok * h + (2 * tok * h if w.dropout else 0)  # + masks
        mlp = (3 if w.gated else 2) * c * tok * f
        if w.attention == "flash":
            core = 4 * tok * a  # f32 log-sum-exp per row and head
        else:
            core = c * s2 + ((1 + c) * s2 if w.dropout else 0)  # probs (+ mask, dropped)
        return float(repl), float(c * qkv + c * tok * w.q_width + mlp + core)
    if remat in ("dots", "dots_no_batch"):
        d = dot_bytes or c
        # block input, attention-out and MLP-down outputs (JAX keeps no MLP-down output; the
        # count stays for what XLA:CPU keeps beyond the model, see docs/plan.md); a parallel
        # block keeps neither (both only feed the residual sum, which no gradient needs)
        repl = c * tok * h + (0 if w.parallel_block else 2 * d * tok * h)
        mlp = (2 if w.gated else 1) * d * tok * f
        if remat == "dots_no_batch":  # the attention matmuls (batch dims) are recomputed
            return float(repl), float(d * qkv + mlp)
        core = d * s2 if w.attention == "naive" else 0  # the scores matmul
        return float(repl), float(d * qkv + d * tok * w.q_width + mlp + core)
    if remat == "block":
        return float(c * tok * h), 0.0
    raise ShardkitValueError(
        f"unknown remat policy {remat!r}; fix: 'none', 'dots', 'dots_no_batch' or 'block'."
    )


@dataclasses.dataclass(frozen=True)
class ActivationMemory:
    """A transformer layout's memory beyond the model state, per device (bytes).

    Attributes:
        activations: the stash the busiest stage keeps for its in-flight micro-batches plus
            the working set of the block being differentiated.
        logits: what the loss phase needs beyond that working set (logits and their gradient
            never live together with the block backward).
        inputs: the batch of token ids (or inputs) for all micro-batches.
        gathered: ZeRO-3-gathered weights alive at the peak.
    """

    activations: float
    logits: float
    inputs: float
    gathered: float


def transformer_memory(
    w: Any,
    hw: Any,
    *,
    micro_batch: int,
    microbatches: int,
    tensor: int,
    stage: int,
    fsdp: int,
    zero: int,
    remat: str,
    in_flight: int,
    local_layers: int,
    layer_params: float,
    sequence_parallel: bool,
    dot_bytes: int | None,
    act_bytes: int | None,
    fsdp_regather: bool = False,
) -> ActivationMemory:
    """Activation, loss-phase, input and gathered-weight bytes of one transformer layout.

    Args:
        w: the `Transformer`.
        hw: the `Hardware` whose compiler habits apply (`activation_upcast`, `dot_output_bytes`,
            `norm_input_bytes`, `library_reduce_rows`, `gathered_layers`, `gathered_bytes`).
        micro_batch, microbatches: b and m per data replica.
        tensor, stage, fsdp, zero: the layout.
        remat: "none", "dots", "dots_no_batch" or "block".
        in_flight: micro-batches the busiest stage holds (`shardkit.pipeline`'s tables).
        local_layers: blocks on the busiest stage.
        layer_params: one block's parameters on a device (tensor-split matmuls, whole norms).
        sequence_parallel: Megatron sequence parallelism over "tensor".
        dot_bytes, act_bytes: overrides of the habits' matmul-output and activation bytes.
        fsdp_regather: ZeRO-3 weights are freed after the forward and gathered again for the
            backward (PyTorch FSDP, `shardkit.plan.runtime`), so without remat too only the
            layers being computed hold gathered weights.
    """
    b, m, sp = micro_batch, microbatches, sequence_parallel
    c = get_precision(w.precision).compute
    a = max(c, act_bytes or hw.activation_upcast or c)  # bytes per kept activation
    per_layer = layer_activation_bytes(
        w, micro_batch=b, tensor=tensor, remat=remat, sequence_parallel=sp,
        dot_bytes=dot_bytes or hw.dot_output_bytes, act_bytes=a,
    )  # fmt: skip
    primitive = remat == "none" and bool(hw.primitive_residuals)
    zero3 = fsdp > 1 and zero == 3
    if primitive:  # JAX's linearisation keeps more than Korthikanti's tensors
        per_layer, transient = _primitive_stash(
            w, b=b, tensor=tensor, sp=sp, a=a, c=c, weights=0.0 if zero3 else layer_params
        )
    stored = per_layer * local_layers * in_flight
    if stage > 1 and w.ends_on_every_stage:
        # shardkit's executor embeds all m micro-batches before the schedule and collects
        # their input cotangents after it: two [m, b, s, h] temporaries on every stage
        stored += 2 * m * c * w.seq * b * w.d_model
    working = _working_set(w, hw, b=b, tensor=tensor, remat=remat, sp=sp, a=a, c=c)
    if primitive:
        # the backward's s x s cotangents are f32, not the compute dtype's c bytes, and the
        # hoisted mask stays live; the forward of the last block holds its own s x s
        # temporaries next to the full stash: the peak takes the larger
        s2 = w.heads * w.seq * w.seq * b / tensor if w.attention != "flash" else 0.0
        working = max(working + (2 * 4 + 1 - c) * s2, transient)
    hidden = 2 * a * w.seq * b * w.d_model / (tensor if sp else 1)
    loss_phase = w.logits_bytes * w.seq * b * w.vocab / tensor + hidden
    # the loss (logits and their gradient) and the backward pass through a block happen
    # at different times: the peak holds the stash plus the larger of the two. The
    # logits field is what the loss phase needs beyond the block's working set.
    table = w.vocab * w.d_model / tensor
    if fsdp > 1 and zero == 3:
        # under remat, the block being differentiated and the one prefetched behind it;
        # a backend with synchronous collectives holds one (`Hardware.gathered_layers`)
        keep = remat == "none" and not fsdp_regather  # kept as the backward's residuals
        layers_alive = local_layers if keep else (hw.gathered_layers or 2)
        # XLA:CPU with f32 dots all-gathers bf16 weights in f32 (the fp32 -> bf16 cast
        # sinks below the collective) and keeps the gathered copy in f32:
        # `activation_upcast` bytes; with bf16 dots it gathers bf16 but the block's f32
        # weight gradients take their place: `gathered_bytes` (`Hardware`, `cpu_habits`)
        g = max(c, hw.gathered_bytes or hw.activation_upcast or c)
        gathered = (layers_alive * layer_params + table * (2 if not w.tied else 1)) * g
    else:
        gathered = 0.0
    return ActivationMemory(
        activations=stored + working,
        logits=max(0.0, loss_phase - working),
        inputs=w.input_bytes_per_token * w.seq * b * m,
        gathered=gathered,
    )


def _primitive_stash(
    w: Any, *, b: int, tensor: int, sp: bool, a: int, c: int, weights: float
) -> tuple[float, float]:
    """(bytes one block stashes, the forward's s x s peak) under remat "none", as JAX keeps them.

    JAX's linearisation saves every primitive's residuals, not the tensors of Korthikanti's
    table, stacked per layer by the scan. For shardkit's GPT (docs/plan.md mechanism (8)):

    - each RMS norm keeps four b x s x h tensors: its input upcast to f32, the f32 2x of
      square's derivative, the normalised and the scaled output (compute dtype, `a` bytes);
    - q, k, v and the attention output, as counted;
    - the softmax keeps its f32 exp and the probabilities in the compute dtype (4 + c per
      s x s element, where the table counts c); its causal mask is hoisted out of the loop
      (1 byte, once);
    - the tanh-GELU MLP keeps five b x s x F tensors (the up output, x^2 x 3, 1 - tanh^2,
      the two products), not two;
    - with a compute dtype narrower than the weights' (bf16 on fp32), the bf16 copies of the
      block's matmul weights; in fp32 the q/k/v kernels stacked into one (`weights`: the
      block's parameters on a device, 0 when ZeRO-3's gathered copies count them).

    The forward of the last block holds the full stash, two f32 s x s temporaries and the
    hoisted mask with its f32 -1e30 operand broadcast to b x heads x s x s: 13 bytes per
    element. Gated MLPs, flash attention and dropout keep the table's counts (not measured).
    """
    c = max(c, a)
    tok = w.seq * b
    h, f = w.d_model, w.ff
    qkv = tok * (w.q_width + 2 * w.kv_width)
    repl = w.norms * (2 * 4 + 2 * a) * tok * h + (2 * tok * h if w.dropout else 0)
    mlp = (3 if w.gated else 5) * c * tok * f
    s2 = w.heads * w.seq * w.seq * b
    if w.attention == "flash":
        core, forward = 4 * tok * w.heads, 0.0
    else:
        core = (4 + c) * s2 + ((1 + c) * s2 if w.dropout else 0)
        forward = (2 * 4 + 4 + 1) * s2 / tensor
    if not weights:
        copies = 0.0
    elif get_precision(w.precision).params > c:
        copies = weights * c  # the bf16 casts of every matmul weight
    else:
        copies = w.d_model * (w.q_width + 2 * w.kv_width) / tensor * c  # the q/k/v stack
    split = c * qkv + c * tok * w.q_width + mlp + core
    return repl / (tensor if sp else 1) + split / tensor + copies, forward


def _working_set(w: Any, hw: Any, *, b: int, tensor: int, remat: str, sp: bool, a: int, c: int):
    """Bytes of the block being differentiated, at the peak of its backward pass."""
    # its cotangents, about as large as its residuals, and under "block" remat the
    # recomputed residuals too ("dots" keeps the matmul outputs, the stash holds the rest);
    # under tensor parallelism also one b x s x h partial-sum input gradient of a
    # column-parallel kernel, live until its all-reduce (the compiler reduces each as it is
    # produced; measured on shardkit's GPT, see docs/plan.md)
    full = layer_activation_bytes(
        w, micro_batch=b, tensor=tensor, remat="none", sequence_parallel=sp, act_bytes=a
    )
    partials = a * w.seq * b * w.d_model if tensor > 1 else 0.0
    working = full * (2 if remat == "block" else 1) + partials / (tensor if sp else 1)
    if remat == "block" and a > c:
        # the MLP hidden tensors of that working set (2 per MLP matmul output, recomputed
        # and cotangent: 4 b x s x F, 6 gated) are not upcast like the residual stream:
        # XLA:CPU keeps the hidden's cotangent, its transpose for the weight-gradient
        # matmul and the GELU-derivative product in the compute dtype, and only the GELU
        # input in f32 (read off the compiled buffers live at the peak, docs/plan.md)
        n_mlp = 2 * (3 if w.gated else 2)
        working -= (n_mlp * a - ((n_mlp - 1) * c + a)) * w.seq * b * w.ff / tensor
    rows = w.seq * b / (tensor if sp else 1)  # tokens a norm normalises
    if hw.norm_input_bytes and hw.norm_input_bytes > a:
        # XLA:CPU with bf16 dots keeps both norms' inputs in f32, as the model upcasts
        # them, where the rest of the working set is bf16 (`Hardware.norm_input_bytes`)
        working += w.norms * (hw.norm_input_bytes - a) * rows * w.d_model
    if hw.library_reduce_rows and rows >= hw.library_reduce_rows:
        # XLA:CPU runs each norm's backward reduction as a YNNPACK library fusion that
        # takes its operands as buffers: the rsqrt factor and the scale of both norms are
        # broadcast to b x s x h in f32 and kept (`Hardware.library_reduce_rows`)
        working += w.norms * 2 * 4 * rows * w.d_model
    return working


def bubble_fraction(stages: int, microbatches: int, virtual: int = 1) -> float:
    """Idle share of a pipelined step: (p-1)/(v m + p-1) (GPipe/1F1B when v = 1).

    Not seed 002's (m-p+1)/m, which is a first-order approximation and goes negative for
    m < p-1 (Narayanan et al. 2021 §2.2; GPipe arXiv:1811.06965).

    Example:
        >>> round(bubble_fraction(4, 4), 4)
        0.4286
    """
    p, m = stages, microbatches
    return (p - 1) / (virtual * m + p - 1)


# -- other tools' closed forms, for parity ----------------------------------------------------
def deepspeed_zero2_estimate(
    total_params: float,
    *,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    additional_buffer_factor: float = 1.5,
    legacy: bool = False,
) -> tuple[int, int]:
    """(cpu_bytes, gpu_bytes) of DeepSpeed's `estimate_zero2_model_states_mem_needs`.

    GPU without offload: 2Ψ (fp16 weights) + 18Ψ/N (fp16 + fp32 grads, fp32 weights, Adam),
    `legacy=True`: the older 4Ψ + 16Ψ/N that DeepSpeed's "Memory Requirements" page still
    prints. With optimizer offload: 2Ψ. CPU: Ψ x 4 x gpus per node x buffer factor
    (Ψ x max(4 N, 16) x factor with offload).
    """
    n = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu = 2 * total_params
        cpu = total_params * max(4 * n, 16) * additional_buffer_factor
    else:
        gpu = (
            4 * total_params + int(16 * total_params / n)
            if legacy
            else (2 * total_params + int(18 * total_params / n))
        )
        cpu = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu), int(gpu)


def deepspeed_zero3_estimate(
    total_params: float,
    largest_layer_params: float,
    *,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    cpu_offload_params: bool = True,
    zero_init: bool = True,
    additional_buffer_factor: float = 1.5,
) -> tuple[int, int, int]:
    """(cpu_bytes, gpu_bytes, largest_layer_bytes) of `estimate_zero3_model_states_mem_needs`.

    GPU: 4 x largest layer (its fp16 weights and grads gathered) + 18Ψ/N without offload,
    + 2Ψ/N with the optimizer offloaded, + 0 with parameters offloaded too.
    """
    n = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest = 4 * largest_layer_params
    f = additional_buffer_factor
    if cpu_offload and cpu_offload_params:
        gpu = largest
        k = 18 * gpus_factor if zero_init else max(4 * num_gpus_per_node, 18 * gpus_factor)
        cpu = total_params * k * f
    elif cpu_offload:
        gpu = largest + int(2 * total_params / n)
        k = 16 * gpus_factor if zero_init else max(4 * num_gpus_per_node, 16 * gpus_factor)
        cpu = total_params * k * f
    else:
        gpu = largest + int(18 * total_params / n)
        base = largest_layer_params if zero_init else total_params
        cpu = base * 4 * num_gpus_per_node * f
    return int(cpu), int(gpu), int(largest)


def megatron_theoretical_memory(
    *,
    hidden: int,
    ffn: int,
    layers: int,
    heads: int,
    vocab: int,
    seq: int,
    micro_batch: int,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    num_microbatches: int | None = None,
    virtual_pp: int | None = None,
    kv_groups: int | None = None,
    swiglu: bool = False,
    untied: bool = False,
    layernorm: bool = True,
    distributed_optimizer: bool = False,
) -> tuple[float, float]:
    """(weight_and_optimizer_bytes, activation_bytes) on Megatron-LM's most loaded device.

    Megatron-LM's `theoretical_memory_usage.py` for a dense GPT with sequence parallelism and
    selective recompute: the first stage holds (L/p layers + embedding)/t parameters at 18 B
    each (6 + 12/d with the distributed optimizer), and activations of sbh(18 + 4F/h) per layer
    for L layers (p micro-batches in flight x L/p layers, scaled by min(1, m/p)), plus the
    embedding's 8sbp + sbhp and, without a pipeline, the output layer's 4sbh(1 + V/h); all / t.
    """
    norm = 2 if layernorm else 1
    groups = kv_groups or heads
    glu = 1.5 if swiglu else 1.0
    attn = 2 * hidden * hidden * (1 + groups / heads)
    layer = 2 * hidden * (ffn * glu + norm) + attn
    embedding = hidden * vocab
    block = layer * layers + norm * hidden
    shard = (block / pp + embedding) / tp
    if untied and pp == 1:
        shard += embedding / tp
    per_param = 6 + 12 / dp if distributed_optimizer else 18
    weights = shard * per_param

    sbh = seq * micro_batch * hidden
    act = sbh * (18 + 4 * ffn / hidden) * layers
    act += 8 * seq * micro_batch * pp + sbh * pp
    if virtual_pp is not None:
        act *= 1 + (pp - 1) / (pp * virtual_pp)
    elif pp > 1 and num_microbatches is not None:
        act *= min(1, num_microbatches / pp)
    if pp == 1:
        act += sbh * 4 * (1 + vocab / hidden)
    return weights, act / tp


def gib(nbytes: float) -> float:
    """Bytes -> GiB."""
    return nbytes / 2**30


def ceil_div(a: int, b: int) -> int:
    return -(-a // b) if isinstance(a, int) else math.ceil(a / b)
