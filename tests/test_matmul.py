"""shardkit.matmul: every algorithm against one-device products, its layout and its collectives.

Tolerances: float32 results match numpy's float64 product within 1e-5 of max|C| (K <= 128
terms of N(0, 1) products); float64 within 1e-12 of max|C|.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit
import shardkit.matmul as skm
from shardkit.inspection import inspect
from shardkit.matmul._layout import layout_of
from shardkit.matmul.api import kernel
from shardkit.matmul.cost import fit

MESHES = {"8": ((8,), ("x",)), "2x4": ((2, 4), ("x", "y")), "4x2": ((4, 2), ("x", "y"))}

# (mesh, A spec, B spec, algorithm, out_spec, bidirectional, expected output spec)
CASES = [
    # scaling-book case 1: nothing to communicate
    ("8", ("x", None), (None, None), "allgather", None, False, ("x", None)),
    # case 2: one operand sharded on K
    ("8", (None, "x"), (None, None), "allgather", None, False, (None, None)),
    ("8", ("x", None), ("x", None), "allgather", None, False, ("x", None)),
    # case 4: same mesh axis on M of A and N of B
    ("8", ("x", None), (None, "x"), "allgather", ("x", None), False, ("x", None)),
    ("8", ("x", None), (None, "x"), "allgather", None, False, (None, "x")),  # gathers A
    # case 3: both sharded on K
    ("8", (None, "x"), ("x", None), "reduce_scatter", None, False, ("x", None)),
    ("8", (None, "x"), ("x", None), "reduce_scatter", (None, "x"), False, (None, "x")),
    ("8", (None, "x"), ("x", None), "reduce_scatter", (None, None), False, (None, None)),
    ("8", (None, "x"), ("x", None), "gspmd", None, False, (None, None)),
    # collective matmul, every ring form, both directions
    ("8", ("x", None), (None, "x"), "collective", None, False, (None, "x")),
    ("8", ("x", None), (None, "x"), "collective", ("x", None), True, ("x", None)),
    ("8", (None, "x"), (None, None), "collective", None, False, (None, None)),
    ("8", (None, None), ("x", None), "collective", None, True, (None, None)),
    ("8", (None, "x"), ("x", None), "collective", None, True, ("x", None)),
    ("8", (None, "x"), ("x", None), "collective", (None, "x"), False, (None, "x")),
    # reduce-scatter rings reading an operand not sharded on K in tiles
    ("8", (None, "x"), (None, None), "collective", ("x", None), True, ("x", None)),
    ("8", (None, None), ("x", None), "collective", (None, "x"), False, (None, "x")),
    # 2-D meshes: SUMMA, the data x model product, collective and auto
    ("2x4", ("x", "y"), ("x", "y"), "summa", None, False, ("x", "y")),
    ("4x2", ("x", "y"), ("x", "y"), "summa", None, False, ("x", "y")),
    ("2x4", ("x", "y"), ("y", None), "reduce_scatter", ("x", None), False, ("x", None)),
    ("4x2", ("x", "y"), ("y", None), "collective", None, True, ("x", "y")),
    ("2x4", ("x", "y"), ("y", None), "gspmd", ("x", None), False, ("x", None)),
    ("2x4", ("x", "y"), ("y", None), "collective", ("x", "y"), False, ("x", "y")),
    ("2x4", ("y", None), (None, "y"), "collective", None, True, (None, "y")),
    ("2x4", (None, "x"), (None, None), "collective", ("x", None), False, ("x", None)),
    ("4x2", ("x", "y"), ("y", None), "allgather", ("x", None), False, ("x", None)),
    ("4x2", ("x", "y"), ("x", "y"), "gspmd", ("x", "y"), False, ("x", "y")),
    ("4x2", ("x", None), (None, "y"), "auto", None, False, ("x", "y")),
    ("2x4", ("y", "x"), ("x", None), "auto", None, False, ("y", "x")),
]
SHAPES = [(64, 64, 64), (32, 128, 64)]  # square, rectangular (M, K, N)


def _make_mesh(name, axis_type):
    shape, names = MESHES[name]
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(names))


def _operands(mesh, sa, sb, shape, dtype=np.float32, seed=0):
    m, k, n = shape
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    A = jax.device_put(a, NamedSharding(mesh, P(*sa)))
    B = jax.device_put(b, NamedSharding(mesh, P(*sb)))
    return a, b, A, B


@pytest.mark.parametrize("shape", SHAPES, ids=["square", "rect"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_algorithm_matches_one_device(case, shape, axis_type):
    mesh_name, sa, sb, algorithm, out, bidi, want = CASES[case]
    mesh = _make_mesh(mesh_name, axis_type)
    a, b, A, B = _operands(mesh, sa, sb, shape, seed=case)
    method, compiled = skm.compile_matmul(
        A, B, algorithm=algorithm, out_spec=out, bidirectional=bidi
    )
    C = compiled(A, B)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    # 1. numbers
    np.testing.assert_allclose(np.asarray(C), ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    # 2. layout: the promised spec and per-device block shapes
    assert method.out_spec == want
    assert C.sharding.is_equivalent_to(NamedSharding(mesh, P(*want)), 2)
    blocks = {s.data.shape for s in C.addressable_shards}
    m, n = ref.shape
    sizes = [1 if e is None else mesh.shape[e] for e in want]
    assert blocks == {(m // sizes[0], n // sizes[1])}
    # 3. collectives: executions and bytes per device equal the prediction (gspmd: no claim)
    report = inspect(compiled)
    got = {k: v for k, v in report.counts().items() if v}
    if algorithm != "gspmd":
        assert got == method.counts(), (got, method.detail)
        assert int(report.total_bytes) == method.comm_bytes
    assert "all-gather" not in got or algorithm in ("allgather", "gspmd")


def test_public_entry_points_agree(axis_type):
    """``shardkit.matmul(...)``, ``shardkit.matmul.matmul(...)`` and ``import as`` all work."""
    mesh = _make_mesh("8", axis_type)
    a, b, A, B = _operands(mesh, ("x", None), (None, "x"), (64, 32, 64))
    C1 = shardkit.matmul(A, B, algorithm="collective")
    C2 = shardkit.matmul.matmul(A, B, algorithm="collective")
    C3 = skm(A, B, algorithm="collective", bidirectional=True)
    ref = a @ b
    for C in (C1, C2, C3):
        np.testing.assert_allclose(np.asarray(C), ref, atol=1e-5 * np.abs(ref).max(), rtol=0)
        assert C.sharding.spec == P(None, "x")
    assert callable(shardkit.matmul) and shardkit.matmul.chain is skm.chain


def test_second_call_does_not_recompile():
    mesh = _make_mesh("8", AxisType.Explicit)
    _, _, A, B = _operands(mesh, (None, "x"), ("x", None), (64, 64, 64))
    skm(A, B, algorithm="reduce_scatter")
    L = layout_of(A, B)
    fn = kernel(L, fit(L, "reduce_scatter", None), jnp.dtype(jnp.float32))
    before = fn._cache_size()
    skm(A, B, algorithm="reduce_scatter")
    assert fn._cache_size() == before == 1


@pytest.mark.parametrize(
    "mesh_name,sa,sb,algorithm",
    [
        ("8", (None, "x"), ("x", None), "collective"),
        ("8", ("x", None), (None, "x"), "collective"),
        ("8", ("x", None), ("x", None), "allgather"),
        ("2x4", ("x", "y"), ("x", "y"), "summa"),
        ("4x2", ("x", "y"), ("y", None), "reduce_scatter"),
        ("4x2", ("x", "y"), ("y", None), "collective-bidirectional"),
        ("2x4", ("x", "y"), ("y", None), "gspmd"),
    ],
)
def test_float64(mesh_name, sa, sb, algorithm, axis_type):
    bidi = algorithm.endswith("-bidirectional")
    algorithm = algorithm.removesuffix("-bidirectional")
    with jax.enable_x64(True):
        mesh = _make_mesh(mesh_name, axis_type)
        a, b, A, B = _operands(mesh, sa, sb, (64, 128, 32), dtype=np.float64)
        C = skm(A, B, algorithm=algorithm, bidirectional=bidi)
        assert C.dtype == jnp.float64
        ref = a @ b
        np.testing.assert_allclose(np.asarray(C), ref, rtol=0, atol=1e-12 * np.abs(ref).max())


def test_auto_picks_fewest_bytes_and_explains(capsys):
    mesh = _make_mesh("8", AxisType.Explicit)
    _, _, A, B = _operands(mesh, ("x", None), (None, None), (64, 32, 64))
    assert skm.explain(A, B).chosen.comm_bytes == 0  # case 1: local
    _, _, A, B = _operands(mesh, (None, "x"), ("x", None), (64, 64, 64))
    ex = skm.explain(A, B)
    fits = [m for _, m in ex.rows if isinstance(m, skm.Method)]
    assert ex.chosen.comm_bytes == min(m.comm_bytes for m in fits)
    assert ex.chosen.comm_bytes < fit(layout_of(A, B), "allgather", None).comm_bytes
    print(ex)
    text = capsys.readouterr().out
    assert "<- chosen" in text and "A[M, K_x] @ B[K_x, N]" in text
    assert "summa" in text and "needs a 2-D mesh" in text
    assert f"{ex.chosen.comm_bytes:>12,}" in text


def _err_operands(mesh_name="8", sa=("x", None), sb=(None, None), shape=(64, 32, 64)):
    mesh = _make_mesh(mesh_name, AxisType.Explicit)
    return _operands(mesh, sa, sb, shape)[2:]


def test_error_mismatched_inner_dims():
    mesh = _make_mesh("8", AxisType.Explicit)
    A = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("x", None)))
    B = jax.device_put(jnp.ones((48, 64)), NamedSharding(mesh, P()))
    with pytest.raises(skm.MatmulLayoutError, match=r"inner dims differ.*32 != B.shape\[0\]=48"):
        skm(A, B)


def test_error_operands_on_different_meshes_name_each_with_its_devices():
    lo = jax.make_mesh((4,), ("x",), devices=jax.devices()[:4])
    hi = jax.make_mesh((4,), ("x",), devices=jax.devices()[4:])  # same shape, other devices
    a = jax.device_put(jnp.ones((16, 8)), NamedSharding(lo, P("x", None)))
    b = jax.device_put(jnp.ones((8, 16)), NamedSharding(hi, P(None, "x")))
    for algorithm in ("auto", "gspmd"):
        with pytest.raises(skm.MatmulLayoutError, match=r"A: \{'x': 4\} on devices \[0, 1, 2, 3\]"
                           r", B: \{'x': 4\} on devices \[4, 5, 6, 7\]\); fix"):  # fmt: skip
            skm.matmul(a, b, algorithm=algorithm)
    wide, tall = jax.make_mesh((2, 4), ("r", "c")), jax.make_mesh((4, 2), ("r", "c"))
    a = jax.device_put(jnp.ones((8, 8)), NamedSharding(wide, P("r", None)))
    b = jax.device_put(jnp.ones((8, 8)), NamedSharding(tall, P(None, "c")))
    with pytest.raises(
        skm.MatmulLayoutError, match=r"A: \{'r': 2, 'c': 4\}.*B: \{'r': 4, 'c': 2\}"
    ):
        skm.matmul(a, b)


def test_error_not_2d():
    mesh = _make_mesh("8", AxisType.Explicit)
    A = jax.device_put(jnp.ones((8, 4, 4)), NamedSharding(mesh, P("x")))
    B = jax.device_put(jnp.ones((4, 4)), NamedSharding(mesh, P()))
    with pytest.raises(skm.MatmulLayoutError, match=r"A has shape \(8, 4, 4\).*fix: reshape"):
        skm(A, B)


def test_error_unknown_mesh_axis_in_out_spec():
    A, B = _err_operands()
    with pytest.raises(skm.MatmulLayoutError, match=r"names mesh axis 'model'.*\{'x': 8\}"):
        skm(A, B, out_spec=P("model", None))


def test_error_unknown_mesh_axis_in_abstract_spec():
    mesh = _make_mesh("8", AxisType.Explicit)
    A = jax.ShapeDtypeStruct((64, 32), jnp.float32)
    with pytest.raises(skm.MatmulLayoutError, match=r"A: spec P\('data', None\) names mesh axis"):
        layout_of(A, A.update(shape=(32, 8)), mesh=mesh, a_spec=P("data", None))


def test_error_summa_on_1d_mesh():
    A, B = _err_operands(sa=("x", None), sb=("x", None))
    with pytest.raises(skm.MatmulLayoutError, match=r"summa' needs a 2-D mesh.*fix: build a 2-D"):
        skm(A, B, algorithm="summa")


def test_error_summa_wrong_layout():
    A, B = _err_operands("2x4", sa=("x", None), sb=("y", None))
    with pytest.raises(skm.MatmulLayoutError, match=r"needs A\[M_R, K_C\].*got A\[M_x, K\]"):
        skm(A, B, algorithm="summa")


def test_error_reduce_scatter_without_sharded_k():
    A, B = _err_operands(sa=("x", None), sb=(None, None))
    with pytest.raises(skm.MatmulLayoutError, match=r"needs the contracting dim K sharded.*fix"):
        skm(A, B, algorithm="reduce_scatter")


def test_error_reduce_scatter_two_axes():
    A, B = _err_operands("2x4", sa=(None, "x"), sb=("y", None))
    with pytest.raises(skm.MatmulLayoutError, match=r"different mesh axes.*'x', size 2"):
        skm(A, B, algorithm="reduce_scatter")


def test_error_collective_on_local_layout():
    A, B = _err_operands(sa=("x", None), sb=(None, None))
    with pytest.raises(skm.MatmulLayoutError, match=r"no dim needs communication.*allgather"):
        skm(A, B, algorithm="collective")


def test_error_collective_out_spec_mismatch():
    A, B = _err_operands(sa=("x", None), sb=(None, "x"))
    with pytest.raises(skm.MatmulLayoutError, match=r"gives C as P\('x', None\), not out_spec"):
        skm(A, B, algorithm="collective", out_spec=P(None, None))


def test_error_bidirectional_odd_block():
    A, B = _err_operands(sa=("x", None), sb=(None, "x"), shape=(8, 16, 16))
    with pytest.raises(skm.MatmulLayoutError, match=r"bidirectional=True.*1 rows/cols \(odd\)"):
        skm(A, B, algorithm="collective", bidirectional=True)


def test_error_unknown_algorithm():
    A, B = _err_operands()
    with pytest.raises(ValueError, match=r"algorithm='cannon' is not one of .*fix"):
        skm(A, B, algorithm="cannon")


def test_error_out_spec_axis_twice():
    A, B = _err_operands()
    with pytest.raises(skm.MatmulLayoutError, match=r"uses mesh axis 'x' on both dims"):
        skm(A, B, out_spec=P("x", "x"))


def test_error_no_mesh():
    with pytest.raises(skm.MatmulLayoutError, match=r"neither A nor B has a NamedSharding"):
        skm(jnp.ones((8, 8)), jnp.ones((8, 8)))


def test_error_multi_axis_dim():
    mesh = _make_mesh("2x4", AxisType.Explicit)
    A = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P(("x", "y"), None)))
    B = jax.device_put(jnp.ones((32, 16)), NamedSharding(mesh, P()))
    with pytest.raises(skm.MatmulLayoutError, match=r"several mesh axes \('x', 'y'\).*gspmd"):
        skm(A, B, algorithm="allgather")


def test_error_indivisible_out_spec_in_chain():
    mesh = _make_mesh("8", AxisType.Explicit)
    A = jax.device_put(jnp.ones((12, 16)), NamedSharding(mesh, P()))
    B = jax.device_put(jnp.ones((16, 16)), NamedSharding(mesh, P(None, "x")))
    with pytest.raises(skm.MatmulLayoutError, match=r"dim 0 has size 12, not divisible.*size 8"):
        skm.chain([A, B], out_spec=P("x", None))


def test_inside_jit_on_explicit_axes():
    """On Explicit axes the layout is part of a tracer's type, so matmul composes under jit."""
    mesh = _make_mesh("8", AxisType.Explicit)
    a, b, A, B = _operands(mesh, ("x", None), (None, "x"), (64, 32, 64))
    f = jax.jit(lambda x, y: 2.0 * skm(x, y, algorithm="collective"))
    C = f(A, B)
    ref = 2.0 * a @ b
    np.testing.assert_allclose(np.asarray(C), ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    counts = {k: v for k, v in inspect(f.lower(A, B).compile()).counts().items() if v}
    assert counts == {"collective-permute": 7}


def test_error_inside_jit_on_auto_axes():
    mesh = _make_mesh("8", AxisType.Auto)
    _, _, A, B = _operands(mesh, ("x", None), (None, "x"), (64, 32, 64))
    with pytest.raises(
        skm.MatmulLayoutError, match=r"A is traced \(inside jax.jit.*\) on a mesh with Auto"
    ):
        jax.jit(lambda x, y: skm(x, y))(A, B)
