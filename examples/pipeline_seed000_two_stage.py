"""Seed 000's two-stage "pipeline" done as a real pipeline.

The seed ran stage 1 (a ReLU, data parallel) and stage 2 (a mean over the batch) as two jitted
calls, one after the other, each on all devices: nothing overlapped, so it was two sharded
steps, not a pipeline. Here the two stages are two device groups along mesh axis "stage"
(each 4 devices wide along "data"), each stage is a trainable Dense + ReLU, and the batch of
128 rows flows through them as 4 micro-batches under the fused 1F1B schedule in one SPMD
program; activations and their gradients move between the groups by collective-permute. The
seed's mean over rows becomes the loss's mean over rows.

Run: python examples/pipeline_seed000_two_stage.py   (8 simulated CPU devices)

Expected output (numbers may differ in the last digits):
    seed: two jitted stages on the same 8 devices, one after the other -> (64,)
    pipeline: {'stage': 2, 'data': 4}, 4 micro-batches of 32 rows, 1f1b: 6 lockstep steps
    loss 0.7851 = sequential reference 0.7851; max |dgrad| 1.9e-09
    compiled: {'all-reduce': 2, 'collective-permute': 2}; all-gather of weights: none
    bubble: executed table 0.200, simulated 0.200, (p-1)/(m+p-1) 0.200
    sgd on the pipelined gradients: loss 0.7851 -> 0.7208 in 5 steps
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.inspection.hlo import collective_counts
from shardkit.pipeline import OneFOneB
from shardkit.pipeline.engine import pipeline_value_and_grad, reference_value_and_grad
from shardkit.pipeline.simulate import simulate
from shardkit.strategies import DataParallel, Hybrid, Pipeline

ROWS, WIDTH, M = 128, 64, 4  # the seed's (n_devices * 16, 64) input


def seed_two_jitted_stages(x) -> str:
    """What the seed did: stage 1 then stage 2, two jitted calls over all devices."""
    mesh = DataParallel().make_mesh()
    rows, whole = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    stage1 = jax.jit(jax.nn.relu, in_shardings=rows, out_shardings=rows)
    stage2 = jax.jit(lambda h: jnp.mean(h, axis=0), in_shardings=rows, out_shardings=whole)
    out = stage2(stage1(x))
    return (
        f"seed: two jitted stages on the same {mesh.size} devices, one after the other -> "
        f"{out.shape}"
    )


def stage_fn(w, x):  # one stage: Dense + ReLU, (rows, 64) -> (rows, 64)
    return jax.nn.relu(x @ w["kernel"] + w["bias"])


def last_fn(_, y, target):  # the seed's mean over rows, as a loss
    return jnp.mean((y - target) ** 2)


def main() -> list[str]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, WIDTH)).astype("f4")
    lines = [seed_two_jitted_stages(x)]

    strategy = Hybrid(data=4, pipeline=Pipeline(stages=2, schedule=OneFOneB(), microbatches=M))
    mesh = strategy.make_mesh()
    params = {  # stacked over the 2 stages (model order), split over "stage"
        "kernel": rng.normal(scale=WIDTH**-0.5, size=(2, WIDTH, WIDTH)).astype("f4"),
        "bias": np.zeros((2, WIDTH), "f4"),
    }
    params = jax.device_put(params, NamedSharding(mesh, P("stage")))
    xs = x.reshape(M, ROWS // M, WIDTH)  # micro-batches
    targets = np.abs(rng.normal(size=xs.shape)).astype("f4")
    run = pipeline_value_and_grad(
        stage_fn, last_fn, mesh=mesh, schedule=OneFOneB(), microbatches=M, data_axes=("data",)
    )
    lines.append(
        f"pipeline: {dict(mesh.shape)}, {M} micro-batches of {ROWS // M} rows, "
        f"{run.schedule.name}: {run.steps} lockstep steps"
    )
    step = jax.jit(run)
    loss, (grads, _, _) = step(params, None, xs, targets)
    ref_loss, (ref_grads, _, _) = jax.jit(reference_value_and_grad(stage_fn, last_fn))(
        jax.device_get(params), None, xs, targets
    )
    diff = max(
        float(np.abs(np.asarray(a) - np.asarray(b)).max())
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads))
    )
    lines.append(
        f"loss {float(loss):.4f} = sequential reference {float(ref_loss):.4f}; "
        f"max |dgrad| {diff:.1e}"
    )
    counts = collective_counts(step.lower(params, None, xs, targets).compile().as_text())
    kinds = {k: v for k, v in counts.items() if v}
    gathers = "none" if not counts.get("all-gather") else counts["all-gather"]
    lines.append(f"compiled: {kinds}; all-gather of weights: {gathers}")
    sim = simulate(run.schedule, 2, M)
    lines.append(
        f"bubble: executed table {run.table.idle_fraction:.3f}, simulated {sim.bubble:.3f}, "
        f"(p-1)/(m+p-1) {1 / (M + 1):.3f}"
    )
    first = float(loss)
    for _ in range(5):
        params = jax.tree.map(lambda w, g: w - 0.5 * g, params, grads)
        loss, (grads, _, _) = step(params, None, xs, targets)
    lines.append(
        f"sgd on the pipelined gradients: loss {first:.4f} -> {float(loss):.4f} in 5 steps"
    )
    for line in lines:
        print(line)
    return lines


if __name__ == "__main__":
    main()
