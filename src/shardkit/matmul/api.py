# ruff: noqa: F722  (jaxtyping shape strings are not Python expressions)
"""``matmul``: one entry point for every sharded matmul algorithm."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jaxtyping import Array, Num

from shardkit.compat import vmap_mapped_entry
from shardkit.matmul._layout import (
    MatmulLayout,
    MatmulLayoutError,
    Method,
    layout_of,
    normalize_spec,
    pspec,
)
from shardkit.matmul.cases import run_recipe
from shardkit.matmul.collective import build_collective
from shardkit.matmul.cost import fit
from shardkit.matmul.summa import build_summa

__all__ = ["compile_matmul", "kernel", "matmul"]


# Algorithms that add partial products across devices or steps: a bool product runs there as
# int32 counts (exact up to 2^31 terms) and C is ``counts > 0``, jnp.matmul's bool result.
_COUNTS_FOR_BOOL = ("reduce_scatter", "summa")


@functools.lru_cache(maxsize=256)
def kernel(L: MatmulLayout, method: Method, dtype: jnp.dtype):
    """The jitted ``(A, B) -> C`` for a fitted method; cached so repeated calls reuse it."""
    if dtype == jnp.bool_ and method.algorithm in _COUNTS_FOR_BOOL:
        counts = kernel(L, method, jnp.dtype(jnp.int32))
        return jax.jit(lambda a, b: counts(a, b) > 0)
    if method.algorithm == "collective":
        return build_collective(L, method, dtype)
    if method.algorithm == "summa":
        return build_summa(L, method, dtype)
    return run_recipe(L, method, dtype)


def matmul(
    a: Num[Array, "m k"],
    b: Num[Array, "k n"],
    *,
    algorithm: str = "auto",
    out_spec: object = None,
    bidirectional: bool = False,
) -> Num[Array, "m n"]:
    """Multiplies sharded matrices C = A @ B with a chosen distributed algorithm.

    The mesh and layouts are read from the operands' NamedShardings (one mesh axis or None per
    dim); Auto and Explicit mesh axes both work. Inside ``jax.jit`` the operands must live on a
    mesh with Explicit axes, where a tracer's type carries its layout.

    Args:
        a: A[M, K] with a NamedSharding.
        b: B[K, N] on the same mesh (an operand without a NamedSharding counts as replicated).
        algorithm: ``"auto"`` (fewest bytes moved, then lowest peak memory; see
            :func:`explain`), ``"gspmd"`` (``jnp.matmul`` under jit, the compiler communicates),
            ``"allgather"`` (gather what blocks a local product: scaling-book cases 1, 2, 4),
            ``"reduce_scatter"`` (local K-block products, then reduce-scatter or all-reduce:
            case 3), ``"collective"`` (all-gather-matmul / matmul-reduce-scatter as a
            ``ppermute`` ring), ``"summa"`` (2-D mesh, panel broadcasts).
        out_spec: PartitionSpec wanted for C. None takes the algorithm's own output:
            allgather: A's M and B's N mesh axes after gathering; reduce_scatter: the
            contracting mesh axis scattered over M when M is free, else over N, else all-reduced;
            collective: fixed by the ring form; summa: ``P(R, C)``; gspmd: ``P(A's M, B's N)``.
        bidirectional: for ``"collective"``: halves travel both ways round the ring.

    Returns:
        C[M, N] with ``NamedSharding(mesh, out_spec)``, in the operands' result dtype (bool
        for bool operands, as ``jnp.matmul``: True where some ``A[i, k] and B[k, j]``;
        reduce_scatter and summa sum int32 counts then, moving 4 bytes per entry).

    Raises:
        MatmulLayoutError: inner dims differ, an operand is not 2-D, specs name unknown mesh
            axes or do not divide the shapes, or the algorithm does not fit the layout (SUMMA
            on a 1-D mesh, reduce_scatter with K unsharded, ...). Each message ends with a fix.
        ValueError: unknown ``algorithm``.

    Example:
        >>> mesh = jax.make_mesh((8,), ("x",))
        >>> A = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("x", None)))
        >>> B = jax.device_put(jnp.ones((32, 64)), NamedSharding(mesh, P(None, "x")))
        >>> C = shardkit.matmul(A, B, algorithm="collective")
        >>> C.sharding.spec, float(np.asarray(C)[0, 0])
        (P(None, 'x'), 32.0)

    See also: :func:`shardkit.matmul.explain`, :func:`shardkit.matmul.chain`.
    """
    _check_vmapped(a, b, algorithm)
    L = layout_of(a, b)
    out = None if out_spec is None else normalize_spec(out_spec, name="out_spec", mesh=L.mesh)
    method = fit(L, algorithm, out, bidirectional=bidirectional)
    dtype = jnp.dtype(jnp.result_type(a.dtype, b.dtype))
    if 0 in (L.m, L.k, L.n):  # nothing to multiply or move: jnp.matmul's zeros, laid out
        return _zeros(L, method, dtype)()
    return kernel(L, method, dtype)(a, b)


def _check_vmapped(a: object, b: object, algorithm: str) -> None:
    """Refuses an operand whose ``jax.vmap``-mapped dim is sharded: the kernels run on 2-D
    blocks, so that mesh axis would be lost (or JAX fails inside ``shard_map``)."""
    if algorithm == "gspmd":
        return
    for name, x in (("A", a), ("B", b)):
        entry = vmap_mapped_entry(x)
        if entry is not None:
            raise MatmulLayoutError(
                f"{name} is mapped by jax.vmap over a dim sharded over mesh axis {entry!r}, but "
                f"algorithm={algorithm!r} multiplies 2-D blocks and cannot keep that axis; fix: "
                "algorithm='gspmd' (the compiler partitions the batch), or jnp.einsum over the "
                "batched operands."
            )


@functools.lru_cache(maxsize=64)
def _zeros(L: MatmulLayout, method: Method, dtype: jnp.dtype):
    """The jitted ``() -> C`` of an empty product (a zero-size M, K or N): zeros, no collective."""
    out = NamedSharding(L.mesh, pspec(method.out_spec))
    return jax.jit(lambda: jnp.zeros((L.m, L.n), dtype), out_shardings=out)


def compile_matmul(
    a: jax.Array | jax.ShapeDtypeStruct,
    b: jax.Array | jax.ShapeDtypeStruct,
    *,
    algorithm: str = "auto",
    out_spec: object = None,
    bidirectional: bool = False,
) -> tuple[Method, jax.stages.Compiled]:
    """The predicted :class:`Method` and the compiled program of ``matmul(a, b, ...)``.

    Use it to audit what an algorithm really runs, without running it.

    Args:
        a, b: arrays or ``jax.ShapeDtypeStruct`` with NamedShardings, as for :func:`matmul`.
        algorithm, out_spec, bidirectional: as for :func:`matmul`.

    Returns:
        ``(method, compiled)``: the prediction (collectives, bytes, peak memory) and the
        ``jax.stages.Compiled`` program (``.as_text()``, ``.memory_analysis()``).

    Raises:
        MatmulLayoutError, ValueError: as :func:`matmul`.

    Example:
        >>> method, compiled = compile_matmul(A, B, algorithm="summa")   # 2x4 mesh
        >>> method.counts(), shardkit.inspect(compiled).counts()["all-reduce"]
        ({'all-reduce': 8}, 8)

    See also: :func:`shardkit.inspection.inspect`.
    """
    L = layout_of(a, b)
    out = None if out_spec is None else normalize_spec(out_spec, name="out_spec", mesh=L.mesh)
    method = fit(L, algorithm, out, bidirectional=bidirectional)
    dtype = jnp.dtype(jnp.result_type(a.dtype, b.dtype))
    if 0 in (L.m, L.k, L.n):
        return method, _zeros(L, method, dtype).lower().compile()
    return method, kernel(L, method, dtype).lower(a, b).compile()
