"""The pipelined loss and gradients of a `Trainer` step (strategies with a "stage" degree).

The model cuts itself with `pipeline_stages(n)` (a `shardkit.models.StagedModel`): the
embedding runs in front of the pipeline under `jax.vjp`, the stacked layers run as `n` stages
under `shardkit.pipeline.pipeline_value_and_grad` with the strategy's schedule and micro-batches,
and the head and loss run as the last part. The embedding's gradient comes from the pipeline's
input cotangent. Parameters and gradients keep the canonical layout (stacked layers whole,
split over "stage"), so optimizer state and checkpoints do not depend on the stage count.

The pipelined loss is the mean of the micro-batch losses (each averaged over its data shards),
as `grad_accum` gives without a pipeline; for the masked cross-entropy it equals the full-batch
loss when every sequence holds the same number of unmasked tokens (true for the reversal task
and token files).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AbstractMesh

from shardkit.errors import ShardkitValueError
from shardkit.pipeline import spmd
from shardkit.pipeline.engine import pipeline_value_and_grad


def pipeline_of(trainer) -> Any:
    """The strategy's `Pipeline` when it has stages > 1 (None otherwise), checked for `trainer`.

    Raises:
        ValueError: when grad_accum > 1, the model has no `pipeline_stages`, its layers do
            not split into the stages, the loss is not the one the model's last stage
            computes, or bfloat16 with a tensor axis on CPU (XLA:CPU aborts compiling it);
            each names the fix. (A mesh without a matching "stage" axis fails earlier, in
            `strategy.bind`.)
    """
    pipe = trainer.bound.pipeline  # the mesh's "stage" axis was checked when bound
    if pipe is None:
        return None
    sizes = trainer.bound.axis_sizes
    if trainer.grad_accum > 1:
        raise ShardkitValueError(
            f"grad_accum={trainer.grad_accum} with Pipeline(stages={pipe.stages}): the pipeline "
            "already splits the batch into micro-batches; fix: grad_accum=1 and "
            f"Pipeline(microbatches={pipe.microbatches * trainer.grad_accum})."
        )
    mesh = trainer.mesh  # an AbstractMesh has no devices: it compiles for the default backend
    platform = (
        jax.default_backend() if isinstance(mesh, AbstractMesh) else mesh.devices.flat[0].platform
    )
    if trainer.compute_dtype == "bfloat16" and sizes.get("tensor", 1) > 1 and platform == "cpu":
        # XLA:CPU's bf16 all-reduce promotion aborts the process ("Invalid binary instruction
        # opcode copy") on the tensor all-reduces inside the pipeline's switch branches.
        raise ShardkitValueError(
            f"bfloat16 with Pipeline(stages={pipe.stages}) and tensor={sizes['tensor']} does not "
            "compile on XLA's CPU backend (it aborts in its bf16 all-reduce pass); fix: "
            "--precision float32 on CPU, or drop the tensor axis (e.g. --mesh "
            f"data={sizes.get('data', 1) * sizes['tensor']},stage={pipe.stages})."
        )
    _probe(trainer, pipe)
    return pipe


def _probe(trainer, pipe) -> None:
    """Builds the staged model once on abstract parameters to check it before compiling."""
    if trainer.graphdef is None:
        raise ShardkitValueError(
            "pipeline stages need a Flax NNX model with a `pipeline_stages(n)` method (like "
            "shardkit.models.GPT), not a plain parameter pytree; fix: train a GPT, or drop the "
            "'stage' axis from the strategy."
        )
    found = {}

    def build(params):
        model = nnx.merge(trainer.graphdef, params)
        if not hasattr(model, "pipeline_stages"):
            raise ShardkitValueError(
                f"{type(model).__name__} has no `pipeline_stages(n)` method, so it cannot be "
                "cut into pipeline stages; fix: use shardkit.models.GPT or add the method "
                "(see shardkit.models.StagedModel), or drop the 'stage' axis."
            )
        n_layers = getattr(getattr(model, "cfg", None), "n_layers", None)
        if n_layers is not None:
            pipe.check_layers(n_layers, what=f"{type(model).__name__}(n_layers={n_layers})")
            pipe.schedule.check(pipe.stages, pipe.microbatches, layers=n_layers)
        found["staged"] = model.pipeline_stages(pipe.n_stages)
        return jnp.zeros(())

    jax.eval_shape(build, trainer.abstract_params)
    staged = found["staged"]
    if trainer.loss_fn is not staged.loss_fn:
        name = getattr(staged.loss_fn, "__name__", repr(staged.loss_fn))
        raise ShardkitValueError(
            f"with pipeline stages the last stage computes {name}, but the Trainer was given "
            f"loss_fn={getattr(trainer.loss_fn, '__name__', trainer.loss_fn)!r}; fix: pass "
            f"loss_fn={name}, or drop the 'stage' axis to train with another loss."
        )


def pipeline_loss_and_grads(trainer, params: Any, batch: dict) -> tuple[jax.Array, Any]:
    """(loss, gradients in the canonical layout) of one pipelined step; call under `jit`.

    Args:
        trainer: a `Trainer` whose `pipeline` is set.
        params: canonical float32 parameters (a pure dict).
        batch: a batch placed by `trainer.place_batch`: leaves (microbatches, mb, ...).
    """
    pipe = trainer.pipeline
    dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[trainer.compute_dtype]
    cparams = jax.tree.map(lambda p: p.astype(dtype) if p.dtype == jnp.float32 else p, params)
    staged = nnx.merge(trainer.graphdef, cparams).pipeline_stages(pipe.n_stages)
    front, stages, last = staged.split(cparams)
    inputs = batch[staged.input_key]  # (m, mb, ...)
    target = {k: v for k, v in batch.items() if k != staged.input_key}
    front_specs = {k: trainer.param_specs[k] for k in front}
    data_axes = trainer.bound.batch_axes
    first = _front(staged.first_fn, trainer.mesh, front_specs, data_axes)
    xs, first_vjp = jax.vjp(lambda f: first(f, inputs), front)  # (m, mb, T, D)
    run = pipeline_value_and_grad(
        staged.stage_fn,
        staged.last_fn,
        mesh=trainer.mesh,
        schedule=pipe.schedule,
        microbatches=pipe.microbatches,
        data_axes=data_axes,
        residuals=pipe.residuals,
    )
    loss, (g_stages, g_last, g_xs) = run(stages, last, xs, target)
    (g_front,) = first_vjp(g_xs.astype(xs.dtype))
    return loss.astype(jnp.float32), staged.merge(g_front, g_stages, g_last)


def _front(first_fn: Callable, mesh: Any, specs: Any, data_axes: tuple[str, ...]) -> Callable:
    """``(front, inputs) -> xs``: `first_fn` on every micro-batch, each device on its own rows.

    One `jax.shard_map` manual over every mesh axis: each front parameter is all-gathered
    whole from its layout (`specs`, a tree of `PartitionSpec` like `front`; a vocab-parallel
    embedding table from its "tensor" pieces, one all-gather per step), and each device embeds
    its data shard of the (m, mb, ...) inputs. Left to the compiler, a gather from a table
    split over "tensor" moves the table to the replicated "stage" axis (a collective-permute)
    and sums the lookups over "stage" (an all-reduce of all m micro-batches' activations), and
    the scatter-add of the backward moves the gradient back (another permute). Here the
    backward is the gather's transpose, a local slice of the table's gradient to each device's
    piece, then the data-parallel sum every parameter gradient has. `first_fn` must treat
    examples independently (an embedding does).
    """
    from jax.sharding import PartitionSpec as P

    manual = tuple(mesh.axis_names)
    dspec = data_axes if len(data_axes) > 1 else (data_axes[0] if data_axes else None)
    xspec = P(None, dspec)
    embed = jax.vmap(first_fn, in_axes=(None, 0))  # per micro-batch

    def per_leaf(fn, front):
        return jax.tree.map(fn, specs, front, is_leaf=lambda x: isinstance(x, P))

    def local(front, inputs):
        # varying over the data axes before the gather, so that the transpose slices the
        # gradient to this device's piece first and sums only the piece over data
        whole = per_leaf(lambda s, a: spmd.gather(spmd.vary(a, data_axes), s), front)
        return embed(whole, inputs)

    def run(front, inputs):
        front = per_leaf(lambda s, a: spmd.place(a, mesh, dict(enumerate(s)), manual), front)
        inputs = jax.tree.map(lambda a: spmd.place(a, mesh, {0: None, 1: dspec}, manual), inputs)
        f = jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(specs, xspec),
            out_specs=xspec,
            axis_names=frozenset(manual),
        )
        return f(front, inputs)

    return run
