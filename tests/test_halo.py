"""halo_exchange and halo_accumulate: ghost cells equal numpy's, corners and edges included."""

import itertools

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkit.fft as skfft
from shardkit.inspection.hlo import collective_counts


def _padded_reference(f, grid, width, periodic):
    """The padded array halo_exchange promises, built shard by shard with numpy."""
    local = [n // g for n, g in zip(f.shape, grid)]
    blocks = np.empty(grid, dtype=object)
    for idx in itertools.product(*(range(g) for g in grid)):
        ranges = []
        for d, i in enumerate(idx):
            if grid[d] == 1:
                ranges.append(np.arange(f.shape[d]))
            else:
                ranges.append(np.arange(i * local[d] - width, (i + 1) * local[d] + width))
        inside = np.ones([len(r) for r in ranges], bool)
        for d, r in enumerate(ranges):
            ok = (r >= 0) & (r < f.shape[d])
            inside &= ok.reshape([-1 if k == d else 1 for k in range(f.ndim)])
        block = f[np.ix_(*[r % n for r, n in zip(ranges, f.shape)])]
        blocks[idx] = block if periodic else np.where(inside, block, 0)
    return np.block(blocks.tolist())


CASES = {  # name: (mesh shape, global shape, spec, grid of shards per dim)
    "2d-2x4": ((2, 4), (8, 16), P("x", "y"), (2, 4)),
    "3d-2x4": ((2, 4), (8, 12, 5), P("x", "y"), (2, 4, 1)),
    "3d-4x2-middle": ((4, 2), (6, 8, 6), P(None, "x", "y"), (1, 4, 2)),
    "2d-8": ((8,), (16, 3), P("x"), (8, 1)),
}


@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_halo_exchange_matches_numpy(case, periodic, axis_type):
    mesh_shape, shape, spec, grid = CASES[case]
    names = ("x", "y")[: len(mesh_shape)]
    mesh = jax.make_mesh(mesh_shape, names, axis_types=(axis_type,) * len(mesh_shape))
    f = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    x = jax.device_put(f, NamedSharding(mesh, spec))
    for width in (1, 2):
        if min(n // g for n, g in zip(shape, grid) if g > 1) < width:
            continue
        g = skfft.halo_exchange(x, width, periodic=periodic)
        want = _padded_reference(f, grid, width, periodic)
        np.testing.assert_array_equal(np.asarray(g), want)  # a copy: exact, corners included
        assert g.sharding.is_equivalent_to(NamedSharding(mesh, spec), f.ndim)
        counts = collective_counts(
            jax.jit(lambda a, w=width: skfft.halo_exchange(a, w, periodic=periodic, spec=spec))
            .lower(x)
            .compile()
            .as_text()
        )
        sharded = sum(1 for s in grid if s > 1)
        assert counts["collective-permute"] == 2 * sharded, counts
        assert counts["all-gather"] == 0 and counts["all-to-all"] == 0, counts


@pytest.mark.parametrize("periodic", [True, False])
def test_halo_accumulate_is_the_adjoint(periodic, axis_type):
    # <exchange(a), b> == <a, accumulate(b)> for random a, b: the adjoint, corners included
    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(axis_type,) * 2)
    spec = P("x", "y")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((8, 16, 4))
    b = rng.standard_normal((8 + 2 * 2, 16 + 2 * 4, 4))
    xa = jax.device_put(a.astype(np.float32), NamedSharding(mesh, spec))
    xb = jax.device_put(b.astype(np.float32), NamedSharding(mesh, spec))
    ea = np.asarray(skfft.halo_exchange(xa, 1, periodic=periodic), np.float64)
    tb = skfft.halo_accumulate(xb, 1, periodic=periodic)
    assert tb.shape == a.shape and tb.sharding.is_equivalent_to(xa.sharding, 3)
    lhs, rhs = np.vdot(ea, b), np.vdot(a, np.asarray(tb, np.float64))
    assert abs(lhs - rhs) < 1e-4 * abs(lhs), (lhs, rhs)
    # and directly: the padded reference's transpose, scattered with numpy
    want = np.zeros_like(a)
    ref = _padded_reference(np.arange(a.size).reshape(a.shape), (2, 4, 1), 1, periodic)
    inside = _padded_reference(np.ones(a.shape), (2, 4, 1), 1, periodic) > 0
    np.add.at(want.reshape(-1), ref[inside].astype(int), b[inside])
    np.testing.assert_allclose(np.asarray(tb), want, rtol=1e-5, atol=1e-5)


def test_halo_width_zero_is_identity_and_jit_on_auto_axes():
    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    x = jax.device_put(
        np.arange(128.0, dtype=np.float32).reshape(8, 16), NamedSharding(mesh, P("x", "y"))
    )
    assert skfft.halo_exchange(x, 0) is x
    fn = jax.jit(
        lambda a: skfft.halo_accumulate(
            skfft.halo_exchange(a, 1, spec=P("x", "y")), 1, spec=P("x", "y")
        )
    )
    out = np.asarray(fn(x))
    # every cell counted once, plus once more per shard that holds it as a ghost
    ones = jax.device_put(np.ones((8, 16), np.float32), NamedSharding(mesh, P("x", "y")))
    mult = np.asarray(fn(ones))
    np.testing.assert_allclose(out, np.arange(128.0).reshape(8, 16) * mult)
    assert mult.min() == 1 and mult.max() == 4  # a corner cell is a ghost of 3 other shards
    assert mult[0, 0] == 4 and mult[1, 1] == 1 and mult[0, 1] == 2 and mult[1, 3] == 2


def test_halo_errors():
    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    x = jax.device_put(np.ones((8, 8), np.float32), NamedSharding(mesh, P("x", "y")))
    with pytest.raises(
        ValueError, match=r"halo_exchange: width=-1 must be a non-negative int.*fix"
    ):
        skfft.halo_exchange(x, -1)
    msg = r"dim 1 of x \(shape \(8, 8\)\) has 2 cells per shard over mesh axis 'y' \(size 4\)"
    with pytest.raises(ValueError, match=msg + r".*fix: use width <= 2"):
        skfft.halo_exchange(x, 3)
    with pytest.raises(ValueError, match=r"halo_accumulate: dim 1 .* at least 3 cells.*width <= 0"):
        skfft.halo_accumulate(x, 1)
    replicated = jax.device_put(np.ones((8, 8), np.float32), NamedSharding(mesh, P()))
    for fn in (skfft.halo_exchange, skfft.halo_accumulate):
        with pytest.raises(ValueError, match=r"x \(shape \(8, 8\), spec P\(None, None\)\) is not "
                                             r"sharded over mesh.*fix: shard x first"):  # fmt: skip
            fn(replicated, 1)
