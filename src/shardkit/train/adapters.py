"""A user's model, whatever library wrote it, as trained parameters plus non-trained state.

`Trainer` takes `model_fn: key -> model` and `loss_fn(model, batch)`. The model may be:

* a Flax NNX `nnx.Module`: parameters are its `nnx.Param`s; everything else it holds
  (BatchNorm statistics, Dropout's RNG key and counter, any `nnx.Variable`) is non-trained
  state, carried through the step and checkpointed. Built with Flax's eager sharding off, so
  `nnx.with_partitioning` / `nnx.Param(..., sharding=...)` need no mesh context;
* `Linen(module, variables, rngs=...)` for Flax Linen: the `params` collection is trained,
  the other collections (`batch_stats`, ...) and the RNG streams are state; `loss_fn` gets a
  callable that runs `module.apply` with the current variables;
* an Equinox module: its floating-point arrays are trained, its other arrays are state (a
  stateful layer's `eqx.nn.StateIndex`, as in `eqx.nn.BatchNorm`, is refused);
* any other pytree of arrays: the parameters themselves (`loss_fn(params, batch)`).

Trained parameters must be floating-point (or complex): an integer or boolean one is refused
when the `Trainer` is built, with where to keep it instead.

Each kind is a `ModelKind`: `split(model) -> (params, state)` and `bind(params, state) ->
what loss_fn gets`, and `state_of(bound)` the state after loss_fn ran. Typed PRNG keys in the
state are kept as typed arrays (orbax saves them).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

from shardkit.common import path_str
from shardkit.errors import ShardkitTypeError, ShardkitValueError
from shardkit.models.common import logical_axes

try:  # optional: Equinox models are accepted when Equinox is installed
    import equinox as eqx
except ImportError:  # pragma: no cover - equinox is a test dependency
    eqx = None

__all__ = [
    "Abstract",
    "Linen",
    "ModelKind",
    "abstract_model",
    "cast_like",
    "describe_state",
    "kind_of",
    "split_model",
]


# -- Linen ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Linen:
    """A Flax Linen module with its variables, for `Trainer`'s `model_fn`.

    Args:
        module: the `flax.linen.Module`.
        variables: `module.init(...)`'s result. Boxed leaves from
            `nn.with_logical_partitioning` / `nn.with_partitioning` give the axis names.
        rngs: RNG streams `module.apply` needs in training, name -> key (e.g.
            `{"dropout": key}`); each call splits its key, so every step draws new masks.

    In `loss_fn(model, batch)`, `model(*args, **kwargs)` is `module.apply(variables, *args,
    rngs=..., mutable=[the non-params collections], **kwargs)`'s output; the updated
    collections become the new state. `model.variables` are the current variables;
    `model.training` is False in `Trainer.evaluate` (pass it as your module's train flag).

    Example:
        >>> import flax.linen as nn
        >>> module = nn.Dense(4)
        >>> trainer = Trainer(lambda k: Linen(module, module.init(k, np.ones((1, 8)))),
        ...                   optax.adam(1e-3), lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean())
        ... # doctest: +SKIP
    """

    module: Any
    variables: Mapping[str, Any]
    rngs: Mapping[str, jax.Array] | None = None

    def __post_init__(self):
        if "params" not in self.variables:
            raise ShardkitValueError(
                f"Linen(variables=...) has collections {sorted(self.variables)} but no "
                "'params'; fix: pass module.init(key, example_input), whose result holds "
                "'params'."
            )


class _BoundLinen:
    """What `loss_fn` gets for a Linen model: call it like the module."""

    def __init__(self, module, variables, rngs, training):
        self.module, self.variables, self._rngs = module, dict(variables), dict(rngs)
        self.training = training  # False in `Trainer.evaluate`: pass it as your train flag

    def __call__(self, *args, **kwargs):
        keys = {}
        for name, key in self._rngs.items():
            self._rngs[name], keys[name] = jax.random.split(key)
        mutable = [c for c in self.variables if c != "params"]
        # mutable=[] would still make Flax return (out, {}): False returns the output alone
        out = self.module.apply(
            self.variables, *args, rngs=keys, mutable=mutable or False, **kwargs
        )
        if mutable:
            out, updates = out
            self.variables = {**self.variables, **updates}
        return out


# -- kinds ------------------------------------------------------------------------------------
class ModelKind:
    """How one library's model splits into (params, state) and binds back for `loss_fn`."""

    name = "pytree"

    def split(self, model: Any) -> tuple[Any, Any]:
        return model, None

    def bind(self, params: Any, state: Any, *, train: bool = True) -> Any:
        return params

    def state_of(self, bound: Any) -> Any:
        return None

    def logical(self, model: Any) -> tuple[Any, Any]:
        """Axis names per parameter leaf and per state leaf (None where absent)."""
        return None, None


class _NNX(ModelKind):
    name = "nnx"

    def __init__(self, graphdef=None):
        self.graphdef = graphdef

    def split(self, model):
        _, params, rest = nnx.split(model, nnx.Param, ...)
        state = nnx.to_pure_dict(rest)
        return nnx.to_pure_dict(params), (state if jax.tree.leaves(state) else None)

    def bind(self, params, state, *, train=True):
        with nnx.use_eager_sharding(False):
            model = (
                nnx.merge(self.graphdef, params)
                if state is None
                else nnx.merge(self.graphdef, params, state)
            )
        if not train and state is not None:
            model.eval()  # Dropout off, BatchNorm on its running statistics
        return model

    def state_of(self, bound):
        rest = nnx.to_pure_dict(nnx.state(bound, nnx.Not(nnx.Param)))
        return rest if jax.tree.leaves(rest) else None

    def logical(self, model):
        return logical_axes(model), None


class _Linen(ModelKind):
    name = "linen"

    def __init__(self, module=None):
        self.module = module

    def split(self, model: Linen):
        variables = nn.unbox(dict(model.variables))
        state = {k: v for k, v in variables.items() if k != "params"}
        if model.rngs:
            state["rngs"] = dict(model.rngs)
        return variables["params"], (state or None)

    def bind(self, params, state, *, train=True):
        state = dict(state or {})
        rngs = state.pop("rngs", {})
        return _BoundLinen(self.module, {"params": params, **state}, rngs, train)

    def state_of(self, bound: _BoundLinen):
        state = {k: v for k, v in bound.variables.items() if k != "params"}
        if bound._rngs:
            state["rngs"] = dict(bound._rngs)
        return state or None

    def logical(self, model: Linen):
        params = model.variables["params"]
        names = jax.tree.map(
            lambda x: tuple(x.names) if isinstance(x, nn.Partitioned) else None,
            params,
            is_leaf=lambda x: isinstance(x, nn.Partitioned),
        )
        return names, None


class _Equinox(ModelKind):
    name = "equinox"

    def __init__(self, static=None):
        self.static = static

    def split(self, model):
        params, rest = eqx.partition(model, eqx.is_inexact_array)
        state, _ = eqx.partition(rest, eqx.is_array)
        return params, (state if jax.tree.leaves(state) else None)

    def bind(self, params, state, *, train=True):
        model = (
            eqx.combine(params, self.static)
            if state is None
            else eqx.combine(params, state, self.static)
        )
        return model if train else eqx.nn.inference_mode(model)

    def state_of(self, bound):
        """The non-floating arrays of the bound model (an index table, a step counter): an
        Equinox model is immutable, so they come back as they went in."""
        return self.split(bound)[1]


def kind_of(model: Any) -> ModelKind:
    """The `ModelKind` of a model object (its static part filled in by `abstract_model`)."""
    if isinstance(model, nnx.Module):
        return _NNX()
    if isinstance(model, Linen):
        return _Linen()
    if eqx is not None and isinstance(model, eqx.Module):
        _check_equinox_state(model)
        return _Equinox()
    if isinstance(model, nn.Module):
        raise ShardkitValueError(
            f"model_fn returned the Linen module {type(model).__name__} without its variables; "
            "fix: return shardkit.train.Linen(module, module.init(key, example_input))."
        )
    _check_pytree(model)
    return ModelKind()


def _check_equinox_state(model: Any) -> None:
    """Raises for Equinox state anywhere in `model`: an `eqx.nn.State` (from
    `eqx.nn.make_with_state`) or a stateful layer's `eqx.nn.StateIndex` (BatchNorm, SpectralNorm),
    whose floating-point statistics would otherwise be trained as parameters."""
    if eqx is None:
        return
    is_state = lambda x: isinstance(x, (eqx.nn.State, eqx.nn.StateIndex))  # noqa: E731
    found = [
        (path_str(p), x)
        for p, x in jax.tree_util.tree_flatten_with_path(model, is_leaf=is_state)[0]
        if is_state(x)
    ]
    if any(isinstance(x, eqx.nn.State) for _, x in found):
        raise ShardkitValueError(
            f"model_fn returned {type(model).__name__} holding an equinox.nn.State (from "
            "eqx.nn.make_with_state: BatchNorm, StateIndex), whose statistics would be "
            "trained as parameters; fix: return an Equinox model without State (e.g. "
            "LayerNorm for BatchNorm), or a Flax NNX / Linen model with BatchNorm."
        )
    if found:
        paths = ", ".join(p or "the model" for p, _ in found[:3])
        paths += f" and {len(found) - 3} more" if len(found) > 3 else ""
        raise ShardkitValueError(
            f"model_fn returned {type(model).__name__} holding an equinox.nn.StateIndex at "
            f"{paths} (a stateful layer: eqx.nn.BatchNorm, eqx.nn.SpectralNorm), whose "
            "statistics would be trained as parameters: shardkit trains an Equinox model's "
            "floating-point arrays and carries no eqx.nn.State through the step; fix: replace "
            "the stateful layer (eqx.nn.LayerNorm or eqx.nn.GroupNorm for BatchNorm), or write "
            "the model in Flax NNX (nnx.BatchNorm) or Linen (nn.BatchNorm), whose statistics "
            "shardkit carries as model state."
        )


def _check_pytree(model: Any) -> None:
    _check_equinox_state(model)
    leaves = jax.tree_util.tree_flatten_with_path(model)[0]
    for path, leaf in leaves:
        if not isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)) and not hasattr(leaf, "dtype"):
            where = jax.tree_util.keystr(path) or "the model"
            raise ShardkitValueError(
                f"model_fn returned {type(model).__name__} whose leaf {where} is "
                f"{type(leaf).__name__}, not an array; fix: return an nnx.Module, "
                "shardkit.train.Linen(module, variables), an equinox.Module, or a pytree of "
                "arrays (the parameters, with loss_fn(params, batch))."
            )
    if not leaves:
        raise ShardkitValueError(
            f"model_fn returned {type(model).__name__} with no arrays to train; fix: return "
            "the model (nnx.Module, Linen(...), equinox.Module) or its parameter pytree."
        )


def _check_model_fn(model_fn: Any) -> None:
    """Raises for a `model_fn` that is a model (or parameters) rather than a function of a key."""
    is_model = isinstance(model_fn, (nnx.Module, Linen, nn.Module)) or (
        eqx is not None and isinstance(model_fn, eqx.Module)
    )
    if is_model or not callable(model_fn):
        what = "a model" if is_model else "not callable"
        raise ShardkitTypeError(
            f"model_fn is {what} ({type(model_fn).__name__}); it must be a function "
            "key -> model, which the Trainer traces to lay the parameters out before they "
            "exist; fix: model_fn=lambda key: MyModel(..., rngs=nnx.Rngs(key)), or "
            "lambda key: model to train one you have built."
        )
    try:
        signature = inspect.signature(model_fn)
    except (TypeError, ValueError):  # no signature (some C callables): `_call_model_fn` checks
        return
    try:
        signature.bind(None)
    except TypeError:
        name = getattr(model_fn, "__name__", type(model_fn).__name__)
        takes = "takes no argument" if not signature.parameters else "needs more than the key"
        raise ShardkitTypeError(_not_key_to_model(f"{name}{signature} {takes}")) from None


def _not_key_to_model(what: str) -> str:
    return (
        f"model_fn {what}; it must be a function key -> model, which the Trainer calls with "
        "a PRNG key (traced, to lay the parameters out before they exist); fix: take the key "
        "(model_fn=lambda key: MyModel(..., rngs=nnx.Rngs(key)), or lambda key: model to "
        "ignore it) and bind the other arguments (lambda key: make(key, width=64), "
        "functools.partial(make, width=64))."
    )


# a Python callable's own arity error, raised before its body runs
_ARITY_ERROR = re.compile(r"positional argument|required (keyword-only )?argument|takes no argu")


def _call_model_fn(model_fn: Callable[[jax.Array], Any], key: jax.Array) -> Any:
    """`model_fn(key)` with Flax's eager sharding off; a `model_fn` whose signature
    `_check_model_fn` could not read and that takes no single key is refused here. A TypeError
    raised inside its body propagates unchanged."""
    try:
        with nnx.use_eager_sharding(False):
            return model_fn(key)
    except TypeError as e:
        raised_by_the_call = e.__traceback__ is not None and e.__traceback__.tb_next is None
        if raised_by_the_call and _ARITY_ERROR.search(str(e)):
            what = f"{type(model_fn).__name__} cannot be called as model_fn(key) ({e})"
            raise ShardkitTypeError(_not_key_to_model(what)) from None
        raise


class Abstract(NamedTuple):
    """A model traced without allocating: its kind, shapes and axis names."""

    kind: ModelKind
    params: Any  # ShapeDtypeStructs
    state: Any  # ShapeDtypeStructs of the non-trained state, or None
    logical: Any  # axis names per parameter leaf, or None
    config: Any  # the model's `cfg` when it looks like a GPTConfig (for the planner)


def abstract_model(model_fn: Callable[[jax.Array], Any]) -> Abstract:
    """Traces `model_fn` once (`jax.eval_shape`) and returns its kind, shapes and names."""
    _check_model_fn(model_fn)
    found: dict = {}

    def build(key):
        model = _call_model_fn(model_fn, key)
        kind = kind_of(model)
        if isinstance(kind, _NNX):
            kind.graphdef = nnx.split(model, nnx.Param, ...)[0]
            cfg = getattr(model, "cfg", None)
            if hasattr(cfg, "n_layers") and hasattr(cfg, "d_model"):
                found["config"] = cfg
        elif isinstance(kind, _Linen):
            kind.module = model.module
        elif isinstance(kind, _Equinox):
            kind.static = eqx.filter(model, eqx.is_array, inverse=True)
        found["kind"] = kind
        found["logical"] = kind.logical(model)[0]
        return kind.split(model)

    params, state = jax.eval_shape(build, jax.random.key(0))
    _check_trained_dtypes(found["kind"], params)
    return Abstract(found["kind"], params, state, found["logical"], found.get("config"))


# where a non-float array that is not trained goes, per model kind (Equinox trains only its
# floating-point arrays, so its integer arrays never reach the check)
_NOT_FLOAT_FIX = {
    "pytree": "close over {it} in loss_fn, pass {it} in the batch, or make {it} floating-point "
    "(.astype(jnp.float32)) to train {it}",
    "nnx": "keep {it} in an nnx.Variable that is not an nnx.Param (class Const(nnx.Variable): "
    "pass; self.perm = Const(...), or nnx.BatchStat): shardkit carries every other variable "
    "as model state, untrained",
    "linen": "keep {it} in a collection other than 'params' (self.variable('consts', 'perm', "
    "lambda: ...)): shardkit carries the other collections as model state, untrained",
}


def _check_trained_dtypes(kind: ModelKind, params: Any) -> None:
    """Raises for an integer, boolean or PRNG-key parameter: `jax.grad` refuses it at step time."""
    bad = [
        f"'{path_str(p)}' ({x.dtype}, shape {tuple(x.shape)})"
        for p, x in jax.tree_util.tree_flatten_with_path(params)[0]
        if not jnp.issubdtype(x.dtype, jnp.inexact)
    ]
    if bad:
        what = "nnx.Param" if kind.name == "nnx" else "parameter"
        listed = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
        it, is_ = ("it", "is") if len(bad) == 1 else ("them", "are")
        fix = _NOT_FLOAT_FIX.get(kind.name, _NOT_FLOAT_FIX["pytree"]).format(it=it)
        raise ShardkitValueError(
            f"model_fn returned a model whose {what}{'s' * (len(bad) > 1)} {listed} {is_} not "
            f"floating-point, but every {what} is trained and gradients need floating-point (or "
            f"complex) arrays; fix: {fix}."
        )


def split_model(kind: ModelKind, model_fn: Callable[[jax.Array], Any], key) -> tuple[Any, Any]:
    """(params, state) of `model_fn(key)`, built with Flax's eager sharding off."""
    with nnx.use_eager_sharding(False):
        return kind.split(model_fn(key))


def cast_like(new: Any, old: Any) -> Any:
    """`new` with each leaf in `old`'s dtype (state updated in bfloat16 stays float32)."""
    return jax.tree.map(
        lambda n, o: n if jnp.issubdtype(o.dtype, jax.dtypes.prng_key) else n.astype(o.dtype),
        new,
        old,
    )


def describe_state(state: Any) -> str:
    """`batch_stats/bn/mean, rngs/dropout` ...: the first few state paths."""
    paths = [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    return ", ".join(paths[:4]) + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")
