"""The HLO reader on compiled text saved from each supported JAX (no compile here).

`tests/data/hlo/make_fixtures.py` wrote one file per program and JAX version. The versions spell
replica groups differently (0.10.2: `mesh['axis_0'=1,'axis_1'=2,'axis_2'=4], device_ids=...` and
`{{0,2,4,6},...}`; 0.12: `mesh['x'=4,'y'=2] {'x'}`), and 0.12's partitioner tags the all-gather
it inserts for a matmul with the argument's name instead of a stack frame. Every version's text
must decode to the same collectives, mesh axes, bytes, loop counts and source lines.
"""

import pathlib
import re

import pytest

from shardkit.inspection import hlo
from shardkit.inspection.audit import collectives_of

DATA = pathlib.Path(__file__).parent / "data" / "hlo"
MAKER = DATA / "make_fixtures.py"
VERSIONS = sorted({p.stem.split("-jax", 1)[1] for p in DATA.glob("*-jax*.txt")})
MESH = (("x", "y"), (4, 2))
F32 = 4


def marked_line(tag: str) -> int:
    """The line of make_fixtures.py carrying `# LINE tag`."""
    lines = MAKER.read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if line.endswith(f"# LINE {tag}"))


def load(name: str, version: str):
    module = hlo.parse_hlo((DATA / f"{name}-jax{version}.txt").read_text())
    return module, collectives_of(module, *MESH)


def test_fixtures_cover_both_ends_of_the_support_range():
    assert "0.10.2" in VERSIONS
    assert any(re.match(r"0\.12\.", v) for v in VERSIONS), VERSIONS


@pytest.mark.parametrize("version", VERSIONS)
def test_matmul_case2_all_gathers_a_over_y_at_the_matmul_line(version):
    module, (c,) = load("matmul_case2", version)
    assert module.num_partitions == 8
    assert (c.kind, c.axes, c.partial, c.group_size, c.num_groups) == (
        "all-gather",
        ("y",),
        "",
        2,
        4,
    )
    assert c.result_shapes == ("f32[64,32]",) and c.buffer_bytes == 64 * 32 * F32
    assert c.bytes_moved == 64 * 32 * F32 / 2 and c.count == 1
    assert c.source is not None and c.source.file.endswith("make_fixtures.py")
    assert c.source.line == marked_line("matmul") and c.source.function.endswith("matmul")


@pytest.mark.parametrize("version", VERSIONS)
def test_psum_in_a_fori_loop_counts_five_times_over_x(version):
    _, (c,) = load("loop_psum", version)
    assert (c.kind, c.axes, c.group_size, c.num_groups) == ("all-reduce", ("x",), 4, 2)
    assert c.count == 5
    assert c.bytes_moved == 2 * 3 / 4 * 4 * 8 * F32
    assert c.source is not None and c.source.line == marked_line("psum")


@pytest.mark.parametrize("version", VERSIONS)
def test_all_to_all_over_both_mesh_axes(version):
    _, (c,) = load("all_to_all", version)
    assert (c.kind, c.axes, c.group_size, c.num_groups) == ("all-to-all", ("x", "y"), 8, 1)
    assert c.buffer_bytes == 8 * 64 * F32 and c.count == 1
    assert c.source is not None and c.source.line == marked_line("all_to_all")


@pytest.mark.parametrize("version", VERSIONS)
def test_jnp_fftn_gathers_over_both_mesh_axes_and_both_point_at_the_call(version):
    _, colls = load("fftn", version)
    assert [(c.kind, c.axes, c.group_size) for c in colls] == [
        ("all-gather", ("y",), 2),
        ("all-gather", ("x",), 4),
    ]
    assert [c.result_shapes for c in colls] == [("c64[8,32,32]",), ("c64[32,32,32]",)]
    assert all(c.source is not None and c.source.line == marked_line("fftn") for c in colls)
