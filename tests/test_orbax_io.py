"""Checkpoints written by plain orbax, without shardkit, restore into a sharded run bit-exactly
(by path, with a report of what matched); shardkit's weights export to plain orbax."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from shardkit.strategies import FSDP, Hybrid
from shardkit.train import (
    CheckpointMismatchError,
    Linen,
    Trainer,
    export_orbax,
    import_orbax,
)

init = nnx.initializers.lecun_normal()


class Net(nnx.Module):
    def __init__(self, rngs, hidden=32):
        self.l1 = nnx.Linear(8, hidden, rngs=rngs,
                             kernel_init=nnx.with_partitioning(init, ("embed", "mlp")))  # fmt: skip
        self.bn = nnx.BatchNorm(hidden, rngs=rngs)
        self.l2 = nnx.Linear(hidden, 4, rngs=rngs,
                             kernel_init=nnx.with_partitioning(init, ("mlp", "embed")))  # fmt: skip

    def __call__(self, x):
        return self.l2(nnx.relu(self.bn(self.l1(x))))


def loss(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()


def user_model(seed=7):
    """The user's model, trained a little on one device with Flax's own loop."""
    with nnx.use_eager_sharding(False):
        model = Net(nnx.Rngs(seed))
    opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    x = np.random.default_rng(0).normal(size=(16, 8)).astype("f4")
    batch = {"x": x, "y": (x[:, 0] > 0).astype("i4")}
    for _ in range(3):
        grads = nnx.grad(loss)(model, batch)
        opt.update(model, grads)
    return model


def trainer(strategy):
    return Trainer(lambda k: Net(nnx.Rngs(k)), optax.adam(1e-3), loss, strategy=strategy)


@pytest.mark.parametrize("saved", ["pure_dict", "nnx_state"])
def test_plain_orbax_params_of_an_nnx_model_restore_on_another_mesh_bit_exactly(tmp_path, saved):
    model = user_model()
    what = (nnx.to_pure_dict(nnx.state(model, nnx.Param)) if saved == "pure_dict"
            else nnx.state(model))  # fmt: skip
    with ocp.StandardCheckpointer() as ckptr:  # no shardkit involved
        ckptr.save(tmp_path / "weights", what)
    for strategy in (FSDP(), Hybrid(data=2, fsdp=2, tensor=2)):
        t = trainer(strategy)
        state, report = import_orbax(tmp_path / "weights", t)
        assert report.ok and not report.reshaped, str(report)
        want = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        for path, leaf in jax.tree_util.tree_flatten_with_path(want)[0]:
            got = state.params
            for k in path:
                got = got[k.key]
            np.testing.assert_array_equal(np.asarray(got), np.asarray(leaf))  # bit-exact
            assert got.sharding.is_equivalent_to(
                t.state_shardings.params[path[0].key][path[1].key], got.ndim
            )
        assert state.params["l1"]["kernel"].sharding.spec != P()  # restored sharded
        if saved == "nnx_state":  # the whole state: BatchNorm statistics come along
            np.testing.assert_array_equal(np.asarray(state.model_state["bn"]["mean"]),
                                          np.asarray(model.bn.mean[...]))  # fmt: skip
            assert "model_state/bn/mean" in report.matched
        else:
            assert "model_state/bn/mean" in report.missing  # initialized, and said so
        assert report.optimizer.startswith("initialized")
        batch = t.place_batch({"x": np.ones((16, 8), "f4"), "y": np.zeros(16, "i4")})
        state, metrics = t.step(state, batch)  # and it trains on from there
        assert np.isfinite(float(metrics["loss"]))


def test_a_checkpoint_of_another_model_is_refused_with_a_report(tmp_path):
    with nnx.use_eager_sharding(False):
        other = Net(nnx.Rngs(0), hidden=16)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp_path / "w", {"params": nnx.to_pure_dict(nnx.state(other, nnx.Param))})
    with pytest.raises(CheckpointMismatchError, match=r"reshaped: params/l1/kernel checkpoint "
                       r"\(8, 16\) vs model \(8, 32\)(.|\n)*fix"):  # fmt: skip
        import_orbax(tmp_path / "w", trainer(FSDP()))
    with pytest.raises(FileNotFoundError, match="no orbax checkpoint.*fix"):
        import_orbax(tmp_path, trainer(FSDP()))


def test_linen_variables_and_optimizer_state_from_a_checkpoint_manager(tmp_path):
    class Dense2(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(4)(nn.relu(nn.Dense(32)(x)))

    module = Dense2()
    variables = module.init(jax.random.key(3), jnp.zeros((1, 8)))
    tx = optax.adam(1e-2)
    opt_state = tx.init(variables["params"])
    with ocp.CheckpointManager(tmp_path / "run") as mgr:  # a user's training run, step 100
        mgr.save(100, args=ocp.args.StandardSave({"params": variables["params"],
                                                  "opt_state": opt_state}))  # fmt: skip
    t = Trainer(lambda k: Linen(module, module.init(k, jnp.zeros((1, 8)))), tx,
                lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean(), strategy=FSDP())  # fmt: skip
    state, report = import_orbax(tmp_path / "run", t)
    assert report.optimizer == "restored" and not report.missing and not report.unused
    np.testing.assert_array_equal(np.asarray(state.params["Dense_0"]["kernel"]),
                                  np.asarray(variables["params"]["Dense_0"]["kernel"]))  # fmt: skip


def test_export_reads_back_with_plain_orbax(tmp_path):
    t = trainer(Hybrid(fsdp=4, tensor=2))
    state = t.init(0)
    out = export_orbax(tmp_path / "export", state)
    with ocp.StandardCheckpointer() as ckptr:
        back = ckptr.restore(out)
    np.testing.assert_array_equal(np.asarray(back["l1"]["kernel"]),
                                  np.asarray(state.params["l1"]["kernel"]))  # fmt: skip
    with pytest.raises(ValueError, match="include=.*fix"):
        export_orbax(tmp_path / "x", state, include=("weights",))
