"""Determinants of distributed matrices from their LU factors.

``det(A) = (-1)^s * prod(diag(U))`` where ``s`` is the number of row interchanges. Every device
owns whole columns of U, so it reads its own diagonal entries; one ``psum`` of two scalars
(log|.| sum and the count of negative entries) finishes the job. :func:`slogdet` is the
overflow-safe form; a zero pivot gives ``sign = 0`` and ``logabsdet = -inf``.

Example:
    >>> mesh = jax.make_mesh((8,), ("x",))
    >>> a = jax.random.normal(jax.random.key(0), (64, 64))
    >>> sign, logdet = slogdet(a, mesh=mesh)
    >>> s_ref, l_ref = jnp.linalg.slogdet(a)
    >>> bool(sign == s_ref), bool(jnp.isclose(logdet, l_ref, rtol=1e-4))
    (True, True)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitValueError
from shardkit.linalg.layout import check_matrix, global_index, n_devices
from shardkit.linalg.lu import LUFactors, lu

__all__ = ["SlogdetResult", "det", "slogdet"]


class SlogdetResult(NamedTuple):
    """``det(A) == sign * exp(logabsdet)``."""

    sign: jax.Array
    logabsdet: jax.Array


def _diag_stats_local(a, *, nb, p, axes):
    kc = a.shape[1]
    col_block = (jnp.arange(kc) // nb) * p + lax.axis_index(axes)
    gcol = col_block * nb + jnp.arange(kc) % nb  # global column of each local column
    diag = a[gcol, jnp.arange(kc)]  # this device's entries of diag(U)
    return lax.psum(_stats(diag), axes)


def _stats(diag):
    """(sum log|d|, turn, zeros) of diagonal entries, in the real dtype: ``turn`` counts the
    negative entries of a real diagonal and sums the complex entries' angles."""
    real = jnp.finfo(diag.dtype).dtype
    turn = jnp.sum(jnp.angle(diag)) if jnp.iscomplexobj(diag) else jnp.sum(diag < 0)
    logs = jnp.sum(jnp.log(jnp.abs(diag)))
    return jnp.stack([logs.astype(real), turn.astype(real), jnp.sum(diag == 0).astype(real)])


def _diag_stats_grid_local(a, *, nb, pr, pc, grid):
    m_loc, n_loc = a.shape
    grow = global_index(m_loc, nb, pr, lax.axis_index(grid[0]))
    gcol = global_index(n_loc, nb, pc, lax.axis_index(grid[1]))
    on_diag = grow[:, None] == gcol[None, :]  # this device's entries of diag(U)
    return lax.psum(_stats(jnp.where(on_diag, a, 1)), grid)


@functools.partial(jax.jit, static_argnames=("mesh", "axes", "nb", "grid"))
def _slogdet_jit(packed, pivots, mesh, axes, nb, grid):
    if grid is None:
        f = functools.partial(_diag_stats_local, nb=nb, p=n_devices(mesh, axes), axes=axes)
        spec = P(None, axes)
    else:
        pr, pc = (mesh.shape[a] for a in grid)
        f = functools.partial(_diag_stats_grid_local, nb=nb, pr=pr, pc=pc, grid=grid)
        spec = P(*grid)
    log_abs, turn, zeros = jax.shard_map(f, mesh=mesh, in_specs=spec, out_specs=P())(packed)
    swaps = jnp.sum(pivots != jnp.arange(pivots.shape[0], dtype=pivots.dtype))
    if jnp.iscomplexobj(packed):  # the product of the pivots' phases, one flip per swap
        sign = jnp.where(swaps % 2 == 0, 1, -1) * jnp.exp(1j * turn)
    else:
        sign = jnp.where((swaps + turn.astype(swaps.dtype)) % 2 == 0, 1, -1)
    singular = zeros > 0
    return SlogdetResult(
        jnp.where(singular, 0, sign).astype(packed.dtype),
        jnp.where(singular, -jnp.inf, log_abs).astype(log_abs.dtype),
    )


def _check_finite(a: jax.Array) -> None:
    """Raises for inf or NaN entries, whose determinant is undefined (NaN), outside `jit`.

    The entry is read with reductions only: indexing an array on Explicit mesh axes with
    integers is a gather JAX asks a sharding for.
    """
    finite = jnp.isfinite(a)
    if not bool(finite.all()):
        first = jnp.argmin(finite.reshape(-1))
        at = jnp.arange(a.size).reshape(a.shape) == first
        value = jnp.sum(jnp.where(at, a, 0)).item()
        i, j = divmod(int(first), a.shape[1])
        raise ShardkitValueError(
            f"a: the ({a.shape[0]}, {a.shape[1]}) matrix holds {value} at [{i}, {j}]; "
            "its determinant is undefined; fix: replace the non-finite entries (inside jit, "
            "slogdet returns NaN for them, as jnp.linalg.slogdet does)."
        )


def _check_square_factors(f: LUFactors) -> None:
    """Raises for the factors of a non-square matrix, which has no determinant."""
    if f.m is not None:
        raise ShardkitValueError(
            f"a: these LUFactors are of a ({f.m}, {f.n}) matrix, which has no determinant; "
            "fix: pass the factors of a square matrix."
        )


def _check_overflow(result: SlogdetResult, a: jax.Array) -> None:
    """Raises when the LU of a finite matrix overflowed (element growth past the dtype's range),
    outside `jit`: log|det| would be NaN or inf though the determinant is representable."""
    logdet = float(result.logabsdet)
    if np.isnan(logdet) or logdet == np.inf:
        n = a.shape[0]
        raise ShardkitValueError(
            f"a: the LU factors of the ({n}, {n}) {a.dtype} matrix overflowed (element growth "
            f"past {float(jnp.finfo(a.dtype).max):.1e}), so log|det| is {logdet}; numpy "
            "computes float32 input in float64. Fix: pass a.astype(jnp.float64) with "
            "jax.config.update('jax_enable_x64', True)."
        )


def slogdet(
    a: jax.Array | LUFactors,
    *,
    block_size: int | None = None,
    mesh: Mesh | None = None,
    axis_names: str | Sequence[str] | None = None,
    grid: tuple[str, str] | None = None,
) -> SlogdetResult:
    """Sign and natural log of the absolute determinant of a distributed square matrix.

    Args:
        a: (N, N) matrix (factored with :func:`~shardkit.linalg.lu`), or its
            :class:`~shardkit.linalg.LUFactors` (then the other options are ignored).
        block_size, mesh, axis_names: passed to :func:`~shardkit.linalg.lu`.
        grid: ``(row_axis, col_axis)`` to factor on a 2-D process grid.

    Returns:
        ``SlogdetResult(sign, logabsdet)``, replicated scalars; ``(0, -inf)`` when a pivot is
        exactly zero.

    Raises:
        ValueError, TypeError: as :func:`~shardkit.linalg.lu` for a bad matrix; ValueError
            for inf or NaN entries, or when the LU overflows the dtype (element growth, e.g.
            Wilkinson's matrix at N = 256 in float32: use float64), outside ``jit``
            (inside, the result is NaN or inf).

    Example:
        >>> sign, logdet = slogdet(a, mesh=jax.make_mesh((8,), ("x",)))

    See also: :func:`det`, :func:`~shardkit.linalg.lu`.
    """
    if isinstance(a, LUFactors):
        _check_square_factors(a)
    else:
        check_matrix(a, "a", stacked="batched_slogdet or batched_det")
        if not isinstance(a, jax.core.Tracer):
            _check_finite(a)
    f = a if isinstance(a, LUFactors) else lu(a, block_size=block_size, mesh=mesh,
                                              axis_names=axis_names, grid=grid)  # fmt: skip
    result = _slogdet_jit(f.lu, f.pivots, f.mesh, f.axis_names, f.block_size, f.grid)
    if not isinstance(a, LUFactors) and not isinstance(result.logabsdet, jax.core.Tracer):
        _check_overflow(result, a)
    return result


def det(
    a: jax.Array | LUFactors,
    *,
    block_size: int | None = None,
    mesh: Mesh | None = None,
    axis_names: str | Sequence[str] | None = None,
    grid: tuple[str, str] | None = None,
) -> jax.Array:
    """Determinant of a distributed square matrix, ``sign * exp(logabsdet)``.

    Overflows to inf (or underflows to 0) for large N where :func:`slogdet` does not.

    Args:
        a: (N, N) matrix or its :class:`~shardkit.linalg.LUFactors`.
        block_size, mesh, axis_names: passed to :func:`~shardkit.linalg.lu`.
        grid: ``(row_axis, col_axis)`` to factor on a 2-D process grid.

    Returns:
        The determinant, a replicated scalar (0 for an exactly singular matrix).

    Raises:
        ValueError, TypeError: as :func:`slogdet`.

    Example:
        >>> det(2 * jnp.eye(8), mesh=jax.make_mesh((8,), ("x",)), block_size=1)   # 256.0

    See also: :func:`slogdet`.
    """
    sign, logabsdet = slogdet(a, block_size=block_size, mesh=mesh, axis_names=axis_names, grid=grid)
    return sign * jnp.exp(logabsdet)
