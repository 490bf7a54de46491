"""The audit `shardkit train` prints and reports: the compiled step's collectives against the
strategy's expected list, memory per device, the generic audit's warnings with the
collectives the strategy itself asks for (FSDP's parameter gathers, gradient sums) taken out
and explained, and the planner's prediction for the layout that ran beside the measurement.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
from jax.sharding import PartitionSpec as P

from shardkit.common import format_bytes
from shardkit.inspection import inspect
from shardkit.inspection.hlo import collective_counts, parse_shape
from shardkit.plan import Transformer, evaluate
from shardkit.strategies.auto import Auto

__all__ = ["audit_step", "predicted_vs_measured", "strategy_owned"]


def audit_step(trainer, compiled) -> tuple[list[dict], list[str], list[dict], Any, list[str]]:
    """Compares the compiled step's collectives with the strategy's; reads memory per device.

    Returns (rows per collective kind, problems, memory rows, the `inspect` report with the
    strategy's own collectives no longer warned about, one line per kind of those).
    """
    counts = collective_counts(compiled.as_text())
    expected = trainer.bound.expected
    problems = expected.check(counts)
    report = None
    try:
        report = inspect(compiled, mesh=trainer.mesh)
    except Exception:  # noqa: BLE001 - the detailed audit is optional; counts suffice
        report = None
    present = {k for k, n in counts.items() if n}
    missing = {" or ".join(sorted(g)) for g in expected.required if not present & g}
    rows = []
    for kind in sorted(present | missing):
        n = counts.get(kind, 0)
        status = "expected" if kind in expected.allowed else "UNEXPECTED"
        by_kind = report.by_kind().get(kind, {}) if report is not None else {}
        rows.append(
            {
                "collective": kind,
                "instructions in the program": n,
                "executions per step": _executions(by_kind),
                "bytes/device/step": format_bytes(by_kind["bytes"]) if by_kind else "-",
                "strategy": status if n else "MISSING",
            }
        )
    mem = compiled.memory_analysis()
    memory = []
    if mem is not None:
        for label, attr in (
            ("arguments (state + batch)", "argument_size_in_bytes"),
            ("outputs", "output_size_in_bytes"),
            ("aliased (donated)", "alias_size_in_bytes"),
            ("temporaries (activations, gathered params)", "temp_size_in_bytes"),
        ):
            memory.append({"memory per device": label, "bytes": format_bytes(getattr(mem, attr))})
    explained: list[str] = []
    if report is not None:
        report, explained = strategy_owned(trainer, report)
    return rows, problems, memory, report, explained


def _executions(by_kind: dict) -> str:
    """How many times the kind's instructions run per step (loops counted), or "-"."""
    if not by_kind:
        return "-"
    return f"{by_kind['count']}" + ("" if by_kind["count_known"] else "+ (a loop count unknown)")


def strategy_owned(trainer, report) -> tuple[Any, list[str]]:
    """`report` without the implicit-gather warnings that are the strategy's own collectives.

    The generic audit warns when a collective's result is as large as a whole sharded input.
    In a training step that is what FSDP does on purpose (an all-gather of a parameter into
    its compute layout) and what the batch-split axes do (an all-reduce of a gradient, which
    XLA:CPU also uses for a reduce-scatter). A warning whose collective is of such a kind and
    whose result has the element count of a parameter in its compute layout is taken out and
    counted in a line instead; every other warning stays.
    """
    sizes = trainer.bound.axis_sizes
    elems = set()
    flat = jax.tree.leaves(trainer.abstract_params)
    specs = jax.tree.leaves(trainer.compute_specs, is_leaf=lambda x: isinstance(x, P))
    names = (
        jax.tree.structure(trainer.abstract_params).flatten_up_to(trainer.logical)
        if trainer.logical is not None
        else [None] * len(flat)
    )
    for leaf, spec, nm in zip(flat, specs, names, strict=True):
        split = math.prod(
            sizes.get(a, 1) for e in spec if e for a in (e if isinstance(e, tuple) else (e,))
        )
        elems.add(math.prod(leaf.shape) // split)
        if nm and nm[0] == "layers":  # stacked layers are gathered one layer at a time
            elems.add(math.prod(leaf.shape) // split // leaf.shape[0])
    owned = {}
    if sizes.get("fsdp", 1) > 1:
        owned["all-gather"] = (
            "parameters all-gathered into their compute layout (FSDP)"
            if trainer.strategy.zero == 3
            else "updated parameter shards all-gathered (ZeRO-1)"
        )
    if trainer.bound.batch_split > 1:
        owned["all-reduce"] = "gradients summed over the batch-split axes"
    tensor = sizes.get("tensor", 1) > 1
    kept, counted = [], {}
    for w in report.warnings:
        c = report.collectives[w.collective] if w.collective is not None else None
        over_tensor = c is not None and c.kind == "all-reduce" and "tensor" in (c.axes or ())
        if w.code == "implicit-gather" and tensor and over_tensor:
            # a partial sum over "tensor": Megatron's row-parallel outputs, the vocab-parallel
            # loss; its size matching a parameter's is a coincidence of shapes
            counted["all-reduce over tensor"] = counted.get("all-reduce over tensor", 0) + 1
            continue
        if w.code == "implicit-gather" and c is not None and c.kind in owned:
            shapes = parse_shape(c.result_shapes[0]) if c.result_shapes else ()
            if shapes and math.prod(shapes[0].dims) in elems:
                counted[c.kind] = counted.get(c.kind, 0) + 1
                continue
        kept.append(w)
    owned["all-reduce over tensor"] = (
        "partial sums over 'tensor' (row-parallel layers, vocab-parallel loss)"
    )
    lines = [
        f"{n} {kind} instruction{'s' * (n != 1)} as large as a parameter or activation: "
        f"{owned[kind]}, as the strategy intends (not warned about)"
        for kind, n in sorted(counted.items())
    ]
    return dataclasses.replace(report, warnings=tuple(kept)), lines


def predicted_vs_measured(run, tok_s: float) -> dict[str, str]:
    """The planner's prediction for the layout that ran, beside what was measured; both MFUs
    are the planner's (its FLOPs over its profile's peak), so they differ as the step times
    do. The summary's "MFU estimate" is another figure: model FLOPs over the measured host
    matmul peak."""
    try:
        workload = Transformer.from_gpt_config(
            run.model_cfg, batch=run.cfg.batch, precision=run.cfg.precision
        )
        hw = Auto().profile(run.devices)  # the profile `--strategy auto` plans with
        c = evaluate(workload, hw, remat=run.model_cfg.remat, **run.trainer.bound.layout())
    except (ValueError, KeyError) as e:  # a layout or device the planner has no model of
        return {"predicted (planner)": f"n/a ({type(e).__name__}: {str(e)[:80]})"}
    tokens = run.cfg.batch * run.model_cfg.seq_len
    step = tokens / tok_s if tok_s else float("nan")
    out = {
        "step time": f"{step * 1e3:.2f} ms measured (median) vs {c.step_time * 1e3:.2f} ms "
        f"predicted: measured / predicted = {step / c.step_time:.2f}",
        "tokens/s vs predicted": f"{tok_s:,.0f} measured vs {tokens / c.step_time:,.0f} "
        f"predicted (planner's {hw.name!r} profile)",
    }
    out["MFU vs predicted"] = (
        f"{c.mfu * c.step_time / step:.1%} measured vs {c.mfu:.1%} predicted (of the "
        f"{hw.name!r} profile's peak)"
    )
    return out
