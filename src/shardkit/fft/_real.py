# ruff: noqa: F722  (jaxtyping shape strings are not Python expressions)
"""Real-to-complex pencil and slab transforms: `prfft3d` and `pirfft3d`.

The half-spectrum dim (Z // 2 + 1 frequencies) is odd for most sizes and JAX arrays cannot be
unevenly sharded (`NamedSharding` refuses a dim that does not divide into its shards), so a
half spectrum sharded over a mesh axis would need visible padding. Instead the half-spectrum dim
stays whole on every device and the other two FFT dims carry the sharding. With the input
`x[X_a, Y_b, Z]` and both mesh axes of size > 1:

    real FFT over Z    (local)                              [X_a, Y_b, KZ]
    all-to-all over b  (split X, gather Y)             ->   [X_ab, Y, KZ]     FFT over Y
    all-to-all over (a, b) (split Y, gather X)         ->   [X, Y_ab, KZ]     FFT over X

Two all-to-alls, no padding, any Z (odd Z included); X and Y must divide by a * b. A slab
(`x[X_a, Y, Z]` or `x[X, Y_b, Z]`) does a local 2-D real FFT and one all-to-all. The transposed
layout rolls the FFT dims as for the complex transforms: `[KY_ab, KZ, KX]`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Complex, Float

from shardkit.errors import ShardkitTypeError, ShardkitValueError
from shardkit.fft import _layout as L
from shardkit.fft import _partitioned as PT
from shardkit.fft import _vmap as V
from shardkit.fft._exchange import exchange, to_trailing, trailing_order


def _kind(a, b, mesh_shape) -> str:
    """Which decomposition a real transform of `x[X_a, Y_b, Z]` uses ("local" when the FFT
    dims are whole and only batch dims are sharded)."""
    act_a = L.entry_size(a, mesh_shape) > 1
    act_b = L.entry_size(b, mesh_shape) > 1
    if act_a and act_b:
        return "pencil"
    return "slab_x" if act_a else ("slab_y" if act_b else "local")


def natural_entries(a, b, kind: str) -> tuple:
    """PartitionSpec entries of the FFT dims of the natural-layout half spectrum."""
    if kind == "pencil":
        return (None, (a, b), None)
    if kind == "slab_x":
        return (None, a, b)
    return (b, a, None)  # slab_y, and "local" (a and b shard nothing)


@functools.partial(
    jax.jit,
    static_argnames=("mesh", "batch", "ab", "inverse", "layout", "norm", "n", "dtype", "given"),
)
def _r2c(x, *, mesh, batch, ab, inverse, layout, norm, n, dtype, given=None):
    """The real transform of `x`; a forward input is sharded `given` (`L.shard_map_as_given`)."""
    a, b = ab
    nb = len(batch)
    kind = _kind(a, b, dict(mesh.shape))
    in_spec = P(*batch, a, b, None)
    nat = batch + natural_entries(a, b, kind)
    out_spec = P(*nat) if layout == "natural" else P(*L.roll(nat, 3, 1))
    X, Y, Z = nb, nb + 1, nb + 2  # local dim indices of the FFT dims

    spectrum = [0, 1, 2] if layout == "natural" else [1, 2, 0]

    def to(blk, order, end):  # final local transpose to the FFT-dim order `end`
        if order == end:
            return blk
        return jnp.transpose(blk, list(range(nb)) + [nb + order.index(d) for d in end])

    def a2a(blk, order, axis, split, concat, new):  # returns the block stored in order `new`
        n = L.entry_size(axis, dict(mesh.shape))
        return exchange(blk, axis, n, order, split, concat, new, nb), new

    def a2a_to(blk, order, axis, split, concat, dims):  # ... with `dims` trailing for the FFT
        return a2a(blk, order, axis, split, concat, trailing_order(order, dims))

    def forward(blk):
        # `order` lists the FFT dims (0=X, 1=Y, 2=Z) in local storage order; every FFT runs
        # over trailing local dims (see _complex.to_trailing).
        order = [0, 1, 2]
        if kind == "local":
            return to(jnp.fft.rfftn(blk, axes=(X, Y, Z), norm=norm), order, spectrum)
        if kind == "pencil":
            blk = jnp.fft.rfft(blk, axis=-1, norm=norm)  # [X_a, Y_b, KZ]
            blk, order = a2a_to(blk, order, b, 0, 1, [1])  # [X_ab, Y, KZ]
            blk = jnp.fft.fft(blk, axis=-1, norm=norm)
            blk, order = a2a_to(blk, order, (a, b), 1, 0, [0])  # [X, Y_ab, KZ]
        elif kind == "slab_x":
            blk = jnp.fft.rfftn(blk, axes=(Y, Z), norm=norm)  # [X_a, KY, KZ]
            blk, order = a2a_to(blk, order, a, 1, 0, [0])  # [X, Y_a, KZ]
        else:
            blk = jnp.fft.rfftn(blk, axes=(X, Z), norm=norm)  # [KX, Y_b, KZ]
            blk, order = a2a_to(blk, order, b, 0, 1, [1])  # [X_b, Y, KZ]
        blk = jnp.fft.fft(blk, axis=-1, norm=norm)
        return to(blk, order, spectrum)

    def inverse_(blk):
        order = list(spectrum)
        if kind == "local":
            blk = to(blk, order, [0, 1, 2])
            return jnp.fft.irfftn(blk, s=(blk.shape[X], blk.shape[Y], n), axes=(X, Y, Z), norm=norm)
        if kind == "slab_y":
            blk, order = to_trailing(blk, order, [1], nb)
            blk = jnp.fft.ifft(blk, axis=-1, norm=norm)
            blk, order = a2a(blk, order, b, 1, 0, [0, 1, 2])  # [KX, Y_b, KZ]
            return jnp.fft.irfftn(blk, s=(blk.shape[X], n), axes=(X, Z), norm=norm)
        blk, order = to_trailing(blk, order, [0], nb)
        blk = jnp.fft.ifft(blk, axis=-1, norm=norm)
        if kind == "slab_x":
            blk, order = a2a(blk, order, a, 0, 1, [0, 1, 2])  # [X_a, KY, KZ]
            return jnp.fft.irfftn(blk, s=(blk.shape[Y], n), axes=(Y, Z), norm=norm)
        blk, order = a2a_to(blk, order, (a, b), 0, 1, [1])  # [X_ab, Y, KZ]
        blk = jnp.fft.ifft(blk, axis=-1, norm=norm)
        blk, order = a2a_to(blk, order, b, 1, 0, [2])  # [X_a, Y_b, KZ]
        blk = jnp.fft.irfft(blk, n=n, axis=-1, norm=norm)
        return to(blk, order, [0, 1, 2])

    if inverse:
        return jax.shard_map(inverse_, mesh=mesh, in_specs=out_spec, out_specs=in_spec)(
            x.astype(dtype)
        )
    run = L.shard_map_as_given(forward, mesh, given or tuple(in_spec), in_spec, out_spec)
    return run(x.astype(dtype))


def check_sizes(shape: tuple, batch: tuple, a, b, mesh, fname: str) -> None:
    nb = len(batch)
    for d, e in enumerate(batch + (a, b, None)):
        L.check_divisible(shape, d, e, mesh, fname, "it is sharded over that mesh axis")
    kind = _kind(a, b, dict(mesh.shape))
    why = "the real transform splits it in an all-to-all"
    if kind == "pencil":
        L.check_divisible(shape, nb, (a, b), mesh, fname, why)
        L.check_divisible(shape, nb + 1, (a, b), mesh, fname, why)
    elif kind == "slab_x":
        L.check_divisible(shape, nb + 1, a, mesh, fname, why)
    elif kind == "slab_y":
        L.check_divisible(shape, nb, b, mesh, fname, why)


def _real_dtype(dtype, fname: str):
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ShardkitTypeError(
            f"{fname}: x has dtype {dtype} but a real-to-complex transform needs a real floating "
            f"input (float32 or float64); fix: use pfft3d for complex input, or "
            f"x.astype(jnp.float32)."
        )
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def layout_of(shape: tuple, entries: tuple, mesh, layout: str) -> L.SpectralLayout:
    """Where the half spectrum of an input of `shape` sharded `entries` lives."""
    nb = len(shape) - 3
    a, b = entries[nb], entries[nb + 1]
    nat = entries[:nb] + natural_entries(a, b, _kind(a, b, dict(mesh.shape)))
    kshape = tuple(shape[:-1]) + (shape[-1] // 2 + 1,)
    axes = tuple(range(len(shape)))
    if layout == "natural":
        return L.SpectralLayout(kshape, P(*nat), axes)
    return L.SpectralLayout(L.roll(kshape, 3, 1), P(*L.roll(nat, 3, 1)), L.roll(axes, 3, 1))


def _kz_dim(layout: str) -> int:
    """The dim of the half spectrum's KZ frequencies in `layout`: last, or next to last."""
    return -1 if layout == "natural" else -2


def _half_weights(kz: int, z: int, value: float, layout: str, dtype) -> jax.Array:
    """`value` along the half-spectrum dim KZ (of `kz` frequencies of a length-`z` real dim),
    except 1 at frequency 0 and, for even `z`, at z/2: the frequencies the half spectrum holds
    once rather than with their mirror image. Shaped to broadcast against a spectrum."""
    w = np.full(kz, value)
    w[0] = 1.0
    if z % 2 == 0:
        w[-1] = 1.0
    return jnp.asarray(w if layout == "natural" else w[:, None], dtype)


def _rfft_adjoint(ct, *, z: int, norm, layout: str, spec: P | None, mesh: Any):
    """The VJP of `prfft3d` on cotangent `ct` (JAX's convention: the transpose of the linear
    map): Re(F(ct padded to the full spectrum)), which is the inverse real transform of
    conj(ct) with the mirrored frequencies halved (`_half_weights`)."""
    w = _half_weights(ct.shape[_kz_dim(layout)], z, 0.5, layout, ct.real.dtype)
    y = jnp.conj(ct) * w
    return pirfft3d(y, n=z, norm=PT.ADJOINT_NORM[norm], layout=layout, spec=spec, mesh=mesh)


def _irfft_adjoint(ct, *, kz: int, n: int, norm, layout: str, spec: P | None, mesh: Any):
    """The VJP of `pirfft3d` on a real cotangent `ct`: the forward real transform, the
    mirrored frequencies doubled (`_half_weights`), conjugated."""
    y = prfft3d(ct, norm=PT.ADJOINT_NORM[norm], layout=layout, spec=spec, mesh=mesh)
    return jnp.conj(y * _half_weights(kz, n, 2.0, layout, ct.dtype))


def _spectrum_spec(x, spec: P | None, mesh: Any, layout: str, fname: str) -> P | None:
    """The spec of the half spectrum of `x` sharded `spec` (None when `spec` is: the adjoint
    then reads its cotangent's own)."""
    if spec is None:
        return None
    mesh, entries = L.resolve(x, spec, mesh, fname)
    return layout_of(tuple(x.shape), entries, mesh, layout).spec


def _field_spec(y, spec: P | None, mesh: Any, layout: str, fname: str) -> P | None:
    """The spec of the real field whose half spectrum `y` is sharded `spec` (or None)."""
    if spec is None:
        return None
    mesh, entries = L.resolve(y, spec, mesh, fname)
    entries = entries if layout == "natural" else L.roll(entries, 3, -1)
    a, b = _original_ab(entries[-3:], dict(mesh.shape), fname)
    return P(*entries[:-3], a, b, None)


def prfft3d(
    x: Float[Array, "*batch x y z"],
    *,
    norm: str | None = "backward",
    layout: L.Layout = "natural",
    spec: P | None = None,
    mesh: Any = None,
) -> Complex[Array, "*batch kx ky kz"]:
    """Distributed real-to-complex 3-D FFT (`numpy.fft.rfftn`), never gathering, never padding.

    The input `x[..., X_a, Y_b, Z]` is real and sharded as for `pfft3d`. The half-spectrum dim
    (Z // 2 + 1 frequencies, for any Z, odd included) stays whole on every device so no padding
    is ever needed or seen:

    - pencil (two mesh axes of size > 1): natural `y[KX, KY_ab, KZ]` (spec
      `P(None, ('a', 'b'), None)`); two all-to-alls, the second over both mesh axes. X and Y
      must divide by a * b.
    - slab over X (`x[X_a, Y, Z]`): natural `y[KX, KY_a, KZ]`, one all-to-all.
    - slab over Y (`x[X, Y_b, Z]`): natural `y[KX_b, KY, KZ]`, one all-to-all.

    `"transposed"` rolls the FFT dims left (`jnp.moveaxis(natural, -3, -1)`), e.g.
    `y[KY_ab, KZ, KX]`. `spectral_layout(x, real=True)` returns shape and spec without computing.

    Args:
        x: float32 or float64 array of rank >= 3 (leading dims are batch dims).
        norm: `"backward"` (default), `"ortho"` or `"forward"`, as in `numpy.fft`.
        layout: `"natural"` or `"transposed"`.
        spec: the PartitionSpec of `x`, needed only inside `jit` on Auto mesh axes.
        mesh: the mesh of `x` when it cannot be read from `x` or from `jax.set_mesh`.

    Returns:
        The half spectrum, complex64 (float32 input) or complex128 (float64 input).

    Raises:
        ValueError: as `pfft3d`.
        TypeError: a complex or integer `x`.

    Example:
        >>> mesh = jax.make_mesh((2, 4), ("x", "y"))
        >>> x = jax.device_put(jnp.ones((16, 16, 15)), NamedSharding(mesh, P("x", "y")))
        >>> y = shardkit.fft.prfft3d(x)
        >>> y.shape, y.sharding.spec
        ((16, 16, 8), P(None, ('x', 'y'), None))

    See also:
        `pirfft3d`, `pfft3d`, `fftfreq3d` (with `real=True`).
    """
    fname = "prfft3d"
    L.check_choice("norm", norm, L.NORMS, fname)
    L.check_choice("layout", layout, L.LAYOUTS, fname)
    L.check_rank(x, 3, fname)
    rdtype = _real_dtype(x.dtype, fname)
    if V.is_mapped(x):  # under jax.vmap: one program over the whole batch
        kshape = tuple(x.shape[:-1]) + (x.shape[-1] // 2 + 1,)
        kshape = kshape if layout == "natural" else L.roll(kshape, 3, 1)
        cdtype = jnp.complex128 if rdtype == jnp.float64 else jnp.complex64
        run = functools.partial(prfft3d, norm=norm, layout=layout)
        return V.call_batched(run, x, spec, mesh, jax.ShapeDtypeStruct(kshape, cdtype))
    if V.differentiated(x):  # jax.grad or jax.jvp under jax.vmap: derivatives of the batch
        run = functools.partial(prfft3d, norm=norm, layout=layout, spec=spec, mesh=mesh)
        kspec = _spectrum_spec(x, spec, mesh, layout, fname)
        back = functools.partial(
            _rfft_adjoint, z=x.shape[-1], norm=norm, layout=layout, spec=kspec, mesh=mesh
        )
        return V.call_differentiated(run, back, x.astype(rdtype))
    x, mesh, entries = L.resolve_placed(x, spec, mesh, fname)
    L.check_fft_entries(entries, mesh, 3, fname, shape=tuple(x.shape))
    batch, a, b = entries[:-3], entries[-3], entries[-2]
    check_sizes(tuple(x.shape), batch, a, b, mesh, fname)
    return _r2c(
        x,
        mesh=mesh,
        batch=batch,
        ab=(a, b),
        inverse=False,
        layout=layout,
        norm=norm,
        n=None,
        dtype=rdtype,
        given=entries,
    )


def _original_ab(kent: tuple, mesh_shape: dict, fname: str) -> tuple:
    """The input mesh axes (a, b) of a half spectrum whose natural FFT-dim entries are `kent`."""
    s0, s1, s2 = kent
    active = lambda e: L.entry_size(e, mesh_shape) > 1  # noqa: E731
    pair = isinstance(s1, tuple) and len(s1) == 2 and s0 is None and s2 is None
    if pair and all(active(n) for n in s1):
        return s1
    if s0 is None and not isinstance(s1, tuple) and active(s1) and not active(s2):
        return s1, s2
    if not isinstance(s0, tuple) and active(s0) and s2 is None and not active(s1):
        return s1, s0
    if not any(active(e) for e in kent):  # FFT dims whole: only batch dims are sharded
        return s1, s0
    raise ShardkitValueError(
        f"{fname}: the half spectrum's FFT dims are sharded {P(*kent)} (natural order), which "
        f"is not a layout prfft3d produces: P(None, ('a', 'b'), None), P(None, 'a', None) or "
        f"P('b', None, None) (rolled left for layout='transposed'); fix: pass the output of "
        f"prfft3d with the same layout= it was made with."
    )


def pirfft3d(
    y: Complex[Array, "*batch kx ky kz"],
    *,
    n: int | None = None,
    norm: str | None = "backward",
    layout: L.Layout = "natural",
    spec: P | None = None,
    mesh: Any = None,
) -> Float[Array, "*batch x y z"]:
    """Inverse of `prfft3d` (`numpy.fft.irfftn`): returns the real field in its input layout.

    Args:
        y: half spectrum in the layout `prfft3d` produced.
        n: length of the last dim of the real output; default `2 * (KZ - 1)` as in numpy (pass
            it for odd sizes).
        norm: `"backward"` (default), `"ortho"` or `"forward"`, as in `numpy.fft`.
        layout: the layout `y` is in; must be the one passed to `prfft3d`.
        spec: the PartitionSpec of `y`, needed only inside `jit` on Auto mesh axes.
        mesh: the mesh of `y` when it cannot be read from `y` or from `jax.set_mesh`.

    Returns:
        The real field `x[..., X_a, Y_b, Z]`, float32 (complex64 input) or float64.

    Raises:
        ValueError: a sharding that `prfft3d` does not produce, an `n` that does not match the
            half-spectrum size, and the errors of `prfft3d`.
        TypeError: a real `y`.

    Example:
        >>> x2 = shardkit.fft.pirfft3d(shardkit.fft.prfft3d(x), n=x.shape[-1])

    See also:
        `prfft3d`, `pifft3d`.
    """
    fname = "pirfft3d"
    L.check_choice("norm", norm, L.NORMS, fname)
    L.check_choice("layout", layout, L.LAYOUTS, fname)
    L.check_rank(y, 3, fname)
    if n is not None:
        L.check_int("n", n, fname)
    cdtype = L.complex_dtype(y.dtype, fname, allow_real=False)
    if V.is_mapped(y):  # under jax.vmap: one program over the whole batch
        kshape = tuple(y.shape) if layout == "natural" else L.roll(tuple(y.shape), 3, -1)
        shape = kshape[:-1] + (2 * (kshape[-1] - 1) if n is None else n,)
        rdtype = jnp.float64 if cdtype == jnp.complex128 else jnp.float32
        run = functools.partial(pirfft3d, n=n, norm=norm, layout=layout)
        return V.call_batched(run, y, spec, mesh, jax.ShapeDtypeStruct(shape, rdtype))
    if V.differentiated(y):  # jax.grad or jax.jvp under jax.vmap: derivatives of the batch
        kz = y.shape[_kz_dim(layout)]
        n = 2 * (kz - 1) if n is None else n
        run = functools.partial(pirfft3d, n=n, norm=norm, layout=layout, spec=spec, mesh=mesh)
        fspec = _field_spec(y, spec, mesh, layout, fname)
        back = functools.partial(
            _irfft_adjoint, kz=kz, n=n, norm=norm, layout=layout, spec=fspec, mesh=mesh
        )
        return V.call_differentiated(run, back, y)
    y, mesh, entries = L.resolve_placed(y, spec, mesh, fname)
    kshape = tuple(y.shape)
    if layout == "transposed":
        entries, kshape = L.roll(entries, 3, -1), L.roll(kshape, 3, -1)
    kz = kshape[-1]
    if n is None:
        n = 2 * (kz - 1)
    if n < 1 or n // 2 + 1 != kz:
        raise ShardkitValueError(
            f"{fname}: n={n} does not match the half spectrum: its last frequency dim has "
            f"{kz} entries, which fits n = {2 * (kz - 1)} or {2 * kz - 1}; fix: pass n= the "
            f"length of the last dim of the original real field."
        )
    batch = entries[:-3]
    a, b = _original_ab(entries[-3:], dict(mesh.shape), fname)
    L.check_fft_entries(batch + (a, b, None), mesh, 3, fname, shape=kshape[:-1] + (n,))
    check_sizes(kshape[:-1] + (n,), batch, a, b, mesh, fname)
    return _r2c(
        y,
        mesh=mesh,
        batch=batch,
        ab=(a, b),
        inverse=True,
        layout=layout,
        norm=norm,
        n=n,
        dtype=cdtype,
    )
