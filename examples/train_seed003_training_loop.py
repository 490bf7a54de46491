"""Seed 003's "complete parallel training loop": a Flax model, optax, data and model
parallelism on a 2-D mesh, checkpoints, and resuming on a different mesh.

Run: python examples/train_seed003_training_loop.py   (8 simulated CPU devices)

Expected output (numbers may differ in the last digits):
    mesh {'fsdp': 4, 'tensor': 2}: Hybrid(data=1, fsdp=4, tensor=2, ...)
    step  20 loss 1.19 accuracy 0.49
    step  40 loss 0.06 accuracy 1.00
    saved step 40; restored on {'data': 8}: same parameters True
    step  60 loss 0.01 accuracy 1.00
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import tempfile

import jax
import numpy as np
import optax
from flax import nnx

from shardkit.models import GPT, GPTConfig, lm_loss
from shardkit.strategies import DataParallel, Hybrid
from shardkit.train import Checkpointer, ReverseTask, Trainer


def main(steps: int = 60, folder: str | None = None) -> list[str]:
    jax.config.update("jax_threefry_partitionable", True)  # same init on every mesh
    task = ReverseTask(digits=15, length=8)
    cfg = GPTConfig(vocab=task.vocab, d_model=32, n_layers=2, n_heads=4, seq_len=task.seq_len)
    optimizer = optax.adamw(
        optax.warmup_cosine_decay_schedule(0, 3e-3, 10, steps), weight_decay=1e-2
    )

    def make(strategy):
        return Trainer(lambda k: GPT(cfg, rngs=nnx.Rngs(k)), optimizer, lm_loss, strategy=strategy)

    lines = []
    trainer = make(Hybrid(fsdp=4, tensor=2))
    lines.append(f"mesh {dict(trainer.mesh.shape)}: {trainer.strategy}")
    state = trainer.init(0)
    folder = folder or tempfile.mkdtemp()
    ckpt = Checkpointer(folder, save_every=steps * 2 // 3)
    half = steps * 2 // 3
    for i in range(steps):
        if i == half:  # move to another mesh and strategy mid-run
            ckpt.wait()
            before = jax.device_get(state.params)
            trainer = make(DataParallel())
            state = ckpt.restore(trainer)
            same = all(
                np.array_equal(a, b)
                for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state.params))
            )
            lines.append(
                f"saved step {half}; restored on {dict(trainer.mesh.shape)}: same parameters {same}"
            )
        state, m = trainer.step(state, trainer.place_batch(task.batch(i, batch_size=32)))
        ckpt.save(state)
        if (i + 1) % (steps // 3) == 0:
            lines.append(f"step {i + 1:3d} loss {float(m['loss']):.2f} "
                         f"accuracy {float(m['accuracy']):.2f}")  # fmt: skip
    ckpt.close()
    for line in lines:
        print(line)
    return lines


if __name__ == "__main__":
    main()
