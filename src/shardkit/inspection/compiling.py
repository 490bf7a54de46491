"""Compiling what the audit is given: a function, a jitted function, or a Lowered, Traced or
Compiled object, with the arguments checked against the function's signature first.

Compiles here key JAX's persistent compilation cache on the program's source locations too
(`source_exact_compiles`): by default the key leaves them out, so with
`jax_compilation_cache_dir` set, a program that only moved in its file (or has the same
function name in another file) is served from the cache with the first program's metadata,
and the audit would name that program's source lines.
"""

from __future__ import annotations

import contextlib
import inspect as _pyinspect
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import jax

from shardkit.compat import jit_params
from shardkit.errors import ShardkitTypeError

__all__ = ["Compilation", "check_args", "compile_for", "kind_of", "source_exact_compiles"]

_METADATA_IN_KEY = "jax_compilation_cache_include_metadata_in_key"


@contextlib.contextmanager
def source_exact_compiles() -> Iterator[None]:
    """Within it, JAX's persistent compilation cache serves an executable only to a program with
    the same source locations (`jax_compilation_cache_include_metadata_in_key`), so the
    compiled program's metadata names the caller's lines. Without a cache directory it changes
    nothing. The setting is restored on exit."""
    old = getattr(jax.config, _METADATA_IN_KEY)
    jax.config.update(_METADATA_IN_KEY, True)
    try:
        yield
    finally:
        jax.config.update(_METADATA_IN_KEY, old)


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


class Compilation(NamedTuple):
    """A compiled program, how long compiling took, and the shardings its `jax.jit` was asked
    for: one per leaf of the dynamic `(args, kwargs)` and one per output leaf, None where jit
    was left to choose; empty for a Lowered or Compiled object, whose requests are not kept."""

    compiled: Any
    seconds: float | None
    requested_in: tuple[Any, ...] = ()
    requested_out: tuple[Any, ...] = ()


def _jit_requests(traced: Any, key: str) -> tuple[Any, ...]:
    """The shardings `jax.jit` was given for a traced call (`in_shardings`/`out_shardings`,
    flat), None where it was left unspecified.

    Read through `compat.jit_params`; where JAX keeps none, nothing counts as requested (the
    layout then shows "compiler's choice")."""
    flat = jit_params(traced).get(key, ())
    return tuple(s if isinstance(s, jax.sharding.Sharding) else None for s in flat)


def compile_for(
    fn: Any,
    args: tuple,
    kwargs: dict,
    *,
    who: str = "inspect",
    in_shardings: Any = None,
    out_shardings: Any = None,
) -> Compilation:
    """Compiles `fn` for `args` (or passes a compiled object through).

    `in_shardings`/`out_shardings` (NamedShardings, or None leaves for "compiler's choice") go
    to `jax.jit` as they would from the user: a plain function is jitted with them, a jitted
    one wrapped in a `jax.jit` that has them. A Lowered or Compiled object cannot take them.
    """
    kind = kind_of(fn)
    options = {k: v for k, v in (("in_shardings", in_shardings), ("out_shardings", out_shardings))
               if v is not None}  # fmt: skip
    asked = list(options)
    if asked and kind not in ("function", "jitted"):
        what = {"compiled": "Compiled", "lowered": "Lowered", "traced": "Traced"}[kind]
        raise ShardkitTypeError(
            f"{who}({kind}, {asked[0]}=...): {asked[0]}= needs a function to compile; a {what} "
            f"object is already lowered with its shardings; fix: {who}(f, *args, "
            f"{asked[0]}=...) with f the function, or jax.jit(f, {asked[0]}=...) before lowering."
        )
    if kind == "compiled":
        if args or kwargs:
            raise ShardkitTypeError(
                f"{who}(compiled, ...): a Compiled object takes no arguments; got {len(args)} "
                f"positional and {len(kwargs)} keyword; fix: {who}(compiled) or "
                f"{who}(jitted_fn, *args)."
            )
        return Compilation(fn, None)
    t0 = time.perf_counter()
    if kind in ("lowered", "traced"):
        what = "Lowered" if kind == "lowered" else "Traced"
        if args or kwargs:
            raise ShardkitTypeError(
                f"{who}({kind}, ...): a {what} object takes no arguments; got {len(args)} "
                f"positional; fix: {who}({kind}) or {who}(jitted_fn, *args)."
            )
        with source_exact_compiles():
            compiled = fn.compile() if kind == "lowered" else fn.lower().compile()
        return Compilation(compiled, time.perf_counter() - t0)
    check_args(fn, args, kwargs, who)
    jitted = fn if kind == "jitted" and not options else jax.jit(fn, **options)
    if hasattr(jitted, "trace"):
        traced = jitted.trace(*args, **kwargs)
        req_in = _jit_requests(traced, "in_shardings")
        req_out = _jit_requests(traced, "out_shardings")
        lowered = traced.lower()
    else:  # a jit-like wrapper without `.trace`: no requests to read
        req_in, req_out, lowered = (), (), jitted.lower(*args, **kwargs)
    with source_exact_compiles():
        compiled = lowered.compile()
    return Compilation(compiled, time.perf_counter() - t0, req_in, req_out)
