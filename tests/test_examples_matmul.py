"""The matmul seed scenarios in examples/ run and print what they promise."""

import pathlib
import runpy
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def _run(name, argv, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [name, *argv])
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    return capsys.readouterr().out


def test_seed000_variants(monkeypatch, capsys):
    out = _run("matmul_seed000_variants.py", ["--size", "128"], monkeypatch, capsys)
    assert "results match: True" in out
    assert "results match sequential: True" in out
    # the 2-D data x model product needs one all-reduce, from the compiler and from shardkit
    assert "jit             C P('data', None): 1 all-reduce" in out
    assert "all-reduce over 'model' (case 3)" in out
    # the benchmark times the three strategies, names the best and shows each one's collectives
    for name in ("replicated", "row_sharded", "col_sharded"):
        assert f"  {name}" in out
    assert out.count("no collectives (0 bytes/device)") >= 6
    assert "best strategy: " in out


def test_seed004_exercise3(monkeypatch, capsys):
    out = _run("matmul_seed004_exercise3.py", [], monkeypatch, capsys)
    assert out.count("same values, layout; no collectives") == 3
    assert "compiler   C P('x',): 1 all-reduce" in out
    assert "shard_map  C P('x',): 1 all-reduce" in out
    assert "A row-sharded, B C D replicated -> 0 bytes, no collectives" in out
    plan_line = next(line for line in out.splitlines() if "compiled plan:" in line)
    gspmd_line = next(line for line in out.splitlines() if "left-to-right" in line)
    ours = int(plan_line.rsplit(", ", 1)[1].split()[0].replace(",", ""))
    theirs = int(gspmd_line.rsplit(", ", 1)[1].split()[0].replace(",", ""))
    assert ours < theirs
