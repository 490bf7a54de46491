"""Distributed FFT without a gather: seed 004's exercise redone with shardkit.fft.

The seed shows that `jnp.fft.fftn` on a sharded 3-D volume all-gathers the whole volume onto
every device, then reaches for jaxDecomp. `shardkit.fft.pfft3d` gives the same numbers with two
all-to-alls and no gather, on today's default (Explicit) mesh axes, where jaxDecomp does not
compile.

    python examples/fft_seed004.py

Expected output:
    mesh (4, 2) ('x', 'y'), A: float32[16, 16, 16] sharded P('x', 'y', None), shards (4, 8, 16)
    jnp.fft.fftn:      all-gather 2, all-to-all 0; output P('x', 'y', None)
    shardkit pfft3d:   all-gather 0, all-to-all 2; output P(None, 'x', 'y'), shards (16, 4, 8)
    equal to jnp.fft.fftn (rtol 1e-5): True
    transposed layout: P('x', 'y', None), shape (16, 16, 16), equal to fftn.transpose(1, 2, 0): True
    round trip back to P('x', 'y', None): True, max error < 1e-5: True
    slab on mesh (1, 8) with P(None, 'y'): all-to-all 1, output P(None, None, 'y'), equal: True
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardkit.fft as skfft  # noqa: E402
from shardkit.inspection.hlo import collective_counts  # noqa: E402


def spec_of(a):
    """The PartitionSpec of `a`, one entry per dim."""
    spec = tuple(a.sharding.spec) + (None,) * (a.ndim - len(a.sharding.spec))
    return P(*spec)


def shards(a):
    return a.sharding.shard_shape(a.shape)


def counts(fn, *args):
    c = collective_counts(jax.jit(fn).lower(*args).compile().as_text())
    return f"all-gather {c['all-gather']}, all-to-all {c['all-to-all']}"


def main():
    mesh = jax.make_mesh((4, 2), ("x", "y"))  # Explicit mesh axes: today's default
    A = jax.random.normal(jax.random.key(0), (16, 16, 16))
    A_sharded = jax.device_put(A, NamedSharding(mesh, P("x", "y")))
    print(
        f"mesh {tuple(mesh.shape.values())} {mesh.axis_names}, A: float32{list(A.shape)} "
        f"sharded {spec_of(A_sharded)}, shards {shards(A_sharded)}"
    )

    local_fft = jnp.fft.fftn(A)  # single-device reference
    global_fft = jnp.fft.fftn(A_sharded)
    print(f"jnp.fft.fftn:      {counts(jnp.fft.fftn, A_sharded)}; output {spec_of(global_fft)}")

    y = skfft.pfft3d(A_sharded)
    print(
        f"shardkit pfft3d:   {counts(skfft.pfft3d, A_sharded)}; output {spec_of(y)}, "
        f"shards {shards(y)}"
    )
    print(
        f"equal to jnp.fft.fftn (rtol 1e-5): "
        f"{bool(np.allclose(y, local_fft, rtol=1e-5, atol=1e-4))}"
    )

    yt = skfft.pfft3d(A_sharded, layout="transposed")  # jaxDecomp's default layout
    same = np.allclose(yt, local_fft.transpose(1, 2, 0), rtol=1e-5, atol=1e-4)
    print(
        f"transposed layout: {spec_of(yt)}, shape {yt.shape}, equal to "
        f"fftn.transpose(1, 2, 0): {bool(same)}"
    )

    back = skfft.pifft3d(yt, layout="transposed")
    err = float(jnp.max(jnp.abs(back.real - A)))
    print(
        f"round trip back to {spec_of(back)}: {spec_of(back) == spec_of(A_sharded)}, "
        f"max error < 1e-5: {err < 1e-5}"
    )

    slab_mesh = jax.make_mesh((1, 8), ("x", "y"))
    A_slab = jax.device_put(A, NamedSharding(slab_mesh, P(None, "y")))
    ys = skfft.pfft3d(A_slab)
    c = collective_counts(jax.jit(skfft.pfft3d).lower(A_slab).compile().as_text())
    print(
        f"slab on mesh (1, 8) with P(None, 'y'): all-to-all {c['all-to-all']}, output "
        f"{spec_of(ys)}, equal: {bool(np.allclose(ys, local_fft, rtol=1e-5, atol=1e-4))}"
    )


if __name__ == "__main__":
    main()
