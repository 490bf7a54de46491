"""Any optax transformation trains under FSDP: its state is placed by path and shape.

Masked and multi-transform states (with empty `MaskedNode`s), factored statistics
(`adafactor`), counters and hyperparameters (`MultiSteps`, `inject_hyperparams`), `muon`: each
trains 3 steps split over 8 devices with the losses of a plain single-device optax loop, and
every state leaf carries the layout `trainer.opt_placement` reports.
"""

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from shardkit.models import MLP, classification_loss
from shardkit.strategies import FSDP
from shardkit.train import TeacherTask, Trainer
from shardkit.train.opt_specs import optimizer_state_specs

TASK = TeacherTask(features=16, classes=4)
SIZES = (16, 64, 64, 4)


def _by_ndim(params):
    return jax.tree.map(lambda x: "matrix" if x.ndim == 2 else "vector", params)


OPTIMIZERS = {
    "adamw": lambda: optax.adamw(1e-2),
    "adafactor": lambda: optax.adafactor(1e-2, min_dim_size_to_factor=16),
    "lion": lambda: optax.lion(1e-3),
    "muon": lambda: optax.contrib.muon(1e-2),
    "chain": lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2)),
    "multi_transform": lambda: optax.multi_transform(
        {"matrix": optax.adam(1e-2), "vector": optax.sgd(1e-2)}, _by_ndim
    ),
    "masked": lambda: optax.masked(
        optax.adam(1e-2), lambda p: jax.tree.map(lambda x: x.ndim == 2, p)
    ),
    "multisteps": lambda: optax.MultiSteps(optax.adam(1e-2), every_k_schedule=2),
    "inject_hyperparams": lambda: optax.inject_hyperparams(optax.adam)(learning_rate=1e-2),
    # takes the loss as update(..., value=loss); halves the step when it improves < 20 %
    "reduce_on_plateau": lambda: optax.chain(
        optax.adam(1e-2), optax.contrib.reduce_on_plateau(patience=0, factor=0.5, rtol=0.2)
    ),
}


def _reference(trainer, make_opt, steps):
    """A plain optax loop on one device from the same initial parameters."""
    params = jax.device_get(trainer.init(0).params)
    opt = optax.with_extra_args_support(make_opt())
    state = opt.init(params)

    def loss_fn(p, batch):
        return classification_loss(nnx.merge(trainer.graphdef, p), batch)[0]

    losses = []
    for i in range(steps):
        batch = TASK.batch(i, batch_size=16)
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, state = opt.update(grads, state, params, value=loss)
        params = optax.apply_updates(params, updates)
        losses.append(float(loss))
    return losses


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_any_optax_transformation_trains_under_fsdp(name):
    make_opt = OPTIMIZERS[name]
    trainer = Trainer(lambda k: MLP(SIZES, rngs=nnx.Rngs(k)), make_opt(), classification_loss,
                      strategy=FSDP())  # fmt: skip
    state = trainer.init(0)
    losses = []
    for i in range(3):
        state, m = trainer.step(state, trainer.place_batch(TASK.batch(i, batch_size=16)))
        losses.append(float(m["loss"]))
    # float32, the same math summed in another order over 8 devices
    np.testing.assert_allclose(losses, _reference(trainer, make_opt, 3), rtol=2e-5, atol=1e-6)
    report = trainer.lint()  # what the linter reports is where the state lives
    placed = {p.path: p for p in report.optimizer}
    flat = jax.tree_util.tree_flatten_with_path(state.opt_state)[0]
    assert len(flat) == len(placed) and "optimizer state" in report.summary()
    split = 0
    for (_key, leaf), p in zip(flat, report.optimizer, strict=True):
        assert leaf.sharding.spec == p.spec, p
        split += any(e is not None for e in p.spec)
    assert split >= 1  # some optimizer state is split over 'fsdp', not all replicated


def test_the_step_hands_its_loss_to_a_transformation_that_takes_it():
    # optax.contrib.reduce_on_plateau keeps the best loss it was given: the step's losses
    tx = optax.chain(optax.adam(1e-2), optax.contrib.reduce_on_plateau(patience=0))
    trainer = Trainer(lambda k: MLP(SIZES, rngs=nnx.Rngs(k)), tx, classification_loss,
                      strategy=FSDP())  # fmt: skip
    state, losses = trainer.init(0), []
    for i in range(3):
        state, m = trainer.step(state, trainer.place_batch(TASK.batch(i, batch_size=16)))
        losses.append(float(m["loss"]))
    plateau = state.opt_state[1]
    np.testing.assert_allclose(float(plateau.best_value), min(losses), rtol=1e-6)
    assert int(plateau.count) == 0  # a window of one loss: counted and reset each step


def test_factored_statistics_follow_their_parameter():
    params = {"w": np.zeros((64, 32), np.float32), "b": np.zeros((32,), np.float32)}
    specs = {"w": P("fsdp", None), "b": P("fsdp")}
    state = optax.adafactor(1e-2, min_dim_size_to_factor=16).init(params)
    _, how = optimizer_state_specs(state, params, specs, {"fsdp": 8})
    by = {(h.path.rsplit("/", 2)[-2], h.path.rsplit("/", 1)[-1]): h for h in how}
    # optax keeps w's (64, 32) second moment as v_col (64,) and v_row (32,)
    assert by[("v_col", "w")].spec == P("fsdp") and by[("v_col", "w")].how == "factored"
    assert by[("v_row", "w")].spec == P(None) and by[("v_row", "w")].how == "factored"
    assert all(h.how == "replicated" for h in how if h.param is None)
