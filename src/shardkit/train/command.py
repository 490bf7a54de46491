"""`shardkit train`: flags and dispatch. Imports nothing heavy until `run` is called."""

from __future__ import annotations

import argparse
import json
import os
import sys

from shardkit.cli_args import at_least, parse_mesh_arg
from shardkit.compat import backend_started
from shardkit.distributed import initialize
from shardkit.distributed.environment import PROCESS_ID
from shardkit.distributed.launch import launch
from shardkit.errors import ShardkitValueError
from shardkit.train.config import load

# flag -> (config key, type, help); defaults live in TrainConfig so a TOML file can set them
_FLAGS = [
    ("--steps", "steps", int, "training steps (default 300)"),
    ("--batch", "batch", int, "global batch size (default 64)"),
    ("--lr", "lr", float, "peak learning rate of the warmup-cosine schedule (default 3e-3)"),
    ("--grad-accum", "grad_accum", int, "micro-batches per step (default 1)"),
    ("--precision", "precision", str, "float32 or bfloat16 (bf16 compute, fp32 master)"),
    ("--d-model", "d_model", int, "GPT width (default 64)"),
    ("--layers", "n_layers", int, "GPT blocks, stacked and scanned (default 2)"),
    ("--heads", "n_heads", int, "attention heads (default 4)"),
    ("--remat", "remat", str, "none, block or dots (rematerialisation policy)"),
    ("--data", "data", str, "token file (.npy ids or raw bytes); default: synthetic reversal"),
    ("--length", "length", int, "reversal task: digits per sequence (default 8)"),
    ("--strategy", "strategy", str, "auto, dp, fsdp, zero1, tp or hybrid (default auto)"),
    (
        "--schedule",
        "schedule",
        str,
        "pipeline schedule: gpipe, 1f1b, interleaved, zb-h1 or zb-h1-fused",
    ),
    ("--microbatches", "microbatches", int, "pipeline micro-batches per step (default 2 x stage)"),
    ("--residuals", "residuals", str, "pipeline backward: recompute (default) or stash"),
    ("--axis-types", "axis_types", str, "mesh axis types: auto or explicit (default auto)"),
    ("--devices", "devices", int, "devices to use; on CPU, simulated devices (default 8)"),
    ("--seed", "seed", int, "initialisation and data seed (default 0)"),
    ("--out", "out", str, "output folder for the report (default shardkit-train)"),
    ("--checkpoint-dir", "checkpoint_dir", str, "checkpoint folder (default <out>/checkpoints)"),
    ("--save-every", "save_every", int, "checkpoint every N steps (default 100)"),
    ("--keep", "keep", int, "checkpoints to keep, at least 1 (default 3)"),
    ("--on-nonfinite", "on_nonfinite", str, "NaN/Inf loss or gradients: stop (default) or skip"),
    ("--log-every", "log_every", int, "metrics every N steps (default 10)"),
    (
        "--tensorboard",
        "tensorboard",
        str,
        "write TensorBoard scalars (loss, tokens/s, MFU, memory) to this folder",
    ),
    (
        "--profile",
        "profile",
        str,
        "START:STOP: a jax.profiler trace of those steps in <out>/profile",
    ),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `shardkit train` flags to `parser` (every flag can also be set in TOML)."""
    parser.description = (
        "Train a GPT with a parallel strategy on a device mesh. With no flags: the synthetic "
        "reversal task on 8 simulated CPU devices, strategy chosen automatically; prints the "
        "plan, layouts, a progress bar and an audit, writes checkpoints and an HTML report."
    )
    parser.add_argument("--config", help="TOML file with any of these settings")
    parser.add_argument(
        "--mesh",
        help="mesh axis sizes, e.g. data=4,tensor=2 or data=2,stage=4 (axes: data, fsdp, "
        "tensor, stage; stage > 1 runs pipeline stages, with --strategy hybrid)",
    )
    for flag, key, kind, text in _FLAGS:
        parser.add_argument(flag, dest=key, type=kind, default=None, help=text)
    parser.add_argument(
        "--resume", dest="resume", action="store_true", default=None,
        help="continue from the latest checkpoint in the checkpoint folder",
    )  # fmt: skip
    parser.add_argument(
        "--overwrite", dest="overwrite", action="store_true", default=None,
        help="replace the checkpoints another run left in the checkpoint folder",
    )  # fmt: skip
    parser.add_argument("--no-report", dest="report", action="store_false", default=None)
    parser.add_argument("--quiet", action="store_true", help="print only the final line")
    parser.add_argument("--json", action="store_true", help="print only the run's summary, as JSON")
    parser.add_argument(
        "--processes", type=at_least(1), default=1,
        help="run as N local processes (shardkit launch), --devices split evenly over them",
    )  # fmt: skip


def config_from_args(args: argparse.Namespace):
    """The `TrainConfig` for parsed flags (TOML file first, then flags)."""
    overrides = {key: getattr(args, key, None) for _, key, _, _ in _FLAGS}
    overrides["resume"] = getattr(args, "resume", None)
    overrides["overwrite"] = getattr(args, "overwrite", None)
    overrides["report"] = getattr(args, "report", None)
    if getattr(args, "mesh", None):
        overrides["mesh"] = parse_mesh_arg(args.mesh)
    return load(getattr(args, "config", None), overrides)


def _argv(args: argparse.Namespace) -> list[str]:
    """The `shardkit train` flags of `args`, without --processes (for each rank)."""
    out = []
    for name in ("config", "mesh"):
        if getattr(args, name, None):
            out += [f"--{name}", getattr(args, name)]
    for flag, key, _, _ in _FLAGS:
        if getattr(args, key, None) is not None:
            out += [flag, str(getattr(args, key))]
    out += ["--resume"] * bool(getattr(args, "resume", None))
    out += ["--overwrite"] * bool(getattr(args, "overwrite", None))
    out += ["--no-report"] * (getattr(args, "report", None) is False)
    out += ["--quiet"] * bool(getattr(args, "quiet", False))
    out += ["--json"] * bool(getattr(args, "json", False))
    return out


def _launch(args: argparse.Namespace, cfg) -> int:
    """`--processes N`: run this command as N ranks with --devices / N devices each."""
    n = args.processes
    if cfg.devices % n:
        raise ShardkitValueError(
            f"--devices {cfg.devices} do not split evenly over --processes {n} "
            f"({cfg.devices / n:g} devices per process); fix: --devices "
            f"{n * max(1, cfg.devices // n)} or a process count that divides {cfg.devices}."
        )
    cmd = [sys.executable, "-m", "shardkit.cli", "train", *_argv(args)]
    return launch(cmd, processes=n, devices_per_process=cfg.devices // n)


def run(args: argparse.Namespace) -> int:
    """Runs `shardkit train`; returns 0 on success (1 if the audit found unexpected
    collectives)."""
    cfg = config_from_args(args)
    processes = getattr(args, "processes", 1) or 1
    if processes < 1:
        raise ShardkitValueError(f"--processes {processes} must be >= 1; fix: --processes 2.")
    if processes > 1 and PROCESS_ID not in os.environ:
        return _launch(args, cfg)
    if PROCESS_ID in os.environ:  # a rank of `shardkit launch`: join the run first
        initialize()
    elif os.environ.get("JAX_PLATFORMS", "cpu") in ("", "cpu"):
        # lazy: `shardkit train --help` starts no JAX
        from shardkit.mesh import simulate_cpu_devices

        if not backend_started():
            simulate_cpu_devices(cfg.devices)
    from shardkit.train.run import train  # lazy: `shardkit train --help` starts no JAX

    as_json = bool(getattr(args, "json", False))
    if as_json:  # stdout holds the JSON document alone; the final line goes to stderr
        from rich.console import Console  # lazy: `shardkit train --help` stays light

        result = train(cfg, quiet=True, console=Console(file=sys.stderr))
    else:
        result = train(cfg, quiet=bool(getattr(args, "quiet", False)))
    if as_json and os.environ.get(PROCESS_ID, "0") == "0":  # process 0 prints it
        print(json.dumps({
            **result.summary,
            "strategy": repr(result.strategy),
            "mesh": result.mesh_axes,
            "collective_problems": result.collective_problems,
            "report": None if result.report is None else str(result.report),
        }, indent=1))  # fmt: skip
    return 1 if result.collective_problems else 0
