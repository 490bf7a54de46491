"""The HLO parser on many compiled programs, against independent counts, and on bad input."""

import collections

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.inspection as si
from shardkit.inspection import groups, hlo
from shardkit.inspection.audit import collectives_of

# Opcodes of XLA's own parser, mapped to shardkit's kinds (async pairs once: the start).
_OPCODES = {
    "kAllGather": "all-gather",
    "kAllGatherStart": "all-gather",
    "kAllReduce": "all-reduce",
    "kAllReduceStart": "all-reduce",
    "kReduceScatter": "reduce-scatter",
    "kAllToAll": "all-to-all",
    "kCollectivePermute": "collective-permute",
    "kCollectivePermuteStart": "collective-permute",
    "kCollectiveBroadcast": "collective-broadcast",
}


def independent_counts(hlo_module) -> collections.Counter:
    """Counts collectives through XLA's C++ HloModule (not through the text)."""
    out = collections.Counter()
    for comp in hlo_module.computations():
        for ins in comp.instructions():
            kind = _OPCODES.get(str(ins.opcode).rsplit(".", 1)[-1])
            if kind:
                out[kind] += 1
    return out


def parsed_counts(text: str) -> collections.Counter:
    return collections.Counter(i.kind for i in hlo.parse_hlo(text).collectives())


def _programs():
    mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    mesh1 = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))

    def s(shape, spec, m=mesh, dtype=jnp.float32):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(m, spec))

    def smap(local, pin, pout, m=mesh, **kw):
        return lambda *a: jax.shard_map(local, mesh=m, in_specs=pin, out_specs=pout, **kw)(*a)

    def wsc(spec, m=mesh):
        return lambda a: jax.lax.with_sharding_constraint(a, NamedSharding(m, spec))

    def mlp_grad(w, x):
        return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)

    def scan_psum(a):
        def body(c, _):
            return c + jax.lax.psum(c, "x"), None

        return jax.lax.scan(body, a, None, length=3)[0]

    return {
        "matmul_allgather": (lambda a, b: a @ b, s((32, 16), P(None, "x")), s((16, 8), P())),
        "matmul_allreduce": (lambda a, b: a @ b, s((32, 16), P(None, "x")), s((16, 8), P("x"))),
        "fftn": (jnp.fft.fftn, s((8, 8, 8), P("x", "y"))),
        "solve": (jnp.linalg.solve, s((16, 16), P("x"), mesh1), s((16,), P(), mesh1)),
        "lu": (jax.lax.linalg.lu, s((16, 16), P("x"), mesh1)),
        "reshard_rows_to_cols": (wsc(P(None, "x")), s((16, 16), P("x"))),
        "psum_tuple": (
            smap(lambda a, b: jax.lax.psum((a, b), "x"), (P("x"), P("x")), P()),
            s((16, 4), P("x")),
            s((8,), P("x")),
        ),
        "all_to_all": (
            smap(lambda a: jax.lax.all_to_all(a, "x", 0, 1, tiled=True), P(None, "x"), P("x")),
            s((16, 16), P(None, "x")),
        ),
        "ppermute": (
            smap(lambda a: jax.lax.ppermute(a, "y", [(0, 1), (1, 0)]), P("y"), P("y")),
            s((8, 4), P("y")),
        ),
        "psum_scatter": (
            smap(lambda a: jax.lax.psum_scatter(a, "x", tiled=True), P(), P("x")),
            s((16, 4), P()),
        ),
        "all_gather": (
            smap(lambda a: jax.lax.all_gather(a, "y", tiled=True), P("y"), P(), check_vma=False),
            s((8, 4), P("y")),
        ),
        "scan_psum": (smap(scan_psum, P("x"), P("x")), s((16, 4), P("x"))),
        "mlp_grad": (mlp_grad, s((16, 16), P(None, "y")), s((32, 16), P("x"))),
        "bf16_psum": (
            smap(lambda a: jax.lax.psum(a, ("x", "y")), P(("x", "y")), P()),
            s((16,), P(("x", "y")), dtype=jnp.bfloat16),
        ),
    }


def test_counts_agree_with_xla_on_many_programs():
    programs = _programs()
    assert len(programs) >= 10
    seen = collections.Counter()
    for name, (fn, *args) in programs.items():
        compiled = jax.jit(fn).lower(*args).compile()
        text = compiled.as_text()
        want = independent_counts(compiled.runtime_executable().hlo_modules()[0])
        got = parsed_counts(text)
        assert got == want, name
        quick = +si.collective_counts(text)  # drop the zero entries
        assert quick == want, name
        assert sum(want.values()) >= 1, name  # every program here communicates
        seen.update(want)
        report = si.inspect(compiled)
        assert len(report.collectives) == sum(want.values()), name
        for c in report.collectives:
            assert c.axes, (name, c)
            assert c.bytes_moved > 0 and c.buffer_bytes > 0, (name, c)
    # the set covers every kind a jit program produces on this backend
    assert {"all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute"} <= (
        set(seen)
    )


ASYNC_HLO = """HloModule async_demo, entry_computation_layout={(f32[8,16]{1,0}, f32[4]{0})->f32[32,16]{1,0}}, num_partitions=4

FileNames
1 "/home/user/model.py"
2 "/usr/lib/python3/site-packages/jax/_src/lax/parallel.py"

FunctionNames
1 "<module>"
2 "step"
3 "psum"

FileLocations
1 {file_name_id=1 function_name_id=1 line=40 end_line=40 column=1 end_column=9}
2 {file_name_id=1 function_name_id=2 line=12 end_line=12 column=8 end_column=30}
3 {file_name_id=2 function_name_id=3 line=300 end_line=300 column=4 end_column=9}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}
3 {file_location_id=3 parent_frame_id=3}


%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%a2a_body (q: f32[8,16]) -> f32[8,16] {
  %q = f32[8,16]{1,0} parameter(0)
  ROOT %a2a = f32[8,16]{1,0} all-to-all(%q), channel_id=5, replica_groups={{0,1,2,3}}, dimensions={0}
}

ENTRY %main (p0: f32[8,16], p1: f32[4]) -> f32[32,16] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = f32[4]{0} parameter(1)
  %ags = (f32[8,16]{1,0}, f32[32,16]{1,0}) all-gather-start(%p0), channel_id=1, replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true, metadata={op_name="jit(step)/all_gather" stack_frame_id=2}
  %agd = f32[32,16]{1,0} all-gather-done(%ags)
  %ars = f32[8,16]{1,0} all-reduce-start(%p0), channel_id=2, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=%add, metadata={op_name="jit(step)/psum" stack_frame_id=3}
  %ard = f32[8,16]{1,0} all-reduce-done(%ars)
  %cps = (f32[8,16]{1,0}, f32[8,16]{1,0}, u32[], u32[]) collective-permute-start(%ard), channel_id=3, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %cpd = f32[8,16]{1,0} collective-permute-done(%cps)
  %tar = (f32[8,16]{1,0}, f32[4]{0}) all-reduce(%cpd, %p1), channel_id=4, replica_groups=[2,2]<=[2,2]T(1,0), use_global_device_ids=true, to_apply=%add
  %g0 = f32[8,16]{1,0} get-tuple-element(%tar), index=0
  %as = ((f32[8,16]{1,0}), f32[8,16]{1,0}, s32[]) async-start(%g0), calls=%a2a_body
  %ad = f32[8,16]{1,0} async-done(%as), calls=%a2a_body
  %rs = f32[2,16]{1,0} reduce-scatter(%ad), channel_id=6, replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_0','axis_1'}, dimensions={0}, use_global_device_ids=true, to_apply=%add
  ROOT %out = f32[32,16]{1,0} add(%agd, %agd)
}
"""  # noqa: E501


def test_async_pairs_and_tuples_in_handwritten_text():
    from jaxlib import _hlo

    want = independent_counts(_hlo.hlo_module_from_text(ASYNC_HLO))
    assert parsed_counts(ASYNC_HLO) == want
    assert +si.collective_counts(ASYNC_HLO) == want
    assert want == {
        "all-gather": 1,
        "all-reduce": 2,
        "collective-permute": 1,
        "all-to-all": 1,
        "reduce-scatter": 1,
    }
    assert hlo.collective_summary(ASYNC_HLO) == (
        "all-gather x1, all-reduce x2, all-to-all x1, collective-permute x1, reduce-scatter x1"
    )
    assert hlo.collective_summary("ENTRY %main () -> f32[] {}") == "none"
    module = hlo.parse_hlo(ASYNC_HLO)
    assert module.num_partitions == 4
    by_name = {c.name: c for c in collectives_of(module, ("a", "b"), (2, 2))}
    ag = by_name["ags"]
    assert (ag.kind, ag.axes, ag.group_size) == ("all-gather", ("a", "b"), 4)
    assert ag.shapes == ("f32[8,16]",) and ag.result_shapes == ("f32[32,16]",)
    assert (ag.buffer_bytes, ag.bytes_moved) == (32 * 16 * 4, 32 * 16 * 4 * 3 / 4)
    ar = by_name["ars"]
    assert (ar.axes, ar.group_size, ar.bytes_moved) == (("b",), 2, 2 * 8 * 16 * 4 / 2)
    cp = by_name["cps"]
    assert (cp.kind, cp.axes, cp.bytes_moved, cp.num_groups) == (
        "collective-permute",
        ("a", "b"),
        8 * 16 * 4,
        4,
    )
    tup = by_name["tar"]
    assert tup.shapes == ("f32[8,16]", "f32[4]") and tup.axes == ("a",)
    assert tup.buffer_bytes == (8 * 16 + 4) * 4
    a2a = by_name["a2a"]
    assert (a2a.count, a2a.computation, a2a.axes) == (1, "a2a_body", ("a", "b"))
    rs = by_name["rs"]
    assert (rs.axes, rs.group_size, rs.bytes_moved) == (("a", "b"), 4, 8 * 16 * 4 * 3 / 4)
    # source lines: the parent_frame_id printed in the table is one more than the parent's id;
    # frames inside JAX are skipped to reach the user's line.
    assert (ag.source.file, ag.source.line, ag.source.function) == (
        "/home/user/model.py",
        12,
        "step",
    )
    assert [f.line for f in ar.traceback] == [300, 12, 40]
    assert (ar.source.line, ar.source.function) == (12, "step")
    assert cp.source is None and cp.traceback == ()


def test_replica_group_spellings():
    def decode(attr, kind="all-reduce", n=8):
        ins = hlo.Instruction("c", kind, "f32[4]", ("p",), attr, "main")
        return groups.replica_groups(ins, n)

    assert decode("replica_groups={{0,1},{2,3}}") == [[0, 1], [2, 3]]
    assert decode("replica_groups={}") == [list(range(8))]
    assert decode("channel_id=1") == [list(range(8))]
    assert decode("replica_groups=[2,4]<=[8]") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert decode("replica_groups=[2,4]<=[4,2]T(1,0)") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert decode("replica_groups=[4,2]<=[2,2,2]T(2,1,0)") == [[0, 4], [2, 6], [1, 5], [3, 7]]
    assert decode("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}, x=1") == [
        [0, 1],
        [2, 3],
        [4, 5],
        [6, 7],
    ]
    assert decode("replica_groups=mesh['a'=4,'b'=2] {'a'}") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    # sub-axis a:(1)2 is the major half of a=4 (pre-size 1: nothing major to it): a // 2
    assert decode("replica_groups=mesh['a'=4,'b'=2] {'a':(1)2}") == [
        [0, 4],
        [1, 5],
        [2, 6],
        [3, 7],
    ]
    assert decode("replica_groups=mesh['a'=4,'b'=2] {'a':(2)2}") == [
        [0, 2],
        [1, 3],
        [4, 6],
        [5, 7],
    ]
    assert decode("replica_groups=mesh['a'=2,'b'=2], device_ids=(3,2,1,0) {'b'}", n=4) == [
        [3, 2],
        [1, 0],
    ]
    assert decode("source_target_pairs={{0,1},{1,0}}", kind="collective-permute") == [
        [0, 1],
        [1, 0],
    ]
    with pytest.raises(ValueError, match=r"not a spelling of replica groups"):
        decode("replica_groups=weird(1)")


def test_nested_loops_multiply():
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))

    def local(a):
        def inner(c, _):
            return c + jax.lax.psum(c, "x"), None

        def outer(c, _):
            return jax.lax.scan(inner, c, None, length=3)[0], None

        return jax.lax.scan(outer, a, None, length=4)[0]

    f = lambda a: jax.shard_map(local, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(a)  # noqa: E731
    x = jax.ShapeDtypeStruct((16,), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    (c,) = si.inspect(f, x).collectives
    assert c.count == 12


def test_parse_errors():
    with pytest.raises(ValueError, match=r"no `HloModule` header.*StableHLO"):
        hlo.parse_hlo("module @jit_f {\n  func.func public @main() {\n  }\n}")
    with pytest.raises(TypeError, match=r"expects the str of compiled.as_text\(\); got int"):
        hlo.parse_hlo(3)
    empty = hlo.parse_hlo(
        "HloModule m\n\nENTRY %main () -> f32[] {\n  ROOT %c = f32[] constant(1)\n}\n"
    )
    assert empty.entry == "main" and empty.collectives() == [] and empty.num_partitions == 1


def test_shapes():
    assert hlo.parse_shape("(f32[4,4]{1,0}, /*index=1*/bf16[2]{0}, pred[])") == (
        hlo.ArrayShape("f32", (4, 4)),
        hlo.ArrayShape("bf16", (2,)),
        hlo.ArrayShape("pred", ()),
    )
    assert hlo.ArrayShape("c64", (3,)).nbytes == 24
    assert hlo.ArrayShape("s4", (3,)).nbytes == 2


def test_operands_missing_from_text_are_inferred_from_the_result():
    text = (
        "HloModule m, num_partitions=4\n\nENTRY %main () -> f32[32,16] {\n"
        "  %ag = f32[32,16]{1,0} all-gather(%elsewhere), replica_groups={{0,1,2,3}}, "
        "dimensions={0}\n"
        "  ROOT %rs = f32[8,16]{1,0} reduce-scatter(%elsewhere2), replica_groups={{0,1,2,3}}, "
        "dimensions={0}, to_apply=%add\n}\n"
    )
    ag, rs = collectives_of(hlo.parse_hlo(text), ("x",), (4,))
    assert (ag.buffer_bytes, ag.bytes_moved, ag.shapes) == (2048, 1536, ("f32[32,16]",))
    assert (rs.buffer_bytes, rs.bytes_moved) == (2048, 1536)


def test_mesh_axes_of_groups():
    names, sizes = ("data", "model"), (4, 2)
    assert groups.mesh_axes_of([[0, 2, 4, 6], [1, 3, 5, 7]], names, sizes, pairs=False) == (
        ("data",),
        "",
    )
    assert groups.mesh_axes_of([list(range(8))], names, sizes, pairs=False) == (
        ("data", "model"),
        "",
    )
    # groups of 2 along data (size 4) only cover part of the axis
    assert groups.mesh_axes_of([[0, 2], [4, 6], [1, 3], [5, 7]], names, sizes, pairs=False) == (
        ("data",),
        "2 of 4 devices",
    )
    assert groups.mesh_axes_of([[0, 1], [1, 0]], names, sizes, pairs=True) == (("model",), "")
    # ids beyond the mesh: not decodable against it
    assert groups.mesh_axes_of([[0, 9]], names, sizes, pairs=False) == (None, "")


def test_branch_counts_weight_a_switch_over_a_table_in_a_scan():
    # a table of branch indices scanned over; only branch 1 holds a psum (and runs 3 times)
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
    table = [0, 1, 2, 1, 0, 1, 2]

    def local(a):
        def step(c, k):
            psum = lambda c: jax.lax.pcast(jax.lax.psum(c, "x"), "x", to="varying")  # noqa: E731
            with jax.named_scope("lane0"):
                c = jax.lax.switch(k, [lambda c: c + 1, psum, lambda c: c * 2], c)
            return c, None

        return jax.lax.scan(step, a, jnp.asarray(table))[0]

    f = lambda a: jax.shard_map(local, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(a)  # noqa: E731
    x = jax.ShapeDtypeStruct((16,), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    compiled = jax.jit(f).lower(x).compile()
    module = hlo.parse_hlo(compiled.as_text())
    weights = [table.count(k) for k in range(3)]  # (2, 3, 2)
    (cond,) = hlo.conditional_matches(module, "lane0")
    (c,) = si.inspect(compiled).collectives
    assert c.count == len(table)  # unweighted: every branch as if taken at every step
    (c,) = si.inspect(compiled, branch_counts={"lane0": weights}).collectives
    assert c.count == 3 and c.total_bytes == 3 * c.bytes_moved
    assert hlo.execution_counts(module, {cond.name: weights})[c.computation] == 3
    # the same conditional by its instruction name; counts scale with the loop
    assert hlo.execution_counts(module, {cond.name: (1, 1, 1)})[c.computation] == 2  # 7/3
    with pytest.raises(ValueError, match=r"'lane9' names no conditional.*lane0.*fix: "):
        hlo.execution_counts(module, {"lane9": weights})
    with pytest.raises(ValueError, match=r"2 counts but conditional .* has 3 branches.*fix: "):
        hlo.execution_counts(module, {"lane0": (1, 2)})
    with pytest.raises(ValueError, match=r"\(0, 0, 0\) must be executions.*fix: "):
        hlo.execution_counts(module, {"lane0": (0, 0, 0)})
