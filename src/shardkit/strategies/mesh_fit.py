"""Whether a strategy fits the mesh it is bound to: the checks `strategy.bind(mesh)` makes.

A strategy's degrees say how many devices each mesh axis spans; a mesh the user built says
it too. When both speak they must agree, or the mesh's sizes would silently win. A degree
left at its default (`Hybrid`'s 1, the one-axis strategies' -1) or given as -1 ("the rest")
takes the mesh's size; any other value is explicit and must equal the mesh axis it names:

    >>> FSDP().bind(make_mesh({"fsdp": 4}, devices=jax.devices()[:4]))     # takes 4
    >>> FSDP(fsdp=8).bind(make_mesh({"fsdp": 4}, devices=jax.devices()[:4]))
    ShardkitValueError: FSDP(fsdp=8) asks for fsdp=8 but the mesh {'fsdp': 4} has 'fsdp' of
    size 4: ...; fix: drop fsdp= to take the mesh's sizes (FSDP()), or build the mesh to match:
    shardkit.make_mesh({'fsdp': 8}) (8 devices; the mesh has 4).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from shardkit.errors import ShardkitError, ShardkitValueError

DEGREES = ("data", "fsdp", "tensor")  # the strategy fields that are mesh axis sizes


def check_mesh(strategy: Any, sizes: Mapping[str, int]) -> None:
    """Raises when `strategy` cannot run on a mesh of these axis sizes as it says it would.

    Raises:
        ShardkitValueError: pipeline stages the "stage" axis does not have; a mesh axis the
            strategy splits over that the mesh lacks; an explicit degree that is not the size
            of its mesh axis. Each names the fix.
    """
    _check_stages(strategy, sizes)
    _check_names(strategy, sizes)
    _check_sizes(strategy, sizes)


def _check_stages(strategy: Any, sizes: Mapping[str, int]) -> None:
    stages = strategy.pipeline.stages if strategy.pipeline is not None else 1
    if stages > 1 and sizes.get("stage", 1) != stages:
        have = f"size {sizes['stage']}" if "stage" in sizes else "no 'stage' axis"
        n = max(1, math.prod(sizes.values()) // stages)
        raise ShardkitValueError(
            f"the strategy has Pipeline(stages={stages}) but the mesh {dict(sizes)} has {have}; "
            f"fix: let the Trainer build the mesh (strategy.make_mesh()), or pass a mesh "
            f"with 'stage': {stages}, e.g. shardkit.make_mesh({{'stage': {stages}, "
            f"'data': {n}}})."
        )


def _check_names(strategy: Any, sizes: Mapping[str, int]) -> None:
    wanted = [a for a in DEGREES if getattr(strategy, a, 1) != 1]
    missing = [a for a in wanted if a not in sizes]
    if missing and math.prod(sizes.values()) > 1:
        raise ShardkitValueError(
            f"{strategy!r} splits over mesh axis {' and '.join(map(repr, missing))}, which the "
            f"mesh {dict(sizes)} lacks: its arrays would be silently replicated; fix: build the "
            f"mesh with the strategy (strategy.make_mesh()), or name the mesh axes "
            f"{', '.join(map(repr, wanted))}."
        )


def explicit_degrees(strategy: Any) -> dict[str, int]:
    """The degrees the user set: neither the field's default nor -1 (both take the mesh's)."""
    if not dataclasses.is_dataclass(strategy):
        return {}
    defaults = {f.name: f.default for f in dataclasses.fields(strategy)}
    return {
        a: getattr(strategy, a)
        for a in DEGREES
        if a in defaults and getattr(strategy, a) not in (-1, defaults[a])
    }


def _check_sizes(strategy: Any, sizes: Mapping[str, int]) -> None:
    explicit = explicit_degrees(strategy)
    wrong = {a: d for a, d in explicit.items() if sizes.get(a, 1) != d}
    if not wrong:
        return
    asked = " and ".join(f"{a}={d}" for a, d in wrong.items())
    have = " and ".join(
        f"{a!r} of size {sizes[a]}" if a in sizes else f"no {a!r} axis (size 1)" for a in wrong
    )
    loose = dataclasses.replace(strategy, **{a: _default(strategy, a) for a in wrong})
    raise ShardkitValueError(
        f"{_short(strategy)} asks for {asked} but the mesh {dict(sizes)} has {have}: the mesh's "
        f"sizes would silently win; fix: drop {', '.join(f'{a}=' for a in wrong)} to take the "
        f"mesh's sizes ({_short(loose)}), or build the mesh to match: {_matching(strategy, sizes)}."
    )


def _default(strategy: Any, field: str) -> Any:
    return next(f.default for f in dataclasses.fields(strategy) if f.name == field)


def _short(strategy: Any) -> str:
    """`Type(field=value, ...)` with only the fields that differ from their defaults."""
    shown = [
        f"{f.name}={getattr(strategy, f.name)!r}"
        for f in dataclasses.fields(strategy)
        if f.repr and getattr(strategy, f.name) != f.default
    ]
    return f"{type(strategy).__name__}({', '.join(shown)})"


def _matching(strategy: Any, sizes: Mapping[str, int]) -> str:
    """A `shardkit.make_mesh(...)` call whose mesh the strategy runs on as written: on the
    mesh's device count if the degrees allow, else on the devices the degrees name."""
    n = math.prod(sizes.values())
    stages = strategy.pipeline.stages if strategy.pipeline is not None else 1
    for count in (n, math.prod(explicit_degrees(strategy).values()) * stages):
        try:
            axes = strategy.mesh_axes(count)
        except ShardkitError:  # the degrees need another device count: try the next one
            continue
        devices = "" if count == n else f" ({count} devices; the mesh has {n})"
        return f"shardkit.make_mesh({axes}){devices}"
    return "strategy.make_mesh(devices) over as many devices as its degrees multiply to"
