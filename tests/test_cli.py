"""The shardkit command: show on 1-D..4-D arrays, devices, bad arguments, lazy imports."""

import json
import os
import subprocess
import sys

import pytest

from shardkit.cli import CLIError, main, parse_mesh_arg, parse_shape_arg, parse_spec_arg


@pytest.mark.parametrize(
    "shape, spec, mesh, expect",
    [
        ("16", "data", "data=8", ["A 14:16", "cpu 7"]),
        ("16,16", "data,model", "data=4,model=2", ["A 12:16", "B 8:16", "cpu 6"]),
        ("8,4,6", "data,none,model", "data=4,model=2", ["folded unsharded dims B", "cpu 7"]),
        ("4,4,4,4", "a,_,b,c", "a=2,b=2,c=2", ["panel D 2:4", "one panel per block", "cpu 5"]),
    ],
)
def test_show_ranks(capsys, shape, spec, mesh, expect):
    rc = main(["show", "--mesh", mesh, "--shape", shape, "--spec", spec, "--format", "text"])
    out = capsys.readouterr().out
    assert rc == 0
    for piece in expect:
        assert piece in out


def test_show_demo_tour(capsys):
    assert main(["show", "--format", "text"]) == 0
    out = capsys.readouterr().out
    assert out.count("# ") == 5 and "x[A_{data,model}]" in out and "panel" in out


def test_devices(capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "8 device(s), 1 process(es)" in out and out.count(" cpu ") == 8


@pytest.mark.parametrize(
    "argv, match",
    [
        (["show", "--mesh", "data4", "--shape", "8"], "write mesh axes as name=size"),
        (["show", "--mesh", "data=four", "--shape", "8"], "not an integer"),
        (["show", "--mesh", "data=8", "--shape", "8,x"], "write dims as integers"),
        (["show", "--mesh", "data=8", "--shape", "8,"], "write dims as integers"),
        (["show", "--mesh", "data=8", "--shape", "0"], "positive integers"),
        (["show", "--mesh", "data=8", "--shape", "6", "--spec", "data"], "dim 0 has size 6"),
        (["show", "--mesh", "data=8", "--shape", "8", "--spec", "model"], "'model' is not in"),
        (["show", "--mesh", "data=16", "--shape", "16", "--spec", "data"], "needs 16 devices"),
        (
            ["show", "--mesh", "data=2,data=8", "--shape", "16", "--spec", "data"],
            "mesh axis 'data' is given twice; fix",
        ),  # fmt: skip
        (
            [
                "show",
                "--mesh",
                "data=4,model=2",
                "--shape",
                "16,16",
                "--spec",
                "data,model",
                "--dims",
                "5,6",
            ],
            "dims=(5, 6): dim 5 is out of range for a rank-2 array; fix",
        ),  # fmt: skip
        (["show", "--spec", "data"], "need --shape"),
        (["show", "--simulate", "100000"], "100000 devices is more than 4096"),
    ],
)
def test_bad_arguments(capsys, argv, match):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert match in err and err.startswith("shardkit show: error:")


def test_parsers():
    from jax.sharding import PartitionSpec as P

    assert parse_mesh_arg("data=4,model=-1") == {"data": 4, "model": -1}
    assert parse_shape_arg("8x4") == (8, 4)
    assert parse_spec_arg("data+model,none,_") == P(("data", "model"), None, None)
    with pytest.raises(CLIError, match="--mesh is empty"):
        parse_mesh_arg(",")


def test_unknown_subcommand_is_an_argparse_error():
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2


def test_help_imports_no_jax():
    code = (
        "import sys; from shardkit.cli import main\n"
        "try: main(['--help'])\nexcept SystemExit: pass\n"
        "print('jax' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False")
    assert "devices" in out.stdout and "train" in out.stdout and "inspect" in out.stdout
    # `shardkit train --help`: tyro builds the flags from TrainConfig, still without JAX
    out = subprocess.run([sys.executable, "-c", code.replace("'--help'", "'train', '--help'")],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.strip().endswith("False") and "--weight-decay" in out.stdout


@pytest.mark.parametrize(
    "argv, match",
    [
        (["plan", "--seq", "0"], r"argument --seq: 0 is below 1"),
        (["plan", "--max-stage", "0"], r"argument --max-stage: 0 is below 1"),
        (["plan", "--top", "-1"], r"argument --top: -1 is below 1"),
        (["plan", "--virtual", "0"], r"argument --virtual: 0 is below 1"),
        (["launch", "-n", "2", "--timeout", "-1", "--", "true"], r"-1 is not a positive number"),
        (["plan", "--devices", "x"], r"argument --devices: 'x' is not an integer"),
        (["train", "--processes", "0"], r"argument --processes: 0 is below 1"),
        (["train", "--strategy", "bogus"], r"invalid choice 'bogus' for argument '--strategy'"),
        (["train", "--stepz", "3"], r"Unrecognized options: --stepz"),
        (["train", "--lr", "abc"], r"--lr.*'abc'"),
        (["train", "--steps"], r"Missing value for argument '--steps'"),
        (["train", "--mesh", "data"], r"write mesh axes as name=size"),
        (["launch", "-n", "2", "--port", "99999", "--", "true"], r"99999 is not a TCP port"),
        (["show", "--simulate", "0"], r"argument --simulate: 0 is below 1"),
        (["show", "--format", "pdf"], r"argument --format: invalid choice"),
    ],
)
def test_bad_flag_values_are_one_line_with_a_fix_and_exit_2(argv, match, capsys):
    import re

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err  # no usage block, one line
    assert re.search(match, err) and f"fix: see shardkit {argv[0]} --help" in err, err


def test_file_problems_are_one_line_with_a_fix(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n")
    assert main(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "bad.py:1:" in err and "fix:" in err, err
    assert main(["train", "--config", str(tmp_path / "nope.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("fix:") == 1 and "not found" in err, err  # one fix, not two


def test_show_html_is_a_styled_document_with_index_ranges(capsys):
    assert main(["show", "--format", "html", "--simulate", "8"]) == 0  # the tour, no --shape
    tour = capsys.readouterr().out
    assert tour.startswith("<!doctype html>") and "<style>" in tour and tour.count("<table") >= 3
    assert main(["show", "--shape", "8,8", "--spec", "data,model", "--mesh", "data=4,model=2",
                 "--format", "html", "--simulate", "8"]) == 0  # fmt: skip
    one = capsys.readouterr().out
    assert one.startswith("<!doctype html>") and "A 0:2" in one and "B 4:8" in one


def test_devices_defaults_to_the_8_simulated_devices_the_other_commands_use():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run([sys.executable, "-m", "shardkit.cli", "devices"], env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0 and "8 device(s)" in out.stdout, out.stdout + out.stderr


def test_a_bare_plan_plans_its_default_model_on_its_default_devices(capsys):
    assert main(["plan", "--top", "1"]) == 0  # gpt3-175b, the old default, fits on no 8 x h100
    assert "llama3-8b" in capsys.readouterr().out


def test_plan_your_own_transformer_from_flags_or_a_toml_file(tmp_path, capsys):
    import json

    args = ["plan", "--devices", "8", "--batch", "16", "--top", "2", "--json"]
    arch = ["--layers", "8", "--d-model", "1024", "--heads", "8", "--kv-heads", "2",
            "--vocab", "32000", "--seq", "1024"]  # fmt: skip
    assert main([*args, *arch]) == 0
    flags = json.loads(capsys.readouterr().out)
    model = tmp_path / "model.toml"
    model.write_text("layers = 8\nd_model = 1024\nheads = 8\nkv_heads = 2\nvocab = 32000\n"
                     "seq = 1024\n")  # fmt: skip
    assert main([*args, "--model-file", str(model)]) == 0
    toml = json.loads(capsys.readouterr().out)
    assert flags["candidates"] == toml["candidates"]  # the same model either way
    assert main([*args, "--model", "llama3-8b", "--layers", "8"]) == 0  # a preset, changed
    changed = json.loads(capsys.readouterr().out)
    assert main([*args, "--model", "llama3-8b"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert changed["candidates"][0]["step_time"] < whole["candidates"][0]["step_time"]
    assert main(["plan", "--layers", "8", "--d-model", "1024"]) == 2
    assert "lacks heads, vocab, seq; fix: pass --heads N --vocab N --seq N" in (
        capsys.readouterr().err)  # fmt: skip
    model.write_text("layerz = 8\n")
    assert main(["plan", "--model-file", str(model)]) == 2
    assert "unknown field(s) layerz; fix:" in capsys.readouterr().err


def test_inspect_of_a_library_function_names_that_function_not_the_launcher():
    """Run as users do, through the installed `shardkit` script: the collectives of
    jax.numpy.fft.fftn come from fftn's definition, not from the launcher or shardkit."""
    import pathlib

    script = pathlib.Path(sys.executable).parent / "shardkit"
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable}: shardkit is not installed there")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [str(script), "inspect", "jax.numpy.fft:fftn", "--mesh", "x=4,y=2", "--json",
         "--args", "c64[64,64,64]@x,y"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    sources = [c["source"] for c in report["collectives"]]
    assert sources and all(s is not None for s in sources), sources
    for s in sources:
        assert s["function"] == "fftn" and s["file"].endswith("numpy/fft.py"), s
    assert all(str(script) not in w["message"] for w in report["warnings"]), report["warnings"]


def test_show_json_gives_each_devices_block():
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        code = main(["show", "--shape", "8,6", "--mesh", "data=4,model=2", "--spec", "data,model",
                     "--json", "--simulate", "8"])  # fmt: skip
    assert code == 0
    doc = json.loads(buf.getvalue())
    assert doc["shape"] == [8, 6] and doc["mesh"] == {"data": 4, "model": 2}
    assert doc["spec"] == ["data", "model"] and doc["notation"] == "x[A_data, B_model]"
    blocks = sorted(tuple(map(tuple, d["block"])) for d in doc["devices"])
    # 4 row blocks of 2 x 2 column blocks of 3: every element on exactly one device
    assert blocks == sorted(((r, r + 2), (c, c + 3)) for r in range(0, 8, 2) for c in (0, 3))
    assert all(d["shard_shape"] == [2, 3] and d["bytes"] == 24 for d in doc["devices"])
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["show", "--json", "--simulate", "8"]) == 0  # the tour, as a JSON list
    tour = json.loads(buf.getvalue())
    assert len(tour) == 5 and tour[1]["spec"] == ["data", "model"]
    assert tour[0]["spec"] == [["data", "model"]]  # one dim over two mesh axes


def test_show_takes_a_mesh_smaller_than_the_devices(capsys):
    """--mesh data=2,model=2 on 8 devices asked for a Python-only fix (devices=...[:4])."""
    argv = ["show", "--mesh", "data=2,model=2", "--shape", "4,4", "--spec", "data,model"]
    assert main([*argv, "--format", "text"]) == 0
    out = capsys.readouterr().out
    assert "mesh data=2, model=2" in out and "cpu 3" in out and "cpu 4" not in out


def test_an_error_of_any_kind_is_one_line_and_the_interrupt_says_so(tmp_path, monkeypatch, capsys):
    target = tmp_path / "f.py"
    target.write_text("def g(x):\n    return {}['a']\n")
    assert main(["inspect", f"{target}:g", "--mesh", "x=8", "--args", "f32[8,8]@x"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "shardkit inspect: error: KeyError: 'a' (--debug: traceback)"

    def stopped(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("shardkit.cli._cmd_devices", stopped)
    assert main(["devices"]) == 130
    assert capsys.readouterr().err.strip() == "shardkit devices: interrupted"  # was empty


def test_plan_refuses_what_it_would_ignore_and_counts_small_models(capsys):
    assert main(["plan", "--virtual", "3"]) == 2  # ignored without the interleaved schedule
    assert "fix: add --schedule interleaved" in capsys.readouterr().err
    assert main(["plan", "--model", "resnet50", "--seq", "128"]) == 2  # a raw TypeError before
    assert "model 'resnet50' (Dense) has no setting seq; fix" in capsys.readouterr().err
    argv = [
        "plan",
        "--layers",
        "2",
        "--d-model",
        "64",
        "--heads",
        "4",
        "--vocab",
        "16",
        "--seq",
        "16",
        "--batch",
        "8",
        "--devices",
        "8",
        "--hardware",
        "cpu",
        "--top",
        "1",
    ]
    assert main(argv) == 0
    assert "custom: 100.7K params" in capsys.readouterr().out  # was "0.00B params"
