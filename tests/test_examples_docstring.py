"""The FFT, linalg and plan examples run and print exactly the output their docstrings promise."""

import ast
import os
import pathlib
import subprocess
import sys

import pytest
from expected import for_this_jax

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _expected(path):
    doc = ast.get_docstring(ast.parse(path.read_text()))
    block = doc.split("Expected output:\n", 1)[1]
    return for_this_jax([line.strip() for line in block.strip().splitlines()])


@pytest.mark.parametrize(
    "name",
    [
        "fft_seed004.py",
        "fft_poisson.py",
        "linalg_seed004.py",
        "linalg_big_system.py",
        "plan_seed002_practical.py",
    ],
)
def test_example_prints_expected_output(name):
    path = EXAMPLES / name
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line.strip() for line in out.stdout.strip().splitlines()]
    assert lines == _expected(path)
