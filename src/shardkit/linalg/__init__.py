"""Distributed dense linear algebra: LU, solves, Cholesky, triangular solves, CG, batched solves.

Every routine keeps the matrix distributed (``jax.shard_map`` with explicit collectives) and
works on Auto and Explicit mesh axes; none all-gathers the matrix. See ``docs/linalg.md``.
"""

from shardkit.linalg.batched import batched_det as batched_det
from shardkit.linalg.batched import batched_lu as batched_lu
from shardkit.linalg.batched import batched_slogdet as batched_slogdet
from shardkit.linalg.batched import batched_solve as batched_solve
from shardkit.linalg.cg import CGInfo as CGInfo
from shardkit.linalg.cg import cg as cg
from shardkit.linalg.cholesky import CholeskyFactors as CholeskyFactors
from shardkit.linalg.cholesky import NotPositiveDefiniteError as NotPositiveDefiniteError
from shardkit.linalg.cholesky import cho_solve as cho_solve
from shardkit.linalg.cholesky import cholesky as cholesky
from shardkit.linalg.det import SlogdetResult as SlogdetResult
from shardkit.linalg.det import det as det
from shardkit.linalg.det import slogdet as slogdet
from shardkit.linalg.layout import column_cyclic_order as column_cyclic_order
from shardkit.linalg.layout import from_column_cyclic as from_column_cyclic
from shardkit.linalg.layout import padded_size as padded_size
from shardkit.linalg.layout import to_column_cyclic as to_column_cyclic
from shardkit.linalg.layout2d import block_cyclic_2d_orders as block_cyclic_2d_orders
from shardkit.linalg.layout2d import from_block_cyclic_2d as from_block_cyclic_2d
from shardkit.linalg.layout2d import to_block_cyclic_2d as to_block_cyclic_2d
from shardkit.linalg.lu import LUFactors as LUFactors
from shardkit.linalg.lu import SingularMatrixError as SingularMatrixError
from shardkit.linalg.lu import lu as lu
from shardkit.linalg.solve import lu_solve as lu_solve
from shardkit.linalg.solve import solve as solve
from shardkit.linalg.triangular import triangular_solve as triangular_solve

__all__ = [
    "CholeskyFactors",
    "NotPositiveDefiniteError",
    "SlogdetResult",
    "cho_solve",
    "cholesky",
    "det",
    "slogdet",
    "CGInfo",
    "batched_det",
    "batched_lu",
    "batched_slogdet",
    "batched_solve",
    "block_cyclic_2d_orders",
    "cg",
    "LUFactors",
    "SingularMatrixError",
    "column_cyclic_order",
    "from_block_cyclic_2d",
    "from_column_cyclic",
    "lu",
    "lu_solve",
    "padded_size",
    "solve",
    "to_block_cyclic_2d",
    "to_column_cyclic",
    "triangular_solve",
]
