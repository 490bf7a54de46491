"""Your Flax NNX model, written as Flax's docs write it, trained sharded by shardkit.

The model annotates its kernels with `nnx.with_partitioning` (Flax's eager sharding stays on:
shardkit builds the model without needing a mesh context), has a built-in `nnx.LayerNorm`
that nobody annotated (replicated, and the lint report says so), plus `nnx.BatchNorm` and
`nnx.Dropout`, whose statistics and RNG streams shardkit carries, updates and checkpoints.
The losses equal Flax's own single-device loop (`nnx.Optimizer` under `nnx.jit`) with the
same RNG streams; the weights then go out to a plain orbax checkpoint and come back on
another mesh.

Run: python examples/your_model_nnx.py   (8 simulated CPU devices)

Expected output (numbers may differ in the last digits):
    flax's own loop   losses 1.4149 1.3580 1.5738 1.2576 1.4826
    Hybrid 2x2x2      losses 1.4149 1.3580 1.5738 1.2576 1.4826 (explicit mesh)
    same losses within 2e-5: True
    l1/kernel P('fsdp', 'tensor'), norm/scale P('fsdp',), bn/mean (model state) P()
    lint: 8 leaves, ..., 0 errors, 0 warnings, 2 notes, optimizer state 16 mirrors, 1 replicated
    exported to plain orbax; imported on {'fsdp': 8}: 8 leaves matched, bit-exact: True

The two notes: the unannotated LayerNorm/bias vectors are replicated over "tensor", and the
model (written without `out_sharding=`) runs with "tensor" as an Auto axis inside the loss on
the Explicit mesh.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pathlib
import tempfile

import jax
import numpy as np
import optax
from flax import nnx

from shardkit.strategies import FSDP, Hybrid
from shardkit.train import Trainer, export_orbax, import_orbax

init = nnx.initializers.lecun_normal()


class Classifier(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(16, 64, kernel_init=nnx.with_partitioning(init, ("embed", "mlp")),
                             rngs=rngs)  # fmt: skip
        self.norm = nnx.LayerNorm(64, rngs=rngs)
        self.bn = nnx.BatchNorm(64, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)
        self.l2 = nnx.Linear(64, 4, kernel_init=nnx.with_partitioning(init, ("mlp", "embed")),
                             rngs=rngs)  # fmt: skip

    def __call__(self, x):
        h = self.drop(nnx.relu(self.bn(self.norm(self.l1(x)))))
        return self.l2(h)


def loss_fn(model, batch):
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


def batches(steps):
    rng = np.random.default_rng(0)
    for _ in range(steps):
        x = rng.normal(size=(32, 16)).astype("f4")
        yield {"x": x, "y": (x[:, 0] > 0).astype("i4") + 2 * (x[:, 1] > 0).astype("i4")}


def flax_loop(steps):
    """Flax's own training loop on one device."""
    with nnx.use_eager_sharding(False):  # one device, no mesh
        model = Classifier(nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param)

        @nnx.jit
        def step(model, optimizer, batch):
            loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
            optimizer.update(model, grads)
            return loss

        return [float(step(model, optimizer, b)) for b in batches(steps)]


def main(steps: int = 5) -> list[str]:
    ref = flax_loop(steps)
    trainer = Trainer(lambda key: Classifier(nnx.Rngs(key)), optax.adamw(3e-3), loss_fn,
                      strategy=Hybrid(data=2, fsdp=2, tensor=2), axis_types="explicit")  # fmt: skip
    state = trainer.init(0)
    losses = []
    for batch in batches(steps):
        state, metrics = trainer.step(state, trainer.place_batch(batch))
        losses.append(float(metrics["loss"]))
    fmt = " ".join(f"{x:.4f}" for x in ref)
    specs = trainer.param_specs
    lines = [
        f"flax's own loop   losses {fmt}",
        f"Hybrid 2x2x2      losses {' '.join(f'{x:.4f}' for x in losses)} (explicit mesh)",
        f"same losses within 2e-5: {bool(np.allclose(losses, ref, rtol=2e-5, atol=1e-6))}",
        f"l1/kernel {specs['l1']['kernel']}, norm/scale {specs['norm']['scale']}, "
        f"bn/mean (model state) {trainer.model_state_specs['bn']['mean']}",
        trainer.lint().summary(),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        out = export_orbax(pathlib.Path(tmp) / "weights", state)  # plain orbax, no shardkit
        other = Trainer(lambda key: Classifier(nnx.Rngs(key)), optax.adamw(3e-3), loss_fn,
                        strategy=FSDP())  # fmt: skip
        back, report = import_orbax(out, other)
        same = all(
            np.array_equal(np.asarray(a), np.asarray(b))
            for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(back.params))
        )
        lines.append(
            f"exported to plain orbax; imported on {dict(other.mesh.shape)}: "
            f"{len(report.matched)} leaves matched, bit-exact: {same}"
        )
    return lines


if __name__ == "__main__":
    print("\n".join(main()))
