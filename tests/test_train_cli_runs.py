"""`shardkit train` from start to finish: a one-device run, the folder of an earlier run, the
history of a resumed run, a signal before the first step, the summary's median, skipped steps
and --no-report. In-process runs through `shardkit.cli.main`; signals go to real subprocesses.
"""

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

import pytest

from shardkit.cli import main

pytestmark = pytest.mark.slow  # whole runs of the CLI, as tests/conftest.py marks such files

SMALL = ["--d-model", "32", "--layers", "1", "--heads", "2", "--batch", "16",
         "--eval-batches", "1"]  # fmt: skip
TIMEOUT = 240


@pytest.fixture(autouse=True)
def _eight_devices():
    """JAX started with tests/conftest.py's 8 devices before any run here: `--devices 1` as the
    first run of a process would otherwise start it with one (as the CLI does in a fresh one)."""
    import jax

    assert len(jax.devices()) == 8


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_one_device_run_finishes_with_its_summary_and_report(tmp_path, capsys):
    out = tmp_path / "one"
    code = main(["train", "--steps", "4", "--log-every", "2", "--devices", "1", "--out", str(out),
                 *SMALL])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    # a step with no collectives says so instead of failing on an empty table
    assert "audit: collectives of the compiled step: none" in captured.out
    for name in ("summary.json", "metrics.json", "report.html", "metrics.jsonl"):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    # the median of two logged rows is their mean, not the upper one
    rates = [r["tokens_per_s"] for r in json.loads((out / "metrics.json").read_text())]
    assert len(rates) == 2 and rates[0] != rates[1]
    assert summary["tokens/s (median)"] == f"{statistics.median(rates):,.0f}"


def test_a_new_run_never_writes_over_an_earlier_runs_outputs(tmp_path, capsys):
    out = tmp_path / "share"
    args = ["train", "--strategy", "dp", "--devices", "2", *SMALL, "--no-report", "--quiet"]
    assert main([*args, "--steps", "4", "--log-every", "1", "--out", str(out)]) == 0
    before = {n: (out / n).read_text() for n in ("metrics.jsonl", "summary.json", "metrics.json")}
    capsys.readouterr()
    # its checkpoints elsewhere: the outputs in --out are still another run's
    code = main([*args, "--steps", "2", "--out", str(out), "--checkpoint-dir",
                 str(tmp_path / "other")])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{out} already holds an earlier run's outputs" in err
    assert "--resume" in err and "--overwrite" in err and "another --out" in err
    assert {n: (out / n).read_text() for n in before} == before  # nothing touched
    assert not (tmp_path / "other").exists()
    # --resume finds no checkpoint there: it would start over on top of the finished run
    code = main([*args, "--steps", "2", "--out", str(out), "--checkpoint-dir",
                 str(tmp_path / "other"), "--resume"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "holds no checkpoint" in err and "would write over" in err and "fix:" in err
    assert {n: (out / n).read_text() for n in before} == before
    # --overwrite replaces them, as asked
    code = main([*args, "--steps", "2", "--out", str(out), "--checkpoint-dir",
                 str(tmp_path / "other"), "--overwrite"])  # fmt: skip
    assert code == 0
    assert [r["step"] for r in _rows(out / "metrics.jsonl")] == [2]


def test_the_default_out_moves_on_past_an_earlier_runs_outputs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    earlier = tmp_path / "shardkit-train"
    earlier.mkdir()
    (earlier / "metrics.jsonl").write_text('{"step": 10, "loss": 1.0}\n')  # no checkpoints
    code = main(["train", "--strategy", "dp", "--devices", "2", *SMALL, "--steps", "2",
                 "--no-report"])  # fmt: skip
    assert code == 0, capsys.readouterr().err[-3000:]
    assert "this run writes to shardkit-train-2" in capsys.readouterr().out
    assert (earlier / "metrics.jsonl").read_text() == '{"step": 10, "loss": 1.0}\n'
    assert [r["step"] for r in _rows(tmp_path / "shardkit-train-2" / "metrics.jsonl")] == [2]


def test_a_resumed_runs_metrics_and_report_cover_the_whole_run(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--strategy", "dp", "--devices", "2", *SMALL, "--log-every", "1",
            "--save-every", "2", "--out", str(out)]  # fmt: skip
    assert main([*args, "--steps", "4", "--no-report", "--quiet"]) == 0
    # a step logged after the last checkpoint by a run that was then lost
    with (out / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 5, "loss": 99.0, "tokens_per_s": 1.0}) + "\n")
    capsys.readouterr()
    assert main([*args, "--steps", "6", "--resume"]) == 0
    text = capsys.readouterr().out
    assert "resumed  step 4" in text
    whole = json.loads((out / "metrics.json").read_text())
    assert [r["step"] for r in whole] == [1, 2, 3, 4, 5, 6]
    assert whole[4]["loss"] != 99.0  # the lost part's row is gone
    assert whole == _rows(out / "metrics.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    rates = [r["tokens_per_s"] for r in whole]
    assert summary["tokens/s (median)"] == f"{statistics.median(rates):,.0f}"


def test_skipped_steps_are_in_the_step_lines_and_no_report_still_writes_the_json(tmp_path, capsys):
    out = tmp_path / "skip"
    code = main(["train", "--strategy", "dp", "--devices", "2", *SMALL, "--lr", "1e9",
                 "--on-nonfinite", "skip", "--steps", "8", "--log-every", "2", "--out", str(out),
                 "--no-report"])  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0
    rows = _rows(out / "metrics.jsonl")
    assert any(r["skipped"] for r in rows), rows
    steps = (re.match(r"step (\d+)/8 ", x) for x in text.splitlines())
    lines = {int(m.group(1)): m.string for m in steps if m}
    assert sorted(lines) == [2, 4, 6, 8]
    for r in rows:  # the count over the logged window, in the row and in its line
        line = lines[r["step"]]
        assert (f"skipped {r['skipped']}" in line) == bool(r["skipped"]), line
        assert r["skipped"] in (0, 1, 2)
    # --no-report: no HTML report or plots, but the summary and metrics still
    assert not (out / "report.html").exists() and not (out / "loss.png").exists()
    assert json.loads((out / "summary.json").read_text())["steps"] == 8
    assert [r["step"] for r in json.loads((out / "metrics.json").read_text())] == [2, 4, 6, 8]


def _env():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    return env


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_before_the_first_step_is_one_line_and_releases_the_lock(tmp_path, sig, code):
    out = tmp_path / "run"
    log = tmp_path / "out.log"
    cmd = [sys.executable, "-m", "shardkit.cli", "train", "--out", str(out), "--steps", "50"]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=f, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
    deadline = time.monotonic() + TIMEOUT
    while "parameter layouts" not in log.read_text():  # set up, not yet compiled
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err[-3000:]
    name = signal.Signals(sig).name
    assert lines[0] == (
        f"shardkit train: {name} before the first step: nothing was trained or saved; fix: run "
        "the command again."
    ), lines[0]
    assert "compiled training step" not in log.read_text()  # it came before the first step
    assert not (out / "checkpoints.lock").exists()


def test_two_runs_on_one_out_with_their_checkpoints_elsewhere_one_is_refused(tmp_path, capsys):
    import socket

    out = tmp_path / "share"
    out.mkdir()
    lock = out / "run.lock"  # held by a live process on this host: this one
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": 0}))
    code = main(["train", "--steps", "2", "--out", str(out), "--checkpoint-dir",
                 str(tmp_path / "mine")])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert f"{out} is in use by pid {os.getpid()} on this host" in err and "run.lock" in err
    assert not (tmp_path / "mine.lock").exists()  # the checkpoint folder's lock was let go
    assert lock.exists()  # the other run's lock stays
