"""Two processes x 1 device against one process x 1 device: distributed FFT and a DP train step.

The same global problem both times: a 128^3 complex FFT (`shardkit.fft.pfft3d`, a slab over the
processes: one all-to-all each way) and a data-parallel training step of an MLP on a fixed
global batch (gradients all-reduced across processes). Prints the best time of each, the
speed-up (the physical limit is the core count: 2x on a 2-core machine) and the collective
time share: the time of the same collectives alone (the FFT's all-to-all, the step's gradient
all-reduce), run across the processes on arrays of the same shapes, over the step time.
Processes talk over gloo on 127.0.0.1, as they would across hosts over the network.

XLA's CPU backend runs one process on every core (intra-op threads), so unpinned, one process
already uses both cores and two processes cannot beat it. The second table pins each process
to one core (`os.sched_setaffinity`): 1 core against 2 cores, the comparison the 2x limit is
about.

    python benchmarks/multihost.py            # launches its own ranks (shardkit launch)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

WORKER = "--worker"
PIN = "SHARDKIT_BENCH_PIN"
N_FFT, BATCH, SIZES, ROUNDS = 128, 512, (512, 1024, 1024, 10), 7


def _best(fn, rounds=ROUNDS) -> float:
    import jax

    jax.block_until_ready(fn())  # compile and warm up
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return min(times)


def worker() -> None:
    """One rank: times the FFT, the train step and their collectives alone."""
    if os.environ.get(PIN):  # one core per process, chosen by rank, before XLA starts threads
        rank = int(os.environ.get("SHARDKIT_PROCESS_ID", "0"))
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    import shardkit.distributed as skd

    info = skd.initialize()
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import shardkit.fft as skfft
    from shardkit.mesh import make_mesh
    from shardkit.models import MLP, classification_loss
    from shardkit.strategies import DataParallel
    from shardkit.train import TeacherTask, Trainer

    n = jax.device_count()
    mesh = make_mesh({"x": n}, axis_types="explicit")
    sharding = NamedSharding(mesh, P("x", None, None))
    host = np.random.default_rng(0).normal(size=(N_FFT,) * 3).astype(np.complex64)
    x = jax.make_array_from_callback(host.shape, sharding, lambda i: host[i])
    fft = jax.jit(skfft.pfft3d)
    out = {"fft": _best(lambda: fft(x))}

    def a2a(v):  # the slab FFT's transposition, alone
        return jax.lax.all_to_all(v, "x", 1, 0, tiled=True)

    comm = jax.jit(jax.shard_map(a2a, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    out["fft_collective"] = _best(lambda: comm(x)) if n > 1 else 0.0

    task = TeacherTask(features=SIZES[0], classes=SIZES[-1])
    trainer = Trainer(
        lambda k: MLP(SIZES, rngs=nnx.Rngs(k)),
        optax.sgd(1e-3),
        classification_loss,
        strategy=DataParallel(),
    )
    state = trainer.init(0)
    batch = trainer.load_batch(task, 0, batch_size=BATCH)
    step = trainer.compile_step(batch)
    holder = [state]

    def train_step():
        holder[0], metrics = step(holder[0], batch)
        return metrics["loss"]

    out["step"] = _best(train_step)
    grads = jax.tree.map(
        lambda p: jnp.zeros((n, *p.shape), p.dtype), jax.tree.leaves(state.params)
    )  # one gradient per device, summed like the step's all-reduce
    grads = jax.device_put(grads, NamedSharding(mesh, P("x")))
    psum = jax.jit(
        jax.shard_map(lambda g: jax.lax.psum(g, "x"), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    )
    out["step_collective"] = _best(lambda: psum(grads)) if n > 1 else 0.0
    if info.is_primary:
        print("RESULT " + json.dumps(out), flush=True)


def _run(processes: int, *, pin: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDKIT_")}
    if pin:
        env[PIN] = "1"
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    cmd = [sys.executable, "-m", "shardkit.cli", "launch", "-n", str(processes)]
    cmd += ["--devices-per-process", "1", "--", sys.executable, __file__, WORKER]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if "RESULT " in line]
    if done.returncode or not lines:
        raise RuntimeError(f"{processes} process run failed:\n{done.stdout[-3000:]}")
    return json.loads(lines[0].split("RESULT ", 1)[1])


def main() -> None:
    print(f"cores: {os.cpu_count()} (speed-up limit {os.cpu_count()}x); gloo on 127.0.0.1")
    for pin in (False, True):
        one, two = _run(1, pin=pin), _run(2, pin=pin)
        title = "one core per process (pinned)" if pin else "unpinned (XLA threads on every core)"
        print(f"\n{title}")
        print(f"{'workload':<34} {'1 proc x 1':>11} {'2 proc x 1':>11} {'speed-up':>9} "
              f"{'collective share (2 proc)':>26}")  # fmt: skip
        rows = [
            (f"pfft3d {N_FFT}^3 complex64", "fft"),
            (f"DP train step, MLP batch {BATCH}", "step"),
        ]
        for label, key in rows:
            share = two[f"{key}_collective"] / two[key]
            print(
                f"{label:<34} {one[key] * 1e3:>9.1f}ms {two[key] * 1e3:>9.1f}ms "
                f"{one[key] / two[key]:>8.2f}x {share:>25.0%}"
            )


if __name__ == "__main__":
    worker() if WORKER in sys.argv else main()
