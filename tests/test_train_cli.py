"""`shardkit train`: a shortened default run learns the task and prints/writes everything."""

import json

import pytest

from shardkit.cli import main
from shardkit.train.config import TrainConfig, load


def test_default_train_shortened_reaches_accuracy(tmp_path, capsys):
    out = tmp_path / "run"
    # the defaults, shortened: 120 steps instead of 300 (same model, task, batch)
    code = main(["train", "--steps", "60", "--save-every", "30", "--out", str(out)])
    assert code == 0
    # resume on another strategy and mesh: the checkpoint reshards on restore
    code = main(
        ["train", "--steps", "120", "--save-every", "30", "--out", str(out), "--resume",
         "--strategy", "hybrid", "--mesh", "fsdp=4,tensor=2"]
    )  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    for needle in (
        "mesh",
        "the planner's top layouts on 8 x cpu",  # auto: the planner's ranking picks
        "why",
        "is predicted fastest",
        "parameter layouts",
        "blocks/q",
        "lint:",
        "resumed  step 60",
        "Mesh(fsdp=4, tensor=2",
        "collectives match the strategy",
        "memory per device",
    ):
        assert needle in text, needle
    summary = json.loads((out / "summary.json").read_text())
    # the stated accuracy: >= 0.95 of reversed digits right on held-out sequences
    assert float(summary["held-out accuracy"]) >= 0.95
    for name in ("report.html", "loss.png", "throughput.png", "metrics.json"):
        assert (out / name).stat().st_size > 0
    html = (out / "report.html").read_text()
    assert "Parameter layouts" in html and "all-reduce" in html
    assert "data:image/png;base64," in html  # the plots are inside the report
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == [
        "120",
        "60",
        "90",
    ]


def test_bad_config_values_are_clear_errors(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('strategy = "pipeline"\n')
    assert main(["train", "--config", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "strategy='pipeline' is not one of auto, dp, fsdp" in capsys.readouterr().err
    bad.write_text("stepz = 3\n")
    with pytest.raises(ValueError, match=r"unknown config key\(s\) stepz.*fix"):
        load(str(bad))
    bad.write_text('strategy = "hybrid"\nmesh = { data = 4, model = 2 }\n')
    assert main(["train", "--config", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "unknown mesh axis 'model'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="precision='fp16'"):
        TrainConfig(precision="fp16")
    with pytest.raises(ValueError, match=r"\[model\].width"):
        bad.write_text("[model]\nwidth = 3\n")
        load(str(bad))


def test_toml_then_flags(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        "steps = 7\nbatch = 16\nmesh = { fsdp = 4, tensor = 2 }\n[model]\nd_model = 32\n"
    )
    from shardkit.train.command import parse_args

    cfg = parse_args(["--config", str(path), "--steps", "9"]).settings
    assert (cfg.steps, cfg.batch, cfg.d_model, dict(cfg.mesh)) == (
        9,
        16,
        32,
        {"fsdp": 4, "tensor": 2},
    )
    # flags after and before --config both override the file; --mesh replaces its mesh
    cfg = parse_args(["--mesh", "data=8", "--layers", "3", "--config", str(path)]).settings
    assert (cfg.steps, cfg.n_layers, dict(cfg.mesh)) == (7, 3, {"data": 8})
    assert parse_args([]).settings == TrainConfig()  # no file, no flags: the defaults


def test_batch_not_divisible_by_data_axes_is_reported(tmp_path, capsys):
    code = main(
        ["train", "--steps", "2", "--batch", "6", "--strategy", "dp", "--out", str(tmp_path)]
    )
    assert code == 2
    assert "batch size 6 is not divisible by 8" in capsys.readouterr().err


def test_train_piped_to_a_file_logs_progress_while_it_runs(tmp_path):
    """As under SLURM: stdout is a file, and progress lines appear before the run ends."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDKIT_")}
    env.pop("XLA_FLAGS", None)
    log = tmp_path / "slurm.log"
    args = [sys.executable, "-m", "shardkit.cli", "train", "--steps", "5000", "--log-every", "5",
            "--out", str(tmp_path / "run"), "--no-report"]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline, steps = time.monotonic() + 240, []
        while len(steps) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
            steps = [x for x in log.read_text().splitlines() if x.startswith("step ")]
        assert proc.poll() is None  # still training: the lines came before the end
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    assert re.fullmatch(r"step 5/5000  loss \d+\.\d+  acc \d\.\d+  tok/s [\d,]+  elapsed \d+s  "
                        r"ETA \S+", steps[0]), steps[0]  # fmt: skip
    text = log.read_text()
    assert "━" not in steps[0] and "\x1b[" not in text  # no bar, no terminal codes in a log
    table = [x for x in text.splitlines() if x.startswith("│ blocks/down")]
    # the layout table is full width, not squeezed into 80 columns
    assert table and "layers,mlp,embed" in table[0] and "16.0 KiB" in table[0], table
    why = [x for x in text.splitlines() if x.startswith("why")]
    assert why and len(why[0]) > 100  # long lines stay whole in a log


def _tensorboard_scalars(folder) -> dict[str, dict[int, float]]:
    """Reads TensorBoard event files back: TFRecord frames of `Event` protos."""
    import pathlib
    import struct

    from tensorboardX.proto import event_pb2

    out: dict[str, dict[int, float]] = {}
    for path in pathlib.Path(folder).rglob("events.out.tfevents.*"):
        data = path.read_bytes()
        i = 0
        while i < len(data):
            (length,) = struct.unpack("<Q", data[i : i + 8])
            event = event_pb2.Event.FromString(data[i + 12 : i + 12 + length])
            i += 12 + length + 4  # length, its crc, the record, its crc
            for value in event.summary.value:
                out.setdefault(value.tag, {})[event.step] = value.simple_value
    return out


def test_tensorboard_scalars_and_a_profiler_trace(tmp_path, capsys):
    import math
    import pathlib

    out, tb = tmp_path / "run", tmp_path / "tb"
    code = main(["train", "--steps", "20", "--log-every", "5", "--out", str(out), "--no-report",
                 "--tensorboard", str(tb), "--profile", "5:8", "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().out[-2000:]
    scalars = _tensorboard_scalars(tb)
    assert sorted(scalars["train/loss"]) == [5, 10, 15, 20]
    logged = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    for row in logged:  # the same numbers the run logged
        assert math.isclose(scalars["train/loss"][row["step"]], row["loss"], rel_tol=1e-6)
        assert math.isclose(scalars["throughput/tokens_per_s"][row["step"]], row["tokens_per_s"],
                            rel_tol=1e-6)  # fmt: skip
    assert all(0 < v < 1.5 for v in scalars["throughput/mfu"].values())
    assert all(v > 0 for v in scalars["memory/bytes_per_device"].values())
    assert "train/accuracy" in scalars
    traces = list(pathlib.Path(out, "profile").rglob("*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0


@pytest.mark.parametrize("bad", ["8:5", "x", "3", "4:4"])
def test_a_bad_profile_window_is_one_line_with_the_fix(bad, tmp_path, capsys):
    code = main(["train", "--profile", bad, "--out", str(tmp_path / "r")])
    assert code == 2
    err = capsys.readouterr().err
    assert "is not START:STOP" in err and "fix: --profile 10:20" in err


def test_the_default_run_does_not_warn_about_its_own_strategy(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--steps", "20", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    html = (out / "report.html").read_text()
    # FSDP's parameter gathers and the gradient sums are the strategy's, not warnings
    for code in ("implicit-gather", "replicated-output"):
        assert code not in html, code
    assert "as the strategy intends (not warned about)" in text
    assert "parameters all-gathered into their compute layout (FSDP)" in text
    # static instructions and per-step executions are labelled as such
    assert "instructions in the program" in text and "executions per step" in text


def test_the_summary_puts_the_planners_prediction_beside_the_measurement(tmp_path, capsys):
    import re

    out = tmp_path / "run"
    assert main(["train", "--steps", "20", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    step = re.fullmatch(r"([\d.]+) ms measured \(median\) vs ([\d.]+) ms predicted: measured / "
                        r"predicted = ([\d.]+)", summary["step time"])  # fmt: skip
    assert step, summary["step time"]
    measured, predicted, ratio = map(float, step.groups())
    assert abs(measured / predicted - ratio) < 0.02 * ratio + 0.01
    assert "predicted (planner's 'cpu' profile)" in summary["tokens/s vs predicted"]
    mfu = re.fullmatch(r"([\d.]+)% measured vs ([\d.]+)% predicted \(of the 'cpu' profile's peak\)",
                       summary["MFU vs predicted"])  # fmt: skip
    assert mfu, summary["MFU vs predicted"]
    # one peak for both: the MFUs differ as the step times do (inversely)
    assert abs(float(mfu[2]) / float(mfu[1]) - ratio) < 0.02 * ratio + 0.02
    assert "step time" in text and "MFU vs predicted" in text


def test_train_and_devices_print_json(tmp_path, capsys):
    assert main(["train", "--steps", "10", "--out", str(tmp_path / "r"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)  # nothing but the JSON document
    assert data["steps"] == 10 and data["mesh"] and "step time" in data
    assert main(["devices", "--json"]) == 0
    devices = json.loads(capsys.readouterr().out)
    assert len(devices["devices"]) == 8 and devices["backend"] == "cpu"


def test_every_config_field_is_a_flag_with_its_choices(capsys):
    """The flags are generated from TrainConfig: none is missing, enumerations list choices."""
    import dataclasses
    import typing

    from shardkit.models.gpt import Remat
    from shardkit.pipeline.names import SCHEDULE_NAMES, schedule_from_name
    from shardkit.strategies.parse import NAMES
    from shardkit.train import config as config_module

    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    for field in dataclasses.fields(TrainConfig):
        assert f"--{field.name.replace('_', '-')}" in text or (
            field.type == "bool" and f"--no-{field.name}" in text
        ), field.name
    for flag in ("--layers", "--heads", "--config", "--processes", "--json", "--quiet"):
        assert flag in text, flag
    assert "{auto,dp,fsdp,zero1,tp,hybrid}" in text and "{float32,bfloat16}" in text
    assert "{none,block,dots}" in text and "{stop,skip}" in text and "interleaved-vN" in text
    # the choices are the names the strategies, the GPT and the pipeline accept
    assert typing.get_args(config_module.Strategy) == NAMES
    assert typing.get_args(config_module.Remat) == typing.get_args(Remat)
    assert set(SCHEDULE_NAMES) <= set(config_module.SCHEDULES)
    for name in config_module.SCHEDULES:
        schedule_from_name(name.replace("vN", "v3"))
    # each setting's flag sets it
    from shardkit.train.command import parse_args

    cfg = parse_args(["--warmup", "5", "--weight-decay", "0", "--seq-len", "32", "--digits", "9",
                      "--eval-batches", "2", "--d-ff", "96", "--no-report", "--resume",
                      "--schedule", "zb-h1", "--residuals", "stash"]).settings  # fmt: skip
    assert (cfg.warmup, cfg.weight_decay, cfg.seq_len, cfg.digits, cfg.eval_batches, cfg.d_ff,
            cfg.report, cfg.resume, cfg.schedule, cfg.residuals) == (
        5, 0.0, 32, 9, 2, 96, False, True, "zb-h1", "stash")  # fmt: skip


@pytest.mark.parametrize(
    "flag, value, match",
    [("--warmup", "-1", "warmup=-1 must be >= 0"), ("--seq-len", "1", "seq_len=1 must be >= 2"),
     ("--weight-decay", "-0.1", "weight_decay=-0.1 is not a non-negative"),
     ("--eval-batches", "0", "eval_batches=0 must be >= 1"),
     ("--d-model", "0", "d_model=0 must be >= 1")],
)  # fmt: skip
def test_numeric_settings_are_range_checked(flag, value, match, tmp_path, capsys):
    assert main(["train", flag, value, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and match in err and "fix: --" in err, err
    bad = tmp_path / "bad.toml"  # the same check for a TOML file's value
    bad.write_text(f"{flag[2:].replace('-', '_')} = {value}\n")
    with pytest.raises(ValueError, match=match):
        load(str(bad))


@pytest.mark.parametrize(
    "line, says",
    [
        (
            'overwrite = "false"',
            r"overwrite = 'false' \(str\) is not true or false; fix: overwrite = false",
        ),
        ("steps = true", r"steps = True \(bool\) is not a whole number; fix: steps = 300"),
        ("steps = 3.5", "steps = 3.5 .float. is not a whole number"),
        ('lr = "0.1"', r"lr = '0.1' \(str\) is not a number.*no quotes"),
        ("mesh = { data = 4.0, tensor = 2 }", r"mesh = .* is not a table of whole numbers"),
        ("model = 5", r"model = 5 is not a table; fix: a \[model\] table"),
        ("steps = ", r"not valid TOML \(.*line 1, column"),
    ],
)
def test_a_toml_value_of_the_wrong_type_is_refused_naming_the_file_and_key(line, says, tmp_path):
    """A string "false" was read as true: `overwrite = "false"` deleted the previous run."""
    path = tmp_path / "c.toml"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=f"{path}: " + says):
        load(str(path))


def test_a_setting_of_the_wrong_type_is_refused_from_python_too():
    with pytest.raises(ValueError, match=r"^overwrite = 'false' \(str\) is not true or false"):
        TrainConfig(overwrite="false")
    with pytest.raises(ValueError, match=r"^steps = 3.5 \(float\) is not a whole number"):
        TrainConfig(steps=3.5)


def test_a_boolean_the_file_sets_can_be_flipped_by_either_flag(tmp_path):
    from shardkit.train.command import parse_args

    path = tmp_path / "c.toml"
    path.write_text("resume = true\nreport = false\nsequence_parallel = true\n")
    on = parse_args(["--config", str(path), "--resume", "--report"]).settings
    off = parse_args(["--config", str(path), "--no-resume", "--no-sequence-parallel"]).settings
    assert (on.resume, on.report, on.sequence_parallel) == (True, True, True)
    assert (off.resume, off.report, off.sequence_parallel) == (False, False, False)


def test_resuming_a_finished_run_trains_nothing_and_rewrites_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--steps", "2", "--save-every", "2", "--out", str(out), "--quiet"]
    assert main(args) == 0
    written = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert {"summary.json", "metrics.json", "report.html"} <= set(written)
    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    said = capsys.readouterr().out
    assert "is at step 2, and --steps is 2: nothing to train" in " ".join(said.split())
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == written


def test_a_profile_window_past_the_last_step_and_empty_token_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"profile='10:20' starts at or after the last step.*fix"):
        TrainConfig(steps=4, profile="10:20")  # traced nothing, without a word
    import numpy as np

    from shardkit.train.data import TokenFile

    np.save(tmp_path / "empty.npy", np.zeros(0, np.int32))
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"holds no tokens \(shape \(0,\)\); fix"):
        TokenFile(path=str(tmp_path / "empty.npy"), seq_len=8)
    with pytest.raises(ValueError, match="is empty; fix"):
        TokenFile(path=str(tmp_path / "empty.txt"), seq_len=8)


def test_zero_runs_a_zero1_row_from_the_command_line_and_toml(tmp_path, capsys):
    """The planner ranks ZeRO-1 rows (`fsdp=4 tensor=2 (ZeRO-1)`); `--zero 1` runs them."""
    from shardkit.strategies import Hybrid
    from shardkit.train.command import parse_args
    from shardkit.train.config import load
    from shardkit.train.run import build_trainer

    args = ["--strategy", "hybrid", "--mesh", "fsdp=4,tensor=2", "--zero", "1", "--steps", "2"]
    trainer, _, _ = build_trainer(parse_args(args).settings)
    assert trainer.strategy == Hybrid(fsdp=4, tensor=2, zero=1)
    toml = tmp_path / "run.toml"
    toml.write_text('strategy = "fsdp"\nzero = 1\n')
    assert load(toml).zero == 1 and build_trainer(load(toml))[0].strategy.zero == 1
    assert main(["train", "--strategy", "dp", "--zero", "1", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--zero 1 sets the ZeRO stage of the fsdp axis" in err and "fix:" in err
