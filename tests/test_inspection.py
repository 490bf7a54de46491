"""The audit against programs whose collectives are known exactly (kinds, counts, bytes, axes).

Byte formulas per device and execution (ring): all-gather (n-1)/n x gathered bytes, all-reduce
2(n-1)/n x operand bytes, reduce-scatter and all-to-all (n-1)/n x operand bytes,
collective-permute 1 x operand bytes.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.inspection as si

MESHES = [((8,), ("x",)), ((4, 2), ("x", "y"))]
I, J, K = 64, 32, 64
F32 = 4


def make(shape, names, axis_type):
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape))


def sds(shape, mesh, spec, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))


def matmul_to(mesh, out_spec):
    """a @ b with the output laid out as out_spec, on Auto and Explicit meshes alike."""
    explicit = mesh.axis_types[0] == jax.sharding.AxisType.Explicit
    out = NamedSharding(mesh, out_spec)

    def mm(a, b):
        if explicit:
            return jnp.matmul(a, b, out_sharding=out)
        return jax.lax.with_sharding_constraint(a @ b, out)

    return mm


def user_line(fn, needle):
    """Line number, in this file, of the first line of `fn` containing `needle`."""
    import inspect

    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if needle in line)


# The four matmul cases of the scaling book: C[I, K] = A[I, J] @ B[J, K].
MATMUL_CASES = {
    # case 1: no contracting dim sharded -> no communication
    "case1": (P("x", None), P(None, None), P("x", None), None),
    # case 2: A sharded on the contracting dim -> all-gather A
    "case2": (P(None, "x"), P(None, None), P(None, None), ("all-gather", I * J * F32)),
    # case 3: both sharded on the contracting dim -> partial sums, all-reduce C
    "case3": (P(None, "x"), P("x", None), P(None, None), ("all-reduce", I * K * F32)),
    # case 4: a non-contracting dim of both sharded on the same axis -> all-gather B
    "case4": (P("x", None), P(None, "x"), P("x", None), ("all-gather", J * K * F32)),
}


@pytest.mark.parametrize("case", sorted(MATMUL_CASES))
@pytest.mark.parametrize("shape,names", MESHES)
def test_matmul_cases(case, shape, names, axis_type):
    mesh = make(shape, names, axis_type)
    pa, pb, pc, expected = MATMUL_CASES[case]
    mm = matmul_to(mesh, pc)
    report = si.inspect(mm, sds((I, J), mesh, pa), sds((J, K), mesh, pb))
    n = mesh.shape["x"]
    if expected is None:
        assert report.collectives == ()
        assert report.total_bytes == 0
        return
    kind, full = expected
    (c,) = report.collectives
    assert c.kind == kind
    assert c.axes == ("x",) and c.partial == ""
    assert c.group_size == n and c.num_groups == 8 // n
    assert c.count == 1
    assert c.buffer_bytes == (full if kind == "all-gather" else full)
    factor = 2 if kind == "all-reduce" else 1
    assert c.bytes_moved == factor * full * (n - 1) / n
    assert report.by_kind() == {kind: {"count": 1, "bytes": c.bytes_moved, "count_known": True}}
    assert report.by_axis() == {"x": {"count": 1, "bytes": c.bytes_moved, "count_known": True}}
    assert c.source is not None and c.source.file == __file__
    assert c.source.line == user_line(mm, "a @ b" if "Auto" in str(axis_type) else "matmul(")


def test_matmul_numbers_and_flops(axis_type):
    """Case 1 runs without communication, matches the single-device product, and its FLOPs
    and argument bytes are the analytic per-device figures."""
    mesh = make((4, 2), ("x", "y"), axis_type)
    rng = np.random.default_rng(0)
    a_np = rng.standard_normal((I, J), dtype=np.float32)
    b_np = rng.standard_normal((J, K), dtype=np.float32)
    a = jax.device_put(a_np, NamedSharding(mesh, P("x", None)))
    b = jax.device_put(b_np, NamedSharding(mesh, P()))
    mm = matmul_to(mesh, P("x", None))
    np.testing.assert_allclose(jax.jit(mm)(a, b), a_np @ b_np, rtol=1e-5, atol=1e-5)
    report = si.inspect(mm, a, b)
    compiled = jax.jit(mm).lower(a, b).compile()
    stats = compiled.memory_analysis()
    m = report.memory
    assert m.argument_bytes == stats.argument_size_in_bytes
    assert m.output_bytes == stats.output_size_in_bytes
    assert m.alias_bytes == stats.alias_size_in_bytes
    assert m.temp_bytes == stats.temp_size_in_bytes
    assert m.total_bytes == m.argument_bytes + m.output_bytes - m.alias_bytes + m.temp_bytes
    assert m.argument_bytes == (I // 4) * J * F32 + J * K * F32
    assert m.output_bytes == (I // 4) * K * F32
    assert report.cost.flops == compiled.cost_analysis()["flops"] == 2 * (I // 4) * J * K


def shard_map_fn(mesh, local, in_specs, out_specs, **kw):
    return lambda x: jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **kw)(
        x
    )


@pytest.mark.parametrize("shape,names", MESHES)
def test_psum_in_shard_map(shape, names, axis_type):
    mesh = make(shape, names, axis_type)
    n = mesh.shape["x"]

    def local(a):
        return jax.lax.psum(a, "x")

    f = shard_map_fn(mesh, local, P("x"), P())
    x = np.arange(16 * 8, dtype=np.float32).reshape(16, 8)
    xs = jax.device_put(x, NamedSharding(mesh, P("x")))
    np.testing.assert_allclose(jax.jit(f)(xs), x.reshape(n, 16 // n, 8).sum(0))
    report = si.inspect(f, xs)
    (c,) = report.collectives
    local_bytes = (16 // n) * 8 * F32
    assert (c.kind, c.axes, c.group_size, c.count) == ("all-reduce", ("x",), n, 1)
    assert c.shapes == (f"f32[{16 // n},8]",)
    assert c.bytes_moved == 2 * local_bytes * (n - 1) / n
    assert c.source.file == __file__
    assert c.source.line == user_line(local, "psum")


@pytest.mark.parametrize("shape,names", MESHES)
def test_all_to_all_ppermute_psum_scatter(shape, names, axis_type):
    mesh = make(shape, names, axis_type)
    n = mesh.shape["x"]
    R, C = 16, 32

    def a2a(a):  # (R, C/n) -> (R/n, C)
        return jax.lax.all_to_all(a, "x", 0, 1, tiled=True)

    def ring(a):
        return jax.lax.ppermute(a, "x", [(i, (i + 1) % n) for i in range(n)])

    def scatter(a):  # (R, C) replicated -> (R/n, C) reduced
        return jax.lax.psum_scatter(a, "x", scatter_dimension=0, tiled=True)

    x = np.arange(R * C, dtype=np.float32).reshape(R, C)
    cases = [
        (a2a, P(None, "x"), P("x", None), "all-to-all", R * C // n * F32, (n - 1) / n, x),
        (ring, P("x", None), P("x", None), "collective-permute", R * C // n * F32, 1, None),
        (scatter, P(), P("x", None), "reduce-scatter", R * C * F32, (n - 1) / n, n * x),
    ]
    for local, pin, pout, kind, operand, factor, want in cases:
        f = shard_map_fn(mesh, local, pin, pout)
        xs = jax.device_put(x, NamedSharding(mesh, pin))
        if want is not None:
            np.testing.assert_allclose(jax.jit(f)(xs), want)
        report = si.inspect(f, xs)
        (c,) = report.collectives
        assert (c.kind, c.axes, c.group_size, c.count) == (kind, ("x",), n, 1), kind
        assert c.buffer_bytes == operand
        assert c.bytes_moved == operand * factor
        assert c.source.line == user_line(local, "jax.lax."), kind


@pytest.mark.parametrize("shape,names", MESHES)
def test_scan_multiplies_by_trip_count(shape, names, axis_type):
    mesh = make(shape, names, axis_type)
    n = mesh.shape["x"]
    steps = 5

    def local(a):
        def body(c, _):
            return c + jax.lax.psum(c, "x"), None

        c, _ = jax.lax.scan(body, a, None, length=steps)
        return c

    f = shard_map_fn(mesh, local, P("x"), P("x"))
    report = si.inspect(f, sds((16, 8), mesh, P("x")))
    (c,) = report.collectives
    per = 2 * (16 // n) * 8 * F32 * (n - 1) / n
    assert (c.kind, c.axes, c.count) == ("all-reduce", ("x",), steps)
    assert c.bytes_moved == per and c.total_bytes == steps * per
    assert report.counts() == {"all-reduce": steps}
    assert si.collective_counts(jax.jit(f).lower(sds((16, 8), mesh, P("x"))).as_text()) == (
        si.collective_counts("")
    )  # lowered StableHLO has no collectives yet; the compiled text does


def test_while_without_trip_count_is_unknown(axis_type):
    mesh = make((8,), ("x",), axis_type)

    def local(a):
        def cond(c):
            return c[1] < jnp.sum(c[0])

        def body(c):
            return c[0] + jax.lax.psum(c[0], "x"), c[1] + 1.0

        return jax.lax.while_loop(cond, body, (a, jnp.float32(0)))[0]

    f = shard_map_fn(mesh, local, P("x"), P("x"), check_vma=False)
    report = si.inspect(f, sds((16, 8), mesh, P("x")))
    (c,) = report.collectives
    assert c.count is None
    assert report.counts() == {"all-reduce": None}
    assert "unknown" in report.to_text()


def test_two_axes_and_tuple_all_reduce(axis_type):
    mesh = make((4, 2), ("x", "y"), axis_type)

    def local(a, b):
        return jax.lax.psum((a, b), ("x", "y"))

    f = lambda a, b: jax.shard_map(  # noqa: E731
        local, mesh=mesh, in_specs=(P("x", "y"), P(("x", "y"))), out_specs=P()
    )(a, b)
    report = si.inspect(f, sds((16, 8), mesh, P("x", "y")), sds((16,), mesh, P(("x", "y"))))
    cs = report.of_kind("all-reduce")
    assert sum(c.count for c in cs) >= 1
    for c in cs:
        assert c.axes == ("x", "y") and c.group_size == 8
    operand = sum(c.buffer_bytes for c in cs)
    assert operand == (4 * 4 + 2) * F32
    assert report.total_bytes == 2 * operand * 7 / 8
    assert report.by_axis()["x,y"]["bytes"] == report.total_bytes


def test_bf16_upcast_is_reported(axis_type):
    mesh = make((8,), ("x",), axis_type)
    f = shard_map_fn(mesh, lambda a: jax.lax.psum(a, "x"), P("x"), P())
    report = si.inspect(f, sds((16, 8), mesh, P("x"), jnp.bfloat16))
    (c,) = report.collectives
    if jax.default_backend() == "cpu":
        assert (c.dtype, c.upcast_from) == ("f32", "bf16")
        (w,) = [w for w in report.warnings if w.code == "upcast"]
        assert "XLA:CPU" in w.message and w.collective == 0


def test_warnings_implicit_gather_replicated_output_large():
    mesh = make((8,), ("x",), jax.sharding.AxisType.Auto)
    x = sds((64, 64), mesh, P("x"))
    report = si.inspect(lambda a: jnp.fft.fft2(a), x, large_bytes=1000)
    codes = [w.code for w in report.warnings]
    assert "implicit-gather" in codes and "large-collective" in codes
    assert "large-collective" not in [
        w.code for w in si.inspect(lambda a: jnp.fft.fft2(a), x, large_bytes=10**6).warnings
    ]
    summed = si.inspect(lambda a: a.sum(0), x)
    assert [w.code for w in summed.warnings] == ["replicated-output"]
    assert "out float32[64]" in summed.warnings[0].message
    (g,) = report.of_kind("all-gather")
    assert g.buffer_bytes == 64 * 64 * 8  # complex64, whole array on every device
    quiet = si.inspect(lambda a: a * 2, x)
    assert quiet.warnings == () and quiet.collectives == ()


def test_data_parallel_parameters_are_not_flagged_replicated(axis_type):
    """A data-parallel step returns replicated parameters on purpose: no warning for them."""
    mesh = make((8,), ("x",), axis_type)
    w = sds((16, 4), mesh, P())
    batch = sds((64, 16), mesh, P("x"))

    def step(w, batch):
        g = jax.grad(lambda w: jnp.mean((batch @ w) ** 2))(w)
        return w - 0.1 * g, batch @ w

    report = si.inspect(step, w, batch)
    (c,) = report.collectives
    assert (c.kind, c.axes, c.buffer_bytes) == ("all-reduce", ("x",), 16 * 4 * 4)
    assert report.warnings == ()


def test_accepts_jitted_lowered_compiled(axis_type):
    mesh = make((8,), ("x",), axis_type)
    f = shard_map_fn(mesh, lambda a: jax.lax.psum(a, "x"), P("x"), P())
    x = sds((16, 8), mesh, P("x"))
    jitted = jax.jit(f)
    lowered = jitted.lower(x)
    compiled = lowered.compile()
    traced = jitted.trace(x)
    reports = [
        si.inspect(f, x),
        si.inspect(jitted, x),
        si.inspect(traced),
        si.inspect(lowered),
        si.inspect(compiled),
    ]
    rows = [[c.to_dict() for c in r.collectives] for r in reports]
    assert all(r == rows[0] for r in rows) and len(rows[0]) == 1
    assert reports[0].compile_seconds is not None and reports[4].compile_seconds is None


def test_abstract_mesh_from_set_mesh():
    """Under jax.set_mesh, a program whose arguments are replicated still decodes its axes."""
    mesh = make((4, 2), ("x", "y"), jax.sharding.AxisType.Explicit)

    def f(a):
        return jax.sharding.reshard(a, P("x")).sum()

    with jax.set_mesh(mesh):
        report = si.inspect(f, jnp.ones((16, 4)))
    assert report.mesh == {"x": 4, "y": 2}
    (c,) = report.collectives
    assert (c.kind, c.axes, c.group_size) == ("all-reduce", ("x",), 4)


# ---- errors ---------------------------------------------------------------------------------


def test_error_not_a_function():
    with pytest.raises(TypeError, match=r"expects a function.*got int"):
        si.inspect(3)


def test_error_arguments_do_not_match():
    def f(a, b):
        return a + b

    with pytest.raises(TypeError, match=r"do not match f\(a, b\).*missing.*'b'.*float32\[4\]"):
        si.inspect(f, jnp.ones(4))


def test_error_no_mesh():
    with pytest.raises(si.NoMeshError, match=r"has no mesh.*NamedSharding"):
        si.inspect(lambda a: a * 2, jnp.ones(4))


def test_error_wrong_mesh():
    mesh = make((8,), ("x",), jax.sharding.AxisType.Auto)
    other = make((4,), ("x",), jax.sharding.AxisType.Auto)
    with pytest.raises(si.NoMeshError, match=r"has 4 devices but the program runs on 8"):
        si.inspect(lambda a: a.sum(), sds((16,), mesh, P("x")), mesh=other)


def test_error_compiled_with_arguments():
    mesh = make((8,), ("x",), jax.sharding.AxisType.Auto)
    compiled = jax.jit(lambda a: a).lower(sds((16,), mesh, P("x"))).compile()
    with pytest.raises(TypeError, match=r"Compiled object takes no arguments"):
        si.inspect(compiled, jnp.ones(16))
    with pytest.raises(TypeError, match=r"Lowered object takes no arguments"):
        si.inspect(jax.jit(lambda a: a).lower(sds((16,), mesh, P("x"))), jnp.ones(16))
