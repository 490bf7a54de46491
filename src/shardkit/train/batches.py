"""Batch placement for `Trainer`: the global batch split over the batch-splitting mesh axes,
stacked in micro-batches when the step accumulates them, each process reading only its rows.

`BatchPlacement` is a part of `Trainer`; it reads the trainer's `mesh`, `bound` (the strategy
bound to it), `microbatches` and `pipeline`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.errors import ShardkitError
from shardkit.train.arguments import check_host_batch

__all__ = ["BatchPlacement", "BatchSizeError"]


class BatchSizeError(ShardkitError, ValueError):
    """A batch that the data-splitting mesh axes (or micro-batches) do not divide."""


class BatchPlacement:
    """The batch methods of `Trainer` (`place_batch`, `load_batch`, `process_rows`...)."""

    mesh: jax.sharding.Mesh
    bound: Any
    microbatches: int
    pipeline: Any

    def batch_sharding(self, batch: Mapping[str, Any], *, micro: bool = True) -> dict:
        """NamedShardings for a batch dict (leading dim split; micro-batch dim first if any)."""
        out = {}
        for key, value in batch.items():
            spec = self.bound.batch_spec(np.ndim(value) - (self.microbatches > 1 and micro))
            if self.microbatches > 1 and micro:
                spec = P(None, *spec)
            out[key] = NamedSharding(self.mesh, spec)
        return out

    def batch_divisor(self, *, micro: bool = True) -> int:
        """The number every global batch size must be a multiple of."""
        return self.bound.batch_split * (self.microbatches if micro else 1)

    def _check_batch_size(self, size: int, micro: bool) -> None:
        div = self.batch_divisor(micro=micro)
        if size % div:
            axes = {a: self.bound.size(a) for a in self.bound.batch_axes}
            what = "microbatches" if self.pipeline else "grad_accum"
            raise BatchSizeError(
                f"batch size {size} is not divisible by {div} (mesh axes {axes} that split the "
                f"batch x {what}={self.microbatches if micro else 1}); fix: use a batch size "
                f"that is a multiple of {div}, e.g. {max(div, size // div * div)}."
            )

    def process_rows(self, batch_size: int, *, for_eval: bool = False) -> np.ndarray:
        """Indices of the global batch's rows that this process's devices hold.

        All rows in a single process. With several processes each gets the rows of its own
        devices (in the order `place_local_batch` expects), so data loaders read only those.

        Raises:
            BatchSizeError: if `batch_size` is not divisible as `place_batch` needs.

        Example:
            >>> trainer.process_rows(8)            # doctest: +SKIP
            array([0, 1, 2, 3, 4, 5, 6, 7])        # one process; [0..3] / [4..7] with two
        """
        micro = self.microbatches > 1 and not for_eval
        self._check_batch_size(batch_size, micro)
        m = self.microbatches
        shape = (m, batch_size // m) if micro else (batch_size,)
        index = np.arange(batch_size).reshape(shape)
        if jax.process_count() == 1:
            return index.ravel()
        sharding = self.batch_sharding({"x": np.zeros(shape + (1,))}, micro=micro)["x"]
        dim = len(shape) - 1
        spans = sorted(
            {
                (idx[dim].start or 0, shape[dim] if idx[dim].stop is None else idx[dim].stop)
                for idx in sharding.addressable_devices_indices_map(shape + (1,)).values()
            }
        )
        local = np.unique(np.concatenate([np.arange(a, b) for a, b in spans]))
        return index[..., local].ravel()

    def place_batch(self, batch: Mapping[str, Any], *, for_eval: bool = False) -> dict:
        """Places a host batch (dict of NumPy arrays, batch dim first) on the mesh.

        `batch` is the whole global batch; with several processes each keeps only the rows
        of its own devices (to load only those rows, use `load_batch`). With `grad_accum > 1`
        (or pipeline micro-batches) the batch is reshaped to (micro-batches,
        batch // micro-batches, ...) first.

        Raises:
            BatchSizeError: if the batch is not divisible by the batch-splitting mesh axes
                times grad_accum (or the pipeline's micro-batches).
        """
        check_host_batch(batch)
        sizes = {np.shape(v)[0] for v in batch.values()}
        if len(sizes) != 1:
            raise BatchSizeError(f"batch arrays have different leading sizes {sorted(sizes)}.")
        size = sizes.pop()
        rows = self.process_rows(size, for_eval=for_eval)
        if len(rows) != size:
            batch = {k: np.asarray(v)[rows] for k, v in batch.items()}
        return self.place_local_batch(batch, batch_size=size, for_eval=for_eval)

    def place_local_batch(
        self, batch: Mapping[str, Any], *, batch_size: int, for_eval: bool = False
    ) -> dict:
        """Places this process's rows (`process_rows(batch_size)`, in that order) on the mesh.

        Uses `jax.make_array_from_process_local_data` with the global shape, so the result
        is the global batch of `batch_size` rows whatever the process count.

        Raises:
            BatchSizeError: if the local rows are not the count `process_rows` gives.
        """
        micro = self.microbatches > 1 and not for_eval
        want = len(self.process_rows(batch_size, for_eval=for_eval))
        for key, value in batch.items():
            if np.shape(value)[0] != want:
                raise BatchSizeError(
                    f"batch[{key!r}] has {np.shape(value)[0]} rows but process "
                    f"{jax.process_index()} of {jax.process_count()} feeds {want} of the "
                    f"global {batch_size}; fix: pass the rows trainer.process_rows({batch_size})."
                )
        if micro:
            m = self.microbatches
            batch = {k: np.reshape(v, (m, want // m) + np.shape(v)[1:]) for k, v in batch.items()}
        shardings = self.batch_sharding(batch, micro=micro)
        lead = (self.microbatches, batch_size // self.microbatches) if micro else (batch_size,)
        return {
            k: jax.make_array_from_process_local_data(
                shardings[k], np.asarray(v), lead + np.shape(v)[len(lead) :]
            )
            for k, v in batch.items()
        }

    def load_batch(self, data: Any, step: int, *, batch_size: int, for_eval=False) -> dict:
        """Loads and places batch `step` of `data`, reading only this process's rows.

        Args:
            data: a source with `batch(step, *, batch_size, rows)` (`ReverseTask`,
                `TokenFile`, `TeacherTask`).
            step: the batch index.
            batch_size: the global batch size (the same on every process).

        Example:
            >>> batch = trainer.load_batch(ReverseTask(), 0, batch_size=64)  # doctest: +SKIP
        """
        rows = self.process_rows(batch_size, for_eval=for_eval)
        local = data.batch(step, batch_size=batch_size, rows=rows)
        return self.place_local_batch(local, batch_size=batch_size, for_eval=for_eval)
