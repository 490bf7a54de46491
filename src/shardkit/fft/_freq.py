# ruff: noqa: F722  (jaxtyping shape strings are not Python expressions)
"""Layout queries and wavenumber grids that match the layout of a distributed spectrum."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float

from shardkit.errors import ShardkitValueError
from shardkit.fft import _complex, _real
from shardkit.fft import _layout as L
from shardkit.mesh import concrete_mesh


def spectral_layout(
    x: Any,
    *,
    layout: L.Layout = "natural",
    real: bool = False,
    ndim: int = 3,
    spec: P | None = None,
    mesh: Any = None,
) -> L.SpectralLayout:
    """The shape, PartitionSpec and axis order of the spectrum a transform of `x` returns.

    Nothing is computed: `x` may be a `jax.ShapeDtypeStruct` with a `NamedSharding`.

    Args:
        x: the input of `pfft3d` (`ndim=3`), `pfft2d` (`ndim=2`) or `prfft3d` (`real=True`).
        layout: `"natural"` or `"transposed"`.
        real: describe the half spectrum of `prfft3d` instead of the full one.
        ndim: number of FFT dims, 3 or 2 (`real=True` needs 3).
        spec: the PartitionSpec of `x` when it cannot be read from `x`.
        mesh: the mesh of `x` when it cannot be read from `x` or from `jax.set_mesh`.

    Returns:
        `SpectralLayout(shape, spec, axes)`; `axes[i]` is the input dim whose frequencies dim
        `i` of the spectrum holds.

    Raises:
        ValueError: as the transform itself would for this input (bad sharding, sizes, options).

    Example:
        >>> mesh = jax.make_mesh((2, 4), ("x", "y"))
        >>> s = jax.ShapeDtypeStruct((16, 16, 16), jnp.float32,
        ...                          sharding=NamedSharding(mesh, P("x", "y")))
        >>> shardkit.fft.spectral_layout(s, layout="transposed")
        SpectralLayout(shape=(16, 16, 16), spec=P('x', 'y', None), axes=(1, 2, 0))

    See also:
        `pfft3d`, `prfft3d`, `fftfreq3d`.
    """
    fname = "spectral_layout"
    L.check_choice("layout", layout, L.LAYOUTS, fname)
    L.check_choice("ndim", ndim, (3,) if real else (2, 3), fname)
    L.check_rank(x, ndim, fname)
    mesh, entries = L.resolve(x, spec, mesh, fname)
    shape = tuple(x.shape)
    if real:  # the checks of the transform itself
        L.check_fft_entries(entries, mesh, 3, fname, shape=shape)
        _real.check_sizes(shape, entries[:-3], entries[-3], entries[-2], mesh, fname)
        return _real.layout_of(shape, entries, mesh, layout)
    entries = _complex.validated(
        shape, entries, ndim, mesh, inverse=False, layout=layout, fname=fname
    )
    return _complex.layout_of(shape, entries, ndim, layout)


def fftfreq3d(
    y: Any,
    *,
    layout: L.Layout = "natural",
    real: bool = False,
    n: int | None = None,
    d: float | tuple[float, float, float] = 1.0,
    spec: P | None = None,
    mesh: Any = None,
) -> tuple[Float[Array, "*shape"], Float[Array, "*shape"], Float[Array, "*shape"]]:
    """Sample frequencies `(kx, ky, kz)` laid out to broadcast against a distributed spectrum.

    Each grid has the spectrum's rank, size 1 except along the dim that holds its frequencies,
    and is sharded there like the spectrum, so `kx**2 + ky**2 + kz**2` broadcasts against `y`
    shard by shard with no communication. Values follow `numpy.fft.fftfreq` (cycles per unit
    of `d`; multiply by 2*pi for angular wavenumbers), `rfftfreq` along the half-spectrum dim.

    Args:
        y: a spectrum from `pfft3d` or `prfft3d` (or an abstract value with its sharding).
        layout: the layout of `y` (`"natural"` or `"transposed"`).
        real: `y` is a half spectrum from `prfft3d`.
        n: length of the real field's last dim (`real=True`); default `2 * (KZ - 1)`.
        d: sample spacing, one value or one per input dim (X, Y, Z).
        spec: the PartitionSpec of `y` when it cannot be read from `y`.
        mesh: the mesh of `y` when it cannot be read from `y` or from `jax.set_mesh`.

    Returns:
        `(kx, ky, kz)`, frequencies along the input dims X, Y, Z, float32 (float64 for a
        complex128 `y`).

    Raises:
        ValueError: rank < 3, a bad `layout`, an `n` that does not fit the half spectrum.

    Example:
        >>> y = shardkit.fft.pfft3d(x)
        >>> kx, ky, kz = shardkit.fft.fftfreq3d(y)
        >>> k2 = (2 * jnp.pi) ** 2 * (kx**2 + ky**2 + kz**2)   # sharded like y

    See also:
        `spectral_layout`, `pfft3d`, `prfft3d`.
    """
    fname = "fftfreq3d"
    L.check_choice("layout", layout, L.LAYOUTS, fname)
    L.check_rank(y, 3, fname)
    mesh, entries = L.resolve(y, spec, mesh, fname)
    mesh = concrete_mesh(mesh)
    if n is not None:
        L.check_int("n", n, fname)
    ds = tuple(d) if isinstance(d, tuple | list) else (d,) * 3
    if len(ds) != 3:
        raise ShardkitValueError(
            f"{fname}: d={d!r} has {len(ds)} values but the spectrum has 3 FFT dims (X, Y, Z); "
            f"fix: pass one spacing, d=box / n, or one per input dim, d=(dx, dy, dz)."
        )
    rank = len(y.shape)
    nb = rank - 3
    axes = (0, 1, 2) if layout == "natural" else (1, 2, 0)
    is64 = jnp.dtype(y.dtype) == jnp.complex128
    dtype = np.float64 if is64 else np.float32
    grids: list[Any] = [None, None, None]
    for p, orig in enumerate(axes):
        size = y.shape[nb + p]
        if real and orig == 2:
            nz = 2 * (size - 1) if n is None else n
            if nz < 1 or nz // 2 + 1 != size:
                raise ShardkitValueError(
                    f"{fname}: n={n} does not fit the half spectrum's {size} frequencies along "
                    f"dim {nb + p}; fix: pass n= the length of the real field's last dim."
                )
            freq = np.fft.rfftfreq(nz, ds[orig])
        else:
            freq = np.fft.fftfreq(size, ds[orig])
        shape = [1] * rank
        shape[nb + p] = size
        gspec = [None] * rank
        gspec[nb + p] = entries[nb + p]
        # A complex128 spectrum means 64-bit types are enabled, so float64 grids survive.
        grids[orig] = _place(freq.astype(dtype).reshape(shape), NamedSharding(mesh, P(*gspec)))
    return grids[0], grids[1], grids[2]


def _place(grid: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """`grid` placed with `sharding`, or an error with the fix when its mesh is abstract (a
    traced value's) and no devices can be found for it outside `jit`."""
    try:
        return jax.device_put(grid, sharding)
    except ValueError as err:
        if isinstance(sharding.mesh, jax.sharding.Mesh):
            raise
        raise ShardkitValueError(
            f"fftfreq3d: y is traced on an abstract mesh {dict(sharding.mesh.shape)} outside "
            f"jit (under jax.grad or jax.vmap alone), where JAX places no array; fix: pass "
            f"mesh=mesh, or call it inside jax.set_mesh(mesh) or jax.jit."
        ) from err
