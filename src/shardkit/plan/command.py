"""`shardkit plan`: rank layouts for a model on a machine, print the table and why.

Example:
    shardkit plan --model gpt3-175b --devices 1024 --hardware h100 --batch 1536
    shardkit plan --model llama3-8b --devices 8 --batch 16 --json
    shardkit plan --model llama3-8b --devices 8 --batch 16 --json --verify  # one JSON document
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import tomllib

from shardkit.cli_args import at_least
from shardkit.errors import ShardkitValueError
from shardkit.plan.hardware import known_hardware
from shardkit.plan.runtime import known_runtimes
from shardkit.plan.search import plan
from shardkit.plan.workload import Transformer, preset, presets


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `shardkit plan` flags to `parser`."""
    parser.description = (
        "Predict per-device memory, communication and compute for every data x fsdp x tensor "
        "x stage layout of a model on a machine, rank them by step time, and say why the top "
        "one wins. --verify compiles the top layouts to check the predictions."
    )
    parser.add_argument(
        "--model", default=None, help=f"preset: {', '.join(presets())} (default llama3-8b); "
        "with the flags below, the preset changed",
    )  # fmt: skip
    parser.add_argument(
        "--model-file", metavar="TOML",
        help="your own transformer: a TOML file of shardkit.plan.Transformer fields (layers, "
        "d_model, heads, vocab, seq, kv_heads, d_ff, gated, ...)",
    )  # fmt: skip
    for flag, field, text in _ARCH_FLAGS:
        parser.add_argument(flag, dest=field, type=at_least(1), default=None, help=text)
    parser.add_argument(
        "--devices", type=at_least(1), default=8, help="number of chips (default 8)"
    )
    parser.add_argument(
        "--hardware", default="h100", help=f"{', '.join(known_hardware())} (default h100)"
    )
    parser.add_argument("--batch", type=at_least(1), default=None, help="global batch in sequences")
    parser.add_argument(
        "--seq", type=at_least(1), default=None, help="sequence length (transformers)"
    )
    parser.add_argument(
        "--remat",
        default=None,
        choices=["none", "dots", "dots_no_batch", "block"],
        help="fix the remat policy",
    )
    parser.add_argument(
        "--precision", default=None, help="mixed (16 B/param), megatron (18), shardkit, fp32"
    )
    parser.add_argument(
        "--zero", default="3,1", help="ZeRO stages allowed over fsdp: '3,1', '3', '1' or 'none'"
    )
    parser.add_argument(
        "--max-stage", type=at_least(1), default=None, help="largest pipeline degree"
    )
    parser.add_argument(
        "--schedule", default="1f1b", choices=["1f1b", "gpipe", "interleaved", "zb-h1"],
        help="pipeline schedule shardkit runs (default 1f1b, the fused two-lane form)",
    )  # fmt: skip
    parser.add_argument(
        "--virtual",
        type=at_least(1),
        default=None,
        help="chunks per device for --schedule interleaved (default 2)",
    )
    parser.add_argument(
        "--sequence-parallel", action="store_true",
        help="tensor parallelism with Megatron sequence parallelism (as published runs used; "
        "shardkit train --sequence-parallel runs it)",
    )  # fmt: skip
    parser.add_argument(
        "--collective-matmul", action="store_true",
        help="with --sequence-parallel: the blocks' tensor traffic as overlapped rings "
        "(shardkit train --collective-matmul runs it)",
    )  # fmt: skip
    parser.add_argument(
        "--runtime", default="shardkit", choices=known_runtimes(),
        help="the stack that runs the layouts (default shardkit, what shardkit train runs; "
        "megatron, torchtitan, pytorch-fsdp, maxtext predict their runs)",
    )  # fmt: skip
    parser.add_argument("--top", type=at_least(1), default=8, help="rows to show (default 8)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--verify", action="store_true", help="compile the top layouts and compare")


# your own transformer from the command line: flag -> Transformer field
_ARCH_FLAGS = [
    ("--layers", "layers", "transformer blocks"),
    ("--d-model", "d_model", "model width"),
    ("--heads", "heads", "attention heads"),
    ("--kv-heads", "kv_heads", "key/value heads (grouped-query attention; default = heads)"),
    ("--d-ff", "d_ff", "MLP hidden width (default 4 x d_model)"),
    ("--vocab", "vocab", "vocabulary size"),
]
_REQUIRED = ("layers", "d_model", "heads", "vocab", "seq")


def _workload(args: argparse.Namespace):
    """The preset, the preset changed by the architecture flags, or the user's own model."""
    changes = {f: getattr(args, f) for _, f, _ in _ARCH_FLAGS if getattr(args, f) is not None}
    if args.seq:
        changes["seq"] = args.seq
    if args.precision:
        changes["precision"] = args.precision
    if args.model_file:
        path = pathlib.Path(args.model_file)
        try:
            fields = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ShardkitValueError(
                f"--model-file {path}: not TOML ({e}); fix: write fields as layers = 32."
            ) from None
        known = {f.name for f in dataclasses.fields(Transformer)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ShardkitValueError(
                f"--model-file {path}: unknown field(s) {', '.join(unknown)}; fix: use "
                f"{', '.join(sorted(known))}."
            )
        fields = {**fields, **changes}
    elif args.model is None and set(changes) - {"precision", "seq"}:
        fields = changes  # only flags: the user's own transformer
    else:
        return preset(args.model or "llama3-8b", **changes)
    missing = [f for f in _REQUIRED if f not in fields]
    if missing:
        raise ShardkitValueError(
            f"your own model lacks {', '.join(missing)}; fix: pass "
            + " ".join(f"--{m.replace('_', '-')} N" for m in missing)
            + " (or start from a preset with --model llama3-8b)."
        )
    return Transformer(**{"name": "custom", **fields})


def _zero(text: str) -> tuple[int, ...]:
    if text.strip().lower() in ("", "none", "0"):
        return ()
    try:
        stages = tuple(int(z) for z in text.split(","))
    except ValueError:
        stages = ()
    if not stages or set(stages) - {1, 3}:
        raise ShardkitValueError(
            f"--zero {text!r}: the ZeRO stages over 'fsdp' are 1 and 3; fix: --zero 3,1 (both), "
            "--zero 3, --zero 1 or --zero none (no fsdp axis)."
        )
    return stages


def run(args: argparse.Namespace) -> int:
    """Runs `shardkit plan`; returns the exit code."""
    workload = _workload(args)
    if args.virtual is not None and args.schedule != "interleaved":
        raise ShardkitValueError(
            f"--virtual {args.virtual} sets the chunks per device of the interleaved schedule, "
            f"but --schedule is {args.schedule}; fix: add --schedule interleaved."
        )
    if args.collective_matmul and not args.sequence_parallel:
        raise ShardkitValueError(
            "--collective-matmul overlaps sequence parallelism's transfers, but "
            "--sequence-parallel is off; fix: --sequence-parallel --collective-matmul."
        )
    result = plan(
        workload,
        devices=args.devices,
        hardware=args.hardware,
        batch=args.batch,
        remat=args.remat,
        max_stage=args.max_stage,
        zero=_zero(args.zero),
        schedule=args.schedule,
        virtual=args.virtual or 2,
        sequence_parallel=args.sequence_parallel,
        collective_matmul=args.collective_matmul,
        runtime=args.runtime,
    )
    verification = result.verify(top=min(args.top, 3), quiet=True) if args.verify else None
    if args.json:  # one JSON document: the plan, and the verification when asked for
        data = result.to_dict(top=args.top)
        if verification is not None:
            data["verification"] = verification.to_dict()
        print(json.dumps(data, indent=2))
    else:
        print(result.render(top=args.top), end="")
        if verification is not None:
            print(verification.render())
    sys.stdout.flush()
    if verification is not None and not verification.ok:
        print(
            "shardkit plan: --verify: a measured quantity is outside its bound (rows marked "
            "above); fix: report it with the table, or plan without --verify.",
            file=sys.stderr,
        )
        return 1
    return 0
