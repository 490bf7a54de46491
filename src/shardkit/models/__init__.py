"""Flax NNX models with logical axis names, ready for `shardkit.strategies`.

Every parameter carries logical axis names in its `out_sharding` metadata (Flax's own key),
e.g. `("embed", "mlp")` for a column-parallel kernel. Strategies map these names to mesh axes,
so one model definition trains under data, FSDP, tensor or hybrid parallelism unchanged.

Logical names used: "layers" (stacked layer axis, never sharded), "embed" (model width),
"mlp" (feed-forward width), "heads" (attention heads), "kv" (head width), "vocab".

Example:
    >>> from flax import nnx
    >>> from shardkit.models import GPT, GPTConfig, logical_axes
    >>> model = GPT(GPTConfig(vocab=16, d_model=32, n_layers=2, n_heads=2, seq_len=16),
    ...             rngs=nnx.Rngs(0))
    >>> logical_axes(model)["embed"]["embedding"]
    ('vocab', 'embed')
"""

from shardkit.models.common import logical_axes as logical_axes
from shardkit.models.gpt import GPT as GPT
from shardkit.models.gpt import GPTConfig as GPTConfig
from shardkit.models.gpt import lm_loss as lm_loss
from shardkit.models.mlp import MLP as MLP
from shardkit.models.mlp import classification_loss as classification_loss
from shardkit.models.stages import StagedModel as StagedModel

__all__ = [
    "GPT",
    "MLP",
    "GPTConfig",
    "StagedModel",
    "classification_loss",
    "lm_loss",
    "logical_axes",
]
