"""Faults in multi-process runs: a rank's Python error stops the job within seconds and is
the error the launcher reports; SIGTERM to the launcher stops its ranks; SIGTERM to one rank
of `shardkit train` saves a checkpoint on every rank and stops them all."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

TIMEOUT = 120


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDKIT_")}
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _launch(n, *cmd, devices=2):
    args = [sys.executable, "-m", "shardkit.cli", "launch", "-n", str(n),
            "--devices-per-process", str(devices), "--", *cmd]  # fmt: skip
    return subprocess.Popen(args, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip


RAISES = textwrap.dedent(
    """
    import shardkit.distributed as skd
    skd.initialize()
    import jax
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("started")
    if jax.process_index() == 1:
        raise ValueError("rank one broke: shard 7 is missing")
    multihost_utils.sync_global_devices("rank 1 never comes")
    print("rank 0 passed a barrier rank 1 never reached")
    """
)


def test_a_rank_that_raises_ends_the_job_within_seconds_with_its_own_error(tmp_path):
    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    t0 = time.monotonic()
    proc = _launch(2, sys.executable, str(script))
    out, _ = proc.communicate(timeout=TIMEOUT)
    took = time.monotonic() - t0
    assert proc.returncode == 1, out[-3000:]
    assert "[rank 1] ValueError: rank one broke: shard 7 is missing" in out
    assert "[launch] rank 1 exited with status 1" in out
    assert "[launch] rank 1's error: ValueError: rank one broke: shard 7 is missing" in out
    assert "passed a barrier" not in out
    assert took < 15 + 10, (took, out[-2000:])  # 15 s after start-up (~10 s of imports)


# rank 0 reports a lost peer and exits at once; rank 1, the cause, fails a moment later
VICTIM_FIRST = textwrap.dedent(
    """
    import os, sys, time
    rank = int(os.environ["SHARDKIT_PROCESS_ID"])
    if rank == 0:
        print("jax.errors.JaxRuntimeError: UNKNOWN: Gloo AllGather failed: Connection reset "
              "by peer [127.0.0.1]:4242", flush=True)
        sys.exit(1)
    time.sleep(0.3)
    print("KeyError: 'embed/kernel' is missing from the checkpoint", flush=True)
    sys.exit(3)
    """
)


def test_the_rank_blamed_is_the_cause_not_the_peer_that_lost_it(tmp_path):
    import io

    from shardkit.distributed.launch import launch

    script = tmp_path / "victim_first.py"
    script.write_text(VICTIM_FIRST)
    out = io.StringIO()
    status = launch([sys.executable, str(script)], processes=2, out=out)
    text = out.getvalue()
    assert status == 3, text
    assert "[launch] rank 1 exited with status 3" in text, text
    assert "[launch] rank 1's error: KeyError: 'embed/kernel' is missing" in text, text


SLEEPS = textwrap.dedent(
    """
    import time, shardkit.distributed as skd
    skd.initialize()
    print("ready", flush=True)
    time.sleep(600)
    """
)


def test_sigterm_to_the_launcher_stops_its_ranks(tmp_path):
    script = tmp_path / "sleeps.py"
    script.write_text(SLEEPS)
    proc = _launch(2, sys.executable, str(script))
    ready = 0
    while ready < 2:
        line = proc.stdout.readline()
        assert line, "the ranks never started"
        ready += line.strip().endswith("ready")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "stopping all ranks" in out
    left = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True)
    assert left.stdout.strip() == ""  # no rank left running


@pytest.mark.parametrize("rank", [1])
def test_sigterm_to_one_rank_of_train_saves_on_every_rank_and_stops_all(tmp_path, rank):
    out = tmp_path / "run"
    args = ["train", "--processes", "2", "--devices", "4", "--strategy", "dp", "--d-model", "32",
            "--layers", "1", "--heads", "2", "--batch", "16", "--steps", "400", "--log-every", "1",
            "--save-every", "1000", "--no-report", "--quiet", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "shardkit.cli", *args], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 240
    metrics = out / "metrics.jsonl"
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.1)
    ranks = subprocess.run(["pgrep", "-f", "shardkit.cli train"], capture_output=True,
                           text=True).stdout.split()  # fmt: skip
    target = [int(p) for p in ranks if _rank_of(int(p)) == rank]
    assert target, ranks
    os.kill(target[0], signal.SIGTERM)
    text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, text[-3000:]
    assert "SIGTERM at step" in text and "saved checkpoint step" in text
    from shardkit.train.checkpoint import Checkpointer

    ckpt = Checkpointer(out / "checkpoints")
    assert ckpt.latest_step() is not None and ckpt.latest_step() >= 3
    ckpt.close()


def _rank_of(pid: int) -> int | None:
    try:
        env = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"SHARDKIT_PROCESS_ID="):
            return int(item.split(b"=")[1])
    return None


def test_gloo_connection_chatter_is_hidden_unless_verbose(tmp_path):
    import io

    from shardkit.distributed.launch import launch

    script = tmp_path / "chatter.py"
    script.write_text(
        "print('[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer "
        "ranks is : 1')\nprint('3')\nprint('step 1 loss 0.5')\n"
    )
    quiet, loud = io.StringIO(), io.StringIO()
    assert launch([sys.executable, str(script)], processes=2, out=quiet) == 0
    assert launch([sys.executable, str(script)], processes=2, out=loud, verbose=True) == 0
    assert "[Gloo]" not in quiet.getvalue() and "] 3\n" not in quiet.getvalue()
    assert quiet.getvalue().count("step 1 loss 0.5") == 2
    assert loud.getvalue().count("[Gloo]") == 2


def test_the_launcher_hides_gloos_chatter_but_never_a_programs_own_numbers():
    """A line holding only a number was taken for a piece of gloo's message and dropped."""
    import io
    import threading

    from shardkit.distributed.launch import _pump

    lines = [
        "42\n",
        "[Gloo] Rank [Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected\n",
        "1\n",
        " peer ranks is : 1\n",
        "\n",
        "answer 42\n",
        "7\n",
    ]
    out, last = io.StringIO(), {}
    _pump(0, io.StringIO("".join(lines)), out, threading.Lock(), last)
    assert out.getvalue() == "[rank 0] 42\n[rank 0] answer 42\n[rank 0] 7\n"
    verbose = io.StringIO()
    _pump(0, io.StringIO("".join(lines)), verbose, threading.Lock(), {}, verbose=True)
    assert verbose.getvalue().count("[rank 0]") == len(lines)
