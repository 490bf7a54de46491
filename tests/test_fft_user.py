"""shardkit.fft at its user boundary: inputs as users and peer test suites pass them.

numpy arrays and single-device arrays with `spec=` and `mesh=`, numpy's rules for `axes=`,
arguments of the wrong type, and errors that name the argument the user passed.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.fft as skfft

RTOL = 1e-5  # relative L2 error of a complex64 transform vs numpy in float64


def _relerr(got, want):
    got = np.asarray(got).astype(np.complex128)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _field(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _unplaced(x, where):
    """`x` as a host numpy array, or as a jax.Array committed to one device."""
    return x if where == "numpy" else jax.device_put(x, jax.devices()[3])


@pytest.mark.parametrize("where", ["numpy", "one-device"])
def test_an_unplaced_input_with_spec_and_mesh_is_placed_as_spec_says(where, axis_type):
    # Before: a raw JAX error (shard_map's in_specs mismatch on Explicit axes, jit's
    # "incompatible devices" for a committed array on Auto ones).
    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(axis_type,) * 2)
    spec = P("x", "y")
    want_spec = NamedSharding(mesh, spec)
    x = _field((16, 8, 8))
    y = skfft.pfft3d(_unplaced(x, where), spec=spec, mesh=mesh)
    assert _relerr(y, np.fft.fftn(x.astype(np.float64))) < RTOL
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "x", "y")), 3)
    yr = skfft.prfft3d(_unplaced(x, where), spec=spec, mesh=mesh)
    assert _relerr(yr, np.fft.rfftn(x.astype(np.float64))) < RTOL
    z = skfft.pifft3d(_unplaced(np.asarray(y), where), spec=P(None, "x", "y"), mesh=mesh)
    assert _relerr(z, x) < RTOL and z.sharding.is_equivalent_to(want_spec, 3)
    b = skfft.batched_fftn(_unplaced(x, where), axes=(2,), spec=spec, mesh=mesh)
    assert _relerr(b, np.fft.fft(x.astype(np.float64), axis=2)) < RTOL
    assert b.sharding.is_equivalent_to(want_spec, 3)
    t = skfft.transpose_zy(_unplaced(x, where), spec=spec, mesh=mesh)
    assert np.array_equal(np.asarray(t), np.transpose(x, (2, 0, 1)))
    g = skfft.halo_exchange(_unplaced(x, where), 1, spec=spec, mesh=mesh)
    want = np.asarray(skfft.halo_exchange(jax.device_put(x, want_spec), 1))
    assert np.array_equal(np.asarray(g), want) and g.sharding.is_equivalent_to(want_spec, 3)


def test_batched_fftn_refuses_repeated_axes_as_jnp_does():
    # Before: axes=(2, 2) was deduplicated and transformed once; numpy transforms twice,
    # jnp.fft.fftn refuses. Silently differing from numpy is worse than refusing.
    mesh = jax.make_mesh((8,), ("data",))
    x = jax.device_put(_field((8, 4, 4)), NamedSharding(mesh, P("data")))
    with pytest.raises(ValueError, match=r"batched_fftn: axes=\(2, 2\) names dim 2 twice.*fix"):
        skfft.batched_fftn(x, axes=(2, 2))
    with pytest.raises(ValueError, match=r"batched_ifftn: axes=\(1, -2\) names dim 1 twice"):
        skfft.batched_ifftn(x.astype(jnp.complex64), axes=(1, -2))
    with pytest.raises(TypeError, match=r"batched_fftn: axes=2 is not a sequence of ints.*fix"):
        skfft.batched_fftn(x, axes=2)


def _sharded(shape=(16, 8, 8), dtype=np.float32, spec=None):
    spec = P("x", "y") if spec is None else spec
    mesh = jax.make_mesh((2, 4), ("x", "y"))
    return jax.device_put(np.ones(shape, dtype), NamedSharding(mesh, spec)), mesh


WRONG_TYPES = [
    # (call, exception, match): before, each raised a bare AttributeError, TypeError or
    # IndexError from inside the library, or (spec="xy", periodic="no") ran as something else.
    (lambda x, m: skfft.pfft3d(x, spec="xy"), TypeError, r"pfft3d: spec='xy' is a str"),
    (lambda x, m: skfft.pfft3d(np.ones((4, 4, 4), "f4"), spec="xy", mesh=m), TypeError, "'xy'"),
    (lambda x, m: skfft.pfft3d(x, mesh="x"), TypeError, r"pfft3d: mesh='x' is a str, not"),
    (lambda x, m: skfft.halo_exchange(x, 1, mesh=4), TypeError, r"halo_exchange: mesh=4 is"),
    (lambda x, m: skfft.pfft3d([[[1.0]]]), TypeError, r"pfft3d: x is a list, not an array"),
    (lambda x, m: skfft.pifft3d(None), TypeError, r"pifft3d: y is a NoneType, not an array"),
    (lambda x, m: skfft.batched_fftn(3.0), TypeError, r"batched_fftn: x is a float, not an"),
    (lambda x, m: skfft.halo_exchange((1, 2), 1), TypeError, r"halo_exchange: x is a tuple"),
    (lambda x, m: skfft.pirfft3d(skfft.prfft3d(x), n="8"), TypeError, r"pirfft3d: n='8' is a"),
    (lambda x, m: skfft.pirfft3d(skfft.prfft3d(x), n=8.0), TypeError, r"pirfft3d: n=8.0 is a"),
    (
        lambda x, m: skfft.fftfreq3d(skfft.prfft3d(x), real=True, n=8.0),
        TypeError,
        r"fftfreq3d: n=8.0 is a float",
    ),
    (lambda x, m: skfft.halo_exchange(x, 1, periodic="no"), TypeError, r"periodic='no' is a"),
    (
        lambda x, m: skfft.fftfreq3d(skfft.pfft3d(x), d=(1.0, 2.0)),
        ValueError,
        r"fftfreq3d: d=\(1.0, 2.0\) has 2 values but the spectrum has 3 FFT dims",
    ),
]


@pytest.mark.parametrize("case", range(len(WRONG_TYPES)))
def test_an_argument_of_the_wrong_type_is_named_with_a_fix(case):
    call, exc, match = WRONG_TYPES[case]
    x, mesh = _sharded()
    with pytest.raises(exc, match=match + r".*fix"):
        call(x, mesh)


def test_errors_about_a_spectrum_name_y_as_the_signature_does():
    # Before: "pifft3d: x has dtype float32", though pifft3d's argument is y.
    x, _ = _sharded(spec=P(None, "x", "y"))
    for fn in (skfft.pifft3d, skfft.pirfft3d, skfft.batched_ifftn):
        with pytest.raises(TypeError, match=rf"{fn.__name__}: y has dtype float32.*fix"):
            fn(x)
    flat, _ = _sharded((16, 8), np.complex64, P("x", "y"))
    for fn in (skfft.pifft3d, skfft.pirfft3d, skfft.fftfreq3d):
        with pytest.raises(ValueError, match=rf"{fn.__name__}: y has rank 2 \(shape \(16, 8\)\)"):
            fn(flat)
    with pytest.raises(ValueError, match=r"pfft3d: x has rank 2"):
        skfft.pfft3d(flat)


def test_a_traced_replicated_input_with_spec_on_explicit_axes_is_refused_with_a_fix():
    # Before: shard_map's "in_specs ... does not match the specs of the input" from inside jit.
    mesh = jax.make_mesh((2, 4), ("x", "y"))
    x = np.ones((16, 8, 8), np.float32)
    msg = r"pfft3d: x \(shape \(16, 8, 8\)\) is replicated on Explicit mesh axes.*fix: shard"
    with pytest.raises(ValueError, match=msg):
        jax.jit(lambda a: skfft.pfft3d(a, spec=P("x", "y"), mesh=mesh))(x)
    with jax.set_mesh(mesh), pytest.raises(ValueError, match=r"halo_exchange: x .* replicated"):
        jax.jit(lambda: skfft.halo_exchange(jnp.ones((16, 8)), 1, spec=P("x", "y")))()
    sharded = jax.device_put(x, NamedSharding(mesh, P("x", "y")))  # the fix works
    y = jax.jit(lambda a: skfft.pfft3d(a, spec=P("x", "y")))(sharded)
    assert _relerr(y, np.fft.fftn(x.astype(np.float64))) < RTOL
