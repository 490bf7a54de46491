"""Your Flax Linen model trained sharded: `Linen(module, variables)` in, your loss unchanged.

The module annotates its kernels with `nn.with_logical_partitioning` and keeps BatchNorm
statistics in `batch_stats`; shardkit trains `params`, carries `batch_stats` as model state
and passes Dropout a fresh key every step (`rngs={"dropout": key}`). With dropout off for the
comparison, the losses equal Linen's own single-device loop.

Run: python examples/your_model_linen.py   (8 simulated CPU devices)

Expected output (numbers may differ in the last digits):
    linen's own loop  losses 2.0569 1.9871 1.7328 1.7928 1.5596
    FSDP x8           losses 2.0569 1.9871 1.7328 1.7928 1.5596
    same losses within 2e-5: True
    Dense_0/kernel P(None, 'fsdp'), batch_stats/BatchNorm_0/mean replicated
    dropout 0.3: two runs alike True, unlike no dropout True
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from shardkit.strategies import FSDP, Hybrid
from shardkit.train import Linen, Trainer

init = nn.initializers.lecun_normal()


class Classifier(nn.Module):
    rate: float = 0.0

    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.Dense(64, kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")))(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train)(x))
        x = nn.Dropout(self.rate, deterministic=not train)(x)
        return nn.Dense(4, kernel_init=nn.with_logical_partitioning(init, ("mlp", "embed")))(x)


def batches(steps):
    rng = np.random.default_rng(0)
    for _ in range(steps):
        x = rng.normal(size=(32, 16)).astype("f4")
        yield {"x": x, "y": (x[:, 0] > 0).astype("i4") + 2 * (x[:, 1] > 0).astype("i4")}


def xent(logits, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def loss_fn(model, batch):  # `model(...)` is module.apply with the current variables
    return xent(model(batch["x"], train=model.training), batch["y"])


def model_fn(module):
    def build(key):
        init_key, dropout_key = jax.random.split(key)
        variables = module.init(init_key, jnp.zeros((1, 16)), train=False)
        return Linen(module, variables, rngs={"dropout": dropout_key})

    return build


def linen_loop(steps):
    """Linen's own training loop on one device."""
    module = Classifier()
    variables = module.init(jax.random.split(jax.random.key(0))[0], jnp.zeros((1, 16)),
                            train=False)  # fmt: skip
    params, stats = nn.unbox(variables["params"]), variables["batch_stats"]
    tx = optax.adam(3e-3)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, stats, opt_state, batch):
        def loss(params):
            logits, upd = module.apply({"params": params, "batch_stats": stats}, batch["x"],
                                       train=True, mutable=["batch_stats"])  # fmt: skip
            return xent(logits, batch["y"]), upd["batch_stats"]

        (value, stats), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), stats, opt_state, value

    out = []
    for batch in batches(steps):
        params, stats, opt_state, value = step(params, stats, opt_state, batch)
        out.append(float(value))
    return out


def run(module, strategy, steps):
    trainer = Trainer(model_fn(module), optax.adam(3e-3), loss_fn, strategy=strategy)
    state = trainer.init(0)
    losses = []
    for batch in batches(steps):
        state, metrics = trainer.step(state, trainer.place_batch(batch))
        losses.append(float(metrics["loss"]))
    return trainer, losses


def main(steps: int = 5) -> list[str]:
    ref = linen_loop(steps)
    trainer, losses = run(Classifier(), FSDP(), steps)
    specs = trainer.param_specs
    stats = trainer.model_state_specs["batch_stats"]["BatchNorm_0"]["mean"]
    lines = [
        f"linen's own loop  losses {' '.join(f'{x:.4f}' for x in ref)}",
        f"FSDP x8           losses {' '.join(f'{x:.4f}' for x in losses)}",
        f"same losses within 2e-5: {bool(np.allclose(losses, ref, rtol=2e-5, atol=1e-6))}",
        f"Dense_0/kernel {specs['Dense_0']['kernel']}, batch_stats/BatchNorm_0/mean "
        + ("replicated" if stats == jax.sharding.PartitionSpec() else str(stats)),
    ]
    _, a = run(Classifier(rate=0.3), Hybrid(data=4, tensor=2), steps)
    _, b = run(Classifier(rate=0.3), Hybrid(data=4, tensor=2), steps)
    _, c = run(Classifier(rate=0.0), Hybrid(data=4, tensor=2), steps)
    lines.append(f"dropout 0.3: two runs alike {a == b}, unlike no dropout {a != c}")
    return lines


if __name__ == "__main__":
    print("\n".join(main()))
