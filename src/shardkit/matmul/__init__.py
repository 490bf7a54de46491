"""Distributed matmul: the four sharding cases, collective matmul, SUMMA, a chain planner.

``shardkit.matmul`` is both a module and a function: ``shardkit.matmul(A, B, algorithm=...)``
calls :func:`matmul`, and ``shardkit.matmul.chain([A, B, C, D])`` plans a product of several
matrices with the fewest communicated bytes.

Design: every algorithm first *fits* the operands' layout (``A[M_X, K] @ B[K, N_Y]``), which
yields a :class:`Method`: the output spec, the collectives the compiled program will hold with
their bytes, and the peak per-device memory. The cost model ranks Methods for
``algorithm="auto"`` and :func:`explain`; :func:`chain` ranks whole parenthesizations with the
same numbers; tests check the compiled HLO against each Method's collectives.

Example:
    >>> import shardkit
    >>> C = shardkit.matmul(A, B)                        # auto
    >>> print(shardkit.matmul.explain(A, B))             # why
    >>> plan = shardkit.matmul.chain([A, B, C, D])       # parenthesization + layouts
    >>> E = plan(A, B, C, D)
"""

import sys
import types

from shardkit.common import deprecated_aliases
from shardkit.matmul._layout import MatmulCollective as MatmulCollective
from shardkit.matmul._layout import MatmulLayoutError as MatmulLayoutError
from shardkit.matmul._layout import Method as Method
from shardkit.matmul.api import compile_matmul as compile_matmul
from shardkit.matmul.api import matmul as matmul
from shardkit.matmul.chain import ChainPlan as ChainPlan
from shardkit.matmul.chain import chain as chain
from shardkit.matmul.chain import gspmd_chain as gspmd_chain
from shardkit.matmul.cost import ALGORITHMS as ALGORITHMS
from shardkit.matmul.cost import Explanation as Explanation
from shardkit.matmul.cost import explain as explain

__all__ = [
    "ALGORITHMS",
    "ChainPlan",
    "MatmulCollective",
    "Explanation",
    "MatmulLayoutError",
    "Method",
    "chain",
    "compile_matmul",
    "explain",
    "gspmd_chain",
    "matmul",
]


class _CallableModule(types.ModuleType):
    """Lets ``shardkit.matmul(A, B)`` call :func:`matmul` while the module keeps its names."""

    def __call__(self, a, b, **kwargs):
        return matmul(a, b, **kwargs)


sys.modules[__name__].__class__ = _CallableModule


# renamed: one class per name (shardkit.inspection has its own Collective)
__getattr__ = deprecated_aliases(__name__, {"Collective": ("MatmulCollective", MatmulCollective)})
