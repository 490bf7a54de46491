"""Strategies at their boundaries: explicit degrees against a user's mesh, `Rules` under FSDP,
and Auto's answer when no layout of the devices suits a user's model and batch."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from shardkit import Rules, make_mesh
from shardkit.errors import ShardkitValueError
from shardkit.plan import NoValidLayoutError, plan
from shardkit.plan.workload import Dense
from shardkit.strategies import FSDP, Auto, DataParallel, Hybrid, TensorParallel
from shardkit.train import Trainer

TP_RULES = ((r"w1", 1), (r"w2", 0))


def init(key):
    return {"w1": jax.random.normal(key, (16, 64)), "w2": jax.random.normal(key, (64, 4))}


def loss_fn(params, batch):
    return ((batch["x"] @ params["w1"] @ params["w2"]) ** 2).mean()


def mesh_of(axes):
    n = int(np.prod(list(axes.values())))
    return make_mesh(axes, devices=jax.devices()[:n])


# ---- 1. explicit degrees must match the sizes of a given mesh ---------------------------------
@pytest.mark.parametrize(
    "strategy, axes, says",
    [
        (Hybrid(data=2, tensor=4, tensor_rules=TP_RULES), {"data": 4, "tensor": 2},
         r"data=2 and tensor=4 but the mesh \{'data': 4, 'tensor': 2\} has 'data' of size 4 "
         r"and 'tensor' of size 2.*fix: drop data=, tensor= to take the mesh's sizes.*or build "
         r"the mesh to match: shardkit\.make_mesh\(\{'data': 2, 'tensor': 4\}\)"),
        (FSDP(fsdp=8), {"fsdp": 4},
         r"FSDP\(fsdp=8\).*fsdp=8 but the mesh \{'fsdp': 4\} has 'fsdp' of size 4.*"
         r"fix: drop fsdp= to take the mesh's sizes \(FSDP\(\)\).*make_mesh\(\{'fsdp': 8\}\)"),
        (FSDP(fsdp=1), {"fsdp": 4}, r"fsdp=1 but the mesh \{'fsdp': 4\} has 'fsdp' of size 4"),
        (TensorParallel(tensor=2, tensor_rules=TP_RULES), {"tensor": 4},
         r"tensor=2 but the mesh \{'tensor': 4\} has 'tensor' of size 4.*fix"),
        (DataParallel(data=4), {"data": 8}, r"data=4 but the mesh \{'data': 8\}.*fix"),
        (Hybrid(data=2, fsdp=-1, tensor=2), {"data": 4, "fsdp": 1, "tensor": 2},
         r"data=2 but the mesh .* has 'data' of size 4.*make_mesh\(\{'data': 2, 'fsdp': 2, "
         r"'tensor': 2\}\)"),
    ],
)  # fmt: skip
def test_an_explicit_degree_the_mesh_overrides_is_refused_at_bind(strategy, axes, says):
    mesh = mesh_of(axes)
    with pytest.raises(ShardkitValueError, match=says):
        strategy.bind(mesh)
    with pytest.raises(ShardkitValueError, match=says):  # as the user met it: the Trainer
        Trainer(init, optax.adam(1e-2), loss_fn, strategy=strategy, mesh=mesh)


@pytest.mark.parametrize(
    "strategy, axes",
    [
        (FSDP(), {"fsdp": 4}),  # fsdp=-1: all the mesh's devices
        (DataParallel(), {"data": 8}),
        (TensorParallel(tensor_rules=TP_RULES), {"tensor": 4}),
        (Hybrid(tensor=2, tensor_rules=TP_RULES), {"data": 4, "tensor": 2}),  # data unset: 1
        (Hybrid(fsdp=-1, tensor=2, tensor_rules=TP_RULES), {"fsdp": 4, "tensor": 2}),
        (Hybrid(data=2, tensor=4, tensor_rules=TP_RULES), {"data": 2, "tensor": 4}),
        (FSDP(fsdp=4), {"fsdp": 4}),
        (FSDP(fsdp=1), {"data": 1}),
    ],
)
def test_unset_or_matching_degrees_take_the_mesh(strategy, axes):
    mesh = mesh_of(axes)
    assert dict(strategy.bind(mesh).axis_sizes) == axes
    trainer = Trainer(init, optax.adam(1e-2), loss_fn, strategy=strategy, mesh=mesh)
    assert dict(trainer.mesh.shape) == axes


# ---- 2. Rules under FSDP: the fsdp axis still splits what the rules leave whole ---------------
class OddNames(nnx.Module):  # own axis names, mapped with Rules as docs/your-model.md shows
    def __init__(self, rngs):
        k = nnx.initializers.lecun_normal()
        self.a = nnx.Linear(16, 64, kernel_init=nnx.with_partitioning(k, ("in", "hidden")),
                            rngs=rngs)  # fmt: skip
        self.b = nnx.Linear(64, 4, kernel_init=nnx.with_partitioning(k, ("hidden", "in")),
                            rngs=rngs)  # fmt: skip

    def __call__(self, x):
        return self.b(nnx.relu(self.a(x)))


NAME_RULES = Rules(logical={"hidden": "tensor", "in": None}, default=P())
TREE = {"a": jax.ShapeDtypeStruct((16, 64), "float32"), "b": jax.ShapeDtypeStruct((64, 4), "f4"),
        "bias": jax.ShapeDtypeStruct((4,), "float32")}  # fmt: skip
NAMES = {"a": ("in", "hidden"), "b": ("hidden", "in"), "bias": None}


def test_fsdp_splits_the_dims_rules_without_fsdp_leave_whole():
    s = FSDP(rules=NAME_RULES)
    mesh = s.make_mesh()
    # largest dim divisible by 8, as FSDP without rules; (4,) does not divide: replicated
    assert s.param_specs(TREE, mesh, logical=NAMES) == {
        "a": P(None, "fsdp"), "b": P("fsdp", None), "bias": P()
    }  # fmt: skip
    z1 = FSDP(zero=1, rules=NAME_RULES)
    assert z1.param_specs(TREE, mesh, logical=NAMES)["a"] == P(None, None)
    assert z1.opt_state_specs(TREE, mesh, logical=NAMES)["a"] == P(None, "fsdp")
    # beside tensor parallelism from the rules, as Hybrid lays out named dims itself
    h = Hybrid(fsdp=4, tensor=2, rules=NAME_RULES)
    assert h.param_specs(TREE, h.make_mesh(), logical=NAMES) == {
        "a": P("fsdp", "tensor"), "b": P("tensor", "fsdp"), "bias": P("fsdp")
    }  # fmt: skip


def test_rules_that_name_fsdp_keep_every_layout():
    rules = Rules([(r"^a$", P(None, "fsdp")), (r".*", P())])
    s = FSDP(rules=rules)
    assert s.param_specs(TREE, s.make_mesh()) == {"a": P(None, "fsdp"), "b": P(), "bias": P()}
    # named through a logical mapping counts too
    rules = Rules([(r"^a$", P(None, "hidden")), (r".*", P())], logical={"hidden": "fsdp"})
    assert FSDP(rules=rules).param_specs(TREE, s.make_mesh()) == {
        "a": P(None, "fsdp"), "b": P(), "bias": P()
    }  # fmt: skip


def test_fsdp_with_the_documented_rules_shards_a_user_model():
    trainer = Trainer(
        lambda k: OddNames(nnx.Rngs(k)), optax.adam(1e-2), lambda m, b: (m(b["x"]) ** 2).mean(),
        strategy=FSDP(rules=NAME_RULES),
    )  # fmt: skip
    assert trainer.param_specs["a"]["kernel"] == P(None, "fsdp")
    assert trainer.param_specs["b"]["kernel"] == P("fsdp", None)
    assert trainer.param_specs["a"]["bias"] == P("fsdp")
    summary = trainer.lint().summary()
    assert "100.0% of per-device bytes fully replicated" not in summary
    state = trainer.init(0)
    assert state.params["a"]["kernel"].sharding.spec == P(None, "fsdp")
    assert state.params["a"]["kernel"].addressable_shards[0].data.shape == (16, 8)


# ---- 3. Auto on a user's model: the message speaks of what Auto plans for it -------------------
def test_auto_on_a_user_model_names_data_and_fsdp_and_how_to_choose_devices():
    with pytest.raises(NoValidLayoutError) as e:
        Trainer(init, optax.adam(1e-2), loss_fn, strategy=Auto(), batch_size=12)
    msg = str(e.value)
    assert "heads" not in msg and "d_ff" not in msg and "stage" not in msg
    assert "batch=12" in msg and "data x fsdp" in msg
    assert "fix: train on 6 devices (Trainer(..., devices=jax.devices()[:6]); 4 or 3 work" in msg
    assert "a batch that is a multiple of 8 (the Trainer's batch_size" in msg
    assert msg.endswith("e.g. 8 or 16.")
    assert " 12 devices" not in msg  # more devices than there are is no fix


def test_plan_of_a_dense_model_speaks_of_data_and_fsdp_only():
    w = Dense(name="mlp", params=1000, flops_per_example=6e3, activation_bytes_per_example=0,
              batch=12)  # fmt: skip
    with pytest.raises(NoValidLayoutError, match=r"no layout of 8 devices suits 'mlp'") as e:
        plan(w, devices=8, hardware="cpu")
    msg = str(e.value)
    assert "heads" not in msg and "stage" not in msg
    assert "fix: use 3 or 4 or 6 or 12 devices" in msg and "multiple of 8" in msg


@pytest.mark.parametrize("axes", [{"data": 2, "fsdp": 4}, {"fsdp": 8}, {"data": 8}])
def test_auto_with_a_given_mesh_runs_on_that_mesh(axes):
    # Auto plans for the mesh's device count; the mesh's own sizes are what runs
    trainer = Trainer(init, optax.adam(1e-2), loss_fn, strategy=Auto(), mesh=mesh_of(axes),
                      batch_size=16)  # fmt: skip
    assert dict(trainer.bound.axis_sizes).items() >= axes.items()
    assert "mesh" in trainer.strategy_reason
    state, m = trainer.step(trainer.init(0), trainer.place_batch({"x": np.ones((16, 16), "f4")}))
    assert np.isfinite(float(m["loss"]))
