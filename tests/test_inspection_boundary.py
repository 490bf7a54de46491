"""Inspection at its boundaries: pruned arguments, requested shardings, the mesh= option, the
options of assert_collectives, and the package's docstring examples. Each layout fact is checked
against what plain `jax.jit(...).lower(...).compile()` reports."""

import doctest
import importlib
import pkgutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit
import shardkit.inspection as si
from shardkit.layout import spec_notation


@pytest.fixture
def mesh():
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def _notation(name, sharding, ndim):
    """The notation jit's own compiled sharding has, for comparison with a layout entry."""
    spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
    return spec_notation((1,) * ndim, P(*spec), name=name)


# ---- 1. an argument jit prunes keeps every later argument on its own sharding ----------------


def test_pruned_argument_does_not_shift_later_arguments(mesh):
    a = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("data", "model")))
    b = jax.device_put(jnp.ones((16,)), NamedSharding(mesh, P("model")))  # unused: pruned
    c = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P(None, "data")))

    def f(a, b, c):
        return a + c

    (sa, sb, sc), _ = jax.jit(f).lower(a, b, c).compile().input_shardings
    assert sb is None  # what jit reports for the pruned argument
    for layout in (si.compiled_layout(f, a, b, c), si.inspect(f, a, b, c).layout):
        ins = {e.path: e for e in layout.inputs}
        assert list(ins) == ["a", "b", "c"]
        assert ins["a"].compiled == _notation("a", sa, 2) == "a[A_data, B_model]"
        assert ins["c"].compiled == _notation("c", sc, 2) == "c[A, B_data]"
        assert ins["b"].pruned and not ins["b"].changed and ins["b"].requested == "b[A_model]"
        assert not ins["a"].changed and not ins["c"].changed
        assert "b" not in {e.path for e in layout.changed()}
        assert "input b float32[16]: requested b[A_model], compiled (unused: pruned by jit)" in (
            str(layout)
        )


def test_pruned_argument_does_not_hide_a_gathered_input(mesh):
    a = jax.device_put(jnp.ones((8,)), NamedSharding(mesh, P("data")))
    b = jax.device_put(jnp.ones((16,)), NamedSharding(mesh, P("model")))  # unused: pruned
    c = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("data", "model")))

    def f(a, b, c):
        return a.sum() + jax.lax.with_sharding_constraint(c, NamedSharding(mesh, P()))

    (_, sb, sc), _ = jax.jit(f).lower(a, b, c).compile().input_shardings
    assert sb is None and not sc.is_fully_replicated
    report = si.inspect(f, a, b, c)
    gathers = [w for w in report.warnings if w.code == "implicit-gather"]
    assert gathers and "global shape [64, 32]" in gathers[0].message


# ---- 2. requested shardings are compiled, as jax.jit compiles them ---------------------------


def test_requested_out_shardings_are_compiled(mesh):
    w = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("data", "model")))
    want = NamedSharding(mesh, P("data", None))
    jitted = jax.jit(lambda w: w * 2, out_shardings=want)
    by_jit = jitted.lower(w).compile().output_shardings
    assert by_jit.spec == P("data", None)
    for layout in (
        si.compiled_layout(lambda w: w * 2, w, out_shardings=want),
        si.compiled_layout(lambda w: w * 2, w, out_shardings=P("data", None)),
        si.compiled_layout(jitted, w),
        si.inspect(jitted, w).layout,
    ):
        (out,) = layout.outputs
        assert out.requested == out.compiled == _notation("out", by_jit, 2) == "out[A_data, B]"
        assert not out.changed and layout.changed() == ()


def test_requested_in_shardings_are_compiled(mesh):
    x = jax.ShapeDtypeStruct((64, 32), jnp.float32)  # not placed: the request decides
    want = NamedSharding(mesh, P(None, "data"))
    by_jit = jax.jit(lambda x: x + 1, in_shardings=want).lower(x).compile().input_shardings
    with jax.set_mesh(mesh):  # a PartitionSpec resolves on jax.set_mesh's mesh
        layouts = [si.compiled_layout(lambda x: x + 1, x, in_shardings=P(None, "data"))]
    layouts.append(si.compiled_layout(lambda x: x + 1, x, in_shardings=(want,)))
    for layout in layouts:
        (entry,) = layout.inputs
        assert entry.requested == entry.compiled == _notation("x", by_jit[0][0], 2)
        assert entry.compiled == "x[A, B_data]" and not entry.changed


def test_requested_shardings_need_a_mesh_and_a_function(mesh):
    x = jax.ShapeDtypeStruct((64, 32), jnp.float32)
    with pytest.raises(ValueError, match=r"out_shardings=PartitionSpec.*no mesh.*fix: "):
        si.compiled_layout(lambda x: x + 1, x, out_shardings=P("data"))
    y = jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    compiled = jax.jit(lambda y: y + 1).lower(y).compile()
    with pytest.raises(TypeError, match=r"out_shardings= needs a function.*Compiled.*fix: "):
        si.compiled_layout(compiled, out_shardings=NamedSharding(mesh, P()))


# ---- 3. every docstring example of the package runs and prints what it shows ----------------


def _docstring_examples():
    for info in pkgutil.iter_modules(si.__path__, "shardkit.inspection."):
        module = importlib.import_module(info.name)
        yield from doctest.DocTestFinder().find(module)


def test_docstring_examples_print_what_they_show():
    globs = {"jax": jax, "jnp": jnp, "np": np, "NamedSharding": NamedSharding, "P": P,
             "AxisType": AxisType, "shardkit": shardkit, "sk": shardkit}  # fmt: skip
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    runner = doctest.DocTestRunner(optionflags=flags)
    tests = [t for t in _docstring_examples() if t.examples]
    assert len(tests) >= 10, [t.name for t in tests]
    report: list[str] = []
    for test in tests:
        test.globs = {**test.globs, **globs}
        runner.run(test, out=report.append)
    assert not report, "\n".join(report)


# ---- 4. mesh= must be the arguments' mesh ---------------------------------------------------


def test_mesh_other_than_the_arguments_mesh_is_refused(mesh):
    x = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("data", "model")))
    (sx,), _ = jax.jit(lambda a: a.sum(0)).lower(x).compile().input_shardings
    assert sx.mesh.axis_names == ("data", "model")
    assert si.inspect(lambda a: a.sum(0), x).collectives[0].axes == ("data",)
    same = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    assert si.inspect(lambda a: a.sum(0), x, mesh=same).collectives[0].axes == ("data",)
    abstract = mesh.abstract_mesh  # no devices to compare: its mesh axes must match
    assert si.inspect(lambda a: a.sum(0), x, mesh=abstract).collectives[0].axes == ("data",)
    swapped = jax.make_mesh((2, 4), ("model", "data"))
    reordered = jax.sharding.Mesh(np.array(jax.devices()[::-1]).reshape(4, 2), ("data", "model"))
    for other in (swapped, reordered):
        with pytest.raises(
            ValueError,
            match=r"mesh=Mesh\(.*\) is not the mesh the arguments are placed on, Mesh\(data=4, "
            r"model=2.*fix: drop mesh=",
        ):
            si.inspect(lambda a: a.sum(0), x, mesh=other)
    with pytest.raises(ValueError, match=r"not the mesh the arguments are placed on"):
        si.assert_collectives(lambda a: a.sum(0), x, mesh=swapped)


# ---- options of assert_collectives ----------------------------------------------------------


def test_assert_collectives_options_at_their_boundaries(mesh):
    x = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("data", "model")))
    none = lambda a: a * 2  # noqa: E731
    gather = lambda a: a.sum(0)  # noqa: E731
    assert not si.assert_collectives(none, x, forbid=None).collectives
    si.assert_collectives(none, x, expect={"all-gather": np.int64(0)})
    for bad in (True, 1.0, np.float32(2)):
        with pytest.raises(ValueError, match=r"a count must be an int >= 0.*got .*fix: "):
            si.assert_collectives(none, x, expect={"all-gather": bad})
    for fn in (none, gather):  # rejected whether or not the program has collectives
        with pytest.raises(TypeError, match=r"max_bytes=.*'1MiB'.*str.*fix: max_bytes=2\*\*20"):
            si.assert_collectives(fn, x, max_bytes="1MiB")
        with pytest.raises(TypeError, match=r"max_total_bytes=.*True.*fix: "):
            si.assert_collectives(fn, x, max_total_bytes=True)
    with pytest.raises(ValueError, match=r"max_bytes=-1.*fix: "):
        si.assert_collectives(gather, x, max_bytes=-1)
    si.assert_collectives(gather, x, max_bytes=np.int64(2**30), max_total_bytes=2.0**30)
