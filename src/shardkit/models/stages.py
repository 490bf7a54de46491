"""A model cut for pipeline parallelism: a front part, equal stages of stacked layers, a last part.

`shardkit.pipeline.pipeline_value_and_grad` runs `stage_fn` on every stage and `last_fn` (head
and loss) after the last one; the front part (an embedding) runs before the pipeline, and its
gradient comes from the cotangent of the pipeline's inputs. The parameters stay in their
canonical layout (the stacked "layers" axis whole); `split` cuts it into `n_stages` groups of
consecutive layers, a reshape that is local when the layers axis is split over mesh axis
"stage", and `merge` undoes it.

Example:
    >>> from flax import nnx
    >>> from shardkit.models import GPT, GPTConfig
    >>> model = GPT(GPTConfig(n_layers=4, d_model=32), rngs=nnx.Rngs(0))
    >>> staged = model.pipeline_stages(2)
    >>> front, stages, last = staged.split(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    >>> stages["up"].shape  # (stages, layers per stage, embed, mlp)
    (2, 2, 32, 128)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from shardkit.errors import ShardkitValueError


@dataclasses.dataclass(frozen=True, kw_only=True)
class StagedModel:
    """Pure functions and a parameter split that run a model as a pipeline.

    Attributes:
        n_stages: number of stages the stacked layers are cut into.
        stacked: key of the stacked-layer subtree in the parameter dict (e.g. "blocks").
        last_keys: top-level parameter keys used by `last_fn` (the rest go to `first_fn`).
        first_fn: `(front_params, inputs) -> x`, inputs of one micro-batch.
        stage_fn: `(stage_params, x) -> x` for one stage's layers (same shape and dtype out).
        last_fn: `(last_params, y, target) -> scalar loss` of one micro-batch.
        loss_fn: the model-level loss `(model, batch)` that the pipeline reproduces.
        input_key: batch key fed to `first_fn`; the other batch keys form `target`.
    """

    n_stages: int
    stacked: str
    last_keys: tuple[str, ...]
    first_fn: Callable[[Any, jax.Array], jax.Array]
    stage_fn: Callable[[Any, jax.Array], jax.Array]
    last_fn: Callable[[Any, jax.Array, Any], jax.Array]
    loss_fn: Callable[..., Any]
    input_key: str = "inputs"

    def split(self, params: dict) -> tuple[dict, Any, dict]:
        """Canonical parameters -> (front, stages with leaves (n_stages, L / n_stages, ...), last).

        Raises:
            ValueError: if the stacked layers do not split into `n_stages` equal groups.
        """
        n = self.n_stages
        layers = {x.shape[0] for x in jax.tree.leaves(params[self.stacked])}
        (count,) = layers
        if count % n:
            raise ShardkitValueError(
                f"params[{self.stacked!r}] holds {count} stacked layers, which do not split "
                f"into {n} pipeline stages; fix: use a layer count that is a multiple of {n}."
            )
        stages = jax.tree.map(
            lambda x: x.reshape((n, x.shape[0] // n) + x.shape[1:]), params[self.stacked]
        )
        front = {k: v for k, v in params.items() if k not in self.last_keys + (self.stacked,)}
        last = {k: params[k] for k in self.last_keys}
        return front, stages, last

    def merge(self, front: dict, stages: Any, last: dict) -> dict:
        """Inverse of `split` (e.g. for gradients): stage leaves back to (L, ...)."""
        stacked = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), stages)
        return {**front, self.stacked: stacked, **last}
