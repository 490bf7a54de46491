"""Users' own models, written as their library's docs write them, train under every strategy on
Auto and Explicit meshes with the losses of a hand-written single-device optax loop.

Six model kinds x {DataParallel, FSDP, TensorParallel, Hybrid} x {auto, explicit}: Flax NNX with
`nnx.with_partitioning` under Flax's defaults (eager sharding on) and an unannotated LayerNorm,
NNX without annotations plus `Rules`, NNX with BatchNorm and Dropout (same RNG streams as the
reference), Flax Linen with `nn.with_logical_partitioning` and `batch_stats`, Equinox, and a
plain parameter pytree with an apply function. Losses agree to rtol 2e-5 over 5 steps (sharded
reductions sum in another order; float32).
"""

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from shardkit import Rules
from shardkit.linter import UnmatchedLeafError
from shardkit.strategies import FSDP, DataParallel, Hybrid, TensorParallel
from shardkit.train import Linen, Trainer

STEPS, RTOL = 5, 2e-5
D_IN, HIDDEN, CLASSES, BATCH = 8, 32, 4, 16
init = nnx.initializers.lecun_normal()


def partitioned(*names):
    return nnx.with_partitioning(init, names)


def batches():
    rng = np.random.default_rng(0)
    for _ in range(STEPS):
        x = rng.normal(size=(BATCH, D_IN)).astype("f4")
        yield {"x": x, "y": (x[:, 0] > 0).astype("i4") + 2 * (x[:, 1] > 0).astype("i4")}


def xent(logits, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


# -- the six model kinds ------------------------------------------------------------------------
class NNXPartitioned(nnx.Module):
    """As Flax's sharding guide writes it: annotated kernels, a built-in LayerNorm without."""

    def __init__(self, rngs):
        self.l1 = nnx.Linear(D_IN, HIDDEN, kernel_init=partitioned("embed", "mlp"), rngs=rngs)
        self.norm = nnx.LayerNorm(HIDDEN, rngs=rngs)
        self.l2 = nnx.Linear(HIDDEN, CLASSES, kernel_init=partitioned("mlp", "embed"), rngs=rngs)

    def __call__(self, x):
        return self.l2(nnx.relu(self.norm(self.l1(x))))


class NNXPlain(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(D_IN, HIDDEN, rngs=rngs)
        self.l2 = nnx.Linear(HIDDEN, CLASSES, rngs=rngs)

    def __call__(self, x):
        return self.l2(nnx.gelu(self.l1(x)))


class NNXStateful(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(D_IN, HIDDEN, kernel_init=partitioned("embed", "mlp"), rngs=rngs)
        self.bn = nnx.BatchNorm(HIDDEN, rngs=rngs)
        self.drop = nnx.Dropout(0.25, rngs=rngs)
        self.l2 = nnx.Linear(HIDDEN, CLASSES, kernel_init=partitioned("mlp", "embed"), rngs=rngs)

    def __call__(self, x):
        return self.l2(self.drop(nnx.relu(self.bn(self.l1(x)))))


def nnx_loss(model, batch):
    return xent(model(batch["x"]), batch["y"])


class LinenNet(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.Dense(HIDDEN, kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")))(x)
        x = nn.BatchNorm(use_running_average=not train)(x)
        x = nn.relu(x)
        out = nn.Dense(CLASSES, kernel_init=nn.with_logical_partitioning(init, ("mlp", "embed")))
        return out(x)


def linen_fn(key):
    return Linen(LinenNet(), LinenNet().init(key, jnp.zeros((1, D_IN)), train=False))


def linen_loss(model, batch):
    return xent(model(batch["x"], train=model.training), batch["y"])


def eqx_fn(key):
    return eqx.nn.MLP(D_IN, CLASSES, HIDDEN, depth=1, activation=jax.nn.relu, key=key)


def pytree_fn(key):
    k1, k2 = jax.random.split(key)
    return {"w1": init(k1, (D_IN, HIDDEN)), "b1": jnp.zeros(HIDDEN),
            "w2": init(k2, (HIDDEN, CLASSES)), "b2": jnp.zeros(CLASSES)}  # fmt: skip


def apply(params, x):
    return jax.nn.relu(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


def eqx_loss(model, batch):
    return xent(jax.vmap(model)(batch["x"]), batch["y"])


def pytree_loss(params, batch):
    return xent(apply(params, batch["x"]), batch["y"])


EQX_TP = ((r"layers/0/weight", 0), (r"layers/1/weight", 1), (r".*", None))
TREE_TP = ((r"w1", 1), (r"w2", 0), (r".*", None))
RULES = Rules([(r"l1/kernel", P("fsdp", "tensor")), (r"l2/kernel", P("tensor", None))],
              default=P())  # fmt: skip


def strategies(kind):
    extra = {"rules": RULES} if kind == "nnx_rules" else {}
    tp = {"tensor_rules": EQX_TP if kind == "equinox" else TREE_TP} if kind in (
        "equinox", "pytree") else {}  # fmt: skip
    return {
        "dp": DataParallel(**extra),
        "fsdp": FSDP(**extra),
        "tp": TensorParallel(**extra, **tp),
        "hybrid": Hybrid(data=2, fsdp=2, tensor=2, **extra, **tp),
    }


MODELS = {
    "nnx_partitioned": (lambda k: NNXPartitioned(nnx.Rngs(k)), nnx_loss),
    "nnx_rules": (lambda k: NNXPlain(nnx.Rngs(k)), nnx_loss),
    "nnx_stateful": (lambda k: NNXStateful(nnx.Rngs(k)), nnx_loss),
    "linen": (linen_fn, linen_loss),
    "equinox": (eqx_fn, eqx_loss),
    "pytree": (pytree_fn, pytree_loss),
}


# -- the single-device references: each library's own training loop -----------------------------
def reference_losses(kind, optimizer) -> list[float]:
    # a single device needs no mesh: Flax's eager sharding would ask for one
    with nnx.use_eager_sharding(False):
        return _reference_losses(kind, optimizer)


def _reference_losses(kind, optimizer) -> list[float]:
    model_fn, loss_fn = MODELS[kind]
    key = jax.random.key(0)
    dev = jax.devices()[0]
    if kind.startswith("nnx"):  # Flax's own NNX loop: nnx.Optimizer and nnx.jit
        model = model_fn(key)
        opt = nnx.Optimizer(model, optimizer, wrt=nnx.Param)

        @nnx.jit
        def nnx_step(model, opt, batch):
            value, grads = nnx.value_and_grad(loss_fn)(model, batch)
            opt.update(model, grads)
            return value

        return [float(nnx_step(model, opt, batch)) for batch in batches()]

    elif kind == "linen":
        variables = model_fn(key).variables
        params, rest = nn.unbox(variables["params"]), nn.unbox(variables["batch_stats"])

        def loss(params, rest, batch):
            logits, upd = LinenNet().apply({"params": params, "batch_stats": rest}, batch["x"],
                                           train=True, mutable=["batch_stats"])  # fmt: skip
            return xent(logits, batch["y"]), upd["batch_stats"]

    elif kind == "equinox":
        params, static = eqx.partition(model_fn(key), eqx.is_inexact_array)
        rest = None

        def loss(params, rest, batch):
            return loss_fn(eqx.combine(params, static), batch), rest

    else:
        params, rest = model_fn(key), None

        def loss(params, rest, batch):
            return loss_fn(params, batch), rest

    @jax.jit
    def step(params, opt_state, rest, batch):
        (value, rest), grads = jax.value_and_grad(loss, has_aux=True)(params, rest, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, rest, value

    params, rest = jax.device_put((params, rest), dev)
    opt_state = optimizer.init(params)
    out = []
    for batch in batches():
        params, opt_state, rest, value = step(params, opt_state, rest, batch)
        out.append(float(value))
    return out


_REFERENCES: dict = {}


def reference(kind):
    if kind not in _REFERENCES:
        _REFERENCES[kind] = reference_losses(kind, optax.adamw(1e-2))
    return _REFERENCES[kind]


def _axes(specs):
    return {a for s in jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P)) for e in s
            if e for a in (e if isinstance(e, tuple) else (e,))}  # fmt: skip


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
@pytest.mark.parametrize("strategy", ["dp", "fsdp", "tp", "hybrid"])
@pytest.mark.parametrize("kind", list(MODELS))
def test_user_models_train_like_a_single_device_optax_loop(kind, strategy, axis_types):
    model_fn, loss_fn = MODELS[kind]
    trainer = Trainer(model_fn, optax.adamw(1e-2), loss_fn, strategy=strategies(kind)[strategy],
                      axis_types=axis_types)  # fmt: skip
    # the layout really splits: a strategy that silently replicated would also match
    want = {"dp": set(), "fsdp": {"fsdp"}, "tp": {"tensor"}, "hybrid": {"fsdp", "tensor"}}
    assert want[strategy] <= _axes(trainer.param_specs), trainer.param_specs
    state = trainer.init(0)
    losses = []
    for batch in batches():
        state, metrics = trainer.step(state, trainer.place_batch(batch))
        losses.append(float(metrics["loss"]))
    np.testing.assert_allclose(losses, reference(kind), rtol=RTOL, atol=1e-6)
    if kind in ("nnx_stateful", "linen"):  # BatchNorm statistics moved with training
        stats = [x for x in jax.tree.leaves(state.model_state) if x.dtype == jnp.float32]
        assert stats and any(float(jnp.abs(s).max()) > 0 for s in stats)
    # the state lands where the Trainer said it would
    for leaf, sharding in zip(jax.tree.leaves(state), jax.tree.leaves(trainer.state_shardings),
                              strict=True):  # fmt: skip
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim), (leaf.shape, sharding)


# -- the boundary: what a user meets around the matrix -------------------------------------------
class MeshNamed(nnx.Module):
    """Annotated with mesh axis names, as Flax's guide does for a ("data", "model") mesh."""

    def __init__(self, rngs):
        self.l1 = nnx.Linear(D_IN, HIDDEN, kernel_init=partitioned(None, "model"), rngs=rngs)
        self.l2 = nnx.Linear(HIDDEN, CLASSES, kernel_init=partitioned("model", None), rngs=rngs)

    def __call__(self, x):
        return self.l2(nnx.relu(self.l1(x)))


def test_mesh_axis_annotations_split_over_tensor_not_silently_replicated():
    trainer = Trainer(lambda k: MeshNamed(nnx.Rngs(k)), optax.adam(1e-3), nnx_loss,
                      strategy=TensorParallel(tensor=4), devices=jax.devices()[:4])  # fmt: skip
    assert trainer.param_specs["l1"]["kernel"] == P(None, "tensor")
    assert trainer.param_specs["l2"]["kernel"] == P("tensor", None)


class OddNames(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(D_IN, HIDDEN, kernel_init=partitioned("in", "hidden"), rngs=rngs)

    def __call__(self, x):
        return self.l1(x)


def test_tensor_parallel_over_names_it_does_not_know_is_refused_with_the_names():
    with pytest.raises(UnmatchedLeafError, match=r"annotated only with \['hidden', 'in'\].*fix"):
        Trainer(lambda k: OddNames(nnx.Rngs(k)), optax.adam(1e-3), nnx_loss,
                strategy=TensorParallel())  # fmt: skip
    # the fix it names: Rules mapping the user's names to mesh axes
    rules = Rules(logical={"hidden": "tensor", "in": None}, default=P())
    trainer = Trainer(lambda k: OddNames(nnx.Rngs(k)), optax.adam(1e-3), nnx_loss,
                      strategy=TensorParallel(rules=rules))  # fmt: skip
    assert trainer.param_specs["l1"]["kernel"] == P(None, "tensor")


def test_partly_annotated_model_replicates_builtin_norms_and_says_so():
    trainer = Trainer(lambda k: NNXPartitioned(nnx.Rngs(k)), optax.adam(1e-3), nnx_loss,
                      strategy=TensorParallel())  # fmt: skip
    assert trainer.param_specs["norm"]["scale"] == P(None)
    report = trainer.lint()
    assert report.ok and "1 note" in report.summary()
    assert "4 unannotated 1-D parameters (l1/bias" in report.notes[0]  # norm scale, bias too
    assert "replicated over 'tensor'" in report.notes[0]
    assert "optimizer state" in report.summary() and report.optimizer


class OddWidth(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(D_IN, 30, kernel_init=partitioned("embed", "mlp"), rngs=rngs)
        self.l2 = nnx.Linear(30, CLASSES, kernel_init=partitioned("mlp", "embed"), rngs=rngs)

    def __call__(self, x):
        return self.l2(self.l1(x))


def test_a_dim_tensor_parallelism_cannot_split_is_replicated_and_said_so():
    """30 does not divide over 8 tensor devices: replicated, and the notes name each leaf, by
    logical name (NNX) or by tensor_rules (a pytree), where they said nothing before."""
    trainer = Trainer(lambda k: OddWidth(nnx.Rngs(k)), optax.adam(1e-3), nnx_loss,
                      strategy=TensorParallel())  # fmt: skip
    assert trainer.param_specs["l1"]["kernel"] == P(None, None)
    note = next(n for n in trainer.lint().notes if "does not divide" in n)
    assert "'l1/kernel' dim 1 of (8, 30)" in note and "'l2/kernel' dim 0 of (30, 4)" in note
    assert "(8 devices)" in note and "multiples of 8" in note
    rules = TensorParallel(tensor_rules=((r"w", 1), (r"u", 1)))
    tree = lambda k: {"w": jnp.zeros((D_IN, 30)), "u": jnp.zeros((D_IN, 32))}  # noqa: E731
    trainer = Trainer(tree, optax.adam(1e-3), pytree_loss, strategy=rules)
    assert trainer.param_specs == {"w": P(None, None), "u": P(None, "tensor")}
    notes = [n for n in trainer.notes if "does not divide" in n]
    assert len(notes) == 1 and "'w' dim 1 of (8, 30)" in notes[0] and "'u'" not in notes[0]


class Unannotated2D(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(D_IN, HIDDEN, kernel_init=partitioned("embed", "mlp"), rngs=rngs)
        self.proj = nnx.Linear(HIDDEN, CLASSES, rngs=rngs)  # a matrix nobody annotated

    def __call__(self, x):
        return self.proj(self.l1(x))


def test_an_unannotated_matrix_under_tensor_parallelism_names_the_leaf_and_the_fix():
    with pytest.raises(UnmatchedLeafError, match=r"'proj/kernel' \(shape \(32, 4\)\).*fix.*"
                       r"with_partitioning"):  # fmt: skip
        Trainer(lambda k: Unannotated2D(nnx.Rngs(k)), optax.adam(1e-3), nnx_loss,
                strategy=TensorParallel())  # fmt: skip


def test_explicit_mesh_user_model_runs_with_auto_tensor_axis_and_notes_it():
    trainer = Trainer(lambda k: NNXPartitioned(nnx.Rngs(k)), optax.adam(1e-3), nnx_loss,
                      strategy=Hybrid(data=2, tensor=4), axis_types="explicit")  # fmt: skip
    state = trainer.init(0)
    state, _ = trainer.step(state, trainer.place_batch(next(batches())))
    assert "tensor" in trainer.auto_axes
    assert any("as Auto" in n for n in trainer.notes)
    assert state.params["l1"]["kernel"].sharding.spec == P(None, "tensor")


def test_model_fn_returning_no_model_is_refused_naming_the_leaf():
    with pytest.raises(ValueError, match=r"leaf \['act'\] is str.*fix"):
        Trainer(lambda k: {"w": jnp.ones(3), "act": "relu"}, optax.adam(1e-3), pytree_loss)
    with pytest.raises(ValueError, match="Linen.*no 'params'.*fix"):
        Linen(LinenNet(), {"batch_stats": {}})
    with pytest.raises(ValueError, match=r"Linen module LinenNet without its variables.*fix"):
        Trainer(lambda k: LinenNet(), optax.adam(1e-3), linen_loss)
    stateful = lambda k: eqx.nn.make_with_state(eqx.nn.BatchNorm)(4, "batch")  # noqa: E731
    with pytest.raises(ValueError, match=r"equinox.nn.State.*fix"):
        Trainer(stateful, optax.adam(1e-3), pytree_loss)


def test_model_state_is_checkpointed_and_evaluation_uses_running_statistics(tmp_path):
    from shardkit.train import Checkpointer

    def make(strategy):
        return Trainer(lambda k: NNXStateful(nnx.Rngs(k)), optax.adam(1e-2), nnx_loss,
                       strategy=strategy)  # fmt: skip

    trainer = make(FSDP())
    state = trainer.init(0)
    for batch in batches():
        state, _ = trainer.step(state, trainer.place_batch(batch))
    paths = {"/".join(map(str, p)) for p, _ in
             jax.tree_util.tree_flatten_with_path(state.model_state)[0]}  # fmt: skip
    assert any("bn" in p and "mean" in p for p in paths) and any("count" in p for p in paths)
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(state, force=True)
    ckpt.wait()
    other = make(Hybrid(data=2, tensor=4))  # another mesh
    restored = Checkpointer(tmp_path / "ckpt").restore(other)
    for a, b in zip(jax.tree.leaves(state.model_state), jax.tree.leaves(restored.model_state),
                    strict=True):  # fmt: skip
        a = jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a
        b = jax.random.key_data(b) if jnp.issubdtype(b.dtype, jax.dtypes.prng_key) else b
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    batch = trainer.place_batch(next(batches()), for_eval=True)
    with pytest.raises(ValueError, match=r"non-trained state.*trainer.evaluate\(state, batch\)"):
        trainer.evaluate(state.params, batch)
    first = trainer.evaluate(state, batch)["loss"]
    again = trainer.evaluate(state, batch)["loss"]  # eval mode: no dropout, stats unchanged
    assert float(first) == float(again)
    # Flax's own eval mode gives the same number on one device
    with nnx.use_eager_sharding(False):
        model = nnx.merge(
            nnx.split(NNXStateful(nnx.Rngs(0)), nnx.Param, ...)[0],
            jax.device_get(state.params),
            jax.device_get(state.model_state),
        )
    model.eval()
    np.testing.assert_allclose(float(first), float(nnx_loss(model, next(batches()))), rtol=1e-5)


def test_dropout_masks_do_not_depend_on_the_mesh():
    losses = {}
    for name, strategy in {"dp": DataParallel(), "tp": TensorParallel(tensor=4)}.items():
        trainer = Trainer(lambda k: NNXStateful(nnx.Rngs(k)), optax.sgd(0.0), nnx_loss,
                          strategy=strategy, devices=jax.devices()[:4])  # fmt: skip
        state = trainer.init(0)
        out = []
        for batch in batches():  # lr 0: only the dropout masks (and batch stats) change
            state, m = trainer.step(state, trainer.place_batch(batch))
            out.append(float(m["loss"]))
        losses[name] = out
    np.testing.assert_allclose(losses["dp"], losses["tp"], rtol=1e-5)
    assert len(set(losses["dp"])) == STEPS  # a new mask every step


@pytest.mark.parametrize("kind", ["equinox", "linen"])
def test_equinox_and_linen_runs_checkpoint_and_restore_on_another_mesh(tmp_path, kind):
    from shardkit.train import Checkpointer

    model_fn, loss_fn = MODELS[kind]
    trainer = Trainer(model_fn, optax.adam(1e-2), loss_fn, strategy=FSDP())
    state = trainer.init(0)
    state, _ = trainer.step(state, trainer.place_batch(next(batches())))
    ckpt = Checkpointer(tmp_path / "c")
    ckpt.save(state, force=True)
    ckpt.close()
    rules = {"tensor_rules": EQX_TP} if kind == "equinox" else {}
    other = Trainer(model_fn, optax.adam(1e-2), loss_fn,
                    strategy=Hybrid(data=4, tensor=2, **rules))  # fmt: skip
    back = Checkpointer(tmp_path / "c").restore(other)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(back), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert type(back.params) is type(state.params)  # an Equinox module stays one


def test_linen_evaluation_uses_running_statistics():
    trainer = Trainer(linen_fn, optax.adam(1e-2), linen_loss, strategy=Hybrid(data=4, tensor=2))
    state = trainer.init(0)
    for batch in batches():
        state, _ = trainer.step(state, trainer.place_batch(batch))
    batch = next(batches())
    got = float(trainer.evaluate(state, trainer.place_batch(batch, for_eval=True))["loss"])
    variables = {"params": jax.device_get(state.params), **jax.device_get(state.model_state)}
    want = float(xent(LinenNet().apply(variables, batch["x"], train=False), batch["y"]))
    np.testing.assert_allclose(got, want, rtol=1e-5)


class ParamSharding(nnx.Module):
    """Variables declared with `nnx.Param(..., sharding=...)`, under Flax's defaults."""

    def __init__(self, rngs):
        self.w = nnx.Param(init(rngs.params(), (D_IN, HIDDEN)), sharding=("embed", "mlp"))
        self.v = nnx.Param(init(rngs.params(), (HIDDEN, CLASSES)), sharding=("mlp", "embed"))

    def __call__(self, x):
        return jax.nn.relu(x @ self.w) @ self.v


def test_nnx_param_sharding_and_sharded_model_under_flax_defaults():
    from shardkit import make_mesh, sharded_model

    trainer = Trainer(lambda k: ParamSharding(nnx.Rngs(k)), optax.adam(1e-3), nnx_loss,
                      strategy=Hybrid(fsdp=4, tensor=2))  # fmt: skip
    assert trainer.param_specs["w"] == P("fsdp", "tensor")
    # outside the Trainer: built directly sharded by Rules, no mesh context needed
    mesh = make_mesh({"data": 2, "model": 4})
    rules = Rules(logical={"embed": None, "mlp": "model"}, default=P())
    model = sharded_model(lambda: NNXPartitioned(nnx.Rngs(0)), rules, mesh)
    assert model.l1.kernel[...].sharding.spec == P(None, "model")
    assert model.norm.scale[...].sharding.spec == P()
    with nnx.use_eager_sharding(False):
        plain = NNXPartitioned(nnx.Rngs(0))
    np.testing.assert_array_equal(np.asarray(model.l1.kernel[...]), plain.l1.kernel[...])


class PlainLinen(nn.Module):
    """A Linen model with parameters only (no batch_stats, no dropout)."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(CLASSES)(nn.relu(nn.Dense(HIDDEN)(x)))


def test_a_linen_model_with_parameters_only_returns_its_output():
    """`model(x)` is the module's output, not Flax's (output, {}) pair, when the variables
    hold nothing but parameters; the losses equal a hand-written optax loop's."""
    module = PlainLinen()
    variables = module.init(jax.random.key(0), jnp.zeros((1, D_IN)))
    seen = []

    def loss(model, batch):
        out = model(batch["x"])
        seen.append(type(out))
        return xent(out, batch["y"])

    trainer = Trainer(lambda k: Linen(module, variables), optax.sgd(0.1), loss,
                      strategy=DataParallel(), grad_accum=2)  # fmt: skip
    state = trainer.init(0)
    params, opt = variables["params"], optax.sgd(0.1)
    opt_state = opt.init(params)
    for batch in batches():
        state, metrics = trainer.step(state, trainer.place_batch(batch))
        value, grads = jax.value_and_grad(
            lambda p, b=batch: xent(module.apply({"params": p}, b["x"]), b["y"])
        )(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        np.testing.assert_allclose(float(metrics["loss"]), float(value), rtol=RTOL)
    assert seen and all(t is not tuple for t in seen), seen


class PermutedMLP(eqx.Module):
    """An Equinox model with an integer array field, as its docs write buffers."""

    mlp: eqx.nn.MLP
    perm: jax.Array

    def __init__(self, key):
        self.mlp = eqx.nn.MLP(D_IN, CLASSES, HIDDEN, depth=1, activation=jax.nn.relu, key=key)
        self.perm = jnp.arange(D_IN)[::-1]

    def __call__(self, x):
        return self.mlp(x[self.perm])


def test_an_equinox_model_with_an_integer_array_trains_like_equinoxs_own_loop():
    def loss_fn(model, batch):
        return xent(jax.vmap(model)(batch["x"]), batch["y"])

    optimizer = optax.adamw(1e-2)
    trainer = Trainer(PermutedMLP, optimizer, loss_fn, strategy=FSDP())
    state = trainer.init(0)
    assert jax.tree.leaves(state.model_state)[0].dtype == jnp.int32
    losses = []
    for batch in batches():
        state, metrics = trainer.step(state, trainer.place_batch(batch))
        losses.append(float(metrics["loss"]))
    model = PermutedMLP(jax.random.key(0))  # equinox's own loop on one device
    params, static = eqx.partition(model, eqx.is_inexact_array)
    opt_state = optimizer.init(params)

    @eqx.filter_jit
    def step(params, opt_state, batch):
        value, grads = jax.value_and_grad(lambda p: loss_fn(eqx.combine(p, static), batch))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    want = []
    for batch in batches():
        params, opt_state, value = step(params, opt_state, batch)
        want.append(float(value))
    np.testing.assert_allclose(losses, want, rtol=RTOL, atol=1e-6)
    np.testing.assert_array_equal(jax.tree.leaves(state.model_state)[0], model.perm)
