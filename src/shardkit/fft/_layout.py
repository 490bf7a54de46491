"""Reading, validating and describing the layouts of distributed FFT inputs and outputs.

Every transform in `shardkit.fft` works on the trailing `k` dims of an array (`k` = 2 or 3, the
"FFT dims"); leading dims are batch dims that keep their sharding. Layouts are written in the
scaling-book notation: `x[X_a, Y_b, Z]` is an array whose dim X is sharded over mesh axis `a`,
Y over `b`, and Z whole on every device.
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitTypeError, ShardkitValueError

Layout = Literal["natural", "transposed"]
LAYOUTS = ("natural", "transposed")
NORMS = (None, "backward", "ortho", "forward")

Entry = Any  # a PartitionSpec entry: None, a mesh axis name, or a tuple of mesh axis names


class SpectralLayout(NamedTuple):
    """Where a spectrum lives: its global shape, its PartitionSpec and its axis order.

    Attributes:
        shape: global shape of the spectrum.
        spec: PartitionSpec of the spectrum, one entry per dim.
        axes: for each dim of the spectrum, the dim of the input it holds the frequencies of
            (batch dims map to themselves). `(0, 1, 2)` for the natural layout of a 3-D
            transform, `(1, 2, 0)` for the transposed one.
    """

    shape: tuple[int, ...]
    spec: P
    axes: tuple[int, ...]


def check_choice(name: str, value: Any, choices: tuple, fname: str) -> None:
    """Raises ValueError when `value` is not one of `choices`."""
    if value not in choices:
        raise ShardkitValueError(
            f"{fname}: {name}={value!r} is not supported; use one of "
            + ", ".join(repr(c) for c in choices)
            + "."
        )


def entry_names(entry: Entry) -> tuple[str, ...]:
    """The mesh axis names of one PartitionSpec entry."""
    if entry is None:
        return ()
    if isinstance(entry, tuple):
        return entry
    return (entry,)


def roll(seq: tuple, k: int, shift: int) -> tuple:
    """Rolls the trailing `k` items of `seq` left by `shift`."""
    nb = len(seq) - k
    tail = seq[nb:]
    return seq[:nb] + tail[shift:] + tail[:shift]


def entry_size(entry: Entry, mesh_shape: dict[str, int]) -> int:
    """How many shards a PartitionSpec entry makes of its dim."""
    return math.prod(mesh_shape[n] for n in entry_names(entry))


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def mesh_of(x: Any) -> Any:
    """The mesh (concrete or abstract) an array or abstract value is laid out on, or None."""
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, NamedSharding):
        return sharding.mesh
    if _is_tracer(x):
        mesh = jax.typeof(x).sharding.mesh
        if mesh.axis_names:
            return mesh
    return None


def spec_of(x: Any) -> P | None:
    """The PartitionSpec an array is known to have, or None when it cannot be read."""
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, NamedSharding):
        return sharding.spec
    if _is_tracer(x):
        aval_sharding = jax.typeof(x).sharding
        if any(e is not None for e in aval_sharding.spec):
            return aval_sharding.spec
    return None


def normalize(spec: P, ndim: int) -> tuple[Entry, ...]:
    """A PartitionSpec as a tuple of `ndim` entries, one-name tuples unwrapped."""
    entries = tuple(spec) + (None,) * (ndim - len(spec))
    out = []
    for e in entries:
        if isinstance(e, tuple | list):
            e = tuple(e)
            e = e[0] if len(e) == 1 else (e or None)
        out.append(e)
    return tuple(out)


_SPECTRUM_ARGS = ("pifft3d", "pifft2d", "pirfft3d", "batched_ifftn", "fftfreq3d")


def arg_name(fname: str) -> str:
    """The name of the array argument of public function `fname`: `y` for a spectrum."""
    return "y" if fname in _SPECTRUM_ARGS else "x"


def check_array(x: Any, fname: str) -> None:
    """Raises TypeError unless `x` is an array or an abstract value (it has a shape and dtype)."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        arg = arg_name(fname)
        raise ShardkitTypeError(
            f"{fname}: {arg} is a {type(x).__name__}, not an array; the transform takes a "
            f"jax.Array sharded over a mesh; fix: {arg} = jax.device_put(jnp.asarray({arg}), "
            f"NamedSharding(mesh, P('x', 'y')))."
        )


def check_int(name: str, value: Any, fname: str) -> None:
    """Raises TypeError unless `value` is an int (a NumPy integer too, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ShardkitTypeError(
            f"{fname}: {name}={value!r} is a {type(value).__name__}, not an int; fix: pass "
            f"{name}= an int, e.g. {name}=int({name})."
        )


def _check_types(spec: Any, mesh: Any, fname: str) -> None:
    """Raises TypeError for a `spec=` that is not a PartitionSpec or a `mesh=` that is not a
    mesh (a str spec would otherwise be read letter by letter as mesh axis names)."""
    if spec is not None and not isinstance(spec, P | tuple | list):
        raise ShardkitTypeError(
            f"{fname}: spec={spec!r} is a {type(spec).__name__}, not a PartitionSpec; fix: "
            f"pass one entry per dim, e.g. spec=P('x', 'y') for dims 0 and 1 sharded over mesh "
            f"axes 'x' and 'y'."
        )
    if mesh is not None and not isinstance(mesh, jax.sharding.Mesh | jax.sharding.AbstractMesh):
        raise ShardkitTypeError(
            f"{fname}: mesh={mesh!r} is a {type(mesh).__name__}, not a jax.sharding.Mesh; fix: "
            f"pass mesh=jax.make_mesh((2, 4), ('x', 'y')) (the mesh the array is laid out on), "
            f"or drop mesh= to read it from the array."
        )


def resolve_placed(x: Any, spec: P | None, mesh: Any, fname: str) -> tuple[Any, Any, tuple]:
    """`resolve`, and `x` placed on the mesh as `spec=` says when it is not laid out on one (a
    NumPy array, or a `jax.Array` on one device): returns `(x, mesh, entries)`.

    Such an input has no sharding to contradict `spec=`, and a `jax.shard_map` over it fails
    with JAX's own error (its in_specs do not match, or its devices are not the mesh's)."""
    mesh, entries = resolve(x, spec, mesh, fname)
    unplaced = not _is_tracer(x) and not isinstance(getattr(x, "sharding", None), NamedSharding)
    if unplaced and isinstance(mesh, jax.sharding.Mesh):
        x = jax.device_put(x, NamedSharding(mesh, P(*entries)))
    return x, mesh, entries


def resolve(x: Any, spec: P | None, mesh: Any, fname: str) -> tuple[Any, tuple[Entry, ...]]:
    """Finds the mesh and the PartitionSpec of `x`, or raises an error that says how to pass them.

    The sharding is read from `x` (a concrete `jax.Array`, a `jax.ShapeDtypeStruct` with a
    sharding, or a traced value on Explicit mesh axes). On Auto mesh axes inside `jit` the
    sharding of a traced value is unknown, so `spec=` must be given.
    """
    check_array(x, fname)
    _check_types(spec, mesh, fname)
    ndim = len(x.shape)
    known, own = spec_of(x), mesh_of(x)
    if mesh is not None and own is not None and not _same_mesh(mesh, own):
        raise ShardkitValueError(
            f"{fname}: x is laid out on mesh {dict(own.shape)} but mesh= is another mesh "
            f"{dict(mesh.shape)}; the transform never moves its input between meshes; fix: "
            f"drop mesh=, or move x first with jax.device_put(x, NamedSharding(mesh, spec))."
        )
    if mesh is None:
        mesh = own
    if mesh is None:
        context = jax.sharding.get_abstract_mesh()
        mesh = context if context.axis_names else None
    if spec is not None and len(spec) > ndim:
        raise ShardkitValueError(
            f"{fname}: spec {spec} has {len(spec)} entries but x has rank {ndim} "
            f"(shape {tuple(x.shape)}); fix: one PartitionSpec entry per dim at most."
        )
    if spec is None:
        spec = known
    elif known is not None and normalize(known, ndim) != normalize(spec, ndim):
        raise ShardkitValueError(
            f"{fname}: x is sharded {P(*normalize(known, ndim))} but spec={spec}; the transform "
            f"never reshards its input; fix: drop spec=, or reshard first with "
            f"jax.sharding.reshard(x, {spec})."
        )
    elif _replicated_on_explicit_axes(x, mesh):
        raise ShardkitValueError(
            f"{fname}: {arg_name(fname)} (shape {tuple(x.shape)}) is replicated on Explicit mesh "
            f"axes (its spec is all None) but spec={spec}; the transform never reshards its "
            f"input; fix: shard it first, jax.sharding.reshard({arg_name(fname)}, {spec}), "
            f"and drop spec=."
        )
    if spec is None or mesh is None:
        raise ShardkitValueError(_unknown_layout(x, mesh, fname))
    entries = normalize(spec, ndim)
    sizes = dict(mesh.shape)
    unknown = [n for e in entries for n in entry_names(e) if n not in sizes]
    if unknown:
        axes = ", ".join(f"{a!r} (size {n})" for a, n in sizes.items())
        raise ShardkitValueError(
            f"{fname}: spec {spec} names mesh axis {unknown[0]!r}, which the mesh has not "
            f"(its axes: {axes}); fix: name axes of that mesh, or pass mesh= the mesh x is "
            "laid out on."
        )
    return mesh, entries


def _replicated_on_explicit_axes(x: Any, mesh: Any) -> bool:
    """Whether `x` is a traced value known to be replicated: its spec is all None and the
    `mesh` it is used on has only Explicit axes (on Auto ones all None means unknown)."""
    if not _is_tracer(x) or mesh is None:
        return False
    types = tuple(getattr(mesh, "axis_types", ()))
    explicit = bool(types) and all(t == AxisType.Explicit for t in types)
    return explicit and all(e is None for e in jax.typeof(x).sharding.spec)


def _same_mesh(a: Any, b: Any) -> bool:
    """Whether two meshes are one: the same axes and sizes, and the same devices in the same
    places when both are concrete (an abstract mesh, a traced value's, names no devices)."""
    if tuple(a.axis_names) != tuple(b.axis_names) or dict(a.shape) != dict(b.shape):
        return False
    if not (isinstance(a, jax.sharding.Mesh) and isinstance(b, jax.sharding.Mesh)):
        return True
    return [d.id for d in a.devices.flat] == [d.id for d in b.devices.flat]


def _unknown_layout(x: Any, mesh: Any, fname: str) -> str:
    """The one-line error for an input whose sharding cannot be read: what, where, the fix."""
    arg = arg_name(fname)
    shape = tuple(x.shape)
    if not _is_tracer(x) or mesh is None:
        where = "a traced value on Auto mesh axes" if _is_tracer(x) else "an unsharded array"
        basis = (
            " (under jax.vmap, jax.hessian and jax.jacfwd make such values, their tangent "
            "basis: take Hessian-vector products there, jax.jvp(jax.grad(loss), (x,), (v,)), "
            "which run per example)"
        )
        return (
            f"{fname}: {arg} (shape {shape}) is {where}, so its layout is unknown; the "
            f"transform needs {arg} sharded over a mesh{basis if _is_tracer(x) else ''}; fix: "
            f"{arg} = jax.device_put({arg}, NamedSharding(mesh, P('x', 'y'))), or inside jit on "
            f"Auto axes pass spec=P('x', 'y') and mesh=mesh (or use jax.set_mesh(mesh))."
        )
    sizes = dict(mesh.shape)
    axes = ", ".join(f"{a!r} (size {n})" for a, n in sizes.items())
    if AxisType.Manual in tuple(getattr(mesh, "axis_types", ())):
        return (
            f"{fname}: {arg} (shape {shape}) is one shard inside jax.shard_map (mesh axes "
            f"{axes} are Manual there), not the distributed array; fix: call {fname} outside "
            f"the shard_map, on the whole sharded array."
        )
    names = [a for a, n in sizes.items() if n > 1][:2] or list(sizes)[:1]
    example = "P(" + ", ".join(repr(a) for a in names) + ")"
    if AxisType.Explicit in tuple(getattr(mesh, "axis_types", ())):
        return (
            f"{fname}: {arg} (shape {shape}) is replicated over mesh axes {axes} (its spec is "
            f"all None), so there is nothing to distribute; fix: shard it first, e.g. "
            f"{arg} = jax.sharding.reshard({arg}, {example}), or use jnp.fft on a replicated array."
        )
    return (
        f"{fname}: {arg} (shape {shape}) is a traced value on Auto mesh axes {axes}, and JAX "
        f"does not tell a traced value's sharding on Auto axes (only on Explicit ones); fix: "
        f"pass the sharding {arg} has, e.g. {fname}({arg}, spec={example}), or make the mesh's "
        f"axes Explicit (jax.make_mesh(..., axis_types=(AxisType.Explicit,) * {len(sizes)}))."
    )


def check_rank(x: Any, k: int, fname: str) -> None:
    """Raises ValueError unless `x` has the `k` FFT dims (plus optional batch dims)."""
    check_array(x, fname)
    if len(x.shape) < k:
        arg = arg_name(fname)
        raise ShardkitValueError(
            f"{fname}: {arg} has rank {len(x.shape)} (shape {tuple(x.shape)}) but a {k}-D "
            f"transform needs at least {k} dims (leading extra dims are batch dims); fix: "
            f"reshape {arg} to {k} trailing FFT dims, e.g. "
            f"{arg}.reshape((1,) * {k - len(x.shape)} + {arg}.shape)."
        )


def multi_axis_dim(entries: tuple[Entry, ...], k: int) -> tuple[int, tuple] | None:
    """The first of the trailing `k` (FFT) dims sharded over several mesh axes, and its
    entry, or None."""
    nb = len(entries) - k
    return next(((nb + i, e) for i, e in enumerate(entries[nb:]) if isinstance(e, tuple)), None)


def whole_if_trivial(entries: tuple[Entry, ...], mesh_shape: dict[str, int]) -> tuple:
    """`entries` with the last dim's entry None when its mesh axes all have size 1: that dim is
    whole (the transforms need it whole, and move or drop its entry)."""
    last = entries[-1]
    if last is not None and entry_size(last, mesh_shape) == 1:
        return entries[:-1] + (None,)
    return entries


def shard_map_as_given(body, mesh: Any, given: tuple, in_spec: P, out_spec: P):
    """`jax.shard_map` of `body` over an input sharded `given`, which differs from the
    `in_spec` the body was planned for at most by mesh axes of size 1 (`whole_if_trivial`):
    the same blocks, but shard_map must be told the input's own spec on Explicit axes, and
    cannot infer that the output is replicated over a size-1 axis it no longer names."""
    trivial = P(*given) != in_spec
    return jax.shard_map(
        body, mesh=mesh, in_specs=P(*given), out_specs=out_spec, check_vma=not trivial
    )


def check_fft_entries(
    entries: tuple[Entry, ...],
    mesh: Any,
    k: int,
    fname: str,
    *,
    shape: tuple,
    last_whole: bool = True,
) -> None:
    """Validates the PartitionSpec entries of the FFT dims and the use of the mesh.

    Each FFT dim must be sharded over at most one mesh axis, the last FFT dim must be whole
    (when `last_whole`), and every mesh axis of size > 1 must shard some dim: an axis left
    unused would make its devices redo the same transform.
    """
    mesh_shape = dict(mesh.shape)
    nb = len(entries) - k
    multi = multi_axis_dim(entries, k)
    if multi is not None:
        d, e = multi
        last = last_whole and d == len(entries) - 1  # the last dim keeps none of them
        keep, extra = (None, e) if last else (e[0], e[1:])
        fix = _placed(entries[:d] + (keep,) + entries[d + 1 :], k, mesh_shape, extra)
        raise ShardkitValueError(
            f"{fname}: FFT dim {d} is sharded over several mesh axes {e}; each FFT dim "
            f"takes at most one mesh axis; fix: {_fix(fix, extra)}"
        )
    if last_whole and entries[-1] is not None and entry_size(entries[-1], mesh_shape) > 1:
        last = entry_names(entries[-1])
        fix = _placed(entries[:-1] + (None,), k, mesh_shape, last)
        raise ShardkitValueError(
            f"{fname}: the last FFT dim (dim {len(entries) - 1}) is sharded over mesh axis "
            f"{entries[-1]!r} of size {entry_size(entries[-1], mesh_shape)}; it must be whole "
            f"on every device; fix: {_fix(fix, last)}"
        )
    used = {n for e in entries for n in entry_names(e)}
    unused = [n for n, s in mesh_shape.items() if s > 1 and n not in used]
    if unused:
        if not any(entry_size(e, mesh_shape) > 1 for e in entries):
            raise ShardkitValueError(
                f"{fname}: x (shape {tuple(shape)}, spec {P(*entries)}) is not sharded over mesh "
                f"{mesh_shape}; a distributed transform needs it sharded; fix: "
                f"x = jax.device_put(x, NamedSharding(mesh, P(...))) sharding dim {nb} (and "
                f"dim {nb + 1} for a pencil transform); for a replicated array use jnp.fft."
            )
        raise ShardkitValueError(
            f"{fname}: mesh {mesh_shape} has axes {unused} that shard no dim of x (spec "
            f"{P(*entries)}), so their devices would redo the same transform. The transform "
            f"decomposes over at most {k - 1} mesh axes plus mesh axes on batch dims (under "
            f"jax.vmap, jax.hessian and jax.jacfwd differentiate along a tangent basis whose "
            f"layout drops the mapped dim's mesh axes: take Hessian-vector products there, "
            f"jax.jvp(jax.grad(loss), (x,), (v,)), which run per example); fix: "
            f"{_fix(_placed(entries, k, mesh_shape, tuple(unused)), tuple(unused))}"
        )


def _placed(entries: tuple, k: int, mesh_shape: dict, axes: tuple) -> P | None:
    """`entries` with mesh `axes` added where a transform takes them: one on each leading FFT
    dim that is whole, the rest together on the first whole batch dim; None if they do not
    fit."""
    nb, out, left = len(entries) - k, list(entries), list(axes)
    for d in range(nb, len(entries) - 1):
        if left and entry_size(entries[d], mesh_shape) == 1:
            out[d] = left.pop(0)
    if left:
        batch = [d for d in range(nb) if entry_size(entries[d], mesh_shape) == 1]
        if not batch:
            return None
        out[batch[0]] = tuple(left) if len(left) > 1 else left[0]
    return P(*out)


def _fix(spec: P | None, axes: tuple) -> str:
    """The end of an error message: reshard to `spec`, or, when no spec of this rank can use
    mesh `axes`, the ways to do without them."""
    if spec is not None:
        return f"shard it as the transform takes it, e.g. jax.sharding.reshard(x, {spec})."
    names = ", ".join(repr(n) for n in axes)
    them = "them" if len(axes) > 1 else "it"
    return (
        f"x's dims cannot also use mesh axis {names}; use a mesh without {them}, or one that "
        f"merges {them} with another axis, or add a leading batch dim sharded over {them}."
    )


def check_divisible(
    shape: tuple[int, ...], dim: int, entry: Entry, mesh: Any, fname: str, why: str
) -> None:
    """Raises ValueError when `shape[dim]` does not divide into the shards of `entry`."""
    mesh_shape = dict(mesh.shape)
    n = entry_size(entry, mesh_shape)
    if n <= 1 or shape[dim] % n == 0:
        return
    axes = " x ".join(f"{a!r} (size {mesh_shape[a]})" for a in entry_names(entry))
    lo = (shape[dim] // n) * n
    near = [s for s in (lo, lo + n) if s > 0]
    raise ShardkitValueError(
        f"{fname}: dim {dim} of x has size {shape[dim]} (shape {tuple(shape)}), which does not "
        f"divide into {n} shards over mesh axis {axes}; {why}. A Fourier transform cannot be "
        f"padded without changing its result; fix: use a size along dim {dim} that is a "
        f"multiple of {n} (e.g. {' or '.join(map(str, near))}), or a mesh whose axis divides "
        f"{shape[dim]}."
    )


def complex_dtype(dtype: Any, fname: str, *, allow_real: bool) -> Any:
    """The complex dtype a transform computes in, or a TypeError with a fix."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return dtype
    if allow_real and jnp.issubdtype(dtype, jnp.floating):
        return jnp.complex128 if dtype == jnp.float64 else jnp.complex64
    if allow_real:
        raise ShardkitTypeError(
            f"{fname}: x has dtype {dtype}; expected a floating or complex dtype; "
            f"fix: x.astype(jnp.float32) or x.astype(jnp.complex64)."
        )
    raise ShardkitTypeError(
        f"{fname}: y has dtype {dtype} but the inverse transform expects a complex spectrum "
        f"(complex64 or complex128); fix: pass the complex output of the forward transform; "
        f"for a half spectrum of a real field use pirfft3d on the output of prfft3d."
    )
