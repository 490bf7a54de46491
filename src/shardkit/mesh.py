"""Device meshes: named grids of devices, with Auto or Explicit mesh axes.

A mesh names the axes along which arrays are split (``{"data": 4, "model": 2}`` on 8 devices).
shardkit builds meshes with :func:`make_mesh`, describes them in one line or as a table, and
can force N simulated CPU devices so sharded programs run on any laptop.

Default axis type: ``"explicit"``, the same as ``jax.make_mesh`` today, so a mesh from shardkit
behaves exactly like one from JAX. Under Explicit axes a sharding is part of an array's type and
operations that would communicate implicitly raise instead (``ShardingTypeError``), which makes
communication visible. Pass ``axis_types="auto"`` for the older behaviour where the compiler
(GSPMD/Shardy) propagates shardings and inserts collectives on its own.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from shardkit.compat import backend_started, context_mesh
from shardkit.errors import (
    ShardkitError,
    ShardkitRuntimeError,
    ShardkitTypeError,
    ShardkitValueError,
)

__all__ = [
    "MeshError",
    "concrete_mesh",
    "describe_mesh",
    "fill_rest",
    "make_mesh",
    "mesh_axis_sizes",
    "mesh_table",
    "simulate_cpu_devices",
]

AxisTypesArg = Literal["explicit", "auto"] | AxisType | Sequence[AxisType | str]


MAX_SIMULATED = 4096  # simulated CPU devices one process can hold (100,000 hung JAX's start)


class MeshError(ShardkitError, ValueError):
    """A mesh cannot be built as asked (bad axis sizes or names, too few devices)."""


def _parse_axis_types(axis_types: AxisTypesArg, n: int) -> tuple[AxisType, ...]:
    names = {"explicit": AxisType.Explicit, "auto": AxisType.Auto, "manual": AxisType.Manual}

    def one(t: AxisType | str) -> AxisType:
        if isinstance(t, AxisType):
            return t
        if isinstance(t, str) and t.lower() in names:
            return names[t.lower()]
        raise MeshError(
            f"axis_types: unknown mesh axis type {t!r}; fix: use 'explicit', 'auto' or a "
            "jax.sharding.AxisType."
        )

    if isinstance(axis_types, (str, AxisType)):
        return (one(axis_types),) * n
    if not isinstance(axis_types, Sequence):
        raise MeshError(
            f"axis_types={axis_types!r} is not a mesh axis type or a sequence of them; fix: "
            "axis_types='explicit', 'auto', or one per mesh axis, e.g. ('auto', 'explicit')."
        )
    types = tuple(one(t) for t in axis_types)
    if len(types) != n:
        raise MeshError(
            f"axis_types has {len(types)} entries but the mesh has {n} mesh axes; fix: pass one "
            "type per mesh axis, or a single 'explicit'/'auto' for all."
        )
    return types


def _resolve_shape(
    axes: Mapping[str, int] | Sequence[int], axis_names: Sequence[str] | None, n_devices: int
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    if isinstance(axes, Mapping):
        if axis_names is not None:
            raise MeshError(
                "axis_names was given together with a dict of mesh axes; fix: pass either "
                "make_mesh({'data': 4, 'model': 2}) or make_mesh((4, 2), ('data', 'model'))."
            )
        names, shape = tuple(axes.keys()), tuple(axes.values())
    elif isinstance(axes, str) or not isinstance(axes, (int, np.integer, Sequence)):
        raise MeshError(
            f"make_mesh({axes!r}): axes must be a dict of mesh axis name -> size or a shape; "
            "fix: make_mesh({'data': 8}) or make_mesh((8,), ('data',))."
        )
    else:
        shape = (axes,) if isinstance(axes, (int, np.integer)) else tuple(axes)
        pairs = all(isinstance(p, (tuple, list)) and len(p) == 2 for p in shape)
        if shape and pairs and all(isinstance(n, str) for n, _ in shape):
            raise MeshError(
                f"make_mesh({list(shape)}) got (name, size) pairs; fix: "
                f"make_mesh({dict(shape)}), a dict of mesh axis name -> size."
            )
        if axis_names is None:
            raise MeshError(
                f"make_mesh({shape}) needs axis_names (one name per mesh axis); fix: "
                f"make_mesh({shape}, {tuple(f'axis_{i}' for i in range(len(shape)))})."
            )
        names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
    if len(shape) != len(names):
        raise MeshError(
            f"mesh shape {shape} has {len(shape)} mesh axes but axis_names {names} has "
            f"{len(names)}; fix: give one name per mesh axis."
        )
    if not shape:
        raise MeshError("a mesh needs at least one mesh axis; fix: make_mesh({'data': -1}).")
    for name in names:
        if not isinstance(name, str) or not name:
            raise MeshError(f"mesh axis name {name!r} must be a non-empty string.")
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise MeshError(f"mesh axis names must be unique; {dup} repeat in {names}.")
    for name, size in zip(names, shape, strict=True):
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool):
            raise MeshError(f"mesh axis {name!r} has size {size!r}; sizes must be integers.")
        if size == 0 or size < -1:
            raise MeshError(
                f"mesh axis {name!r} has size {size}; sizes must be >= 1, or -1 for "
                "'the rest of the devices'."
            )
    if shape.count(-1) > 1:
        raise MeshError(
            f"at most one mesh axis may be -1 ('the rest'); got {dict(zip(names, shape))}."
        )
    shape = tuple(fill_rest(dict(zip(names, shape, strict=True)), n_devices).values())
    return tuple(int(s) for s in shape), names


def fill_rest(sizes: Mapping[str, int], n_devices: int) -> dict[str, int]:
    """Fills the one size that is -1 with the devices the others leave; the only -1 resolver.

    Args:
      sizes: mesh axis (or strategy degree) name -> size, at most one of them -1.
      n_devices: the devices to fill.

    Raises:
      MeshError: when the other sizes' product does not divide ``n_devices``, more than one
        size is -1, or a size is not an integer >= 1 (or -1).

    Example:
      >>> fill_rest({"data": -1, "tensor": 2}, 8)
      {'data': 4, 'tensor': 2}
    """
    for k, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v == 0 or v < -1:
            raise MeshError(
                f"fill_rest: {k!r} has size {v!r} in {dict(sizes)}; sizes must be integers "
                ">= 1, or -1 for 'the rest of the devices'; fix: e.g. {'data': -1, 'tensor': 2}."
            )
    if list(sizes.values()).count(-1) > 1:
        raise MeshError(
            f"fill_rest: at most one size may be -1 ('the rest'); got {dict(sizes)}; fix: give "
            "every other size, e.g. {'data': -1, 'tensor': 2}."
        )
    known = math.prod(int(v) for v in sizes.values() if v != -1)
    if -1 not in sizes.values():
        return {k: int(v) for k, v in sizes.items()}
    if n_devices % known:
        fixed = " x ".join(f"{k}={v}" for k, v in sizes.items() if v != -1)
        raise MeshError(
            f"cannot fill -1 in {dict(sizes)}: {n_devices} devices are not divisible by the "
            f"other mesh axes' product {known} ({fixed} does not divide {n_devices} devices); "
            f"fix: choose sizes whose product divides {n_devices}."
        )
    return {k: n_devices // known if v == -1 else int(v) for k, v in sizes.items()}


def make_mesh(
    axes: Mapping[str, int] | Sequence[int],
    axis_names: Sequence[str] | None = None,
    *,
    axis_types: AxisTypesArg = "explicit",
    devices: Sequence[Any] | None = None,
    allow_fallback: bool = False,
) -> Mesh:
    """Builds a named device mesh.

    Args:
      axes: mesh axis sizes, either a dict ``{"data": 4, "model": 2}`` or a shape tuple used
        with ``axis_names``. One size may be ``-1``, meaning "all remaining devices".
      axis_names: names of the mesh axes when ``axes`` is a shape tuple.
      axis_types: ``"explicit"`` (default, as ``jax.make_mesh``), ``"auto"``, a
        ``jax.sharding.AxisType``, or one type per mesh axis.
      devices: the devices to use (default: all of ``jax.devices()``). Pass a subset to build a
        mesh over part of the machine, e.g. ``jax.devices()[:4]``.
      allow_fallback: when fewer devices exist than the mesh needs, build the largest 1-D mesh
        over all devices on the first mesh axis instead of raising, and warn. Off by default:
        a mesh never silently changes shape.

    Returns:
      A ``jax.sharding.Mesh`` whose device grid has the requested shape.

    Raises:
      MeshError: bad names or sizes, or a device count that does not match (unless
        ``allow_fallback``).

    Example:
      >>> mesh = make_mesh({"data": 4, "model": 2})
      >>> describe_mesh(mesh)
      'Mesh(data=4, model=2; explicit; 8 devices cpu:0-7, 1 process)'

    See also: :func:`describe_mesh`, :func:`simulate_cpu_devices`.
    """
    if devices is not None and not isinstance(devices, (np.ndarray, jax.Device)):
        devices = list(devices)  # a generator or another iterable of devices
    devs = list(jax.devices() if devices is None else np.asarray(devices, dtype=object).flat)
    if not devs:
        raise MeshError("devices is empty; fix: pass at least one device, e.g. jax.devices()[:1].")
    _check_devices(devs)
    shape, names = _resolve_shape(axes, axis_names, len(devs))
    types = _parse_axis_types(axis_types, len(shape))
    need = math.prod(shape)
    if need != len(devs):
        if allow_fallback and need > len(devs):
            import warnings

            warnings.warn(
                f"make_mesh: {dict(zip(names, shape))} needs {need} devices but only "
                f"{len(devs)} exist; falling back to a 1-D mesh {{{names[0]!r}: {len(devs)}}} "
                "(allow_fallback=True).",
                stacklevel=2,
            )
            return Mesh(np.array(devs), (names[0],), axis_types=(types[0],))
        else:
            hint = (
                f"fix: use a subset, devices=jax.devices()[:{need}]"
                if need < len(devs)
                else (
                    f"fix: shrink the mesh to {len(devs)} devices (e.g. {{{names[0]!r}: -1}}), "
                    f"simulate more CPU devices with shardkit.simulate_cpu_devices({need}) "
                    "before JAX starts, or pass allow_fallback=True for a 1-D mesh"
                )
            )
            raise MeshError(
                f"mesh {dict(zip(names, shape))} needs {need} devices but {len(devs)} were "
                f"given; {hint}."
            )
    if devices is None and len(devs) == len(jax.devices()):
        # Let JAX order devices for the physical topology (matters on TPU/GPU).
        return jax.make_mesh(shape, names, axis_types=types)
    return Mesh(np.array(devs).reshape(shape), names, axis_types=types)


def _check_devices(devs: list[Any]) -> None:
    """Raises unless `devs` are distinct JAX devices."""
    bad = next((d for d in devs if not isinstance(d, jax.Device)), None)
    if bad is not None:
        raise MeshError(
            f"devices holds {bad!r} ({type(bad).__name__}), not a JAX device; fix: pass "
            "devices from jax.devices(), e.g. devices=jax.devices()[:4]."
        )
    if len(set(devs)) != len(devs):
        ids = [d.id for d in devs]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise MeshError(
            f"devices lists device(s) {twice} more than once ({len(devs)} entries, "
            f"{len(set(devs))} devices); a mesh places each device once; fix: pass distinct "
            "devices, e.g. jax.devices()[:4]."
        )


def first_devices(sizes: Mapping[str, int]) -> list[Any] | None:
    """The devices a mesh of `sizes` from the command line is built over: the first N when it
    needs fewer than exist (`--mesh data=2,model=2` on 8 simulated devices), else None (all;
    `make_mesh` then says what does not fit)."""
    if any(int(v) < 1 for v in sizes.values()):  # a -1 size takes what remains
        return None
    need = math.prod(int(v) for v in sizes.values())
    devs = jax.devices()
    return devs[:need] if need < len(devs) else None


def concrete_mesh(mesh: Any) -> Any:
    """`mesh`, or when it is a traced value's abstract mesh, the concrete mesh of
    `jax.set_mesh` with the same axes (else `mesh` itself).

    A kernel jitted on an abstract mesh runs inside the caller's `jit`, but under an eager
    `jax.grad` or `jax.vmap` its parts run alone and need devices: to place arrays, or to run
    a transpose on the cotangent.
    """
    if isinstance(mesh, Mesh):
        return mesh
    context = context_mesh()
    return context if not context.empty and context.abstract_mesh == mesh else mesh


def _check_mesh(fn: str, mesh: Any) -> None:
    """Raises unless `mesh` is a Mesh or AbstractMesh."""
    if isinstance(mesh, (Mesh, jax.sharding.AbstractMesh)):
        return
    hint = (
        f"{fn}(x.sharding.mesh)"
        if isinstance(mesh, jax.sharding.NamedSharding)
        else f"{fn}(shardkit.make_mesh({{'data': 8}}))"
    )
    raise ShardkitTypeError(
        f"{fn}: mesh is {type(mesh).__name__}, not a jax.sharding.Mesh or AbstractMesh; "
        f"fix: {hint}."
    )


def mesh_axis_sizes(mesh: Mesh | Any) -> dict[str, int]:
    """Returns ``{mesh axis name: size}`` for a Mesh or AbstractMesh.

    Raises:
      TypeError: ``mesh`` is not a mesh.
    """
    _check_mesh("mesh_axis_sizes", mesh)
    return dict(mesh.shape)


def _axis_type_name(mesh: Any) -> str:
    kinds = {str(t).split(".")[-1].lower() for t in getattr(mesh, "axis_types", ())}
    return "/".join(sorted(kinds)) if kinds else "auto"


def _device_range(devices: Sequence[Any]) -> str:
    ids = sorted(d.id for d in devices)
    platform = devices[0].platform if devices else "?"
    if ids == list(range(ids[0], ids[0] + len(ids))):
        return f"{platform}:{ids[0]}-{ids[-1]}" if len(ids) > 1 else f"{platform}:{ids[0]}"
    return f"{platform}:{','.join(map(str, ids))}"


def describe_mesh(mesh: Mesh) -> str:
    """One-line description: axis names and sizes, axis types, devices and processes.

    Example:
      >>> describe_mesh(make_mesh({"data": 8}))
      'Mesh(data=8; explicit; 8 devices cpu:0-7, 1 process)'

    Raises:
      TypeError: ``mesh`` is not a mesh (a NamedSharding's is ``sharding.mesh``).
    """
    _check_mesh("describe_mesh", mesh)
    axes = ", ".join(f"{k}={v}" for k, v in mesh.shape.items())
    if isinstance(mesh, jax.sharding.AbstractMesh):
        return f"Mesh({axes}; {_axis_type_name(mesh)}; abstract, no devices)"
    devs = list(mesh.devices.flat)
    procs = len({d.process_index for d in devs})
    return (
        f"Mesh({axes}; {_axis_type_name(mesh)}; {len(devs)} device{'s' * (len(devs) != 1)} "
        f"{_device_range(devs)}, {procs} process{'es' * (procs != 1)})"
    )


def mesh_table(mesh: Mesh) -> str:
    """A plain-text table of the device grid: which device sits at each mesh coordinate.

    Rows are the first mesh axis, columns the remaining axes folded together.

    Example:
      >>> print(mesh_table(make_mesh({"data": 2, "model": 4})))  # doctest: +SKIP
      Mesh(data=2, model=4; explicit; 8 devices cpu:0-7, 1 process)
      data\\model   0   1   2   3
      0            0   1   2   3
      1            4   5   6   7

    Raises:
      TypeError: ``mesh`` is not a mesh. MeshError: ``mesh`` is abstract (has no devices).
    """
    _check_mesh("mesh_table", mesh)
    if isinstance(mesh, jax.sharding.AbstractMesh):
        raise MeshError(
            f"mesh_table: {describe_mesh(mesh)} has no devices to lay out; fix: pass the "
            "concrete mesh (shardkit.make_mesh(...)), or describe_mesh for its axes."
        )
    grid = np.asarray(mesh.devices)
    names = list(mesh.shape.keys())
    rows = grid.reshape(grid.shape[0], -1) if grid.ndim > 1 else grid.reshape(1, -1)
    if grid.ndim == 1:
        header_l, col_labels, row_labels = names[0], [str(i) for i in range(grid.shape[0])], [""]
    else:
        header_l = f"{names[0]}\\{'x'.join(names[1:])}"
        col_labels = [",".join(map(str, idx)) for idx in np.ndindex(*grid.shape[1:])]
        row_labels = [str(i) for i in range(grid.shape[0])]
    width = max(len(header_l), *(len(r) for r in row_labels))
    cw = max(4, *(len(c) + 1 for c in col_labels))
    lines = [describe_mesh(mesh)]
    lines.append(header_l.ljust(width) + "".join(c.rjust(cw) for c in col_labels))
    for label, row in zip(row_labels, rows, strict=True):
        cells = "".join(str(d.id).rjust(cw) for d in row)
        lines.append(label.ljust(width) + cells)
    procs = sorted({d.process_index for d in grid.flat})
    if len(procs) > 1:
        lines.append(f"processes: {procs}")
    return "\n".join(lines)


def simulate_cpu_devices(n: int) -> None:
    """Forces ``n`` simulated CPU devices; must run before JAX starts its backend.

    Simulated devices share the machine's cores: they prove layouts, collectives and
    per-device memory, not speed.

    With ``n > 1`` it also sets ``OPENBLAS_THREAD_TIMEOUT=4`` unless the environment already
    sets it: OpenBLAS's worker threads (LAPACK under ``jnp.linalg`` on CPU) otherwise spin for
    2^28 cycles after every call, and on cores already shared by ``n`` device programs that
    spinning takes them from the other devices (a distributed LU on 8 simulated devices ran
    1.3-1.5x slower with it; a one-device solve was no faster with it). It takes effect if
    OpenBLAS loads after this call, as it does when the first LAPACK operation runs.

    Args:
      n: number of CPU devices (>= 1).

    Raises:
      ValueError: ``n`` < 1.
      RuntimeError: JAX has already started with a different device count.

    Example:
      >>> import shardkit as sk
      >>> sk.simulate_cpu_devices(8)  # first thing in the script
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ShardkitValueError(f"simulate_cpu_devices: n must be an integer >= 1, got {n!r}.")
    n = int(n)
    if n > MAX_SIMULATED:  # each is a thread and buffers in this process: JAX hangs starting
        raise ShardkitValueError(
            f"simulate_cpu_devices: {n} devices is more than {MAX_SIMULATED}, which one process "
            "can hold; fix: simulate fewer, or plan larger meshes without devices "
            "(shardkit plan --devices N, jax.sharding.AbstractMesh)."
        )
    if n > 1:  # 2^4 cycles, OpenBLAS's least: idle BLAS workers sleep instead of spinning
        os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    if backend_started():
        have = jax.device_count()
        if have == n and jax.default_backend() == "cpu":
            return
        raise ShardkitRuntimeError(
            f"simulate_cpu_devices({n}): JAX has already started with {have} "
            f"{jax.default_backend()} device(s); the device count can only be set before the "
            "first JAX computation; fix: call shardkit.simulate_cpu_devices at the top of your "
            f"script, or set XLA_FLAGS=--xla_force_host_platform_device_count={n} and "
            "JAX_PLATFORMS=cpu in the environment before starting Python."
        )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])
    jax.config.update("jax_num_cpu_devices", n)
