"""Split a stage's backward into its input-gradient part and its weight-gradient part.

Zero-bubble schedules run a stage's backward in two ops: ``BI`` (the input gradient, which the
previous stage waits for) and ``W`` (the weight gradients). Two separate ``jax.vjp`` calls
would make ``W`` redo the part of the input-gradient chain inside the stage that it needs (the
cotangent at every layer's output). :class:`SplitBackward` instead traces the backward once,
flattens it (inlining calls and remat, unrolling scans), and cuts it in two: ``bi`` runs the
equations the input gradient needs and also returns the values the rest reads (the "cut":
cotangents at matmul outputs, activations rebuilt from stashed residuals); ``w`` runs only
the remaining equations, essentially the weight-gradient matmuls, from the same inputs plus
the cut. The executor keeps the cut in a buffer slot from ``BI`` to ``W``.

Example:
    >>> bwd = lambda w, g: jax.vjp(lambda w, x: jnp.tanh(x @ w), w, x)[1](g)  # (dw, dx)
    >>> sp = SplitBackward(bwd, (w, g), grads_of=(0,), input_grads=(1,))
    >>> dx, cut = sp.bi(w, g)
    >>> (dw,) = sp.w(w, g, cut)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.extend.core import Literal

from shardkit.compat import scan_parts

_CALLS = {"closed_call": "call_jaxpr", "core_call": "call_jaxpr", "remat2": "jaxpr",
          "checkpoint": "jaxpr", "pjit": "jaxpr", "jit": "jaxpr",
          "custom_jvp_call": "call_jaxpr"}  # fmt: skip


def _read(env, v):
    return v.val if isinstance(v, Literal) else env[v]


def _flat_eval(jaxpr, consts, args) -> list:
    """Evaluates ``jaxpr`` binding primitives, inlining calls and unrolling scans."""
    env = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for e in jaxpr.eqns:
        ins = [_read(env, v) for v in e.invars]
        name = e.primitive.name
        if name in _CALLS and _CALLS[name] in e.params:
            sub = e.params[_CALLS[name]]
            outs = _flat_eval(getattr(sub, "jaxpr", sub), getattr(sub, "consts", ()), ins)
        elif name == "scan":
            outs = _unrolled_scan(e.params, ins)
        else:
            outs = e.primitive.bind(*ins, **e.params)
            outs = outs if e.primitive.multiple_results else [outs]
        env.update(zip(e.outvars, outs, strict=True))
    return [_read(env, v) for v in jaxpr.outvars]


def _unrolled_scan(params, ins) -> list:
    nc, nk, body, body_consts = scan_parts(params)
    n = params["length"]
    consts, carry, xs = ins[:nc], list(ins[nc : nc + nk]), ins[nc + nk :]
    n_ys = len(body.outvars) - nk
    ys: list = [None] * n
    for i in reversed(range(n)) if params["reverse"] else range(n):
        outs = _flat_eval(body, body_consts, [*consts, *carry, *(x[i] for x in xs)])
        carry, ys[i] = outs[:nk], outs[nk:]
    stacked = [jnp.stack([ys[i][j] for i in range(n)]) for j in range(n_ys)]
    return [*carry, *stacked]


def _needed(eqns, outvars) -> tuple[list, set]:
    """The equations (in order) that ``outvars`` depend on."""
    need = {v for v in outvars if not isinstance(v, Literal)}
    keep = []
    for e in reversed(eqns):
        if any(o in need for o in e.outvars):
            keep.append(e)
            need.update(v for v in e.invars if not isinstance(v, Literal))
    return keep[::-1], need


def _run(eqns, env) -> None:
    for e in eqns:
        outs = e.primitive.bind(*(_read(env, v) for v in e.invars), **e.params)
        env.update(zip(e.outvars, outs if e.primitive.multiple_results else [outs], strict=True))


class SplitBackward:
    """``bwd(*args) -> tuple`` split into ``bi(*args) -> (input grads, cut)`` and
    ``w(*args, cut) -> weight grads``.

    Args:
        bwd: the backward function; returns a tuple of pytrees.
        args: example arguments (arrays or ShapeDtypeStructs) with the shapes it runs on.
        grads_of: positions in ``bwd``'s output tuple of the weight gradients (``w``'s part).
        input_grads: positions of the input gradients (``bi``'s part).

    Attributes:
        cut_proto: ShapeDtypeStructs of the values ``bi`` hands to ``w``.
    """

    def __init__(self, bwd: Callable, args: tuple, *, grads_of: Sequence[int],
                 input_grads: Sequence[int]):  # fmt: skip
        closed = jax.make_jaxpr(bwd)(*args)
        self._out_tree = jax.tree.structure(jax.eval_shape(bwd, *args))
        flat = jax.make_jaxpr(lambda *a: _flat_eval(closed.jaxpr, closed.consts, a))(
            *jax.tree.leaves(args)
        )
        jaxpr, self._consts = flat.jaxpr, flat.consts
        outs = jax.eval_shape(bwd, *args)
        sizes = [len(jax.tree.leaves(o)) for o in outs]
        starts = [sum(sizes[:k]) for k in range(len(sizes))]

        def vars_of(positions):
            return [jaxpr.outvars[starts[k] + j] for k in positions for j in range(sizes[k])]

        self._grads_of, self._input_grads = tuple(grads_of), tuple(input_grads)
        self._outs = outs
        self._bi_out, self._w_out = vars_of(input_grads), vars_of(grads_of)
        self._bi, _ = _needed(jaxpr.eqns, self._bi_out)
        in_bi = {id(e) for e in self._bi}
        made_by_bi = {o for e in self._bi for o in e.outvars}
        self._w = [e for e in _needed(jaxpr.eqns, self._w_out)[0] if id(e) not in in_bi]
        cut: list = []
        for v in [v for e in self._w for v in e.invars] + list(self._w_out):
            if not isinstance(v, Literal) and v in made_by_bi and v not in cut:
                cut.append(v)
        self._cut = cut
        self._jaxpr = jaxpr
        self.cut_proto = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in cut]

    def _env(self, args):
        env = dict(zip(self._jaxpr.constvars, self._consts, strict=True))
        env.update(zip(self._jaxpr.invars, jax.tree.leaves(args), strict=True))
        return env

    def _unflatten(self, positions, leaves):
        it = iter(leaves)
        out = []
        for k in positions:
            tree = jax.tree.structure(self._outs[k])
            out.append(jax.tree.unflatten(tree, [next(it) for _ in range(tree.num_leaves)]))
        return tuple(out)

    def bi(self, *args) -> tuple[tuple, list]:
        """(the input gradients, the cut) at ``args``."""
        env = self._env(args)
        _run(self._bi, env)
        grads = self._unflatten(self._input_grads, [_read(env, v) for v in self._bi_out])
        return grads, [env[v] for v in self._cut]

    def w(self, *args_and_cut) -> tuple:
        """The weight gradients at ``args`` given the cut ``bi`` returned (the last argument)."""
        *args, cut = args_and_cut
        env = self._env(tuple(args))
        env.update(zip(self._cut, cut, strict=True))
        _run(self._w, env)
        return self._unflatten(self._grads_of, [_read(env, v) for v in self._w_out])
