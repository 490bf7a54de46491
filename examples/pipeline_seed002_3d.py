"""Seed 002's 3-D parallelism picture (GPT-3: data 64 x tensor 8 x pipeline 16) as a real run
on 8 devices: data=2 x tensor=2 x stage=2.

"stage" cuts the GPT's stacked layers into consecutive stages, "tensor" splits every matmul
inside a stage (Megatron: heads, MLP and vocab), "data" splits each micro-batch. The compiled
step shows each axis's communication: collective-permutes between stages, all-reduces of the
tensor partial sums and of the data-parallel gradients, and one all-gather of the vocab-split
embedding table (whole on every device for the lookups in front of the stages). The
pipelined loss and gradients equal those of the same GPT trained without stages.

Run: python examples/pipeline_seed002_3d.py   (8 simulated CPU devices)

Expected output (numbers may differ in the last digits):
    mesh {'stage': 2, 'data': 2, 'tensor': 2}
    blocks/q P('stage', None, 'tensor', None), embedding P('tensor', None)
    block parameters per device: 25% = 1 / (tensor x stage); data replicas hold copies
    compiled: {'all-gather': 1, 'all-reduce': 16, 'collective-permute': 2}
    same as 8-way data parallel without stages: loss 2.7904 vs 2.7904, max |dgrad| 2.4e-08
    fitted one batch in 8 steps: loss 2.79 -> 2.26
    GPT-3 plan: 64 x 8 x 16 = 8192 devices; 1536 / 64 = 24 micro-batches per pipeline;
      bubble (p-1)/(m+p-1) = 15/39 = 0.385 (simulated 0.385)
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import numpy as np
import optax
from flax import nnx

from shardkit.inspection.hlo import collective_counts
from shardkit.models import GPT, GPTConfig, lm_loss
from shardkit.pipeline import OneFOneB
from shardkit.pipeline.simulate import simulate
from shardkit.strategies import DataParallel, Hybrid, Pipeline
from shardkit.train import ReverseTask, Trainer

TASK = ReverseTask(digits=15, length=4)  # vocab 16: the tensor axis splits it
CFG = GPTConfig(vocab=TASK.vocab, d_model=16, n_layers=4, n_heads=2, seq_len=TASK.seq_len)


def make(strategy):
    return Trainer(
        lambda k: GPT(CFG, rngs=nnx.Rngs(k)), optax.adam(1e-2), lm_loss, strategy=strategy
    )


def gpt3_plan(data=64, tensor=8, stages=16, batch=1536) -> list[str]:
    m = batch // data
    sim = simulate(OneFOneB(), stages, m)
    return [
        f"GPT-3 plan: {data} x {tensor} x {stages} = {data * tensor * stages} devices; "
        f"{batch} / {data} = {m} micro-batches per pipeline;",
        f"  bubble (p-1)/(m+p-1) = {stages - 1}/{m + stages - 1} = "
        f"{(stages - 1) / (m + stages - 1):.3f} (simulated {sim.bubble:.3f})",
    ]


def main() -> list[str]:
    strategy = Hybrid(data=2, tensor=2, pipeline=Pipeline(stages=2, microbatches=4))
    trainer, plain = make(strategy), make(DataParallel())
    mesh = trainer.mesh
    specs = trainer.param_specs
    lines = [
        f"mesh {dict(mesh.shape)}",
        f"blocks/q {specs['blocks']['q']}, embedding {specs['embedding']}",
    ]
    state = trainer.init(0)
    ref_params = jax.device_put(state.params, plain.state_shardings.params)  # same values
    blocks = jax.tree.leaves(state.params["blocks"])
    share = sum(x.addressable_shards[0].data.size for x in blocks) / sum(x.size for x in blocks)
    lines.append(
        f"block parameters per device: {share:.0%} = 1 / (tensor x stage); "
        "data replicas hold copies"
    )
    batch = trainer.place_batch(TASK.batch(0, batch_size=16))
    counts = collective_counts(trainer.compile_step(batch).as_text())
    lines.append(f"compiled: { {k: v for k, v in counts.items() if v} }")
    (loss, _), grads = trainer.loss_and_grads(state.params, batch)
    ref_batch = plain.place_batch(TASK.batch(0, batch_size=16))
    (ref_loss, _), ref_grads = plain.loss_and_grads(ref_params, ref_batch)
    diff = max(
        float(np.abs(np.asarray(a) - np.asarray(b)).max())
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads))
    )
    lines.append(
        f"same as 8-way data parallel without stages: loss {float(loss):.4f} vs "
        f"{float(ref_loss):.4f}, max |dgrad| {diff:.1e}"
    )
    losses = []
    for _ in range(8):
        state, metrics = trainer.step(state, batch)
        losses.append(float(metrics["loss"]))
    lines.append(f"fitted one batch in 8 steps: loss {losses[0]:.2f} -> {losses[-1]:.2f}")
    lines += gpt3_plan()
    for line in lines:
        print(line)
    return lines


if __name__ == "__main__":
    main()
