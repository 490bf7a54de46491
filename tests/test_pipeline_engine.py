"""The SPMD pipeline executor against the sequential reference: values, memory, collectives.

Every schedule's loss and gradients (stage parameters, loss-head parameters, input cotangent)
must equal ``reference_value_and_grad`` (plain ``jax.value_and_grad`` over the stages in model
order) in float32 to ATOL + RTOL * |reference|. The grid is small but covering: p = 2, 4, 8,
m from p to 4p, every schedule with both residual modes, Auto and Explicit meshes, a data
axis and a tensor axis.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit
from shardkit.inspection import parse_hlo
from shardkit.models.common import row_parallel_out
from shardkit.pipeline import (
    GPipe,
    Interleaved,
    OneFOneB,
    ZeroBubbleH1,
    gpipe_value_and_grad,
    pipeline_value_and_grad,
    reference_value_and_grad,
    table,
)

# float32: |got - want| <= ATOL * max(1, max|want leaf|) + RTOL * |want|, the atol scaled by
# each leaf's largest entry since summation order differs (up to 16 stages, 32 micro-batches)
ATOL, RTOL = 2e-6, 2e-5
D, H, MB = 8, 16, 4
AUTO, EXPLICIT = AxisType.Auto, AxisType.Explicit


def stage_fn(w, x):
    """A residual MLP block; gelu's residuals depend on x, the weights' do not."""
    return x + jax.nn.gelu(x @ w["w1"] + w["b"]) @ w["w2"]


def last_fn(head, y, t):
    return jnp.mean((y @ head - t) ** 2)


M_MAX = 32


@functools.cache
def _data(S):
    rng = np.random.default_rng(S)

    def normal(*shape, scale=1.0):
        return jnp.asarray(scale * rng.standard_normal(shape), jnp.float32)

    w = {
        "w1": normal(S, D, H, scale=1 / np.sqrt(D)),
        "b": normal(S, H, scale=0.1),
        "w2": normal(S, H, D, scale=0.5 / np.sqrt(H)),
    }
    head = normal(D, D, scale=1 / np.sqrt(D))
    return w, head, normal(M_MAX, MB, D), normal(M_MAX, MB, D)


def make(S, m):
    """Parameters of S stages and m micro-batches (the first m of M_MAX)."""
    w, head, xs, ts = _data(S)
    return w, head, xs[:m], ts[:m]


@functools.cache
def _per_microbatch_reference(S):
    """reference_value_and_grad on each of the M_MAX micro-batches alone (one compile per S)."""
    w, head, xs, ts = _data(S)
    ref = jax.jit(reference_value_and_grad(stage_fn, last_fn))
    xs, ts = np.asarray(xs), np.asarray(ts)
    parts = [jax.device_get(ref(w, head, xs[i : i + 1], ts[i : i + 1])) for i in range(M_MAX)]
    return jax.tree.map(lambda *a: np.stack(a), *parts)


def reference(S, m):
    """The reference loss and gradients over the first m micro-batches: means of the parts."""
    loss, (gw, ghead, gxs) = _per_microbatch_reference(S)
    return loss[:m].mean(0), (jax.tree.map(lambda g: g[:m].mean(0), gw), ghead[:m].mean(0),
                              gxs[:m, 0] / m)  # fmt: skip


def engine(kind, mesh, m, fn=stage_fn, **kw):
    if kind == "autodiff":
        return gpipe_value_and_grad(fn, last_fn, mesh=mesh, microbatches=m, **kw)
    sched, residuals = kind
    return pipeline_value_and_grad(
        fn, last_fn, mesh=mesh, schedule=sched, microbatches=m, residuals=residuals, **kw
    )


def assert_close(got, want):
    loss, grads = got
    rloss, rgrads = want
    np.testing.assert_allclose(loss, rloss, atol=ATOL * max(1.0, abs(float(rloss))), rtol=RTOL)
    paths = jax.tree_util.tree_leaves_with_path(rgrads)
    for (path, r), g in zip(paths, jax.tree.leaves(grads), strict=True):
        assert g.shape == r.shape, jax.tree_util.keystr(path)
        atol = ATOL * max(1.0, float(jnp.max(jnp.abs(r))))
        np.testing.assert_allclose(g, r, atol=atol, rtol=RTOL, err_msg=jax.tree_util.keystr(path))


def run_case(kind, mesh, m, *, data=None, **kw):
    """Compiles and runs one engine on sharded inputs; returns (compiled, result, reference)."""
    v = 1 if kind == "autodiff" else kind[0].virtual
    p = dict(mesh.shape)["stage"]
    w, head, xs, ts = make(p * v, m)
    ref = reference(p * v, m)
    w = jax.tree.map(lambda a: jax.device_put(a, NamedSharding(mesh, P("stage"))), w)
    xs, ts = (jax.device_put(a, NamedSharding(mesh, P(None, data))) for a in (xs, ts))
    head = jax.device_put(head, NamedSharding(mesh, P()))
    f = engine(kind, mesh, m, data_axes=(data,) if data else (), **kw)
    compiled = jax.jit(f).lower(w, head, xs, ts).compile()
    return f, compiled, compiled(w, head, xs, ts), ref


def test_reference_over_m_is_the_mean_of_its_micro_batches():
    """The per-micro-batch reference used below agrees with one call over m micro-batches."""
    w, head, xs, ts = make(2, 5)
    direct = jax.jit(reference_value_and_grad(stage_fn, last_fn))(w, head, xs, ts)
    assert_close(reference(2, 5), direct)
    assert float(direct[0]) > 0.1  # a real loss, not a degenerate zero


REC, STASH = "recompute", "stash"
# (p, m, engine, axis type): each p sees m = p and m = 4p, each schedule both residual modes,
# both mesh kinds, and m values that are not multiples of p where the schedule allows.
GRID = [
    (2, 2, "autodiff", AUTO),
    (2, 8, (OneFOneB(), STASH), EXPLICIT),
    (2, 4, (Interleaved(v=2), STASH), AUTO),
    (2, 7, (ZeroBubbleH1(), REC), EXPLICIT),
    (2, 5, (GPipe(), REC), AUTO),
    (4, 16, "autodiff", EXPLICIT),
    (4, 4, (OneFOneB(), REC), AUTO),
    (4, 13, (OneFOneB(fused=False), STASH), EXPLICIT),
    (4, 16, (Interleaved(v=2), REC), AUTO),
    (4, 4, (ZeroBubbleH1(), STASH), AUTO),
    (4, 12, (GPipe(), STASH), EXPLICIT),
    (4, 9, (ZeroBubbleH1(fused=True), STASH), EXPLICIT),
    (8, 8, "autodiff", AUTO),
    (8, 32, (OneFOneB(), STASH), EXPLICIT),
    (8, 8, (ZeroBubbleH1(), STASH), AUTO),
    (8, 16, (Interleaved(v=2), STASH), EXPLICIT),
]


def _id(case):
    p, m, kind, at = case
    name = kind if kind == "autodiff" else f"{kind[0].name}-{kind[1]}"
    return f"p{p}-m{m}-{name}-{'auto' if at == AUTO else 'explicit'}"


@pytest.mark.parametrize("case", GRID, ids=[_id(c) for c in GRID])
def test_schedule_matches_reference(case):
    p, m, kind, at = case
    mesh = jax.make_mesh((p,), ("stage",), axis_types=(at,), devices=jax.devices()[:p])
    f, compiled, got, ref = run_case(kind, mesh, m)
    assert_close(got, ref)
    # the executor scans over exactly the schedule's table: one activation and one gradient
    # ppermute per step (autodiff: m + p - 1 forward steps and their transposes)
    steps = m + p - 1 if kind == "autodiff" else table(kind[0], p, m).steps
    assert f.steps == steps
    report, loop_permutes = _audit(compiled)
    assert loop_permutes == 2 * steps
    assert {c.axes for c in report.collectives} <= {("stage",)}
    assert not report.of_kind("all-gather")  # parameters stay where they are


def test_stash_every_residual_matches_reference_and_costs_more_memory():
    """stash_policy=None keeps every vjp residual; the default keeps matmul outputs only."""
    mesh = jax.make_mesh((2,), ("stage",), axis_types=(AUTO,), devices=jax.devices()[:2])
    _, every, got, ref = run_case((ZeroBubbleH1(), STASH), mesh, 5, stash_policy=None)
    assert_close(got, ref)
    _, dots, _, _ = run_case((ZeroBubbleH1(), STASH), mesh, 5)
    temp = [c.memory_analysis().temp_size_in_bytes for c in (every, dots)]
    assert temp[1] < 0.8 * temp[0], temp  # gelu's elementwise residuals are recomputed


def test_input_grad_false_and_no_recompile():
    """input_grad=False returns g_xs=None with the same loss and gradients; a second call with
    new values reuses the compiled program."""
    mesh = jax.make_mesh((2,), ("stage",), axis_types=(EXPLICIT,), devices=jax.devices()[:2])
    f = jax.jit(engine((OneFOneB(), STASH), mesh, 4, input_grad=False))
    w, head, xs, ts = make(2, 4)
    w = jax.tree.map(lambda a: jax.device_put(a, NamedSharding(mesh, P("stage"))), w)
    loss, (gw, ghead, gxs) = f(w, head, xs, ts)
    assert gxs is None
    assert_close((loss, (gw, ghead)), (reference(2, 4)[0], reference(2, 4)[1][:2]))
    f(w, head, 2 * xs, ts)
    assert f._cache_size() == 1


def _audit(compiled):
    """The report and the executions of collective-permutes inside loops (the schedule's)."""
    report = shardkit.inspect(compiled)
    entry = parse_hlo(compiled.as_text()).entry
    permutes = report.of_kind("collective-permute")
    return report, sum(c.count for c in permutes if c.computation != entry)


def _data_reductions(compiled):
    """(all-reduces over 'data' with their counts, and whether each is in the entry)."""
    report = shardkit.inspect(compiled)
    entry = parse_hlo(compiled.as_text()).entry
    return report, [(c.count, c.computation == entry) for c in report.of_kind("all-reduce")
                    if c.axes is not None and "data" in c.axes]  # fmt: skip


@pytest.mark.parametrize(
    "kind, at",
    [
        ("autodiff", EXPLICIT),
        ((OneFOneB(), STASH), AUTO),
        ((OneFOneB(), REC), EXPLICIT),
        ((ZeroBubbleH1(), STASH), EXPLICIT),
        ((Interleaved(v=2), REC), AUTO),
    ],
    ids=[
        "autodiff-explicit",
        "1f1b-stash-auto",
        "1f1b-rec-explicit",
        "zb-stash-explicit",
        "interleaved-rec-auto",
    ],  # fmt: skip
)
def test_data_axis_one_gradient_reduction_after_the_loop(kind, at):
    mesh = jax.make_mesh((2, 4), ("data", "stage"), axis_types=(at, at))
    f, compiled, got, ref = run_case(kind, mesh, 8, data="data")
    assert_close(got, ref)
    report, data_reduces = _data_reductions(compiled)
    # exactly one gradient all-reduce over 'data', executed once, outside the schedule loop
    assert data_reduces == [(1, True)]
    assert _audit(compiled)[1] == 2 * f.steps
    assert all(c.axes == ("stage",) for c in report.of_kind("collective-permute"))
    assert {c.kind for c in report.collectives} == {"collective-permute", "all-reduce"}


def tensor_stage_fn(w, x):
    """stage_fn with Megatron's row-parallel matmul spelled out for Explicit meshes."""
    g = jax.nn.gelu(x @ w["w1"] + w["b"])  # (mb, H), H split over 'tensor'
    return x + jnp.einsum("bh,hd->bd", g, w["w2"], out_sharding=row_parallel_out(g, 2))


@pytest.mark.parametrize(
    "kind, at",
    [("autodiff", EXPLICIT), ((OneFOneB(), STASH), AUTO), ((OneFOneB(), STASH), EXPLICIT),
     ((ZeroBubbleH1(fused=True), REC), EXPLICIT)],
    ids=["autodiff-explicit", "1f1b-stash-auto", "1f1b-stash-explicit", "zb-fused-rec-explicit"],
)  # fmt: skip
def test_tensor_axis_left_to_the_compiler(kind, at):
    """data=2, tensor=2, stage=2: the stage's matmul weights are sharded over 'tensor'; on
    Explicit meshes too they stay split inside the stages (no all-gather at the shard_map
    boundary, which JAX's partial-manual lowering would otherwise insert)."""
    mesh = jax.make_mesh((2, 2, 2), ("data", "tensor", "stage"), axis_types=(at,) * 3)
    specs = {"w1": P("stage", None, "tensor"), "b": P("stage", "tensor"),
             "w2": P("stage", "tensor", None)}  # fmt: skip
    w, head, xs, ts = make(2, 4)
    ref = reference(2, 4)
    w = {k: jax.device_put(a, NamedSharding(mesh, specs[k])) for k, a in w.items()}
    xs, ts = (jax.device_put(a, NamedSharding(mesh, P(None, "data"))) for a in (xs, ts))
    f = engine(kind, mesh, 4, fn=tensor_stage_fn, data_axes=("data",))
    compiled = jax.jit(f).lower(w, head, xs, ts).compile()
    got = compiled(w, head, xs, ts)
    assert_close(got, ref)
    for k, spec in specs.items():  # gradients come back laid out as the parameters
        assert got[1][0][k].sharding.is_equivalent_to(NamedSharding(mesh, spec), 3), k
    report, data_reduces = _data_reductions(compiled)
    assert data_reduces == [(1, True)]
    assert {c.axes for c in report.collectives} <= {("stage",), ("data",), ("tensor",)}
    assert not report.of_kind("all-gather")
    tensor = [c for c in report.of_kind("all-reduce") if c.axes == ("tensor",)]
    assert tensor and max(c.count for c in tensor) >= 4  # Megatron's, inside the steps


def mlp(w, x):
    return x + jax.nn.gelu(x @ w["w1"]) @ w["w2"]


def _temp_mib(kind, mesh, m):
    f = engine(kind, mesh, m, fn=mlp, input_grad=False)
    p = dict(mesh.shape)["stage"]
    sh = NamedSharding(mesh, P("stage"))
    w = {"w1": jax.ShapeDtypeStruct((p, 64, 128), jnp.float32, sharding=sh),
         "w2": jax.ShapeDtypeStruct((p, 128, 64), jnp.float32, sharding=sh)}  # fmt: skip
    x = jax.ShapeDtypeStruct((m, 64, 64), jnp.float32, sharding=NamedSharding(mesh, P()))
    head = jax.ShapeDtypeStruct((64, 64), jnp.float32, sharding=NamedSharding(mesh, P()))
    compiled = jax.jit(f).lower(w, head, x, x).compile()
    return compiled.memory_analysis().temp_size_in_bytes / 2**20


def test_1f1b_temporaries_flat_in_m_while_gpipe_autodiff_grows():
    """Per-device temporaries (memory_analysis) at p = 4, activation 16 KiB, m = 4 .. 32."""
    mesh = jax.make_mesh((4,), ("stage",), axis_types=(AUTO,), devices=jax.devices()[:4])
    ad = [_temp_mib("autodiff", mesh, m) for m in (4, 32)]
    plain = [_temp_mib((OneFOneB(fused=False), STASH), mesh, m) for m in (4, 32)]
    fused = [_temp_mib((OneFOneB(), REC), mesh, m) for m in (8, 32)]
    assert ad[1] > 2 * ad[0], ad  # GPipe by autodiff keeps every micro-batch's residuals
    assert plain[1] < 1.10 * plain[0], plain  # <= p in flight
    assert fused[1] < 1.10 * fused[0], fused  # <= 2p - 1 in flight, reached from m = 8


# --------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def mesh4():
    return jax.make_mesh((4,), ("stage",), axis_types=(AUTO,), devices=jax.devices()[:4])


def _call(f, S=4, m=8, mb=MB, x_dtype=jnp.float32):
    w, head, xs, ts = make(S, m)
    xs = jnp.zeros((m, mb, D), x_dtype)
    ts = jnp.zeros((m, mb, D))
    return jax.eval_shape(f, w, head, xs, ts)


def test_error_no_stage_axis():
    mesh = jax.make_mesh((4,), ("data",), axis_types=(AUTO,), devices=jax.devices()[:4])
    with pytest.raises(ValueError, match=r"no 'stage' axis.*fix: make the mesh with a 'stage'"):
        pipeline_value_and_grad(stage_fn, last_fn, mesh=mesh, schedule=OneFOneB(),
                                microbatches=8)  # fmt: skip


def test_error_m_below_p_where_the_schedule_needs_more(mesh4):
    with pytest.raises(ValueError, match=r"m=2 .*< p=4.*fix: use microbatches=4"):
        engine((ZeroBubbleH1(), REC), mesh4, 2)
    with pytest.raises(ValueError, match=r"m=2 .*< p=4.*multiple of p; fix: use microbatches=4"):
        engine((Interleaved(v=2), REC), mesh4, 2)


def test_error_stage_params_leading_axis(mesh4):
    f = engine((Interleaved(v=2), REC), mesh4, 8)
    with pytest.raises(ValueError, match=r"stage_params\['b'\] has shape \(4, 16\).*p\*v = 4\*2 = 8"
                       r".*fix: stack"):  # fmt: skip
        _call(f, S=4)


def test_error_stage_output_shape_or_dtype(mesh4):
    wide = pipeline_value_and_grad(lambda w, x: jnp.concatenate([x, x], -1), last_fn,
                                   mesh=mesh4, schedule=GPipe(), microbatches=8)  # fmt: skip
    with pytest.raises(ValueError, match=r"stage_fn maps .*\(4, 8\).* to .*\(4, 16\).*fix"):
        _call(wide)
    cast = gpipe_value_and_grad(lambda w, x: x.astype(jnp.bfloat16), last_fn, mesh=mesh4,
                                microbatches=8)  # fmt: skip
    with pytest.raises(ValueError, match=r"float32.*bfloat16.*same shape and dtype; fix"):
        _call(cast)


def test_error_microbatch_not_divisible_by_data_axes():
    mesh = jax.make_mesh((2, 4), ("data", "stage"), axis_types=(AUTO, AUTO))
    f = engine((OneFOneB(), STASH), mesh, 8, data_axes=("data",))
    with pytest.raises(ValueError, match=r"micro-batch size 3 .*not divisible by the 2 devices "
                       r"of data_axes=\('data',\); fix: use a micro-batch size"):  # fmt: skip
        _call(f, mb=3)
    with pytest.raises(ValueError, match=r"xs has shape \(8, 4, 8\).*microbatches=6.*fix"):
        jax.eval_shape(engine((OneFOneB(), STASH), mesh, 6), *make(4, 8))


def test_error_bad_residuals_and_data_axes(mesh4):
    with pytest.raises(ValueError, match=r"residuals='keep'; fix: pass residuals='recompute'"):
        engine((OneFOneB(), "keep"), mesh4, 8)
    with pytest.raises(ValueError, match=r"data_axes=\('batch',\).*fix: pass data_axes="):
        engine((OneFOneB(), REC), mesh4, 8, data_axes=("batch",))


def test_stash_keeps_no_weights_in_slots(mesh4):
    """Stashed residuals depend on the micro-batch: no slot holds a [D, H] or [H, D] weight."""
    f = engine((OneFOneB(), STASH), mesh4, 8)
    w, head, xs, ts = make(4, 8)
    jaxpr = jax.make_jaxpr(f)(w, head, xs, ts)
    text = str(jaxpr)
    assert f.plan.res_slots == 7  # 2p - 1 micro-batches in flight on the first device
    # the residual buffers are [slots + 1, MB, ...]; a weight-shaped one would be [8, 8, 16]
    assert f"f32[{f.plan.res_slots + 1},{D},{H}]" not in text
    assert f"f32[{f.plan.res_slots + 1},{H},{D}]" not in text
    assert f"f32[{f.plan.res_slots + 1},{MB},{H}]" in text


def test_split_backward_w_runs_only_the_weight_gradient_matmuls():
    """Zero-bubble BI and W with stashed residuals: one backward traced once and cut in two.
    A stage of two residual-MLP blocks (a scan) has 8 backward matmuls: BI runs the 4 of the
    input-gradient chain, W the 4 weight-gradient ones (two vjp calls would give W 6: it
    would redo the second block's input gradient); W reads no weight-shaped value from BI."""
    from shardkit.pipeline.residuals import Residuals
    from shardkit.pipeline.split import SplitBackward

    def two_blocks(w, x):
        return lax.scan(lambda h, wl: (stage_fn(wl, h), None), x, w)[0]

    w, _, xs, ts = make(2, 1)  # the 2 stages' weights as one stage of 2 blocks
    x, g = xs[0], ts[0]
    mid = Residuals(two_blocks, (w, x), live=(1,), policy=jax.checkpoint_policies.dots_saveable)
    stashed = jax.jit(mid.forward)(w, x)[1]
    split = SplitBackward(lambda st, pc, x, g: mid.vjp(st, pc, x)(g), (stashed, w, x, g),
                          grads_of=(0,), input_grads=(1,))  # fmt: skip
    dots = [sum(e.primitive.name == "dot_general" for e in eqns) for eqns in (split._bi, split._w)]
    assert dots == [4, 4]
    weight_shapes = {tuple(a.shape[1:]) for a in jax.tree.leaves(w)}
    assert not weight_shapes & {tuple(c.shape) for c in split.cut_proto}

    @jax.jit
    def both(stashed, w, x, g):
        (dx,), cut = split.bi(stashed, w, x, g)
        (dw,) = split.w(stashed, w, x, g, cut)
        return (dw, dx), jax.vjp(two_blocks, w, x)[1](g)

    got, want = both(stashed, w, x, g)
    assert_close((0.0, got), (0.0, want))
