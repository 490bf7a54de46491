"""Your Equinox model trained sharded: return the `eqx.Module`, write the loss as usual.

shardkit trains the module's floating-point arrays (`eqx.is_inexact_array`), keeps the rest
static, and gives `loss_fn` the module back. Equinox models carry no axis names, so tensor
parallelism takes `tensor_rules` (path regex -> the dim to split); data and FSDP need none.
The losses equal Equinox's own single-device loop.

Run: python examples/your_model_equinox.py   (8 simulated CPU devices)

Expected output (numbers may differ in the last digits):
    equinox's own loop     losses 1.3817 1.3954 1.4347 1.3293 1.4132
    Hybrid fsdp 4 x tp 2   losses 1.3817 1.3954 1.4347 1.3293 1.4132
    same losses within 2e-5: True
    layers/0/weight P('tensor', 'fsdp'), layers/1/weight P('fsdp', 'tensor')
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import equinox as eqx
import jax
import numpy as np
import optax

from shardkit.strategies import Hybrid
from shardkit.train import Trainer

# Equinox's Linear weight is (out, in): split the first layer's outputs, the second's inputs
TENSOR_RULES = ((r"layers/0/weight", 0), (r"layers/1/weight", 1), (r".*", None))


def model_fn(key):
    return eqx.nn.MLP(16, 4, 64, depth=1, activation=jax.nn.relu, key=key)


def loss_fn(model, batch):
    logits = jax.vmap(model)(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


def batches(steps):
    rng = np.random.default_rng(0)
    for _ in range(steps):
        x = rng.normal(size=(32, 16)).astype("f4")
        yield {"x": x, "y": (x[:, 0] > 0).astype("i4") + 2 * (x[:, 1] > 0).astype("i4")}


def equinox_loop(steps):
    """Equinox's own training loop on one device."""
    model = model_fn(jax.random.key(0))
    tx = optax.adam(3e-3)
    opt_state = tx.init(eqx.filter(model, eqx.is_inexact_array))

    @eqx.filter_jit
    def step(model, opt_state, batch):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, batch)
        updates, opt_state = tx.update(grads, opt_state)
        return eqx.apply_updates(model, updates), opt_state, loss

    out = []
    for batch in batches(steps):
        model, opt_state, loss = step(model, opt_state, batch)
        out.append(float(loss))
    return out


def main(steps: int = 5) -> list[str]:
    ref = equinox_loop(steps)
    trainer = Trainer(model_fn, optax.adam(3e-3), loss_fn,
                      strategy=Hybrid(fsdp=4, tensor=2, tensor_rules=TENSOR_RULES))  # fmt: skip
    state = trainer.init(0)
    losses = []
    for batch in batches(steps):
        state, metrics = trainer.step(state, trainer.place_batch(batch))
        losses.append(float(metrics["loss"]))
    specs = trainer.param_specs
    return [
        f"equinox's own loop     losses {' '.join(f'{x:.4f}' for x in ref)}",
        f"Hybrid fsdp 4 x tp 2   losses {' '.join(f'{x:.4f}' for x in losses)}",
        f"same losses within 2e-5: {bool(np.allclose(losses, ref, rtol=2e-5, atol=1e-6))}",
        f"layers/0/weight {specs.layers[0].weight}, layers/1/weight {specs.layers[1].weight}",
    ]


if __name__ == "__main__":
    print("\n".join(main()))
