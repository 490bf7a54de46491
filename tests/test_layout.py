"""Layout views: any rank, text/rich/HTML, shard and tree tables, spec diffs."""

import io

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.layout import (
    diff_specs,
    format_rows,
    shard_table,
    show,
    spec_notation,
    tree_table,
)
from shardkit.linter import IndivisibleShardingError
from shardkit.mesh import make_mesh


def test_spec_notation():
    assert spec_notation((16, 16), P("data", "model")) == "W[A_data, B_model]"
    assert spec_notation(("D", "F"), P(None, ("x", "y"))) == "W[D, F_{x,y}]"
    assert spec_notation(3, P("x"), name="X") == "X[A_x, B, C]"


def test_show_2d_text_cells_match_device_blocks(axis_type):
    mesh = make_mesh({"data": 4, "model": 2}, axis_types=axis_type)
    x = jax.device_put(jnp.zeros((16, 16)), NamedSharding(mesh, P("data", "model")))
    text = show(x, format="text", file=io.StringIO())
    lines = text.splitlines()
    assert lines[0] == "x: f32[16,16]  x[A_data, B_model]  mesh data=4, model=2"
    assert "B 0:8" in lines[1] and "B 8:16" in lines[1]
    row0 = next(line for line in lines if line.startswith("A 0:4"))
    assert row0.split("|")[1].strip() == "cpu 0" and row0.split("|")[2].strip() == "cpu 1"
    row3 = next(line for line in lines if line.startswith("A 12:16"))
    assert row3.split("|")[1].strip() == "cpu 6" and row3.split("|")[2].strip() == "cpu 7"
    assert "note:" not in text


def test_show_partially_replicated_lists_all_holders():
    mesh = make_mesh({"data": 4, "model": 2})
    text = show(shape=(8, 8), mesh=mesh, spec=P("data"), format="text", file=io.StringIO())
    assert "cpu 0, cpu 1" in text and "cpu 6, cpu 7" in text


def test_show_4d_panels_and_fold_note():
    mesh = make_mesh({"a": 2, "b": 2, "c": 2})
    text = show(shape=(4, 4, 4, 4), mesh=mesh, spec=P("a", None, "b", "c"), format="text",
                file=io.StringIO())  # fmt: skip
    assert text.count("panel D ") == 2  # dim 3 sharded but not drawn: one panel per block
    assert "showing dims A (dim 0), C (dim 2)" in text
    assert "folded unsharded dims B (dim 1)" in text
    assert "one panel per block of sharded dims D (dim 3)" in text
    for dev in range(8):
        assert f"cpu {dev} " in text or f"cpu {dev}|" in text


def test_show_explicit_dims_and_bad_dims():
    mesh = make_mesh({"data": 8})
    text = show(shape=(8, 4, 2), mesh=mesh, spec=P("data"), dims=(1, 2), format="text",
                file=io.StringIO())  # fmt: skip
    assert "one panel per block of sharded dims A (dim 0)" in text
    with pytest.raises(ValueError, match="at most two distinct dims"):
        show(shape=(8, 4, 2), mesh=mesh, spec=P("data"), dims=(0, 0), format="text")


def test_show_rich_and_html(capsys):
    mesh = make_mesh({"data": 4, "model": 2})
    show(shape=(8, 4, 6), mesh=mesh, spec=P("data", None, "model"))
    out = capsys.readouterr().out
    assert "cpu 7" in out and "A 6:8" in out and "folded unsharded dims B" in out
    assert "\x1b[" not in out  # not a TTY: no colour codes
    html = show(shape=(8,), mesh=mesh, spec=P("data"), format="html")
    assert html.startswith("<div class='shardkit-layout'>") and html.count("<td") == 4


def test_show_bad_input():
    mesh = make_mesh({"data": 4, "model": 2})
    with pytest.raises(TypeError, match="expected a jax.Array"):
        show([1, 2, 3])
    with pytest.raises(TypeError, match="needs sharding= or mesh="):
        show(shape=(4,))
    with pytest.raises(IndivisibleShardingError, match=r"dim 0 has size 6"):
        show(shape=(6,), mesh=mesh, spec=P("data"))
    with pytest.raises(ValueError, match="format='svg'"):
        show(shape=(8,), mesh=mesh, spec=P("data"), format="svg")


def test_shard_table_rows():
    mesh = make_mesh({"data": 4, "model": 2})
    x = jax.device_put(jnp.zeros((8, 6), jnp.bfloat16), NamedSharding(mesh, P("data", "model")))
    rows = shard_table(x)
    assert len(rows) == 8
    assert rows[3] == {"device": "cpu 3", "process": 0, "index": "[2:4, 3:6]",
                       "shard_shape": (2, 3), "bytes": 12}  # fmt: skip
    assert "cpu 7" in format_rows(rows)


def test_tree_table_reads_array_shardings():
    mesh = make_mesh({"data": 4, "model": 2})
    tree = {
        "w": jax.device_put(jnp.zeros((8, 4)), NamedSharding(mesh, P(None, "model"))),
        "b": jax.device_put(jnp.zeros((4,)), NamedSharding(mesh, P())),
    }
    rows = {r["path"]: r for r in tree_table(tree)}
    assert rows["w"]["spec"] == "[A, B_model]" and rows["w"]["bytes_per_device"] == 8 * 2 * 4
    assert rows["b"]["spec"] == "[A]" and rows["b"]["bytes_per_device"] == 16


def test_diff_specs():
    a = {"x": P("data"), "y": P(), "z": P("model", None)}
    b = {"x": P("data", None), "y": P("model"), "z": P(None, "model")}
    assert diff_specs(a, b) == [("y", P(), P("model")), ("z", P("model", None), P(None, "model"))]
