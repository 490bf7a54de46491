"""The least traffic a training step of shardkit's GPT needs under a strategy's layout.

`traffic_lower_bound` is what `measure_gpt`'s compiled bytes are held against: bytes each
device sends per step, ring formulas (`shardkit.collectives`), for the layout the strategy
gives the parameters and activations. The terms:

- gradients, summed over the batch-splitting axes ("data", "fsdp") once per step: an
  all-reduce, 2(n-1)/n of the device's parameter bytes (ZeRO-1: a reduce-scatter and an
  all-gather of the updated shards, the same bytes);
- ZeRO-3 (parameters split over "fsdp"): the parameters all-gathered and their gradients
  reduce-scattered once per micro-batch, 2(n-1)/n per micro-batch (a step that keeps whole
  gradients across micro-batches would hold what ZeRO-3 exists not to hold);
- tensor parallelism, per block: two column-parallel regions whose input is gathered (or its
  gradient reduced) and two row-parallel ones whose output is reduced, forward and backward:
  8(n-1)/n of the device's activation (B x T x d_model) per block, with or without sequence
  parallelism (an all-reduce is a reduce-scatter plus an all-gather);
- a vocab-parallel output head: its input gathered and its input gradient reduced,
  2(n-1)/n of an activation;
- a vocab-parallel embedding: its partial rows reduced, 2(n-1)/n of an activation ((n-1)/n
  with sequence parallelism, a reduce-scatter), or the table all-gathered once per micro-batch
  when that is fewer bytes (a small vocabulary): the smaller of the two.

The vocab-parallel loss's per-token reductions (a max and sums over the vocabulary, 1/d_model
of an activation each) are not counted.
"""

from __future__ import annotations

from typing import Any

from shardkit.errors import ShardkitValueError

__all__ = ["traffic_lower_bound"]


def _ring(n: int) -> float:
    return (n - 1) / n


def traffic_lower_bound(
    cfg: Any, strategy: Any, *, devices: int, batch: int, grad_accum: int = 1, itemsize: int = 4
) -> dict[str, float]:
    """Bytes each device must send per training step, by cause, and their "total".

    Args:
        cfg: a `shardkit.models.GPTConfig`.
        strategy: a shardkit strategy without a pipeline.
        devices: mesh size.
        batch: global batch (sequences of `cfg.seq_len` tokens).
        grad_accum: micro-batches per step.
        itemsize: bytes per value of the reduced gradients and the activations (4: float32).

    Returns:
        {"gradients", "parameters", "activations", "total"}: bytes per device per step.

    Raises:
        ValueError: for a pipeline strategy (its stage traffic is not bounded here).

    Example:
        >>> from shardkit.models import GPTConfig
        >>> from shardkit.strategies import DataParallel
        >>> cfg = GPTConfig(vocab=16, d_model=64, n_layers=2, n_heads=4, seq_len=16)
        >>> b = traffic_lower_bound(cfg, DataParallel(), devices=8, batch=16)
        >>> b["total"] == 2 * 7 / 8 * 4 * cfg.n_params()
        True
    """
    axes = strategy.mesh_axes(devices)
    if axes.get("stage", 1) > 1:
        raise ShardkitValueError(
            f"traffic_lower_bound({strategy!r}): a pipeline's stage traffic is not bounded "
            "here; fix: a strategy without pipeline=."
        )
    data, fsdp, t = axes.get("data", 1), axes.get("fsdp", 1), axes.get("tensor", 1)
    d, f, v, layers = cfg.d_model, cfg.ff, cfg.vocab, cfg.n_layers
    vocab_split = t > 1 and v % t == 0
    split = layers * (4 * d * d * (cfg.n_heads % t == 0) + 2 * d * f * (f % t == 0))
    split += 2 * v * d * vocab_split
    local = itemsize * ((cfg.n_params() - split) + split / t)  # parameter bytes per device
    zero3 = fsdp > 1 and getattr(strategy, "zero", 3) == 3
    out = {"gradients": 0.0, "parameters": 0.0, "activations": 0.0}
    if zero3:  # gathered and reduce-scattered over fsdp per micro-batch, summed over data once
        out["parameters"] = grad_accum * _ring(fsdp) * local
        out["gradients"] = grad_accum * _ring(fsdp) * local + 2 * _ring(data) * local / fsdp
    elif data * fsdp > 1:
        out["gradients"] = 2 * _ring(data * fsdp) * local
    if t > 1:
        act = batch // (data * fsdp) * cfg.seq_len * d * itemsize  # the device's whole step
        sp = bool(getattr(strategy, "sequence_parallel", False))
        blocks = 8 * layers * _ring(t) * act
        head = 2 * _ring(t) * act if vocab_split else (_ring(t) * act if sp else 0.0)
        embed = 0.0
        if vocab_split:
            table = grad_accum * _ring(t) * v * d * itemsize
            embed = min((1 if sp else 2) * _ring(t) * act, table)
        out["activations"] = blocks + head + embed
    out["total"] = sum(out.values())
    return out
