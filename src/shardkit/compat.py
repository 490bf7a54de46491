"""The only place shardkit touches JAX's private modules, each use with the reason.

shardkit supports JAX 0.10.2 (Python 3.11) to 0.12.x (Python 3.12–3.13). Behaviour is chosen by
feature detection, never by comparing version strings; where JAX has no public API for what
shardkit needs, the private use lives here and nowhere else (``tests/test_compat.py`` greps the
tree for ``jax._src``), so a JAX upgrade that moves it breaks one function, not the package.

Public routes shardkit uses directly, found in every supported version: ``jax.distributed.
is_initialized()``, ``jax.lax.all_gather(..., to="invarying")``.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

# JAX is imported inside the functions that need it, so `shardkit --version` (which only reads
# installed-package metadata) answers without starting JAX.

__all__ = [
    "autodiff_over_vmap",
    "backend_started",
    "context_mesh",
    "distributed_client",
    "is_vmap_mapped",
    "scan_parts",
    "version_line",
    "versions",
    "vmap_mapped_entry",
]


def backend_started() -> bool:
    """True once JAX has created a backend (after which the CPU device count is fixed).

    No public query exists up to JAX 0.12: ``jax.devices()`` would itself start the backend.
    ``xla_bridge._backends`` is the cache JAX fills on first use (0.10.2–0.12).
    """
    try:
        from jax._src import xla_bridge  # private: no public "has the backend started?" query

        return bool(xla_bridge._backends)  # noqa: SLF001
    except (ImportError, AttributeError):  # pragma: no cover - the cache moved in a later JAX
        return False


def context_mesh() -> Any:
    """The concrete mesh of ``jax.set_mesh``, also while a transformation traces (an empty mesh
    when none is set).

    The public ``jax.sharding.get_mesh()`` refuses whenever any trace is active, including plain
    ``jax.grad`` or ``jax.vmap`` outside ``jit``, where a traced value names only an abstract
    mesh and arrays can still be placed on the concrete one (0.10.2–0.12).
    """
    from jax._src import mesh  # private: get_mesh refuses under any trace

    return mesh.get_concrete_mesh()


def jit_params(traced: Any) -> dict:
    """The parameters `jax.jit` traced a call with (its `in_shardings`, `out_shardings`...),
    {} where JAX keeps none. No public API states them up to JAX 0.12: `Traced._params`
    (0.10.2 to 0.12)."""
    params = getattr(traced, "_params", None)
    return params if isinstance(params, dict) else {}


def distributed_client() -> Any | None:
    """The coordination service's key-value client of a multi-process run, or None when alone.

    JAX 0.10.2–0.12 expose ``jax.distributed.is_initialized()`` but no public handle on the
    client, whose ``key_value_set`` / ``blocking_key_value_get`` let processes compare their
    settings before the first collective (a mismatch there would hang in the collective).
    """
    import jax

    if not jax.distributed.is_initialized():
        return None
    from jax._src import distributed  # private: the key-value client has no public accessor

    return distributed.global_state.client


def is_vmap_mapped(x: Any) -> bool:
    """Whether ``x`` is a value the innermost ``jax.vmap`` maps over a dim.

    JAX 0.10.2–0.12 have no public query for "is this a vmap tracer"; shardkit's FFTs need it to
    run a batch-sharded transform once on the whole batch.
    """
    from jax._src.interpreters import batching  # private: no public vmap-tracer query

    return isinstance(x, batching.BatchTracer) and x.batch_dim is not None


def vmap_mapped_entry(x: Any) -> Any:
    """The PartitionSpec entry (mesh axis names) of the dim the innermost ``jax.vmap`` maps
    ``x`` over, or None when ``x`` is not mapped or that dim is not sharded (0.10.2–0.12)."""
    import jax

    if not is_vmap_mapped(x):
        return None
    spec = tuple(jax.typeof(x.val).sharding.spec)
    return spec[x.batch_dim] if x.batch_dim < len(spec) else None


def autodiff_over_vmap(x: Any) -> str | None:
    """``"reverse"`` when ``x`` is traced by ``jax.grad`` / ``jax.vjp``, ``"forward"`` by
    ``jax.jvp``, inside a ``jax.vmap`` that maps its primal (per-example derivatives,
    ``jax.vmap(jax.grad(f))``), directly or through other autodiff levels (second
    derivatives: a Hessian-vector product ``jax.jvp(jax.grad(f), ...)`` under ``jax.vmap``);
    None otherwise.

    JAX 0.10.2–0.12 linearise reverse mode with ``LinearizeTracer`` and run forward mode with
    ``JVPTracer``, and offer no public query for either; shardkit's FFTs need it because the
    transform then sees one element, whose layout no longer names the mapped dim's mesh axes,
    and ``jax.custom_derivatives.linear_call`` (their transposable JVP) has no batching rule.
    """
    from jax._src.interpreters import ad  # private: no public "which autodiff trace" query

    for mode, kind in (("reverse", "LinearizeTracer"), ("forward", "JVPTracer")):
        tracer = getattr(ad, kind, None)
        if tracer is not None and isinstance(x, tracer):
            inner = x.primal  # the level below: a vmapped value, or one more autodiff level
            return mode if is_vmap_mapped(inner) or autodiff_over_vmap(inner) else None
    return None


def scan_parts(params: dict) -> tuple[int, int, Any, tuple]:
    """``(num_consts, num_carry, body jaxpr, body consts)`` of a ``scan`` equation's params.

    The params of a jaxpr equation are JAX's internal format. Up to JAX 0.10 a scan carries
    ``num_consts`` / ``num_carry`` and a ClosedJaxpr body; JAX 0.12 carries ``ft_in`` (the
    operand groups consts, carry, xs, one entry per operand; carries that pass through unchanged
    are moved to the consts) and an open Jaxpr body; ``ft_in.unpack()`` gives the three groups
    (as JAX's own scan rules read them) and ``len`` of a group its operand count. The body's
    outputs are the carries then the stacked outputs in both.
    """
    body = params["jaxpr"]
    if "num_consts" in params:
        nc, nk = params["num_consts"], params["num_carry"]
    else:
        nc, nk, _ = (len(group) for group in params["ft_in"].unpack())
    return nc, nk, getattr(body, "jaxpr", body), tuple(getattr(body, "consts", ()))


def versions() -> dict[str, str]:
    """shardkit's, JAX's and jaxlib's versions, e.g. for a report or ``shardkit --version``."""

    def of(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "unknown"

    return {"shardkit": of("shardkit"), "jax": of("jax"), "jaxlib": of("jaxlib")}


def version_line() -> str:
    """One line naming the three versions: ``shardkit 0.1.0, jax 0.12.0.1, jaxlib 0.12.0.1``."""
    return ", ".join(f"{k} {v}" for k, v in versions().items())
