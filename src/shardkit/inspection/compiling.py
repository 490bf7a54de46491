"""Compiling what the audit is given: a function, a jitted function, or a Lowered, Traced or
Compiled object, with the arguments checked against the function's signature first."""

from __future__ import annotations

import inspect as _pyinspect
import time
from typing import Any

import jax

from shardkit.errors import ShardkitTypeError

__all__ = ["check_args", "compile_for", "kind_of"]


def kind_of(obj: Any) -> str:
    """`compiled`, `lowered`, `jitted` or `function`."""
    if hasattr(obj, "as_text") and hasattr(obj, "memory_analysis") and not hasattr(obj, "compile"):
        return "compiled"
    if hasattr(obj, "compile") and hasattr(obj, "as_text"):
        return "lowered"
    if hasattr(obj, "lower") and callable(obj):
        return "jitted"
    if hasattr(obj, "lower") and hasattr(obj, "jaxpr"):
        return "traced"
    if callable(obj):
        return "function"
    raise ShardkitTypeError(
        f"inspect(fn=...) expects a function, a jax.jit-wrapped function, or a Lowered or "
        f"Compiled object; got {type(obj).__name__} {obj!r:.60}; fix: shardkit.inspect(f, x) "
        "with f a Python function of arrays."
    )


def check_args(fn: Any, args: tuple, kwargs: dict, who: str) -> None:
    target = getattr(fn, "__wrapped__", fn)
    try:
        sig = _pyinspect.signature(target)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        name = getattr(target, "__name__", type(target).__name__)
        shapes = ", ".join(_describe_arg(a) for a in args) or "no arguments"
        raise ShardkitTypeError(
            f"{who}({name}, ...): the arguments do not match {name}{sig}: {e}. Got {shapes}; "
            f"fix: pass the arguments {name} expects, as arrays or jax.ShapeDtypeStruct "
            "(with sharding=NamedSharding(mesh, P(...)))."
        ) from None


def _describe_arg(a: Any) -> str:
    shape = getattr(a, "shape", None)
    dtype = getattr(a, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{dtype}{list(shape)}"
    return type(a).__name__


def compile_for(
    fn: Any, args: tuple, kwargs: dict, *, who: str = "inspect"
) -> tuple[Any, float | None]:
    """Compiles `fn` for `args` (or passes a compiled object through): (compiled, seconds)."""
    kind = kind_of(fn)
    if kind == "compiled":
        if args or kwargs:
            raise ShardkitTypeError(
                f"{who}(compiled, ...): a Compiled object takes no arguments; got {len(args)} "
                f"positional and {len(kwargs)} keyword; fix: {who}(compiled) or "
                f"{who}(jitted_fn, *args)."
            )
        return fn, None
    t0 = time.perf_counter()
    if kind in ("lowered", "traced"):
        what = "Lowered" if kind == "lowered" else "Traced"
        if args or kwargs:
            raise ShardkitTypeError(
                f"{who}({kind}, ...): a {what} object takes no arguments; got {len(args)} "
                f"positional; fix: {who}({kind}) or {who}(jitted_fn, *args)."
            )
        compiled = fn.compile() if kind == "lowered" else fn.lower().compile()
    else:
        check_args(fn, args, kwargs, who)
        jitted = fn if kind == "jitted" else jax.jit(fn)
        compiled = jitted.lower(*args, **kwargs).compile()
    return compiled, time.perf_counter() - t0
