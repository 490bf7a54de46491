"""What `Trainer` refuses of a user's model at construction, before anything is traced for a
step: an Equinox module with stateful layers, integer or boolean parameters, a `model_fn` that
is not `key -> model`; and what it must keep accepting beside them."""

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from shardkit.errors import ShardkitTypeError, ShardkitValueError
from shardkit.strategies import DataParallel
from shardkit.train import Linen, Trainer

BATCH = {"x": np.ones((16, 16), "f4"), "y": np.zeros(16, "i4")}


def trainer(model_fn, loss_fn=lambda model, batch: 0.0):
    return Trainer(model_fn, optax.sgd(0.1), loss_fn, strategy=DataParallel())


def xent(logits, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


# -- Equinox modules with stateful layers (eqx.nn.StateIndex) ----------------------------------
class EqxBatchNormNet(eqx.Module):
    lin: eqx.nn.Linear
    bn: eqx.nn.BatchNorm

    def __init__(self, key):
        self.lin = eqx.nn.Linear(16, 8, key=key)
        self.bn = eqx.nn.BatchNorm(8, axis_name="batch", mode="batch")


@pytest.mark.parametrize(
    "model_fn, path",
    [
        (EqxBatchNormNet, "bn/batch_state_index"),
        (lambda k: eqx.nn.Sequential([eqx.nn.Linear(16, 8, key=k),
                                      eqx.nn.BatchNorm(8, "b", mode="batch")]), "layers/1/"),
        (lambda k: {"net": EqxBatchNormNet(k)}, "net/bn/batch_state_index"),  # in a pytree
    ],
)  # fmt: skip
def test_an_equinox_module_with_a_state_index_is_refused_at_construction(model_fn, path):
    with pytest.raises(ShardkitValueError) as info:
        trainer(model_fn)
    msg = str(info.value)
    assert "equinox.nn.StateIndex" in msg and path in msg, msg
    assert "would be trained as parameters" in msg, msg
    assert msg.rsplit("fix: ", 1)[1].startswith("replace the stateful layer"), msg
    for fix in ("eqx.nn.LayerNorm", "nnx.BatchNorm", "model state"):
        assert fix in msg, msg


def test_an_equinox_module_with_integers_and_dropout_is_still_accepted():
    class Net(eqx.Module):
        lin: eqx.nn.Linear
        drop: eqx.nn.Dropout
        perm: jax.Array
        steps: jax.Array

        def __init__(self, key):
            self.lin = eqx.nn.Linear(16, 4, key=key)
            self.drop = eqx.nn.Dropout(0.1)
            self.perm, self.steps = jnp.arange(4), jnp.zeros((), bool)

    t = trainer(Net)
    assert [x.dtype for x in jax.tree.leaves(t.abstract_params)] == [jnp.float32] * 2
    assert sorted(str(x.dtype) for x in jax.tree.leaves(t.abstract_model_state)) == [
        "bool",
        "int32",
    ]


# -- integer and boolean parameters -------------------------------------------------------------
class NNXIntParam(nnx.Module):
    def __init__(self, rngs):
        self.l = nnx.Linear(16, 4, rngs=rngs)
        self.perm = nnx.Param(jnp.arange(4))


class LinenIntParam(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(4)(x)[:, self.param("perm", lambda k: jnp.arange(4))]


def linen_int_param(key):
    return Linen(LinenIntParam(), LinenIntParam().init(key, jnp.ones((1, 16))))


@pytest.mark.parametrize(
    "model_fn, leaf, fix",
    [
        (lambda k: {"w": jax.random.normal(k, (16, 4)), "perm": jnp.arange(4)},
         "'perm' (int32, shape (4,))", "close over it in loss_fn, pass it in the batch"),
        (lambda k: {"w": jnp.ones((16, 4)), "mask": [jnp.ones((2, 3), bool)]},
         "'mask/0' (bool, shape (2, 3))", "make it floating-point"),
        (lambda k: NNXIntParam(nnx.Rngs(k)),
         "nnx.Param 'perm' (int32, shape (4,))", "nnx.Variable that is not an nnx.Param"),
        (linen_int_param, "'perm' (int32, shape (4,))", "collection other than 'params'"),
    ],
)  # fmt: skip
def test_a_non_float_parameter_is_refused_at_construction_with_its_path(model_fn, leaf, fix):
    with pytest.raises(ShardkitValueError) as info:
        trainer(model_fn)
    msg = str(info.value)
    assert leaf in msg and "not floating-point" in msg, msg
    assert fix in msg.rsplit("fix: ", 1)[1], msg


def test_several_non_float_parameters_are_all_named():
    def model_fn(key):
        return {"w": jnp.ones((16, 4)), "a": jnp.arange(3), "b": jnp.zeros(2, jnp.uint8)}

    with pytest.raises(
        ShardkitValueError, match=r"parameters 'a' \(int32, shape \(3,\)\), 'b' \(uint8.*are not"
    ):
        trainer(model_fn)


def test_the_nnx_fix_for_an_integer_parameter_trains_with_rng_counts_and_batch_stats():
    class Const(nnx.Variable):
        pass

    class Fixed(nnx.Module):  # the fix the error suggests, beside Dropout's and BatchNorm's state
        def __init__(self, rngs):
            self.l = nnx.Linear(16, 4, rngs=rngs)
            self.bn = nnx.BatchNorm(4, rngs=rngs)
            self.drop = nnx.Dropout(0.1, rngs=rngs)
            self.perm = Const(jnp.arange(4)[::-1])

        def __call__(self, x):
            return self.drop(self.bn(self.l(x)))[:, self.perm[...]]

    t = trainer(lambda k: Fixed(nnx.Rngs(k)), lambda m, b: xent(m(b["x"]), b["y"]))
    state = t.init(0)
    state, metrics = t.step(state, t.place_batch(BATCH))
    assert np.isfinite(float(metrics["loss"]))
    np.testing.assert_array_equal(state.model_state["perm"], [3, 2, 1, 0])
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))


def test_bfloat16_and_complex_parameters_are_accepted():
    t = trainer(lambda k: {"w": jnp.ones((16, 4), jnp.bfloat16), "c": jnp.ones(4, jnp.complex64)})
    assert {str(x.dtype) for x in jax.tree.leaves(t.abstract_params)} == {"bfloat16", "complex64"}


# -- model_fn must be key -> model --------------------------------------------------------------
def make(key, width):
    return {"w": jnp.ones((16, width))}


def make_kw(key, *, width):
    return {"w": jnp.ones((16, width))}


class Opaque:
    """A callable whose signature `inspect` cannot read (as some C-implemented callables)."""

    __signature__ = "unknown"

    def __call__(self, key):
        return {"w": jax.random.normal(key, (16, 4))}


class OpaqueNoKey(Opaque):
    def __call__(self):
        return {"w": jnp.ones(3)}


class OpaqueBadBody(Opaque):
    def __call__(self, key):
        return {"w": jnp.ones(3) + "a"}


@pytest.mark.parametrize(
    "model_fn, shown",
    [
        (lambda: {"w": jnp.ones(3)}, "model_fn <lambda>() takes no argument"),
        (make, "model_fn make(key, width) needs more than the key"),
        (make_kw, "model_fn make_kw(key, *, width) needs more than the key"),
        (OpaqueNoKey(), "model_fn OpaqueNoKey cannot be called as model_fn(key)"),
    ],
)
def test_a_model_fn_that_is_not_key_to_model_is_refused_with_the_fix(model_fn, shown):
    with pytest.raises(ShardkitTypeError) as info:
        trainer(model_fn)
    msg = str(info.value)
    assert msg.startswith(shown), msg
    assert "it must be a function key -> model" in msg, msg
    assert "fix: " in msg and "lambda key:" in msg.rsplit("fix: ", 1)[1], msg


def bad_body(key):
    return {"w": jnp.ones(3) + "a"}


@pytest.mark.parametrize("model_fn", [bad_body, OpaqueBadBody()], ids=["signature", "opaque"])
def test_a_type_error_inside_a_correct_model_fn_is_not_swallowed(model_fn):
    with pytest.raises(TypeError, match="unsupported operand") as info:
        trainer(model_fn)
    assert not isinstance(info.value, ShardkitTypeError)


def test_model_fns_that_take_the_key_are_accepted():
    def with_default(key, width=4):
        return {"w": jax.random.normal(key, (16, width))}

    for model_fn in (with_default, lambda *a: {"w": jnp.ones(3)}, Opaque()):
        assert jax.tree.leaves(trainer(model_fn).abstract_params)
