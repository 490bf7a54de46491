"""Block-cyclic layouts for distributed dense linear algebra.

A dense N x N matrix is split into square blocks of ``block_size`` (nb) rows or columns. In the
1-D *column-block-cyclic* layout over P devices, column block ``j`` lives on device ``j % P``:
every device owns whole columns spread evenly over the matrix, so each device keeps work until
the end of an LU or Cholesky factorization (a contiguous column split would leave the first
devices idle after the first 1/P of the steps).

The layout is stored as an ordinary global ``jax.Array`` of shape (N, N) whose columns are
reordered so that ``P(None, axis_names)`` gives every device its own blocks, contiguous and in
ascending order: device ``d`` holds global column blocks ``d, d + P, d + 2P, ...``.
:func:`column_cyclic_order` gives that column order.

Going from row-sharded ``P(axis_names, None)`` to the column-block-cyclic layout is an
``all_to_all`` (each device sends the piece of its rows that belongs to each other device),
issued one block column at a time in a ``fori_loop`` so that every message is N x nb words and
no second copy of the shard is made; :func:`from_column_cyclic` is the reverse.

Example:
    >>> mesh = jax.make_mesh((8,), ("x",))
    >>> a = jnp.arange(64.0 * 64).reshape(64, 64)
    >>> ac = to_column_cyclic(a, mesh=mesh, block_size=4)
    >>> ac.sharding.spec
    P(None, 'x')
    >>> bool((from_column_cyclic(ac, mesh=mesh, block_size=4) == a).all())
    True
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AbstractMesh, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitTypeError, ShardkitValueError
from shardkit.mesh import concrete_mesh
from shardkit.placement import constrain

__all__ = [
    "column_cyclic_order",
    "from_column_cyclic",
    "padded_size",
    "resolve_mesh",
    "to_column_cyclic",
]


def resolve_mesh(
    x: jax.Array | None, mesh: Mesh | None, axis_names: str | Sequence[str] | None, *, arg: str
) -> tuple[Mesh, tuple[str, ...]]:
    """Returns the mesh and the mesh axes a kernel distributes over.

    The mesh comes from ``mesh=``, else from ``x.sharding`` when it is a ``NamedSharding`` (or
    from the traced type of ``x`` on Explicit axes), else from ``jax.set_mesh``.
    ``axis_names`` defaults to all mesh axes (flattened into one process dimension).

    Raises:
        ValueError: no mesh can be found, or an axis name is not in the mesh.
        TypeError: ``mesh`` is not a mesh.
    """
    if mesh is not None and not isinstance(mesh, Mesh | AbstractMesh):
        raise ShardkitTypeError(
            f"mesh: expected a jax.sharding.Mesh, got {type(mesh).__name__} {mesh!r}. Fix: pass "
            "mesh=jax.make_mesh((8,), ('x',)) and name its axes with axis_names=."
        )
    if mesh is None:
        sharding = getattr(x, "sharding", None)
        if isinstance(sharding, NamedSharding):
            mesh = sharding.mesh
        else:  # traced under Explicit axes, or a mesh set with jax.set_mesh
            typed = getattr(jax.typeof(x), "sharding", None) if x is not None else None
            abstract = getattr(typed, "mesh", None)
            if abstract is None or abstract.empty:
                abstract = jax.sharding.get_abstract_mesh()
            if abstract is not None and not abstract.empty:
                mesh = abstract
    if mesh is None:
        raise ShardkitValueError(
            f"{arg}: no mesh found (the array is not NamedSharding-placed and no mesh is set). "
            "Pass mesh=jax.make_mesh((8,), ('x',)) or call inside `with jax.set_mesh(mesh):`."
        )
    if axis_names is None:
        axes = tuple(mesh.axis_names)
    elif isinstance(axis_names, str):
        axes = (axis_names,)
    else:
        axes = tuple(axis_names)
    for name in axes:
        if name not in mesh.axis_names:
            raise ShardkitValueError(
                f"axis_names: mesh axis {name!r} is not in the mesh {dict(mesh.shape)}. "
                f"Use one of {tuple(mesh.axis_names)}."
            )
    if len(set(axes)) != len(axes):
        raise ShardkitValueError(
            f"axis_names: {axes} names a mesh axis twice; fix: name each axis once, e.g. "
            f"{tuple(dict.fromkeys(axes))}."
        )
    return mesh, axes


def onto_mesh(x, mesh, rows: tuple[str, ...] | None = None):
    """``x`` on the devices of ``mesh``: a concrete array committed elsewhere (to one device, or
    to another mesh) is moved there once, outside ``jit``, which refuses arguments whose devices
    differ from those of the mesh its program runs on; dim 0 sharded over the mesh axes
    ``rows`` when they divide it, else replicated. Numpy arrays, uncommitted arrays and tracers
    are returned as they are."""
    if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer) or not x.committed:
        return x
    concrete = concrete_mesh(mesh)  # jax.set_mesh's for an abstract one
    if not isinstance(concrete, Mesh) or x.sharding.device_set == set(concrete.devices.flat):
        return x
    whole = rows is None or x.ndim == 0 or x.shape[0] % n_devices(concrete, rows)
    spec = P() if whole else P(rows, *(None,) * (x.ndim - 1))
    return jax.device_put(x, NamedSharding(concrete, spec))


def n_devices(mesh: Mesh, axes: tuple[str, ...]) -> int:
    """Number of devices along the mesh axes ``axes``."""
    return int(np.prod([mesh.shape[a] for a in axes]))


def padded_size(n: int, block_size: int, p: int) -> int:
    """Smallest multiple of ``block_size * p`` that is at least ``n``.

    Example:
        >>> padded_size(100, 8, 8)
        128
    """
    for arg, value in (("block_size", block_size), ("p", p)):
        if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 1:
            raise ShardkitValueError(
                f"{arg}: must be a positive int, got {value!r}. Try padded_size(n, 32, 8)."
            )
    step = block_size * p
    return -(-n // step) * step


def column_cyclic_order(n: int, block_size: int, p: int) -> np.ndarray:
    """Global column indices in the storage order of the column-block-cyclic layout.

    ``a[:, column_cyclic_order(n, nb, p)]`` is the column-block-cyclic storage of ``a``.

    Raises:
        ValueError: ``n`` is not a multiple of ``block_size * p``.

    Example:
        >>> column_cyclic_order(8, 2, 2).tolist()
        [0, 1, 4, 5, 2, 3, 6, 7]
    """
    if n % (block_size * p):
        raise ShardkitValueError(
            f"n: {n} is not a multiple of block_size * devices = {block_size} * {p}. "
            f"Pad to padded_size(n, block_size, p) = {padded_size(n, block_size, p)}."
        )
    nblk = n // block_size
    blocks = np.arange(nblk).reshape(nblk // p, p).T.reshape(-1)  # device-major
    return (blocks[:, None] * block_size + np.arange(block_size)).reshape(-1)


def rows_to_cyclic_local(a: jax.Array, *, block_size: int, p: int, axes) -> jax.Array:
    """Inside ``shard_map``: local rows (N/P, N) -> local cyclic columns (N, N/P).

    One ``all_to_all`` in a ``fori_loop`` over the N / (nb P) block columns of every device:
    each moves N x nb words per device, and no copy of the whole shard is made besides the
    output.
    """
    r, n = a.shape
    k = n // (block_size * p)
    out = zeros_varying((p * r, k * block_size), a.dtype, axes)

    def body(i, out):
        piece = lax.dynamic_slice_in_dim(a, i * p * block_size, p * block_size, axis=1)
        piece = piece.reshape(r, p, block_size).transpose(1, 0, 2)  # (P dest, R, nb)
        piece = lax.all_to_all(piece, axes, 0, 0, tiled=True)  # (P src, R, nb)
        piece = piece.reshape(p * r, block_size)  # (N, nb): global block i * P + me
        return lax.dynamic_update_slice_in_dim(out, piece, i * block_size, axis=1)

    return lax.fori_loop(0, k, body, out)


def cyclic_to_rows_local(a: jax.Array, *, block_size: int, p: int, axes) -> jax.Array:
    """Inside ``shard_map``: local cyclic columns (N, N/P) -> local rows (N/P, N).

    The inverse of :func:`rows_to_cyclic_local`, one block column per loop step.
    """
    n, kc = a.shape
    k = kc // block_size
    r = n // p
    out = zeros_varying((r, n), a.dtype, axes)

    def body(i, out):
        piece = lax.dynamic_slice_in_dim(a, i * block_size, block_size, axis=1)  # (N, nb)
        piece = lax.all_to_all(piece.reshape(p, r, block_size), axes, 0, 0, tiled=True)
        piece = piece.transpose(1, 0, 2).reshape(r, p * block_size)  # blocks i*P .. i*P+P-1
        return lax.dynamic_update_slice_in_dim(out, piece, i * p * block_size, axis=1)

    return lax.fori_loop(0, k, body, out)


def _check_square(a, arg: str) -> None:
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ShardkitValueError(
            f"{arg}: expected a square matrix (N, N), got shape {tuple(a.shape)}. "
            "Pass a 2-D square array; for a stack of small systems use batched_solve."
        )


def _check_layout(n: int, block_size: int, p: int, arg: str) -> None:
    if block_size < 1:
        raise ShardkitValueError(f"block_size: must be >= 1, got {block_size}. Try block_size=32.")
    if n % (block_size * p):
        raise ShardkitValueError(
            f"{arg}: size {n} is not a multiple of block_size * devices = {block_size} * {p} "
            f"= {block_size * p}. Pad the matrix to {padded_size(n, block_size, p)} "
            "(the solvers pad for you), or pick a block_size that divides N / devices."
        )


@functools.partial(jax.jit, static_argnames=("mesh", "axes", "block_size"))
def _to_cyclic(a, mesh, axes, block_size):
    p = n_devices(mesh, axes)
    a = constrain(a, mesh, P(axes, None))
    f = functools.partial(rows_to_cyclic_local, block_size=block_size, p=p, axes=axes)
    return jax.shard_map(f, mesh=mesh, in_specs=P(axes, None), out_specs=P(None, axes))(a)


@functools.partial(jax.jit, static_argnames=("mesh", "axes", "block_size"))
def _from_cyclic(a, mesh, axes, block_size):
    p = n_devices(mesh, axes)
    a = constrain(a, mesh, P(None, axes))
    f = functools.partial(cyclic_to_rows_local, block_size=block_size, p=p, axes=axes)
    return jax.shard_map(f, mesh=mesh, in_specs=P(None, axes), out_specs=P(axes, None))(a)


def to_column_cyclic(
    a: jax.Array,
    *,
    block_size: int,
    mesh: Mesh | None = None,
    axis_names: str | Sequence[str] | None = None,
) -> jax.Array:
    """Converts an (N, N) matrix to the 1-D column-block-cyclic layout.

    Args:
        a: square matrix, any sharding (row-sharded ``P(axis_names, None)`` moves with one
            all-to-all; a replicated matrix is sliced locally first).
        block_size: columns per block (nb); N must be a multiple of ``nb * P``.
        mesh: the device mesh; defaults to ``a.sharding.mesh`` or the mesh set by
            ``jax.set_mesh``.
        axis_names: mesh axes to distribute over (default: all, flattened).

    Returns:
        The (N, N) storage array ``a[:, column_cyclic_order(N, nb, P)]`` sharded
        ``P(None, axis_names)``.

    Raises:
        ValueError: ``a`` is not square, N is not a multiple of ``nb * P``, or no mesh.

    Example:
        >>> ac = to_column_cyclic(a, mesh=jax.make_mesh((8,), ("x",)), block_size=4)

    See also: :func:`from_column_cyclic`, :func:`column_cyclic_order`.
    """
    _check_square(a, "a")
    mesh, axes = resolve_mesh(a, mesh, axis_names, arg="a")
    _check_layout(a.shape[0], block_size, n_devices(mesh, axes), "a")
    return _to_cyclic(a, mesh, axes, block_size)


def from_column_cyclic(
    a: jax.Array,
    *,
    block_size: int,
    mesh: Mesh | None = None,
    axis_names: str | Sequence[str] | None = None,
) -> jax.Array:
    """Converts column-block-cyclic storage back to a row-sharded matrix in natural order.

    Args:
        a: (N, N) storage array from :func:`to_column_cyclic` (or the ``lu`` field of
            :class:`~shardkit.linalg.LUFactors`).
        block_size: the block size the storage was made with.
        mesh: the device mesh (default: ``a.sharding.mesh`` or ``jax.set_mesh``).
        axis_names: mesh axes the storage is distributed over (default: all).

    Returns:
        The (N, N) matrix in natural column order, sharded ``P(axis_names, None)``.

    Raises:
        ValueError: ``a`` is not square, N is not a multiple of ``nb * P``, or no mesh.

    Example:
        >>> a2 = from_column_cyclic(ac, mesh=mesh, block_size=4)   # == a

    See also: :func:`to_column_cyclic`.
    """
    _check_square(a, "a")
    mesh, axes = resolve_mesh(a, mesh, axis_names, arg="a")
    _check_layout(a.shape[0], block_size, n_devices(mesh, axes), "a")
    return _from_cyclic(a, mesh, axes, block_size)


def pad_identity(a: jax.Array, n_pad: int) -> jax.Array:
    """Pads (M, N) to (n_pad, n_pad) with an identity block from S = max(M, N) on, elementwise
    (a scatter into a sharded matrix is refused on Explicit axes). A non-square matrix first
    gets zero rows or columns up to S x S."""
    m, n = a.shape
    if (m, n) == (n_pad, n_pad):
        return a
    a = jnp.pad(a, ((0, n_pad - m), (0, n_pad - n)))
    i = lax.broadcasted_iota(jnp.int32, (n_pad, n_pad), 0)
    j = lax.broadcasted_iota(jnp.int32, (n_pad, n_pad), 1)
    return jnp.where((i == j) & (i >= max(m, n)), jnp.ones((), a.dtype), a)


def zeros_varying(shape, dtype, axes) -> jax.Array:
    """Zeros typed as varying over ``axes`` (for ``fori_loop`` carries inside ``shard_map``)."""
    return lax.pcast(jnp.zeros(shape, dtype), axes, to="varying")


DEFAULT_BLOCK_SIZE = 32


def n_chunks(blocks: int, target: int = 4) -> int:
    """Largest divisor of ``blocks`` that is at most ``target``: the column chunks of a trailing
    update (chunks must tile exactly; temporaries ~ shard / chunks)."""
    return max(g for g in range(1, min(blocks, target) + 1) if blocks % g == 0)


def global_index(local_len, nb, p, me):
    """Global index of each of a device's ``local_len`` block-cyclic rows or columns (block
    size ``nb`` over ``p`` devices, this device ``me``)."""
    i = jnp.arange(local_len)
    return ((i // nb) * p + me) * nb + i % nb


def check_array(x, arg: str) -> None:
    """Raises TypeError unless ``x`` is an array (a list has no shape to report)."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise ShardkitTypeError(
            f"{arg}: expected an array, got {type(x).__name__}. Fix: pass jnp.asarray({arg}) "
            "(jnp.linalg refuses lists too)."
        )


def check_flag(value, arg: str) -> bool:
    """Returns ``value`` as a bool, raising TypeError unless it is one (numpy's too): read as
    truthy, scipy's ``trans='N'`` (no transpose) or ``lower='upper'`` would do the opposite."""
    if not isinstance(value, bool | np.bool_):
        raise ShardkitTypeError(
            f"{arg}: expected True or False, got {type(value).__name__} {value!r}. Fix: pass "
            f"{arg}=True or {arg}=False (scipy's trans='N'/'T' is transpose=False/True)."
        )
    return bool(value)


def check_matrix(a, arg: str, *, square: bool = True, stacked: str | None = None) -> None:
    """Raises unless ``a`` is a (square, if ``square``) floating or complex matrix; the message
    points a stack of matrices to the batched function ``stacked`` when there is one."""
    check_array(a, arg)
    shape = tuple(a.shape)
    kind, dims = ("square matrix", "N, N") if square else ("matrix", "M, N")
    hint = f"; for a stack of matrices (B, {dims}) use {stacked}" if stacked else ""
    if len(shape) != 2 or (square and shape[0] != shape[1]):
        raise ShardkitValueError(
            f"{arg}: expected a {kind} ({dims}), got shape {shape}. "
            f"Pass a 2-D{' square' if square else ''} array{hint}."
        )
    if 0 in shape:
        raise ShardkitValueError(
            f"{arg}: the matrix is empty (shape {shape}); the distributed factorizations need "
            f"at least one row and column. Fix: skip the call for an empty system (jnp.linalg "
            f"gives its empty or unit result)."
        )
    check_dtype(a, arg)


def solve_dtype(*dtypes) -> jnp.dtype:
    """The dtype a solve with operands of `dtypes` computes in, as `jnp.linalg.solve` promotes:
    float32 with float64 is float64 (without x64, float32), integers and bools are floats."""
    full = jnp.result_type(*(jax.dtypes.canonicalize_dtype(d) for d in dtypes))
    return full if jnp.issubdtype(full, jnp.inexact) else jnp.result_type(full, jnp.float32)


_LAPACK_DTYPES = ("float32", "float64", "complex64", "complex128")


def check_dtype(a, arg: str, *, integers: bool = False) -> None:
    """Raises TypeError unless ``a`` is float32, float64, complex64 or complex128 (what LAPACK
    factors: half precision is refused, as numpy.linalg refuses it), or, with ``integers``, an
    integer or bool array (promoted to float, as ``jnp.linalg.solve`` does)."""
    dtype = jnp.dtype(a.dtype)
    if dtype.name in _LAPACK_DTYPES or (integers and not jnp.issubdtype(dtype, jnp.inexact)):
        return
    raise ShardkitTypeError(
        f"{arg}: expected a floating or complex dtype (float32, float64, complex64, "
        f"complex128), got {dtype}. Convert with {arg}.astype(jnp.float32)."
    )


def block_size_for(nb: int | None, n: int, p: int = 1) -> int:
    """The panel width for an N x N matrix padded to a multiple of ``nb * p``.

    ``nb`` is checked when given. When None, the widest of 256, 128, 64 and 32 whose (N, nb)
    panel is at most a quarter of a device's N^2 / p shard (``4 p nb <= N``: the factorization
    holds a few panel-sized buffers, so per-device memory stays within 3 shards) and that pads
    N no more than 3% beyond what 32 would; capped at N so any N works. Wider panels mean fewer
    steps, so fewer collective rounds and larger local GEMMs.

    Example:
        >>> block_size_for(None, 2048, 8), block_size_for(None, 2100, 8), block_size_for(None, 20)
        (64, 32, 20)
    """
    if nb is not None:
        check_block_size(nb, n)
        return int(nb)
    least = padded_size(n, DEFAULT_BLOCK_SIZE, p)
    for wide in (256, 128, 64):
        if 4 * p * wide <= n and padded_size(n, wide, p) <= 1.03 * least:
            return wide
    return max(1, min(DEFAULT_BLOCK_SIZE, n))


def check_block_size(nb: int, n: int) -> None:
    if isinstance(nb, np.integer):  # e.g. np.int64 from numpy arithmetic
        nb = int(nb)
    if not isinstance(nb, int) or isinstance(nb, bool) or nb < 1:
        raise ShardkitValueError(
            f"block_size: must be a positive int, got {nb!r}. Try block_size=32."
        )
    if nb > n:
        raise ShardkitValueError(
            f"block_size: {nb} is larger than the matrix size N = {n}. "
            f"Pass block_size <= {n}, e.g. block_size={min(DEFAULT_BLOCK_SIZE, n)}."
        )
