"""Pencil transposes: equal jnp.transpose, the documented specs, one all-to-all, no gather."""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.fft as skfft
from shardkit.inspection.hlo import collective_counts

SHAPE = (16, 8, 24)  # (X, Y, Z), every dim divides by 8
ROLL_RIGHT, ROLL_LEFT = (2, 0, 1), (1, 2, 0)
MESHES = {"2x4": (2, 4), "4x2": (4, 2), "1x8": (1, 8), "8x1": (8, 1)}


def _field(mesh_name, axis_type, shape=SHAPE, dtype=np.float32):
    mesh = jax.make_mesh(MESHES[mesh_name], ("a", "b"), axis_types=(axis_type,) * 2)
    host = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    return mesh, host, jax.device_put(host, NamedSharding(mesh, P("a", "b")))


def _spec(a):
    return tuple(a.sharding.spec) + (None,) * (a.ndim - len(a.sharding.spec))


def _audit(fn, a, spec):
    compiled = jax.jit(lambda v: fn(v, spec=spec)).lower(a).compile()
    return compiled, collective_counts(compiled.as_text())


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_pencil_chain_equals_jnp_transpose(mesh_name, axis_type):
    mesh, host, f = _field(mesh_name, axis_type)
    sizes = dict(mesh.shape)
    g = skfft.transpose_zy(f)  # Y-pencil g[Z_b, X_a, Y]
    np.testing.assert_array_equal(np.asarray(g), np.transpose(host, ROLL_RIGHT))  # exact: a copy
    assert g.sharding.is_equivalent_to(NamedSharding(mesh, P("b", "a")), 3), g.sharding
    assert {s.data.shape for s in g.addressable_shards} == {(24 // sizes["b"], 16 // sizes["a"], 8)}
    h = skfft.transpose_yx(g)  # X-pencil h[Y_a, Z_b, X]
    np.testing.assert_array_equal(np.asarray(h), np.transpose(host, ROLL_LEFT))
    assert h.sharding.is_equivalent_to(NamedSharding(mesh, P("a", "b")), 3), h.sharding
    g2 = skfft.transpose_xy(h)
    np.testing.assert_array_equal(np.asarray(g2), np.asarray(g))
    assert g2.sharding.is_equivalent_to(g.sharding, 3)
    f2 = skfft.transpose_yz(g2)
    np.testing.assert_array_equal(np.asarray(f2), host)
    assert f2.sharding.is_equivalent_to(f.sharding, 3)
    # each step: one all-to-all over the mesh axis it moves (none on a size-1 axis), no gather
    for fn, arg, axis in (
        (skfft.transpose_zy, f, "b"),
        (skfft.transpose_yx, g, "a"),
        (skfft.transpose_xy, h, "a"),
        (skfft.transpose_yz, g, "b"),
    ):
        compiled, counts = _audit(fn, arg, P(*_spec(arg)))
        want = 1 if sizes[axis] > 1 else 0
        assert counts["all-to-all"] == want and sum(counts.values()) == want, (fn, counts)


def test_transposes_are_the_steps_of_pfft3d():
    mesh, host, f = _field("2x4", AxisType.Explicit, dtype=np.complex64)
    # FFT along the last (whole) dim of each pencil, then move on: pfft3d's transposed layout
    g = skfft.transpose_zy(skfft.batched_fftn(f, axes=(2,)))
    h = skfft.transpose_yx(skfft.batched_fftn(g, axes=(2,)))
    y = skfft.batched_fftn(h, axes=(2,))
    want = skfft.pfft3d(f, layout="transposed")
    assert y.sharding.is_equivalent_to(want.sharding, 3)
    np.testing.assert_allclose(np.asarray(y), np.asarray(want), rtol=1e-5, atol=1e-4)
    ref = np.transpose(np.fft.fftn(host.astype(np.complex128)), ROLL_LEFT)
    assert np.linalg.norm(np.asarray(y) - ref) / np.linalg.norm(ref) < 1e-5


def test_batch_dims_vmap_and_jit(axis_type):
    mesh = jax.make_mesh((2, 2, 2), ("batch", "a", "b"), axis_types=(axis_type,) * 3)
    host = np.random.default_rng(1).standard_normal((4,) + SHAPE).astype(np.float32)
    xs = jax.device_put(host, NamedSharding(mesh, P("batch", "a", "b")))
    g = skfft.transpose_zy(xs)  # a leading batch dim keeps its sharding
    np.testing.assert_array_equal(np.asarray(g), np.transpose(host, (0, 3, 1, 2)))
    assert _spec(g) == ("batch", "b", "a", None)
    gv = jax.vmap(skfft.transpose_zy)(xs)
    np.testing.assert_array_equal(np.asarray(gv), np.asarray(g))
    assert gv.sharding.is_equivalent_to(g.sharding, 4)
    fn = jax.jit(lambda a: skfft.transpose_yz(a, spec=P("batch", "b", "a")))
    back = fn(g)
    np.testing.assert_array_equal(np.asarray(back), host)
    assert back.sharding.is_equivalent_to(xs.sharding, 4)
    fn(g)
    assert fn._cache_size() == 1


def test_error_last_dim_does_not_split():
    mesh, _, f = _field("2x4", AxisType.Explicit, shape=(16, 8, 6))
    with pytest.raises(ValueError, match=r"transpose_zy: dim 2 of x has size 6.*'b' \(size 4\)"
                                         r".*all-to-all splits.*fix.*4 or 8"):  # fmt: skip
        skfft.transpose_zy(f)


def test_error_last_dim_sharded_and_rank():
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
    x = jax.device_put(np.ones((16, 8, 8), np.float32), NamedSharding(mesh, P(None, "a", "b")))
    with pytest.raises(ValueError, match=r"transpose_yz: the last FFT dim \(dim 2\) is sharded"):
        skfft.transpose_yz(x)
    x2 = jax.device_put(np.ones((16, 8), np.float32), NamedSharding(mesh, P("a", "b")))
    with pytest.raises(ValueError, match=r"transpose_xy: x has rank 2.*fix"):
        skfft.transpose_xy(x2)
