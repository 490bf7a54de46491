"""Workloads the planner reasons about: a decoder-only `Transformer` and a generic `Dense` model.

A workload states shapes and training choices, never layouts: the planner decides those. Sizes
follow Megatron's notation where it has one (L layers, h = d_model, F = d_ff, a heads, s
sequence, V vocab).

Presets (shapes from the papers; `batch` is the published global batch in sequences):

* `gpt2-1.5b`: 48 x 1600, 25 heads, F 6400, V 50257, s 1024, learned positions, tied
  embeddings (Radford et al. 2019).
* `gpt3-175b`: 96 x 12288, 96 heads, F 49152, V 50257, s 2048, batch 1536 (Brown et al. 2020,
  Table 2.1; Narayanan et al. 2021).
* `llama3-8b` / `llama3-70b` / `llama3-405b`: 32 x 4096 / 80 x 8192 / 126 x 16384, 8 KV heads,
  SwiGLU F 14336 / 28672 / 53248, V 128256, s 8192 (Llama 3 paper, arXiv:2407.21783, Table 3).
* `resnet50`: a ResNet-50-sized dense model: 25.6M parameters in 54 weight layers (53
  convolutions + 1 dense), 8.2 GFLOP forward per 224x224 image (4.1 G multiply-adds; He et
  al. 2016), about 27M stored activation values per image (conv, batch-norm and ReLU
  outputs), i.e. ~54 MB at 16 bits.

Example:
    >>> w = Transformer.preset("gpt3-175b")
    >>> round(w.n_params() / 1e9, 1)
    174.6
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from shardkit.errors import ShardkitValueError
from shardkit.plan.checks import checked_fields
from shardkit.plan.memory import get_precision, optimizer_bytes

Remat = Literal["auto", "none", "dots", "dots_no_batch", "block"]
REMAT_POLICIES = ("none", "dots", "block")  # the policies shardkit's GPT runs; searched
# policies other stacks run, costed when asked for: JAX's `dots_with_no_batch_dims_saveable`
# (MaxText's remat_policy="minimal") keeps the weight matmuls' outputs, not attention's
OTHER_REMAT_POLICIES = ("dots_no_batch",)
# the sizes each workload checks when built (`checks.checked`; "?": None means the default)
_TRANSFORMER_SIZES = dict.fromkeys(("layers", "d_model", "heads", "vocab", "seq", "batch"), "count")
_TRANSFORMER_SIZES |= dict.fromkeys(("d_ff", "kv_heads", "head_dim"), "count?")
_TRANSFORMER_SIZES |= dict.fromkeys(
    ("norm_params", "logits_bytes", "input_bytes_per_token"), "size"
)
# what None means for the sizes that default (0 is refused: it is no size, and no default)
_DEFAULTS = {"d_ff": "the default: 4 x d_model", "kv_heads": "the default: heads",
             "head_dim": "the default: d_model // heads"}  # fmt: skip
_DENSE_SIZES = {"params": "count", "flops_per_example": "positive",
                "activation_bytes_per_example": "nonnegative", "batch": "count",
                "largest_layer_params": "size", "layers": "count",
                "input_bytes_per_example": "nonnegative"}  # fmt: skip


def check_remat(remat: Any, where: str) -> None:
    """Raises unless `remat` is "auto" or a policy the planner costs."""
    if remat not in ("auto", *REMAT_POLICIES, *OTHER_REMAT_POLICIES):
        raise ShardkitValueError(
            f"{where}remat={remat!r} is not one of "
            f"{('auto', *REMAT_POLICIES, *OTHER_REMAT_POLICIES)}; fix: remat='auto'."
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Transformer:
    """A decoder-only transformer and how it is trained.

    Attributes:
        name: label for tables.
        layers: decoder blocks (L).
        d_model: residual width (h).
        heads: query heads (a).
        vocab: vocabulary size (V).
        seq: tokens per sequence (s).
        batch: global batch in sequences per optimizer step.
        d_ff: feed-forward width (F); None (the default): 4 x d_model.
        kv_heads: key/value heads (grouped-query attention); None (the default): `heads`.
        head_dim: width per head; None (the default): d_model // heads.
        gated: SwiGLU MLP (three F x h matrices) instead of two.
        parallel_block: attention and MLP both read one norm of the block input and their
            outputs are added to it (GPT-J, PaLM, MaxText's 2023 decoder) instead of the MLP
            reading a second norm of the attention's residual sum: one norm per block, and
            the attention's output projection is neither kept for the backward pass nor rerun
            under remat (no gradient needs its output).
        tied: output head shares the embedding table.
        positions: a learned position table (s x h).
        norm_params: parameters per norm per channel (1 RMSNorm, 2 LayerNorm with bias).
        uneven_stages: pipeline stages may hold ceil(L / p) layers when p does not divide L
            (Megatron-LM and torchtitan allow it; shardkit's pipeline needs L % p == 0).
        ends_on_every_stage: under a pipeline every stage holds the embedding and the
            output head (shardkit's executor: they stay outside the staged layers, replicated
            over "stage") instead of the first stage the one and the last the other (Megatron).
        fused_qkv: q/k/v (and gate/up) are one kernel each, as in Megatron-LM: one tensor-
            parallel all-reduce for their input gradient instead of one per kernel.
        attention: "flash" (no s x s tensors kept) or "naive" (softmax probabilities kept, as
            shardkit's `GPT` computes them).
        dropout: dropout masks kept for the backward pass (1 byte per element).
        precision: a `shardkit.plan.memory.Precision` name ("mixed", "shardkit", "megatron",
            "fp32") or value.
        optimizer: "adam"/"adamw" (two fp32 moments), "sgd" (momentum) or "none".
        remat: "auto" (the search chooses), "none", "dots" or "block"; "dots_no_batch"
            (MaxText's "minimal") is costed when asked for but not searched.
        logits_bytes: bytes held per output logit at the loss (4: one f32 array, a fused
            cross-entropy; shardkit's `lm_loss` holds f32 logits, log-probabilities, one-hot
            targets and their cotangents: about 24).
        input_bytes_per_token: bytes of the batch per token (shardkit's LM batch: int32
            inputs and targets + f32 mask = 12).

    Sizes are ints (numpy integers too; a bool or a float is refused, even 16.0: pass
    `int(...)`); the ones that default take None for their default, never 0.

    Raises:
        ValueError: on a size that is not a positive int (`d_ff=0`, `batch=16.5`), a byte
            count below 0, heads that do not divide the widths, or an unknown remat policy;
            the message names the field and its value and ends with a fix.
    """

    name: str = "transformer"
    layers: int
    d_model: int
    heads: int
    vocab: int
    seq: int
    batch: int = 8
    d_ff: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    gated: bool = False
    parallel_block: bool = False
    tied: bool = False
    positions: bool = False
    norm_params: int = 1
    fused_qkv: bool = True
    uneven_stages: bool = False
    ends_on_every_stage: bool = False
    attention: Literal["flash", "naive"] = "flash"
    dropout: bool = False
    precision: Any = "mixed"
    optimizer: str = "adam"
    remat: Remat = "auto"
    logits_bytes: int = 4
    input_bytes_per_token: int = 12

    def __post_init__(self):
        checked_fields(self, _TRANSFORMER_SIZES, where="Transformer ", optional=_DEFAULTS)
        if self.head_dim is None and self.d_model % self.heads:
            raise ShardkitValueError(
                f"Transformer heads={self.heads} does not divide d_model={self.d_model}; "
                "fix: pass head_dim= explicitly or pick heads from d_model's divisors."
            )
        if self.heads % self.kv:
            raise ShardkitValueError(
                f"Transformer kv_heads={self.kv_heads} does not divide heads={self.heads}; "
                "fix: kv_heads must divide heads (grouped-query attention)."
            )
        check_remat(self.remat, "Transformer ")
        if self.attention not in ("flash", "naive"):
            raise ShardkitValueError(
                f"Transformer attention={self.attention!r}; fix: 'flash' or 'naive'."
            )
        get_precision(self.precision)
        optimizer_bytes(self.optimizer)

    # -- sizes ------------------------------------------------------------------------------
    @property
    def ff(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def kv(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def hd(self) -> int:
        return self.d_model // self.heads if self.head_dim is None else self.head_dim

    @property
    def q_width(self) -> int:
        """Width of the query projection (heads x head_dim)."""
        return self.heads * self.hd

    @property
    def kv_width(self) -> int:
        return self.kv * self.hd

    def layer_matmul_params(self) -> int:
        """Matmul parameters per block: q, k, v, out, and 2 or 3 MLP matrices."""
        h = self.d_model
        attn = h * (2 * self.q_width + 2 * self.kv_width)
        mlp = (3 if self.gated else 2) * h * self.ff
        return attn + mlp

    @property
    def norms(self) -> int:
        """Norms per block: 1 for a parallel block, else 2."""
        return 1 if self.parallel_block else 2

    def layer_params(self) -> int:
        """Parameters per block (matmuls + norms)."""
        return self.layer_matmul_params() + self.norms * self.norm_params * self.d_model

    def embedding_params(self) -> int:
        """Token table (+ position table when learned)."""
        return self.vocab * self.d_model + (self.seq * self.d_model if self.positions else 0)

    def head_params(self) -> int:
        """Final norm + output head (0 for the head when tied)."""
        return self.norm_params * self.d_model + (0 if self.tied else self.d_model * self.vocab)

    def n_params(self) -> int:
        """Total parameters (Ψ)."""
        return self.layers * self.layer_params() + self.embedding_params() + self.head_params()

    def largest_layer_params(self) -> int:
        """Largest single parameter group: a block or the embedding table."""
        return max(self.layer_params(), self.vocab * self.d_model)

    @property
    def tokens(self) -> int:
        """Tokens per optimizer step (batch x seq)."""
        return self.batch * self.seq

    def model_flops_per_token(self) -> float:
        """Model FLOPs per token, the numerator of MFU (PaLM, arXiv:2204.02311, App. B).

        6 x matmul parameters (blocks and output head; the embedding lookup is no matmul) +
        12 x L x s x (heads x head_dim) for attention scores and values, no causal discount.
        """
        matmul = self.layers * self.layer_matmul_params() + self.d_model * self.vocab
        return 6.0 * matmul + 12.0 * self.layers * self.seq * self.q_width

    def replace(self, **changes) -> Transformer:
        """A copy with some fields changed, e.g. `replace(batch=512, remat="block")`."""
        return dataclasses.replace(self, **changes)

    # -- constructors ---------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **changes) -> Transformer | Dense:
        """A published model by name (see the module docstring), with fields overridden.

        Raises:
            ValueError: for an unknown name (the message lists the presets).
        """
        return preset(name, **changes)

    @classmethod
    def gpt2_1_5b(cls, **changes) -> Transformer:
        """GPT-2 XL, 1.5B parameters (see the module docstring)."""
        return preset("gpt2-1.5b", **changes)

    @classmethod
    def gpt3_175b(cls, **changes) -> Transformer:
        """GPT-3, 175B parameters, batch 1536 x 2048 tokens."""
        return preset("gpt3-175b", **changes)

    @classmethod
    def llama3_8b(cls, **changes) -> Transformer:
        """Llama 3 8B (GQA, SwiGLU, 8k sequences)."""
        return preset("llama3-8b", **changes)

    @classmethod
    def llama3_70b(cls, **changes) -> Transformer:
        """Llama 3 70B."""
        return preset("llama3-70b", **changes)

    @classmethod
    def llama3_405b(cls, **changes) -> Transformer:
        """Llama 3 405B."""
        return preset("llama3-405b", **changes)

    @classmethod
    def from_gpt_config(cls, cfg: Any, *, batch: int = 8, **changes) -> Transformer:
        """The workload of a shardkit `GPTConfig` trained by shardkit's `Trainer`.

        Learned positions, untied head, RMS norms with a scale only, separate q/k/v kernels, an
        unfused loss, naive attention, and the Trainer's mixed precision ("shardkit": fp32
        weights and Adam moments, bf16 compute).

        Example:
            >>> from shardkit.models import GPTConfig
            >>> cfg = GPTConfig(vocab=64, d_model=64, n_layers=2, n_heads=4, seq_len=16)
            >>> Transformer.from_gpt_config(cfg).n_params() == cfg.n_params()
            True
        """
        kw: dict[str, Any] = dict(
            name="gpt",
            layers=cfg.n_layers,
            d_model=cfg.d_model,
            heads=cfg.n_heads,
            vocab=cfg.vocab,
            seq=cfg.seq_len,
            d_ff=cfg.ff,
            positions=True,
            tied=False,
            norm_params=1,
            attention="naive",
            fused_qkv=True,  # q/k/v stacked into one contraction (one backward all-reduce)
            precision="shardkit",
            remat=cfg.remat,
            logits_bytes=24,
            batch=batch,
            ends_on_every_stage=True,
        )
        kw.update(changes)
        return cls(**kw)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Dense:
    """A generic model described by totals: parameters, FLOPs and activations per example.

    Only data and FSDP parallelism are planned for it (no tensor or pipeline split).

    Attributes:
        name: label.
        params: parameter count.
        flops_per_example: training FLOPs per example (forward + backward, ~3 x forward).
        activation_bytes_per_example: activations kept for the backward pass per example.
        batch: global batch in examples.
        largest_layer_params: largest single layer (for ZeRO-3 gather buffers).
        layers: parameter tensors gathered one at a time under ZeRO-3 (one collective each).
        input_bytes_per_example: bytes of one example's input.
        precision: see `Transformer`.
        optimizer: see `Transformer`.

    Raises:
        ValueError: when params, batch or layers is not a positive int, flops_per_example
            not a finite number > 0, a byte count or largest_layer_params below 0 (or not
            finite), or the precision, optimizer or remat unknown.
    """

    name: str = "dense"
    params: int
    flops_per_example: float
    activation_bytes_per_example: float
    batch: int = 256
    largest_layer_params: int = 0
    layers: int = 1
    input_bytes_per_example: float = 0.0
    precision: Any = "mixed"
    optimizer: str = "adam"
    remat: Remat = "none"

    def __post_init__(self):
        checked_fields(self, _DENSE_SIZES, where=f"Dense {self.name!r}: ")
        check_remat(self.remat, f"Dense {self.name!r}: ")
        get_precision(self.precision)
        optimizer_bytes(self.optimizer)

    def n_params(self) -> int:
        return self.params

    def model_flops_per_example(self) -> float:
        return self.flops_per_example

    def replace(self, **changes) -> Dense:
        return dataclasses.replace(self, **changes)


_LLAMA = dict(gated=True, norm_params=1, vocab=128256, seq=8192, kv_heads=8, batch=1024)

_PRESETS: dict[str, Any] = {
    "gpt2-1.5b": lambda: Transformer(
        name="gpt2-1.5b", layers=48, d_model=1600, heads=25, d_ff=6400, vocab=50257,
        seq=1024, batch=512, positions=True, tied=True, norm_params=2),
    "gpt3-175b": lambda: Transformer(
        name="gpt3-175b", layers=96, d_model=12288, heads=96, d_ff=49152, vocab=50257,
        seq=2048, batch=1536, positions=True, tied=True, norm_params=2),
    "llama3-8b": lambda: Transformer(
        name="llama3-8b", layers=32, d_model=4096, heads=32, d_ff=14336, **_LLAMA),
    "llama3-70b": lambda: Transformer(
        name="llama3-70b", layers=80, d_model=8192, heads=64, d_ff=28672, **_LLAMA),
    "llama3-405b": lambda: Transformer(
        name="llama3-405b", layers=126, d_model=16384, heads=128, d_ff=53248, **_LLAMA),
    "resnet50": lambda: Dense(
        name="resnet50", params=25_557_032, flops_per_example=3 * 8.2e9,
        activation_bytes_per_example=54e6, largest_layer_params=2_359_296, layers=54,
        input_bytes_per_example=224 * 224 * 3 * 2, batch=256),
}  # fmt: skip


def presets() -> list[str]:
    """Names of the built-in workloads."""
    return sorted(_PRESETS)


def preset(name: str, **changes) -> Transformer | Dense:
    """The preset workload `name` with `changes` applied (e.g. `batch=64`).

    Raises:
        ValueError: for an unknown name; the message lists the presets.

    Example:
        >>> preset("llama3-8b", batch=8).tokens
        65536
    """
    key = name.strip().lower().replace("_", "-")
    if key not in _PRESETS:
        raise ShardkitValueError(
            f"unknown model {name!r}; presets: {', '.join(presets())}; fix: pass one of those "
            "or a shardkit.plan.Transformer(layers=..., d_model=..., ...)."
        )
    base = _PRESETS[key]()
    fields = {f.name for f in dataclasses.fields(base)}
    unknown = sorted(set(changes) - fields)
    if unknown:
        raise ShardkitValueError(
            f"model {name!r} ({type(base).__name__}) has no setting {', '.join(unknown)}; fix: "
            f"leave {'them' if len(unknown) > 1 else 'it'} out, or set one of "
            f"{', '.join(sorted(fields))}."
        )
    return base.replace(**changes) if changes else base
