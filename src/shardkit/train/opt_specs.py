"""Layouts for the state of any optax transformation, matched to the parameters by path.

Optimizer state rarely is a plain copy of the parameters: `masked` and `multi_transform` put
empty `MaskedNode`s where a parameter is not theirs, `adafactor` keeps factored statistics
(a row and a column vector per matrix), `MultiSteps` and `inject_hyperparams` add counters and
hyperparameters. So each state leaf is placed by what it is, read from its key path and shape:

* its path ends with a parameter's path and it has the parameter's shape: the parameter's
  optimizer layout ("mirrors");
* it ends with a parameter's path and has the parameter's shape with one dim removed (or kept
  as 1): the parameter's layout without that dim's entry ("factored"), where it still divides;
* anything else (step counts, scalars, hyperparameters): replicated ("replicated").
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
from jax.sharding import PartitionSpec as P

from shardkit.common import path_str

__all__ = ["OptPlacement", "optimizer_state_specs"]


class OptPlacement(NamedTuple):
    """How one optimizer-state leaf was placed: its path, the spec, how, and after which
    parameter (None when replicated for want of one)."""

    path: str
    spec: P
    how: str  # "mirrors", "factored" or "replicated"
    param: str | None


def _suffix_match(path: str, params: dict[str, Any]) -> str | None:
    """The longest parameter path that `path` ends with (at a "/" boundary)."""
    best = None
    for p in params:
        if (path == p or path.endswith("/" + p)) and (best is None or len(p) > len(best)):
            best = p
    return best


def _factored(shape: tuple, pshape: tuple, spec: P, axis_sizes: dict) -> P | None:
    """`spec` adapted to a statistic of `pshape` with one dim dropped or kept as 1."""
    entries = list(spec) + [None] * (len(pshape) - len(spec))
    for d in range(len(pshape)):
        if shape == pshape[:d] + pshape[d + 1 :]:
            kept = entries[:d] + entries[d + 1 :]
        elif shape == pshape[:d] + (1,) + pshape[d + 1 :]:
            kept = entries[:d] + [None] + entries[d + 1 :]
        else:
            continue
        return P(*(e if _divides(size, e, axis_sizes) else None for size, e in zip(shape, kept)))
    return None


def _divides(size: int, entry: Any, axis_sizes: dict) -> bool:
    if entry is None:
        return True
    n = 1
    for a in entry if isinstance(entry, tuple) else (entry,):
        n *= axis_sizes.get(a, 1)
    return size % n == 0


def optimizer_state_specs(
    opt_state: Any, params: Any, param_specs: Any, axis_sizes: dict[str, int]
) -> tuple[Any, list[OptPlacement]]:
    """PartitionSpecs for every leaf of `opt_state`, and how each was placed.

    Args:
        opt_state: the optimizer state (arrays or ShapeDtypeStructs), any structure.
        params: the parameters it was built from.
        param_specs: the parameters' optimizer-state layouts (a tree of `PartitionSpec`).
        axis_sizes: mesh axis sizes, to keep only splits that divide.

    Returns:
        (a tree of specs mirroring `opt_state`, one `OptPlacement` per leaf).

    Example:
        >>> import optax
        >>> params = {"w": jnp.zeros((8, 4))}
        >>> state = optax.adafactor(1e-2).init(params)
        >>> specs, how = optimizer_state_specs(state, params, {"w": P("fsdp", None)}, {"fsdp": 8})
        >>> sorted({h.how for h in how})
        ['factored', 'mirrors', 'replicated']
    """
    flat_p = jax.tree_util.tree_flatten_with_path(params)[0]
    flat_s = jax.tree.leaves(param_specs, is_leaf=lambda x: isinstance(x, P))
    by_path = {
        path_str(k): (tuple(getattr(v, "shape", ())), s) for (k, v), s in zip(flat_p, flat_s)
    }
    leaves, treedef = jax.tree_util.tree_flatten_with_path(opt_state)
    specs, report = [], []
    for key, leaf in leaves:
        path, shape = path_str(key), tuple(getattr(leaf, "shape", ()))
        match = _suffix_match(path, by_path)
        spec, how = P(), "replicated"
        if match is not None and shape:
            pshape, pspec = by_path[match]
            if shape == pshape:
                spec, how = pspec, "mirrors"
            else:
                factored = _factored(shape, pshape, pspec, axis_sizes)
                if factored is not None:
                    spec, how = factored, "factored"
        specs.append(spec)
        report.append(OptPlacement(path, spec, how, match if how != "replicated" else None))
    return jax.tree_util.tree_unflatten(treedef, specs), report
