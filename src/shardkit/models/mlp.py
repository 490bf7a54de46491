"""A multi-layer perceptron (seed scenario: 784-512-256-10) with logical axis names."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from shardkit.errors import ShardkitValueError
from shardkit.models.common import param, row_parallel_out


class _Dense(nnx.Module):
    def __init__(self, din: int, dout: int, names: tuple[str, str], *, rngs: nnx.Rngs):
        self.kernel = param(nnx.initializers.lecun_normal(), rngs.params(), (din, dout), names)
        self.bias = param(nnx.initializers.zeros, rngs.params(), (dout,), (names[1],))

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.kernel[...]
        x = x.astype(kernel.dtype)  # compute in the parameters' dtype
        y = jnp.einsum("bi,io->bo", x, kernel, out_sharding=row_parallel_out(x, 2))  # (B, O)
        return y + self.bias[...].astype(x.dtype)


class MLP(nnx.Module):
    """A ReLU MLP whose kernels alternate column- and row-parallel logical names.

    Layer i's kernel is named ("embed", "mlp") when i is even and ("mlp", "embed") when odd,
    so tensor parallelism shards the hidden width without a gather in between (Megatron
    column-then-row). The last layer's output is named "classes", which no strategy shards.

    Args:
        sizes: layer widths, input first, e.g. (784, 512, 256, 10).
        rngs: Flax random streams for initialisation.

    Raises:
        ValueError: if fewer than two sizes are given or a size is not positive.

    Example:
        >>> model = MLP((784, 512, 256, 10), rngs=nnx.Rngs(0))
        >>> model(jnp.ones((4, 784))).shape
        (4, 10)

    See also: `classification_loss`, `shardkit.models.GPT`.
    """

    def __init__(self, sizes: Sequence[int] = (784, 512, 256, 10), *, rngs: nnx.Rngs):
        sizes = tuple(int(s) for s in sizes)
        if len(sizes) < 2 or min(sizes) < 1:
            raise ShardkitValueError(
                f"MLP sizes={sizes} needs at least two positive widths (input and output); "
                "fix: pass e.g. sizes=(784, 512, 256, 10)."
            )
        self.sizes = sizes
        layers = []
        for i, (din, dout) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            last = i == len(sizes) - 2
            a, b = ("embed", "mlp") if i % 2 == 0 else ("mlp", "embed")
            if last:
                b = "classes"
            layers.append(_Dense(din, dout, (a, b), rngs=rngs))
        self.layers = nnx.List(layers)

    def __call__(self, x: jax.Array) -> jax.Array:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = jax.nn.relu(x)
        return x


def classification_loss(model: nnx.Module, batch: dict) -> tuple[jax.Array, dict]:
    """Mean softmax cross-entropy of `model(batch["x"])` against integer `batch["y"]`.

    Returns:
        (loss, {"accuracy": fraction of correct argmax predictions}).
    """
    logits = model(batch["x"]).astype(jnp.float32)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    accuracy = (jnp.argmax(logits, -1) == batch["y"]).mean()
    return loss, {"accuracy": accuracy}
