"""`shardkit train` settings at the command line: every user error is one line on stderr that
names the flag (or the TOML file and key) and the bad value, ends with a fix in CLI terms,
and exits 2; nothing is created or run before the settings are known to be good."""

import io
import json
import sys
import warnings

import pytest

from shardkit.cli import main
from shardkit.distributed.launch import launch
from shardkit.train.config import TrainConfig, load


def _error(capsys) -> str:
    """The one line on stderr (asserting it is one line with a fix)."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "fix:" in lines[0], err
    return lines[0]


def _code(argv: list[str]) -> int:
    """`shardkit ARGV`'s exit status (a usage error exits from the parser: SystemExit)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def _toml(tmp_path, text: str, name: str = "run.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# 1. empty paths ----------------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["--out", "--data", "--checkpoint-dir", "--tensorboard"])
def test_empty_paths_are_refused_naming_the_flag(flag, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", flag, "", "--steps", "1", "--no-report"]) == 2
    err = _error(capsys)
    assert flag in err and "empty" in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written into the current folder


def test_an_empty_path_in_a_toml_file_names_the_file_and_key(tmp_path, capsys):
    path = _toml(tmp_path, 'out = ""\n')
    assert main(["train", "--config", path]) == 2
    err = _error(capsys)
    assert path in err and "out" in err and 'out = "' in err.split("fix:")[1], err


# 2. seeds ------------------------------------------------------------------------------------
def test_a_seed_beyond_int64_is_refused_at_parse_time(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["train", "--seed", str(2**63), "--out", str(out)]) == 2
    err = _error(capsys)
    assert "--seed" in err and str(2**63) in err and "OverflowError" not in err, err
    assert not out.exists()
    with pytest.raises(ValueError, match="seed"):
        TrainConfig(seed=2**63)
    assert TrainConfig(seed=2**63 - 1).seed == 2**63 - 1  # jax.random.key's largest


# 3. TOML errors name the file and the key, with the fix in TOML terms ----------------------
@pytest.mark.parametrize(
    "text, key, fix",
    [
        ('strategy = "bogus"\n', "strategy", 'strategy = "auto"'),
        ("zero = 2\n", "zero", "zero = 3"),
        ("steps = 0\n", "steps", "steps = 1"),
        ('mesh = { foo = 8 }\nstrategy = "hybrid"\n', "mesh", "mesh = {"),
        ('schedule = "bogus"\nstrategy = "hybrid"\nmesh = { data = 2, stage = 4 }\n',
         "schedule", 'schedule = "'),
        ("lr = 1e308\n", "lr", "lr = 0.003"),
        ("collective_matmul = true\n", "collective_matmul", "sequence_parallel = true"),
    ],
)  # fmt: skip
def test_toml_value_errors_name_the_file_and_key(text, key, fix, tmp_path, capsys):
    path = _toml(tmp_path, text)
    out = tmp_path / "o"
    assert main(["train", "--config", path, "--out", str(out)]) == 2
    err = _error(capsys)
    assert path in err and key in err and fix in err.split("fix:")[1], err
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--steps", "0"], "--steps"),
        (["--strategy", "hybrid", "--mesh", "foo=8"], "--mesh"),
        (["--zero", "2"], "--zero"),
    ],
)
def test_the_same_errors_from_flags_name_the_flag(argv, flag, tmp_path, capsys):
    assert _code(["train", *argv, "--out", str(tmp_path / "o")]) == 2
    err = _error(capsys)
    assert flag in err and ".toml" not in err, err


def test_a_flag_overriding_a_toml_key_is_named_as_the_flag(tmp_path, capsys):
    path = _toml(tmp_path, 'strategy = "hybrid"\nmesh = { fsdp = 4, tensor = 2 }\n')
    assert main(["train", "--config", path, "--mesh", "foo=8", "--out", str(tmp_path)]) == 2
    err = _error(capsys)
    assert "--mesh" in err and path not in err, err


def test_a_non_utf8_file_names_the_file_with_a_fix(tmp_path, capsys):
    path = tmp_path / "binary.toml"
    path.write_bytes(b"steps = 2\n\xff\xfe\n")
    assert main(["train", "--config", str(path)]) == 2
    err = _error(capsys)
    assert str(path) in err and "UTF-8" in err and "codec" not in err, err


# 4. --config itself, and --help ---------------------------------------------------------------
def test_config_without_a_value_is_one_line_naming_the_command(capsys):
    assert _code(["train", "--config"]) == 2
    err = _error(capsys)
    assert err.startswith("shardkit train: error:") and "--config" in err, err


def test_an_empty_config_path_is_not_called_a_folder(capsys):
    assert main(["train", "--config", ""]) == 2
    err = _error(capsys)
    assert "--config" in err and "empty" in err and "folder" not in err, err


def test_help_wins_over_a_bad_config_file(tmp_path, capsys):
    path = _toml(tmp_path, 'steps = "3"\n')
    with pytest.raises(SystemExit) as stop:
        main(["train", "--config", path, "--help"])
    assert stop.value.code == 0
    captured = capsys.readouterr()
    assert "--steps" in captured.out and "error" not in captured.err, captured


# 5. a key set twice ---------------------------------------------------------------------------
@pytest.mark.parametrize("key, a, b", [("d_model", "32", "48"), ("remat", '"block"', '"dots"')])
def test_a_key_at_the_top_and_under_model_is_an_error_naming_both(key, a, b, tmp_path, capsys):
    path = _toml(tmp_path, f"{key} = {a}\n[model]\n{key} = {b}\n")
    with pytest.raises(ValueError, match=rf"{key}.*\[model\]\.{key}"):
        load(path)
    assert main(["train", "--config", path]) == 2
    err = _error(capsys)
    assert path in err and a in err and b in err, err


# 6. operating-system errors name the flag whose path failed ----------------------------------
def test_out_naming_a_file_names_out(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["train", "--out", str(afile)]) == 2
    err = _error(capsys)
    assert "--out" in err and "check the path and the disk" not in err, err


def test_data_naming_a_folder_names_data(tmp_path, capsys):
    assert main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    err = _error(capsys)
    assert "--data" in err and "check the path and the disk" not in err, err
    assert not (tmp_path / "o").exists()


def test_inspect_html_under_a_file_names_html_not_train_flags(tmp_path, capsys):
    target = tmp_path / "f.py"
    target.write_text("def g(x):\n    return x * 2\n")
    (tmp_path / "afile").write_text("x")
    html = str(tmp_path / "afile" / "x.html")
    argv = ["inspect", f"{target}:g", "--mesh", "x=8", "--args", "f32[8,8]@x", "--html", html]
    assert main(argv) == 2
    err = _error(capsys)
    assert "--html" in err and "--checkpoint-dir" not in err and "--out" not in err, err


# 7. show --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--dims", "x"], ["--dims", "'x'"]),
        (["--mesh", "data=9"], ["--simulate 9"]),
        (["--mesh", "data=-1,model=-1"], ["--mesh"]),
    ],
)
def test_show_errors_name_the_flag_and_a_cli_fix(argv, needles, capsys):
    assert main(["show", "--shape", "16,16", *argv]) == 2
    err = _error(capsys)
    assert all(n in err for n in needles) and "simulate_cpu_devices" not in err, err


# 8. CLI fixes, not Python calls -----------------------------------------------------------------
def test_collective_matmul_without_sequence_parallel_gives_the_flags(tmp_path, capsys):
    assert main(["train", "--collective-matmul", "--out", str(tmp_path / "o")]) == 2
    err = _error(capsys)
    assert "--sequence-parallel" in err and "plan(" not in err, err


def test_plan_collective_matmul_without_sequence_parallel_gives_the_flags(capsys):
    assert main(["plan", "--collective-matmul"]) == 2
    err = _error(capsys)
    assert "--sequence-parallel --collective-matmul" in err and "plan(" not in err, err


def test_plan_zero_fix_is_the_flag(capsys):
    assert main(["plan", "--zero", "2"]) == 2
    err = _error(capsys)
    assert "--zero 3" in err and "zero=(" not in err, err


def test_a_bad_schedule_lists_the_interleaved_vn_form(tmp_path, capsys):
    argv = ["train", "--strategy", "hybrid", "--mesh", "data=2,stage=4", "--schedule", "bogus"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = _error(capsys)
    assert "--schedule" in err and "interleaved-v" in err, err
    assert TrainConfig(schedule="interleaved-v3").schedule == "interleaved-v3"


# 9. --json and the launcher's output --------------------------------------------------------
def test_json_final_line_on_stderr_is_not_wrapped(monkeypatch, capsys):
    import shardkit.train.run as run_module
    from shardkit.train import command

    long = "done " + "x" * 200

    class Result:
        summary, strategy, mesh_axes, collective_problems, report = {}, "dp", {}, [], None

    def fake_train(cfg, *, console=None, quiet=False):
        console.print(long)
        return Result()

    monkeypatch.setattr(run_module, "train", fake_train)
    assert main(["train", "--json", "--steps", "1"]) == 0
    captured = capsys.readouterr()
    assert long in captured.err.splitlines(), captured.err
    json.loads(captured.out)
    assert command is not None


_RANK = (
    "import os, sys\n"
    "rank = os.environ['SHARDKIT_PROCESS_ID']\n"
    "print('{\"rank\": ' + rank + '}')\n"
    "print('done ' + rank, file=sys.stderr)\n"
)


def test_launch_passes_one_ranks_stdout_through_unprefixed():
    out, err = io.StringIO(), io.StringIO()
    assert launch([sys.executable, "-c", _RANK], processes=2, out=out, err=err, plain_rank=0) == 0
    assert out.getvalue() == '{"rank": 0}\n', out.getvalue()
    assert sorted(err.getvalue().splitlines()) == [
        "[rank 0] done 0",
        "[rank 1] done 1",
        '[rank 1] {"rank": 1}',
    ]


def test_launch_reports_failures_on_stderr(capfd):
    script = "import os, sys\nprint('hi')\nsys.exit(int(os.environ['SHARDKIT_PROCESS_ID']) * 3)\n"
    assert launch([sys.executable, "-c", script], processes=2) == 3
    captured = capfd.readouterr()
    assert "[launch] rank 1 exited with status 3" in captured.err, captured
    assert "[launch]" not in captured.out and "[rank 0] hi" in captured.out, captured


# 10. float32 overflow, and no empty --out after a failed start ------------------------------
def test_lr_that_overflows_float32_is_refused_without_warnings(tmp_path, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["train", "--lr", "1e308", "--out", str(tmp_path / "o")]) == 2
    err = _error(capsys)
    assert "--lr" in err and "1e+308" in err, err
    assert not (tmp_path / "o").exists()


def test_a_strategy_error_from_the_file_names_the_file_with_toml_keys(tmp_path, capsys):
    path = _toml(tmp_path, 'strategy = "dp"\nmesh = { tensor = 8 }\n')
    assert main(["train", "--config", path, "--out", str(tmp_path / "o")]) == 2
    err = _error(capsys)
    assert path in err and 'strategy = "hybrid"' in err and "mesh = { data = 2" in err, err
    assert not (tmp_path / "o").exists()


def test_a_run_failing_at_set_up_leaves_no_empty_out(tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["train", "--d-model", "30", "--heads", "4", "--steps", "2", "--out", str(out)]
    assert main(argv) == 2
    assert "n_heads=4 does not divide d_model=30" in _error(capsys)
    assert not out.exists()


def test_the_configs_mesh_axes_and_schedules_are_the_libraries():
    from shardkit.pipeline.names import SCHEDULE_NAMES
    from shardkit.strategies.parse import MESH_AXES
    from shardkit.train import config

    assert config._MESH_AXES == MESH_AXES
    assert set(config.SCHEDULES) - {"interleaved-vN"} == set(SCHEDULE_NAMES)
