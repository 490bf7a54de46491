"""Report renderings, assert_collectives, compiled layouts and the `shardkit inspect` command."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.inspection as si
from shardkit.cli import main as cli_main


@pytest.fixture
def mesh(axis_type):
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2)


def psum_program(mesh):
    def local(a):
        return jax.lax.psum(a, "data")  # the collective's line

    f = lambda a: jax.shard_map(local, mesh=mesh, in_specs=P("data"), out_specs=P())(a)  # noqa: E731
    x = jax.ShapeDtypeStruct((32, 8), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    return f, x, local.__code__.co_firstlineno + 1


def test_text_dict_json_html_rich(mesh, capsys):
    f, x, line = psum_program(mesh)
    report = si.inspect(f, x)
    moved = 2 * 8 * 8 * 4 * 3 / 4  # all-reduce of f32[8,8] over data (n=4)
    text = str(report)
    assert "all-reduce" in text and "f32[8,8]" in text and "data" in text
    assert f"test_inspection_report.py:{line}" in text
    assert "384 B" in text and "2(n-1)/n x operand bytes" in text
    assert "memory per device: arguments 256 B" in text  # (32/4)*8*4 bytes
    d = json.loads(report.to_json())
    (c,) = d["collectives"]
    assert (c["kind"], c["axes"], c["group_size"], c["count"]) == ("all-reduce", ["data"], 4, 1)
    assert c["bytes_moved"] == moved and c["source"]["line"] == line
    assert d["totals"]["by_kind"] == {
        "all-reduce": {"count": 1, "bytes": moved, "count_known": True}
    }
    assert d["totals"]["by_axis"] == {"data": {"count": 1, "bytes": moved, "count_known": True}}
    assert (
        d["memory"]["argument_bytes"] == 256
        and d["memory"]["total_bytes"]
        == sum(d["memory"][k] for k in ("argument_bytes", "output_bytes", "temp_bytes"))
        - d["memory"]["alias_bytes"]
    )
    html = report.to_html()
    assert html.startswith('<div class="shardkit-report">') and "<td>all-reduce</td>" in html
    assert report._repr_html_() == html
    import rich

    rich.print(report)
    out = capsys.readouterr().out
    assert "all-reduce" in out and "data" in out and "replicated-output" in out


def test_html_escapes():
    report = si.Report(
        name="<jit>",
        mesh={"x": 8},
        platform="cpu",
        collectives=(),
        memory=None,
        cost=si.Cost(None, None, None),
        warnings=(si.Finding("large-collective", "a < b & c"),),
    )
    html = report.to_html()
    assert "&lt;jit&gt;" in html and "a &lt; b &amp; c" in html and "<jit>" not in html
    assert "cost per device: ?FLOP" in report.to_text()


def test_assert_collectives_passes_and_returns_report(mesh):
    f, x, _ = psum_program(mesh)
    report = si.assert_collectives(
        f, x, forbid=["all-gather"], expect={"all-reduce": 1}, max_bytes=384, max_total_bytes=384
    )
    assert report.counts() == {"all-reduce": 1}


def test_assert_collectives_failures_name_the_source_line(mesh):
    f, x, line = psum_program(mesh)
    where = f"test_inspection_report.py:{line}"
    with pytest.raises(si.CollectiveAssertionError, match=r"forbidden all-reduce: 1 found") as e:
        si.assert_collectives(f, x, forbid=["all-reduce"])
    assert where in str(e.value) and "384 B per device" in str(e.value)
    assert e.value.problems == ["forbidden all-reduce: 1 found"]
    with pytest.raises(AssertionError, match=r"expected 2 all-reduce per call, found 1"):
        si.assert_collectives(f, x, expect={"all-reduce": 2})
    with pytest.raises(AssertionError, match=r"expected 0 all-reduce") as e:
        si.assert_collectives(f, x, expect={"all-reduce": 0, "all-to-all": 0})
    assert where in str(e.value)
    with pytest.raises(AssertionError, match=r"1 collective\(s\) move more than 383 bytes"):
        si.assert_collectives(f, x, max_bytes=383)
    with pytest.raises(AssertionError, match=r"move 384 bytes per device per call, more than 300"):
        si.assert_collectives(f, x, max_total_bytes=300)


def test_assert_collectives_bad_options(mesh):
    f, x, _ = psum_program(mesh)
    with pytest.raises(ValueError, match=r"forbid=.*unknown collective kind 'allgather'"):
        si.assert_collectives(f, x, forbid=["allgather"])
    with pytest.raises(ValueError, match=r"expect=.*unknown collective kind 'psum'"):
        si.assert_collectives(f, x, expect={"psum": 1})
    with pytest.raises(ValueError, match=r"a count must be an int >= 0"):
        si.assert_collectives(f, x, expect={"all-reduce": -1})


def test_compiled_layout_requested_vs_compiled():
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    w = jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    b = jax.ShapeDtypeStruct((32,), jnp.float32)  # not placed: the compiler chooses

    def step(w, b):
        return {"y": w + b, "s": w.sum()}

    layout = si.compiled_layout(step, w, b)
    entries = {e.path: e for e in (*layout.inputs, *layout.outputs)}
    assert entries["w"].requested == entries["w"].compiled == "w[A_data, B]"
    assert not entries["w"].changed
    assert entries["b"].requested is None and entries["b"].compiled == "b[A]"
    assert entries["out/y"].compiled == "out[A_data, B]" and entries["out/s"].compiled == "out[]"
    assert {e.path for e in layout.changed()} == {"b", "out/s", "out/y"}
    asked = NamedSharding(mesh, P(None, "data"))
    layout = si.compiled_layout(step, w, b, out_shardings={"s": None, "y": asked})
    y = next(e for e in layout.outputs if e.path == "out/y")
    # compiled with the request, as jax.jit(step, out_shardings=...) does: nothing changed
    assert (y.requested, y.compiled, y.changed) == ("out[A, B_data]", "out[A, B_data]", False)
    assert "requested out[A, B_data], compiled out[A, B_data]" in str(layout)
    d = layout.to_dict()
    assert {e["path"] for e in d["inputs"]} == {"w", "b"}
    with pytest.raises(TypeError, match=r"compiled_layout\(step, \.\.\.\): the arguments do not"):
        si.compiled_layout(step, w)


def test_report_carries_layout(mesh):
    f, x, _ = psum_program(mesh)
    report = si.inspect(f, x)
    (out,) = report.layout.outputs
    assert out.compiled == "out[A, B]" and out.changed
    assert "layout changed by the compiler" in report.to_text()


# ---- the command line -----------------------------------------------------------------------


def test_cli_function_and_args_json(capsys):
    rc = cli_main(
        [
            "inspect",
            "jax.numpy.fft:fftn",
            "--mesh",
            "x=4,y=2",
            "--args",
            "c64[16,16,16]@x,y",
            "--json",
        ]
    )
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    gathers = [c for c in d["collectives"] if c["kind"] == "all-gather"]
    assert gathers and d["mesh"] == {"x": 4, "y": 2}
    assert sum(c["buffer_bytes"] for c in gathers if c["axes"] == ["x"]) == 16 * 16 * 16 * 8
    assert "implicit-gather" in {w["code"] for w in d["warnings"]}


def test_cli_spec_file_text_and_html(tmp_path, capsys):
    spec = tmp_path / "spec.py"
    spec.write_text(
        "import jax, jax.numpy as jnp\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "mesh = jax.make_mesh((8,), ('x',), axis_types=(jax.sharding.AxisType.Auto,))\n"
        "def fn(a):\n"
        "    return a @ a.T\n"
        "args = (jax.ShapeDtypeStruct((64, 16), jnp.float32, "
        "sharding=NamedSharding(mesh, P(None, 'x'))),)\n"
    )
    html = tmp_path / "r.html"
    assert cli_main(["inspect", str(spec), "--text", "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert "all-reduce" in out and "spec.py:5 (fn)" in out
    page = html.read_text()
    assert "all-reduce" in page
    assert page.startswith("<!doctype html>") and "<style>" in page  # a styled document


def test_cli_errors(capsys, tmp_path):
    assert cli_main(["inspect", "jax.numpy:matmul", "--args", "f32[4,4]@x", "f32[4]"]) == 2
    assert "names mesh axes but no mesh is given" in capsys.readouterr().err
    assert cli_main(["inspect", "jax.numpy:matmul", "--args", "float[4,4]"]) == 2
    assert "write each argument as DTYPE[DIMS]" in capsys.readouterr().err
    assert cli_main(["inspect", "jax.numpy:nope", "--args", "f32[4]"]) == 2
    assert "'nope' is not a function of jax.numpy" in capsys.readouterr().err
    assert cli_main(["inspect", "no_such_module_xyz:f"]) == 2
    assert "cannot import no_such_module_xyz" in capsys.readouterr().err
    assert cli_main(["inspect", "matmul"]) == 2
    assert "name a function as module:function" in capsys.readouterr().err
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    assert cli_main(["inspect", str(bad)]) == 2
    assert "must define `fn`" in capsys.readouterr().err
    assert cli_main(["inspect", "jnp_missing.py"]) == 2
    assert "no such spec file" in capsys.readouterr().err
    assert cli_main(["inspect", "jax.numpy:sin", "--args", "f32[8]"]) == 2
    assert "has no mesh" in capsys.readouterr().err


def test_parse_arg_spec():
    from shardkit.inspection.command import parse_arg_spec

    assert parse_arg_spec("f32[1024,512]@data,model") == ("float32", (1024, 512), "data,model")
    assert parse_arg_spec("bf16[8]") == ("bfloat16", (8,), None)
    assert parse_arg_spec("s32[]") == ("int32", (), None)
    with pytest.raises(ValueError, match=r"--args 'f32\(3\)'"):
        parse_arg_spec("f32(3)")


_CACHED = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
import shardkit
mesh = jax.make_mesh((8,), ("x",))
x = jax.device_put(jnp.ones((64, 64)), NamedSharding(mesh, P("x", None)))
{pad}
def f(a):
    return jnp.sum(a, axis=0)

print([c.where for c in shardkit.inspect(f, x).collectives])
print(jax.config.jax_compilation_cache_include_metadata_in_key)
"""


def test_source_lines_are_right_with_a_persistent_compilation_cache(tmp_path):
    # the cache key leaves source locations out by default: a program that only moved in its
    # file would be served the first one's executable, metadata and all, and inspect would name
    # the first file's lines
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    cache = tmp_path / "cache"
    for name, pad in (("first.py", ""), ("second.py", "\n\n\n")):
        script = tmp_path / name
        script.write_text(_CACHED.format(pad=pad))
        out = subprocess.run(
            [sys.executable, str(script), str(cache)],
            env=env,
            text=True,
            capture_output=True,
            timeout=300,
            check=True,
        ).stdout.splitlines()
        line = 14 + len(pad)  # `return jnp.sum(...)`
        assert out[0] == f"['{script}:{line} (f)']", out
        assert out[1] == "False"  # the user's setting is restored
    assert any(cache.iterdir())  # the cache was written, so the second run could have hit it
