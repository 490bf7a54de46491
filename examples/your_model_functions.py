"""Your plain JAX model, a parameter pytree and an apply function, trained sharded.

`model_fn(key)` returns the parameters; `loss_fn(params, batch)` calls your apply function.
Plain pytrees carry no axis names: data parallelism and FSDP need none, tensor parallelism
takes `tensor_rules`. The optimizer is any optax transformation: here `optax.adafactor`,
whose factored statistics (a row and a column vector per matrix) shardkit places along
their parameter's split, as the lint report lists. The losses equal a plain optax loop.

Run: python examples/your_model_functions.py   (8 simulated CPU devices)

Expected output (numbers may differ in the last digits):
    optax loop        losses 1.9260 1.9011 1.5617 2.0058 1.5518
    TensorParallel 8  losses 1.9260 1.9011 1.5617 2.0058 1.5518
    same losses within 2e-5: True
    w1 P(None, 'tensor'), w2 P('tensor', None), b1 P(None,)
    optimizer state: 6 factored, 3 mirrors, 4 replicated
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import collections

import jax
import jax.numpy as jnp
import numpy as np
import optax

from shardkit.strategies import TensorParallel
from shardkit.train import Trainer

TENSOR_RULES = ((r"w1", 1), (r"w2", 0), (r".*", None))  # column- then row-parallel


def init_params(key):
    k1, k2 = jax.random.split(key)
    glorot = jax.nn.initializers.glorot_normal()
    return {"w1": glorot(k1, (16, 64)), "b1": jnp.zeros(64),
            "w2": glorot(k2, (64, 4)), "b2": jnp.zeros(4)}  # fmt: skip


def apply(params, x):
    return jax.nn.relu(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


def loss_fn(params, batch):
    logits = apply(params, batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


def batches(steps):
    rng = np.random.default_rng(0)
    for _ in range(steps):
        x = rng.normal(size=(32, 16)).astype("f4")
        yield {"x": x, "y": (x[:, 0] > 0).astype("i4") + 2 * (x[:, 1] > 0).astype("i4")}


def optimizer():
    return optax.adafactor(1e-2, min_dim_size_to_factor=8)


def optax_loop(steps):
    params = init_params(jax.random.key(0))
    tx = optimizer()
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    out = []
    for batch in batches(steps):
        params, opt_state, loss = step(params, opt_state, batch)
        out.append(float(loss))
    return out


def main(steps: int = 5) -> list[str]:
    ref = optax_loop(steps)
    trainer = Trainer(init_params, optimizer(), loss_fn,
                      strategy=TensorParallel(tensor_rules=TENSOR_RULES))  # fmt: skip
    state = trainer.init(0)
    losses = []
    for batch in batches(steps):
        state, metrics = trainer.step(state, trainer.place_batch(batch))
        losses.append(float(metrics["loss"]))
    specs = trainer.param_specs
    kinds = collections.Counter(row.how for row in trainer.lint().optimizer)
    return [
        f"optax loop        losses {' '.join(f'{x:.4f}' for x in ref)}",
        f"TensorParallel 8  losses {' '.join(f'{x:.4f}' for x in losses)}",
        f"same losses within 2e-5: {bool(np.allclose(losses, ref, rtol=2e-5, atol=1e-6))}",
        f"w1 {specs['w1']}, w2 {specs['w2']}, b1 {specs['b1']}",
        "optimizer state: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())),
    ]


if __name__ == "__main__":
    print("\n".join(main()))
