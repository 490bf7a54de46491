"""Train one MLP with data parallelism, FSDP and hybrid FSDP x tensor on several processes.

The script is the same for one process and for many: `shardkit.distributed.initialize()`
joins the run when `shardkit launch` (or SLURM, ...) started it and does nothing otherwise.
Each process loads only the rows of the global batch its own devices hold
(`Trainer.load_batch`), so the global batch, the losses and the final parameters are the same
whatever the process count:

    shardkit launch -n 2 --devices-per-process 4 -- python examples/multihost_train.py
    python examples/multihost_train.py             # one process, 8 simulated devices

Expected output (process 0 of 2, prefixed `[rank 0]`; one process prints the same, with
"process 0 of 1, 8 local devices of 8" and "saved by 1 processes"; the checkpoint line comes
with `--out DIR`):
    process 0 of 2, 4 local devices of 8
    dp     mesh {'data': 8} losses 1.5522 1.7852 1.9490
    fsdp   mesh {'fsdp': 8} losses 1.5522 1.7852 1.9490
    hybrid mesh {'fsdp': 4, 'tensor': 2} losses 1.5522 1.7852 1.9490
    global batch 5 of reverse : (16, 8), sum 461
    global batch 5 of tokens  : (16, 8), sum 1965
    checkpoint of hybrid saved by 2 processes at step 3

With `--out DIR` process 0 also writes DIR/train.npz (losses and final parameters) and every
process writes the hybrid run's checkpoint to DIR/ckpt (orbax, one shard file per process).
`--restore DIR` restores that checkpoint with FSDP on however many processes run now:

    shardkit launch -n 4 --devices-per-process 2 -- python examples/multihost_train.py --restore DIR
    [rank 0] restored step 3 onto Mesh(fsdp=8; auto; 8 devices cpu:0,1,2048,2049,4096,4097,
    6144,6145, 4 processes)
"""

import argparse
import atexit
import os
import pathlib
import tempfile

if "SHARDKIT_PROCESS_ID" not in os.environ:  # alone: simulate 8 CPU devices
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import shardkit.distributed as skd  # noqa: E402

INFO = skd.initialize()  # first, before any other JAX call

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from shardkit.mesh import describe_mesh  # noqa: E402
from shardkit.models import MLP, classification_loss  # noqa: E402
from shardkit.strategies import FSDP, DataParallel, Hybrid  # noqa: E402
from shardkit.train import Checkpointer, ReverseTask, TeacherTask, TokenFile, Trainer  # noqa: E402

STEPS, BATCH, SIZES = 3, 16, (16, 32, 4)


def token_file() -> TokenFile:
    """A small token file; every process writes the same ids to its own path."""
    path = pathlib.Path(tempfile.gettempdir()) / f"shardkit-tokens-{os.getpid()}.npy"
    np.save(path, np.random.default_rng(0).integers(0, 32, 4096).astype(np.int32))
    atexit.register(path.unlink, missing_ok=True)
    return TokenFile(path=str(path), seq_len=8)


def make_trainer(strategy, *, grad_accum=1) -> Trainer:
    return Trainer(
        lambda k: MLP(SIZES, rngs=nnx.Rngs(k)),
        optax.adam(1e-2),
        classification_loss,
        strategy=strategy,
        grad_accum=grad_accum,
    )


def run(strategy, data, *, grad_accum=1):
    """Trains STEPS steps; returns (trainer, final state, losses)."""
    trainer = make_trainer(strategy, grad_accum=grad_accum)
    skd.check_mesh(trainer.mesh)  # each process's devices are one block of the mesh
    state, losses = trainer.init(0), []
    for step in range(STEPS):
        state, metrics = trainer.step(state, trainer.load_batch(data, step, batch_size=BATCH))
        losses.append(float(metrics["loss"]))
    return trainer, state, losses


def host_leaves(tree) -> list[np.ndarray]:
    """Every leaf as a global host array (gathered from all processes)."""
    return [
        np.asarray(x) for x in jax.tree.leaves(multihost_utils.process_allgather(tree, tiled=True))
    ]


def restore(folder: pathlib.Path, say) -> None:
    """Restores the hybrid checkpoint into FSDP over this run's processes and devices."""
    trainer = make_trainer(FSDP())
    ckpt = Checkpointer(folder / "ckpt")
    state = ckpt.restore(trainer)
    ckpt.close()
    say(f"restored step {int(state.step)} onto {describe_mesh(trainer.mesh)}")
    leaves = host_leaves(state)
    if INFO.is_primary:
        out = folder / f"restored-{INFO.num_processes}.npz"
        np.savez(out, **{f"state{i}": x for i, x in enumerate(leaves)})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", help="write train.npz (process 0) and the checkpoint here")
    parser.add_argument("--restore", help="restore DIR/ckpt with FSDP; write restored-N.npz")
    args = parser.parse_args()
    jax.config.update("jax_threefry_partitionable", True)
    say = print if INFO.is_primary else (lambda *a: None)
    say(
        f"process {INFO.process_id} of {INFO.num_processes}, {len(INFO.local_devices)} local "
        f"devices of {len(INFO.devices)}"
    )
    if args.restore:
        return restore(pathlib.Path(args.restore), say)
    data = TeacherTask(features=SIZES[0], classes=SIZES[-1])
    runs = {"dp": (DataParallel(), 1), "fsdp": (FSDP(), 2), "hybrid": (Hybrid(fsdp=4, tensor=2), 1)}
    saved = {}
    for name, (strategy, accum) in runs.items():  # FSDP with 2 micro-batches per step
        trainer, state, losses = run(strategy, data, grad_accum=accum)
        shown = " ".join(f"{x:.4f}" for x in losses)
        say(f"{name:<6} mesh {dict(trainer.mesh.shape)} losses {shown}")
        saved[f"{name}/losses"] = np.array(losses)
        for i, leaf in enumerate(host_leaves(state.params)):
            saved[f"{name}/param{i}"] = leaf
        if name == "hybrid":
            for source, loader in (
                ("reverse", ReverseTask(digits=7, length=4)),
                ("tokens", token_file()),
            ):
                batch = trainer.load_batch(loader, 5, batch_size=BATCH)  # this process's rows
                inputs = multihost_utils.process_allgather(batch["inputs"], tiled=True)
                saved[f"batch/{source}"] = np.asarray(inputs)  # the global batch
                say(f"global batch 5 of {source:<8}: {inputs.shape}, sum {int(inputs.sum())}")
        if name == "hybrid" and args.out:
            for i, leaf in enumerate(host_leaves(state)):  # step, params, optimizer state
                saved[f"hybrid/state{i}"] = leaf
            ckpt = Checkpointer(pathlib.Path(args.out) / "ckpt", async_save=False)
            ckpt.save(state, meta={"strategy": name}, force=True)
            ckpt.close()
            say(f"checkpoint of hybrid saved by {INFO.num_processes} processes at step {STEPS}")
    if args.out and INFO.is_primary:
        np.savez(pathlib.Path(args.out) / "train.npz", **saved)


if __name__ == "__main__":
    main()
