"""Distributed FFTs that never gather: pencil and slab transforms written with `jax.shard_map`.

`jnp.fft.fftn` on a sharded array all-gathers the whole array onto every device (jax issues
13081 and 15680): each device then holds and transforms the global array. `shardkit.fft`
instead transforms whole dims locally and moves the sharding between dims with
`lax.all_to_all` inside one `jax.shard_map`, so no device ever holds more than its shard plus
one transposition buffer. It works on Auto and Explicit mesh axes alike.

A 3-D transform of `x[X_a, Y_b, Z]` (dims X, Y sharded over mesh axes a, b):

    FFT Z -> all-to-all over b -> FFT Y -> all-to-all over a -> FFT X  ==  y[KX, KY_a, KZ_b]

Two all-to-alls for a pencil (two mesh axes), one for a slab (one mesh axis). The inverse runs
the steps backwards and returns the input layout exactly.

Example:
    >>> import jax, jax.numpy as jnp, shardkit.fft as skfft
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jax.make_mesh((2, 4), ("x", "y"))
    >>> x = jax.device_put(jnp.ones((16, 16, 16)), NamedSharding(mesh, P("x", "y")))
    >>> y = skfft.pfft3d(x)                    # y[KX, KY_x, KZ_y], equal to jnp.fft.fftn(x)
    >>> x2 = skfft.pifft3d(y)                  # back to x[X_x, Y_y, Z]
"""

from shardkit.fft._batched import batched_fftn as batched_fftn
from shardkit.fft._batched import batched_ifftn as batched_ifftn
from shardkit.fft._complex import pfft2d as pfft2d
from shardkit.fft._complex import pfft3d as pfft3d
from shardkit.fft._complex import pifft2d as pifft2d
from shardkit.fft._complex import pifft3d as pifft3d
from shardkit.fft._freq import fftfreq3d as fftfreq3d
from shardkit.fft._freq import spectral_layout as spectral_layout
from shardkit.fft._halo import halo_accumulate as halo_accumulate
from shardkit.fft._halo import halo_exchange as halo_exchange
from shardkit.fft._layout import SpectralLayout as SpectralLayout
from shardkit.fft._real import pirfft3d as pirfft3d
from shardkit.fft._real import prfft3d as prfft3d
from shardkit.fft._transpose import transpose_xy as transpose_xy
from shardkit.fft._transpose import transpose_yx as transpose_yx
from shardkit.fft._transpose import transpose_yz as transpose_yz
from shardkit.fft._transpose import transpose_zy as transpose_zy

__all__ = [
    "SpectralLayout",
    "batched_fftn",
    "batched_ifftn",
    "fftfreq3d",
    "halo_accumulate",
    "halo_exchange",
    "pfft2d",
    "pfft3d",
    "pifft2d",
    "pifft3d",
    "pirfft3d",
    "prfft3d",
    "spectral_layout",
    "transpose_xy",
    "transpose_yx",
    "transpose_yz",
    "transpose_zy",
]
