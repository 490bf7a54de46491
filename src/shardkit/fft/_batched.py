# ruff: noqa: F722  (jaxtyping shape strings are not Python expressions)
"""FFTs along unsharded dims of a sharded array, with zero collectives.

`jnp.fft.fftn` over the unsharded dims of a batch-sharded array all-gathers the whole array on
today's XLA (jax issues 13081 and 15680, openxla/xla issue 24). Running the same transform
inside `jax.shard_map` with the array's own spec keeps every shard where it is.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Complex, Num

from shardkit.errors import ShardkitTypeError, ShardkitValueError
from shardkit.fft import _layout as L
from shardkit.fft import _partitioned as PT
from shardkit.fft import _vmap as V


def _body(axes: tuple, inverse: bool, norm):
    """The per-shard program: the transform of the local block (whole along `axes`)."""
    return functools.partial(jnp.fft.ifftn if inverse else jnp.fft.fftn, axes=axes, norm=norm)


@functools.partial(jax.jit, static_argnames=("mesh", "entries", "axes", "inverse", "norm"))
def _local(x, *, mesh, entries, axes, inverse, norm):
    spec = P(*entries)
    body = _body(axes, inverse, norm)
    return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)(x)


def _run(x, axes, norm, spec, mesh, inverse, fname):
    L.check_choice("norm", norm, L.NORMS, fname)
    L.check_array(x, fname)
    dtype = L.complex_dtype(x.dtype, fname, allow_real=not inverse)
    axes = _checked_axes(axes, tuple(x.shape), fname)
    if V.is_mapped(x):  # under jax.vmap: one program over the whole batch, mapped dim first
        shifted = tuple(ax + 1 for ax in axes)
        run = lambda a, spec, mesh: _run(a, shifted, norm, spec, mesh, inverse, fname)  # noqa: E731
        return V.call_batched(run, x, spec, mesh, jax.ShapeDtypeStruct(tuple(x.shape), dtype))
    if V.differentiated(x):  # jax.grad or jax.jvp under jax.vmap: derivatives of the batch
        run = lambda a: _run(a, axes, norm, spec, mesh, inverse, fname)  # noqa: E731
        back = lambda c: _run(c, axes, PT.ADJOINT_NORM[norm], None, mesh, not inverse, fname)  # noqa: E731
        return V.call_differentiated(run, PT.conjugated(back), x.astype(dtype))
    if PT.applies(x, spec):  # inside jit on Auto axes: XLA's partitioner lays x out
        return _partitioned(tuple(x.shape), axes, norm, inverse, fname)(x.astype(dtype))
    x, mesh, entries = L.resolve_placed(x, spec, mesh, fname)
    _checked(tuple(x.shape), entries, mesh, axes, fname)
    return _local(x, mesh=mesh, entries=entries, axes=axes, inverse=inverse, norm=norm)


def _checked_axes(axes: Any, shape: tuple, fname: str) -> tuple[int, ...]:
    """`axes=` as sorted non-negative dims, or an error: not ints, out of range, or a dim
    named twice (numpy would transform it twice, `jnp.fft.fftn` refuses)."""
    ndim, arg = len(shape), L.arg_name(fname)
    if axes is None:
        return tuple(range(ndim))
    if not isinstance(axes, Sequence) or not all(
        isinstance(ax, int | np.integer) and not isinstance(ax, bool) for ax in axes
    ):
        raise ShardkitTypeError(
            f"{fname}: axes={axes!r} is not a sequence of ints; fix: pass the dims to "
            f"transform as a tuple, e.g. axes=(1, 2)."
        )
    axes = tuple(int(ax) for ax in axes)
    for ax in axes:
        if not -ndim <= ax < ndim:
            raise ShardkitValueError(
                f"{fname}: axes={axes} names dim {ax}, but {arg} has rank {ndim} (shape "
                f"{shape}); fix: pass dims between {-ndim} and {ndim - 1}."
            )
    seen: set[int] = set()
    for ax in axes:
        if ax % ndim in seen:
            raise ShardkitValueError(
                f"{fname}: axes={axes} names dim {ax % ndim} twice ({arg} has shape {shape}); "
                f"jnp.fft.fftn refuses repeated axes too; fix: name each dim once, e.g. "
                f"axes={tuple(sorted({a % ndim for a in axes}))}, and call again to transform "
                f"a dim twice."
            )
        seen.add(ax % ndim)
    return tuple(sorted(seen))


def _checked(shape: tuple, entries: tuple, mesh, axes: tuple, fname: str) -> None:
    """Raises ValueError when a transformed dim is sharded."""
    mesh_shape = dict(mesh.shape)
    for ax in axes:
        if L.entry_size(entries[ax], mesh_shape) > 1:
            raise ShardkitValueError(
                f"{fname}: dim {ax} (size {shape[ax]}) is sharded over mesh axis "
                f"{entries[ax]!r} (spec {P(*entries)}), but this transform only runs along "
                f"unsharded dims; fix: use pfft2d/pfft3d for a transform over a sharded dim, "
                f"or drop dim {ax} from axes=."
            )


@functools.lru_cache(maxsize=64)  # one op per signature: eager calls then hit jit's cache
def _partitioned(
    shape: tuple, axes: tuple, norm, inverse: bool, fname: str, cotangent: bool = False
):
    """The transform of a traced input on Auto mesh axes whose sharding XLA's partitioner
    chooses (`_partitioned`); its adjoint is the transform the other way (`PT.ADJOINT_NORM`),
    applied to a cotangent (`PT.op`'s `cotangent`)."""

    def plan(mesh, entries):
        _checked(shape, entries, mesh, axes, fname)
        return _body(axes, inverse, norm), P(*entries), P(*entries)

    def adjoint():
        other = _partitioned(shape, axes, PT.ADJOINT_NORM[norm], not inverse, fname, True)
        return PT.conjugated(other)

    def reference(a):  # the transform on one device
        return PT.fft(a, axes, norm, inverse)

    rule = PT.kept_rule(len(shape), axes)
    op = PT.op(plan=plan, reference=reference, rule=rule, fname=fname, cotangent=cotangent)
    shifted = tuple(ax + 1 for ax in axes)  # the whole batch has the mapped dim first
    return PT.linear(
        op, adjoint, lambda b: _partitioned(b, shifted, norm, inverse, fname, cotangent)
    )


def batched_fftn(
    x: Num[Array, "*shape"],
    *,
    axes: Sequence[int] | None = None,
    norm: str | None = "backward",
    spec: P | None = None,
    mesh: Any = None,
) -> Complex[Array, "*shape"]:
    """`jnp.fft.fftn` along unsharded dims of a sharded array, with zero collectives.

    Typical use: a batch of images `x[B_data, H, W]` transformed over `(H, W)`. The output has
    the input's sharding.

    Args:
        x: real or complex array sharded over some dims.
        axes: dims to transform (all dims by default); none of them may be sharded.
        norm: `"backward"` (default), `"ortho"` or `"forward"`, as in `numpy.fft`.
        spec: the PartitionSpec of `x`; optional, as for `pfft3d`.
        mesh: the mesh of `x` when it cannot be read from `x` or from `jax.set_mesh`.

    Returns:
        The complex transform, sharded like `x`.

    Raises:
        ValueError: a transformed dim is sharded; a dim out of range; a bad `norm`; `x` not
            sharded.
        TypeError: a non-floating dtype.

    Example:
        >>> mesh = jax.make_mesh((8,), ("data",))
        >>> x = jax.device_put(jnp.ones((8, 16, 16)), NamedSharding(mesh, P("data")))
        >>> shardkit.fft.batched_fftn(x, axes=(1, 2)).sharding.spec
        P('data', None, None)

    See also:
        `batched_ifftn`, `pfft2d`, `pfft3d`.
    """
    return _run(x, axes, norm, spec, mesh, False, "batched_fftn")


def batched_ifftn(
    y: Complex[Array, "*shape"],
    *,
    axes: Sequence[int] | None = None,
    norm: str | None = "backward",
    spec: P | None = None,
    mesh: Any = None,
) -> Complex[Array, "*shape"]:
    """`jnp.fft.ifftn` along unsharded dims of a sharded array, with zero collectives.

    Args:
        y: complex array sharded over some dims.
        axes: dims to transform (all dims by default); none of them may be sharded.
        norm: `"backward"` (default), `"ortho"` or `"forward"`, as in `numpy.fft`.
        spec: the PartitionSpec of `y`; optional, as for `pfft3d`.
        mesh: the mesh of `y` when it cannot be read from `y` or from `jax.set_mesh`.

    Returns:
        The complex inverse transform, sharded like `y`.

    Raises:
        ValueError: as `batched_fftn`.
        TypeError: a real `y`.

    Example:
        >>> x2 = shardkit.fft.batched_ifftn(shardkit.fft.batched_fftn(x, axes=(1, 2)), axes=(1, 2))

    See also:
        `batched_fftn`.
    """
    return _run(y, axes, norm, spec, mesh, True, "batched_ifftn")
