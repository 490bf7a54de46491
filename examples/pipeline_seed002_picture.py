"""Seed 002's pipeline picture as a real run: a GPT's 8 layers cut into 4 stages (one per
device along mesh axis "stage", times 2 along "data"), 8 micro-batches flowing through them,
and the bubble read from the step table the run executed, next to the simulator's.

The picture's efficiency formula, (m - p + 1) / m, undercounts: with p stages and m
micro-batches a GPipe or 1F1B step lasts m + p - 1 slots of which m are busy, so the efficiency
is m / (m + p - 1) and the bubble (p - 1) / (m + p - 1).

Run: python examples/pipeline_seed002_picture.py   (8 simulated CPU devices)

Expected output (numbers may differ in the last digits):
    stages: stage 0 layers 0-1, stage 1 layers 2-3, stage 2 layers 4-5, stage 3 layers 6-7
    time 0: mb 0 on stage 0
    time 1: mb 0 on stage 1, mb 1 on stage 0
    time 2: mb 0 on stage 2, mb 1 on stage 1, mb 2 on stage 0
    time 3: mb 0 on stage 3, mb 1 on stage 2, mb 2 on stage 1, mb 3 on stage 0
    gpipe p=4 m=8: 22 steps, bubble executed 0.273, simulated 0.273, (p-1)/(m+p-1) 0.273
    1f1b p=4 m=8: 14 steps, bubble executed 0.273, simulated 0.273
    micro-batches in flight at m=32: gpipe 32, 1f1b 7 (1f1b stays flat as m grows)
    efficiency: seed's (m-p+1)/m 0.625, measured 1 - bubble 0.727 = m/(m+p-1)
    fitted one batch in 10 steps: loss 2.78 -> 2.38; collectives {'all-reduce': 3, ...}
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import optax
from flax import nnx

from shardkit.inspection.hlo import collective_counts
from shardkit.models import GPT, GPTConfig, lm_loss
from shardkit.pipeline import F, GPipe, OneFOneB, table
from shardkit.pipeline.simulate import simulate
from shardkit.strategies import Hybrid, Pipeline
from shardkit.train import ReverseTask, Trainer

P_STAGES, M = 4, 8


def stage_layers(n_layers: int = 8) -> str:
    per = n_layers // P_STAGES
    return "stages: " + ", ".join(
        f"stage {s} layers {s * per}-{s * per + per - 1}" for s in range(P_STAGES)
    )


def forward_flow(steps: int = 4) -> list[str]:
    """The seed's "Time t: [Batch i on GPU d]" lines, read from the GPipe step table."""
    ops = table(GPipe(), P_STAGES, M).ops  # [T, p, lanes, (kind, micro-batch, chunk)]
    lines = []
    for t in range(steps):
        busy = [
            (int(ops[t, d, 0, 1]), d) for d in reversed(range(P_STAGES)) if ops[t, d, 0, 0] == F
        ]
        lines.append(f"time {t}: " + ", ".join(f"mb {i} on stage {d}" for i, d in busy))
    return lines


def bubbles() -> list[str]:
    lines = []
    for schedule in (GPipe(), OneFOneB()):
        t, sim = table(schedule, P_STAGES, M), simulate(schedule, P_STAGES, M)
        line = (
            f"{schedule.name} p={P_STAGES} m={M}: {t.steps} steps, bubble executed "
            f"{t.idle_fraction:.3f}, simulated {sim.bubble:.3f}"
        )
        if schedule.name == "gpipe":
            line += f", (p-1)/(m+p-1) {(P_STAGES - 1) / (M + P_STAGES - 1):.3f}"
        lines.append(line)
    flight = {s.name: max(simulate(s, P_STAGES, 32).peak_in_flight) for s in (GPipe(), OneFOneB())}
    lines.append(
        f"micro-batches in flight at m=32: gpipe {flight['gpipe']}, 1f1b {flight['1f1b']} "
        "(1f1b stays flat as m grows)"
    )
    bubble = table(GPipe(), P_STAGES, M).idle_fraction
    lines.append(
        f"efficiency: seed's (m-p+1)/m {(M - P_STAGES + 1) / M:.3f}, measured 1 - bubble "
        f"{1 - bubble:.3f} = m/(m+p-1)"
    )
    return lines


def train(steps: int = 10) -> str:
    """The GPT trained with the pipeline (data=2 x stage=4, GPipe, 8 micro-batches of 4)."""
    task = ReverseTask(digits=15, length=4)
    cfg = GPTConfig(vocab=task.vocab, d_model=16, n_layers=8, n_heads=2, seq_len=task.seq_len)
    strategy = Hybrid(data=2, pipeline=Pipeline(stages=P_STAGES, schedule=GPipe(), microbatches=M))
    trainer = Trainer(
        lambda k: GPT(cfg, rngs=nnx.Rngs(k)), optax.adam(1e-2), lm_loss, strategy=strategy
    )
    state = trainer.init(0)
    losses = []
    batch = trainer.place_batch(task.batch(0, batch_size=32))  # one batch, fitted
    for _ in range(steps):
        state, metrics = trainer.step(state, batch)
        losses.append(float(metrics["loss"]))
    counts = {
        k: v for k, v in collective_counts(trainer.compile_step(batch).as_text()).items() if v
    }
    return (
        f"fitted one batch in {steps} steps: loss {losses[0]:.2f} -> {losses[-1]:.2f}; "
        f"collectives {counts}"
    )


def main() -> list[str]:
    lines = [stage_layers(), *forward_flow(), *bubbles(), train()]
    for line in lines:
        print(line)
    return lines


if __name__ == "__main__":
    main()
