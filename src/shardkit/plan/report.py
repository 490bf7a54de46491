"""How a `Plan` prints: a ranked rich table and a paragraph on why the top row wins."""

from __future__ import annotations

from typing import Any

from shardkit.common import format_bytes as _size
from shardkit.plan.memory import model_state_bytes


def _count(n: float) -> str:
    """A parameter count: 101.2K, 8.03B."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}" if unit in "TB" else f"{n / scale:.1f}{unit}"
    return f"{n:.0f}"


_SHORT = {
    "all-gather": "AG",
    "reduce-scatter": "RS",
    "all-reduce": "AR",
    "all-to-all": "A2A",
    "collective-permute": "P2P",
}


def _time(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.2f} s"


def collectives_text(c) -> str:
    """`AG 12.3 GB RS 12.3 GB AR 400.0 MB`: bytes each device moves per step, by kind."""
    return " ".join(f"{_SHORT[k]} {_size(v)}" for k, v in c.collectives.items()) or "none"


def table(plan, top: int = 8):
    """A rich Table of the `top` fastest layouts.

    Columns: rank, layout, remat policy, micro-batches x sequences per micro-batch, weights /
    gradients / optimizer state per device, activations (+ logits), peak and the share of the
    usable memory left (the fit margin), bytes each device moves per step per collective kind,
    step time, MFU (model FLOPs) and HFU (executed FLOPs, recompute included), bottleneck.
    """
    from rich.table import Table

    hw = plan.hardware
    title = (
        f"{plan.workload.name}: {_count(plan.workload.n_params())} params, batch "
        f"{plan.workload.batch}, on {plan.devices} x {hw.name} ({_size(hw.usable_bytes)} of "
        f"{_size(hw.hbm_bytes)} usable) - {len(plan.candidates)} layouts fit"
        + (
            ""
            if plan.best.runtime == "shardkit"
            else f", as the {plan.best.runtime} runtime runs them"
        )
    )
    t = Table(title=title, title_justify="left")
    for col, just in [
        ("#", "right"), ("layout", "left"), ("remat", "left"), ("m x b", "right"),
        ("w / g / opt", "right"), ("act", "right"), ("peak (margin)", "right"),
        ("collectives per step", "left"), ("step", "right"), ("MFU / HFU", "right"),
        ("bottleneck", "left"),
    ]:  # fmt: skip
        t.add_column(col, justify=just)
    for i, c in enumerate(plan.candidates[:top], 1):
        state = f"{_size(c.param_bytes)} / {_size(c.grad_bytes)} / {_size(c.opt_bytes)}"
        t.add_row(
            str(i), _label(c), c.remat, f"{c.microbatches} x {c.micro_batch}", state,
            _size(c.activation_bytes + c.logits_bytes), f"{_size(c.peak_bytes)} ({c.margin:.0%})",
            collectives_text(c), _time(c.step_time), f"{c.mfu:.0%} / {c.hfu:.0%}", c.bottleneck,
        )  # fmt: skip
    return t


def _label(c) -> str:
    """The layout, its pipeline schedule, and "prediction only" when shardkit cannot run it."""
    text = c.layout + (f", {c.schedule}" if c.stage > 1 else "")
    return text + ("" if c.runnable else " (prediction only)")


def why(plan) -> str:
    """One paragraph on the top layout: memory, time split, and what the runner-up loses."""
    c = plan.best
    hw = plan.hardware
    w = plan.workload
    state = c.param_bytes + c.grad_bytes + c.opt_bytes
    parts = [
        f"{c.layout} is predicted fastest: {_time(c.step_time)} per step, MFU {c.mfu:.0%} "
        f"(HFU {c.hfu:.0%} with recompute)."
    ]
    zero = {0: "replicated", 1: "ZeRO-1: optimizer state split", 3: "ZeRO-3: all split"}[c.zero]
    parts.append(
        f"Per device it holds {_size(state)} of model state ({zero}), "
        f"{_size(c.activation_bytes + c.logits_bytes)} of activations (remat={c.remat}, "
        f"{c.microbatches} micro-batch{'es' if c.microbatches > 1 else ''} of {c.micro_batch}) "
        f"and {_size(c.gathered_bytes)} of gathered or cast weights: {_size(c.peak_bytes)} of "
        f"{_size(hw.usable_bytes)} usable ({c.margin:.0%} margin)."
    )
    split = [f"compute {_time(c.compute_time)}"]
    for axis, t in c.comm_time.items():
        hidden = c.ring_hidden_time if axis == "tensor" else 0.0
        note = f" ({_time(hidden)} hidden by collective matmul)" if hidden else ""
        split.append(f"{axis} collectives {_time(t)}{note}")
    if c.bubble_time:
        split.append(f"pipeline bubble {_time(c.bubble_time)}")
    parts.append(
        f"The step is {c.bottleneck}-bound ({', '.join(split)}; data-parallel and FSDP "
        f"traffic overlaps compute, {_time(c.exposed_comm_time)} exposed)."
    )
    full = _replicated_state(w)
    if full > hw.usable_bytes:
        parts.append(
            f"Plain data parallelism would need {_size(full)} of model state per device, "
            "more than fits."
        )
    if not c.runnable:
        run = next((r for r in plan.candidates if r.runnable), None)
        parts.append(
            (
                f"It is predicted for the {c.runtime} runtime's pipeline, which shardkit's "
                "lockstep executor does not reproduce"
                if c.runtime != "shardkit" and c.stage > 1
                else "shardkit does not run it (fsdp, or sequence parallelism, inside pipeline "
                "stages)"
            )
            + (f"; the fastest layout it runs is {run.layout}." if run else ".")
        )
    if len(plan.candidates) > 1:
        r = plan.candidates[1]
        parts.append(
            f"Runner-up {r.layout} (remat={r.remat}) takes {_time(r.step_time)} "
            f"({r.step_time / c.step_time - 1:+.0%}), {r.bottleneck}-bound."
        )
    return " ".join(parts)


def _replicated_state(w: Any) -> float:
    return model_state_bytes(
        w.n_params(), zero=0, shards=1, precision=w.precision, optimizer=w.optimizer
    ).total


def render(plan, top: int = 8, width: int = 160) -> str:
    """Table + why paragraph as plain text."""
    import io

    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False)
    console.print(table(plan, top=top))
    console.print("Why: " + why(plan), soft_wrap=False)
    return buf.getvalue()
