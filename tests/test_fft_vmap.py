"""jax.vmap of shardkit.fft transforms over a batch-sharded array: one program, the 4-D one."""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.fft as skfft
from shardkit.inspection.hlo import collective_counts

TOL = 1e-5  # relative L2 error vs numpy in float64, complex64 data
SHAPE = (4, 16, 8, 12)  # (batch, X, Y, Z)


def _mesh(axis_type):
    return jax.make_mesh((2, 2, 2), ("b", "x", "y"), axis_types=(axis_type,) * 3)


def _data(shape, complex_=True, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    return (
        (x + 1j * rng.standard_normal(shape)).astype(np.complex64)
        if complex_
        else x.astype(np.float32)
    )


def _relerr(got, want):
    got = np.asarray(got).astype(np.complex128)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _per_element(fn, host):
    return np.stack(
        [fn(h.astype(np.complex128 if np.iscomplexobj(h) else np.float64)) for h in host]
    )


@pytest.mark.parametrize("layout", ["natural", "transposed"])
def test_vmap_pfft3d_over_batch_sharded_array(axis_type, layout):
    mesh = _mesh(axis_type)
    host = _data(SHAPE)
    xs = jax.device_put(host, NamedSharding(mesh, P("b", "x", "y")))
    fwd = jax.vmap(lambda a: skfft.pfft3d(a, layout=layout))
    ys = fwd(xs)
    want = _per_element(np.fft.fftn, host)
    if layout == "transposed":
        want = np.moveaxis(want, 1, -1)
    assert ys.shape == want.shape and _relerr(ys, want) < TOL
    # the same layout as the 4-D transform: the mapped dim keeps its mesh axis 'b'
    direct = skfft.pfft3d(xs, layout=layout)
    assert ys.sharding.is_equivalent_to(direct.sharding, 4), ys.sharding
    assert ys.sharding.spec[0] == "b"
    back = jax.vmap(lambda a: skfft.pifft3d(a, layout=layout))(ys)
    assert _relerr(back, host) < TOL
    assert back.sharding.is_equivalent_to(xs.sharding, 4)


def test_vmap_pfft3d_with_spec_and_inside_jit(axis_type):
    mesh = _mesh(axis_type)
    host = _data(SHAPE, seed=1)
    xs = jax.device_put(host, NamedSharding(mesh, P("b", "x", "y")))
    # spec= of one batch element, the mapped dim's mesh axis read from the batch
    ys = jax.vmap(lambda a: skfft.pfft3d(a, spec=P("x", "y")))(xs)
    assert _relerr(ys, _per_element(np.fft.fftn, host)) < TOL
    # inside jit: Explicit axes read the batch's sharding; Auto axes take it from spmd_axis_name
    vm = jax.vmap(lambda a: skfft.pfft3d(a, spec=P("x", "y")), spmd_axis_name="b")
    fn = jax.jit(vm)
    compiled = fn.lower(xs).compile()
    counts = collective_counts(compiled.as_text())
    assert counts["all-to-all"] == 2 and sum(counts.values()) == 2, counts
    ys2 = compiled(xs)
    assert _relerr(ys2, _per_element(np.fft.fftn, host)) < TOL
    assert ys2.sharding.is_equivalent_to(NamedSharding(mesh, P("b", None, "x", "y")), 4)
    fn(xs)
    assert fn._cache_size() == 1  # a second call does not recompile


def test_vmap_prfft3d_and_back(axis_type):
    mesh = _mesh(axis_type)
    host = _data(SHAPE, complex_=False, seed=2)
    xs = jax.device_put(host, NamedSharding(mesh, P("b", "x", "y")))
    ks = jax.vmap(skfft.prfft3d)(xs)
    assert _relerr(ks, _per_element(np.fft.rfftn, host)) < TOL
    assert ks.sharding.is_equivalent_to(skfft.prfft3d(xs).sharding, 4)
    back = jax.vmap(lambda a: skfft.pirfft3d(a, n=12))(ks)
    assert back.dtype == np.float32
    np.testing.assert_allclose(np.asarray(back), host, atol=1e-5)
    assert back.sharding.is_equivalent_to(xs.sharding, 4)


def test_vmap_over_a_middle_dim_and_nested_vmap():
    mesh = _mesh(AxisType.Explicit)
    host = _data((2, 2, 16, 8, 12), seed=3)
    xs = jax.device_put(host, NamedSharding(mesh, P(None, "b", "x", "y")))
    ys = jax.vmap(skfft.pfft3d, in_axes=1)(xs)  # mapped dim 1 -> output dim 0
    want = np.fft.fftn(host.astype(np.complex128), axes=(2, 3, 4))
    assert _relerr(ys, np.moveaxis(want, 1, 0)) < TOL
    yy = jax.vmap(jax.vmap(skfft.pfft3d))(xs)
    assert _relerr(yy, want) < TOL
    assert yy.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "b", None, "x", "y")), 5)


def test_vmap_of_an_unsharded_batch_dim_on_a_pencil_mesh():
    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    host = _data((3, 8, 8, 8), seed=4)
    xs = jax.device_put(host, NamedSharding(mesh, P(None, "x", "y")))
    ys = jax.vmap(skfft.pfft3d)(xs)
    assert _relerr(ys, _per_element(np.fft.fftn, host)) < TOL
    assert ys.sharding.is_equivalent_to(NamedSharding(mesh, P(None, None, "x", "y")), 4)


def test_vmap_on_auto_axes_inside_jit_without_spec():
    # the complex transforms leave the layout to XLA's partitioner (test_fft_partitioned); a
    # real transform cannot, and names the fix
    mesh = _mesh(AxisType.Auto)
    host = _data(SHAPE)
    xs = jax.device_put(host, NamedSharding(mesh, P("b", "x", "y")))
    ys = jax.jit(jax.vmap(skfft.pfft3d))(xs)
    assert _relerr(ys, np.fft.fftn(host, axes=(1, 2, 3))) < 1e-5
    assert ys.sharding.is_equivalent_to(NamedSharding(mesh, P("b", None, "x", "y")), 4)
    with pytest.raises(ValueError, match=r"prfft3d: x \(shape \(4, 16, 8, 12\)\).*spec="):
        jax.jit(jax.vmap(skfft.prfft3d))(xs.real)


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
def test_vmap_batched_fftn_keeps_the_batch_sharding(axis_type):
    # the mapped dim is one more leading dim of the batch transform (it raised on both kinds)
    mesh = _mesh(axis_type)
    host = _data(SHAPE, complex_=False)
    xs = jax.device_put(host, NamedSharding(mesh, P("b", ("x", "y"))))
    fn = jax.vmap(lambda a: skfft.batched_fftn(a, axes=(1, 2), norm="ortho"))
    with jax.set_mesh(mesh):
        ys = jax.jit(fn)(xs)
        back = jax.vmap(lambda b: skfft.batched_ifftn(b, axes=(-2, -1), norm="ortho"))(ys)
    assert _relerr(ys, np.fft.fftn(host.astype(np.float64), axes=(2, 3), norm="ortho")) < TOL
    assert ys.sharding.is_equivalent_to(xs.sharding, 4)
    assert _relerr(back, host) < TOL
    assert back.sharding.is_equivalent_to(xs.sharding, 4)
