"""A GPT decoder in Flax NNX: layers stacked and scanned, logical axis names, remat policies.

The blocks are created with `nnx.vmap` (each parameter gains a leading "layers" axis) and run
with `jax.lax.scan`, so compile time does not grow with depth. Attention projections keep the
head axis separate (q/k/v kernels are (embed, heads, kv), the output kernel (heads, kv, embed))
so tensor parallelism shards heads without reshapes.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
from flax import nnx

from shardkit.errors import ShardkitValueError
from shardkit.models.common import batch_out, param, row_parallel_out
from shardkit.models.stages import StagedModel
from shardkit.overlap import all_gather_matmul, matmul_reduce_scatter
from shardkit.placement import gather_sequence, sequence_out, split_heads, split_sequence

Remat = Literal["none", "block", "dots"]
_REMAT = ("none", "block", "dots")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """Sizes and options of a `GPT`.

    Attributes:
        vocab: number of token ids.
        d_model: residual width ("embed").
        n_layers: number of decoder blocks (stacked on the "layers" axis and scanned).
        n_heads: attention heads ("heads"); must divide d_model.
        d_ff: feed-forward width ("mlp"); defaults to 4 * d_model.
        seq_len: maximum sequence length (learned positions).
        remat: "none" (keep all activations), "block" (recompute each block in the backward
            pass, saving only block inputs) or "dots" (save matmul outputs, recompute the rest).

    Raises:
        ValueError: on a non-positive size, heads that do not divide d_model, or an unknown
            remat policy.
    """

    vocab: int = 16
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int | None = None
    seq_len: int = 16
    remat: Remat = "none"

    def __post_init__(self):
        for name in ("vocab", "d_model", "n_layers", "n_heads", "seq_len"):
            if getattr(self, name) < 1:
                raise ShardkitValueError(
                    f"GPTConfig {name}={getattr(self, name)} must be positive; "
                    f"fix: pass {name}=<a positive int>."
                )
        if self.d_model % self.n_heads:
            raise ShardkitValueError(
                f"GPTConfig n_heads={self.n_heads} does not divide d_model={self.d_model}; "
                f"fix: pick n_heads from the divisors of {self.d_model}."
            )
        if self.remat not in _REMAT:
            raise ShardkitValueError(
                f"GPTConfig remat={self.remat!r} is not one of {_REMAT}; fix: remat='block'."
            )

    @property
    def ff(self) -> int:
        return self.d_ff or 4 * self.d_model

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def n_params(self) -> int:
        """Parameter count (embeddings, blocks, final norm, output head)."""
        d, f, v = self.d_model, self.ff, self.vocab
        block = 4 * d * d + 2 * d * f + 2 * d
        return v * d + self.seq_len * d + self.n_layers * block + d + d * v

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 x matmul parameters + attention (scaling-book)."""
        d, f = self.d_model, self.ff
        matmul = self.n_layers * (4 * d * d + 2 * d * f) + d * self.vocab
        attention = self.n_layers * 6 * self.seq_len * d  # 12 * T * d / 2 for causal
        return 6.0 * matmul + attention


def _norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    return (x32 * jax.lax.rsqrt(var + 1e-6)).astype(x.dtype) * scale.astype(x.dtype)


class Block(nnx.Module):
    """One pre-norm decoder block: causal self-attention then a GELU MLP."""

    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        d, h, k, f = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.ff
        init = nnx.initializers.normal(0.02)
        out_init = nnx.initializers.normal(0.02 / (2 * cfg.n_layers) ** 0.5)
        ones = nnx.initializers.ones
        self.norm1 = param(ones, rngs.params(), (d,), ("embed",))
        self.q = param(init, rngs.params(), (d, h, k), ("embed", "heads", "kv"))
        self.k = param(init, rngs.params(), (d, h, k), ("embed", "heads", "kv"))
        self.v = param(init, rngs.params(), (d, h, k), ("embed", "heads", "kv"))
        self.out = param(out_init, rngs.params(), (h, k, d), ("heads", "kv", "embed"))
        self.norm2 = param(ones, rngs.params(), (d,), ("embed",))
        self.up = param(init, rngs.params(), (d, f), ("embed", "mlp"))
        self.down = param(out_init, rngs.params(), (f, d), ("mlp", "embed"))

    def __call__(self, x: jax.Array) -> jax.Array:  # x: (B, T, D)
        dt = x.dtype
        w = lambda p: p[...].astype(dt)
        # under sequence parallelism the residual stream and the norms run on sequence slices
        x = split_sequence(x)
        # q, k, v: (B, T, H, K) column-parallel, as one contraction over the stacked weights,
        # so the backward pass sums the three input gradients before its one tensor
        # all-reduce (three separate ones would each be reduced); `all_gather_matmul` gathers
        # the sequence first (overlapped with the products under collective matmul) and
        # `split_heads` pins the heads split under sequence parallelism (no-ops otherwise)
        qkv = all_gather_matmul(
            "btd,cdhk->cbthk",
            _norm(x, self.norm1[...]),
            jnp.stack([w(self.q), w(self.k), w(self.v)]),
            split=2,
        )
        q, k, v = (split_heads(qkv[i], 2) for i in range(3))
        t = x.shape[1]
        scores = jnp.einsum("bthk,bshk->bhts", q, k) / jnp.sqrt(q.shape[-1]).astype(dt)
        causal = jnp.tril(jnp.ones((t, t), dtype=bool))
        scores = jnp.where(causal, scores.astype(jnp.float32), -1e30)
        probs = jax.nn.softmax(scores, axis=-1).astype(dt)  # (B, H, T, S)
        att = split_heads(jnp.einsum("bhts,bshk->bthk", probs, v), 2)
        out = matmul_reduce_scatter(
            "bthk,hkd->btd", att, w(self.out), split=0, out_sharding=_heads_out(att)
        )
        x = split_sequence(x + out)  # row-parallel: partial sums reduced over the tensor axis
        h = _norm(x, self.norm2[...])
        u = jax.nn.gelu(all_gather_matmul("btd,df->btf", h, w(self.up), split=1))
        u = split_heads(u, 2)  # (B, T, F)
        down = matmul_reduce_scatter(
            "btf,fd->btd", u, w(self.down), split=0, out_sharding=row_parallel_out(u, 3)
        )
        return split_sequence(x + down)


def _heads_out(att: jax.Array):
    # att is (B, T, H, K): the contracted heads axis is dim 2, not the last one.
    spec = getattr(jax.typeof(att).sharding, "spec", None)
    if spec is None or len(spec) < 3 or spec[2] is None:
        return None
    return sequence_out(att, 3) or batch_out(att, 3)


class GPT(nnx.Module):
    """Decoder-only transformer with scanned, stacked blocks and logical axis names.

    Args:
        cfg: a `GPTConfig`.
        rngs: Flax random streams for initialisation.

    Example:
        >>> model = GPT(GPTConfig(vocab=16, d_model=32, n_layers=2, n_heads=2, seq_len=8),
        ...             rngs=nnx.Rngs(0))
        >>> model(jnp.zeros((3, 8), jnp.int32)).shape
        (3, 8, 16)

    See also: `lm_loss`, `shardkit.strategies`.
    """

    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        init = nnx.initializers.normal(0.02)
        self.embedding = param(init, rngs.params(), (cfg.vocab, cfg.d_model), ("vocab", "embed"))
        self.position = param(init, rngs.params(), (cfg.seq_len, cfg.d_model), (None, "embed"))

        @nnx.split_rngs(splits=cfg.n_layers)
        @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
        def make_blocks(rngs: nnx.Rngs) -> Block:
            return Block(cfg, rngs=rngs)

        self.blocks = make_blocks(rngs)
        self.norm = param(nnx.initializers.ones, rngs.params(), (cfg.d_model,), ("embed",))
        self.head = param(init, rngs.params(), (cfg.d_model, cfg.vocab), ("embed", "vocab"))
        # Optional `layer_state -> layer_state` applied to each layer's weights inside the scan;
        # a trainer sets it to all-gather FSDP-split weights one layer at a time (ZeRO-3).
        self.layer_layout = None

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Returns logits (B, T, vocab) in float32 for integer `tokens` (B, T).

        Computation runs in the parameters' dtype (cast them to bfloat16 for mixed precision).
        """
        t = tokens.shape[1]
        if t > self.cfg.seq_len:
            raise ShardkitValueError(
                f"GPT tokens have length {t} > seq_len={self.cfg.seq_len}; "
                f"fix: build the model with GPTConfig(seq_len={t}) or shorten the batch."
            )
        x = embed(self.embedding[...], self.position[...], tokens)
        graphdef, stacked = nnx.split(self.blocks)
        x = run_blocks(graphdef, stacked, x, remat=self.cfg.remat, layout=self.layer_layout)
        return head_logits(x, self.norm[...], self.head[...])

    def pipeline_stages(self, n_stages: int):
        """This model cut into `n_stages` pipeline stages (a `shardkit.models.StagedModel`).

        The embedding runs in front of the pipeline, each stage scans `n_layers / n_stages`
        consecutive blocks, and the last part is the final norm, the head and `lm_loss`'s
        masked cross-entropy of one micro-batch.

        Raises:
            ValueError: if `n_stages` does not divide `n_layers`.
        """
        cfg = self.cfg
        if n_stages < 1 or cfg.n_layers % n_stages:
            raise ShardkitValueError(
                f"GPT n_layers={cfg.n_layers} does not split into {n_stages} pipeline stages; "
                f"fix: use n_layers a multiple of {n_stages} (e.g. --layers "
                f"{n_stages * max(1, cfg.n_layers // max(n_stages, 1))}) or a stage count "
                f"from {[d for d in range(1, cfg.n_layers + 1) if cfg.n_layers % d == 0]}."
            )
        graphdef, _ = nnx.split(self.blocks)
        remat, layout = cfg.remat, self.layer_layout

        def first_fn(front, tokens):  # (mb, T) -> (mb, T, D)
            return embed(front["embedding"], front["position"], tokens)

        def stage_fn(stacked, x):  # x: (mb, T, D)
            return run_blocks(graphdef, stacked, x, remat=remat, layout=layout)

        def last_fn(last, y, target):  # y: (mb, T, D); target: {"targets", "mask"}
            return masked_nll(head_logits(y, last["norm"], last["head"]), target)[0]

        return StagedModel(
            n_stages=n_stages,
            stacked="blocks",
            last_keys=("norm", "head"),
            first_fn=first_fn,
            stage_fn=stage_fn,
            last_fn=last_fn,
            loss_fn=lm_loss,
        )


def embed(table: jax.Array, position: jax.Array, tokens: jax.Array) -> jax.Array:
    """Token plus learned position embeddings: (B, T) int -> (B, T, D) in the table's dtype."""
    x = table.at[tokens].get(out_sharding=batch_out(tokens, 3))  # (B, T, D)
    return x + position[: tokens.shape[1]].astype(table.dtype)


def run_blocks(graphdef, stacked, x: jax.Array, *, remat: Remat = "none", layout=None):
    """Runs stacked blocks (leading "layers" axis) over `x` (B, T, D) with `lax.scan`.

    Args:
        graphdef: the `nnx.GraphDef` of the stacked blocks (`nnx.split(model.blocks)[0]`).
        stacked: their state (or pure dict), every leaf with a leading layers axis; any
            number of layers, so a pipeline stage runs a slice of them.
        x: the residual stream.
        remat: the `GPTConfig.remat` policy.
        layout: optional `layer_state -> layer_state` applied per layer (see `GPT`).
    """

    def body(h, layer_state):
        if layout is not None:
            layer_state = layout(layer_state)
        return nnx.merge(graphdef, layer_state)(h), None

    if remat == "block":
        body = jax.checkpoint(body)
    elif remat == "dots":
        body = jax.checkpoint(body, policy=jax.checkpoint_policies.dots_saveable)
    # the scan's carry keeps one layout: the stream's sequence slices under sequence parallelism
    x, _ = jax.lax.scan(body, split_sequence(x), stacked)
    return x


def head_logits(x: jax.Array, norm: jax.Array, head: jax.Array) -> jax.Array:
    """Final norm and output head: (B, T, D) -> float32 logits (B, T, vocab)."""
    x = gather_sequence(_norm(x, norm))
    out = jnp.einsum("btd,dv->btv", x, head.astype(x.dtype))  # vocab-parallel
    return out.astype(jnp.float32)


def lm_loss(model: GPT, batch: dict) -> tuple[jax.Array, dict]:
    """Masked next-token cross-entropy; vocab-parallel safe (no gather on the vocab axis).

    Args:
        model: a `GPT`.
        batch: {"inputs": (B, T) int, "targets": (B, T) int, "mask": (B, T) float}.

    Returns:
        (loss, {"accuracy": masked token accuracy}).
    """
    return masked_nll(model(batch["inputs"]), batch)


def masked_nll(logits: jax.Array, batch: dict) -> tuple[jax.Array, dict]:
    """`lm_loss` from logits (B, T, V): masked mean cross-entropy and accuracy."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    onehot = jax.nn.one_hot(batch["targets"], logits.shape[-1], dtype=logp.dtype)
    nll = -jnp.sum(logp * onehot, axis=-1)  # (B, T)
    mask = batch["mask"].astype(jnp.float32)
    denom = jnp.maximum(mask.sum(), 1.0)
    loss = jnp.sum(nll * mask) / denom
    # the target's log-probability is the one largest (reductions over the vocab, which may
    # be sharded, rather than an argmax); a tie, such as uniform logits, is no prediction
    top = jnp.max(logp, -1, keepdims=True)
    unique = jnp.sum((logp >= top).astype(jnp.int32), -1) == 1
    correct = (jnp.sum(logp * onehot, -1) >= top[..., 0]) & unique
    accuracy = jnp.sum(correct * mask) / denom
    return loss, {"accuracy": accuracy}


__all__ = ["GPT", "Block", "GPTConfig", "lm_loss"]
