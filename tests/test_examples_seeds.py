"""The seed scenario scripts in examples/ run, and print what their expected-output block says.

Each script forces its own 8 simulated CPU devices, so it runs in a subprocess with
``XLA_FLAGS`` removed from the environment. Two kinds of checks:

* the whole stdout equals the ``# Expected output:`` comment block at the end of the script
  (so the documented output never goes stale);
* key facts, stated here independently of that block: device labels, specs, numbers.

After an intended change of output, refresh the blocks with
``python tests/test_examples_seeds.py --update`` and review the diff.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = [
    "seed001_sharded_computation.py",
    "seed002_debugging.py",
    "seed003_three_modes.py",
    "seed004_exercise1_layouts.py",
]
MARKER = "# Expected output:"
TIMEOUT_S = 120


@functools.cache
def run(name: str) -> str:
    """Runs one example script; returns its stdout (fails the test on a non-zero exit)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        env=env,
        cwd=EXAMPLES.parent,
        timeout=TIMEOUT_S,
    )
    if proc.returncode != 0:
        pytest.fail(f"{name} exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc.stdout


def expected_block(name: str) -> str:
    """The script's expected output: the comment lines after the marker, '# ' removed."""
    text = (EXAMPLES / name).read_text()
    assert MARKER in text, f"{name} has no {MARKER!r} block"
    lines = text.split(MARKER, 1)[1].splitlines()[1:]
    return "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in lines)


def normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


@pytest.mark.parametrize("name", SCRIPTS)
def test_output_matches_expected_block(name):
    actual, expected = normalise(run(name)), normalise(expected_block(name))
    assert actual == expected, (
        f"{name}: output differs from its expected-output block; if the change is intended, "
        "run `python tests/test_examples_seeds.py --update` and review the diff."
    )


def between(out: str, start: str, end: str | None = None) -> str:
    """The part of ``out`` from the heading ``start`` to the heading ``end``."""
    i = out.index(start)
    j = out.index(end, i + len(start)) if end else len(out)
    return out[i:j]


def test_seed001_devices_and_layouts():
    out = run("seed001_sharded_computation.py")
    s1 = between(out, "== 1.", "== 2.")
    assert "devices: [CpuDevice(id=0)" in s1 and "CpuDevice(id=7)]" in s1
    assert "arr.devices(): {CpuDevice(id=0)}" in s1
    assert "SingleDeviceSharding(device=CpuDevice(id=0)" in s1
    s2 = between(out, "== 2.", "== 3.")
    assert "[auto] jax.typeof(arr_sharded) = float32[4,8]" in s2
    assert "[explicit] jax.typeof(arr_sharded) = float32[4@x,8@y]" in s2
    # 2x4 grid: devices 0-3 on the first row of blocks, 4-7 on the second.
    assert re.search(r"A 0:2 \|\s*cpu 0\s*\|\s*cpu 1\s*\|\s*cpu 2\s*\|\s*cpu 3\s*\|", s2)
    assert re.search(r"A 2:4 \|\s*cpu 4\s*\|\s*cpu 5\s*\|\s*cpu 6\s*\|\s*cpu 7\s*\|", s2)


def test_seed001_jit_constraint_and_shard_map():
    out = run("seed001_sharded_computation.py")
    s3 = between(out, "== 3.", "== 4.")
    assert s3.count("shardings match: True") == 2
    # sum over axis 0 of arange(32).reshape(4, 8): column sums 48, 52, ..., 76.
    total = "[48. 52. 56. 60. 64. 68. 72. 76.]"
    assert f"[auto] f_contract: spec P('y',), value {total}" in s3
    assert f"[explicit] f_contract: spec P('y',), value {total}" in s3
    assert "| cpu 0, cpu 4 |" in s3  # partially replicated over mesh axis x
    s4 = between(out, "== 4.", "== 5.")
    assert f"[auto] spec P('x',), value {total}" in s4
    assert "can only refer to Auto axes" in s4
    assert f"[explicit] reshard: spec P(('x', 'y'),), value {total}" in s4
    assert s4.count("| cpu 0 | cpu 1 | cpu 2 | cpu 3 | cpu 4 | cpu 5 | cpu 6 | cpu 7 |") == 2
    s5 = between(out, "== 5.", "== 6.")
    assert s5.count("shard_map(f_elementwise): [1.     2.6829 2.8186 1.2822]... shape (32,)") == 2
    assert s5.count("device local shape: x.shape=(4,)") == 2
    assert s5.count("sum per shard: [  6  22  38  54  70  86 102 118]") == 2
    assert s5.count("psum over 'x': 496 (jnp.sum: 496)") == 2
    assert "does not match the specs of the input" in s5


def test_seed001_three_ways_to_shard_a_layer():
    out = run("seed001_sharded_computation.py")
    s6 = between(out, "== 6.")
    ref = re.search(r"single device: \[([^\]]+)\]", s6).group(1)
    values = [float(v) for v in ref.split()]
    assert len(values) == 4 and all(0 < v < 1 for v in values)  # sigmoid outputs
    # Every way, on both meshes, prints the reference values with one all-reduce.
    ways = re.findall(r"way \d, [^:]+: \[([^\]]+)\]  \[([^\]]+)\]", s6)
    assert len(ways) == 6
    assert all(v == ref and comm == "all-reduce x1" for v, comm in ways)
    assert s6.count("matches single device: True") == 6
    assert "matches single device: False" not in s6
    assert "ShardingTypeError: Contracting dimensions are sharded" in s6
    assert "0 errors" in s6


def test_seed002_debugging_checks():
    out = run("seed002_debugging.py")
    # Seed's full size: x (128, 4096) over data=4 is 512 KiB, w (4096, 2048) over model=2 16 MiB.
    assert "0 errors" in out and "16.5 MiB per device" in out
    for kind in ("auto", "explicit"):
        part = between(out, f"== {kind} mesh", "==" if kind == "auto" else "== debugging")
        assert "matches numpy: True" in part
        assert "collectives: none" in part  # y[data, model] needs no communication
        assert "spec=P('data', 'model')" in part
        assert "Device: cpu:0, Shape: (32, 128)" in part
        assert re.search(r"A 96:128 \|\s*cpu 6\s*\|\s*cpu 7\s*\|", part)
        assert part.count("(32, 128)    16.0 KiB") == 8  # shard table: 8 equal shards
    assert "jax.typeof(y): float32[128@data,256@model]" in out
    assert "jax.typeof(y): float32[128,256]" in out
    mistake = between(out, "== debugging")
    assert mistake.count("w: intended P(None, 'model'), actual P('model', None)") == 2
    assert mistake.count("w[D, F_model] -> w[D_model, F]") == 2
    assert mistake.count("collectives: all-reduce x1") == 2
    assert mistake.count("y spec: P('data', None) | shard shape: (32, 256)") == 2
    assert mistake.count("matches numpy: True") == 2
    assert "| cpu 0, cpu 1 |" in mistake


def test_seed003_three_modes_agree():
    out = run("seed003_three_modes.py")
    loss = re.search(r"reference \(1 device\): loss (\d+\.\d+)", out).group(1)
    runs = [("automatic", "Auto"), ("explicit", "Explicit"), ("manual", "Explicit"),
            ("manual", "Auto")]  # fmt: skip
    for mode, axes in runs:
        tag = f"[{mode}, {axes} mesh]"
        assert f"{tag} matches the reference: True" in out
        assert re.search(
            rf"{re.escape(tag)} y: float32\[16\S*,8\] spec P\('data', None\); loss {loss}", out
        )
        assert f"{tag} grad w1 spec P(None, 'model')" in out
    assert "matches the reference: False" not in out
    assert "[explicit, Explicit mesh] y: float32[16@data,8] spec P('data', None)" in out
    assert "[automatic, Auto mesh] y: float32[16,8] spec P('data', None)" in out
    assert "unchanged code -> ShardingTypeError" in out
    assert "h is float32[16@data,16@model]" in out
    assert "per device: x (4, 8), w1 (8, 8), w2 (8, 8)" in out
    table = between(out, "== side by side", "== 4.")
    assert len(re.findall(r"all-reduce x\d+\s+True", table)) == 4


def test_seed003_partitionable_rng():
    out = run("seed003_three_modes.py")
    rng = between(out, "== 4.")
    assert "jax_threefry_partitionable default: True" in rng
    for kind in ("auto", "explicit"):
        on = f"partitionable=True [{kind}] sharded draw == unsharded draw: True; collectives: none"
        assert on in rng
        off = re.search(rf"partitionable=False \[{kind}\] [^;]+: True; collectives: (.+)", rng)
        assert off and off.group(1) != "none"  # the old stream needs communication
    first = re.findall(r"first values: \[([^\]]+)\]", rng)
    assert len(first) == 2 and first[0] != first[1]  # two different random streams
    assert "out_sharding= draw: float32[16@data,16@model] equal: True" in rng


SEED004_GRIDS = {
    "rows over 8 devices": [f"cpu {d}" for d in range(8)],
    "subset of devices": [f"cpu {d}" for d in range(4)],
    "1.1 transposed": [" | ".join(f"cpu {d}" for d in range(8))],
    "1.2 2-D": ["cpu 0 | cpu 1 | cpu 2 | cpu 3", "cpu 4 | cpu 5 | cpu 6 | cpu 7"],
    "1.2 transposed 2-D": ["cpu 0 | cpu 4", "cpu 1 | cpu 5", "cpu 2 | cpu 6", "cpu 3 | cpu 7"],
    "1.3 partial mesh": ["cpu 0 | cpu 2", "cpu 4 | cpu 6"],
    "1.4 mysterious:": ["cpu 0 | cpu 2", "cpu 4 | cpu 6", "cpu 1 | cpu 3", "cpu 5 | cpu 7"],
    "1.4 mysterious, second": [
        "cpu 0 | cpu 2",
        "cpu 4 | cpu 6",
        "cpu 1 | cpu 3",
        "cpu 5 | cpu 7",
    ],  # fmt: skip
}


def grid_rows(part: str) -> list[str]:
    """The cell rows of a text layout, cells joined by ' | ', whitespace squeezed."""
    rows = []
    for line in part.splitlines():
        if "|" in line and "cpu" in line:
            cells = [c.strip() for c in line.split("|")[1:-1]]
            rows.append(" | ".join(cells))
    return rows


@pytest.mark.parametrize("title", list(SEED004_GRIDS))
def test_seed004_exercise_layouts(title):
    out = run("seed004_exercise1_layouts.py")
    start = out.index(f"== {title}")
    end = out.find("\n== ", start + 1)
    part = out[start : end if end != -1 else len(out)]
    assert grid_rows(part.split("[auto]")[0]) == SEED004_GRIDS[title]
    assert "[auto] with_sharding_constraint gives the same layout: True" in part
    assert "matches the seed's picture: True" in part
    assert "values unchanged: True" in part


def test_seed004_extras():
    out = run("seed004_exercise1_layouts.py")
    assert "Mesh(x=4; explicit; 4 devices cpu:0-3, 1 process)" in out
    assert "Mesh(x=2, y=2; explicit; 4 devices cpu:0,2,4,6, 1 process)" in out
    assert "both answers put every block on the same device: True" in out
    assert "cpu 1   0        [8:12, 0:8]    (4, 8)       128 B" in out
    assert "duplicate-axis" in out
    assert "dim 1 has size 16, which mesh axis 'y' (size 3)" in out
    assert "can only refer to Auto axes" in out


def _update_blocks() -> None:
    for name in SCRIPTS:
        path = EXAMPLES / name
        head = path.read_text().split(MARKER, 1)[0]
        out = normalise(run(name))
        block = "\n".join(f"# {line}" if line else "#" for line in out.splitlines())
        path.write_text(f"{head}{MARKER}\n#\n{block}\n")
        print(f"updated {path}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/test_examples_seeds.py --update")
    _update_blocks()
