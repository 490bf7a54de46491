"""The pipeline seed examples run and print what their docstrings promise (run in-process)."""

import importlib.util
import pathlib
import re

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def numbers(line, pattern):
    return [float(x) for x in re.search(pattern, line).groups()]


def test_seed002_picture():
    lines = load("pipeline_seed002_picture").main()
    assert lines[0].startswith("stages: stage 0 layers 0-1, stage 1 layers 2-3")
    assert lines[1:5] == [  # the seed's "Time t: [Batch i on GPU d]" flow, from the table
        "time 0: mb 0 on stage 0",
        "time 1: mb 0 on stage 1, mb 1 on stage 0",
        "time 2: mb 0 on stage 2, mb 1 on stage 1, mb 2 on stage 0",
        "time 3: mb 0 on stage 3, mb 1 on stage 2, mb 2 on stage 1, mb 3 on stage 0",
    ]
    executed, simulated, formula = numbers(
        lines[5], r"executed ([\d.]+), simulated ([\d.]+), \(p-1\)/\(m\+p-1\) ([\d.]+)"
    )
    assert executed == simulated == formula == 0.273 and "22 steps" in lines[5]
    assert lines[6] == "1f1b p=4 m=8: 14 steps, bubble executed 0.273, simulated 0.273"
    assert lines[7].startswith("micro-batches in flight at m=32: gpipe 32, 1f1b 7")
    assert "seed's (m-p+1)/m 0.625, measured 1 - bubble 0.727" in lines[8]
    first, last = numbers(lines[9], r"loss ([\d.]+) -> ([\d.]+)")
    assert last < first - 0.1
    assert "'collective-permute': 2" in lines[9] and "all-gather" not in lines[9]


def test_seed000_two_stage():
    lines = load("pipeline_seed000_two_stage").main()
    assert lines[0].endswith("one after the other -> (64,)")
    assert lines[1] == (
        "pipeline: {'stage': 2, 'data': 4}, 4 micro-batches of 32 rows, 1f1b: 6 lockstep steps"
    )
    loss, ref, diff = numbers(
        lines[2], r"loss ([\d.]+) = sequential reference ([\d.]+); .* ([\d.e-]+)$"
    )
    assert abs(loss - ref) < 1e-4 and diff < 1e-6
    assert "'collective-permute': 2" in lines[3] and lines[3].endswith(
        "all-gather of weights: none"
    )
    assert lines[4] == "bubble: executed table 0.200, simulated 0.200, (p-1)/(m+p-1) 0.200"
    first, last = numbers(lines[5], r"loss ([\d.]+) -> ([\d.]+)")
    assert last < first


def test_seed002_3d():
    lines = load("pipeline_seed002_3d").main()
    assert lines[0] == "mesh {'stage': 2, 'data': 2, 'tensor': 2}"
    assert lines[1] == "blocks/q P('stage', None, 'tensor', None), embedding P('tensor', None)"
    assert lines[2].startswith("block parameters per device: 25% = 1 / (tensor x stage)")
    assert "'collective-permute'" in lines[3] and "'all-reduce'" in lines[3]
    assert "'all-gather': 1" in lines[3]  # the embedding table, once; no stage weight
    # data x tensor x stage = the plain trainer: loss and gradients in float32 (printed to 4
    # decimals; gradients of size ~0.1 agree within 1e-6)
    loss, ref, diff = numbers(lines[4], r"loss ([\d.]+) vs ([\d.]+), max \|dgrad\| ([\d.e-]+)")
    assert abs(loss - ref) < 1e-4 and diff < 1e-6
    first, last = numbers(lines[5], r"loss ([\d.]+) -> ([\d.]+)")
    assert last < first - 0.1
    assert lines[6].startswith("GPT-3 plan: 64 x 8 x 16 = 8192 devices; 1536 / 64 = 24")
    assert lines[7] == "  bubble (p-1)/(m+p-1) = 15/39 = 0.385 (simulated 0.385)"
