"""`TrainConfig`: every `shardkit train` setting, from defaults, a TOML file and flags.

Precedence: defaults < TOML file < command-line flags. Unknown keys are errors, not ignored.

Example TOML (all keys optional):

    steps = 300
    batch = 64
    strategy = "hybrid"
    mesh = { fsdp = 4, tensor = 2 }
    [model]
    d_model = 64
    n_layers = 2
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import tomllib
from collections.abc import Mapping
from typing import Any

from shardkit.errors import ShardkitValueError

_MODEL_KEYS = ("d_model", "n_layers", "n_heads", "d_ff", "remat")
_PRECISIONS = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Settings of a training run; defaults are the `shardkit train` demo (under 5 minutes
    on a 2-core CPU with 8 simulated devices, reaching >= 0.95 reversal accuracy).

    Attributes mirror the CLI flags; see `shardkit train --help`.
    """

    # model: a small GPT; the task sets vocab and sequence length
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int | None = None
    remat: str = "none"
    # data: the synthetic reversal task, or a token file
    data: str | None = None  # path to a token file (.npy ids or raw bytes); None = reversal
    digits: int = 15  # vocab 16 = digits + separator: divisible for a vocab-parallel split
    length: int = 8  # reversal: digits per sequence (sequence length 2 * length)
    seq_len: int = 64  # token file: tokens per sequence
    # parallelism
    strategy: str = "auto"
    mesh: Mapping[str, int] = dataclasses.field(default_factory=dict)
    axis_types: str = "auto"
    devices: int = 8  # simulated CPU devices when running on CPU
    schedule: str | None = None  # pipeline schedule (mesh axis "stage"); None = fused 1F1B
    microbatches: int | None = None  # pipeline micro-batches; None = 2 x stage
    residuals: str | None = None  # pipeline backward: "recompute" (None) or "stash"
    # optimisation
    steps: int = 300
    batch: int = 64
    lr: float = 3e-3
    warmup: int = 30
    weight_decay: float = 0.01
    grad_accum: int = 1
    precision: str = "float32"  # "bfloat16": bf16 compute, fp32 master weights and Adam state
    seed: int = 0
    # outputs
    out: str = "shardkit-train"
    checkpoint_dir: str | None = None  # default <out>/checkpoints
    save_every: int = 100
    keep: int = 3
    resume: bool = False  # continue from the latest checkpoint in checkpoint_dir
    overwrite: bool = False  # replace another run's checkpoints in checkpoint_dir
    on_nonfinite: str = "stop"  # NaN/Inf loss or gradient norm: "stop" or "skip" the update
    log_every: int = 10
    eval_batches: int = 4
    report: bool = True
    tensorboard: str | None = None  # folder for TensorBoard event files
    profile: str | None = None  # "START:STOP": a jax.profiler trace of those steps

    def __post_init__(self):
        if self.precision not in _PRECISIONS:
            raise ShardkitValueError(
                f"precision={self.precision!r} is not one of {_PRECISIONS}; "
                "fix: --precision bfloat16."
            )
        for name in ("steps", "batch", "grad_accum", "save_every", "log_every", "devices"):
            if getattr(self, name) < 1:
                raise ShardkitValueError(
                    f"{name}={getattr(self, name)} must be >= 1; fix: {name}=1."
                )
        if self.keep < 1:
            raise ShardkitValueError(
                f"keep={self.keep} would delete every checkpoint, including the one being "
                "resumed from; fix: --keep 1 or more (default 3)."
            )
        if not math.isfinite(self.lr) or self.lr <= 0:
            raise ShardkitValueError(
                f"lr={self.lr} is not a positive finite learning rate; fix: --lr 3e-3."
            )
        if self.on_nonfinite not in ("stop", "skip"):
            raise ShardkitValueError(
                f"on_nonfinite={self.on_nonfinite!r} is not 'stop' or 'skip'; fix: "
                "--on-nonfinite stop (default) or --on-nonfinite skip."
            )
        if self.resume and self.overwrite:
            raise ShardkitValueError(
                "--resume continues the checkpoints that --overwrite would delete; fix: pass one."
            )
        if self.microbatches is not None and self.microbatches < 1:
            raise ShardkitValueError(
                f"microbatches={self.microbatches} must be >= 1; fix: --microbatches 8."
            )
        if self.profile is not None:
            parse_window(self.profile)
        if self.axis_types not in ("auto", "explicit"):
            raise ShardkitValueError(
                f"axis_types={self.axis_types!r} is not 'auto' or 'explicit'; "
                "fix: --axis-types explicit."
            )

    @property
    def checkpoints(self) -> str:
        return self.checkpoint_dir or str(pathlib.Path(self.out) / "checkpoints")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["mesh"] = dict(self.mesh)
        return out


def parse_window(text: str | None) -> tuple[int, int] | None:
    """`"START:STOP"` -> (start, stop) steps, STOP exclusive; None for None.

    Raises:
        ShardkitValueError: not two integers with 0 <= START < STOP.
    """
    if text is None:
        return None
    parts = str(text).split(":")
    try:
        start, stop = (int(p) for p in parts)
    except ValueError:
        start, stop = -1, -1
    if len(parts) != 2 or start < 0 or stop <= start:
        raise ShardkitValueError(
            f"profile={text!r} is not START:STOP steps with 0 <= START < STOP; fix: "
            "--profile 10:20 traces steps 10 to 19."
        )
    return start, stop


def load(path: str | None = None, overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """Builds a `TrainConfig` from an optional TOML file and flag overrides (None = unset).

    Raises:
        FileNotFoundError: if `path` does not exist.
        ValueError: for unknown keys (with the list of valid ones) or bad values.
    """
    values: dict[str, Any] = {}
    if path is not None:
        p = pathlib.Path(path)
        if not p.exists():
            raise FileNotFoundError(f"config file {path!r} not found; fix: pass a real path.")
        raw = tomllib.loads(p.read_text())
        model = raw.pop("model", {})
        for key, value in model.items():
            if key not in _MODEL_KEYS:
                raise ShardkitValueError(
                    f"{path}: unknown key [model].{key}; fix: use one of {', '.join(_MODEL_KEYS)}."
                )
            values[key] = value
        values.update(raw)
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ShardkitValueError(
            f"unknown config key(s) {', '.join(unknown)}"
            + (f" in {path}" if path else "")
            + f"; fix: use keys from {', '.join(sorted(fields))}."
        )
    return TrainConfig(**values)
