"""Defects a user sweep of the audit found: mesh axis names JAX accepts but a regex did not, an
implicit-gather warning on a plain gradient all-reduce, assertions that passed on loop counts
that are only lower bounds, unchecked `inspect` options, and raw JAX errors from
`shardkit inspect --args`.

Bytes per device and execution (ring): all-reduce 2(n-1)/n x operand bytes.
"""

import functools
import html
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.inspection as si
from shardkit.cli import main as cli_main
from shardkit.errors import ShardkitError
from shardkit.inspection.groups import replica_groups
from shardkit.inspection.hlo import parse_hlo
from shardkit.linter import IndivisibleShardingError, SpecRankError, UnknownMeshAxisError

F32 = 4


def put(shape, mesh, spec):
    return jax.device_put(jnp.ones(shape), NamedSharding(mesh, spec))


# ---- 1. mesh axis names with spaces and punctuation ---------------------------------------

NAMES = [
    ("data parallel", "parallel"),  # one name is a suffix of the other
    ("a<b", "c"),
    ("x=1", "y,2"),  # the separators of the mesh list itself
    ("a]b", "{c}"),  # the brackets of the mesh list and of the axis set
    ('a"b', "q"),
    ("0", "1"),  # digits: names, not mesh axis indices
    ("数据", "模型"),
]


@pytest.mark.parametrize("names", NAMES, ids=lambda n: "|".join(n))
def test_axis_names_jax_accepts_decode_to_the_right_mesh_axes(names, axis_type):
    mesh = jax.make_mesh((2, 4), names, axis_types=(axis_type,) * 2)
    x = put((8, 8), mesh, P(*names))  # local block f32[4,2]
    inner = si.inspect(lambda v: jnp.sum(v, 1), x)  # partial sums f32[4] over names[1] (4)
    (c,) = inner.of_kind("all-reduce")
    assert (c.axes, c.group_size, c.num_groups) == ((names[1],), 4, 2)
    assert c.bytes_moved == 2 * 3 / 4 * 4 * F32  # 24 B
    outer = si.inspect(lambda v: jnp.sum(v, 0), x)  # partial sums f32[2] over names[0] (2)
    (c,) = outer.of_kind("all-reduce")
    assert (c.axes, c.group_size, c.num_groups) == ((names[0],), 2, 4)
    assert c.bytes_moved == 2 * 1 / 2 * 2 * F32  # 8 B


def test_a_single_axis_named_with_punctuation():
    mesh = jax.make_mesh((8,), ("a<b",), axis_types=(AxisType.Auto,))
    report = si.inspect(lambda v: jnp.sum(v, 0), put((64, 8), mesh, P("a<b")))
    (c,) = report.collectives
    assert (c.axes, c.group_size, c.bytes_moved) == (("a<b",), 8, 2 * 7 / 8 * 8 * F32)


def _groups(spec: str, n: int = 8) -> list[list[int]]:
    text = (
        f"HloModule m, num_partitions={n}\n\nENTRY %main (p: f32[2]) -> f32[2] {{\n"
        "  %p = f32[2]{0} parameter(0)\n"
        f"  ROOT %r = f32[2]{{0}} all-reduce(%p), replica_groups={spec}, to_apply=%add\n}}\n"
    )
    return replica_groups(next(iter(parse_hlo(text).collectives())), n)


@pytest.mark.parametrize(
    "spec, groups",
    [
        ("mesh['data parallel'=2,'parallel'=4] {'parallel'}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
        (
            "mesh['data parallel'=2,'parallel'=4] {'data parallel'}",
            [[0, 4], [1, 5], [2, 6], [3, 7]],
        ),
        ("mesh['a]b'=2,'{c}'=4] {'{c}'}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
        ("mesh['x=1'=2,'y,2'=4] {'x=1', 'y,2'}", [list(range(8))]),
        ("mesh[data=2,model=4] {model}", [[0, 1, 2, 3], [4, 5, 6, 7]]),  # unquoted
        ("mesh[data=2,model=4] {0}", [[0, 4], [1, 5], [2, 6], [3, 7]]),  # an axis index
        ("mesh['a b'=2,'c'=4] {'c':(1)2}", [[0, 2], [1, 3], [4, 6], [5, 7]]),  # a sub-axis
        ("mesh['a b'=2,'c'=4], device_ids=(4,5,6,7,0,1,2,3) {'c'}", [[4, 5, 6, 7], [0, 1, 2, 3]]),
    ],
)
def test_mesh_spelling_with_quoted_names(spec, groups):
    assert sorted(_groups(spec)) == sorted(groups)


@pytest.mark.parametrize(
    "spec, why",
    [
        ("mesh['a'=2,'b'=4] {'zz'}", r"mesh axis 'zz' is not one of .*'a', 'b'"),
        ("mesh['a", r"no closing quote"),
        ("mesh['a'=two] {'a'}", r"size"),
        ("mesh['a'=2,'b'=4] {'a'", r"no closing"),
        ("mesh['a'=2,'b'=4] {7}", r"mesh axis '7' is not one of"),
    ],
)
def test_unreadable_mesh_spelling_names_the_hlo_text(spec, why):
    with pytest.raises(
        ShardkitError, match=r"replica_groups=.*mesh\[.* of %r is not .* can read: .*" + why
    ) as e:
        _groups(spec)
    assert isinstance(e.value, ValueError) and "fix: " in str(e.value)


# ---- 2. implicit-gather needs a gather --------------------------------------------------------


def data_parallel_loss(w, x):
    return jnp.mean(jnp.tanh(x @ w) ** 2)


@pytest.mark.parametrize("batch", [64, 128])
def test_gradient_all_reduce_of_replicated_weights_is_no_implicit_gather(batch, axis_type):
    # w has as many elements as x when batch == 64: a coincidence of sizes, not a gather of x
    mesh = jax.make_mesh((8,), ("data",), axis_types=(axis_type,))
    w = put((64, 64), mesh, P())
    x = put((batch, 64), mesh, P("data", None))
    report = si.inspect(jax.grad(data_parallel_loss), w, x)
    (c,) = report.collectives
    assert (c.kind, c.axes, c.result_shapes) == ("all-reduce", ("data",), ("f32[64,64]",))
    assert [f.code for f in report.warnings] == []


def test_gathers_that_materialise_a_sharded_operand_still_warn():
    mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
    x = put((64, 16), mesh, P("d"))

    def gather_by_psum(block):  # an all-gather spelled as a psum of a zero-padded block
        i = jax.lax.axis_index("d")
        full = jax.lax.dynamic_update_slice(jnp.zeros((64, 16)), block, (i * 8, 0))
        return jax.lax.psum(full, "d")

    f = lambda v: jax.shard_map(gather_by_psum, mesh=mesh, in_specs=P("d"), out_specs=P())(v)  # noqa: E731
    report = si.inspect(f, x)
    (c,) = report.collectives
    assert c.kind == "all-reduce"
    (w,) = [w for w in report.warnings if w.code == "implicit-gather"]
    assert w.collective == 0 and "global shape [64, 16]" in w.message

    def psum_of_a_value(block):  # the same collective of a same-sized value: no gather
        return jax.lax.psum(jnp.tile(block, (8, 1)), "d")

    g = lambda v: jax.shard_map(psum_of_a_value, mesh=mesh, in_specs=P("d"), out_specs=P())(v)  # noqa: E731
    assert "implicit-gather" not in [w.code for w in si.inspect(g, x).warnings]
    gathered = si.inspect(
        lambda v: jax.lax.with_sharding_constraint(v, NamedSharding(mesh, P())) + 1, x
    )
    (w,) = [w for w in gathered.warnings if w.code == "implicit-gather"]
    assert "all-gather #0" in w.message


# ---- 3. assert_collectives on loops without a trip count -----------------------------------


def halving_loop(x):  # data-dependent: ~111 iterations, one f32[] all-reduce per iteration
    return jax.lax.while_loop(lambda s: jnp.sum(s) > 1e-30, lambda s: s * 0.5, x)


@pytest.fixture
def loop_input():
    mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
    return put((64, 16), mesh, P("d", None))


@pytest.mark.parametrize(
    "option, what",
    [
        (dict(max_total_bytes=100), r"max_total_bytes=100: all collectives move at least 7 bytes"),
        (dict(expect={"all-reduce": 1}), r"expected 1 all-reduce per call, found at least 1"),
        (dict(expect={"all-reduce": 0}), r"expected 0 all-reduce per call, found at least 1"),
    ],
)
def test_assertions_on_unknown_loop_counts_fail(loop_input, option, what):
    with pytest.raises(si.CollectiveAssertionError) as e:
        si.assert_collectives(halving_loop, loop_input, **option)
    message = str(e.value)  # what, why (which loop), and a fix
    assert re.search(what, message), message
    assert "a lower bound" in message
    assert "jit(halving_loop)/while" in message and "no trip count" in message
    assert "fix: " in message and "lax.scan" in message and "fori_loop" in message
    assert e.value.problems and "lower bound" in e.value.problems[0]


def test_assertions_that_do_not_depend_on_loop_counts_still_pass(loop_input):
    report = si.assert_collectives(
        halving_loop,
        loop_input,
        forbid=["all-gather"],
        expect={"all-gather": 0},
        max_bytes=7,  # bytes per execution are known: f32[] all-reduce over 8 = 7 B
    )
    assert report.counts() == {"all-reduce": None}
    with pytest.raises(si.CollectiveAssertionError, match=r"move more than 6 bytes"):
        si.assert_collectives(halving_loop, loop_input, max_bytes=6)


# ---- 4. inspect's options ------------------------------------------------------------------


@pytest.fixture
def x8():
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    return put((64, 16), mesh, P("x"))


def test_large_bytes_is_validated_like_the_byte_bounds_of_assert_collectives(x8):
    summed = lambda v: v.sum(0)  # noqa: E731
    with pytest.raises(TypeError, match=r"large_bytes='1MiB'.*str.*fix: large_bytes=2\*\*20"):
        si.inspect(summed, x8, large_bytes="1MiB")
    with pytest.raises(TypeError, match=r"large_bytes=True.*fix: "):
        si.inspect(summed, x8, large_bytes=True)
    for bad in (-5, float("nan")):
        with pytest.raises(ValueError, match=r"large_bytes=.*must be >= 0.*fix: "):
            si.inspect(summed, x8, large_bytes=bad)
    report = si.inspect(summed, x8, large_bytes=0)
    assert "large-collective" in [w.code for w in report.warnings]


def scale(v, mesh):  # a user function with a parameter called mesh
    return v * mesh


def test_a_function_parameter_named_mesh_gets_a_fix(x8):
    with pytest.raises(
        TypeError,
        match=r"mesh= is inspect's own option.*scale\(v, mesh\).*fix: .*functools.partial\(scale, "
        r"mesh=",
    ):
        si.inspect(scale, x8, mesh=2.0)
    with pytest.raises(TypeError, match=r"mesh= is inspect's own option.*functools.partial"):
        si.inspect(scale, x8)
    with pytest.raises(TypeError, match=r"inspect\(mesh=2.0\): .*Mesh.*fix: "):
        si.inspect(lambda v, mesh=1.0: v * mesh, x8, mesh=2.0)
    report = si.inspect(functools.partial(scale, mesh=2.0), x8)  # the fix works
    assert report.collectives == ()


def test_html_and_rich_show_the_layout_the_compiler_changed(x8, capsys):
    report = si.inspect(lambda v: v.sum(0), x8)
    changed = report.layout.changed()
    assert changed and "layout changed by the compiler:" in report.to_text()
    page = report.to_html()
    assert "layout changed by the compiler" in page
    for entry in changed:
        assert html.escape(entry.describe()) in page
    import rich

    rich.print(report)
    assert "layout changed by the compiler" in capsys.readouterr().out


# ---- 5. shardkit inspect --args -----------------------------------------------------------


@pytest.mark.parametrize(
    "item, error, why",
    [
        ("f32[7,64]@x,y", IndivisibleShardingError, r"dim 0 has size 7.*'x' \(size 4\)"),
        ("f32[64,64]@x,z", UnknownMeshAxisError, r"mesh axis 'z' is not in the mesh"),
        ("f32[64]@x,y", SpecRankError, r"the spec has 2 entries but the array has rank 1"),
    ],
)
def test_cli_args_that_do_not_fit_the_mesh(item, error, why, capsys):
    argv = ["inspect", "jax.numpy:sum", "--mesh", "x=4,y=2", "--args", "f32[8]", item]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    pattern = r"^shardkit inspect: error: --args '" + re.escape(item) + "': .*" + why + ".*fix: "
    assert re.search(pattern, err), err
    assert "Sharding spec" not in err and "Resource axis" not in err
    with pytest.raises(error, match=why):
        cli_main(["--debug", *argv])
