"""The inspection examples run, print what their comments say, and report the right numbers."""

import pathlib
import runpy

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, capsys) -> tuple[dict, str]:
    path = EXAMPLES / name
    ns = runpy.run_path(str(path), run_name="example")
    result = ns["main"]()
    out = capsys.readouterr().out
    expected = path.read_text().split("# Expected output:\n", 1)[1]
    expected = "\n".join(line[2:] for line in expected.strip("\n").split("\n"))
    assert out.strip("\n") == expected
    return result, out


def line_of(name: str, needle: str) -> int:
    lines = (EXAMPLES / name).read_text().split("\n")
    return next(i + 1 for i, line in enumerate(lines) if needle in line)


def test_fft_solve_seed004(capsys):
    name = "inspect_fft_solve.py"
    reports, _ = run_example(name, capsys)
    fft = reports["fft"]
    gathers = fft.of_kind("all-gather")
    assert [c.axes for c in gathers] == [("y",), ("x",)]
    whole = 16 * 16 * 16 * 8  # complex64, the whole array
    assert gathers[-1].buffer_bytes == whole and gathers[-1].bytes_moved == whole * 3 / 4
    for c in gathers:
        assert c.source.file == str(EXAMPLES / name)
        assert c.source.line == line_of(name, "return jnp.fft.fftn(a)")
    for key, needle in (("solve", "jnp.linalg.solve(a, b)"), ("lu", "lax.linalg.lu(a)")):
        (c,) = reports[key].of_kind("all-gather")
        assert (c.buffer_bytes, c.axes, c.group_size) == (16 * 16 * 4, ("x",), 8)
        assert c.source.line == line_of(name, needle)
        assert "implicit-gather" in {w.code for w in reports[key].warnings}


def test_reshard_seed000(capsys):
    reports, _ = run_example("inspect_reshard.py", capsys)
    for report in reports.values():
        (c,) = report.collectives
        assert (c.kind, c.axes, c.group_size) == ("all-to-all", ("x",), 8)
        assert c.buffer_bytes == 8 * 64 * 4 and c.bytes_moved == 8 * 64 * 4 * 7 / 8


def test_patterns_seed002(capsys):
    reports, _ = run_example("inspect_patterns.py", capsys)
    assert sorted(reports) == sorted(_LAX)
    for pattern, (report, analytic) in reports.items():
        (c,) = report.collectives
        assert c.kind == pattern and c.bytes_moved == analytic and c.axes == ("data",)
        assert c.source.line == line_of("inspect_patterns.py", f"jax.lax.{_LAX[pattern]}(")


_LAX = {
    "all-reduce": "psum",
    "all-gather": "all_gather",
    "reduce-scatter": "psum_scatter",
    "all-to-all": "all_to_all",
}
