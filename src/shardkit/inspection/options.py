"""Checks of the options `inspect` and `assert_collectives` take, before anything compiles.

Both take byte bounds (`large_bytes=`, `max_bytes=`, `max_total_bytes=`), checked by one
function so they refuse the same values with the same words; and `inspect`'s own keyword
options (`mesh=`, `large_bytes=`, `branch_counts=`) share their names with whatever the user's
function takes, so a function with a parameter called `mesh` is told how to get it one.

Example:
    >>> check_byte_bound(2**20, "large_bytes", "inspect")       # fine
    >>> try:
    ...     check_byte_bound("1MiB", "large_bytes", "inspect")
    ... except TypeError as e:
    ...     print(str(e).split(";")[0])
    inspect(large_bytes='1MiB'): a byte bound must be a number of bytes, got str
"""

from __future__ import annotations

import inspect as pyinspect
import numbers
from typing import Any

import jax
import numpy as np

from shardkit.errors import ShardkitTypeError, ShardkitValueError

__all__ = ["OWN_OPTIONS", "check_byte_bound", "check_options"]


def check_byte_bound(value: Any, option: str, who: str) -> None:
    """A byte bound is None or a real number >= 0 (not a bool, not NaN, not a string like
    `"1MiB"`); `who` names the function in the message (`inspect`, `assert_collectives`).

    Raises:
        TypeError: not a number. ValueError: below 0, or NaN.
    """
    if value is None:
        return
    if not isinstance(value, numbers.Real) or isinstance(value, bool | np.bool_):
        raise ShardkitTypeError(
            f"{who}({option}={value!r}): a byte bound must be a number of bytes, got "
            f"{type(value).__name__}; fix: {option}=2**20 for 1 MiB."
        )
    if not value >= 0:  # also NaN, which no comparison would ever exceed
        raise ShardkitValueError(
            f"{who}({option}={value!r}): a byte bound must be >= 0 (and not NaN); fix: "
            f"{option}=0 to allow no bytes, or {option}=2**20 for 1 MiB."
        )


OWN_OPTIONS = {  # inspect's own keyword options, and what each is for
    "mesh": "the mesh to decode collectives against",
    "large_bytes": "the bytes above which a collective is warned about",
    "branch_counts": "how often each branch of a conditional runs",
}


def check_options(fn: Any, args: tuple, kwargs: dict, given: dict[str, Any]) -> None:
    """Raises when `fn` needs a parameter that inspect took as its own option (`mesh=`), or
    when `mesh=` is no mesh; `given` holds the options the caller passed."""
    target = getattr(fn, "__wrapped__", fn)
    name = getattr(target, "__name__", type(target).__name__)
    try:
        sig = pyinspect.signature(target)
        bound = sig.bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):  # no signature, or arguments that bind_partial refuses
        sig, bound = None, {}
    params = sig.parameters if sig is not None else {}
    for opt, purpose in OWN_OPTIONS.items():
        p = params.get(opt)
        if p is None or opt in bound or p.default is not p.empty or p.kind == p.VAR_KEYWORD:
            continue
        value = given.get(opt)
        taken = f", and {opt}={value!r:.40} was taken as that" if value is not None else ""
        raise ShardkitTypeError(
            f"inspect({name}, ...): {opt}= is inspect's own option ({purpose}){taken}, so it "
            f"never reaches {name}{sig}, whose parameter {opt!r} is then missing; fix: bind "
            f"it first: shardkit.inspect(functools.partial({name}, {opt}="
            f"{'...' if value is None else repr(value)[:40]}), *args), or wrap it in a lambda."
        )
    mesh = given.get("mesh")
    if mesh is not None and not isinstance(mesh, jax.sharding.Mesh | jax.sharding.AbstractMesh):
        own = ""
        if "mesh" in params:
            own = f"; to set {name}'s parameter mesh, bind it: functools.partial({name}, mesh=...)"
        raise ShardkitTypeError(
            f"inspect(mesh={mesh!r:.40}): mesh= is {OWN_OPTIONS['mesh']} and must be a "
            f"jax.sharding.Mesh or AbstractMesh, got {type(mesh).__name__}; fix: drop mesh= "
            f"(the arguments' mesh is used) or pass x.sharding.mesh{own}."
        )
