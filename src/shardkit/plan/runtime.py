"""Runtimes: how the software that runs a layout executes it, where that changes its cost.

The planner's default is shardkit itself (`"shardkit"`): XLA compiles the step, the pipeline
runs as the lockstep step table of `shardkit.pipeline`, remat is `jax.checkpoint` (XLA drops the
recomputation no gradient needs). Published runs of other stacks ran differently, so to compare
the planner with them (and to explain shardkit's own choice against them) a `Runtime` names the
differences that move step time or memory:

* `pipeline`: "lockstep" (shardkit's SPMD executor: every device steps through one table, the
  fused 1F1B holds up to 2p - 1 micro-batches, the idle share is that of the table) or "async"
  (point-to-point runtimes, Megatron-LM and torchtitan: each stage runs its own op list, the
  bubble is (p - 1) / (v m) of the ideal time, i.e. (p - 1) / (v m + p - 1) of the step, and
  1F1B holds p micro-batches, interleaved p + (p - 1) / v stage-units (Narayanan et al. 2021,
  arXiv:2104.04473, §2.2)).
* `recompute`: what a "block" recomputation reruns. "dead-code" (`jax.checkpoint` under XLA:
  the block's forward but for the MLP-down matmul, whose output no gradient needs) or
  "forward" (`torch.utils.checkpoint` and Megatron's full recomputation rerun the whole
  forward: hardware FLOPs = 4/3 of the model's, Narayanan et al. 2021 §5.1; Korthikanti et al.
  2022, arXiv:2205.05198, Table 4: 30-36% overhead).
* `fsdp_regather`: ZeRO-3 weights gathered for the forward are freed after it and gathered
  again for the backward (PyTorch FSDP's `reshard_after_forward=True`, the default of
  torchtitan and llm-foundry's FULL_SHARD) instead of kept as residuals of the backward pass
  (JAX without remat: the gathered weight is an input of the matmul's VJP, so autodiff saves
  it per layer; XLA on GPU and TPU keeps it, as on CPU, `docs/plan.md`).
* `tensor_overlap`: share of the blocks' tensor-parallel collectives hidden behind compute.
  XLA on TPU runs them asynchronously beside the independent matmuls (MaxText: 0.9);
  Megatron-LM's all-reduces block the next matmul (0, Narayanan et al. 2021 §3.3); Megatron-
  Core with Transformer Engine's communication overlap: 0.5 (assumed, fitted to its 2024
  H100 table).
* `split_sends`: a pipeline send carries 1/tensor of the activation over the network and is
  all-gathered inside the node (Megatron's scatter/gather, Narayanan et al. 2021 §4.1).
* `elementwise`: memory-bound passes over the residual width per token and block (norms,
  activation functions, residual adds, softmax bookkeeping, their gradients), read and written
  at HBM bandwidth beside the matmuls. It makes a narrow model reach less of the peak: the
  matmul FLOPs of a block grow as h^2, this traffic as h. 300 fits Megatron-LM's A100 table
  (1.7B at 44% of peak in hardware FLOPs, 1T at 52%: predicted within 10% from h = 2304 to
  25600) and agrees with torchtitan's 8B/70B and llm-foundry's 1B-70B trends; XLA fuses most
  of these ops into the matmuls (0 for shardkit and MaxText, whose TPU table shows no such
  trend).
* `ceiling`: hardware name (or "name/fp8") -> share of the peak the stack's matmuls reach
  (else `Hardware.mfu_ceiling`). Fitted per stack to its published runs with the terms above
  in place (`tests/data/published_*.toml`): Megatron-LM A100 0.62 and H100 0.6 (Megatron-
  Core's 1.7B row, which has no tensor or pipeline traffic); llm-foundry (PyTorch FSDP) A100
  0.8, H100 0.68; torchtitan H100 0.415 (Llama 3.1 8B) and 0.46 of the fp8 peak with Float8;
  NeMo fp8 0.555 of the fp8 peak; MaxText v5e 0.76 and v4 0.69 (its MFU counts no
  recompute, so the planner's own recompute comes on top).

Example:
    >>> get_runtime("megatron").pipeline, get_runtime("shardkit").pipeline
    ('async', 'lockstep')
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from shardkit.errors import ShardkitValueError


@dataclasses.dataclass(frozen=True, kw_only=True)
class Runtime:
    """How one software stack executes a layout (module docstring).

    Attributes:
        name: lower-case label.
        pipeline: "lockstep" (shardkit's executor) or "async" (point-to-point stages).
        recompute: what "block" remat reruns: "dead-code" (XLA) or "forward" (PyTorch).
        fsdp_regather: ZeRO-3 weights are freed after the forward and gathered again for the
            backward (PyTorch FSDP) rather than kept for it (XLA without remat).
        tensor_overlap: share of tensor-parallel collectives hidden behind compute.
        elementwise: memory-bound passes over h per token and block (module docstring).
        split_sends: pipeline sends carry 1/tensor of the activation (Megatron).
        ceiling: hardware name (or "name/fp8") -> achievable share of peak for this stack
            (else the hardware's `mfu_ceiling`).
        description: one line for tables.
    """

    name: str
    pipeline: Literal["lockstep", "async"] = "lockstep"
    recompute: Literal["dead-code", "forward"] = "dead-code"
    fsdp_regather: bool = False
    tensor_overlap: float = 0.0
    elementwise: float = 0.0
    split_sends: bool = False
    ceiling: dict[str, float] = dataclasses.field(default_factory=dict)
    description: str = ""

    def __post_init__(self):
        if self.pipeline not in ("lockstep", "async"):
            raise ShardkitValueError(
                f"Runtime {self.name!r}: pipeline={self.pipeline!r}; fix: 'lockstep' or 'async'."
            )
        if self.recompute not in ("dead-code", "forward"):
            raise ShardkitValueError(
                f"Runtime {self.name!r}: recompute={self.recompute!r}; fix: 'dead-code' or "
                "'forward'."
            )
        if not 0 <= self.tensor_overlap <= 1:
            raise ShardkitValueError(
                f"Runtime {self.name!r}: tensor_overlap={self.tensor_overlap} must lie in "
                "[0, 1]; fix: tensor_overlap=0.0."
            )

    def ceiling_for(self, hardware, dtype: str = "bf16") -> float:
        """The share of `hardware`'s `dtype` peak this stack's matmuls reach ("h100/fp8" keys
        an fp8 figure; else the bf16 one; else `Hardware.mfu_ceiling`)."""
        if dtype != "bf16" and f"{hardware.name}/{dtype}" in self.ceiling:
            return self.ceiling[f"{hardware.name}/{dtype}"]
        return self.ceiling.get(hardware.name, hardware.mfu_ceiling)

    def replace(self, **changes) -> Runtime:
        return dataclasses.replace(self, **changes)


RUNTIMES: dict[str, Runtime] = {
    "shardkit": Runtime(
        name="shardkit", description="shardkit: XLA, lockstep pipeline table, jax.checkpoint"
    ),
    "megatron": Runtime(
        name="megatron", pipeline="async", recompute="forward", split_sends=True,
        elementwise=300, ceiling={"a100": 0.62, "h100": 0.6},
        description="Megatron-LM / NeMo: asynchronous 1F1B, full recompute reruns the forward",
    ),
    "megatron-core": Runtime(
        name="megatron-core", pipeline="async", recompute="forward", split_sends=True,
        tensor_overlap=0.5, elementwise=300, ceiling={"h100": 0.6, "h100/fp8": 0.555},
        description="Megatron-Core / NeMo with Transformer Engine: tensor traffic overlapped",
    ),
    "torchtitan": Runtime(
        name="torchtitan", pipeline="async", recompute="forward", fsdp_regather=True,
        elementwise=300, ceiling={"h100-96gb": 0.415, "h100-96gb/fp8": 0.46},
        description="torchtitan: FSDP2 reshards after forward, torch.distributed.pipelining",
    ),
    "pytorch-fsdp": Runtime(
        name="pytorch-fsdp", pipeline="async", recompute="forward", fsdp_regather=True,
        elementwise=300, ceiling={"a100": 0.8, "a100-40gb": 0.8, "h100": 0.68},
        description="PyTorch FSDP FULL_SHARD (llm-foundry, DeepSpeed ZeRO-3 alike)",
    ),
    "maxtext": Runtime(
        name="maxtext", tensor_overlap=0.9, ceiling={"tpu-v5e": 0.76, "tpu-v4": 0.69},
        description="MaxText: XLA on TPU/GPU, asynchronous collectives beside the matmuls",
    ),
}  # fmt: skip

_ALIASES = {"nemo": "megatron-core", "mcore": "megatron-core", "megatron-lm": "megatron",
            "llm-foundry": "pytorch-fsdp", "fsdp": "pytorch-fsdp", "xla": "shardkit",
            "lockstep": "shardkit", "async": "megatron"}  # fmt: skip


def known_runtimes() -> list[str]:
    """Names of the built-in runtimes."""
    return sorted(RUNTIMES)


def get_runtime(name: str | Runtime) -> Runtime:
    """The runtime called `name` ("shardkit", "megatron", "torchtitan", ...), or `name` itself.

    Raises:
        ValueError: for an unknown name (lists the known ones).
    """
    if isinstance(name, Runtime):
        return name
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in RUNTIMES:
        raise ShardkitValueError(
            f"unknown runtime {name!r}; known: {', '.join(known_runtimes())}; fix: pass one of "
            "those, or shardkit.plan.Runtime(name=..., pipeline='async', ...)."
        )
    return RUNTIMES[key]
