"""The training examples run and print what their docstrings promise (run in-process)."""

import importlib.util
import pathlib
import re

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_seed000_parallel_layers():
    lines = load("train_seed000_parallel_layers").main()
    assert (
        lines[0].startswith("parallel linear: yP(None, 'tensor')") and "collectives {}" in lines[0]
    )
    assert float(re.search(r"max err ([\d.e+-]+)", lines[0]).group(1)) < 1e-4
    assert "layers/0/kernel P(None, 'tensor'), layers/1/kernel P('tensor', None)" in lines[1]
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", lines[1]).groups())
    assert last < first
    assert "params 1/8 per device: True; collectives all-gather, all-reduce" in lines[2]
    before, after = map(float, re.search(r"([\d.]+) MiB -> ([\d.]+) MiB", lines[3]).groups())
    assert "max diff 0.0" in lines[3] and after < before  # remat keeps fewer bytes
    assert lines[4] == "adaptive: small (64,) -> P(None,); big (4096, 256) -> P('data', None)"


def test_seed002_practical():
    lines = load("train_seed002_practical").main()
    assert all(line.endswith("expected: ok") for line in lines)
    assert "collectives {'all-reduce': 1}" in lines[0]
    assert "q P(None, None, 'tensor', None)" in lines[1] and "all-gather" not in lines[1]
    assert "shard (2, 32, 4, 8)" in lines[2] and "params per device 25%" in lines[2]


def test_seed003_training_loop(tmp_path):
    lines = load("train_seed003_training_loop").main(steps=30, folder=str(tmp_path))
    assert lines[0].startswith("mesh {'fsdp': 4, 'tensor': 2}")
    assert "restored on {'data': 8}: same parameters True" in lines[3]
    losses = [float(x) for x in re.findall(r"loss ([\d.]+)", "\n".join(lines))]
    assert losses[-1] < losses[0]


def test_seed004_flax():
    lines = load("train_seed004_flax").main()
    assert lines[0] == (
        "logical names: layers/0/kernel ('embed', 'mlp'), layers/1/kernel ('mlp', 'embed')"
    )
    assert "P('fsdp', 'tensor')" in lines[3]
    assert lines[-1] == "all strategies agree within 1e-5: True"
