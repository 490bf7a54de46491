"""The checks of what a `Trainer` is given: its constructor's arguments, and the state, batch
and seed its methods take. Each error names the argument, says what it got and ends with a fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from shardkit.errors import ShardkitTypeError, ShardkitValueError
from shardkit.strategies import Auto, Strategy, from_name
from shardkit.strategies.parse import NAMES

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def _got(value: Any) -> str:
    """`value` as an error shows it: its name or short repr, and its type."""
    kind = type(value)
    kind = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
    name, text = getattr(value, "__name__", None), repr(value)
    if isinstance(name, str):
        return f"{name} (a {kind})"
    return f"{text} ({kind})" if len(text) <= 60 and not text.startswith("<") else f"a {kind}"


def checked_strategy(strategy: Any) -> Any:
    """The strategy to use: `strategy` itself, `Auto()` for None, or the strategy a name such
    as "fsdp" stands for (`shardkit.strategies.from_name`, as the CLI's `--strategy`)."""
    if strategy is None:
        return Auto()
    if isinstance(strategy, str):
        return from_name(strategy)
    if isinstance(strategy, (Auto, Strategy)) and not isinstance(strategy, type):
        return strategy
    if isinstance(strategy, type):
        raise ShardkitTypeError(
            f"strategy={strategy.__name__} is a class, not a strategy; fix: "
            f"strategy={strategy.__name__}() (with its degrees, if any)."
        )
    raise ShardkitTypeError(
        f"strategy={_got(strategy)} is not a strategy; fix: pass one from "
        f"shardkit.strategies (DataParallel(), FSDP(), TensorParallel(), Hybrid(...), Auto()) "
        f"or a name: {', '.join(NAMES)}."
    )


def check_arguments(
    optimizer: Any,
    loss_fn: Any,
    *,
    mesh: Any,
    grad_accum: Any,
    compute_dtype: Any,
    batch_size: Any,
    nonfinite: Any,
) -> None:
    """Raises for a `Trainer` argument of the wrong kind (the model is checked where it is
    traced, `shardkit.train.adapters.abstract_model`)."""
    if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
        called = callable(optimizer) and not hasattr(optimizer, "init")
        raise ShardkitTypeError(
            f"optimizer={_got(optimizer)} is not an optax GradientTransformation (it has no "
            "init and update); fix: "
            + ("call it, e.g. optax.adam(1e-3)." if called else "pass e.g. optax.adam(1e-3).")
        )
    if not callable(loss_fn):
        raise ShardkitTypeError(
            f"loss_fn={_got(loss_fn)} is not callable; fix: pass a function "
            "(model, batch) -> loss or (loss, metrics dict)."
        )
    if mesh is not None and not isinstance(mesh, (jax.sharding.Mesh, jax.sharding.AbstractMesh)):
        raise ShardkitTypeError(
            f"mesh={_got(mesh)} is not a jax.sharding.Mesh (or AbstractMesh); fix: leave it "
            "out (the strategy makes one), or pass jax.make_mesh(sizes, names) with the "
            "strategy's axis names."
        )
    if isinstance(grad_accum, bool) or not isinstance(grad_accum, int) or grad_accum < 1:
        raise ShardkitValueError(
            f"grad_accum={grad_accum!r} must be an int >= 1; fix: grad_accum=1."
        )
    if compute_dtype not in DTYPES:
        raise ShardkitValueError(
            f"compute_dtype={compute_dtype!r} is not one of {sorted(DTYPES)}; "
            "fix: compute_dtype='bfloat16' for mixed precision."
        )
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer))
        or batch_size < 1
    ):  # fmt: skip
        raise ShardkitValueError(
            f"batch_size={batch_size!r} must be a positive int or None; fix: the global "
            "batch size, e.g. batch_size=64."
        )
    if nonfinite not in (None, "stop", "skip"):
        raise ShardkitValueError(
            f"nonfinite={nonfinite!r} is not None, 'stop' or 'skip'; fix: nonfinite='stop' "
            "(report the gradient norm so the loop can stop) or 'skip' (drop such updates)."
        )


def check_seed(seed: Any) -> jax.Array:
    """The PRNG key of `init`'s `seed`: an int, or a key (`jax.random.key`) used as given."""
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return jax.random.key(int(seed))
    if isinstance(seed, jax.Array) and jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
        return seed
    if isinstance(seed, jax.Array) and seed.shape == (2,) and seed.dtype == jnp.uint32:
        return jax.random.wrap_key_data(seed)  # a raw jax.random.PRNGKey
    raise ShardkitTypeError(
        f"seed={_got(seed)} is neither an int nor a PRNG key; fix: trainer.init(0) or "
        "trainer.init(jax.random.key(0))."
    )


def check_state(state: Any, state_type: type, method: str) -> None:
    """Raises unless `state` is the `TrainState` that `init` (or a step) returned."""
    if not isinstance(state, state_type):
        raise ShardkitTypeError(
            f"trainer.{method}: state is {_got(state)}, not the TrainState trainer.init "
            "returns; fix: state = trainer.init(seed), then state, metrics = "
            "trainer.step(state, batch)."
        )


def check_host_batch(batch: Any) -> None:
    """Raises unless `batch` is a flat dict of arrays with the batch dim first (`place_batch`)."""
    if not isinstance(batch, Mapping):
        raise ShardkitTypeError(
            f"trainer.place_batch: batch is {_got(batch)}, not a dict of arrays; fix: a dict "
            "such as {'x': inputs, 'y': labels}, each with the batch dim first."
        )
    for key, value in batch.items():
        if isinstance(value, Mapping):
            raise ShardkitTypeError(
                f"trainer.place_batch: batch[{key!r}] is a dict; the batch must be a flat dict "
                "of arrays, each with the batch dim first; fix: move its arrays to the top "
                f"level (e.g. batch[{next(iter(value), 'x')!r}]) and read them there in loss_fn."
            )
        if np.ndim(value) == 0:
            raise ShardkitValueError(
                f"trainer.place_batch: batch[{key!r}] is {_got(value)} of shape (), but every "
                "field is split over the devices along its batch dim first; fix: one value per "
                "example (np.full(batch_size, value)), or a constant in loss_fn."
            )


def check_batch(batch: Any, method: str, micro: int = 1, what: str = "grad_accum") -> None:
    """Raises unless `batch` is a dict of arrays already on the mesh (`place_batch`), stacked
    in `micro` micro-batches (`what`: the option that asks for them) when `micro` > 1."""
    if not isinstance(batch, Mapping):
        raise ShardkitTypeError(
            f"trainer.{method}: batch is {_got(batch)}, not a dict of arrays; fix: a dict "
            "such as {'x': inputs, 'y': labels}, placed with trainer.place_batch(batch)."
        )
    for key, value in batch.items():
        if not isinstance(value, jax.Array):
            raise ShardkitTypeError(
                f"trainer.{method}: batch[{key!r}] is {_got(value)} of shape "
                f"{np.shape(value)}, not an array on the mesh; fix: "
                f"batch = trainer.place_batch(batch{', for_eval=True' * (method == 'evaluate')}) "
                "before the call."
            )
        if micro > 1 and (value.ndim < 2 or value.shape[0] != micro):
            raise ShardkitValueError(
                f"trainer.{method}: batch[{key!r}] has shape {value.shape}, but with "
                f"{what}={micro} it must be stacked as [{micro} micro-batches, rows, ...] (a "
                "batch placed with for_eval=True is not); fix: batch = trainer.place_batch(batch)."
            )


def batch_key(tag: str, batch: Mapping[str, Any]) -> tuple:
    """The key of the program compiled for `batch`: each field's shape, dtype and sharding."""
    return (tag,) + tuple(  # the keys are distinct, so sorting never compares the rest
        sorted((k, np.shape(v), v.dtype, v.sharding) for k, v in batch.items())
    )


def split_loss(out: Any) -> tuple[Any, Any]:
    """`loss_fn`'s result as (loss, metrics): a scalar loss, or a pair of it and a dict of
    metrics; raises, while the step is traced, for anything else."""
    if isinstance(out, tuple) and len(out) != 2:
        raise ShardkitValueError(
            f"loss_fn returned a tuple of {len(out)} items; it must return the loss, or "
            "(loss, metrics dict); fix: return loss, {'accuracy': acc}."
        )
    loss, metrics = out if isinstance(out, tuple) else (out, {})
    check_loss(loss, metrics)
    return loss, metrics


def check_loss(loss: Any, metrics: Any) -> None:
    """Raises for a `loss_fn` result that is not a scalar loss and a dict of metrics."""
    if np.ndim(loss) != 0:
        raise ShardkitValueError(
            f"loss_fn returned a loss of shape {np.shape(loss)}, not a scalar; fix: reduce "
            "it in loss_fn, e.g. return jnp.mean(losses)."
        )
    if not isinstance(metrics, Mapping):
        raise ShardkitTypeError(
            f"loss_fn returned (loss, {type(metrics).__name__}); the second item must be a "
            "dict of metrics; fix: return loss, {'accuracy': acc}, or the loss alone."
        )
