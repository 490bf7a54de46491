"""The "your model" examples (docs/your-model.md) run and print what their docstrings promise:
each library's own single-device loop and shardkit's sharded run give the same losses."""

import importlib.util
import pathlib
import re

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def losses(line):
    return [float(x) for x in re.findall(r"\d+\.\d{4}", line)]


def same_losses(lines):
    ref, ours = losses(lines[0]), losses(lines[1])
    assert len(ref) == len(ours) == 5 and all(abs(a - b) <= 2e-5 * abs(a) + 1e-4
                                               for a, b in zip(ref, ours))  # fmt: skip
    assert lines[2] == "same losses within 2e-5: True"


def test_nnx_as_flax_writes_it():
    lines = load("your_model_nnx").main()
    same_losses(lines)
    assert lines[1].endswith("(explicit mesh)")
    assert lines[3] == ("l1/kernel P('fsdp', 'tensor'), norm/scale P('fsdp',), "
                        "bn/mean (model state) P()")  # fmt: skip
    assert "0 errors" in lines[4] and "2 notes" in lines[4] and "16 mirrors" in lines[4]
    assert lines[5] == (
        "exported to plain orbax; imported on {'fsdp': 8}: 8 leaves matched, bit-exact: True"
    )


def test_linen():
    lines = load("your_model_linen").main()
    same_losses(lines)
    assert lines[3] == "Dense_0/kernel P(None, 'fsdp'), batch_stats/BatchNorm_0/mean replicated"
    assert lines[4] == "dropout 0.3: two runs alike True, unlike no dropout True"


def test_equinox():
    lines = load("your_model_equinox").main()
    same_losses(lines)
    assert lines[3] == "layers/0/weight P('tensor', 'fsdp'), layers/1/weight P('fsdp', 'tensor')"


def test_plain_functions_with_adafactor():
    lines = load("your_model_functions").main()
    same_losses(lines)
    assert lines[3] == "w1 P(None, 'tensor'), w2 P('tensor', None), b1 P(None,)"
    assert lines[4] == "optimizer state: 6 factored, 3 mirrors, 4 replicated"
