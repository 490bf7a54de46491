"""The body of `shardkit train`: plan, layouts, training with progress, audit, report.

`train(config)` is importable for scripts and tests; `shardkit.train.command` only parses flags.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import pathlib
import signal
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import optax
from flax import nnx
from jax.experimental import multihost_utils
from rich.console import Console
from rich.markup import escape

from shardkit.common import format_bytes
from shardkit.compat import version_line
from shardkit.errors import ShardkitValueError
from shardkit.mesh import describe_mesh
from shardkit.models import GPT, GPTConfig, lm_loss
from shardkit.plan import Transformer
from shardkit.plan.hardware import hardware_for
from shardkit.strategies import Auto, from_name
from shardkit.train.checkpoint import (
    Checkpointer,
    CheckpointRejectedWarning,
    NonFiniteStateError,
    refuse_foreign_steps,
)
from shardkit.train.config import TrainConfig, parse_window
from shardkit.train.data import ReverseTask, TokenFile
from shardkit.train.guard import (
    BEFORE_FIRST_STEP,
    MetricsLog,
    StopAtOnce,
    StopSignals,
    after_last_step,
    already_done,
    claim_output,
    diverged,
    hold_locks,
    interrupted,
    nothing_to_resume,
    refuse_host_overflow,
    remove_outputs,
)
from shardkit.train.metrics import History, Progress, host_matmul_flops
from shardkit.train.pipeline_view import pipeline_rows
from shardkit.train.report import write_metrics, write_report
from shardkit.train.step_audit import audit_step, predicted_vs_measured
from shardkit.train.tables import layout_rows, print_table
from shardkit.train.tensorboard import ProfileWindow, ScalarWriter
from shardkit.train.trainer import Trainer


@dataclasses.dataclass
class RunResult:
    """What a run produced: final metrics, evaluation accuracy, paths and audit findings."""

    steps: int
    final_loss: float
    eval_accuracy: float
    eval_loss: float
    tokens_per_s: float
    report: pathlib.Path | None
    checkpoint_dir: pathlib.Path
    collective_problems: list[str]
    strategy: Any
    mesh_axes: dict[str, int]
    params: Any = None
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)  # as in summary.json


def _devices(cfg: TrainConfig):

    devices = jax.devices()
    if len(devices) < cfg.devices:
        raise ShardkitValueError(
            f"devices={cfg.devices} requested but JAX sees {len(devices)} "
            f"({jax.default_backend()}); fix: --devices {len(devices)}, or on CPU start a fresh "
            "process (the simulated device count is fixed when JAX starts)."
        )
    return devices[: cfg.devices]


def _data(cfg: TrainConfig):

    if cfg.data:
        return TokenFile(path=cfg.data, seq_len=cfg.seq_len, seed=cfg.seed)
    return ReverseTask(digits=cfg.digits, length=cfg.length, seed=cfg.seed)


def model_config(cfg: TrainConfig, data):
    """The GPT configuration of a run: sizes from `cfg`, vocabulary and length from `data`."""

    return GPTConfig(
        vocab=data.vocab,
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        d_ff=cfg.d_ff,
        seq_len=data.seq_len,
        remat=cfg.remat,
    )


def hardware_profile(devices) -> str:
    """The planner's hardware profile for these devices (`shardkit.plan.hardware_for`)."""
    return hardware_for(devices)


def auto_plan(cfg: TrainConfig, model_cfg, devices):
    """The planner's ranking of layouts for `shardkit train --strategy auto` on `devices`.

    The workload is the run's GPT, batch, precision and remat policy; pipelined layouts
    (data x tensor x stage) compete with the others. The first row shardkit runs
    (`Plan.runnable_best`) is the one trained. The same call as `Trainer(strategy=Auto())`.
    """
    workload = Transformer.from_gpt_config(
        model_cfg,
        batch=cfg.batch,
        precision=cfg.precision,  # the planner reads the Trainer's names
    )
    return Auto().plan(
        workload,
        devices=devices,
        sequence_parallel=cfg.sequence_parallel,
        collective_matmul=cfg.collective_matmul,
    )


def runnable_best(planned):
    """The fastest row of `planned` that shardkit runs (`Plan.runnable_best`)."""
    return planned.runnable_best()


def plan_rows(planned, top: int = 3) -> list[str]:
    """One line per top layout of a plan: layout, remat, peak memory, step time, MFU."""

    rows = []
    for c in planned.top(top):
        rows.append(
            f"{c.layout}, remat={c.remat}, {c.microbatches} x {c.micro_batch} sequences: "
            f"peak {format_bytes(c.peak_bytes)} per device, step {c.step_time * 1e3:.2f} ms "
            f"(predicted), MFU {c.mfu:.0%}, {c.bottleneck}-bound"
        )
    return rows


def build_trainer(cfg: TrainConfig, devices=None, *, planned=None):
    """The `Trainer`, data source and model config `shardkit train` uses for `cfg`.

    With `--strategy auto` the strategy is the top row of `planned` (from `auto_plan`), or of
    a fresh plan when none is given, and `trainer.strategy_reason` is the plan's why.
    """
    data = _data(cfg)
    model_cfg = model_config(cfg, data)
    warmup = min(cfg.warmup, cfg.steps - 1)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, cfg.lr, warmup, max(cfg.steps, warmup + 1), cfg.lr / 10
    )
    strategy = from_name(
        cfg.strategy,
        mesh=cfg.mesh,
        schedule=cfg.schedule,
        microbatches=cfg.microbatches,
        residuals=cfg.residuals,
        sequence_parallel=cfg.sequence_parallel,
        collective_matmul=cfg.collective_matmul,
        zero=cfg.zero,
    )
    if isinstance(strategy, Auto):
        targets = list(jax.devices()[: cfg.devices] if devices is None else devices)
        planned = planned or auto_plan(cfg, model_cfg, targets)
        strategy = planned.runnable_best().strategy()
    trainer = Trainer(
        lambda key: GPT(model_cfg, rngs=nnx.Rngs(key)),
        optax.adamw(schedule, weight_decay=cfg.weight_decay),
        lm_loss,
        strategy=strategy,
        devices=devices,
        axis_types=cfg.axis_types,
        grad_accum=cfg.grad_accum,
        compute_dtype=cfg.precision,
        batch_size=cfg.batch,
        nonfinite=cfg.on_nonfinite,
    )
    if planned is not None:
        trainer.strategy_reason = planned.why()
    return trainer, data, model_cfg


@dataclasses.dataclass
class _Run:
    """What the phases of one `shardkit train` share, built once by `_set_up`."""

    cfg: TrainConfig
    console: Any
    say: Callable[..., None]
    quiet: bool
    primary: bool  # several processes: process 0 prints and reports
    devices: list
    planned: Any
    trainer: Any
    data: Any
    model_cfg: Any
    why: str
    layout: list[dict[str, Any]]
    lint_report: Any
    pipe_rows: dict | None


def _set_up(cfg: TrainConfig, console: Any, quiet: bool) -> _Run:
    """Devices, the planner's choice (``--strategy auto``), the Trainer and its layouts."""
    jax.config.update("jax_threefry_partitionable", True)
    primary = jax.process_index() == 0
    quiet = quiet or not primary
    console = console or _console()
    devices = _devices(cfg)
    planned = None
    if cfg.strategy.strip().lower() == "auto":
        planned = auto_plan(cfg, model_config(cfg, _data(cfg)), devices)
    trainer, data, model_cfg = build_trainer(cfg, devices, planned=planned)
    pipe_rows = None
    if trainer.pipeline is not None:
        pipe_rows = pipeline_rows(trainer.pipeline, cfg.out if cfg.report else None)
    return _Run(
        cfg=cfg,
        console=console,
        say=(lambda *a, **k: None) if quiet else console.print,
        quiet=quiet,
        primary=primary,
        devices=devices,
        planned=planned,
        trainer=trainer,
        data=data,
        model_cfg=model_cfg,
        why=trainer.strategy_reason or f"chosen with --strategy {cfg.strategy}",
        layout=layout_rows(trainer),
        lint_report=trainer.lint(),
        pipe_rows=pipe_rows,
    )


def _show_set_up(run: _Run) -> None:
    """The header: versions, devices, plan, mesh, strategy, model, parameter layouts."""
    say, trainer, mesh, m = run.say, run.trainer, run.trainer.mesh, run.model_cfg
    say(f"[bold]versions[/] {escape(version_line())}")
    say(
        f"[bold]devices[/]  {len(run.devices)} x {run.devices[0].device_kind} "
        f"({jax.default_backend()})"
    )
    if run.planned is not None and not run.quiet:
        where = f"{len(run.devices)} x {run.planned.hardware.name}"
        say(f"[bold]plan[/]     the planner's top layouts on {where}, fastest first:")
        for i, row in enumerate(plan_rows(run.planned), 1):
            say(f"         {i}. " + escape(row))
    say(f"[bold]mesh[/]     {describe_mesh(mesh)}")
    say(f"[bold]strategy[/] {trainer.bound.description}")
    say("[bold]why[/]      " + escape(run.why))
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(trainer.abstract_params))
    say(
        f"[bold]model[/]    GPT d_model={m.d_model} layers={m.n_layers} heads={m.n_heads} "
        f"d_ff={m.ff} vocab={m.vocab} seq={m.seq_len} remat={m.remat}: {n_params:,} parameters"
    )
    for key, value in (run.pipe_rows or {}).items():
        say(f"[bold]pipeline[/] {key}: {value}")
    if not run.quiet:
        print_table(run.console, run.layout, "parameter layouts")
        say(escape(run.lint_report.summary()))
        for note in run.lint_report.notes:
            say("[bold]note[/]     " + escape(note))


def _start(run: _Run) -> tuple[Checkpointer, dict, Any]:
    """The checkpoint folder (checked fresh, or resumed from) and the first state."""
    cfg = run.cfg
    steps = refuse_foreign_steps(cfg.checkpoints) if run.primary and cfg.overwrite else []
    for entry in steps:  # asked for by --overwrite (local or bucket); a user's own files stay
        entry.rmtree()
    if steps:
        run.say(
            f"[bold]overwrite[/] removed the previous run's checkpoints "
            f"{sorted(e.name for e in steps)} in {cfg.checkpoints}"
        )
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("shardkit train: checkpoint folder ready")
    ckpt = Checkpointer(cfg.checkpoints, save_every=cfg.save_every, max_to_keep=cfg.keep)
    meta = {"model": dataclasses.asdict(run.model_cfg), "strategy": repr(run.trainer.strategy)}
    if cfg.resume and ckpt.latest_step() is not None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CheckpointRejectedWarning)
            state = ckpt.restore(run.trainer)
        for w in caught:
            if issubclass(w.category, CheckpointRejectedWarning):
                run.console.print(f"[yellow]checkpoint[/] {escape(str(w.message))}")
        run.say(f"[bold]resumed[/]  step {int(state.step)} from {ckpt.directory}")
    else:
        if cfg.resume:
            run.console.print(f"[yellow]resume[/]   {escape(nothing_to_resume(ckpt))}")
        state = run.trainer.init(cfg.seed)
    return ckpt, meta, state


def _loop(run: _Run, ckpt: Checkpointer, meta: dict, state: Any):
    """Compiles the step, then trains to ``cfg.steps`` with progress and checkpoints.

    Stops early, after saving a checkpoint, on SIGINT or SIGTERM (`RunInterrupted`), and on a
    NaN/Inf loss or gradient norm (`TrainingDivergedError`, nothing saved). Every logged row
    is appended to ``<out>/metrics.jsonl`` as it is logged.

    Returns ``(state, history, compiled step, compile seconds)``.
    """
    cfg, trainer = run.cfg, run.trainer
    start = int(jax.device_get(state.step))
    t0 = time.perf_counter()
    first = trainer.load_batch(run.data, start, batch_size=cfg.batch)
    compiled = trainer.compile_step(first)
    refuse_host_overflow(compiled)  # simulated devices share the host's memory
    compile_s = time.perf_counter() - t0
    run.say(f"[bold]compiled[/] training step in {compile_s:.1f} s")

    log = MetricsLog(pathlib.Path(cfg.out) / "metrics.jsonl" if run.primary else None, start=start)
    history = History(rows=list(log.earlier))  # resumed: the rows up to its checkpoint
    tokens_per_step = cfg.batch * run.model_cfg.seq_len
    extra = _extra_metrics(run, compiled, tokens_per_step)
    tb = ScalarWriter(cfg.tensorboard) if cfg.tensorboard and run.primary else None
    profile = ProfileWindow(parse_window(cfg.profile), pathlib.Path(cfg.out) / "profile")
    window_t, window_n, skipped = time.perf_counter(), 0, 0
    with (
        Progress(cfg.steps, start=start, console=run.console, enabled=not run.quiet) as bar,
        StopSignals() as stop,
        _closing(tb, profile),
    ):
        for step in range(start, cfg.steps):
            batch = (
                first if step == start else trainer.load_batch(run.data, step, batch_size=cfg.batch)
            )
            profile.before(step)
            state, metrics = trainer.step(state, batch)
            profile.after(step + 1, metrics)
            if "skipped" in metrics:  # --on-nonfinite skip: counted on device, read when logged
                skipped = skipped + metrics["skipped"]
            window_n += 1
            done = step + 1
            try:
                ckpt.save(state, meta=meta)
            except NonFiniteStateError as e:
                raise diverged(cfg.lr, ckpt, done, {}) from e
            if done % cfg.log_every == 0 or done == cfg.steps or stop.signum:
                m = {k: float(v) for k, v in jax.device_get(metrics).items()}
                if "skipped" in m:  # the updates skipped since the previous logged row
                    m["skipped"], skipped = int(jax.device_get(skipped)), 0
                finite = all(math.isfinite(m.get(k, 0.0)) for k in ("loss", "grad_norm"))
                if not finite and cfg.on_nonfinite == "stop":
                    raise diverged(cfg.lr, ckpt, done, m)
                dt = (time.perf_counter() - window_t) / window_n
                window_t, window_n = time.perf_counter(), 0
                history.add(step=done, step_time=dt, tokens_per_s=tokens_per_step / dt, **m)
                log.write(history.rows[-1])
                if tb is not None:
                    tb.write(done, {**history.rows[-1], **extra(tokens_per_step / dt)})
                bar.update(
                    done,
                    loss=m["loss"],
                    **({"acc": m["accuracy"]} if "accuracy" in m else {}),  # none when pipelined
                    **{"tok/s": tokens_per_step / dt},
                    **({"skipped": m["skipped"]} if m.get("skipped") else {}),
                )
            if jax.process_count() > 1 and multihost_utils.reached_preemption_sync_point(done):
                stop.signum = signal.SIGTERM  # JAX's notice: every rank stops at this step
            if stop.signum:
                raise interrupted(ckpt, meta, state, stop.signum)
    ckpt.save(state, meta=meta, force=int(jax.device_get(state.step)) not in ckpt.all_steps())
    ckpt.wait()
    return state, history, compiled, compile_s


def _extra_metrics(run: _Run, compiled, tokens_per_step: int):
    """`tokens/s -> {"mfu", "memory_bytes"}` for TensorBoard (measured peak on CPU; compiled
    per-device bytes of the step). Only computed when --tensorboard is on."""
    if not run.cfg.tensorboard:
        return lambda tok_s: {}
    peak = host_matmul_flops() if jax.default_backend() == "cpu" else float("nan")
    flops = run.model_cfg.flops_per_token()
    mem = compiled.memory_analysis()
    used = float("nan") if mem is None else float(
        mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
        - getattr(mem, "alias_size_in_bytes", 0)
    )  # fmt: skip
    return lambda tok_s: {"mfu": flops * tok_s / peak, "memory_bytes": used}


@contextlib.contextmanager
def _closing(tb, profile):
    """Closes the TensorBoard writer and ends an open profiler trace, however the loop ends."""
    try:
        yield
    finally:
        profile.stop()
        if tb is not None:
            tb.close()


def _evaluate(run: _Run, params: Any) -> tuple[float, float]:
    """Held-out ``(accuracy, loss)``, averaged over ``cfg.eval_batches`` batches."""
    cfg = run.cfg
    evals = [
        run.trainer.evaluate(
            params, run.trainer.load_batch(run.data, 10**9 + i, batch_size=cfg.batch, for_eval=True)
        )
        for i in range(cfg.eval_batches)
    ]
    accuracy = float(sum(float(e.get("accuracy", 0.0)) for e in evals) / len(evals))
    loss = float(sum(float(e["loss"]) for e in evals) / len(evals))
    return accuracy, loss


def _summary(run, history, eval_acc, eval_loss, compile_s, ckpt) -> tuple[dict, float]:
    """The run's summary table (also `summary.json`) and its median tokens/s."""
    tok_s = history.median("tokens_per_s")
    peak = host_matmul_flops() if jax.default_backend() == "cpu" else float("nan")
    achieved = run.model_cfg.flops_per_token() * tok_s
    summary = {
        "steps": run.cfg.steps,
        "final training loss": f"{history.last('loss'):.4f}",
        "held-out accuracy": f"{eval_acc:.3f}",
        "held-out loss": f"{eval_loss:.4f}",
        "tokens/s (median)": f"{tok_s:,.0f}",
        "model FLOP/s": f"{achieved:,.3g}",
        "MFU estimate": f"{achieved / peak:.1%} of measured host matmul peak {peak:.3g} FLOP/s"
        if math.isfinite(peak)
        else "n/a (pass the accelerator peak)",
        **predicted_vs_measured(run, tok_s),
        "compile time": f"{compile_s:.1f} s",
        "checkpoints": f"{ckpt.directory} steps {ckpt.all_steps()}",
    }
    return summary, tok_s


def _report(run, summary, coll_rows, problems, memory, audit, history, explained=()):
    """Writes the HTML report and `summary.json` into ``cfg.out``; returns the report's path."""
    cfg, trainer, mesh = run.cfg, run.trainer, run.trainer.mesh
    expected = trainer.bound.expected
    path = write_report(
        cfg.out,
        summary=summary,
        plan={
            "devices": f"{len(run.devices)} x {run.devices[0].device_kind}",
            "mesh": describe_mesh(mesh),
            "strategy": trainer.bound.description,
            "why": run.why,
            "expected collectives": "; ".join(
                f"{' or '.join(sorted(g))}: {w}"
                for g, w in zip(expected.required, expected.why, strict=True)
            )
            or "none",
        },
        layout_rows=run.layout,
        lint_summary=run.lint_report.summary(),
        collective_rows=coll_rows,
        collective_problems=problems,
        memory_rows=memory,
        history=history,
        audit_html=audit.to_html() if audit is not None else None,
        audit_notes=list(explained),
        config=cfg.to_dict(),
        pipeline=run.pipe_rows,
    )
    (pathlib.Path(cfg.out) / "summary.json").write_text(json.dumps(summary, indent=1))
    return path


def train(cfg: TrainConfig, *, console: Any = None, quiet: bool = False) -> RunResult:
    """Runs `shardkit train` for `cfg`: plan, layouts, training, audit, checkpoints, report.

    Args:
        cfg: a `TrainConfig`.
        console: a rich Console (default a new one); output goes there.
        quiet: print only the final summary (no tables or progress bar).

    Returns:
        A `RunResult`.
    """
    with StopAtOnce(BEFORE_FIRST_STEP) as stop:
        cfg, moved = claim_output(cfg)
        locks = hold_locks(cfg)
        ckpt = None
        try:
            if cfg.overwrite and jax.process_index() == 0:
                remove_outputs(cfg.out)  # the earlier run's summary, metrics and report
            run = _set_up(cfg, console, quiet)
            if moved:
                run.say(f"[bold]out[/]      {escape(moved)}")
            for lock in locks:
                if lock.stale:
                    run.say(f"[bold]lock[/]     took over the stale lock of {lock.stale}")
            _show_set_up(run)
            ckpt, meta, state = _start(run)
            if int(jax.device_get(state.step)) >= cfg.steps:  # a finished run, resumed again
                return _finished_already(run, ckpt, state)
            state, history, compiled, compile_s = _loop(run, ckpt, meta, state)
            stop.when = after_last_step(ckpt)
            return _finish(run, ckpt, state, history, compiled, compile_s)
        finally:
            if ckpt is not None:
                _close_quietly(ckpt)
            for lock in reversed(locks):
                lock.release()


def _finished_already(run: _Run, ckpt: Checkpointer, state: Any) -> RunResult:
    """A run resumed at or past ``--steps`` (a requeued job that had finished): nothing is
    trained and nothing it wrote (summary, metrics, report) is rewritten."""
    step, out = int(jax.device_get(state.step)), pathlib.Path(run.cfg.out)
    run.console.print(f"[bold]done[/]     {escape(already_done(run.cfg, step))}")
    summary = out / "summary.json"
    report = out / "report.html"
    return RunResult(
        steps=step, final_loss=math.nan, eval_accuracy=math.nan, eval_loss=math.nan,
        tokens_per_s=0.0, report=report if report.is_file() else None,
        checkpoint_dir=ckpt.directory, collective_problems=[], strategy=run.trainer.strategy,
        mesh_axes=dict(run.trainer.bound.axis_sizes), params=state.params,
        summary=json.loads(summary.read_text()) if summary.is_file() else {},
    )  # fmt: skip


def _close_quietly(ckpt: Checkpointer) -> None:
    """Waits for pending saves and stops orbax's threads, so a failing run still exits; an
    error here is secondary to the one already being raised (or was raised by `close`)."""
    with contextlib.suppress(Exception):  # reported by the caller's own error
        ckpt.close()


def _finish(run, ckpt, state, history, compiled, compile_s) -> RunResult:
    """Evaluation, audit, summary and report after the loop; the final line."""
    cfg = run.cfg
    eval_acc, eval_loss = _evaluate(run, state.params)

    coll_rows, problems, memory, audit, explained = audit_step(run.trainer, compiled)
    if not run.quiet:
        print_table(run.console, coll_rows, "audit: collectives of the compiled step")
        run.say(
            "[green]collectives match the strategy[/]"
            if not problems
            else "[red]" + "; ".join(problems) + "[/]"
        )
        for line in explained:
            run.say("[bold]audit[/]    " + escape(line))
        print_table(run.console, memory, "audit: memory per device (compiled step)")

    summary, tok_s = _summary(run, history, eval_acc, eval_loss, compile_s, ckpt)
    for key in ("step time", "MFU vs predicted"):
        if key in summary:
            run.say(f"[bold]{key}[/] " + escape(summary[key]))
    report_path = None
    if cfg.report and run.primary:
        report_path = _report(run, summary, coll_rows, problems, memory, audit, history, explained)
    elif run.primary:  # --no-report: no HTML or plots, the summary and metrics still
        write_metrics(cfg.out, history)
        (pathlib.Path(cfg.out) / "summary.json").write_text(json.dumps(summary, indent=1))
    ckpt.close()  # raises if an asynchronous save failed
    (run.console.print if run.primary else run.say)(
        f"[bold]done[/]     loss {history.last('loss'):.4f}, held-out accuracy {eval_acc:.3f}, "
        f"{tok_s:,.0f} tokens/s" + (f"; report {report_path}" if report_path else "")
    )
    return RunResult(
        steps=cfg.steps,
        final_loss=history.last("loss"),
        eval_accuracy=eval_acc,
        eval_loss=eval_loss,
        tokens_per_s=tok_s,
        report=report_path,
        checkpoint_dir=ckpt.directory,
        collective_problems=problems,
        strategy=run.trainer.strategy,
        mesh_axes=dict(run.trainer.bound.axis_sizes),
        params=state.params,
        summary=summary,
    )


def _console():
    """stdout's console: a terminal's own width, else wide (a log file cuts nothing at 80)."""
    return Console() if sys.stdout.isatty() else Console(width=200)
