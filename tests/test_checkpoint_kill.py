"""Kill-and-resume: a training process SIGKILLed 10 times at random points (during and between
asynchronous checkpoint saves) resumes each time and ends with exactly the parameters of an
uninterrupted run."""

import os
import pathlib
import random
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import optax
from flax import nnx

from shardkit.models import MLP, classification_loss
from shardkit.strategies import DataParallel
from shardkit.train.data import TeacherTask
from shardkit.train.trainer import Trainer

STEPS, BATCH, SIZES, DEVICES = 60, 16, (16, 64, 64, 4), 2
KILLS = 10

WORKER = textwrap.dedent(
    f"""
    import os, sys, time
    import jax, numpy as np, optax
    from flax import nnx
    from shardkit.models import MLP, classification_loss
    from shardkit.strategies import DataParallel
    from shardkit.train.checkpoint import Checkpointer
    from shardkit.train.data import TeacherTask
    from shardkit.train.trainer import Trainer

    jax.config.update("jax_threefry_partitionable", True)
    folder, out = sys.argv[1], sys.argv[2]
    # relaunches reuse the compiled programs: the test time goes to training, not compiling
    jax.config.update("jax_compilation_cache_dir", folder + "-jax-cache")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    task = TeacherTask(features={SIZES[0]}, classes={SIZES[-1]})
    trainer = Trainer(lambda k: MLP({SIZES}, rngs=nnx.Rngs(k)), optax.adam(1e-2),
                      classification_loss, strategy=DataParallel())
    ckpt = Checkpointer(folder, save_every=1, max_to_keep=2, async_save=True)
    state = ckpt.restore(trainer) if ckpt.latest_step() is not None else trainer.init(0)
    start = int(state.step)
    print("start", start, flush=True)
    for i in range(start, {STEPS}):
        state, _ = trainer.step(state, trainer.place_batch(task.batch(i, batch_size={BATCH})))
        ckpt.save(state)
        print("step", i + 1, flush=True)
    ckpt.close()
    np.savez(out, *jax.tree.leaves(jax.device_get(state.params)))
    print("done", flush=True)
    """
)


def _env():
    env = dict(os.environ)
    # this process's other XLA flags (its code generation), so that the reference it computes
    # is bit-comparable with the workers'
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env["XLA_FLAGS"] = " ".join([f"--xla_force_host_platform_device_count={DEVICES}", *flags])
    env["JAX_PLATFORMS"] = "cpu"
    return env


def test_sigkill_ten_times_then_resume_matches_uninterrupted(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    folder, out = tmp_path / "ckpt", tmp_path / "final.npz"
    cmd = [sys.executable, str(worker), str(folder), str(out)]
    rng = random.Random(0)
    starts = []
    for _ in range(KILLS):
        proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline()  # "start N": resumed and compiled, now training
        assert line.startswith("start"), line
        starts.append(int(line.split()[1]))
        target = starts[-1] + rng.randint(1, 6)
        while not line.startswith(f"step {target}"):  # a random number of steps in
            line = proc.stdout.readline()
            assert line, "worker exited early"
        time.sleep(rng.uniform(0.0, 0.05))  # then during or between the async saves
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        proc.stdout.close()
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert starts[0] == 0 and starts[-1] > 0  # later launches resumed from checkpoints
    assert starts == sorted(starts)
    # the uninterrupted reference, same mesh shape, in this process
    task = TeacherTask(features=SIZES[0], classes=SIZES[-1])
    trainer = Trainer(
        lambda k: MLP(SIZES, rngs=nnx.Rngs(k)),
        optax.adam(1e-2),
        classification_loss,
        strategy=DataParallel(),
        devices=jax.devices()[:DEVICES],
    )
    state = trainer.init(0)
    for i in range(STEPS):
        state, _ = trainer.step(state, trainer.place_batch(task.batch(i, batch_size=BATCH)))
    final = np.load(out)
    ref = jax.tree.leaves(jax.device_get(state.params))
    assert len(final.files) == len(ref)
    for i, r in enumerate(ref):
        np.testing.assert_array_equal(final[f"arr_{i}"], r)
    leftovers = [p.name for p in pathlib.Path(folder).iterdir() if "tmp" in p.name]
    assert leftovers == []  # unfinished saves were cleaned up on restart
