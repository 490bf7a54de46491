"""`Trainer`: sharded init, a jitted, donated training step, and evaluation (batch placement
in `shardkit.train.batches`).

The state is a `TrainState(step, params, opt_state, model_state)` of plain pytrees (params
as a pure dict for Flax NNX models), so orbax saves it and any mesh can restore it. The model
may be Flax NNX, Flax Linen (`Linen(module, variables)`), Equinox or a parameter pytree (see
`shardkit.train.adapters`); its non-trained state (BatchNorm statistics, Dropout's RNG
streams) is `model_state`, replicated, updated by each step.

Layouts come from a strategy: parameters and optimizer state get the strategy's specs, the
batch its batch spec. Inside the step, parameters are cast to the compute dtype, then laid out
for compute (FSDP's "fsdp" axis removed: an all-gather whose transpose reduce-scatters the
gradients), and gradients are constrained back to the optimizer-state layout before the
optimizer update. On Explicit meshes these layout changes are `jax.sharding.reshard`, on Auto
meshes `with_sharding_constraint`.

With a pipeline degree (`Hybrid(pipeline=Pipeline(stages=p))`, mesh axis "stage"), the step
runs `shardkit.pipeline.pipeline_value_and_grad` over the model's `pipeline_stages` (see
`shardkit.train.pipelined`); the parameters keep their canonical layout, with the stacked
layers split over "stage", so checkpoints restore across a change of stage count.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitValueError
from shardkit.linter import LintReport, lint
from shardkit.placement import constrain_tree
from shardkit.strategies import Auto, Strategy
from shardkit.strategies.core import drop_axis
from shardkit.train.accumulate import (
    accumulate,
    accumulate_per_microbatch,
    per_microbatch_notes,
    unreduced_axes,
)
from shardkit.train.adapters import abstract_model, cast_like, describe_state, split_model
from shardkit.train.arguments import (
    DTYPES,
    batch_key,
    check_arguments,
    check_batch,
    check_seed,
    check_state,
    checked_strategy,
    split_loss,
)
from shardkit.train.batches import BatchPlacement
from shardkit.train.batches import BatchSizeError as BatchSizeError  # re-exported
from shardkit.train.opt_specs import optimizer_state_specs
from shardkit.train.param_layout import indivisible_notes, split_stacked, unannotated_notes
from shardkit.train.pipelined import pipeline_loss_and_grads, pipeline_of


class TrainState(NamedTuple):
    """Training state: step counter, parameters, optimizer state and the model's non-trained
    state (BatchNorm statistics, RNG streams; None when it has none), all sharded arrays."""

    step: jax.Array
    params: Any
    opt_state: Any
    model_state: Any = None


class Trainer(BatchPlacement):
    """Trains a model with a parallelism strategy on a device mesh.

    Args:
        model_fn: `key -> model`; returns an `nnx.Module` (parameters are its `nnx.Param`s,
            axis names read from their metadata, other variables are state),
            `shardkit.train.Linen(module, variables)`, an `equinox.Module`, or a plain
            parameter pytree. Flax's eager sharding is off while it runs.
        optimizer: an optax `GradientTransformation` (schedules welcome).
        loss_fn: `(model, batch) -> loss` or `(loss, metrics dict)`; for plain pytrees `model`
            is the parameter pytree, for Linen a callable running `module.apply`.
        strategy: a strategy from `shardkit.strategies` (default `Auto()`), or its name as
            `shardkit train --strategy` takes it ("dp", "fsdp", "zero1", "tp", "hybrid").
        mesh: a mesh with the strategy's axis names; default `strategy.make_mesh(devices)`.
        devices: devices for the default mesh (default all).
        axis_types: "auto" or "explicit" for the default mesh.
        grad_accum: micro-batches per step; gradients are averaged over them. With pipeline
            stages the strategy's `Pipeline.microbatches` plays this role (keep grad_accum=1).
        compute_dtype: "float32" or "bfloat16" (mixed precision: float32 master weights and
            optimizer state, bfloat16 forward and backward).
        batch_size: global batch size, used by `Auto` to pick divisible degrees.
        nonfinite: None (default), "stop" (the step's metrics carry `grad_norm`, the global
            gradient norm, for the caller to check with the loss) or "skip" (also: a step
            whose loss or gradient norm is NaN/Inf leaves parameters and optimizer state
            unchanged and reports `skipped` = 1).

    Raises:
        TypeError: for an argument of the wrong kind (a model or a dict as `model_fn`, an
            optax function not called, a strategy class not instantiated), each naming the
            argument with a fix; `step` and `evaluate` likewise for a batch not placed with
            `place_batch`, `step` for a state not from `init`.
        ValueError: for a model_fn result that is no model, grad_accum < 1, an unknown dtype
            or a non-scalar loss; with pipeline stages: a model with non-trained state, a
            mesh without "stage", a model without `pipeline_stages`, a layer count the stages
            do not divide, or grad_accum > 1.

    Example:
        >>> import optax
        >>> from flax import nnx
        >>> from shardkit.models import MLP, classification_loss
        >>> from shardkit.strategies import DataParallel
        >>> trainer = Trainer(lambda k: MLP((16, 32, 4), rngs=nnx.Rngs(k)), optax.adam(1e-3),
        ...                   classification_loss, strategy=DataParallel())
        >>> state = trainer.init(0)
        >>> batch = trainer.place_batch({"x": np.ones((8, 16), "f4"), "y": np.zeros(8, "i4")})
        >>> state, metrics = trainer.step(state, batch)

    See also: `shardkit.train.checkpoint`, `shardkit.strategies`.
    """

    def __init__(
        self,
        model_fn: Callable[[jax.Array], Any],
        optimizer: optax.GradientTransformation,
        loss_fn: Callable[..., Any],
        *,
        strategy: Strategy | Auto | None = None,
        mesh: jax.sharding.Mesh | None = None,
        devices: Any = None,
        axis_types: str = "auto",
        grad_accum: int = 1,
        compute_dtype: str = "float32",
        batch_size: int | None = None,
        nonfinite: str | None = None,
    ):
        check_arguments(
            optimizer, loss_fn, mesh=mesh, grad_accum=grad_accum, compute_dtype=compute_dtype,
            batch_size=batch_size, nonfinite=nonfinite,
        )  # fmt: skip
        self.nonfinite = nonfinite
        self.model_fn, self.optimizer, self.loss_fn = model_fn, optimizer, loss_fn
        self.grad_accum, self.compute_dtype = grad_accum, compute_dtype
        # the model's kind (NNX, Linen, Equinox, pytree) splits it into parameters and
        # non-trained state and binds them back for loss_fn inside the step
        model = abstract_model(model_fn)
        self.kind = model.kind
        self.graphdef = getattr(model.kind, "graphdef", None)  # NNX structure, else None
        self.abstract_params, self.logical = model.params, model.logical
        self.abstract_model_state = model.state
        self.strategy_reason = ""
        strategy = checked_strategy(strategy)
        if isinstance(strategy, Auto):  # the planner chooses, as `shardkit train --strategy auto`
            devs = list(devices or jax.devices())
            if mesh is not None:
                devs = list(getattr(mesh, "devices", np.array(devs)).flat)[: mesh.size]
            strategy, self.strategy_reason = strategy.choose(
                self.abstract_params,
                n_devices=mesh.size if mesh is not None else len(devs),
                logical=self.logical,
                batch=batch_size,
                workload=model.config,
                precision=compute_dtype,
                devices=devs,
                mesh=None if mesh is None else dict(mesh.shape),
            )
        self.strategy = strategy
        self.mesh = mesh if mesh is not None else strategy.make_mesh(devices, axis_types=axis_types)
        # the strategy resolved against the mesh once; everything below reads it
        self.bound = bound = strategy.bind(self.mesh)
        self.explicit = bound.explicit
        self.pipeline = pipeline_of(self)  # None unless the strategy has stages > 1
        self.microbatches = self.pipeline.microbatches if self.pipeline else grad_accum
        self.param_specs = bound.param_specs(self.abstract_params, logical=self.logical)
        self._opt_param_specs = bound.opt_state_specs(self.abstract_params, logical=self.logical)
        self._unreduced = unreduced_axes(bound.batch_axes, self.param_specs)
        self.compute_specs = jax.tree.map(
            bound.compute_spec, self.param_specs, is_leaf=lambda x: isinstance(x, P)
        )
        # Stacked (scanned) layers are gathered one layer at a time inside the scan when the
        # model offers a `layer_layout` hook; everything else is gathered up front.
        self._stacked_key, self._upfront_specs, self._layer_specs = split_stacked(
            self.abstract_params, self.logical, self.param_specs, self.compute_specs, bound
        )
        if self.pipeline is not None and self._stacked_key is not None:
            # the non-pipelined forward (evaluate) gathers the stage-split layers up front
            self._upfront_specs = dict(self._upfront_specs)
            self._upfront_specs[self._stacked_key] = jax.tree.map(
                lambda s: P(*(drop_axis(e, "stage") for e in s)),
                self.param_specs[self._stacked_key],
                is_leaf=lambda x: isinstance(x, P),
            )
        self._state_layouts(jax.eval_shape(optimizer.init, self.abstract_params))
        self._compiled: dict = {}
        self._init = None
        self.auto_axes: tuple[str, ...] = ()  # mesh axes the model runs with as Auto
        # what the Trainer decided for this model that is not a problem, for the lint report
        self.notes: list[str] = unannotated_notes(self) + indivisible_notes(self)
        if self.pipeline is None and grad_accum > 1:  # gradients reduced per micro-batch: why
            self.notes += per_microbatch_notes(self._unreduced, bound, self.abstract_model_state)
        # several processes on XLA:CPU: keep at most two steps in flight (see `step`)
        self._bounded_dispatch = jax.process_count() > 1 and jax.default_backend() == "cpu"
        self._in_flight = None
        if batch_size is not None and batch_size % self.batch_divisor():
            self.place_batch({"x": np.zeros((batch_size, 1))})  # raises BatchSizeError

    # -- layouts --------------------------------------------------------------------------
    def _state_layouts(self, abstract_opt) -> None:
        """Optimizer-state and model-state specs, the state's shardings and abstract state."""
        # placed by path and shape, so any optax state works (masked, factored, counters)
        self.opt_specs, self.opt_placement = optimizer_state_specs(
            abstract_opt, self.abstract_params, self._opt_param_specs, dict(self.bound.axis_sizes)
        )
        # non-trained state (BatchNorm statistics, RNG keys and counters) is small: replicated
        self.model_state_specs = jax.tree.map(lambda _: P(), self.abstract_model_state)
        if self.pipeline is not None and self.abstract_model_state is not None:
            raise ShardkitValueError(
                f"the model holds non-trained state ({describe_state(self.abstract_model_state)})"
                ", which pipeline stages do not carry; fix: train it without pipeline stages, "
                "or without BatchNorm / stored RNG streams."
            )
        specs = TrainState(P(), self.param_specs, self.opt_specs, self.model_state_specs)
        self.state_shardings = self._named(specs)
        step = jax.ShapeDtypeStruct((), jnp.int32)
        abstract = TrainState(step, self.abstract_params, abstract_opt, self.abstract_model_state)
        self.abstract_state = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            abstract,
            self.state_shardings,
        )

    def lint(self) -> LintReport:
        """The parameter layouts checked (`shardkit.lint`), with the Trainer's notes and how
        each optimizer-state leaf was placed (`report.optimizer`)."""
        report = lint(self.abstract_params, self.param_specs, self.mesh)
        report.notes = list(self.notes)
        report.optimizer = list(self.opt_placement)
        return report

    def _named(self, specs):
        return jax.tree.map(
            lambda s: NamedSharding(self.mesh, s), specs, is_leaf=lambda x: isinstance(x, P)
        )

    # -- init -----------------------------------------------------------------------------
    def _init_fn(self, key):
        params, model_state = split_model(self.kind, self.model_fn, key)
        return TrainState(
            jnp.zeros((), jnp.int32), params, self.optimizer.init(params), model_state
        )

    def compiled_init(self):
        """The compiled initializer (born sharded via `out_shardings`); see `memory_analysis`."""
        if self._init is None:
            key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
            jitted = jax.jit(self._init_fn, out_shardings=self.state_shardings)
            self._init = jitted.lower(key).compile()
        return self._init

    def init(self, seed: int | jax.Array = 0) -> TrainState:
        """Initializes parameters and optimizer state directly in their sharded layout.

        The same seed gives the same values on every mesh (partitionable threefry).
        """
        return self.compiled_init()(check_seed(seed))

    # -- step -----------------------------------------------------------------------------
    def _constrain(self, tree, specs):
        return constrain_tree(tree, self.mesh, specs)

    def _loss(self, params, batch, model_state=None, *, train=True):
        """(loss, (metrics, model state after the call)) of `loss_fn` on the bound model."""
        dtype = DTYPES[self.compute_dtype]
        params = jax.tree.map(lambda p: p.astype(dtype) if p.dtype == jnp.float32 else p, params)
        params = self._constrain(params, self._upfront_specs)  # FSDP all-gather

        def run(params, batch, model_state):
            model = self.kind.bind(params, model_state, train=train)
            if self._layer_specs is not None and hasattr(model, "layer_layout"):
                model.layer_layout = self._layer_layout
            with self.bound.model_context():  # sequence parallelism, when asked for
                out = self.loss_fn(model, batch)
            loss, metrics = split_loss(out)
            if model_state is not None:
                model_state = cast_like(self.kind.state_of(model), model_state)
            return loss.astype(jnp.float32), dict(metrics), model_state

        if self.auto_axes:  # see `_lowered`: results come back replicated
            run = jax.sharding.auto_axes(run, axes=self.auto_axes, out_sharding=P())
        loss, metrics, model_state = run(params, batch, model_state)
        return loss, (metrics, model_state)

    def _layer_layout(self, layer_state):
        """Per-layer all-gather inside the scan: constrain one layer's weights for compute."""
        leaves, treedef = jax.tree.flatten(layer_state)
        specs = jax.tree.leaves(self._layer_specs, is_leaf=lambda x: isinstance(x, P))
        assert len(leaves) == len(specs), (len(leaves), len(specs))
        return treedef.unflatten(self._constrain(leaves, specs))

    def loss_and_grads(self, params: Any, batch: Mapping[str, Any], model_state: Any = None):
        """(loss, gradients) of `params` on a batch placed with `place_batch`: the value the
        training step applies, pipelined when the strategy has stages (for tests and audits).
        `model_state` is the model's non-trained state (`state.model_state`), if it has any.
        """
        self._check_step_batch(batch, "loss_and_grads")
        key = batch_key("grads", batch)
        if key not in self._compiled:
            self._compiled[key] = self._lowered(
                jax.jit(lambda p, b, m: self._loss_and_grads(p, b, m)[0::2]),
                params, dict(batch), model_state,
            ).compile()  # fmt: skip
        return self._compiled[key](params, dict(batch), model_state)

    def _loss_and_grads(self, params, batch, model_state=None):
        """((loss, metrics), model state after the step, gradients)."""
        if self.pipeline is not None:
            loss, grads = pipeline_loss_and_grads(self, params, batch)
            metrics = {}
        else:
            (loss, (metrics, model_state)), grads = self._accumulated_grads(
                params, batch, model_state
            )
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
        return (loss, metrics), model_state, grads

    def _accumulated_grads(self, params, batch, model_state):
        grad_fn = jax.value_and_grad(self._loss, has_aux=True)
        if self.grad_accum == 1:
            return grad_fn(params, batch, model_state)
        bound = self.bound
        if not self._unreduced or jax.tree.leaves(model_state):  # see `per_microbatch_notes`
            zeros = self._constrain(jax.tree.map(jnp.zeros_like, params), self._opt_param_specs)
            return accumulate_per_microbatch(grad_fn, params, batch, model_state, zeros)
        return accumulate(
            grad_fn, params, batch, axes=self._unreduced, batch_axes=bound.batch_axes,
            sizes=dict(bound.axis_sizes), param_specs=self.param_specs,
            constrain=self._constrain,
        )  # fmt: skip

    def _step_fn(self, state: TrainState, batch):
        (loss, metrics), model_state, grads = self._loss_and_grads(
            state.params, batch, state.model_state
        )
        grads = self._constrain(grads, self._opt_param_specs)
        # value=: the loss, for transformations that take it (optax.contrib.reduce_on_plateau)
        optimizer = optax.with_extra_args_support(self.optimizer)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params, value=loss)
        params = optax.apply_updates(state.params, updates)
        params = self._constrain(params, self.param_specs)
        metrics = {"loss": loss, **metrics}
        if self.nonfinite is not None:
            metrics["grad_norm"] = grad_norm = optax.tree.norm(grads)
            if self.nonfinite == "skip":  # a step with NaN/Inf loss or gradients changes nothing
                ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
                keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
                params = jax.tree.map(keep, params, state.params)
                opt_state = jax.tree.map(keep, opt_state, state.opt_state)
                model_state = jax.tree.map(keep, model_state, state.model_state)
                metrics["skipped"] = (~ok).astype(jnp.int32)
        return TrainState(state.step + 1, params, opt_state, model_state), metrics

    def jit_step(self, batch_shardings: Mapping[str, Any]):
        """The training step under `jax.jit`, as `compile_step` compiles it: state donated,
        state and batch shardings pinned, metrics replicated.

        Args:
            batch_shardings: the sharding of each batch field (e.g. `{"inputs": ...}`).

        Returns:
            ``jitted(state, batch) -> (state, metrics)``; lower it with abstract arguments to
            compile without allocating (as `shardkit.verify.measure_gpt` does).
        """
        return jax.jit(
            self._step_fn,
            in_shardings=(self.state_shardings, dict(batch_shardings)),
            out_shardings=(self.state_shardings, NamedSharding(self.mesh, P())),
            donate_argnums=(0,),
        )

    def compile_step(self, batch: Mapping[str, Any]):
        """Compiles (once per batch shape) and returns the step for batches like `batch`."""
        key = batch_key("step", batch)
        if key not in self._compiled:
            jitted = self.jit_step({k: v.sharding for k, v in batch.items()})
            abstract_batch = {
                k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding)
                for k, v in batch.items()
            }
            self._compiled[key] = self._lowered(jitted, self.abstract_state, abstract_batch)
            self._compiled[key] = self._compiled[key].compile()
        return self._compiled[key]

    def _lowered(self, jitted, *args):
        """`jitted.lower(*args)`. On an Explicit mesh, a model whose code JAX cannot type
        there (a contraction over "tensor" or a scatter without `out_sharding=`, as most
        models written for Auto meshes have) is traced again with "tensor" as an Auto axis
        (`jax.sharding.auto_axes`), and if that is not enough with every axis Auto inside
        `loss_fn`: the compiler then places those collectives; the state keeps its layouts.
        """
        while True:
            try:
                with self._mesh_context():
                    return jitted.lower(*args)
            except Exception as e:  # noqa: BLE001 - JAX's ShardingTypeError has no public name
                axes = self._next_auto_axes() if type(e).__name__ == "ShardingTypeError" else None
                if axes is None:
                    raise
                self.auto_axes = axes
                self.notes.append(
                    f"loss_fn runs with mesh axes {list(axes)} as Auto (jax.sharding.auto_axes):"
                    f" the model does not type-check on the Explicit mesh "
                    f"({str(e).splitlines()[0][:160]}); parameters, optimizer state and batch "
                    "keep their Explicit layouts"
                )
                self._compiled.clear()

    def _next_auto_axes(self) -> tuple[str, ...] | None:
        if not self.explicit:
            return None
        every = tuple(self.mesh.axis_names)
        if not self.auto_axes and self.bound.size("tensor") > 1:
            return ("tensor",)
        return every if self.auto_axes != every else None

    def _check_step_batch(self, batch, method: str) -> None:
        what = "microbatches" if self.pipeline else "grad_accum"
        check_batch(batch, method, micro=self.microbatches, what=what)

    def _mesh_context(self):
        return jax.set_mesh(self.mesh) if self.auto_axes else contextlib.nullcontext()

    def evaluate(self, params: Any, batch: Mapping[str, Any]) -> dict:
        """Loss and metrics on a batch placed with `place_batch(..., for_eval=True)`.

        Args:
            params: the parameters (`state.params`), or the whole `TrainState`, which a model
                with non-trained state (BatchNorm statistics) needs. The model runs in
                evaluation mode (NNX `model.eval()`, Equinox inference mode).
        """
        check_batch(batch, "evaluate")
        model_state = None
        if isinstance(params, TrainState):
            params, model_state = params.params, params.model_state
        elif self.abstract_model_state is not None:
            raise ShardkitValueError(
                "evaluate(params, ...) of a model with non-trained state "
                f"({describe_state(self.abstract_model_state)}); fix: pass the whole state, "
                "trainer.evaluate(state, batch)."
            )
        key = batch_key("eval", batch)
        if key not in self._compiled:
            jitted = jax.jit(
                lambda p, b, m: _merge_metrics(self._loss(p, b, m, train=False)),
                out_shardings=NamedSharding(self.mesh, P()),
            )
            self._compiled[key] = self._lowered(jitted, params, dict(batch), model_state)
            self._compiled[key] = self._compiled[key].compile()
        return self._compiled[key](params, dict(batch), model_state)

    def step(self, state: TrainState, batch: Mapping[str, Any]):
        """Runs one training step; `state` is donated. Returns (new_state, metrics).

        With several processes on CPU (gloo collectives) at most two steps are in flight: the
        call waits for the previous step before returning. Dispatching many steps ahead there
        slows a 2-process x 4-device run from 12 ms to over 2.5 s per step (docs/multihost.md).
        """
        check_state(state, TrainState, "step")
        self._check_step_batch(batch, "step")
        out = self.compile_step(batch)(state, dict(batch))
        if self._bounded_dispatch:
            if self._in_flight is not None:
                jax.block_until_ready(self._in_flight)
            self._in_flight = out[1]
        return out


def _merge_metrics(out):
    loss, (metrics, _) = out
    return {"loss": loss, **metrics}
