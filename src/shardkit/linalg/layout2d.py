"""The 2-D block-cyclic layout over a (P_r x P_c) process grid.

Row block ``I`` (``block_size`` rows) lives on process row ``I % P_r`` and column block ``J``
on process column ``J % P_c``, as in ScaLAPACK. Like the 1-D layout (``layout``) it is stored
as an ordinary (N, N) ``jax.Array`` whose rows and columns are reordered
(:func:`block_cyclic_2d_orders`) so that ``P(row_axis, col_axis)`` gives every device its own
blocks in ascending order.

Entering it from row-sharded ``P((row_axis, col_axis), None)`` is an ``all_to_all`` over both
mesh axes (each device sends every other device the rows and columns that device owns), one
block column per ``fori_loop`` step so no second copy of the shard is made; leaving it is the
reverse. N must be a multiple of ``block_size * P * P_r`` (:func:`grid_multiple`), so that every
device's contiguous rows split evenly over the process rows; the solvers pad for you.

Example:
    >>> mesh = jax.make_mesh((2, 4), ("r", "c"))
    >>> a = jnp.arange(64.0 * 64).reshape(64, 64)
    >>> s = to_block_cyclic_2d(a, block_size=4, grid=("r", "c"), mesh=mesh)
    >>> rows, cols = block_cyclic_2d_orders(64, 4, 2, 4)
    >>> bool((s == a[jnp.ix_(rows, cols)]).all())
    True
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitValueError
from shardkit.linalg import layout
from shardkit.placement import constrain

__all__ = ["block_cyclic_2d_orders", "from_block_cyclic_2d", "to_block_cyclic_2d"]


def grid_multiple(nb: int, pr: int, pc: int) -> int:
    """N must be a multiple of this for the one-shot all-to-all into the 2-D layout."""
    return nb * pr * pc * pr


def rows_to_grid_local(a, *, nb, pr, pc, axes):
    """Inside ``shard_map``: local rows (N/P, N) of ``P((r, c), None)`` -> local 2-D cyclic
    block (N/P_r, N/P_c): an ``all_to_all`` over both mesh axes, one block column of each
    device per ``fori_loop`` step so no second copy of the shard is made."""
    rows, n = a.shape  # rows = Kr * nb: Kr row blocks, a multiple of pr
    kr = rows // nb
    kc = n // (nb * pc)  # column blocks per process column
    out = jnp.zeros((pc * rows, kc * nb), a.dtype)  # N/P_r rows: (kr / pr) nb from each of P

    def body(v, out):
        piece = lax.dynamic_slice_in_dim(a, v * pc * nb, pc * nb, axis=1)  # blocks v*pc + c
        piece = piece.reshape(kr // pr, pr, nb, pc, nb)  # row block t = u * pr + r
        piece = piece.transpose(1, 3, 0, 2, 4).reshape(pr * pc, (kr // pr) * nb, nb)
        piece = lax.all_to_all(piece, axes, 0, 0, tiled=True)  # (source d, its rows for me, nb)
        return lax.dynamic_update_slice_in_dim(out, piece.reshape(-1, nb), v * nb, axis=1)

    return lax.fori_loop(0, kc, body, out)


def grid_to_rows_local(a, *, nb, pr, pc, axes):
    """Inside ``shard_map``: the inverse of :func:`rows_to_grid_local`."""
    m_loc, n_loc = a.shape  # (N / P_r, N / P_c)
    rows = m_loc // pc  # N / P
    kr = rows // nb
    kc = n_loc // nb
    out = jnp.zeros((rows, kc * pc * nb), a.dtype)

    def body(v, out):
        piece = lax.dynamic_slice_in_dim(a, v * nb, nb, axis=1)  # (N/P_r, nb): my block v
        piece = piece.reshape(pr * pc, (kr // pr) * nb, nb)  # (dest d: the rows' source, ...)
        piece = lax.all_to_all(piece, axes, 0, 0, tiled=True)  # (source r*pc + c, rows, nb)
        piece = piece.reshape(pr, pc, kr // pr, nb, nb).transpose(2, 0, 3, 1, 4)
        return lax.dynamic_update_slice_in_dim(out, piece.reshape(rows, pc * nb), v * pc * nb, 1)

    return lax.fori_loop(0, kc, body, out)


def check_grid(mesh, grid, arg: str = "grid") -> tuple[str, str]:
    """Validates ``grid=(row_axis, col_axis)`` against the mesh."""
    if len(mesh.axis_names) < 2:
        raise ShardkitValueError(
            f"{arg}: the 2-D LU needs a mesh with two axes, but the mesh {dict(mesh.shape)} has "
            f"{len(mesh.axis_names)} axis; got grid={grid!r}. Fix: pass "
            "mesh=jax.make_mesh((2, 4), ('r', 'c')) with grid=('r', 'c'), or drop grid= for "
            "the 1-D LU."
        )
    if not (isinstance(grid, tuple | list) and len(grid) == 2 and grid[0] != grid[1]):
        raise ShardkitValueError(
            f"{arg}: expected two different mesh axis names (row_axis, col_axis), got {grid!r}. "
            f"Try grid={tuple(mesh.axis_names)[:2]!r}."
        )
    for name in grid:
        if name not in mesh.axis_names:
            raise ShardkitValueError(
                f"{arg}: mesh axis {name!r} is not in the mesh {dict(mesh.shape)}. "
                f"Use two of {tuple(mesh.axis_names)}."
            )
    return tuple(grid)


def grid_orders(n_pad: int, nb: int, pr: int, pc: int):
    """Global row and column indices in the storage order of the 2-D layout (host side)."""
    return layout.column_cyclic_order(n_pad, nb, pr), layout.column_cyclic_order(n_pad, nb, pc)


def block_cyclic_2d_orders(n: int, block_size: int, pr: int, pc: int):
    """Global row and column indices in the storage order of the 2-D layout.

    ``a[np.ix_(rows, cols)]`` is the 2-D block-cyclic storage of ``a``.

    Example:
        >>> rows, cols = block_cyclic_2d_orders(64, 4, 2, 4)
    """
    return grid_orders(n, block_size, pr, pc)


def _check(a, block_size, mesh, grid):
    shape = tuple(a.shape)
    if len(shape) != 2 or shape[0] != shape[1]:
        raise ShardkitValueError(f"a: expected a square matrix (N, N), got shape {shape}.")
    mesh, _ = layout.resolve_mesh(a, mesh, None, arg="a")
    r, c = check_grid(mesh, grid)
    pr, pc = mesh.shape[r], mesh.shape[c]
    step = grid_multiple(block_size, pr, pc)
    if block_size < 1 or shape[0] % step:
        raise ShardkitValueError(
            f"a: size {shape[0]} is not a multiple of block_size * P * P_r = {block_size} * "
            f"{pr * pc} * {pr} = {step} (grid {r}={pr} x {c}={pc}). Pad the matrix to "
            f"{-(-shape[0] // step) * step}, or use a smaller block_size."
        )
    return mesh, (r, c), pr, pc


@functools.partial(jax.jit, static_argnames=("mesh", "grid", "nb"))
def _to_2d(a, mesh, grid, nb):
    pr, pc = (mesh.shape[x] for x in grid)
    f = functools.partial(rows_to_grid_local, nb=nb, pr=pr, pc=pc, axes=grid)
    a = constrain(a, mesh, P(grid, None))
    return jax.shard_map(f, mesh=mesh, in_specs=P(grid, None), out_specs=P(*grid), check_vma=False)(
        a
    )  # check_vma=False: the kernels are shared with the 2-D LU, which needs it


@functools.partial(jax.jit, static_argnames=("mesh", "grid", "nb"))
def _from_2d(a, mesh, grid, nb):
    pr, pc = (mesh.shape[x] for x in grid)
    f = functools.partial(grid_to_rows_local, nb=nb, pr=pr, pc=pc, axes=grid)
    a = constrain(a, mesh, P(*grid))
    return jax.shard_map(f, mesh=mesh, in_specs=P(*grid), out_specs=P(grid, None), check_vma=False)(
        a
    )


def to_block_cyclic_2d(
    a: jax.Array, *, block_size: int, grid: tuple[str, str], mesh: Mesh | None = None
) -> jax.Array:
    """Converts an (N, N) matrix to the 2-D block-cyclic layout over ``grid``.

    Args:
        a: square matrix, any sharding (row-sharded ``P(grid, None)`` moves with one
            all-to-all; other shardings are first re-laid out by XLA).
        block_size: rows and columns per block (nb).
        grid: ``(row_axis, col_axis)``, two mesh axes forming the P_r x P_c process grid.
        mesh: the device mesh (default: ``a.sharding.mesh`` or ``jax.set_mesh``).

    Returns:
        The storage ``a[np.ix_(*block_cyclic_2d_orders(N, nb, P_r, P_c))]`` sharded
        ``P(row_axis, col_axis)``.

    Raises:
        ValueError: ``a`` is not square, N is not a multiple of ``nb * P * P_r``, a grid axis
            is not in the mesh, or no mesh.

    Example:
        >>> s = to_block_cyclic_2d(a, block_size=4, grid=("r", "c"), mesh=mesh)

    See also: :func:`from_block_cyclic_2d`, :func:`shardkit.linalg.to_column_cyclic` (1-D).
    """
    mesh, grid, _, _ = _check(a, block_size, mesh, grid)
    return _to_2d(a, mesh, grid, block_size)


def from_block_cyclic_2d(
    a: jax.Array, *, block_size: int, grid: tuple[str, str], mesh: Mesh | None = None
) -> jax.Array:
    """Converts 2-D block-cyclic storage back to natural order, row-sharded ``P(grid, None)``.

    Args:
        a: (N, N) storage from :func:`to_block_cyclic_2d` (or the ``lu`` field of factors made
            with ``grid=``).
        block_size: the block size the storage was made with.
        grid: ``(row_axis, col_axis)`` it was made with.
        mesh: the device mesh (default: ``a.sharding.mesh`` or ``jax.set_mesh``).

    Returns:
        The matrix in natural order, sharded ``P((row_axis, col_axis), None)``.

    Raises:
        ValueError: as :func:`to_block_cyclic_2d`.

    Example:
        >>> a2 = from_block_cyclic_2d(s, block_size=4, grid=("r", "c"), mesh=mesh)   # == a

    See also: :func:`to_block_cyclic_2d`.
    """
    mesh, grid, _, _ = _check(a, block_size, mesh, grid)
    return _from_2d(a, mesh, grid, block_size)
