"""Transforms inside jit on Auto mesh axes without spec=: XLA's partitioner lays x out.

Each result is checked against numpy and against the eager transform of the same array (whose
sharding shardkit reads directly); the compiled program must not gather the operand.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.fft as skfft
from shardkit.inspection.hlo import collective_counts

AUTO = AxisType.Auto

# (mesh shape, input shape, input spec): pencils, slabs, batch dims, non-cubic FFT dims
CASES = {
    "pencil": ((2, 4), (16, 8, 24), P("x", "y")),
    "pencil-swapped": ((2, 4), (8, 16, 8), P("y", "x")),
    "slab": ((8,), (16, 24, 8), P("x")),
    "slab-y": ((8,), (6, 16, 8), P(None, "x")),
    "batch": ((2, 4), (3, 8, 16, 8), P(None, "x", "y")),
    "sharded-batch": ((2, 4), (2, 8, 16, 4), P("x", "y")),
    "2d": ((8,), (16, 40), P("x")),
    "2d-batch": ((2, 4), (4, 8, 12), P("x", "y")),
}


def _mesh(shape):
    return jax.make_mesh(shape, ("x", "y")[: len(shape)], axis_types=(AUTO,) * len(shape))


def _data(shape, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)


def _relerr(got, want):
    got = np.asarray(got).astype(np.complex128)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _numpy(host, k, layout, norm, inverse=False):
    axes = tuple(range(host.ndim - k, host.ndim))
    if inverse:
        if layout == "transposed":
            host = np.moveaxis(host, -1, -k)
        return np.fft.ifftn(host, axes=axes, norm=norm)
    y = np.fft.fftn(host.astype(np.complex128), axes=axes, norm=norm)
    return y if layout == "natural" else np.moveaxis(y, -k, -1)


@pytest.mark.parametrize("norm", ["backward", "ortho"])
@pytest.mark.parametrize("layout", ["natural", "transposed"])
@pytest.mark.parametrize("case", list(CASES))
def test_jit_without_spec_equals_numpy_and_the_eager_layout(case, layout, norm):
    mesh_shape, shape, spec = CASES[case]
    k = 2 if case.startswith("2d") else 3
    fwd, inv = (skfft.pfft2d, skfft.pifft2d) if k == 2 else (skfft.pfft3d, skfft.pifft3d)
    host = _data(shape)
    x = jax.device_put(host, NamedSharding(_mesh(mesh_shape), spec))

    jitted = jax.jit(lambda a: fwd(a, layout=layout, norm=norm))
    compiled = jitted.lower(x).compile()
    y = compiled(x)
    eager = fwd(x, layout=layout, norm=norm)
    assert _relerr(y, _numpy(host, k, layout, norm)) < 1e-5
    assert y.sharding.is_equivalent_to(eager.sharding, y.ndim), (y.sharding, eager.sharding)
    counts = collective_counts(compiled.as_text())
    assert counts.get("all-gather", 0) == 0, counts  # x is never gathered
    assert counts.get("all-to-all", 0) >= 1, counts  # the distributed transform ran
    # the same per-shard program as with spec=: the same collectives and temporaries
    given = jax.jit(lambda a: fwd(a, layout=layout, norm=norm, spec=spec)).lower(x).compile()
    assert collective_counts(given.as_text()) == counts
    memory = compiled.memory_analysis().temp_size_in_bytes
    assert memory <= given.memory_analysis().temp_size_in_bytes + 1024, memory

    x2 = jax.jit(lambda b: inv(b, layout=layout, norm=norm))(y)
    assert _relerr(x2, host) < 1e-5
    assert x2.sharding.is_equivalent_to(x.sharding, x.ndim)


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize("layout", ["natural", "transposed"])
def test_gradient_without_spec_equals_jnp(layout, norm):
    mesh = _mesh((2, 4))
    rng = np.random.default_rng(1)
    host = rng.standard_normal((16, 8, 24)).astype(np.float32)
    w = rng.standard_normal((16, 8, 24)).astype(np.float32)
    w = w if layout == "natural" else np.moveaxis(w, 0, -1)
    x = jax.device_put(host, NamedSharding(mesh, P("x", "y")))

    def loss(a, fft):
        y = fft(a)
        return jnp.sum(jnp.abs(y) ** 2 + jnp.real(y) * w - jnp.imag(y) * w)

    def reference(a):
        y = jnp.fft.fftn(a, norm=norm)
        return y if layout == "natural" else jnp.moveaxis(y, 0, -1)

    g = jax.jit(jax.grad(lambda a: loss(a, lambda b: skfft.pfft3d(b, layout=layout, norm=norm))))(x)
    want = jax.grad(lambda a: loss(a, reference))(jnp.asarray(host))
    assert _relerr(g, np.asarray(want)) < 1e-5
    assert g.sharding.is_equivalent_to(x.sharding, x.ndim)

    # and through the inverse: the gradient of a complex input (JAX's convention: conj of d/dz)
    spectrum = skfft.spectral_layout(x, layout=layout)
    y = jax.device_put(_data(spectrum.shape, seed=2), NamedSharding(mesh, spectrum.spec))

    def inverse_loss(b, ifft):
        return jnp.sum(jnp.abs(ifft(b) - 0.5) ** 2)

    def ifft_reference(b):
        b = b if layout == "natural" else jnp.moveaxis(b, -1, 0)
        return jnp.fft.ifftn(b, norm=norm)

    ifft = lambda b: skfft.pifft3d(b, layout=layout, norm=norm)  # noqa: E731
    gi = jax.jit(jax.grad(lambda b: inverse_loss(b, ifft)))(y)
    want_i = jax.grad(lambda b: inverse_loss(b, ifft_reference))(jnp.asarray(np.asarray(y)))
    assert _relerr(gi, np.asarray(want_i)) < 1e-5
    assert gi.sharding.is_equivalent_to(y.sharding, y.ndim)


def test_under_set_mesh_and_vmap_without_spec():
    grid = jax.make_mesh((2, 2, 2), ("b", "x", "y"), axis_types=(AUTO,) * 3)
    host = _data((4, 8, 8, 16))
    xs = jax.device_put(host, NamedSharding(grid, P("b", "x", "y")))
    with jax.set_mesh(grid):
        ys = jax.jit(jax.vmap(skfft.pfft3d))(xs)
    assert _relerr(ys, np.fft.fftn(host.astype(np.complex128), axes=(1, 2, 3))) < 1e-5
    assert ys.sharding.spec == P("b", None, "x", "y")


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize("layout", ["natural", "transposed"])
def test_one_device_program_is_jnp_fftn(layout, norm):
    host = _data((8, 4, 6))
    y = jax.jit(lambda a: skfft.pfft3d(a, layout=layout, norm=norm))(jnp.asarray(host))
    assert _relerr(y, _numpy(host, 3, layout, norm)) < 1e-5
    x2 = jax.jit(lambda b: skfft.pifft3d(b, layout=layout, norm=norm))(y)
    assert _relerr(x2, host) < 1e-5


def test_eager_gradient_on_auto_axes_runs_the_distributed_program():
    # under jax.grad without jit the input is traced too; the op must still be partitioned
    mesh = _mesh((2, 4))
    host = np.random.default_rng(3).standard_normal((16, 8, 8)).astype(np.float32)
    x = jax.device_put(host, NamedSharding(mesh, P("x", "y")))
    g = jax.grad(lambda a: jnp.sum(jnp.abs(skfft.pfft3d(a, norm="ortho")) ** 2))(x)
    assert _relerr(g, 2 * host) < 1e-5  # Parseval: the ortho transform keeps the norm
    assert g.sharding.is_equivalent_to(x.sharding, x.ndim)


@pytest.mark.parametrize("fn", ["pfft3d", "pifft3d", "transposes", "batched_fftn"])
@pytest.mark.parametrize("under", ["grad", "set_mesh"])
def test_gradient_with_a_cotangent_laid_out_otherwise_equals_jnp(fn, under):
    # the cotangent of the linear loss sum(real(f(x)) * w) is w, laid out by the partitioner
    # as it likes (here sharded on the last dim only, or replicated): the VJP takes its own
    # block of it instead of refusing the layout of a value the user never sees
    mesh = _mesh((2, 4))
    host = np.random.default_rng(5).standard_normal((16, 16, 8)).astype(np.float32)
    spec = P(None, "x", "y") if fn == "pifft3d" else P("x", "y")  # a natural spectrum's
    x = jax.device_put(host, NamedSharding(mesh, spec))
    ours, theirs = {
        "pfft3d": (skfft.pfft3d, jnp.fft.fftn),
        "pifft3d": (
            lambda a: skfft.pifft3d(a.astype(jnp.complex64)),
            lambda a: jnp.fft.ifftn(a.astype(jnp.complex64)),
        ),
        "transposes": (
            lambda a: skfft.transpose_yx(skfft.transpose_zy(a)).reshape(host.shape),
            lambda a: jnp.transpose(a, (1, 2, 0)).reshape(host.shape),
        ),
        "batched_fftn": (
            lambda a: skfft.batched_fftn(a, axes=(2,)),
            lambda a: jnp.fft.fftn(a, axes=(2,)),
        ),
    }[fn]

    def loss(f):
        return lambda a: jnp.sum(jnp.real(f(a)) * jnp.arange(8.0))

    if under == "set_mesh":
        with jax.set_mesh(mesh):
            g = jax.grad(loss(ours))(x)
    else:
        g = jax.grad(loss(ours))(x)
    assert _relerr(g, jax.grad(loss(theirs))(host)) < 1e-5


def test_error_when_the_partitioner_leaves_x_unsharded():
    mesh = _mesh((2, 4))
    x = jax.device_put(_data((8, 8, 8)), NamedSharding(mesh, P("x", "y")))
    # a fresh array inside jit is replicated: the transform would have nothing to distribute
    with pytest.raises(Exception, match=r"pfft3d: x .*not sharded over mesh.*XLA's partitioner "
                                        r"chose this sharding, P\(None, None, None\).*"
                                        r"with_sharding_constraint"):  # fmt: skip
        jax.jit(lambda a: skfft.pfft3d(jnp.ones((8, 8, 8), jnp.complex64) + a.sum()))(x)


def test_error_when_the_last_dim_is_sharded():
    mesh = _mesh((8,))
    x = jax.device_put(_data((8, 8, 16)), NamedSharding(mesh, P(None, None, "x")))
    with pytest.raises(Exception, match=r"last FFT dim \(dim 2\) is sharded over mesh axis 'x' "
                                        r"of size 8.*XLA's partitioner chose"):  # fmt: skip
        jax.jit(skfft.pfft3d)(x)


def test_inside_shard_map_the_error_says_to_call_it_outside():
    # Manual axes have no partitioner: a traced shard cannot be laid out later, so the call
    # raises instead of transforming each shard alone
    mesh = _mesh((2, 4))
    x = jax.device_put(_data((16, 16, 8)), NamedSharding(mesh, P("x", "y")))
    local = jax.shard_map(skfft.pfft3d, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y"))
    with pytest.raises(ValueError, match=r"pfft3d: x \(shape \(8, 4, 8\)\) is one shard inside "
                                         r"jax.shard_map.*fix: call pfft3d outside"):  # fmt: skip
        jax.jit(local)(x)


@pytest.mark.parametrize("case", ["pencil", "slab", "batch", "sharded-batch"])
def test_pencil_transposes_without_spec_equal_jnp_transpose(case):
    mesh_shape, shape, spec = CASES[case]
    host = _data(shape)
    x = jax.device_put(host, NamedSharding(_mesh(mesh_shape), spec))
    nb = x.ndim - 3
    batch = tuple(range(nb))
    right, left = batch + (nb + 2, nb, nb + 1), batch + (nb + 1, nb + 2, nb)
    for there, back in [("transpose_zy", "transpose_yz"), ("transpose_yx", "transpose_xy")]:
        compiled = jax.jit(getattr(skfft, there)).lower(x).compile()
        g = compiled(x)
        np.testing.assert_array_equal(np.asarray(g), np.transpose(host, right))
        eager = getattr(skfft, there)(x)
        assert g.sharding.is_equivalent_to(eager.sharding, g.ndim), (g.sharding, eager.sharding)
        assert collective_counts(compiled.as_text()).get("all-gather", 0) == 0
        f = jax.jit(getattr(skfft, back))(g)
        np.testing.assert_array_equal(np.asarray(f), host)
        assert f.sharding.is_equivalent_to(x.sharding, x.ndim)
    # the VJP of a step is the step back: d/dx sum(zy(x)^2 w) / 2 = yz(zy(x) w) = x yz(w)
    w = np.random.default_rng(4).standard_normal(np.transpose(host, right).shape)
    real = jax.device_put(host.real, x.sharding)
    loss = lambda a: jnp.sum(skfft.transpose_zy(a) ** 2 * w) / 2  # noqa: E731
    grad = jax.jit(jax.grad(loss))(real)
    np.testing.assert_allclose(np.asarray(grad), host.real * np.transpose(w, left), rtol=1e-5)
    assert grad.sharding.is_equivalent_to(x.sharding, x.ndim)


def test_batched_fftn_without_spec_keeps_the_sharding():
    mesh = _mesh((2, 4))
    host = _data((8, 4, 6, 10))
    x = jax.device_put(host, NamedSharding(mesh, P("y", None, "x")))
    compiled = (
        jax.jit(lambda a: skfft.batched_fftn(a, axes=(1, 3), norm="ortho")).lower(x).compile()
    )
    y = compiled(x)
    assert _relerr(y, np.fft.fftn(host, axes=(1, 3), norm="ortho")) < 1e-5
    assert y.sharding.is_equivalent_to(x.sharding, x.ndim)
    assert not any(collective_counts(compiled.as_text()).values())  # no collective at all
    x2 = jax.jit(lambda b: skfft.batched_ifftn(b, axes=(1, 3), norm="ortho"))(y)
    assert _relerr(x2, host) < 1e-5
    real = jax.device_put(host.real, x.sharding)
    g = jax.jit(jax.grad(lambda a: jnp.sum(jnp.abs(skfft.batched_fftn(a, axes=(1, 3))) ** 2)))(real)
    assert _relerr(g, 2 * 4 * 10 * np.asarray(real)) < 1e-5  # Parseval over the 40 points
    with pytest.raises(Exception, match=r"batched_fftn: dim 2 \(size 6\) is sharded over mesh "
                                        r"axis 'x'.*XLA's partitioner chose"):  # fmt: skip
        jax.jit(lambda a: skfft.batched_fftn(a, axes=(2,)))(x)


@pytest.mark.parametrize("fn", ["halo_exchange", "prfft3d"])
def test_transforms_without_a_partitioner_rule_keep_the_clear_error(fn):
    # a halo's shape and a real spectrum's layout depend on the sharding, which a rule cannot
    # state before the partitioner runs
    mesh = _mesh((2, 4))
    x = jax.device_put(np.ones((16, 16, 8), np.float32), NamedSharding(mesh, P("x", "y")))
    call = {"halo_exchange": lambda a: skfft.halo_exchange(a, 1)}.get(fn, getattr(skfft, fn))
    with pytest.raises(ValueError, match=rf"{fn}: x .*traced value on Auto mesh axes.*spec="):
        jax.jit(call)(x)


def test_no_argument_carries_the_mesh_under_set_mesh():
    # a function of no arguments: JAX lowers without a mesh, so the operand's sharding names
    # none; it is matched against jax.set_mesh's mesh
    mesh = _mesh((2, 4))

    def power():
        x = jax.lax.with_sharding_constraint(jnp.ones((16, 8, 8), jnp.complex64), P("x", "y"))
        return skfft.pfft3d(x)

    with jax.set_mesh(mesh):
        try:
            y = jax.jit(power)()
        except Exception as e:  # JAX 0.10 compiles outside the set_mesh context: the clear error
            assert jax.__version_info__ < (0, 12), e
            assert re.search(r"pfft3d: .*names no mesh.*fix: pass spec=", str(e)), e
            y = jax.jit(lambda: skfft.pfft3d(jnp.ones((16, 8, 8)), spec=P("x", "y")))()  # the fix
    want = np.zeros((16, 8, 8))
    want[0, 0, 0] = 16 * 8 * 8
    assert _relerr(y, want) < 1e-6
    assert y.sharding.spec == P(None, "x", "y")


def test_explicit_axes_are_read_not_partitioned():
    # on Explicit axes the traced sharding is known: all None means replicated, an error now,
    # not a compile-time surprise
    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    x = jax.device_put(_data((16, 8, 8)), NamedSharding(mesh, P()))
    with jax.set_mesh(mesh), pytest.raises(
        ValueError, match=r"pfft3d: x \(shape \(16, 8, 8\)\) is replicated over mesh axes 'x' "
                          r"\(size 2\), 'y' \(size 4\).*fix: shard it first"):  # fmt: skip
        jax.jit(skfft.pfft3d)(x)


# per-example gradients of each op family: (op, reference on one element, element shape,
# spec of the batch)
PER_EXAMPLE = {
    "pfft3d": (
        lambda a: skfft.pfft3d(a, layout="transposed"),
        lambda a: jnp.moveaxis(jnp.fft.fftn(a), 0, -1),
        (8, 8, 16),
        P("b", "x", "y"),
    ),
    "pifft3d": (skfft.pifft3d, jnp.fft.ifftn, (8, 8, 16), P("b", None, "x", "y")),
    "pfft2d": (skfft.pfft2d, jnp.fft.fft2, (4, 8, 8), P("b", "x", "y")),
    "transpose_zy": (
        skfft.transpose_zy,
        lambda a: jnp.transpose(a, (2, 0, 1)),
        (8, 8, 4),
        P("b", "x", "y"),
    ),
    "batched_fftn": (
        lambda a: skfft.batched_fftn(a, axes=(0,)),
        lambda a: jnp.fft.fft(a, axis=0),
        (8, 4, 4),
        P("b", None, "x", "y"),
    ),
}


@pytest.mark.parametrize("fn", list(PER_EXAMPLE))
def test_vmap_of_grad_without_spec_gives_per_example_gradients(fn):
    # jax.vmap around jax.grad: the transform sees one differentiated element, its operand is
    # mapped only inside the custom VJP; the whole batch then runs as one program
    op, reference, shape, spec = PER_EXAMPLE[fn]
    grid = jax.make_mesh((2, 2, 2), ("b", "x", "y"), axis_types=(AUTO,) * 3)
    rng = np.random.default_rng(7)
    host = rng.standard_normal((4, *shape)).astype(np.float32)
    xs = jax.device_put(host, NamedSharding(grid, spec))
    weights = jnp.asarray(rng.standard_normal(4).astype(np.float32))

    def loss(a, w, f):  # each element's own weight: the gradients differ per element
        y = f(a.astype(jnp.complex64))
        return w * jnp.sum(jnp.abs(y) ** 2 + jnp.real(y))

    per_example = jax.jit(jax.vmap(jax.grad(lambda a, w: loss(a, w, op))))
    got = per_example(xs, weights)
    want = jax.vmap(jax.grad(lambda a, w: loss(a, w, reference)))(jnp.asarray(host), weights)
    assert _relerr(got, np.asarray(want)) < 1e-5
    text = per_example.lower(xs, weights).compile().as_text()
    assert collective_counts(text).get("all-gather", 0) == 0


@pytest.mark.parametrize("fn", list(PER_EXAMPLE))
def test_forward_mode_without_spec_equals_jnp(fn):
    # jax.jvp and a Hessian-vector product (forward over reverse) on a 2x4 pencil, and jax.vmap
    # of jax.jvp over a batch sharded on a third mesh axis, inside jit on Auto axes, where the
    # transform is a custom-partitioned op
    op, reference, shape, spec = PER_EXAMPLE[fn]
    rng = np.random.default_rng(8)
    host, tangent = (rng.standard_normal((4, *shape)).astype(np.float32) for _ in range(2))

    def loss(a, f):
        y = f(a.astype(jnp.complex64))
        return jnp.sum(jnp.abs(y) ** 2 + jnp.real(y) ** 3)

    def single(f, x, t):  # the JVP and the Hessian-vector product of one element's loss
        jvp = jax.jvp(lambda a: loss(a, f), (x,), (t,))[1]
        return jvp, jax.jvp(jax.grad(lambda a: loss(a, f)), (x,), (t,))[1]

    def mapped(f, xs, ts):
        return jax.vmap(lambda a, t: jax.jvp(lambda b: loss(b, f), (a,), (t,))[1])(xs, ts)

    pencil = NamedSharding(_mesh((2, 4)), P(*spec[1:]))
    grid = jax.make_mesh((2, 2, 2), ("b", "x", "y"), axis_types=(AUTO,) * 3)
    for run, args, sharding in [
        (single, (host[0], tangent[0]), pencil),
        (mapped, (host, tangent), NamedSharding(grid, spec)),
    ]:
        put = [jax.device_put(a, sharding) for a in args]
        compiled = jax.jit(lambda a, t, run=run: run(op, a, t)).lower(*put).compile()
        want = run(reference, *map(jnp.asarray, args))
        for g, w in zip(jax.tree.leaves(compiled(*put)), jax.tree.leaves(want), strict=True):
            assert _relerr(g, np.asarray(w)) < 1e-4, (fn, run.__name__)
        assert collective_counts(compiled.as_text()).get("all-gather", 0) == 0


def test_jacfwd_without_spec_is_the_dft_matrix():
    # forward-mode Jacobian of a 2x4-pencil transform: column e_i is the DFT of a unit impulse
    mesh = _mesh((2, 4))
    x = jax.device_put(np.zeros((8, 8, 4), np.float32), NamedSharding(mesh, P("x", "y")))

    def real_part(a):  # real outputs: jacfwd of a real function of a real input
        return jnp.real(skfft.pfft3d(a.astype(jnp.complex64), norm="ortho"))

    jac = jax.jit(jax.jacfwd(real_part))(x)  # [8, 8, 4 | 8, 8, 4]
    eye = np.eye(256).reshape(256, 8, 8, 4)
    want = np.real(np.fft.fftn(eye, axes=(1, 2, 3), norm="ortho")).reshape(256, 256).T
    assert _relerr(np.asarray(jac).reshape(256, 256), want) < 1e-5


@pytest.mark.parametrize("fn", ["pfft3d", "transpose_zy"])
def test_linear_transpose_without_spec_equals_jnp(fn):
    # jax.linear_transpose of the op: the adjoint, as jnp's transpose rules give it
    mesh = _mesh((2, 4))
    host = _data((8, 8, 4))
    x = jax.device_put(host, NamedSharding(mesh, P("x", "y")))
    op = getattr(skfft, fn)
    reference = jnp.fft.fftn if fn == "pfft3d" else lambda a: jnp.transpose(a, (2, 0, 1))
    ct = op(x)
    got = jax.jit(lambda c: jax.linear_transpose(op, x)(c)[0])(ct)
    want = jax.linear_transpose(reference, host)(np.asarray(ct))[0]
    assert _relerr(got, np.asarray(want)) < 1e-5
    assert got.sharding.is_equivalent_to(x.sharding, x.ndim)
