"""`Pipeline`: the pipeline-parallel degree of a `Hybrid` strategy (mesh axis "stage").

A pipeline splits the model's stacked layers into `stages * virtual` consecutive stages, one
group per device along mesh axis "stage", and runs the global batch as `microbatches`
micro-batches through them with a schedule from `shardkit.pipeline` (GPipe, fused 1F1B,
interleaved, zero-bubble H1). It composes with the other degrees: "data" splits each
micro-batch, "tensor" splits every stage's matmuls (Megatron), so
`Hybrid(data=2, tensor=2, pipeline=Pipeline(stages=2))` is 3-D parallelism on 8 devices.

Example:
    >>> from shardkit.strategies import Hybrid, Pipeline
    >>> s = Hybrid(data=2, pipeline=Pipeline(stages=4, microbatches=8))
    >>> s.mesh_axes(8)
    {'stage': 4, 'data': 2}
"""

from __future__ import annotations

import dataclasses
from typing import Any

from shardkit.errors import ShardkitValueError
from shardkit.pipeline import OneFOneB
from shardkit.pipeline.names import SCHEDULE_NAMES as SCHEDULE_NAMES
from shardkit.pipeline.names import schedule_from_name as schedule_from_name


@dataclasses.dataclass(frozen=True, kw_only=True)
class Pipeline:
    """Pipeline parallelism over mesh axis "stage".

    Args:
        stages: devices along "stage" (p). The stacked layers are split into p * v stages,
            where v is the schedule's virtual stages per device (1 except `Interleaved`).
        schedule: a schedule from `shardkit.pipeline` (`GPipe()`, `OneFOneB()`,
            `Interleaved(v=2)`, `ZeroBubbleH1()`) or its short name ("gpipe", "1f1b",
            "interleaved", "zb-h1", "zb-h1-fused"); default fused 1F1B.
        microbatches: micro-batches per step (m); default 2 * stages. The global batch is
            cut into m micro-batches; "data" splits each micro-batch.
        residuals: "recompute" (each backward op reruns its stage's forward: least memory)
            or "stash" (forwards keep the residuals of in-flight micro-batches: no recompute).

    Raises:
        ValueError: for stages or microbatches < 1, an unknown schedule name, or a
            (stages, microbatches) pair the schedule cannot run (e.g. m < p for 1F1B), each
            with the fix.

    Example:
        >>> p = Pipeline(stages=4, schedule="gpipe", microbatches=8)
        >>> p.n_stages, p.schedule.name
        (4, 'gpipe')
    """

    stages: int = 2
    schedule: Any = None
    microbatches: int | None = None
    residuals: str = "recompute"

    def __post_init__(self):
        if self.residuals not in ("recompute", "stash"):
            raise ShardkitValueError(
                f"Pipeline(residuals={self.residuals!r}) is not 'recompute' or 'stash'; "
                "fix: Pipeline(residuals='stash') to keep residuals instead of recomputing."
            )
        if not isinstance(self.stages, int) or self.stages < 1:
            raise ShardkitValueError(
                f"Pipeline(stages={self.stages!r}) must be a positive int (devices along mesh "
                "axis 'stage'); fix: Pipeline(stages=4)."
            )
        if self.microbatches is None:
            object.__setattr__(self, "microbatches", 2 * self.stages)
        if not isinstance(self.microbatches, int) or self.microbatches < 1:
            raise ShardkitValueError(
                f"Pipeline(microbatches={self.microbatches!r}) must be a positive int; "
                f"fix: Pipeline(microbatches={2 * self.stages})."
            )
        schedule = self.schedule
        if schedule is None:
            schedule = OneFOneB()
        elif isinstance(schedule, str):
            schedule = schedule_from_name(schedule)
        object.__setattr__(self, "schedule", schedule)
        if self.stages > 1:
            schedule.check(self.stages, self.microbatches)

    @property
    def virtual(self) -> int:
        """Virtual stages per device (v)."""
        return int(getattr(self.schedule, "virtual", 1))

    @property
    def n_stages(self) -> int:
        """Model stages p * v: the stacked layers are cut into this many equal groups."""
        return self.stages * self.virtual

    def check_layers(self, n_layers: int, *, what: str = "model") -> None:
        """Raises ValueError unless `n_layers` splits evenly into `n_stages` stages."""
        n = self.n_stages
        if n_layers % n:
            fits = [d for d in range(1, n_layers + 1) if n_layers % (d * self.virtual) == 0]
            raise ShardkitValueError(
                f"{what} has {n_layers} stacked layers, which do not split into stages="
                f"{self.stages} x virtual={self.virtual} = {n} pipeline stages; fix: use a "
                f"layer count that is a multiple of {n} (e.g. --layers {n * max(1, n_layers // n)}"
                f"), or stages from {fits} for {n_layers} layers."
            )

    def describe(self) -> str:
        """One line: stages, schedule, micro-batches."""
        v = f", v={self.virtual}" if self.virtual > 1 else ""
        return (
            f"stage x{self.stages} (pipeline: layers in {self.n_stages} stages{v}, "
            f"{self.schedule.name} schedule, {self.microbatches} micro-batches"
            + (", stashed residuals)" if self.residuals == "stash" else ")")
        )
