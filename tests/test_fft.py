"""shardkit.fft: numbers vs numpy, layouts, collectives, memory, recompiles, errors."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.fft as skfft
from shardkit.inspection.hlo import collective_counts
from shardkit.inspection.hlo_parse import parse_hlo

# (mesh shape, mesh axis names, input spec, all-to-alls of one complex transform)
MESHES = {
    "8": ((8,), ("x",), P("x"), 1),
    "8-y": ((8,), ("x",), P(None, "x"), 1),
    "1x8": ((1, 8), ("x", "y"), P("x", "y"), 1),
    "2x4": ((2, 4), ("x", "y"), P("x", "y"), 2),
    "4x2": ((4, 2), ("x", "y"), P("x", "y"), 2),
    "2x4-yx": ((2, 4), ("x", "y"), P("y", "x"), 2),  # X over the mesh's second axis
    "8x1": ((8, 1), ("x", "y"), P("x", "y"), 1),
}
RTOL = {np.complex64: 1e-5, np.complex128: 1e-12}  # relative L2 error vs numpy in float64
SHAPE = (32, 16, 24)  # non-cubic; every dim divides by 8


def _mesh(name, axis_type):
    shape, names, spec, a2a = MESHES[name]
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape)), spec, a2a


def _data(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _relerr(got, want):
    got = np.asarray(got).astype(np.complex128)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _same_layout(a, b):
    return a.sharding.is_equivalent_to(b.sharding, a.ndim)


def _put(x, mesh, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))


def _compiled(fn, arg, spec):
    """Compiles `fn(arg, spec=spec)` under jit; returns the executable and its audit."""
    compiled = jax.jit(lambda a: fn(a, spec=spec)).lower(arg).compile()
    text = compiled.as_text()
    return compiled, collective_counts(text), compiled.memory_analysis().temp_size_in_bytes, text


def _a2a_bytes(text):
    """Bytes per device the all-to-alls of compiled HLO text deliver (their results)."""
    ops = parse_hlo(text).instructions()
    return sum(a.nbytes for op in ops if op.opcode == "all-to-all" for a in op.arrays)


def _halves(mesh, spec, layout):
    """Whether a forward transform runs its exchange in two halves: a slab's natural layout
    with X split (its temporaries are 1.5 L, not 2 L)."""
    x_axis = spec[0] if len(spec) else None
    return layout == "natural" and x_axis is not None and dict(mesh.shape)[x_axis] > 1


def _check_complex(mesh, spec, shape, dtype, a2a):
    """Numbers, layouts, collectives and memory of forward and inverse, both layouts.

    Each transform is compiled once through the public API under jit; the same executable gives
    the numbers, the HLO and the memory analysis.
    """
    host = _data(shape, dtype)
    x = _put(host, mesh, spec)
    local = x.nbytes / mesh.size
    want = np.fft.fftn(host.astype(np.complex128))
    for layout in ("natural", "transposed"):
        lay = skfft.spectral_layout(x, layout=layout)
        fwd = functools.partial(skfft.pfft3d, layout=layout)
        inv = functools.partial(skfft.pifft3d, layout=layout)
        compiled_f, counts_f, temp_f, text_f = _compiled(fwd, x, spec)
        y = compiled_f(x)
        compiled_i, counts_i, temp_i, text_i = _compiled(inv, y, lay.spec)
        x2 = compiled_i(y)
        # 1. numbers
        expect = want if layout == "natural" else np.moveaxis(want, 0, -1)
        assert y.dtype == dtype and y.shape == expect.shape == lay.shape
        assert _relerr(y, expect) < RTOL[dtype], layout
        assert _relerr(x2, host) < RTOL[dtype], layout
        # 2. layouts: the documented spec, even shards, the exact input layout back
        assert y.sharding.is_equivalent_to(NamedSharding(mesh, lay.spec), 3), y.sharding
        assert {s.data.shape for s in y.addressable_shards} == {y.sharding.shard_shape(y.shape)}
        assert _same_layout(x2, x), (x2.sharding, x.sharding)
        # 3. collectives: a2a exchanges of the whole shard each, nothing else (a slab's natural
        # forward transform exchanges the shard in two halves)
        halves = a2a == 1 and _halves(mesh, spec, layout)
        for counts, text, want_a2a in (
            (counts_f, text_f, a2a * (1 + halves)),
            (counts_i, text_i, a2a),
        ):
            assert counts["all-to-all"] == want_a2a, (layout, counts)
            assert sum(counts.values()) == want_a2a, (layout, counts)
            assert _a2a_bytes(text) == a2a * local, (layout, _a2a_bytes(text) / local)
        # 4. memory: temporaries <= 3 L (natural: 2 L), no buffer as large as the global array
        for temp, text in ((temp_f, text_f), (temp_i, text_i)):
            assert temp <= 3 * local, (layout, temp / local)
            assert max(_hlo_sizes(text)) < np.prod(shape)
        if layout == "natural":
            assert temp_f <= (1.5 if halves else 2) * local + 1024, temp_f / local


def _hlo_sizes(text):
    """Element counts of every array shape in compiled HLO text."""
    sizes = []
    for dims in re.findall(r"\b(?:c64|c128|f32|f64)\[([\d,]*)\]", text):
        sizes.append(int(np.prod([int(d) for d in dims.split(",") if d] or [1])))
    return sizes


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_pfft3d_matches_numpy_complex64(mesh_name, axis_type):
    mesh, spec, a2a = _mesh(mesh_name, axis_type)
    _check_complex(mesh, spec, SHAPE, np.complex64, a2a)


@pytest.mark.parametrize("mesh_name", ["8", "1x8", "2x4", "4x2", "8x1"])
def test_pfft3d_matches_numpy_complex128(mesh_name, axis_type):
    with jax.enable_x64(True):
        mesh, spec, a2a = _mesh(mesh_name, axis_type)
        _check_complex(mesh, spec, (16, 8, 24), np.complex128, a2a)


def test_pfft3d_natural_layout_is_numpy_order_with_sharding_moved():
    mesh, spec, _ = _mesh("2x4", AxisType.Explicit)
    x = _put(_data((16, 16, 16), np.complex64), mesh, spec)
    y = skfft.pfft3d(x)
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "x", "y")), 3)
    assert {s.data.shape for s in y.addressable_shards} == {(16, 8, 4)}
    yt = skfft.pfft3d(x, layout="transposed")
    assert yt.sharding.is_equivalent_to(x.sharding, 3)
    assert skfft.spectral_layout(x, layout="transposed").axes == (1, 2, 0)
    # the two layouts may compute the FFT over X differently (matmuls or FFT): equal to float32
    # rounding of the spectrum's scale
    y = np.asarray(y)
    np.testing.assert_allclose(np.asarray(yt), np.moveaxis(y, 0, -1), atol=1e-6 * abs(y).max())


@pytest.mark.parametrize(
    "mesh_name, x_size, ffts",
    [
        ("8", 1024, (1, 1)),
        ("8", 2048, (2, 2)),
        ("2x4", 64, (1, 3)),
        ("2x4", 1024, (1, 3)),
        ("2x4", 2048, (2, 3)),
        ("2x4", 20, (3, 3)),
    ],
)
def test_natural_layout_does_the_fft_over_x_by_matmuls_up_to_128_point_chunks(
    mesh_name, x_size, ffts
):
    # The all-to-all that gathers X (a slab's, or a pencil's over both mesh axes) leaves it in
    # chunks of x_size / 8 points: up to 128 the FFT over X is two matmuls where the chunks lie
    # (the program's only FFT op is the one over Y and Z), above it an FFT over a transposed
    # copy. A pencil's inverse, and a pencil whose X does not divide by 8 (20), take the per-axis
    # route: three 1-D FFTs. Forward and inverse program, `ffts` FFT ops each.
    # Both directions and layouts must equal numpy either way.
    mesh, spec, _ = _mesh(mesh_name, AxisType.Explicit)
    host = _data((x_size, 8, 8), np.complex64)
    x = _put(host, mesh, spec)
    want = np.fft.fftn(host.astype(np.complex128), norm="ortho")
    for layout in ("natural", "transposed"):
        y = skfft.pfft3d(x, norm="ortho", layout=layout)
        assert _relerr(y, want if layout == "natural" else np.moveaxis(want, 0, -1)) < 1e-5
        x2 = skfft.pifft3d(y, norm="ortho", layout=layout)
        assert _same_layout(x2, x) and _relerr(x2, host) < 1e-5
    y = skfft.pfft3d(x)
    cases = [(skfft.pfft3d, x, ffts[0]), (skfft.pifft3d, y, ffts[1])]
    if mesh_name == "2x4":  # a pencil's transposed layout takes the matmuls too
        cases.append((functools.partial(skfft.pfft3d, layout="transposed"), x, ffts[0]))
    for fn, arg, want_ffts in cases:
        text = jax.jit(fn).lower(arg).compile().as_text()
        ops = [ln for ln in text.splitlines() if re.search(r"= c64\[[\d,]+\]\S* fft\(", ln)]
        assert len(ops) == want_ffts, ops


@pytest.mark.parametrize("mesh_name", ["8", "2x4"])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 128])
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_matmul_fft_over_x_equals_numpy_for_odd_even_and_large_chunks_with_a_batch(
    mesh_name, m, dtype
):
    # chunks of m points after the all-to-all (X = 8m), odd and even m (the forward's real
    # matmul pairs rows k and m - k), a leading batch dim, both norms that scale
    mesh, spec, _ = _mesh(mesh_name, AxisType.Explicit)
    host = _data((2, 8 * m, 8, 8), dtype)
    with jax.enable_x64(dtype == np.complex128):
        x = _put(host, mesh, P(None, *spec))
        for norm in ("ortho", "forward"):
            want = np.fft.fftn(host.astype(np.complex128), axes=(1, 2, 3), norm=norm)
            y = skfft.pfft3d(x, norm=norm)
            assert y.dtype == dtype and _relerr(y, want) < RTOL[dtype]
            assert _relerr(skfft.pifft3d(y, norm=norm), host) < RTOL[dtype]


def test_jnp_fftn_gathers_where_pfft3d_does_not():
    mesh, spec, _ = _mesh("2x4", AxisType.Auto)
    x = _put(_data((16, 16, 16), np.complex64), mesh, spec)
    ours = collective_counts(
        jax.jit(lambda a: skfft.pfft3d(a, spec=spec)).lower(x).compile().as_text()
    )
    theirs = collective_counts(jax.jit(jnp.fft.fftn).lower(x).compile().as_text())
    assert ours["all-gather"] == 0 and ours["all-to-all"] == 2
    assert theirs["all-gather"] >= 1  # the gap shardkit.fft fills (jax issues 13081, 15680)


def test_second_call_does_not_recompile():
    mesh, spec, _ = _mesh("2x4", AxisType.Explicit)
    x = _put(_data(SHAPE, np.complex64), mesh, spec)
    skfft.pfft3d(x)
    before = skfft._complex._c2c._cache_size()
    y = skfft.pfft3d(_put(_data(SHAPE, np.complex64, seed=1), mesh, spec))
    skfft.pifft3d(y)
    skfft.pifft3d(skfft.pfft3d(x))
    assert skfft._complex._c2c._cache_size() == before + 1  # the inverse, once


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
def test_norm_matches_numpy(norm):
    mesh, spec, _ = _mesh("2x4", AxisType.Explicit)
    host = _data((16, 16, 16), np.complex64)
    x = _put(host, mesh, spec)
    y = skfft.pfft3d(x, norm=norm)
    assert _relerr(y, np.fft.fftn(host.astype(np.complex128), norm=norm)) < 1e-5
    assert _relerr(skfft.pifft3d(y, norm=norm), host) < 1e-5
    r = skfft.prfft3d(_put(host.real.copy(), mesh, spec), norm=norm)
    assert _relerr(r, np.fft.rfftn(host.real.astype(np.float64), norm=norm)) < 1e-5
    assert _relerr(skfft.pirfft3d(r, n=16, norm=norm), host.real) < 1e-5


REAL_CASES = [
    ("2x4", (32, 16, 24)),
    ("4x2", (16, 16, 15)),
    ("8", (16, 16, 16)),
    ("8-y", (16, 16, 9)),
    ("1x8", (16, 32, 8)),
    ("8x1", (16, 16, 16)),
]


@pytest.mark.parametrize("mesh_name,shape", REAL_CASES)
def test_prfft3d_matches_numpy(mesh_name, shape, axis_type):
    mesh, spec, _ = _mesh(mesh_name, axis_type)
    host = _data(shape, np.float32)
    x = _put(host, mesh, spec)
    want = np.fft.rfftn(host.astype(np.float64))
    a2a = 2 if mesh_name in ("2x4", "4x2") else 1
    # The transposed layout differs only by a local transpose: check it on two cases.
    layouts = ("natural", "transposed") if mesh_name in ("2x4", "8-y") else ("natural",)
    for layout in layouts:
        lay = skfft.spectral_layout(x, layout=layout, real=True)
        fwd = functools.partial(skfft.prfft3d, layout=layout)
        inv = functools.partial(skfft.pirfft3d, layout=layout, n=shape[-1])
        compiled_f, counts_f, _, _ = _compiled(fwd, x, spec)
        y = compiled_f(x)
        compiled_i, counts_i, _, _ = _compiled(inv, y, lay.spec)
        x2 = compiled_i(y)
        expect = want if layout == "natural" else np.moveaxis(want, 0, -1)
        assert y.dtype == np.complex64 and y.shape == expect.shape == lay.shape
        assert _relerr(y, expect) < 1e-5
        assert y.sharding.is_equivalent_to(NamedSharding(mesh, lay.spec), 3)
        assert x2.dtype == np.float32 and _same_layout(x2, x)
        assert _relerr(x2, host) < 1e-5
        for counts in (counts_f, counts_i):
            assert counts["all-to-all"] == a2a and sum(counts.values()) == a2a, counts


def test_prfft3d_eager_call_and_layout():
    mesh, spec, _ = _mesh("2x4", AxisType.Explicit)
    host = _data((16, 16, 15), np.float32)
    x = _put(host, mesh, spec)
    y = skfft.prfft3d(x)  # outside jit the spec is read from x
    assert y.shape == (16, 16, 8)
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, P(None, ("x", "y"))), 3)
    assert _relerr(y, np.fft.rfftn(host.astype(np.float64))) < 1e-5
    assert _same_layout(skfft.pirfft3d(y, n=15), x)


def test_prfft3d_complex128():
    with jax.enable_x64(True):
        mesh, spec, _ = _mesh("2x4", AxisType.Explicit)
        host = _data((16, 16, 15), np.float64)
        y = skfft.prfft3d(_put(host, mesh, spec))
        assert y.dtype == np.complex128
        assert _relerr(y, np.fft.rfftn(host)) < 1e-12
        x2 = skfft.pirfft3d(y, n=15)
        assert x2.dtype == np.float64 and _relerr(x2, host) < 1e-12


def test_batched_4d_input(axis_type):
    mesh = jax.make_mesh((2, 2, 2), ("b", "x", "y"), axis_types=(axis_type,) * 3)
    host = _data((2, 16, 8, 8), np.complex64)
    x = _put(host, mesh, P("b", "x", "y"))
    y = skfft.pfft3d(x)
    assert _relerr(y, np.fft.fftn(host.astype(np.complex128), axes=(1, 2, 3))) < 1e-5
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, P("b", None, "x", "y")), 4)
    assert _same_layout(skfft.pifft3d(y), x)
    # the transposed layout takes the FFT over X by matmuls with the batch among the columns
    yt = skfft.pfft3d(x, layout="transposed")
    want = np.moveaxis(np.fft.fftn(host.astype(np.complex128), axes=(1, 2, 3)), 1, -1)
    assert _relerr(yt, want) < 1e-5 and _same_layout(yt, x)
    assert _relerr(skfft.pifft3d(yt, layout="transposed"), host) < 1e-5
    r = skfft.prfft3d(_put(host.real.copy(), mesh, P("b", "x", "y")))
    assert _relerr(r, np.fft.rfftn(host.real.astype(np.float64), axes=(1, 2, 3))) < 1e-5


def test_pfft2d_and_batched(axis_type):
    mesh = jax.make_mesh((2, 4), ("data", "x"), axis_types=(axis_type,) * 2)
    host = _data((4, 16, 8), np.complex64)
    x = _put(host, mesh, P("data", "x"))
    want = np.fft.fft2(host.astype(np.complex128))
    for layout in ("natural", "transposed"):
        y = skfft.pfft2d(x, layout=layout)
        expect = want if layout == "natural" else np.moveaxis(want, 1, -1)
        assert _relerr(y, expect) < 1e-5
        x2 = skfft.pifft2d(y, layout=layout)
        assert _same_layout(x2, x) and _relerr(x2, host) < 1e-5
    text = jax.jit(lambda a: skfft.pfft2d(a, spec=P("data", "x"))).lower(x).compile().as_text()
    counts = collective_counts(text)  # one exchange of the shard, in two halves (a slab)
    assert counts["all-to-all"] == 2 and sum(counts.values()) == 2
    assert _a2a_bytes(text) == x.nbytes // mesh.size


@pytest.mark.parametrize(
    "mesh_shape,shape,spec,fft",
    [
        ((8, 1), (16, 8), P("x", "y"), (skfft.pfft2d, skfft.pifft2d)),
        ((2, 4, 1), (8, 8, 8), P("x", "y", "z"), (skfft.pfft3d, skfft.pifft3d)),
    ],
    ids=["2d", "3d"],
)
def test_a_last_dim_sharded_over_a_size_1_axis_is_whole(axis_type, mesh_shape, shape, spec, fft):
    # a mesh axis of size 1 leaves its dim whole: the transform runs, and its inverse takes
    # the spectrum back, in both layouts
    names = ("x", "y", "z")[: len(mesh_shape)]
    mesh = jax.make_mesh(mesh_shape, names, axis_types=(axis_type,) * len(mesh_shape))
    host = _data(shape, np.complex64)
    x = _put(host, mesh, spec)
    forward, inverse = fft
    want = np.fft.fftn(host.astype(np.complex128))
    for layout in ("natural", "transposed"):
        y = forward(x, layout=layout)
        assert _relerr(y, want if layout == "natural" else np.moveaxis(want, 0, -1)) < 1e-5
        x2 = inverse(y, layout=layout)
        assert _same_layout(x2, x) and _relerr(x2, host) < 1e-5


def test_real_transforms_and_transposes_with_a_last_dim_on_a_size_1_axis(axis_type):
    mesh = jax.make_mesh((2, 4, 1), ("x", "y", "z"), axis_types=(axis_type,) * 3)
    host = _data((8, 8, 6), np.float32)
    x = _put(host, mesh, P("x", "y", "z"))
    want = np.fft.rfftn(host.astype(np.float64))
    for layout in ("natural", "transposed"):
        y = skfft.prfft3d(x, layout=layout)
        assert _relerr(y, want if layout == "natural" else np.moveaxis(want, 0, -1)) < 1e-5
        x2 = skfft.pirfft3d(y, layout=layout)
        assert _same_layout(x2, x) and _relerr(x2, host) < 1e-5
    cube = _data((8, 8, 8), np.float32)  # the transposes split Z over 'y'
    c = _put(cube, mesh, P("x", "y", "z"))
    g = skfft.transpose_zy(c)
    np.testing.assert_array_equal(np.asarray(g), np.transpose(cube, (2, 0, 1)))
    assert _same_layout(skfft.transpose_yz(g), c)


def test_batched_fftn_has_zero_collectives(axis_type):
    mesh = jax.make_mesh((8,), ("data",), axis_types=(axis_type,))
    host = _data((8, 16, 12), np.complex64)
    x = _put(host, mesh, P("data"))
    y = skfft.batched_fftn(x, axes=(1, 2))
    assert _relerr(y, np.fft.fftn(host.astype(np.complex128), axes=(1, 2))) < 1e-5
    assert _same_layout(y, x)
    assert _relerr(skfft.batched_ifftn(y, axes=(-2, -1)), host) < 1e-5
    fn = jax.jit(lambda a: skfft.batched_fftn(a, axes=(1, 2), spec=P("data")))
    assert sum(collective_counts(fn.lower(x).compile().as_text()).values()) == 0


@pytest.mark.parametrize("layout", ["natural", "transposed"])
def test_fftfreq3d_matches_layout(layout):
    mesh, spec, _ = _mesh("2x4", AxisType.Explicit)
    shape = (16, 8, 12)
    x = _put(_data(shape, np.float32), mesh, spec)
    for real in (False, True):
        y = skfft.prfft3d(x, layout=layout) if real else skfft.pfft3d(x, layout=layout)
        kx, ky, kz = skfft.fftfreq3d(y, layout=layout, real=real, n=12, d=(1.0, 0.5, 2.0))
        want = [np.fft.fftfreq(16, 1.0), np.fft.fftfreq(8, 0.5)]
        want.append(np.fft.rfftfreq(12, 2.0) if real else np.fft.fftfreq(12, 2.0))
        axes = (0, 1, 2) if layout == "natural" else (1, 2, 0)
        for orig, k in enumerate((kx, ky, kz)):
            pos = axes.index(orig)
            assert k.shape[pos] == y.shape[pos] and k.size == y.shape[pos]
            np.testing.assert_allclose(np.asarray(k).ravel(), want[orig], rtol=1e-6)
            assert k.sharding.spec[pos] == y.sharding.spec[pos]
        k2 = kx**2 + ky**2 + kz**2
        assert k2.shape == y.shape and k2.sharding.is_equivalent_to(y.sharding, 3)


def test_spectral_poisson_solve_recovers_potential():
    mesh, spec, _ = _mesh("2x4", AxisType.Explicit)
    n = 16
    g = np.arange(n) * 2 * np.pi / n
    X, Y, Z = np.meshgrid(g, g, g, indexing="ij")
    phi = np.sin(X) * np.cos(2 * Y) + np.cos(3 * Z)
    rho = -(np.sin(X) * np.cos(2 * Y) * 5 + 9 * np.cos(3 * Z))  # laplacian of phi
    x = _put(rho.astype(np.float32), mesh, spec)
    rk = skfft.prfft3d(x)
    kx, ky, kz = skfft.fftfreq3d(rk, real=True, n=n, d=1.0 / n)
    k2 = kx**2 + ky**2 + kz**2
    phik = jnp.where(k2 == 0, 0, -rk / jnp.where(k2 == 0, 1, k2))
    out = skfft.pirfft3d(phik, n=n)
    assert _same_layout(out, x)
    np.testing.assert_allclose(np.asarray(out), phi, atol=1e-5)


@pytest.mark.parametrize("mesh_name", ["2x4", "8"])  # a pencil; a slab (FFT over X by matmuls)
def test_gradient_matches_jnp_and_keeps_sharding(mesh_name, axis_type):
    mesh, spec, _ = _mesh(mesh_name, axis_type)
    host = _data((16, 8, 8), np.float32)
    w = _data((16, 8, 8), np.float32, seed=1)
    x = _put(host, mesh, spec)

    def loss(a):
        return jnp.sum(jnp.abs(skfft.pfft3d(a, spec=spec)) ** 2 * w.reshape(a.shape))

    with jax.set_mesh(mesh):
        g = jax.jit(jax.grad(loss))(x)
    want = jax.grad(lambda a: jnp.sum(jnp.abs(jnp.fft.fftn(a)) ** 2 * w))(jnp.asarray(host))
    assert _relerr(g, np.asarray(want)) < 1e-5
    assert _same_layout(g, x)

    def real_loss(a):
        return jnp.sum(jnp.abs(skfft.prfft3d(a, spec=spec)) ** 2 * w[..., :5].reshape(16, 8, 5))

    with jax.set_mesh(mesh):
        gr = jax.jit(jax.grad(real_loss))(x)
    want_r = jax.grad(lambda a: jnp.sum(jnp.abs(jnp.fft.rfftn(a)) ** 2 * w[..., :5]))(
        jnp.asarray(host)
    )
    assert _relerr(gr, np.asarray(want_r)) < 1e-5
    assert _same_layout(gr, x)


def test_auto_mesh_inside_jit_takes_spec():
    mesh, spec, _ = _mesh("2x4", AxisType.Auto)
    x = _put(_data((16, 16, 16), np.complex64), mesh, spec)
    y = jax.jit(lambda a: skfft.pfft3d(a, spec=spec))(x)  # without spec=: test_fft_partitioned
    assert _relerr(y, np.fft.fftn(np.asarray(x).astype(np.complex128))) < 1e-5
    assert y.sharding.spec == P(None, "x", "y")


# ---- errors: each names the argument, the sizes and a fix ----


def _x(mesh_name="2x4", shape=(16, 16, 16), dtype=np.complex64, spec=None):
    mesh, default_spec, _ = _mesh(mesh_name, AxisType.Explicit)
    return _put(_data(shape, dtype), mesh, default_spec if spec is None else spec)


@pytest.mark.parametrize("fn", ["pfft3d", "prfft3d", "spectral_layout"])
def test_error_spec_naming_an_axis_the_mesh_lacks(fn):
    # inside jit on Auto axes the spec is taken as given: a name the mesh lacks was a KeyError
    mesh, spec, _ = _mesh("2x4", AxisType.Auto)
    x = _put(_data((16, 16, 16), np.float32 if fn == "prfft3d" else np.complex64), mesh, spec)
    call = lambda a: getattr(skfft, fn)(a, spec=P("x", "z"), mesh=mesh)
    with pytest.raises(ValueError, match=r"mesh axis 'z', which the mesh has not.*'x' \(size 2\), "
                                         r"'y' \(size 4\).*fix"):  # fmt: skip
        jax.jit(call)(x)


def test_error_rank():
    with pytest.raises(ValueError, match=r"rank 2 .*needs at least 3 dims.*fix"):
        skfft.pfft3d(_x("8", (16, 16), spec=P("x")))


def test_error_unsharded_input():
    with pytest.raises(ValueError, match=r"unsharded array.*fix: x = jax.device_put"):
        skfft.pfft3d(jnp.ones((16, 16, 16), jnp.complex64))
    mesh, _, _ = _mesh("2x4", AxisType.Explicit)
    with pytest.raises(ValueError, match=r"x \(shape \(16, 16, 16\), spec P\(None, None, None\)\) "
                                         r"is not sharded over mesh.*fix"):  # fmt: skip
        skfft.pfft3d(_put(np.ones((16, 16, 16), np.complex64), mesh, P()))


def test_error_a_half_spectrum_given_to_the_complex_inverse_points_to_pirfft3d():
    y = skfft.prfft3d(_x(dtype=np.float32))  # a pencil's half spectrum: P(None, ('x', 'y'))
    with pytest.raises(ValueError, match=r"pifft3d: y's dim 1 is sharded over several mesh axes "
                                         r"\('x', 'y'\).*fix: invert a half spectrum with "
                                         r"pirfft3d"):  # fmt: skip
        skfft.pifft3d(y)


@pytest.mark.parametrize("real", [False, True])
def test_spectral_layout_refuses_what_the_transform_refuses(real):
    mesh, _, _ = _mesh("2x4", AxisType.Explicit)
    sharding = NamedSharding(mesh, P("x", "y"))
    shape, fn = ((16, 12, 6), skfft.prfft3d) if real else ((16, 16, 6), skfft.pfft3d)
    x = jax.ShapeDtypeStruct(shape, np.float32, sharding=sharding)
    match = r"dim \d of x has size \d+ .*does not divide into \d shards"
    with pytest.raises(ValueError, match=match):
        fn(_put(np.ones(shape, np.float32), mesh, P("x", "y")))
    with pytest.raises(ValueError, match=match):
        skfft.spectral_layout(x, real=real)


def test_error_three_axis_mesh():
    mesh = jax.make_mesh((2, 2, 2), ("x", "y", "z"), axis_types=(AxisType.Explicit,) * 3)
    x = _put(np.ones((16, 16, 16), np.complex64), mesh, P("x", "y"))
    with pytest.raises(ValueError, match=r"axes \['z'\] that shard no dim.*fix"):
        skfft.pfft3d(x)


def test_error_last_dim_sharded():
    with pytest.raises(ValueError, match=r"last FFT dim \(dim 2\) is sharded over mesh axis 'y'"):
        skfft.pfft3d(_x(spec=P(None, "x", "y")))


def test_error_indivisible_size_names_dim_and_sizes():
    # Z = 12 splits over 'y' (size 4) fine but Y = 18 cannot split over 'x' ... use Z = 10.
    with pytest.raises(ValueError, match=r"dim 2 of x has size 10.*'y' \(size 4\).*8 or 12"):
        skfft.pfft3d(_x(shape=(16, 16, 10)))
    with pytest.raises(ValueError, match=r"dim 1 of x has size 12.*8 shards.*8 or 16"):
        skfft.prfft3d(_x(shape=(16, 12, 16), dtype=np.float32))


def test_error_dtypes():
    with pytest.raises(TypeError, match=r"expects a complex spectrum.*pirfft3d"):
        skfft.pifft3d(_x(dtype=np.float32))
    with pytest.raises(TypeError, match=r"needs a real floating input.*pfft3d"):
        skfft.prfft3d(_x())
    with pytest.raises(TypeError, match=r"expects a complex spectrum"):
        skfft.pirfft3d(_x(dtype=np.float32))
    with pytest.raises(TypeError, match=r"dtype int32.*astype"):
        skfft.pfft3d(_x(dtype=np.int32))


def test_error_options_and_layout_mismatch():
    x = _x()
    with pytest.raises(ValueError, match=r"norm='fwd' is not supported.*'ortho'"):
        skfft.pfft3d(x, norm="fwd")
    with pytest.raises(ValueError, match=r"layout='pencil' is not supported"):
        skfft.pfft3d(x, layout="pencil")
    with pytest.raises(ValueError, match=r"layout='natural'.*must be whole.*layout='transposed'"):
        skfft.pifft3d(x)
    with pytest.raises(ValueError, match=r"n=20 does not match the half spectrum"):
        skfft.pirfft3d(skfft.prfft3d(_x(dtype=np.float32)), n=20)
    with pytest.raises(ValueError, match=r"not a layout prfft3d produces"):
        skfft.pirfft3d(skfft.pfft3d(x))
    with pytest.raises(ValueError, match=r"x is sharded .* but spec=.*never reshards"):
        skfft.pfft3d(x, spec=P("y", "x"))
    with pytest.raises(ValueError, match=r"several mesh axes .*at most one mesh axis"):
        skfft.pfft3d(_x(spec=P(("x", "y"))))


def test_error_batched_fftn_on_sharded_dim():
    with pytest.raises(ValueError, match=r"dim 0 \(size 16\) is sharded.*use pfft2d/pfft3d"):
        skfft.batched_fftn(_x(), axes=(0, 2))
    with pytest.raises(ValueError, match=r"names dim 3, but x has rank 3"):
        skfft.batched_fftn(_x(), axes=(3,))


def test_fftfreq3d_complex128_grids_are_float64():
    with jax.enable_x64(True):
        mesh, spec, _ = _mesh("8", AxisType.Explicit)
        y = skfft.pfft3d(_x("8", (16, 8, 8), dtype=np.complex128, spec=spec))
        kx, ky, kz = skfft.fftfreq3d(y, d=0.1)
        assert kx.dtype == ky.dtype == kz.dtype == np.float64
        np.testing.assert_array_equal(np.asarray(ky).ravel(), np.fft.fftfreq(8, 0.1))
