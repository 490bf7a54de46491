"""Stashed backward residuals: keep what depends on the micro-batch, rebuild the rest.

``jax.vjp`` closes over residuals; some depend on the micro-batch (activations), others only
on the parameters (the weights themselves, casts or transposes of them). :class:`Residuals`
finds which is which by following each residual back through the vjp's jaxpr, so the
executor stashes only the first kind per micro-batch and rebuilds the second from the
parameters in the backward (XLA drops the rest of that re-trace): no slot holds weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal


def dependent_leaves(fn: Callable, args: tuple, live: Sequence[int]) -> list[bool]:
    """For each residual leaf of ``jax.vjp(fn, *args)``: does it depend on ``args[live]``?"""

    def res(*a):
        return jax.tree.leaves(jax.vjp(fn, *a)[1])

    closed = jax.make_jaxpr(res)(*args)
    jaxpr = closed.jaxpr
    flat_in = [jax.tree.leaves(a) for a in args]
    starts = np.cumsum([0] + [len(f) for f in flat_in])
    dep = set()
    for j in live:
        dep.update(id(v) for v in jaxpr.invars[starts[j] : starts[j + 1]])
    for eqn in jaxpr.eqns:
        if any(id(v) in dep for v in eqn.invars if not isinstance(v, Literal)):
            dep.update(id(v) for v in eqn.outvars)
    return [not isinstance(v, Literal) and id(v) in dep for v in jaxpr.outvars]


class Residuals:
    """Stashes the micro-batch-dependent vjp residuals of a function, rebuilds its vjp later."""

    def __init__(self, fn: Callable, args: tuple, live: Sequence[int], policy: Callable | None):
        if policy is not None:  # keep what the policy saves, recompute the rest in the backward
            fn = jax.checkpoint(fn, policy=policy)
        self.fn, self.live = fn, tuple(live)
        self.mask = dependent_leaves(fn, args, live)
        _, vjp = jax.vjp(fn, *args)
        self.proto = [a for a, k in zip(jax.tree.leaves(vjp), self.mask) if k]

    def forward(self, *args):
        out, vjp = jax.vjp(self.fn, *args)
        return out, [a for a, k in zip(jax.tree.leaves(vjp), self.mask) if k]

    def vjp(self, stashed, *args):
        """The vjp function at ``args`` whose live arguments are only placeholders."""
        args = tuple(
            jax.tree.map(jnp.zeros_like, a) if j in self.live else a for j, a in enumerate(args)
        )
        _, fresh = jax.vjp(self.fn, *args)
        leaves, treedef = jax.tree.flatten(fresh)
        it = iter(stashed)
        leaves = [next(it) if k else a for a, k in zip(leaves, self.mask)]
        return jax.tree.unflatten(treedef, leaves)
