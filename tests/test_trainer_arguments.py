"""Trainer misuse: each wrong argument is one clear error naming it, with a fix that works."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from shardkit.errors import ShardkitError
from shardkit.strategies import FSDP, DataParallel
from shardkit.train.trainer import Trainer


def model_fn(key):
    return {"w": jax.random.normal(key, (16, 4)), "b": jnp.zeros(4)}


def loss_fn(p, batch):
    return jnp.mean((batch["x"] @ p["w"] + p["b"] - batch["y"]) ** 2)


HOST = {
    "x": np.random.default_rng(0).normal(size=(8, 16)).astype("f4"),
    "y": np.zeros((8, 4), "f4"),
}


def trainer(model_fn=model_fn, optimizer=None, loss_fn=loss_fn, **kw):
    optimizer = optax.sgd(0.1) if optimizer is None else optimizer
    return Trainer(model_fn, optimizer, loss_fn, **({"strategy": DataParallel()} | kw))


@pytest.mark.parametrize(
    "kwargs, names",
    [
        ({"optimizer": optax.adam}, ["optimizer=adam", "optax.adam(1e-3)"]),
        ({"optimizer": optax.sgd}, ["optimizer=sgd", "call it"]),
        ({"optimizer": "adam"}, ["optimizer='adam' (str)", "optax.adam(1e-3)"]),
        ({"model_fn": {"w": jnp.zeros((16, 4))}}, ["model_fn is not callable", "lambda key"]),
        ({"model_fn": nnx.Linear(16, 4, rngs=nnx.Rngs(0))}, ["model_fn is a model (Linear)"]),
        ({"loss_fn": "mse"}, ["loss_fn='mse'", "fix:"]),
        ({"strategy": FSDP}, ["strategy=FSDP is a class", "FSDP()"]),
        ({"strategy": {"fsdp": 8}}, ["is not a strategy", "fsdp"]),
        ({"strategy": "zero3"}, ["unknown strategy 'zero3'", "fsdp"]),
        ({"mesh": (8,)}, ["mesh=(8,)", "jax.make_mesh"]),
        ({"batch_size": "8"}, ["batch_size='8'", "fix:"]),
        ({"batch_size": 0}, ["batch_size=0", "fix:"]),
        ({"grad_accum": True}, ["grad_accum=True", "fix:"]),
    ],
)
def test_a_wrong_constructor_argument_is_named_with_a_fix(kwargs, names):
    with pytest.raises(ShardkitError) as info:
        trainer(**kwargs)
    assert isinstance(info.value, (TypeError, ValueError))
    for name in names:
        assert name in str(info.value), str(info.value)


def test_the_suggested_fixes_work_and_a_strategy_name_is_the_strategy():
    by_name = trainer(strategy="fsdp")
    assert by_name.strategy == FSDP()
    assert by_name.param_specs == trainer(strategy=FSDP()).param_specs
    built = nnx.Linear(16, 4, rngs=nnx.Rngs(3))
    t = trainer(
        model_fn=lambda key: built,
        loss_fn=lambda m, b: jnp.mean((m(b["x"]) - b["y"]) ** 2),
    )
    state = t.init(jax.random.PRNGKey(0))  # a raw uint32 key is taken too
    np.testing.assert_array_equal(state.params["kernel"], built.kernel[...])
    state, metrics = t.step(state, t.place_batch(HOST))
    want = np.mean((HOST["x"] @ np.asarray(built.kernel[...]) + np.asarray(built.bias[...])) ** 2)
    np.testing.assert_allclose(metrics["loss"], want, rtol=1e-5)


def test_step_and_evaluate_name_an_unplaced_batch_a_wrong_state_and_a_bad_seed():
    t = trainer()
    state = t.init(0)
    with pytest.raises(TypeError, match=r"batch\['x'\] is a numpy.ndarray of shape \(8, 16\)"):
        t.step(state, HOST)
    with pytest.raises(TypeError, match=r"trainer.place_batch\(batch, for_eval=True\)"):
        t.evaluate(state.params, HOST)
    with pytest.raises(TypeError, match="batch is a list"):
        t.step(state, [HOST["x"]])
    with pytest.raises(TypeError, match=r"state is .*dict.*trainer.init\(seed\)"):
        t.step(state._asdict(), t.place_batch(HOST))
    with pytest.raises(TypeError, match=r"seed='zero' \(str\)"):
        t.init("zero")
    state, metrics = t.step(state, t.place_batch(HOST))  # the fixed call runs
    assert np.isfinite(metrics["loss"])


def test_a_loss_fn_that_returns_no_scalar_or_no_metrics_dict_is_named():
    t = trainer(loss_fn=lambda p, b: b["x"] @ p["w"])
    with pytest.raises(ValueError, match=r"loss of shape \(8, 4\), not a scalar"):
        t.step(t.init(0), t.place_batch(HOST))
    t = trainer(loss_fn=lambda p, b: (loss_fn(p, b), [1.0]))
    with pytest.raises(TypeError, match=r"\(loss, list\).*dict of metrics"):
        t.step(t.init(0), t.place_batch(HOST))


def test_a_loss_fn_that_returns_three_items_is_named():
    t = trainer(loss_fn=lambda p, b: (loss_fn(p, b), {}, 1))
    with pytest.raises(ValueError, match=r"returned a tuple of 3 items.*fix"):
        t.step(t.init(0), t.place_batch(HOST))


@pytest.mark.parametrize(
    "batch, names",
    [
        ((HOST["x"], HOST["y"]), ["batch is", "tuple", "not a dict", "{'x'"]),
        ({**HOST, "scale": np.float32(1.0)}, ["batch['scale']", "shape ()", "batch dim first"]),
        ({"inputs": {"x": HOST["x"]}, "y": HOST["y"]}, ["batch['inputs']", "dict", "flat"]),
        ({"x": HOST["x"], "y": [1, 2]}, ["leading sizes", "[2, 8]"]),
    ],
)
def test_place_batch_names_a_batch_that_is_not_a_flat_dict_of_arrays(batch, names):
    with pytest.raises(ShardkitError) as err:
        trainer().place_batch(batch)
    assert all(n in str(err.value) for n in names), str(err.value)


def test_a_batch_placed_for_evaluation_given_to_an_accumulating_step_is_named():
    t = trainer(grad_accum=2)
    state = t.init(0)
    host = {k: np.concatenate([v, v]) for k, v in HOST.items()}  # 2 micro-batches of 8 rows
    with pytest.raises(ShardkitError, match=r"trainer.step: batch\['(x|y)'\].*grad_accum=2.*"
                       r"fix: .*place_batch\(batch\)"):  # fmt: skip
        t.step(state, t.place_batch(host, for_eval=True))
    state, _ = t.step(state, t.place_batch(host))  # the fix


def test_evaluate_and_loss_and_grads_compile_again_for_another_dtype():
    t = trainer()
    state = t.init(0)
    for dtype in ("f4", "i4", "f4"):
        host = {"x": np.ones((8, 16), dtype), "y": HOST["y"]}
        want = float(loss_fn(jax.device_get(state.params), host))
        assert np.isclose(float(t.evaluate(state.params, t.place_batch(host))["loss"]), want)
        (loss, _), _ = t.loss_and_grads(state.params, t.place_batch(host))
        assert np.isclose(float(loss), want)
