"""Seed 004's "distributing a neural network" with Flax: annotate parameters with logical axis
names, let a strategy map them to mesh axes, initialise directly sharded, and train. The same
model runs data parallel, tensor parallel and hybrid with the same losses.

Run: python examples/train_seed004_flax.py   (8 simulated CPU devices)

Expected output (numbers may differ in the last digits):
    logical names: layers/0/kernel ('embed', 'mlp'), layers/1/kernel ('mlp', 'embed')
    DataParallel      kernel0 P(None, None)      losses 2.1640 2.3685 2.2007
    TensorParallel    kernel0 P(None, 'tensor')  losses 2.1640 2.3685 2.2007
    Hybrid 4x2        kernel0 P('fsdp', 'tensor') losses 2.1640 2.3685 2.2007
    all strategies agree within 1e-5: True
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import numpy as np
import optax
from flax import nnx

from shardkit.models import MLP, classification_loss, logical_axes
from shardkit.strategies import DataParallel, Hybrid, TensorParallel
from shardkit.train import TeacherTask, Trainer

SIZES = (64, 128, 64, 8)


def main(steps: int = 3) -> list[str]:
    jax.config.update("jax_threefry_partitionable", True)
    task = TeacherTask(features=SIZES[0], classes=SIZES[-1])
    names = logical_axes(nnx.eval_shape(lambda: MLP(SIZES, rngs=nnx.Rngs(0))))["layers"]
    lines = [
        f"logical names: layers/0/kernel {names[0]['kernel']}, layers/1/kernel {names[1]['kernel']}"
    ]
    runs = {}
    for label, strategy in (
        ("DataParallel", DataParallel()),
        ("TensorParallel", TensorParallel()),
        ("Hybrid 4x2", Hybrid(fsdp=4, tensor=2)),
    ):
        trainer = Trainer(
            lambda k: MLP(SIZES, rngs=nnx.Rngs(k)),
            optax.adam(1e-2),
            classification_loss,
            strategy=strategy,
        )
        state = trainer.init(0)  # born sharded: out_shardings from the strategy
        losses = []
        for i in range(steps):
            batch = trainer.place_batch(task.batch(i, batch_size=32))
            state, m = trainer.step(state, batch)
            losses.append(float(m["loss"]))
        runs[label] = np.array(losses)
        spec = state.params["layers"][0]["kernel"].sharding.spec
        lines.append(f"{label:<17} kernel0 {str(spec):<18} losses " + " ".join(
            f"{x:.4f}" for x in losses))  # fmt: skip
    ref = runs["DataParallel"]
    agree = all(np.allclose(v, ref, rtol=1e-5) for v in runs.values())
    lines.append(f"all strategies agree within 1e-5: {agree}")
    for line in lines:
        print(line)
    return lines


if __name__ == "__main__":
    main()
