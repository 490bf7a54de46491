"""`shardkit train` when things go wrong: every fault ends in one line, no good checkpoint is
lost, nothing corrupt is restored silently. Real subprocesses, real signals, real files."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

SMALL = ["--strategy", "dp", "--devices", "2", "--d-model", "32", "--layers", "1", "--heads", "2",
         "--batch", "16", "--no-report", "--quiet"]  # fmt: skip
TIMEOUT = 240


def _env():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _start(cwd, *args):
    cmd = [sys.executable, "-m", "shardkit.cli", "train", *SMALL, *args]
    return subprocess.Popen(
        cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _train(cwd, *args):
    proc = _start(cwd, *args)
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, out, err


def _losses(folder):
    lines = (pathlib.Path(folder) / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines)]


def _one_line_error(err):
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert "Traceback" not in err, err[-3000:]
    return lines[-1]


def test_a_new_run_never_deletes_another_runs_checkpoints(tmp_path):
    out = tmp_path / "run"
    rc, _, err = _train(tmp_path, "--out", str(out), "--steps", "4", "--save-every", "2")
    assert rc == 0, err[-3000:]
    before = sorted(p.name for p in (out / "checkpoints").iterdir())
    rc, _, err = _train(tmp_path, "--out", str(out), "--steps", "4")
    assert rc == 2
    line = _one_line_error(err)
    assert "already holds another run's checkpoints" in line
    assert "--resume" in line and "--overwrite" in line
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == before
    # the default --out: a second run moves to the next numbered folder
    for _ in range(2):
        rc, _, err = _train(tmp_path, "--steps", "2")
        assert rc == 0, err[-3000:]
    assert (tmp_path / "shardkit-train" / "checkpoints").is_dir()
    assert (tmp_path / "shardkit-train-2" / "checkpoints").is_dir()
    # --overwrite replaces, as asked
    rc, _, err = _train(tmp_path, "--out", str(out), "--steps", "3", "--overwrite")
    assert rc == 0, err[-3000:]
    assert [s for s, _ in _losses(out)][-1] == 3


@pytest.mark.parametrize(
    "flags,match",
    [(["--keep", "0"], "keep=0 would delete every checkpoint"),
     (["--lr", "nan"], "lr=nan is not a positive finite learning rate"),
     (["--lr", "inf"], "lr=inf is not a positive finite"),
     (["--lr", "-1"], "lr=-1.0 is not a positive"),
     (["--resume", "--overwrite"], "pass one")],
)  # fmt: skip
def test_settings_that_would_lose_a_run_are_refused(tmp_path, flags, match):
    rc, _, err = _train(tmp_path, "--out", str(tmp_path / "r"), *flags)
    assert rc == 2 and match in _one_line_error(err)


def test_a_diverging_run_stops_and_keeps_its_good_checkpoints(tmp_path):
    out = tmp_path / "run"
    args = ["--out", str(out), "--steps", "60", "--save-every", "2", "--log-every", "1",
            "--lr", "1e9"]  # fmt: skip
    rc, _, err = _train(tmp_path, *args)
    assert rc == 2
    line = _one_line_error(err)
    assert "training stopped" in line and "last good checkpoint is step" in line and "--lr" in line
    last = int(line.split("last good checkpoint is step ")[1].split()[0])
    from shardkit.train.checkpoint import Checkpointer

    ckpt = Checkpointer(out / "checkpoints")
    assert ckpt.latest_step() == last  # the newest checkpoint is the last good one
    ckpt.close()
    # skipping instead: the run ends, the bad steps changed nothing
    rc, _, err = _train(tmp_path, *args[2:], "--out", str(tmp_path / "skip"),
                        "--on-nonfinite", "skip", "--steps", "8")  # fmt: skip
    assert rc == 0, err[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "skip" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("skipped") for r in rows)


def _corrupt_newest(folder: pathlib.Path) -> int:
    newest = max(int(p.name) for p in folder.iterdir() if p.name.isdigit())
    for f in (folder / str(newest)).glob("state/**/d/*"):
        raw = bytearray(f.read_bytes())
        for frac in (0.3, 0.6, 0.9):
            at = int(len(raw) * frac)
            raw[at : at + 4] = bytes(b ^ 0x5A for b in raw[at : at + 4])
        f.write_bytes(bytes(raw))
    return newest


def test_resume_falls_back_past_a_corrupt_checkpoint(tmp_path):
    out = tmp_path / "run"
    rc, _, err = _train(tmp_path, "--out", str(out), "--steps", "6", "--save-every", "2")
    assert rc == 0, err[-3000:]
    bad = _corrupt_newest(out / "checkpoints")
    rc, stdout, err = _train(tmp_path, "--out", str(out), "--steps", "8", "--resume")
    assert rc == 0, err[-3000:]
    assert f"step {bad}" in stdout + err and "moved it to" in stdout + err
    assert (tmp_path / "run" / "checkpoints.rejected" / str(bad)).is_dir()


def _wait_for_steps(folder, n, proc):
    deadline = time.monotonic() + TIMEOUT
    path = pathlib.Path(folder) / "metrics.jsonl"
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    raise AssertionError("no training progress")


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_saves_and_resume_is_bit_exact(tmp_path, sig, code):
    steps = ["--steps", "30", "--save-every", "10", "--log-every", "1"]
    rc, _, err = _train(tmp_path, "--out", str(tmp_path / "whole"), *steps)
    assert rc == 0, err[-3000:]
    proc = _start(tmp_path, "--out", str(tmp_path / "cut"), *steps)
    _wait_for_steps(tmp_path / "cut", 4, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == code, err[-3000:]
    line = _one_line_error(err)
    assert signal.Signals(sig).name in line and "saved checkpoint step" in line
    stopped = int(line.split("saved checkpoint step ")[1].split()[0])
    assert 4 <= stopped < 30  # saved on the way out, not at a save_every multiple
    rc, _, err = _train(tmp_path, "--out", str(tmp_path / "cut"), *steps, "--resume")
    assert rc == 0, err[-3000:]
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "whole")  # bit for bit


def test_two_runs_on_one_folder_one_is_refused_and_a_stale_lock_is_taken_over(tmp_path):
    out = tmp_path / "run"
    steps = ["--steps", "400", "--save-every", "50", "--log-every", "1"]
    first = _start(tmp_path, "--out", str(out), *steps)
    _wait_for_steps(out, 2, first)
    rc, _, err = _train(tmp_path, "--out", str(out), *steps, "--resume")
    assert rc == 2
    line = _one_line_error(err)
    assert f"in use by pid {first.pid} on this host" in line and "checkpoints.lock" in line
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=TIMEOUT)
    # a lock left by a process that is gone
    lock = out / "checkpoints.lock"
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": 2**22 + 7, "started": 0}))
    proc = _start(tmp_path, "--out", str(out), "--steps", "3", "--resume")
    out_text, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err[-3000:]
    assert not lock.exists()


@pytest.mark.parametrize(
    "ids,match",
    [(np.arange(200, dtype=np.float32) % 7, "not a 1-D array of integer token ids"),
     (np.arange(200, dtype=np.int32) - 3, "ids from -3 to 196")],
)  # fmt: skip
def test_token_files_that_would_train_on_garbage_are_refused(tmp_path, ids, match):
    path = tmp_path / "tokens.npy"
    np.save(path, ids)
    rc, _, err = _train(tmp_path, "--out", str(tmp_path / "r"), "--data", str(path), "--steps", "2")
    assert rc == 2 and match in _one_line_error(err)


@pytest.mark.parametrize("where", ["under-a-file", "read-only"])
def test_an_unwritable_output_folder_is_one_line_within_seconds(tmp_path, where):
    if where == "under-a-file":
        blocker = tmp_path / "a-file"
        blocker.write_text("not a folder")
        out, reason = blocker / "run", "Not a directory"
    else:  # sysfs refuses new folders even to root (chmod does not stop root)
        out, reason = pathlib.Path("/sys/shardkit-run"), "Operation not permitted"
    t0 = time.monotonic()
    rc, _, err = _train(tmp_path, "--out", str(out), "--steps", "2")
    assert rc == 2 and time.monotonic() - t0 < 60
    line = _one_line_error(err)
    assert reason in line and "fix:" in line


def _small_files():
    """In the child: files may not grow past 20 kB (EFBIG), as a full disk stops a write."""
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))


def test_a_failing_checkpoint_write_is_one_line_and_the_process_exits(tmp_path):
    cmd = [sys.executable, "-m", "shardkit.cli", "train", *SMALL, "--out", str(tmp_path / "r"),
           "--steps", "6", "--save-every", "2"]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT, preexec_fn=_small_files)  # fmt: skip
    assert proc.returncode == 2 and time.monotonic() - t0 < 120
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]
    line = _one_line_error(proc.stderr)
    assert "File too large" in line and "fix: free space" in line and "--resume" in line


def test_the_metrics_log_keeps_only_the_rows_a_run_continues(tmp_path):
    from shardkit.train.guard import MetricsLog

    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    for step in (10, 20, 30):
        log.write({"step": step, "loss": 1.0 / step})
    MetricsLog(path, start=20)  # resumed from step 20: step 30 will be logged again
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [10, 20]
    MetricsLog(path)  # a fresh run (--overwrite): its own history only
    assert path.read_text() == ""


def test_overwrite_removes_checkpoints_only_and_resume_never_starts_over_silently(tmp_path):
    out = tmp_path / "run"
    rc, _, err = _train(tmp_path, "--out", str(out), "--steps", "2", "--save-every", "2")
    assert rc == 0, err[-3000:]
    mine = out / "checkpoints" / "thesis.tex"
    mine.write_text("three years of work")
    rc, out_text, err = _train(tmp_path, "--out", str(out), "--steps", "2", "--overwrite")
    assert rc == 0, err[-3000:]
    assert mine.read_text() == "three years of work"  # a user's file in the folder stays
    # --resume where there is no checkpoint yet: says so, then starts at step 0
    fresh = tmp_path / "fresh"
    rc, text, err = _train(tmp_path, "--out", str(fresh), "--steps", "2", "--resume")
    assert rc == 0, err[-3000:]
    assert "no checkpoint in" in text + err and "starting at step 0" in text + err
    # ... but not when the earlier checkpoints were moved aside as failing their checks
    gone = tmp_path / "gone"
    (gone / "checkpoints.rejected" / "4").mkdir(parents=True)
    rc, _, err = _train(tmp_path, "--out", str(gone), "--steps", "2", "--resume")
    assert rc == 2
    line = _one_line_error(err)
    assert "no checkpoint left" in line and "checkpoints.rejected" in line and "fix:" in line
    assert not (gone / "checkpoints").exists() or not any((gone / "checkpoints").iterdir())


@pytest.mark.parametrize("hard_links", [True, False])
def test_the_run_lock_appears_with_its_owner_already_written(tmp_path, monkeypatch, hard_links):
    from shardkit.train.lock import RunLock

    seen = []
    real_link = os.link

    def link(src, dst):
        seen.append(json.loads(pathlib.Path(src).read_text())["pid"])  # complete before it shows
        if not hard_links:
            raise PermissionError("no hard links on this file system")
        return real_link(src, dst)

    monkeypatch.setattr(os, "link", link)
    with RunLock(tmp_path / "checkpoints") as lock:
        assert seen == [os.getpid()]
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints.lock"]  # no leftovers
    assert not lock.path.exists()


def test_a_step_too_big_for_the_hosts_memory_is_refused_before_it_runs(monkeypatch):
    """8 simulated devices share one host: a step whose temporaries exceed what the host has
    available was killed by the kernel at its first step, with no message."""
    import jax
    import jax.numpy as jnp

    from shardkit.train import guard

    compiled = jax.jit(lambda x: jnp.outer(x, x)).lower(jnp.ones(4096)).compile()
    mem = compiled.memory_analysis()
    temp = mem.temp_size_in_bytes + mem.output_size_in_bytes  # what the step allocates
    assert temp >= 4096 * 4096 * 4
    monkeypatch.setattr(guard, "_available_bytes", lambda: 8 * temp - 1)
    with pytest.raises(ValueError, match=r"for the 8 simulated devices that share this host.*fix"):
        guard.refuse_host_overflow(compiled)
    monkeypatch.setattr(guard, "_available_bytes", lambda: 16 * temp)
    guard.refuse_host_overflow(compiled)  # fits: nothing to say
