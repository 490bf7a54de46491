"""Strategies from names and mesh-axis dicts, as used by `shardkit train` and TOML configs."""

from __future__ import annotations

from collections.abc import Mapping

from shardkit.strategies.auto import Auto
from shardkit.strategies.core import FSDP, DataParallel, Hybrid, TensorParallel

NAMES = ("auto", "dp", "fsdp", "zero1", "tp", "hybrid")
MESH_AXES = ("data", "fsdp", "tensor")


def from_name(name: str, *, mesh: Mapping[str, int] | None = None):
    """Builds a strategy from a short name and optional mesh axis sizes.

    Args:
        name: one of "auto", "dp", "fsdp" (ZeRO-3), "zero1", "tp", "hybrid".
        mesh: mesh axis sizes such as {"data": 4, "tensor": 2}; axes must be among
            "data", "fsdp", "tensor". With "hybrid" it sets the degrees (default
            {"data": -1, "tensor": 2}); with other names it may only name that strategy's axis.

    Raises:
        ValueError: for an unknown name or mesh axis, or an axis the strategy does not use.

    Example:
        >>> from_name("hybrid", mesh={"fsdp": 4, "tensor": 2})
        Hybrid(data=1, fsdp=4, tensor=2, zero=3, tensor_rules=None)
    """
    key = name.strip().lower()
    if key not in NAMES:
        raise ValueError(f"unknown strategy {name!r}; fix: use one of {', '.join(NAMES)}.")
    mesh = dict(mesh or {})
    for axis, size in mesh.items():
        if axis not in MESH_AXES:
            raise ValueError(
                f"unknown mesh axis {axis!r} (size {size}) for strategy {name!r}; fix: name "
                f"mesh axes from {', '.join(MESH_AXES)}, e.g. --mesh data=4,tensor=2."
            )
    if key == "hybrid":
        degrees = mesh or {"data": -1, "tensor": 2}
        return Hybrid(**{a: int(degrees.get(a, 1)) for a in MESH_AXES})
    if key == "auto":
        if mesh:
            raise ValueError(
                "strategy 'auto' chooses the mesh itself; fix: drop --mesh or use "
                "--strategy hybrid with it."
            )
        return Auto()
    axis = {"dp": "data", "fsdp": "fsdp", "zero1": "fsdp", "tp": "tensor"}[key]
    extra = set(mesh) - {axis}
    if extra:
        raise ValueError(
            f"strategy {name!r} uses only mesh axis {axis!r}, got {sorted(extra)}; fix: use "
            "--strategy hybrid to combine axes."
        )
    size = int(mesh.get(axis, -1))
    if key == "dp":
        return DataParallel(data=size)
    if key == "tp":
        return TensorParallel(tensor=size)
    return FSDP(fsdp=size, zero=1 if key == "zero1" else 3)
