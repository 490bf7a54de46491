"""The SPMD pipeline executor: one program, a 'stage' mesh axis, a scan over the step table.

:func:`pipeline_value_and_grad` turns a stage function and a loss head into a pipelined
loss-and-gradient over ``m`` micro-batches. Inside ``jax.shard_map`` (manual over 'stage' and
the data axes; any other mesh axis, e.g. 'tensor', stays with the compiler) every device scans
over the rows of the schedule's step table; per lane, ``lax.switch`` runs the device's op
(forward, backward, input-gradient or weight-gradient backward, or nothing) on its own chunk
of the stage parameters, and at the end of the step one ``ppermute`` sends activations forward
and one sends gradients backward. Received values and, with ``residuals="stash"``, the
backward residuals of the forward wait in buffer slots chosen by :mod:`.slots`.

Residuals: ``"recompute"`` runs ``jax.vjp`` again in the backward (only the stage input is
kept); ``"stash"`` keeps the forward's vjp residuals that depend on the micro-batch and
recomputes the ones that depend on the parameters alone (the weights themselves, casts of
them), so no slot ever holds a copy of the weights (:mod:`.residuals`); ``stash_policy``
chooses which residuals are worth keeping (default: matmul outputs). With ``"stash"`` the
zero-bubble schedules' ``BI`` and ``W`` ops run the two halves of one traced backward
(:mod:`.split`): ``BI`` keeps what ``W`` needs (cotangents at the matmul outputs, rebuilt
activations) in a slot, so ``W`` runs only the weight-gradient equations.

Gradients over data axes are accumulated per device (the parameters are made varying before
the loop, so no backward op reduces anything) and averaged once after the loop, in one tuple
all-reduce; loss, loss-head gradients and the input cotangent are summed over 'stage' once at
the end. Stage parameters arrive split over 'stage' in model order; interleaved schedules
regroup them to their chunks with ``v**2`` ppermutes (:func:`.spmd.regroup`).

Example:
    >>> mesh = jax.make_mesh((4,), ("stage",))
    >>> stage_fn = lambda w, x: jnp.tanh(x @ w)
    >>> last_fn = lambda _, y, t: jnp.mean((y - t) ** 2)
    >>> f = pipeline_value_and_grad(stage_fn, last_fn, mesh=mesh, schedule=OneFOneB(),
    ...                             microbatches=8)
    >>> loss, (g_w, g_last, g_xs) = jax.jit(f)(w, None, xs, ys)   # w: [4, D, D]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitValueError
from shardkit.pipeline import slots as sl
from shardkit.pipeline import spmd
from shardkit.pipeline.lockstep import LANE_SCOPE as LANE_SCOPE
from shardkit.pipeline.lockstep import lane_branches, table_body
from shardkit.pipeline.schedule import IDLE, GPipe, table

RESIDUALS = ("recompute", "stash")


def branch_counts(tbl) -> tuple[np.ndarray, ...]:
    """How often each device runs each branch of each lane's ``lax.switch`` in one step.

    The executor's lane ``l`` switches (under ``jax.named_scope(LANE_SCOPE.format(l))``) over
    the branches idle, then per kind the lane runs (sorted codes) that kind and its last-stage
    twin (the op of model stage ``p*v - 1``, followed by the loss head). A collective inside
    branch ``k`` runs ``counts[l][d, k]`` times per step on device ``d`` (the switch itself
    runs ``table.steps`` times: every row holds exactly one branch per lane).

    Args:
        tbl: the step table the executor scans over (``table(schedule, p, m)``).

    Returns:
        Per lane, an ``int [p, branches]`` array; each row sums to ``tbl.steps``.

    Example:
        >>> from shardkit.pipeline import OneFOneB, table
        >>> [c.tolist() for c in branch_counts(table(OneFOneB(), p=2, m=2))]
        [[[2, 2, 0], [2, 0, 2]], [[2, 2, 0], [2, 0, 2]]]
    """
    ops = np.asarray(tbl.ops)
    T, p, L, _ = ops.shape
    v = tbl.virtual
    out = []
    for lane in range(L):
        kinds = lane_branches(ops[:, :, lane, 0].ravel())
        counts = np.zeros((p, 1 + 2 * len(kinds)), np.int64)
        for t in range(T):
            for d in range(p):
                k, _, c = (int(z) for z in ops[t, d, lane])
                last = d == p - 1 and c == v - 1
                counts[d, 0 if k == IDLE else 1 + 2 * kinds.index(k) + last] += 1
        out.append(counts)
    return tuple(out)


# --------------------------------------------------------------------------- validation


def _path(kp) -> str:
    return jax.tree_util.keystr(kp)


def _axes(mesh, stage_axis: str, data_axes: Sequence[str]) -> tuple[int, int]:
    shape = dict(mesh.shape)
    if stage_axis not in shape:
        raise ShardkitValueError(
            f"pipeline_value_and_grad: the mesh {shape} has no {stage_axis!r} axis to put "
            f"pipeline stages on; fix: make the mesh with a {stage_axis!r} axis, e.g. "
            f"shardkit.make_mesh({{'data': 2, {stage_axis!r}: 4}}), or pass stage_axis= one "
            f"of {list(shape)}"
        )
    for ax in data_axes:
        if ax not in shape or ax == stage_axis:
            raise ShardkitValueError(
                f"pipeline_value_and_grad: data_axes={tuple(data_axes)} names {ax!r}, which is "
                f"not a mesh axis other than {stage_axis!r} (mesh {shape}); fix: pass "
                f"data_axes= a subset of {[a for a in shape if a != stage_axis]}"
            )
    return shape[stage_axis], math.prod(shape[a] for a in data_axes)


def _check_inputs(
    stage_fn, last_fn, stage_params, last_params, xs, targets, *, p, v, m, n_data, data_axes
):
    S = p * v
    for kp, leaf in jax.tree_util.tree_leaves_with_path(stage_params):
        shape = tuple(getattr(leaf, "shape", ()))
        if not shape or shape[0] != S:
            raise ShardkitValueError(
                f"pipeline_value_and_grad: stage_params{_path(kp)} has shape {shape}; its "
                f"leading axis must be the p*v = {p}*{v} = {S} model stages (p = 'stage' mesh "
                f"axis size, v = the schedule's virtual stages); fix: stack the per-stage "
                f"parameters into a leading axis of size {S}, e.g. "
                f"x.reshape({S}, -1, *x.shape[1:]) on stacked layers"
            )
    for name, a in (("xs", xs), ("targets", targets)):
        for kp, leaf in jax.tree_util.tree_leaves_with_path(a):
            shape = tuple(leaf.shape)
            if len(shape) < 2 or shape[0] != m:
                raise ShardkitValueError(
                    f"pipeline_value_and_grad: {name}{_path(kp)} has shape {shape}; it must be "
                    f"[microbatches={m}, microbatch, ...]; fix: reshape the batch as "
                    f"x.reshape({m}, -1, *x.shape[1:])"
                )
            if shape[1] % n_data:
                raise ShardkitValueError(
                    f"pipeline_value_and_grad: {name}{_path(kp)} has micro-batch size "
                    f"{shape[1]} (shape {shape}), not divisible by the {n_data} devices of "
                    f"data_axes={tuple(data_axes)}; fix: use a micro-batch size that is a "
                    f"multiple of {n_data} (e.g. {n_data * max(1, shape[1] // n_data)}) or "
                    f"fewer micro-batches"
                )
    p0 = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), stage_params)
    x0 = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), xs)
    t0 = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), targets)
    y0 = jax.eval_shape(stage_fn, p0, x0)
    got = jax.tree.map(lambda a: (tuple(a.shape), str(a.dtype)), y0)
    want = jax.tree.map(lambda a: (tuple(a.shape), str(a.dtype)), x0)
    if jax.tree.structure(y0) != jax.tree.structure(x0) or got != want:
        raise ShardkitValueError(
            f"pipeline_value_and_grad: stage_fn maps a micro-batch {want} to {got}; every "
            f"stage's output feeds the next stage's input, so they must have the same shape "
            f"and dtype; fix: make stage_fn return its input's shape and dtype (move "
            f"embeddings before the pipeline and the output head into last_fn)"
        )
    out = jax.eval_shape(last_fn, last_params, y0, t0)
    if getattr(out, "shape", None) != ():
        raise ShardkitValueError(
            f"pipeline_value_and_grad: last_fn returns {getattr(out, 'shape', out)}, not a "
            f"scalar; fix: return the mean loss over the micro-batch, e.g. jnp.mean(...)"
        )


# --------------------------------------------------------------------------- the executor


class PipelinedValueAndGrad:
    """``f(stage_params, last_params, xs, targets) -> (loss, (g_stage, g_last, g_xs))``.

    Made by :func:`pipeline_value_and_grad`; trace it under ``jax.jit``.

    Attributes:
        schedule: the schedule.
        table: its lockstep step :class:`~shardkit.pipeline.Table` (None for GPipe by
            autodiff).
        steps: lockstep steps the executor scans over (``table.steps``; ``m + p - 1`` for
            GPipe by autodiff).
        plan: the buffer slots (:class:`~shardkit.pipeline.slots.SlotPlan`; None for autodiff).
    """

    def __init__(self, run, *, schedule, table, steps, plan):
        self._run = run
        self.schedule, self.table, self.steps, self.plan = schedule, table, steps, plan

    def __call__(self, stage_params, last_params, xs, targets):
        return self._run(stage_params, last_params, xs, targets)


def _spmd(
    body, *, mesh, stage_axis, data_axes, v, input_grad, stage_params, last_params, xs, targets
):
    """Runs ``body`` under shard_map with the common layout, prologue and epilogue."""
    p = dict(mesh.shape)[stage_axis]
    manual = (stage_axis, *data_axes)
    dspec = tuple(data_axes) if len(data_axes) > 1 else (data_axes[0] if data_axes else None)
    n_data = math.prod(dict(mesh.shape)[a] for a in data_axes)

    sp = jax.tree.map(lambda a: spmd.place(a, mesh, {0: stage_axis}, manual), stage_params)
    lp = jax.tree.map(lambda a: spmd.place(a, mesh, {}, manual), last_params)
    xs_, ts_ = (
        jax.tree.map(lambda a: spmd.place(a, mesh, {0: None, 1: dspec}, manual), t)
        for t in (xs, targets)
    )

    def local(sp, lp, xs, ts):
        sp = spmd.vary(spmd.regroup(sp, p, v, stage_axis, to_chunks=True), manual)  # [v, ...]
        lp, xs, ts = spmd.vary((lp, xs, ts), manual)
        loss, gsp, glp, gxs = body(sp, lp, xs, ts)
        if data_axes:
            gxs = jax.tree.map(lambda g: g / n_data, gxs)
            gsp, glp, loss = spmd.reduce((gsp, glp, loss), lax.pmean, data_axes)
        glp, loss, gxs = spmd.reduce((glp, loss, gxs), lax.psum, (stage_axis,))
        return loss, spmd.regroup(gsp, p, v, stage_axis, to_chunks=False), glp, gxs

    xspec = P(None, dspec)
    sspec = P(stage_axis)

    def call(mesh, *args):
        f = jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(sspec, P(), xspec, xspec),
            out_specs=(P(), sspec, P(), xspec if input_grad else P()),
            axis_names=frozenset(manual),
        )
        return f(*args)

    # outputs laid out as their inputs (gradients as parameters), free Explicit axes included
    like = (jnp.zeros(()), sp, lp, xs_ if input_grad else None)
    out_specs = jax.tree.map(spmd.spec_of, like)
    loss, gsp, glp, gxs = spmd.keep_free_axes(call, mesh, manual, (sp, lp, xs_, ts_), out_specs)
    return loss, (gsp, glp, gxs)


def _autodiff_body(stage_fn, last_fn, *, p, m, stage_axis, remat, input_grad):
    fn = jax.checkpoint(stage_fn) if remat else stage_fn
    perm = [(d, d + 1) for d in range(p - 1)]
    T = m + p - 1

    def forward(sp, lp, xs, ts):
        d = lax.axis_index(stage_axis)
        pc = spmd.index(sp, 0)
        axes = jax.typeof(spmd.index(xs, 0)).manual_axis_type.varying

        def step(x_recv, t):
            x_in = spmd.index(xs, jnp.minimum(t, m - 1))
            x = jax.tree.map(lambda a, b: jnp.where(d == 0, a, b), x_in, x_recv)
            y = fn(pc, x)
            return jax.tree.map(lambda a: lax.ppermute(a, stage_axis, perm), y), y

        x_init = jax.tree.map(jnp.zeros_like, spmd.index(xs, 0))
        _, ys = lax.scan(step, x_init, jnp.arange(T))
        ys = jax.tree.map(lambda a: a[p - 1 :], ys)  # [m, ...] valid on the last device

        def head():
            per_mb = jax.vmap(last_fn, in_axes=(None, 0, 0))(lp, ys, ts)
            return spmd.vary(jnp.mean(per_mb).astype(jnp.float32), axes)

        return lax.cond(d == p - 1, head, lambda: spmd.vary(jnp.zeros((), jnp.float32), axes))

    def body(sp, lp, xs, ts):
        if not input_grad:
            loss, (gsp, glp) = jax.value_and_grad(forward, argnums=(0, 1))(sp, lp, xs, ts)
            return loss, gsp, glp, None
        loss, (gsp, glp, gxs) = jax.value_and_grad(forward, argnums=(0, 1, 2))(sp, lp, xs, ts)
        return loss, gsp, glp, gxs

    return body


# --------------------------------------------------------------------------- public API


def pipeline_value_and_grad(
    stage_fn: Callable,
    last_fn: Callable,
    *,
    mesh,
    schedule,
    microbatches: int,
    stage_axis: str = "stage",
    data_axes: Sequence[str] = (),
    residuals: str = "recompute",
    stash_policy: Callable | None = jax.checkpoint_policies.dots_saveable,
    input_grad: bool = True,
) -> PipelinedValueAndGrad:
    """Pipelined loss and gradients of ``mean_i last_fn(last_params, stages(xs[i]), targets[i])``.

    The model is ``p * v`` stages (``p`` = size of mesh axis ``stage_axis``, ``v`` = the
    schedule's virtual stages per device) applied in order: ``x <- stage_fn(stage_params[s],
    x)`` for ``s = 0 .. p*v-1``, then ``last_fn(last_params, x, target)``. Virtual stage ``s``
    runs on device ``s % p``.

    Args:
        stage_fn: ``stage_fn(params_s, x) -> y`` with ``y`` of ``x``'s shape and dtype.
        last_fn: ``last_fn(last_params, y, target) -> scalar`` (the mean loss of a micro-batch).
        mesh: a mesh with a ``stage_axis`` axis (Auto or Explicit).
        schedule: ``GPipe()``, ``OneFOneB()``, ``Interleaved(v)`` or ``ZeroBubbleH1()`` from
            ``shardkit.pipeline``; the executor runs ``table(schedule, p, m)``.
        microbatches: ``m``, the leading axis of ``xs`` and ``targets``.
        stage_axis: the mesh axis of the pipeline stages.
        data_axes: mesh axes that split each micro-batch (data parallel); gradients are
            averaged over them once, after the schedule. Mesh axes not named here or as
            ``stage_axis`` (e.g. 'tensor') are left to the compiler.
        residuals: ``"recompute"`` (the backward reruns the stage's forward) or ``"stash"``
            (the forward keeps the micro-batch-dependent residuals; never the weights).
        stash_policy: with ``"stash"``, a ``jax.checkpoint`` policy choosing which residuals
            to keep; the default keeps matmul outputs and recomputes elementwise ops in the
            backward (at p = 4, D = 256 a third of the memory and half the bytes of keeping
            every residual, for the same FLOPs); None keeps every residual.
        input_grad: return ``g_xs``; with False it is None and the ``[m, mb, ...]`` buffer
            that collects it (the one temporary that grows with ``m``) is not allocated.

    Returns:
        ``f(stage_params, last_params, xs, targets) -> (loss, (g_stage, g_last, g_xs))``
        where ``stage_params`` leaves have a leading axis of size ``p*v`` (model order),
        ``last_params`` is replicated (or None), ``xs`` and ``targets`` are ``[m, mb, ...]``
        and ``g_xs`` is the cotangent of ``xs`` (for an embedding in front of the pipeline).
        ``f.steps`` is the number of lockstep steps it scans over.

    Raises:
        ValueError: no ``stage_axis`` in the mesh, unknown ``data_axes`` or ``residuals``, a
            schedule that cannot run ``m`` micro-batches on ``p`` stages, and (when ``f`` is
            called) a leading axis that is not ``p*v``, ``xs`` without ``m`` micro-batches or
            with a micro-batch size the data axes do not divide, a ``stage_fn`` that changes
            shape or dtype, a non-scalar ``last_fn``; each message ends with the fix.

    Example:
        >>> mesh = jax.make_mesh((4,), ("stage",))
        >>> f = pipeline_value_and_grad(lambda w, x: jnp.tanh(x @ w),
        ...                             lambda _, y, t: jnp.mean((y - t) ** 2),
        ...                             mesh=mesh, schedule=OneFOneB(), microbatches=8)
        >>> f.steps
        14

    See also:
        :func:`gpipe_value_and_grad`, :func:`reference_value_and_grad`.
    """
    data_axes = tuple(data_axes)
    p, n_data = _axes(mesh, stage_axis, data_axes)
    if residuals not in RESIDUALS:
        raise ShardkitValueError(
            f"pipeline_value_and_grad: residuals={residuals!r}; fix: pass "
            "residuals='recompute' or residuals='stash'"
        )
    m = microbatches
    v = schedule.virtual
    tbl = table(schedule, p, m)  # checks that the schedule runs m micro-batches on p stages
    plan = sl.plan(tbl, stash=residuals == "stash")
    body = table_body(
        stage_fn, last_fn, plan, stage_axis=stage_axis, v=v, input_grad=input_grad,
        stash_policy=stash_policy,
    )  # fmt: skip

    def run(stage_params, last_params, xs, targets):
        _check_inputs(
            stage_fn, last_fn, stage_params, last_params, xs, targets,
            p=p, v=v, m=m, n_data=n_data, data_axes=data_axes,
        )  # fmt: skip
        return _spmd(
            body, mesh=mesh, stage_axis=stage_axis, data_axes=data_axes, v=v, input_grad=input_grad,
            stage_params=stage_params, last_params=last_params, xs=xs, targets=targets,
        )  # fmt: skip

    return PipelinedValueAndGrad(run, schedule=schedule, table=tbl, steps=tbl.steps, plan=plan)


def gpipe_value_and_grad(
    stage_fn: Callable,
    last_fn: Callable,
    *,
    mesh,
    microbatches: int,
    stage_axis: str = "stage",
    data_axes: Sequence[str] = (),
    remat: bool = False,
    input_grad: bool = True,
) -> PipelinedValueAndGrad:
    """GPipe by autodiff: the forward schedule in a ``lax.scan``, gradients by ``jax.grad``.

    The baseline the table schedules are measured against: ``m + p - 1`` forward steps, one
    activation ``ppermute`` each, and autodiff's reverse scan (which keeps every step's
    residuals, so memory grows with ``m``; ``remat=True`` keeps only stage inputs). The
    gradient is taken inside the ``shard_map``, so data-parallel gradients are averaged once
    after the loop, as in :func:`pipeline_value_and_grad`.

    Args:
        stage_fn, last_fn, mesh, microbatches, stage_axis, data_axes, input_grad: as in
            :func:`pipeline_value_and_grad` (one stage per device: ``stage_params`` leaves
            have a leading axis of size ``p``).
        remat: wrap ``stage_fn`` in ``jax.checkpoint``.

    Returns:
        ``f(stage_params, last_params, xs, targets) -> (loss, (g_stage, g_last, g_xs))``;
        ``f.steps == m + p - 1``.

    Raises:
        ValueError: as :func:`pipeline_value_and_grad`.

    Example:
        >>> f = gpipe_value_and_grad(stage_fn, last_fn, mesh=mesh, microbatches=8)
        >>> f.steps   # m + p - 1 at p = 4
        11
    """
    data_axes = tuple(data_axes)
    p, n_data = _axes(mesh, stage_axis, data_axes)
    m = microbatches
    GPipe().check(p, m)
    body = _autodiff_body(
        stage_fn, last_fn, p=p, m=m, stage_axis=stage_axis, remat=remat, input_grad=input_grad
    )

    def run(stage_params, last_params, xs, targets):
        _check_inputs(
            stage_fn, last_fn, stage_params, last_params, xs, targets,
            p=p, v=1, m=m, n_data=n_data, data_axes=data_axes,
        )  # fmt: skip
        return _spmd(
            body, mesh=mesh, stage_axis=stage_axis, data_axes=data_axes, v=1, input_grad=input_grad,
            stage_params=stage_params, last_params=last_params, xs=xs, targets=targets,
        )  # fmt: skip

    return PipelinedValueAndGrad(run, schedule=GPipe(), table=None, steps=m + p - 1, plan=None)


def reference_value_and_grad(stage_fn: Callable, last_fn: Callable) -> Callable:
    """The non-pipelined reference: the same loss and gradients by plain ``jax.value_and_grad``.

    Runs the ``S`` stages in model order (a ``lax.scan`` over ``stage_params``' leading axis)
    on every micro-batch, then ``last_fn``; the loss is the mean over micro-batches. Meant for
    tests on one device (pass unsharded arrays).

    Args:
        stage_fn: ``stage_fn(params_s, x) -> y`` as in :func:`pipeline_value_and_grad`.
        last_fn: ``last_fn(last_params, y, target) -> scalar``.

    Returns:
        ``f(stage_params, last_params, xs, targets) -> (loss, (g_stage, g_last, g_xs))``.

    Example:
        >>> ref = reference_value_and_grad(stage_fn, last_fn)
        >>> loss, (g_stage, g_last, g_xs) = jax.jit(ref)(w, None, xs, ys)
    """

    def loss_fn(stage_params, last_params, xs, targets):
        def one(x, t):
            y, _ = lax.scan(lambda h, ps: (stage_fn(ps, h), None), x, stage_params)
            return last_fn(last_params, y, t)

        return jnp.mean(jax.vmap(one)(xs, targets))

    def run(stage_params, last_params, xs, targets):
        loss, grads = jax.value_and_grad(loss_fn, argnums=(0, 1, 2))(
            stage_params, last_params, xs, targets
        )
        return loss, grads

    return run
