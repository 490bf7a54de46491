"""How far ahead a multi-process CPU loop may dispatch: ms per step for three waiting habits.

    shardkit launch -n 2 --devices-per-process 4 -- python tools/gloo_dispatch.py MODE STEPS

MODE is `block` (wait for each step), `prev` (wait for the previous step: at most two in
flight, what `Trainer.step` does) or `async` (never wait). Each rank prints its ms per step.
See docs/multihost.md for the figures measured here.
"""

import sys
import time

import shardkit.distributed as skd

info = skd.initialize()

import jax  # noqa: E402 - after initialize(), which must run before JAX starts
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
rows, vec = NamedSharding(mesh, P("data", None)), NamedSharding(mesh, P("data"))
n_local = 64 // info.num_processes
opt = optax.adam(1e-2)


@jax.jit
def step(w, state, a, b):
    loss, g = jax.value_and_grad(lambda w: jnp.mean((a @ w - b) ** 2))(w)
    updates, state = opt.update(g, state, w)
    return optax.apply_updates(w, updates), state, loss


def batch(i):
    rng = np.random.default_rng([info.process_id, i])
    a = rng.standard_normal((n_local, 48)).astype(np.float32)
    b = rng.standard_normal(n_local).astype(np.float32)
    return (
        jax.make_array_from_process_local_data(rows, a, (64, 48)),
        jax.make_array_from_process_local_data(vec, b, (64,)),
    )


def main(mode: str, steps: int) -> None:
    w = jax.device_put(jnp.zeros(48), NamedSharding(mesh, P()))
    state = opt.init(w)
    w, state, loss = step(w, state, *batch(0))
    loss.block_until_ready()
    t0, prev = time.perf_counter(), None
    for i in range(steps):
        w, state, loss = step(w, state, *batch(i))
        if mode == "block":
            loss.block_until_ready()
        elif mode == "prev":
            if prev is not None:
                prev.block_until_ready()
            prev = loss
    loss.block_until_ready()
    ms = (time.perf_counter() - t0) / steps * 1e3
    print(f"rank {info.process_id} {mode}: {ms:.2f} ms/step over {steps} steps", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
