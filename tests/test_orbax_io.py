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

from shardkit.errors import ShardkitValueError
from shardkit.strategies import FSDP, Hybrid
from shardkit.train import (
    Checkpointer,
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


def user_run(seed=7):
    """The user's model and its `nnx.Optimizer`, trained 3 steps on one device with Flax's
    own loop."""
    with nnx.use_eager_sharding(False):
        model = Net(nnx.Rngs(seed))
    opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    x = np.random.default_rng(0).normal(size=(16, 8)).astype("f4")
    batch = {"x": x, "y": (x[:, 0] > 0).astype("i4")}
    for _ in range(3):
        grads = nnx.grad(loss)(model, batch)
        opt.update(model, grads)
    return model, opt


def user_model(seed=7):
    return user_run(seed)[0]


def params_of(model):
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def assert_params_equal(got, want):
    got_leaves = jax.tree_util.tree_flatten_with_path(got)[0]
    want_leaves = jax.tree_util.tree_flatten_with_path(want)[0]
    assert [p for p, _ in got_leaves] == [p for p, _ in want_leaves]
    for (path, a), (_, b) in zip(got_leaves, want_leaves):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(path))


def trainer(strategy, optimizer=None):
    return Trainer(lambda k: Net(nnx.Rngs(k)), optimizer or optax.adam(1e-3), loss,
                   strategy=strategy)  # fmt: skip


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


def test_two_copies_of_the_model_are_refused_until_a_prefix_chooses_one(tmp_path):
    student, teacher = params_of(user_model(7)), params_of(user_model(8))
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp_path / "w", {"teacher": teacher, "student": student})
    t = trainer(Hybrid(data=2, fsdp=2, tensor=2))
    # equally good matches: refused in one line that names both and ends with the fix
    with pytest.raises(ShardkitValueError, match=r"^[^\n]*'student', 'teacher'[^\n]*"
                       r"fix: import_orbax\(\.\.\., prefix='student'\)[^\n]*$"):  # fmt: skip
        import_orbax(tmp_path / "w", t)
    for prefix, want in (("student", student), ("teacher", teacher), ("teacher/", teacher)):
        state, report = import_orbax(tmp_path / "w", t, prefix=prefix)
        assert_params_equal(state.params, want)
        name = prefix.strip("/")
        assert report.matched["params/l1/kernel"] == f"{name}/l1/kernel"
        other = "teacher" if name == "student" else "student"
        assert report.ok
        assert sorted(report.unused) == sorted(
            f"{other}/{p[len('params/') :]}" for p in report.matched
        )
    with pytest.raises(ShardkitValueError, match=r"prefix='ema'.*'student', 'teacher'.*fix"):
        import_orbax(tmp_path / "w", t, prefix="ema")


def test_params_beside_an_ema_copy_import_the_params_by_their_exact_name(tmp_path):
    params, ema = params_of(user_model(7)), params_of(user_model(8))
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp_path / "w", {"params": params, "ema": ema})
    t = trainer(FSDP())
    state, report = import_orbax(tmp_path / "w", t)  # "params" is the trainer's own name
    assert_params_equal(state.params, params)
    assert report.matched["params/bn/bias"] == "params/bn/bias"
    assert sorted(report.unused) == sorted(f"ema/{p[len('params/') :]}" for p in report.matched)
    state, report = import_orbax(tmp_path / "w", t, prefix="ema")
    assert_params_equal(state.params, ema)
    assert report.matched["params/bn/bias"] == "ema/bn/bias"


def test_two_whole_nnx_states_take_the_model_state_from_beside_the_chosen_params(tmp_path):
    a, b = user_model(7), user_model(8)
    assert not np.array_equal(np.asarray(a.bn.mean[...]), np.asarray(b.bn.mean[...]))
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp_path / "w", {"a": nnx.state(a), "b": nnx.state(b)})
    t = trainer(FSDP())
    with pytest.raises(ShardkitValueError, match=r"'a', 'b'.*fix: import_orbax\(\.\.\., prefix="):
        import_orbax(tmp_path / "w", t)
    state, report = import_orbax(tmp_path / "w", t, prefix="b")
    assert_params_equal(state.params, params_of(b))
    np.testing.assert_array_equal(np.asarray(state.model_state["bn"]["mean"]),
                                  np.asarray(b.bn.mean[...]))  # fmt: skip
    assert report.matched["model_state/bn/mean"] == "b/bn/mean/value"


def test_an_nnx_optimizer_beside_the_model_restores_with_its_step(tmp_path):
    """Adam's `mu` and `nu` mirror the parameters' paths; they are never taken for them."""
    model, opt = user_run()
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp_path / "w", {"optimizer": nnx.state(opt), "model": nnx.state(model)})
    state, report = import_orbax(tmp_path / "w", trainer(FSDP(), optax.adam(1e-2)))
    assert report.optimizer == "restored" and not report.missing and not report.unused
    assert_params_equal(state.params, params_of(model))
    assert report.matched["params/l1/kernel"] == "model/l1/kernel/value"
    assert int(state.step) == int(opt.step[...]) == 3
    np.testing.assert_array_equal(np.asarray(state.opt_state[0].mu["l1"]["kernel"]),
                                  np.asarray(opt.opt_state[0].mu["l1"]["kernel"][...]))  # fmt: skip


def test_a_shardkit_checkpoint_imports_with_its_step_only_with_its_optimizer_state(tmp_path):
    t = trainer(Hybrid(fsdp=4, tensor=2))
    state = t.init(0)
    batch = t.place_batch({"x": np.ones((16, 8), "f4"), "y": np.zeros(16, "i4")})
    state, _ = t.step(state, batch)
    ckpt = Checkpointer(tmp_path / "ck", save_every=1, max_to_keep=3)
    ckpt.save(state, force=True)
    ckpt.close()
    back, report = import_orbax(tmp_path / "ck", trainer(FSDP()))
    assert report.optimizer == "restored" and not report.unused, str(report)
    assert report.matched["step"] == "step"
    assert int(back.step) == 1 and back.step.sharding.spec == P()
    assert_params_equal(back.params, state.params)
    # another optimizer: its state starts afresh, and so does the step
    sgd = trainer(FSDP(), optax.sgd(0.1, momentum=0.9))
    back, report = import_orbax(tmp_path / "ck", sgd)
    assert report.optimizer.startswith("initialized") and "step" in report.unused
    assert int(back.step) == 0
    assert_params_equal(back.params, state.params)


def test_two_optimizer_states_are_not_guessed_between_the_optimizer_starts_afresh(tmp_path):
    model, opt = user_run()
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp_path / "w", {"params": params_of(model), "opt_a": nnx.state(opt),
                                    "opt_b": nnx.state(opt)})  # fmt: skip
    state, report = import_orbax(tmp_path / "w", trainer(FSDP(), optax.adam(1e-2)))
    assert_params_equal(state.params, params_of(model))
    assert report.optimizer == (
        "initialized from the restored parameters (it matches equally well under "
        "'opt_a/opt_state', 'opt_b/opt_state'; prefix= chooses the one beside the parameters)"
    )
    assert int(state.step) == 0 and int(state.opt_state[0].count) == 0
    assert "optimizer state initialized from the restored parameters (it matches" in str(report)


def test_a_copy_beside_the_bare_parameters_is_refused_and_prefix_empty_takes_the_top(tmp_path):
    params, ema = params_of(user_model(7)), params_of(user_model(8))
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp_path / "w", {**params, "ema": ema})
    t = trainer(FSDP())
    with pytest.raises(
        ShardkitValueError, match=r"'', 'ema'.*fix: import_orbax\(\.\.\., prefix=''\)"
    ):
        import_orbax(tmp_path / "w", t)
    state, report = import_orbax(tmp_path / "w", t, prefix="")
    assert_params_equal(state.params, params)
    assert report.matched["params/l1/kernel"] == "l1/kernel"
    state, _ = import_orbax(tmp_path / "w", t, prefix="ema")
    assert_params_equal(state.params, ema)
