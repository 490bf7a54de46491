"""Gradient accumulation over micro-batches, with one gradient reduction per step.

A step with ``grad_accum = M`` scans over M micro-batches. Left to the compiler, the gradients
of each micro-batch are summed over the batch-split mesh axes as they are produced: M
all-reduces (or reduce-scatters) per step where one suffices. `accumulate` keeps them
*unreduced* instead: the micro-batch is viewed as S shards, one per device group along the
batch axes the parameters are not split over (``data``; ``fsdp`` too under ZeRO-1), each
shard's gradient is taken under `jax.vmap` with ``spmd_axis_name`` so it stays on its own
devices, and the S partial sums are added once, after the last micro-batch: one all-reduce
(ZeRO-1: one reduce-scatter) per step.

The step's loss is then the mean of per-shard losses, as under PyTorch DDP or torchtitan's
gradient accumulation: the same value as the global micro-batch's loss whenever `loss_fn`
is a mean over examples (the shards hold equally many) — the mean over micro-batches already
works this way. Two cases keep one reduction per micro-batch (`per_microbatch_notes` says
which):

- a model with non-trained state (BatchNorm statistics, stored RNG streams): its state flows
  from one micro-batch to the next over the whole micro-batch;
- parameters split over every batch axis (ZeRO-3 without a ``data`` axis): the accumulator
  would hold whole gradients on every device, which FSDP exists to avoid; the gradients are
  reduce-scattered per micro-batch, as the parameters are gathered per micro-batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from shardkit.placement import sequence_batch

__all__ = ["accumulate", "accumulate_per_microbatch", "per_microbatch_notes", "unreduced_axes"]


def unreduced_axes(batch_axes: tuple[str, ...], param_specs: Any) -> tuple[str, ...]:
    """The batch axes no parameter is split over: gradients may stay unreduced along them."""
    used = set()
    for spec in jax.tree.leaves(param_specs, is_leaf=lambda x: isinstance(x, P)):
        for entry in spec:
            used.update(entry if isinstance(entry, tuple) else (entry,))
    return tuple(a for a in batch_axes if a not in used)


def per_microbatch_notes(axes: tuple[str, ...], bound: Any, model_state: Any) -> list[str]:
    """Why a step reduces gradients once per micro-batch; empty when it reduces them once (or
    never: no mesh axis of `bound`, the bound strategy, splits the batch)."""
    if not bound.batch_axes:
        return []
    if jax.tree.leaves(model_state):
        return [
            "gradients are reduced once per micro-batch: the model carries non-trained state "
            "(BatchNorm statistics or RNG streams) from one whole micro-batch to the next"
        ]
    if not axes:
        return [
            "gradients are reduce-scattered once per micro-batch: the parameters are split "
            "over every batch axis (ZeRO-3), so an unreduced accumulator would hold whole "
            "gradients on every device; add a data axis to reduce over it once per step"
        ]
    return []


def _entry(axes: tuple[str, ...]) -> str | tuple[str, ...] | None:
    return None if not axes else axes[0] if len(axes) == 1 else axes


def accumulate(
    grad_fn: Callable[..., Any],
    params: Any,
    batch: dict[str, Any],
    *,
    axes: tuple[str, ...],
    batch_axes: tuple[str, ...],
    sizes: dict[str, int],
    param_specs: Any,
    constrain: Callable[[Any, Any], Any],
):
    """((loss, (metrics, None)), gradients) averaged over the micro-batches of `batch`.

    Args:
        grad_fn: ``(params, micro_batch, None) -> ((loss, (metrics, None)), grads)``.
        params: the parameters (their layout is `param_specs`).
        batch: each leaf ``[M, B, ...]``: M micro-batches of B rows split over `batch_axes`.
        axes: the batch axes gradients stay unreduced along (`unreduced_axes`).
        batch_axes: every mesh axis the batch is split over (`axes` first).
        sizes: mesh axis sizes.
        param_specs: the parameters' PartitionSpecs; the accumulator adds a leading shard dim.
        constrain: ``(tree, specs) -> tree`` with sharding constraints applied.
    """
    shards = math.prod(sizes[a] for a in axes)
    rest = tuple(a for a in batch_axes if a not in axes)

    def split(x):  # [M, B, ...] -> [M, S, B / S, ...], shard s on its own devices
        x = x.reshape(x.shape[0], shards, x.shape[1] // shards, *x.shape[2:])
        return constrain(x, P(None, _entry(axes), _entry(rest), *([None] * (x.ndim - 3))))

    # per-shard gradients of the shared parameters: each stays a partial sum on its devices
    per_shard = jax.vmap(grad_fn, in_axes=(None, 0, None), spmd_axis_name=_entry(axes))
    grad_specs = jax.tree.map(
        lambda s: P(_entry(axes), *s), param_specs, is_leaf=lambda x: isinstance(x, P)
    )

    def micro(carry, mb):
        loss, metrics, grads = carry
        with sequence_batch(rest):  # the model's batch dim, per shard: the other batch axes
            (l, (m, _)), g = per_shard(params, mb, None)
        grads = constrain(jax.tree.map(jnp.add, grads, g), grad_specs)
        # each metric and the loss arrive per shard, [S, ...]: summed over the shards only
        sums = jax.tree.map(lambda a, b: a + b.sum(0), (loss, metrics), (l, m))
        return (*sums, grads), None

    first = jax.tree.map(lambda x: x[0], jax.tree.map(split, batch))
    with sequence_batch(rest):
        (_, (m0, _)), g0 = jax.eval_shape(per_shard, params, first, None)
    zeros = lambda t: jax.tree.map(lambda x: jnp.zeros(x.shape[1:], jnp.float32), t)  # noqa: E731
    carry = (
        jnp.zeros((), jnp.float32),
        zeros(m0),
        constrain(jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), g0), grad_specs),
    )
    (loss, metrics, grads), _ = jax.lax.scan(micro, carry, jax.tree.map(split, batch))
    count = batch_len(batch) * shards
    grads = jax.tree.map(lambda g: g.sum(0) / count, grads)  # the one reduction of the step
    loss, metrics = jax.tree.map(lambda x: x / count, (loss, metrics))
    return (loss, (metrics, None)), grads


def batch_len(batch: dict[str, Any]) -> int:
    """The number of micro-batches (leading dim) of a stacked batch."""
    return jax.tree.leaves(batch)[0].shape[0]


def accumulate_per_microbatch(grad_fn, params, batch, model_state, zero_grads):
    """((loss, (metrics, model_state)), gradients) averaged over the micro-batches of `batch`,
    each micro-batch's gradients reduced as they are produced; the model's non-trained state
    flows from one micro-batch to the next. `zero_grads`: zeros in the gradients' layout."""

    def micro(carry, mb):
        loss, metrics, grads, mstate = carry
        (l, (m, mstate)), g = grad_fn(params, mb, mstate)
        loss, metrics, grads = jax.tree.map(jnp.add, (loss, metrics, grads), (l, m, g))
        return (loss, metrics, grads, mstate), None

    first = jax.tree.map(lambda x: x[0], batch)
    (loss, (metrics, _)), _ = jax.tree.map(
        lambda x: jnp.zeros(x.shape, jnp.float32),
        jax.eval_shape(grad_fn, params, first, model_state),
    )
    zero_grads = jax.tree.map(lambda z: z.astype(jnp.float32), zero_grads)
    (loss, metrics, grads, model_state), _ = jax.lax.scan(
        micro, (loss, metrics, zero_grads, model_state), batch
    )
    scale = 1.0 / batch_len(batch)
    loss, metrics, grads = jax.tree.map(lambda x: x * scale, (loss, metrics, grads))
    return (loss, (metrics, model_state)), grads
