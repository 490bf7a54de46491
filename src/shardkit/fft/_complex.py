# ruff: noqa: F722  (jaxtyping shape strings are not Python expressions)
"""Complex-to-complex pencil and slab transforms: `pfft3d`, `pifft3d`, `pfft2d`, `pifft2d`.

The engine transforms the trailing `k` dims of an array inside one `jax.shard_map`. With the FFT
dims sharded `x[X_a, Y_b, Z]` it runs

    FFT over Z        (local)                       x[X_a, Y_b, Z]
    all-to-all over b (split Z, gather Y)      ->   x[X_a, Y, Z_b]     FFT over Y (local)
    all-to-all over a (split Y, gather X)      ->   x[X, Y_a, Z_b]     FFT over X (local)

so the result has the same axis order as `numpy.fft.fftn` with the sharding moved one dim to the
right (the "natural" layout). A mesh axis of size 1, or a missing one, skips its all-to-all: with
`x[X_a, Y, Z]` (a slab) the first two FFTs merge into one local 2-D FFT and one all-to-all
remains. The "transposed" layout rolls the FFT dims locally so the dim transformed last comes
last, `y[Y_a, Z_b, X]`: its PartitionSpec equals the input's, and the inverse starts with a
local FFT over the last dim. The inverse replays the steps backwards, so it returns the input
layout exactly.

Locally every 1-D FFT runs over the trailing dim (XLA's FFT transforms minor dims; `jnp.fft`
along a middle dim adds a transpose on each side): after each all-to-all the block is rotated so
the dim just gathered comes last. Two rotations end in the transposed layout. The natural layout
would cost one more local transpose (X back to the front); instead, when the last all-to-all
leaves X in chunks of at most `_dft.MAX_M` points, the FFT over X runs where the chunks lie as
two matmuls (`_dft`), and the inverse starts the same way. Each all-to-all sends its chunks
along a leading chunk dim (`exchange`), so XLA makes one copy before it (chunking) and one after
it (reassembly and rotation together) instead of a slice copy, a concatenate and a transpose.

A forward 3-D pencil whose X divides by a * b takes a route with fewer local transposes
(`_pencil`): one all-to-all over b that splits X and gathers Y, a local 2-D FFT over Y and Z,
then one all-to-all over both mesh axes that gathers X, in the same output layouts. The data
movement helpers live in `_exchange`.

Inside `jit` on Auto mesh axes, where a traced input's sharding is chosen only when XLA's
partitioner runs, the same per-shard program runs as a custom-partitioned op (`_partitioned`).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Complex, Num

from shardkit.errors import ShardkitValueError
from shardkit.fft import _dft as D
from shardkit.fft import _exchange as E
from shardkit.fft import _layout as L
from shardkit.fft import _partitioned as PT
from shardkit.fft import _pencil as PE
from shardkit.fft import _vmap as V


def _steps(entries: tuple, k: int, mesh_shape: dict[str, int]) -> list[tuple[int, Any]]:
    """The all-to-alls of a forward transform, in order: (FFT dim index i, mesh axis of dim i).

    Step i moves the mesh axis of FFT dim i to FFT dim i + 1; trivial mesh axes are skipped.
    """
    nb = len(entries) - k
    fft = entries[nb:]
    return [(i, fft[i]) for i in range(k - 2, -1, -1) if L.entry_size(fft[i], mesh_shape) > 1]


def _x_by_matmuls(slab: bool, order, x_group: list[int], m: int) -> bool:
    """Whether the FFT over X runs where a slab's all-to-all leaves it, as matmuls (`_dft`):
    the spectrum is in natural `order`, X is transformed alone, in chunks of <= MAX_M points."""
    return slab and list(order) == list(range(len(order))) and x_group == [0] and m <= D.MAX_M


def _groups(k: int, steps: dict, inverse: bool) -> list[tuple[list[int], Any]]:
    """The local FFTs in order: (FFT dims transformed together, the step that follows or None).

    Forward: FFT dim k-1, then for i = k-2 .. 0 move dim i's mesh axis to dim i+1 and FFT i.
    Inverse: the same steps backwards. Dims whose mesh axis is trivial join the next FFT.
    """
    seq = list(range(k - 2, -1, -1)) if not inverse else list(range(k - 1))
    groups, pending = [], [k - 1] if not inverse else [0]
    for i in seq:
        if i in steps:
            groups.append((pending, i))
            pending = []
        pending.append(i if not inverse else i + 1)
    groups.append((pending, None))
    return groups


def _run_local(blk, entries, k, mesh_shape, norm, *, inverse: bool, start, end):
    """Runs the FFT steps on a local block whose FFT dims are stored in order `start`.

    Every 1-D FFT runs over trailing local dims (the fast path of XLA's FFT); each all-to-all
    leaves the block with the next FFT's dims trailing, and the block is transposed to `end` at
    the end. In the natural layout the FFT over the leading dim X, next to the all-to-all that
    gathers or splits X, runs in place as matmuls (`_dft`) when its chunks are small enough.
    """
    nb = blk.ndim - k
    order, natural = list(start), list(range(k))
    fft = jnp.fft.ifftn if inverse else jnp.fft.fftn
    steps = dict(_steps(entries, k, mesh_shape))
    groups = _groups(k, steps, inverse)
    first = groups[0]
    slab = len(steps) == 1  # one all-to-all: it gathers X from, or splits X into, whole slabs
    n = L.entry_size(steps.get(0), mesh_shape)  # X's shards (1 when X is whole)
    if inverse and _x_by_matmuls(slab, order, first[0], blk.shape[nb] // n):
        t = D.inverse_to_chunks(blk, n, nb, norm)  # iFFT over X straight into the chunks to send
        t = E.swap(t, steps[0])
        new = E.trailing_order(order, groups[1][0])
        blk, order, groups = E.reassemble(t, order, 1, new, nb), new, groups[1:]
    for g, (dims, i) in enumerate(groups):
        blk, order = E.to_trailing(blk, order, dims, nb)  # a no-op after an exchange
        blk = fft(blk, axes=list(range(blk.ndim - len(dims), blk.ndim)), norm=norm)
        if i is None:
            break
        split, concat = (i + 1, i) if not inverse else (i, i + 1)
        n = L.entry_size(steps[i], mesh_shape)
        m = blk.shape[nb + order.index(concat)]
        if not inverse and order == natural and _x_by_matmuls(slab, end, groups[-1][0], m):
            # X arrives in chunks already in natural order: the FFT over X by matmuls
            return _gather_x_by_matmuls(blk, steps[i], n, nb, norm)
        new = E.trailing_order(order, groups[g + 1][0])
        blk, order = E.exchange(blk, steps[i], n, order, split, concat, new, nb), new
    if order != list(end):
        perm = list(range(nb)) + [nb + order.index(d) for d in end]
        blk = jnp.transpose(blk, perm)
    return blk


def _gather_x_by_matmuls(blk, axis, n: int, nb: int, norm) -> jax.Array:
    """The all-to-all of a slab's natural layout and the FFT over X: `blk[*B, x2, Y, ..]`
    (Y whole, X split over `axis`, `n` shards) -> `y[*B, KX, Y/n, ..]`.

    Y is cut into the chunks to send (`_dft.planes_to_send`). The exchange and the matmuls
    run in two halves over the last dim when it is even: each half's send buffers and received
    chunks are half the shard, so the temporaries are 1.5 L instead of 2 L. On glibc that also
    keeps the 256^3 slab's temporaries on 8 devices under the 32 MiB above which every call
    maps its block afresh (2 L was 32 MiB and 64 bytes: about 65,000 page faults per call).
    """
    c = blk.reshape(blk.shape[: nb + 1] + (n, blk.shape[nb + 1] // n) + blk.shape[nb + 2 :])
    parts = 2 if c.shape[-1] % 2 == 0 else 1
    halves = [
        D.forward_received(E.swap(D.planes_to_send(h, nb), axis, dim=1), nb, norm)
        for h in jnp.split(c, parts, axis=-1)
    ]
    return jnp.concatenate(halves, axis=-1)


def natural_entries(entries: tuple, k: int) -> tuple:
    """PartitionSpec entries of the natural-layout spectrum of an input with `entries`."""
    nb = len(entries) - k
    return entries[:nb] + (None,) + entries[nb : len(entries) - 1]


def _local(entries: tuple, k: int, mesh_shape: dict, *, inverse: bool, layout: str, norm):
    """The per-shard program of a transform of an input sharded `entries`: (body, in_spec,
    out_spec), where the specs are those of the body's argument and result."""
    in_spec = P(*entries)
    out_spec = P(*natural_entries(entries, k)) if layout == "natural" else in_spec
    natural = list(range(k))
    rolled = natural[1:] + natural[:1]  # [..., Y_a, Z_b, X]: the transposed layout
    spectrum = natural if layout == "natural" else rolled
    start, end = (spectrum, natural) if inverse else (natural, spectrum)

    def body(blk):
        if not inverse and PE.applies(blk.shape, entries, k, mesh_shape):
            return PE.forward(blk, entries, mesh_shape, layout=layout, norm=norm)
        return _run_local(blk, entries, k, mesh_shape, norm, inverse=inverse, start=start, end=end)

    return (body, out_spec, in_spec) if inverse else (body, in_spec, out_spec)


@functools.partial(
    jax.jit,
    static_argnames=("mesh", "entries", "k", "inverse", "layout", "norm", "dtype", "given"),
)
def _c2c(x, *, mesh, entries, k, inverse, layout, norm, dtype, given):
    """The transform of `x`, sharded `given`; `entries` are the forward input's (`validated`)."""
    body, in_spec, out_spec = _local(
        entries, k, dict(mesh.shape), inverse=inverse, layout=layout, norm=norm
    )
    return L.shard_map_as_given(body, mesh, given, in_spec, out_spec)(x.astype(dtype))


def _check_splits(shape: tuple, entries: tuple, k: int, mesh, fname: str) -> None:
    """Every dim that an all-to-all splits must divide into the shards of its mesh axis."""
    nb = len(entries) - k
    for d, e in enumerate(entries):
        L.check_divisible(shape, d, e, mesh, fname, "it is sharded over that mesh axis")
    for i in range(k - 1):
        e = entries[nb + i]
        L.check_divisible(
            shape,
            nb + i + 1,
            e,
            mesh,
            fname,
            f"the transform splits it over the mesh axis of dim {nb + i} in an all-to-all",
        )


def forward(x, *, k, norm, layout, spec, mesh, fname):
    """Validates and runs a forward complex transform over the trailing `k` dims."""
    L.check_choice("norm", norm, L.NORMS, fname)
    L.check_choice("layout", layout, L.LAYOUTS, fname)
    L.check_rank(x, k, fname)
    dtype = L.complex_dtype(x.dtype, fname, allow_real=True)
    if V.is_mapped(x):  # under jax.vmap: one program over the whole batch
        shape = tuple(x.shape) if layout == "natural" else L.roll(tuple(x.shape), k, 1)
        run = functools.partial(forward, k=k, norm=norm, layout=layout, fname=fname)
        return V.call_batched(run, x, spec, mesh, jax.ShapeDtypeStruct(shape, dtype))
    if V.differentiated(x):  # jax.grad or jax.jvp under jax.vmap: derivatives of the batch
        options = dict(k=k, layout=layout, mesh=mesh, fname=fname)
        run = functools.partial(forward, norm=norm, spec=spec, **options)
        back = functools.partial(inverse, norm=PT.ADJOINT_NORM[norm], spec=None, **options)
        return V.call_differentiated(run, PT.conjugated(back), x.astype(dtype))
    if PT.applies(x, spec):  # inside jit on Auto axes: XLA's partitioner lays x out
        return _partitioned(tuple(x.shape), k, norm, layout, False, fname)(x.astype(dtype))
    x, mesh, entries = L.resolve_placed(x, spec, mesh, fname)
    given = entries
    entries = validated(tuple(x.shape), given, k, mesh, inverse=False, layout=layout, fname=fname)
    return _c2c(
        x, mesh=mesh, entries=entries, k=k, inverse=False, layout=layout, norm=norm, dtype=dtype,
        given=given,
    )  # fmt: skip


def validated(shape: tuple, entries: tuple, k: int, mesh, *, inverse, layout, fname) -> tuple:
    """The PartitionSpec entries of the forward input, checked, from those of the argument (the
    input, or for an inverse transform the spectrum in `layout`) of global `shape`.

    A last FFT dim sharded over mesh axes of size 1 only is whole: its entry becomes None (the
    natural layout moves the last entry off the spectrum, and the transposed inverse needs that
    dim whole), which leaves the sharding the same.
    """
    entries = L.whole_if_trivial(entries, dict(mesh.shape))
    if inverse:
        _check_spectrum(entries, k, fname)
        entries = original_entries(entries, k, layout, fname)
        if layout == "transposed":
            shape = L.roll(shape, k, -1)
    L.check_fft_entries(entries, mesh, k, fname, shape=shape)
    _check_splits(shape, entries, k, mesh, fname)
    return entries


@functools.lru_cache(maxsize=64)  # one op per signature: eager calls then hit jit's cache
def _partitioned(
    shape: tuple, k: int, norm, layout: str, inverse: bool, fname: str, cotangent: bool = False
):
    """The custom-partitioned transform of a complex input of `shape`, differentiable and
    batchable (`PT.linear`); its adjoint is the transform the other way (`PT.ADJOINT_NORM`),
    which maps the cotangent back to the argument's layout (`PT.op`'s `cotangent`)."""
    nb = len(shape) - k
    out_shape = shape if layout == "natural" else L.roll(shape, k, -1 if inverse else 1)
    shift = int(layout == "natural")  # FFT dim i's mesh axis moves to dim i + shift
    moves = {nb + i: nb + i + shift for i in range(k - 1)}
    if inverse:
        moves = {e: d for d, e in moves.items()}
    axes = tuple(range(nb, nb + k))

    def reference(a):  # the transform on one device
        if inverse:
            a = a if layout == "natural" else jnp.moveaxis(a, -1, nb)
            return PT.fft(a, axes, norm, inverse=True)
        y = PT.fft(a, axes, norm, inverse=False)
        return y if layout == "natural" else jnp.moveaxis(y, nb, -1)

    def plan(mesh, entries):
        ins = validated(shape, entries, k, mesh, inverse=inverse, layout=layout, fname=fname)
        return _local(ins, k, dict(mesh.shape), inverse=inverse, layout=layout, norm=norm)

    def adjoint():
        return PT.conjugated(
            _partitioned(out_shape, k, PT.ADJOINT_NORM[norm], layout, not inverse, fname, True)
        )

    rule = PT.moved_rule(shape, out_shape, moves)
    op = PT.op(plan=plan, reference=reference, rule=rule, fname=fname, cotangent=cotangent)
    batched = lambda b: _partitioned(b, k, norm, layout, inverse, fname, cotangent)  # noqa: E731
    return PT.linear(op, adjoint, batched)


def _check_spectrum(entries: tuple, k: int, fname: str) -> None:
    """Raises for a spectrum no complex forward transform makes: an FFT dim sharded over
    several mesh axes, the layout of `prfft3d`'s half spectrum on a slab."""
    multi = L.multi_axis_dim(entries, k)
    if multi is not None:
        raise ShardkitValueError(
            f"{fname}: y's dim {multi[0]} is sharded over several mesh axes {multi[1]} "
            f"(spec {P(*entries)}), which no complex forward transform gives its spectrum; "
            f"prfft3d's half spectrum is laid out so; fix: invert a half spectrum with "
            f"pirfft3d, or pass {fname} the output of the complex forward transform."
        )


def original_entries(entries: tuple, k: int, layout: str, fname: str) -> tuple:
    """The input PartitionSpec entries a spectrum with `entries` and `layout` came from."""
    nb = len(entries) - k
    fft = entries[nb:]
    if layout == "natural":
        if fft[0] is not None:
            raise ShardkitValueError(
                f"{fname}: with layout='natural' the spectrum's first FFT dim (dim {nb}) must be "
                f"whole, but the spectrum is sharded {P(*entries)}; fix: pass "
                f"layout='transposed' if it came from a forward transform with that layout."
            )
        return entries[:nb] + fft[1:] + (None,)
    if fft[-1] is not None:
        raise ShardkitValueError(
            f"{fname}: with layout='transposed' the spectrum's last dim (dim {len(entries) - 1}) "
            f"must be whole, but the spectrum is sharded {P(*entries)}; fix: pass "
            f"layout='natural' if it came from a forward transform with that layout."
        )
    return entries


def inverse(y, *, k, norm, layout, spec, mesh, fname):
    """Validates and runs an inverse complex transform over the trailing `k` dims."""
    L.check_choice("norm", norm, L.NORMS, fname)
    L.check_choice("layout", layout, L.LAYOUTS, fname)
    L.check_rank(y, k, fname)
    dtype = L.complex_dtype(y.dtype, fname, allow_real=False)
    if V.is_mapped(y):  # under jax.vmap: one program over the whole batch
        shape = tuple(y.shape) if layout == "natural" else L.roll(tuple(y.shape), k, -1)
        run = functools.partial(inverse, k=k, norm=norm, layout=layout, fname=fname)
        return V.call_batched(run, y, spec, mesh, jax.ShapeDtypeStruct(shape, dtype))
    if V.differentiated(y):  # jax.grad or jax.jvp under jax.vmap: derivatives of the batch
        options = dict(k=k, layout=layout, mesh=mesh, fname=fname)
        run = functools.partial(inverse, norm=norm, spec=spec, **options)
        back = functools.partial(forward, norm=PT.ADJOINT_NORM[norm], spec=None, **options)
        return V.call_differentiated(run, PT.conjugated(back), y)
    if PT.applies(y, spec):  # inside jit on Auto axes: XLA's partitioner lays y out
        return _partitioned(tuple(y.shape), k, norm, layout, True, fname)(y)
    y, mesh, spec_entries = L.resolve_placed(y, spec, mesh, fname)
    entries = validated(
        tuple(y.shape), spec_entries, k, mesh, inverse=True, layout=layout, fname=fname
    )
    return _c2c(
        y, mesh=mesh, entries=entries, k=k, inverse=True, layout=layout, norm=norm, dtype=dtype,
        given=spec_entries,
    )  # fmt: skip


def layout_of(shape: tuple, entries: tuple, k: int, layout: str) -> L.SpectralLayout:
    """Where the complex spectrum of an input of `shape` sharded `entries` lives."""
    axes = tuple(range(len(shape)))
    if layout == "natural":
        return L.SpectralLayout(tuple(shape), P(*natural_entries(entries, k)), axes)
    return L.SpectralLayout(L.roll(tuple(shape), k, 1), P(*entries), L.roll(axes, k, 1))


def pfft3d(
    x: Num[Array, "*batch x y z"],
    *,
    norm: str | None = "backward",
    layout: L.Layout = "natural",
    spec: P | None = None,
    mesh: Any = None,
) -> Complex[Array, "*batch kx ky kz"]:
    """Distributed 3-D FFT over the last three dims: pencil or slab, never gathering.

    The input `x[..., X_a, Y_b, Z]` is sharded over one or two mesh axes on its first two FFT
    dims (the last must be whole). With two mesh axes of size > 1 this is a pencil transform
    (two all-to-alls: over b, then over both mesh axes when X divides by a * b, else over each
    mesh axis in turn; docs/fft.md); with one (a 1-D mesh, a mesh axis of size 1, or `P('x')`)
    a slab transform (one all-to-all and a local 2-D FFT). Leading dims are batch
    dims and keep their sharding. The whole transform is one jitted program; inside a user's
    `jit` it is inlined.

    Output layouts (query them without computing with `spectral_layout`):

    - `"natural"`: same axis order as `numpy.fft.fftn`, sharding moved one dim right:
      `x[X_a, Y_b, Z] -> y[KX, KY_a, KZ_b]`, spec `P(None, 'a', 'b')`.
    - `"transposed"`: FFT dims rolled left, `y[KY_a, KZ_b, KX]` with the input's spec; equals
      `jnp.moveaxis(natural, -3, -1)`. It saves a local transpose each way on a round trip and
      matches jaxDecomp's default (contiguous) layout.

    Args:
        x: real or complex array, rank >= 3, sharded as above. Real input is transformed as
            complex (complex64 for float32, complex128 for float64).
        norm: `"backward"` (default), `"ortho"` or `"forward"`, as in `numpy.fft`.
        layout: `"natural"` or `"transposed"`, see above.
        spec: the PartitionSpec of `x`, read from `x` when not given. For a traced `x` on Auto
            mesh axes (inside `jit`) without it, XLA's partitioner chooses the sharding when it
            compiles the program, and the transform follows it (docs/fft.md); pass it to fix
            the sharding yourself, or for forward-mode autodiff there.
        mesh: the mesh of `x` when it cannot be read from `x` or from `jax.set_mesh`.

    Returns:
        The complex spectrum, sharded as the chosen layout says.

    Raises:
        ValueError: rank < 3; the last dim sharded; `x` not sharded; a mesh axis that shards no
            dim (e.g. a 3-axis mesh); a dim that does not divide into its shards; a bad `norm`
            or `layout`; a `spec` that contradicts the sharding of `x`.
        TypeError: a non-floating dtype.

    Example:
        >>> mesh = jax.make_mesh((2, 4), ("x", "y"))
        >>> x = jax.device_put(jnp.ones((16, 16, 16)), NamedSharding(mesh, P("x", "y")))
        >>> y = shardkit.fft.pfft3d(x)
        >>> y.sharding.spec
        P(None, 'x', 'y')
        >>> bool(np.allclose(y, np.fft.fftn(np.asarray(x)), atol=1e-3))
        True

    See also:
        `pifft3d` (inverse), `prfft3d` (real input), `spectral_layout`, `fftfreq3d`.
    """
    return forward(x, k=3, norm=norm, layout=layout, spec=spec, mesh=mesh, fname="pfft3d")


def pifft3d(
    y: Complex[Array, "*batch kx ky kz"],
    *,
    norm: str | None = "backward",
    layout: L.Layout = "natural",
    spec: P | None = None,
    mesh: Any = None,
) -> Complex[Array, "*batch x y z"]:
    """Inverse of `pfft3d`: returns the input layout exactly, from either output layout.

    Args:
        y: complex spectrum in the layout `pfft3d` produced (`y[KX, KY_a, KZ_b]` for
            `"natural"`, `y[KY_a, KZ_b, KX]` for `"transposed"`).
        norm: `"backward"` (default), `"ortho"` or `"forward"`, as in `numpy.fft`.
        layout: the layout `y` is in; must be the one passed to `pfft3d`.
        spec: the PartitionSpec of `y`; optional, as for `pfft3d`.
        mesh: the mesh of `y` when it cannot be read from `y` or from `jax.set_mesh`.

    Returns:
        The complex field `x[..., X_a, Y_b, Z]`, with the spec the forward input had.

    Raises:
        ValueError: as `pfft3d`, and a spectrum whose sharding does not fit `layout`.
        TypeError: a real `y` (use `pirfft3d` for half spectra).

    Example:
        >>> y = shardkit.fft.pfft3d(x, layout="transposed")
        >>> x2 = shardkit.fft.pifft3d(y, layout="transposed")
        >>> x2.sharding.is_equivalent_to(x.sharding, x.ndim)
        True

    See also:
        `pfft3d`, `pirfft3d`.
    """
    return inverse(y, k=3, norm=norm, layout=layout, spec=spec, mesh=mesh, fname="pifft3d")


def pfft2d(
    x: Num[Array, "*batch x y"],
    *,
    norm: str | None = "backward",
    layout: L.Layout = "natural",
    spec: P | None = None,
    mesh: Any = None,
) -> Complex[Array, "*batch kx ky"]:
    """Distributed 2-D FFT over the last two dims with one all-to-all, never gathering.

    The input `x[..., X_a, Y]` has its first FFT dim sharded over one mesh axis; leading batch
    dims may be sharded over other mesh axes. Layouts: `"natural"` gives `y[..., KX, KY_a]`,
    `"transposed"` gives `y[..., KY_a, KX]` (the input's spec).

    Args:
        x: real or complex array of rank >= 2.
        norm: `"backward"` (default), `"ortho"` or `"forward"`, as in `numpy.fft`.
        layout: `"natural"` or `"transposed"`.
        spec: the PartitionSpec of `x`; optional, as for `pfft3d`.
        mesh: the mesh of `x` when it cannot be read from `x` or from `jax.set_mesh`.

    Returns:
        The complex spectrum in the chosen layout.

    Raises:
        ValueError, TypeError: as `pfft3d`.

    Example:
        >>> mesh = jax.make_mesh((8,), ("x",))
        >>> x = jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P("x")))
        >>> shardkit.fft.pfft2d(x).sharding.spec
        P(None, 'x')

    See also:
        `pifft2d`, `pfft3d`, `batched_fftn`.
    """
    return forward(x, k=2, norm=norm, layout=layout, spec=spec, mesh=mesh, fname="pfft2d")


def pifft2d(
    y: Complex[Array, "*batch kx ky"],
    *,
    norm: str | None = "backward",
    layout: L.Layout = "natural",
    spec: P | None = None,
    mesh: Any = None,
) -> Complex[Array, "*batch x y"]:
    """Inverse of `pfft2d`: returns the input layout exactly.

    Args:
        y: complex spectrum in the layout `pfft2d` produced.
        norm: `"backward"` (default), `"ortho"` or `"forward"`, as in `numpy.fft`.
        layout: the layout `y` is in.
        spec: the PartitionSpec of `y`; optional, as for `pfft3d`.
        mesh: the mesh of `y` when it cannot be read from `y` or from `jax.set_mesh`.

    Returns:
        The complex field with the forward input's spec.

    Raises:
        ValueError, TypeError: as `pifft3d`.

    Example:
        >>> x2 = shardkit.fft.pifft2d(shardkit.fft.pfft2d(x))

    See also:
        `pfft2d`.
    """
    return inverse(y, k=2, norm=norm, layout=layout, spec=spec, mesh=mesh, fname="pifft2d")
