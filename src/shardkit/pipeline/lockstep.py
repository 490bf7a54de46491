"""The lockstep table executor: the body `shardkit.pipeline.engine` runs inside `shard_map`.

Every device scans the rows of the schedule's step table (`slots.SlotPlan.rows`: named
`StepRow` / `LaneRow` fields). Per lane, ``lax.switch`` runs the device's op (forward,
backward, input-gradient or weight-gradient backward, or nothing) on its chunk of the stage
parameters, reading its inputs from buffer slots; at the end of the step one ``ppermute``
sends activations forward and one sends gradients backward. The loop state is a `_Carry`.
"""

from __future__ import annotations

import functools
import types
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from shardkit.pipeline import slots as sl
from shardkit.pipeline import spmd
from shardkit.pipeline.residuals import Residuals
from shardkit.pipeline.schedule import BI, IDLE, B, F, W
from shardkit.pipeline.split import SplitBackward

__all__ = ["LANE_SCOPE", "lane_branches", "table_body"]

LANE_SCOPE = "pipeline_lane{}"
"""The ``jax.named_scope`` of lane ``l``'s ``lax.switch`` (an ``op_name`` component in HLO)."""


def lane_branches(kinds) -> tuple[int, ...]:
    """The non-idle kinds of a lane, sorted: kind ``kinds[j]`` runs as branch ``1 + 2j`` (or
    ``2 + 2j`` on the last model stage, where the loss head follows); branch 0 is idle."""
    return tuple(sorted(set(int(k) for k in kinds) - {IDLE}))


def _last(stage_fn, last_fn):
    def fn(pc, lp, x, t):
        return last_fn(lp, stage_fn(pc, x), t)

    return fn


class _Slots(NamedTuple):
    """The buffers of slots: received activations and gradients, stashed residuals, the last
    stage's residuals, what BI hands W (the last stage's apart)."""

    x: Any
    g: Any
    res: Any
    last: Any
    cut: Any
    last_cut: Any


class _Carry(NamedTuple):
    """The executor's loop state: the slots, the input cotangents, the gradient accumulators
    and the loss."""

    slots: _Slots
    gxs: Any
    grads: Any
    glast: Any
    loss: Any


class _Buffers(NamedTuple):
    """What a lane's branch reads: the micro-batched inputs and targets, the slots and the
    stage parameters."""

    xs: Any
    ts: Any
    slots: _Slots
    sp: Any


def table_body(stage_fn, last_fn, plan: sl.SlotPlan, *, stage_axis, v, input_grad, stash_policy):
    tbl = plan.table
    p = tbl.p
    static = dict(
        stage_fn=stage_fn, last_fn4=_last(stage_fn, last_fn), plan=plan, stage_axis=stage_axis,
        v=v, input_grad=input_grad, stash_policy=stash_policy, p=p, L=tbl.lanes, m=tbl.m,
        stash=plan.stash,
        rows=jax.tree.map(jnp.asarray, plan.rows()),  # a StepRow of [T, p] int32 arrays
        fwd_perm=[(d, (d + 1) % p) for d in range(p if v > 1 else p - 1)],
        bwd_perm=[((d + 1) % p, d) for d in range(p if v > 1 else p - 1)],
    )  # fmt: skip

    def body(sp, lp, xs, ts):
        tr = _trace(static, sp, lp, xs, ts)
        lanes = [_branches_for(tr, lane) for lane in range(tr.L)]
        slots = _Slots(
            x=spmd.buffer(tr.x0, plan.x_slots + 1),
            g=spmd.buffer(tr.x0, plan.g_slots + 1),
            res=spmd.buffer(tr.mid.proto, plan.res_slots + 1) if tr.stash else None,
            last=spmd.buffer(tr.end.proto, plan.last_slots + 1) if tr.stash else None,
            cut=spmd.buffer(tr.cut_zero, plan.cut_slots + 1) if tr.split else None,
            last_cut=spmd.buffer(tr.lcut_zero, plan.last_cut_slots + 1) if tr.split else None,
        )
        carry = _Carry(
            slots=slots,
            gxs=spmd.buffer(tr.x0, tr.m) if input_grad else None,  # the output: no trash slot
            grads=_zeros(sp) if tr.grad_lanes else None,
            glast=_zeros(lp) if tr.grad_lanes else None,
            loss=tr.vary(jnp.zeros((), jnp.float32)),
        )
        carry, _ = lax.scan(functools.partial(_step, tr, lanes), carry, tr.rows)
        return carry.loss, carry.grads, carry.glast, carry.gxs

    return body


def _zeros(a):
    return jax.tree.map(jnp.zeros_like, a)


def _trace(static: dict, sp, lp, xs, ts) -> types.SimpleNamespace:
    """What one trace of the executor shares: the static settings, this device's index, the
    example operands, the residual and split-backward helpers and the loss seed."""
    tr = types.SimpleNamespace(**static, sp=sp, lp=lp, xs=xs, ts=ts)
    tr.d = lax.axis_index(tr.stage_axis)
    tr.vary = lambda t: spmd.vary(t, jax.typeof(xs).manual_axis_type.varying)
    tr.x0, t0 = spmd.index(xs, 0), spmd.index(ts, 0)
    p0 = spmd.index(sp, 0)
    loss_dtype = jax.eval_shape(tr.last_fn4, p0, lp, tr.x0, t0).dtype
    tr.has = [set(k) for k in tr.plan.lane_kinds]
    tr.grad_lanes = any(h & {B, W} for h in tr.has)
    tr.mid = tr.end = tr.msplit = tr.lsplit = tr.cut_zero = tr.lcut_zero = None
    if tr.stash:
        policy = tr.stash_policy
        tr.mid = Residuals(tr.stage_fn, (p0, tr.x0), live=(1,), policy=policy)
        tr.end = Residuals(tr.last_fn4, (p0, lp, tr.x0, t0), live=(2, 3), policy=policy)
    tr.seed = tr.vary(jnp.asarray(1.0 / tr.m, loss_dtype))
    tr.split = tr.stash and any(W in k for k in tr.has)
    if tr.split:  # BI hands W what it needs, so W runs only the weight-gradient equations
        mid, end = tr.mid, tr.end
        tr.msplit = SplitBackward(
            lambda st, pc, x, g: mid.vjp(st, pc, x)(g),
            (mid.proto, p0, tr.x0, tr.x0), grads_of=(0,), input_grads=(1,),
        )  # fmt: skip
        tr.lsplit = SplitBackward(
            lambda st, pc, lp, x, t, s: end.vjp(st, pc, lp, x, t)(s)[:3],
            (end.proto, p0, lp, tr.x0, t0, tr.seed), grads_of=(0, 1), input_grads=(2,),
        )  # fmt: skip
        tr.cut_zero = tr.vary([jnp.zeros(a.shape, a.dtype) for a in tr.msplit.cut_proto])
        tr.lcut_zero = tr.vary([jnp.zeros(a.shape, a.dtype) for a in tr.lsplit.cut_proto])
    return tr


def _branches_for(tr, lane: int):
    """A lane's ``lax.switch`` branches (idle, then each kind it runs, not last and last
    stage), the branch index of each kind, and the names of what its branches return."""
    kinds = list(lane_branches(tr.has[lane]))
    outs = {"loss"}  # what this lane's branches return
    if F in kinds:
        outs |= {"y"} | ({"res", "lres"} if tr.stash else set())
    if set(kinds) & {B, BI}:
        outs.add("gx")
    if tr.split and BI in kinds:
        outs |= {"cut", "lcut"}
    if set(kinds) & {B, W}:
        outs |= {"grads", "glast"}
    fns = [functools.partial(_run_op, tr, IDLE, False, frozenset(outs))]
    fns += [
        functools.partial(_run_op, tr, k, last, frozenset(outs))
        for k in kinds
        for last in (False, True)
    ]
    base = np.zeros(5, np.int32)
    for j, k in enumerate(kinds):
        base[k] = 1 + 2 * j
    return fns, jnp.asarray(base), outs


def _run_op(tr, kind, last, outs, operands):
    """One op of a lane: reads its slots (inside the branch: only the branch that runs reads
    them) and returns what it made; new residuals go into their slots after the switch."""
    r, state, bufs = operands  # r: this lane's sl.LaneRow
    stash, split, m, lp, seed = tr.stash, tr.split, tr.m, tr.lp, tr.seed
    out = {
        "loss": jnp.zeros((), jnp.float32),
        "y": _zeros(tr.x0),
        "gx": _zeros(tr.x0),
        "res": _zeros(tr.mid.proto) if stash else None,
        "lres": _zeros(tr.end.proto) if stash else None,
        "cut": tr.cut_zero if split else None,
        "lcut": tr.lcut_zero if split else None,
        **state,
    }
    if kind == IDLE:
        return tr.vary({k: out[k] for k in sorted(outs)})
    i, c = r.mb, r.chunk
    sp, xs, ts = bufs.sp, bufs.xs, bufs.ts
    pc = spmd.index(sp, c) if tr.v > 1 else jax.tree.map(lambda a: a[0], sp)
    first = (tr.d == 0) & (c == 0)
    x = jax.tree.map(
        lambda a, b: jnp.where(first, a, b), spmd.index(xs, i), spmd.index(bufs.slots.x, r.x_read)
    )
    dp = dlp = None
    if kind == F:
        if stash and last:
            loss, out["lres"] = tr.end.forward(pc, lp, x, spmd.index(ts, i))
            out["loss"] = loss.astype(jnp.float32) / m
        elif stash:
            out["y"], out["res"] = tr.mid.forward(pc, x)
        elif not last:
            out["y"] = tr.stage_fn(pc, x)
    elif last and split and kind in (BI, W):
        st, t = spmd.index(bufs.slots.last, r.last_read), spmd.index(ts, i)
        if kind == BI:
            (out["gx"],), out["lcut"] = tr.lsplit.bi(st, pc, lp, x, t, seed)
        else:
            cut = spmd.index(bufs.slots.last_cut, r.last_cut_read)
            dp, dlp = tr.lsplit.w(st, pc, lp, x, t, seed, cut)
    elif split and kind in (BI, W):
        st, g = spmd.index(bufs.slots.res, r.res_read), spmd.index(bufs.slots.g, r.g_read)
        if kind == BI:
            (out["gx"],), out["cut"] = tr.msplit.bi(st, pc, x, g)
        else:
            (dp,) = tr.msplit.w(st, pc, x, g, spmd.index(bufs.slots.cut, r.cut_read))
    elif last:
        t = spmd.index(ts, i)
        if stash:
            fn = tr.end.vjp(spmd.index(bufs.slots.last, r.last_read), pc, lp, x, t)
        else:
            loss, fn = jax.vjp(lambda a, b, c: tr.last_fn4(a, b, c, t), pc, lp, x)
            if kind in (B, BI):
                out["loss"] = loss.astype(jnp.float32) / m
        dp, dlp, dx = fn(seed)[:3]
        if kind in (B, BI):
            out["gx"] = dx
    else:
        if stash:
            fn = tr.mid.vjp(spmd.index(bufs.slots.res, r.res_read), pc, x)
        else:
            _, fn = jax.vjp(tr.stage_fn, pc, x)
        dp, dx = fn(spmd.index(bufs.slots.g, r.g_read))
        if kind in (B, BI):
            out["gx"] = dx
    if kind in (B, W):
        out["grads"] = _accumulate(state["grads"], dp, c, tr.v)
        if dlp is not None:
            out["glast"] = jax.tree.map(jnp.add, state["glast"], dlp)
    return tr.vary({k: out[k] for k in sorted(outs)})


def _step(tr, lanes, carry: _Carry, rows_t):
    """One step of the table on this device: each lane's op, then the sends."""
    (xbuf, gbuf, rbuf, lbuf, cbuf, lcbuf), gxs, grads, glast, loss = carry
    d, m = tr.d, tr.m
    row = jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, d, 0, keepdims=False), rows_t)
    ys, gs = [], []
    for lane in range(tr.L):
        fns, base, outs = lanes[lane]
        r = row.lanes[lane]
        k, c = r.kind, r.chunk
        state = {"grads": grads, "glast": glast}
        state = {key: val for key, val in state.items() if key in outs}
        is_last = (d == tr.p - 1) & (c == tr.v - 1)
        branch = jnp.where(k == IDLE, 0, base[k] + is_last.astype(jnp.int32))
        bufs = _Buffers(tr.xs, tr.ts, _Slots(xbuf, gbuf, rbuf, lbuf, cbuf, lcbuf), tr.sp)
        with jax.named_scope(LANE_SCOPE.format(lane)):  # see branch_counts
            got = lax.switch(branch, fns, (r, state, bufs))
        loss = loss + got["loss"]
        if "res" in got:
            rbuf = spmd.put(rbuf, r.res_write, got["res"])
            lbuf = spmd.put(lbuf, r.last_write, got["lres"])
        if "cut" in got:
            cbuf = spmd.put(cbuf, r.cut_write, got["cut"])
            lcbuf = spmd.put(lcbuf, r.last_cut_write, got["lcut"])
        grads, glast = got.get("grads", grads), got.get("glast", glast)
        if "gx" in got and tr.input_grad:
            j = r.gx_index
            keep = j < m
            j = jnp.minimum(j, m - 1)
            new = jax.tree.map(
                lambda a, b, keep=keep: jnp.where(keep, a, b), got["gx"], spmd.index(gxs, j)
            )
            gxs = spmd.put(gxs, j, new)
        ys.append(got.get("y"))
        gs.append(got.get("gx"))
    y = _pick(ys, row.fwd_lane)
    gy = _pick(gs, row.bwd_lane)
    if y is not None:
        y = jax.tree.map(lambda a: lax.ppermute(a, tr.stage_axis, tr.fwd_perm), y)
        xbuf = spmd.put(xbuf, row.x_recv, y)
    if gy is not None:
        gy = jax.tree.map(lambda a: lax.ppermute(a, tr.stage_axis, tr.bwd_perm), gy)
        gbuf = spmd.put(gbuf, row.g_recv, gy)
    return _Carry(_Slots(xbuf, gbuf, rbuf, lbuf, cbuf, lcbuf), gxs, grads, glast, loss), None


def _accumulate(grads: Any, dp: Any, c: Any, v: int) -> Any:
    """``grads[c] += dp`` for the ``[v, ...]`` gradient accumulator."""
    if v == 1:
        return jax.tree.map(lambda g, u: g + u[None], grads, dp)
    return jax.tree.map(
        lambda g, u: lax.dynamic_update_index_in_dim(g, spmd.index(g, c) + u, c, 0), grads, dp
    )


def _pick(values, lane):
    """The lane's value among ``values`` (None where a lane never produces one)."""
    present = [(j, a) for j, a in enumerate(values) if a is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0][1]
    out = present[0][1]
    for j, a in present[1:]:
        out = jax.tree.map(lambda u, w, j=j: jnp.where(lane == j, w, u), out, a)
    return out
