"""shardkit.fft at the user's boundary: layouts only batch dims shard, the wrong mesh passed,
frequency grids under plain `jax.grad`, `vmap` with `spec=` inside `jit`, and error messages
whose fix the transform accepts."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.fft as skfft
from shardkit.inspection.hlo import collective_counts

TOL = 1e-5  # relative L2 error vs numpy in float64, float32 / complex64 data


def _relerr(got, want):
    got = np.asarray(got).astype(np.complex128)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _put(x, mesh, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))


@pytest.mark.parametrize("layout", ["natural", "transposed"])
def test_real_transform_of_an_input_only_its_batch_dim_shards(layout, axis_type):
    mesh = jax.make_mesh((8,), ("x",), axis_types=(axis_type,))
    host = np.random.default_rng(0).standard_normal((8, 4, 6, 5)).astype(np.float32)
    x = _put(host, mesh, P("x"))
    y = skfft.prfft3d(x, layout=layout)
    want = np.fft.rfftn(host.astype(np.float64), axes=(1, 2, 3))
    if layout == "transposed":
        want = np.moveaxis(want, 1, 3)
    assert _relerr(y, want) < TOL
    expected = skfft.spectral_layout(x, layout=layout, real=True)
    assert y.shape == expected.shape
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, expected.spec), y.ndim)
    back = skfft.pirfft3d(y, n=5, layout=layout)
    assert _relerr(back, host) < TOL
    assert back.sharding.is_equivalent_to(x.sharding, x.ndim)


def test_real_transform_under_vmap_of_a_batch_sharded_array():
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
    host = np.random.default_rng(1).standard_normal((8, 4, 4, 6)).astype(np.float32)
    y = jax.vmap(skfft.prfft3d)(_put(host, mesh, P("x")))
    assert _relerr(y, np.fft.rfftn(host.astype(np.float64), axes=(1, 2, 3))) < TOL


def test_a_mesh_argument_other_than_the_input_s_mesh_is_an_error():
    m24 = jax.make_mesh((2, 4), ("x", "y"))
    m42 = jax.make_mesh((4, 2), ("x", "y"))
    x = _put(np.ones((8, 8, 4), np.complex64), m24, P("x", "y"))
    with pytest.raises(ValueError, match=r"laid out on mesh \{'x': 2, 'y': 4\}.*fix: drop mesh="):
        skfft.pfft3d(x, mesh=m42)
    flipped = jax.sharding.Mesh(m24.devices[::-1], ("x", "y"))  # same axes, other devices
    with pytest.raises(ValueError, match="another mesh"):
        skfft.pfft3d(x, mesh=flipped)
    assert _relerr(skfft.pfft3d(x, mesh=m24), np.fft.fftn(np.ones((8, 8, 4)))) < TOL


def test_a_spec_longer_than_the_rank_is_named_as_such():
    mesh = jax.make_mesh((2, 4), ("x", "y"))
    x = _put(np.ones((8, 8, 4), np.complex64), mesh, P("x", "y"))
    with pytest.raises(ValueError, match=r"has 4 entries but x has rank 3"):
        skfft.pfft3d(x, spec=P("x", "y", None, None))


def test_frequency_grids_of_a_spectrum_traced_by_grad_or_vmap_outside_jit():
    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    host = np.random.default_rng(2).standard_normal((8, 8, 8)).astype(np.float32)

    def energy(v):  # sum over k of |k|^2 |v_k|^2
        yk = skfft.prfft3d(v)
        kx, ky, kz = skfft.fftfreq3d(yk, real=True, n=8)
        return jnp.sum(jnp.abs(yk) ** 2 * (kx**2 + ky**2 + kz**2))

    def reference(v):
        f, fz = jnp.fft.fftfreq(8), jnp.fft.rfftfreq(8)
        k2 = f[:, None, None] ** 2 + f[None, :, None] ** 2 + fz[None, None, :] ** 2
        return jnp.sum(jnp.abs(jnp.fft.rfftn(v)) ** 2 * k2)

    want = np.asarray(jax.grad(reference)(jnp.asarray(host)), np.float64)
    x = _put(host, mesh, P("x", "y"))
    with jax.set_mesh(mesh):
        got = jax.grad(energy)(x)
        batched = jax.vmap(energy)(_put(np.stack([host, 2 * host]), mesh, P(None, "x", "y")))
    assert _relerr(got, want) < TOL
    assert np.allclose(np.asarray(batched) / float(reference(jnp.asarray(host))), [1, 4], rtol=1e-5)
    with pytest.raises(ValueError, match=r"fftfreq3d: y is traced on an abstract mesh.*mesh=mesh"):
        jax.grad(energy)(x)  # no jax.set_mesh: no devices to place the grids on


@pytest.mark.parametrize("fn", ["pfft3d", "prfft3d"])
def test_vmap_with_spec_inside_jit_on_auto_axes_reads_the_batch_axis(fn):
    mesh = jax.make_mesh((2, 2, 2), ("b", "x", "y"), axis_types=(AxisType.Auto,) * 3)
    host = np.random.default_rng(3).standard_normal((4, 8, 8, 4)).astype(np.float32)
    xs = _put(host, mesh, P("b", "x", "y"))
    transform = getattr(skfft, fn)
    ys = jax.jit(jax.vmap(lambda a: transform(a, spec=P("x", "y"))))(xs)
    numpy_fn = np.fft.fftn if fn == "pfft3d" else np.fft.rfftn
    assert _relerr(ys, numpy_fn(host.astype(np.float64), axes=(1, 2, 3))) < TOL
    # forward mode with spec= goes through the same vmap rule
    mapped = jax.vmap(lambda a: transform(a, spec=P("x", "y")))
    primal, tangent = jax.jit(lambda a: jax.jvp(mapped, (a,), (a,)))(xs)
    assert _relerr(tangent, np.asarray(primal)) < TOL


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto])
@pytest.mark.parametrize(
    "fn", ["pfft3d", "pifft3d", "pfft2d", "transpose_zy", "transpose_xy", "batched_fftn"]
)
def test_per_example_derivatives_of_a_batch_sharded_on_another_axis(fn, axis_type):
    # jax.vmap of jax.grad / jax.jvp: the transform sees one element, whose layout no longer
    # names the batch's mesh axis 'b'; the derivatives run on the whole batch instead
    mesh = jax.make_mesh((2, 2, 2), ("b", "x", "y"), axis_types=(axis_type,) * 3)
    rng = np.random.default_rng(5)
    host = rng.standard_normal((4, 8, 8, 4)).astype(np.float32)
    spec = P("b", None, "x", "y") if fn in ("pifft3d", "batched_fftn") else P("b", "x", "y")
    xs = _put(host, mesh, spec)
    weights = rng.standard_normal(4).astype(np.float32)
    ws = _put(weights, mesh, P("b"))
    element = P(*spec[1:]) if axis_type == AxisType.Auto else None  # Auto: spec= is needed
    references = {
        "pfft3d": jnp.fft.fftn,
        "pifft3d": jnp.fft.ifftn,
        "pfft2d": jnp.fft.fft2,
        "transpose_zy": lambda a: jnp.transpose(a, (2, 0, 1)),
        "transpose_xy": lambda a: jnp.transpose(a, (1, 2, 0)),
        "batched_fftn": lambda a: jnp.fft.fft(a, axis=0),
    }
    if fn == "batched_fftn":
        op = lambda a: skfft.batched_fftn(a, axes=(0,), spec=element)  # noqa: E731
    else:
        op = lambda a: getattr(skfft, fn)(a, spec=element)  # noqa: E731

    def loss(a, w, f):
        y = f(a.astype(jnp.complex64))
        return w * jnp.sum(jnp.abs(y) ** 2 + jnp.real(y) ** 3)

    def derivatives(f, xs, ws):
        grads = jax.vmap(jax.grad(lambda a, w: loss(a, w, f)))(xs, ws)
        jvps = jax.vmap(lambda a, w: jax.jvp(lambda b: loss(b, w, f), (a,), (a,))[1])(xs, ws)
        return grads, jvps

    compiled = jax.jit(lambda a, w: derivatives(op, a, w)).lower(xs, ws).compile()
    want = derivatives(references[fn], jnp.asarray(host), jnp.asarray(weights))
    for got, w in zip(compiled(xs, ws), want, strict=True):
        assert _relerr(got, np.asarray(w)) < 1e-4
    assert collective_counts(compiled.as_text()).get("all-gather", 0) == 0


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto])
@pytest.mark.parametrize(
    "mesh_shape,element,layout,z,norm",
    [
        ((2, 2, 2), P("x", "y"), "natural", 4, "backward"),  # pencil
        ((2, 2, 2), P("x", "y"), "transposed", 5, "ortho"),
        ((2, 4), P("x"), "transposed", 6, "forward"),  # slab over X
        ((2, 4), P(None, "x"), "natural", 7, "backward"),  # slab over Y
    ],
)
def test_per_example_derivatives_of_the_real_transforms(
    axis_type, mesh_shape, element, layout, z, norm
):
    # prfft3d and pirfft3d give their own derivatives under jax.vmap too: their adjoints are
    # each other with the mirrored frequencies halved or doubled, as jnp.fft.rfftn's VJP
    names = ("b", "x", "y")[: len(mesh_shape)]
    mesh = jax.make_mesh(mesh_shape, names, axis_types=(axis_type,) * len(names))
    rng = np.random.default_rng(6)
    host = rng.standard_normal((4, 8, 8, z)).astype(np.float32)
    weights = rng.standard_normal(4).astype(np.float32)
    xs, ws = _put(host, mesh, P("b", *element)), _put(weights, mesh, P("b"))
    auto = axis_type == AxisType.Auto
    kspec = skfft.spectral_layout(xs, layout=layout, real=True).spec if auto else None
    opts = dict(norm=norm, layout=layout)

    def roll(y):  # numpy's layout -> `layout`
        return y if layout == "natural" else jnp.moveaxis(y, -3, -1)

    forward = {
        "shardkit": lambda a: skfft.prfft3d(a, spec=element if auto else None, **opts),
        "jnp": lambda a: roll(jnp.fft.rfftn(a, norm=norm)),
    }
    inverse = {
        "shardkit": lambda y: skfft.pirfft3d(y, n=z, spec=P(*kspec[1:]) if auto else None, **opts),
        "jnp": lambda y: jnp.fft.irfftn(
            y if layout == "natural" else jnp.moveaxis(y, -1, -3), s=(8, 8, z), norm=norm
        ),
    }

    def derivatives(f, finv, xs, ys, ws):
        def loss(a, w):
            y = f(a)
            return w * jnp.sum(jnp.abs(y) ** 2 + jnp.real(y) ** 3 + jnp.imag(y))

        def loss_inv(y, w):
            return w * jnp.sum(finv(y) ** 3)

        return (
            jax.vmap(jax.grad(loss))(xs, ws),
            jax.vmap(lambda a, w: jax.jvp(lambda b: loss(b, w), (a,), (a,))[1])(xs, ws),
            jax.vmap(jax.grad(loss_inv))(ys, ws),
            jax.vmap(lambda y, w: jax.jvp(lambda c: loss_inv(c, w), (y,), (y,))[1])(ys, ws),
        )

    ys = jax.jit(jax.vmap(forward["shardkit"]))(xs)
    compiled = jax.jit(
        lambda a, y, w: derivatives(forward["shardkit"], inverse["shardkit"], a, y, w)
    ).lower(xs, ys, ws).compile()  # fmt: skip
    got = compiled(xs, ys, ws)
    host_ys = jnp.asarray(np.asarray(ys))
    want = derivatives(forward["jnp"], inverse["jnp"], jnp.asarray(host), host_ys, weights)
    for g, w in zip(got, want, strict=True):
        assert _relerr(g, np.asarray(w)) < 1e-4
    assert collective_counts(compiled.as_text()).get("all-gather", 0) == 0


@pytest.mark.parametrize(
    "fn,axis_type,with_spec",
    [
        (fn, axis_type, with_spec)
        for fn in ("pfft3d", "prfft3d", "transpose_zy")
        for axis_type, with_spec in ((AxisType.Explicit, False), (AxisType.Auto, True),
                                     (AxisType.Auto, False))
        if not (fn == "prfft3d" and axis_type == AxisType.Auto and not with_spec)
    ],  # the real transforms need spec= inside jit on Auto axes
)  # fmt: skip
def test_per_example_second_derivatives(fn, axis_type, with_spec):
    # Hessian-vector products (forward over reverse), reverse over reverse and forward over
    # forward, under jax.vmap of a batch sharded on its own mesh axis
    mesh = jax.make_mesh((2, 2, 2), ("b", "x", "y"), axis_types=(axis_type,) * 3)
    host = np.random.default_rng(7).standard_normal((4, 8, 8, 4)).astype(np.float32)
    xs = _put(host, mesh, P("b", "x", "y"))
    element = P("x", "y") if with_spec else None
    references = {
        "pfft3d": jnp.fft.fftn,
        "prfft3d": jnp.fft.rfftn,
        "transpose_zy": lambda a: jnp.transpose(a, (2, 0, 1)),
    }

    def second_derivatives(f):
        def loss(v):
            y = f(v)
            return jnp.sum(jnp.real(y) ** 3 + jnp.abs(y) ** 2)

        def grad_dot(v):
            return jnp.sum(jax.grad(loss)(v) * jnp.sin(v))

        return (
            jax.vmap(lambda a: jax.jvp(jax.grad(loss), (a,), (jnp.cos(a),))[1]),
            jax.vmap(jax.grad(grad_dot)),
            jax.vmap(lambda a: jax.jvp(lambda b: jax.jvp(loss, (b,), (b,))[1], (a,), (a,))[1]),
        )

    op = lambda a: getattr(skfft, fn)(a, spec=element)  # noqa: E731
    for got, want in zip(
        second_derivatives(op), second_derivatives(references[fn]), strict=True
    ):  # fmt: skip
        assert _relerr(jax.jit(got)(xs), np.asarray(want(jnp.asarray(host)))) < 1e-4


def test_vmap_of_hessian_names_hessian_vector_products():
    # jax.hessian's tangent basis under jax.vmap carries no mesh: the error names the way
    mesh = jax.make_mesh((2, 2, 2), ("b", "x", "y"), axis_types=(AxisType.Explicit,) * 3)
    host = np.random.default_rng(5).standard_normal((2, 4, 4, 4)).astype(np.float32)
    xs = _put(host, mesh, P("b", "x", "y"))

    def loss(v):
        return jnp.sum(jnp.real(skfft.pfft3d(v)) ** 3)

    # raised when the program compiles (the partitioner's rule), as a JaxRuntimeError
    errors = (ValueError, jax.errors.JaxRuntimeError)
    with pytest.raises(errors, match=r"Hessian-vector products.*jax.jvp\(jax.grad\(loss\)"):
        jax.jit(jax.vmap(jax.hessian(loss)))(xs)


# (mesh shape, axis names, a spec the transform refuses, transform, input shape)
REFUSED = [
    ((2, 2, 2), ("b", "x", "y"), P(None, ("x", "b"), "y"), "pfft3d", (4, 8, 8, 4)),
    ((2, 4), ("x", "y"), P("x", None, "y"), "prfft3d", (8, 8, 8)),
    ((2, 4), ("x", "y"), P("x", None, "y"), "pfft3d", (8, 8, 8)),
    ((2, 4), ("x", "y"), P(("x", "y"), None, None), "pfft3d", (8, 8, 8)),
    ((2, 4), ("x", "y"), P(None, None, ("x", "y")), "pfft3d", (8, 8, 8)),
    ((2, 4), ("x", "y"), P(None, ("x", "y")), "pfft2d", (8, 8, 8)),
    ((2, 2, 2), ("b", "x", "y"), P(None, "x", "y", None), "pfft3d", (4, 8, 8, 4)),
]


@pytest.mark.parametrize("mesh_shape,names,spec,fn,shape", REFUSED)
def test_the_fix_an_error_suggests_is_accepted(mesh_shape, names, spec, fn, shape):
    mesh = jax.make_mesh(mesh_shape, names, axis_types=(AxisType.Explicit,) * len(names))
    host = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    transform = getattr(skfft, fn)
    with pytest.raises(ValueError) as err:
        transform(_put(host, mesh, spec))
    suggested = re.search(r"reshard\(x, (P\(.*\))\)\.$", str(err.value))
    assert suggested, str(err.value)
    fixed = eval(suggested.group(1), {"P": P})  # noqa: S307  (a spec printed by shardkit)
    transform(_put(host, mesh, fixed))  # the suggestion is a layout the transform takes


def test_an_error_without_a_layout_to_suggest_says_what_to_change():
    mesh = jax.make_mesh((2, 2, 2), ("b", "x", "y"), axis_types=(AxisType.Explicit,) * 3)
    x = _put(np.ones((8, 8, 4), np.float32), mesh, P("x", "y"))
    with pytest.raises(ValueError, match=r"cannot also use mesh axis 'b'.*leading batch dim"):
        skfft.pfft3d(x)
    x2 = _put(np.ones((8, 8), np.complex64), mesh, P(("x", "y")))
    with pytest.raises(ValueError, match=r"several mesh axes.*cannot also use mesh axis 'y'"):
        skfft.pfft2d(x2)
