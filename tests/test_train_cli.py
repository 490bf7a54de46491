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
    assert "Parameter layouts" in html and "all-reduce" in html and "loss.png" in html
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == [
        "120",
        "60",
        "90",
    ]


def test_bad_config_values_are_clear_errors(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('strategy = "pipeline"\n')
    assert main(["train", "--config", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "unknown strategy 'pipeline'" in capsys.readouterr().err
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
    from argparse import Namespace

    from shardkit.train.command import config_from_args

    cfg = config_from_args(Namespace(config=str(path), steps=9, mesh=None))
    assert (cfg.steps, cfg.batch, cfg.d_model, dict(cfg.mesh)) == (
        9,
        16,
        32,
        {"fsdp": 4, "tensor": 2},
    )


def test_batch_not_divisible_by_data_axes_is_reported(tmp_path, capsys):
    code = main(
        ["train", "--steps", "2", "--batch", "6", "--strategy", "dp", "--out", str(tmp_path)]
    )
    assert code == 2
    assert "batch size 6 is not divisible by 8" in capsys.readouterr().err
