"""Models: shapes, logical axis names, remat policies give identical gradients, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from shardkit.models import GPT, MLP, GPTConfig, lm_loss, logical_axes
from shardkit.models.gpt import masked_nll

CFG = GPTConfig(vocab=16, d_model=32, n_layers=2, n_heads=4, seq_len=16)


# Models are built inside jit / eval_shape: eager construction dispatches op by op (slow).
def test_mlp_seed_sizes_and_names():
    out = jax.eval_shape(
        lambda x: MLP((784, 512, 256, 10), rngs=nnx.Rngs(0))(x), jnp.ones((3, 784))
    )
    assert out.shape == (3, 10)
    model = nnx.eval_shape(lambda: MLP((784, 512, 256, 10), rngs=nnx.Rngs(0)))
    names = logical_axes(model)["layers"]
    assert [names[i]["kernel"] for i in range(3)] == [
        ("embed", "mlp"),
        ("mlp", "embed"),
        ("embed", "classes"),
    ]


def test_gpt_shapes_names_and_param_count():
    model = nnx.eval_shape(lambda: GPT(CFG, rngs=nnx.Rngs(0)))
    logits = jax.eval_shape(lambda t: GPT(CFG, rngs=nnx.Rngs(0))(t), jnp.zeros((2, 16), "int32"))
    assert logits.shape == (2, 16, 16)
    names = logical_axes(model)
    assert names["blocks"]["q"] == ("layers", "embed", "heads", "kv")
    assert names["embedding"] == ("vocab", "embed")
    n = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert n == CFG.n_params()
    assert nnx.state(model, nnx.Param)["blocks"]["up"].shape == (2, 32, 128)  # stacked


def test_gpt_is_causal():
    a = jnp.arange(16, dtype=jnp.int32)[None] % 16
    b = a.at[0, 10].set(3)
    la, lb = jax.jit(lambda x: GPT(CFG, rngs=nnx.Rngs(0))(x))(jnp.concatenate([a, b]))
    np.testing.assert_array_equal(la[:10], lb[:10])  # the past ignores the future
    assert not np.allclose(la[10:], lb[10:])


def test_remat_policies_give_the_same_gradients():
    batch = {
        "inputs": jnp.arange(32, dtype=jnp.int32).reshape(2, 16) % 16,
        "targets": (jnp.arange(32, dtype=jnp.int32).reshape(2, 16) + 1) % 16,
        "mask": jnp.ones((2, 16)),
    }

    def grads(cfg):
        def fn():
            graphdef, params = nnx.split(GPT(cfg, rngs=nnx.Rngs(0)))
            return jax.grad(lambda p: lm_loss(nnx.merge(graphdef, p), batch)[0])(params)

        return jax.jit(fn)()

    base = grads(CFG)
    for remat in ("block", "dots"):
        other = grads(GPTConfig(**{**CFG.__dict__, "remat": remat}))
        for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(other)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)  # recompute: same math


def test_config_errors():
    with pytest.raises(ValueError, match="n_heads=3 does not divide d_model=32"):
        GPTConfig(d_model=32, n_heads=3)
    with pytest.raises(ValueError, match="remat='full' is not one of"):
        GPTConfig(remat="full")
    with pytest.raises(ValueError, match="vocab=0 must be positive"):
        GPTConfig(vocab=0)
    with pytest.raises(ValueError, match=r"MLP sizes=\(5,\) needs at least two"):
        MLP((5,), rngs=nnx.Rngs(0))
    small = GPTConfig(vocab=16, d_model=32, n_layers=1, n_heads=4, seq_len=8)
    with pytest.raises(ValueError, match="length 9 > seq_len=8"):
        jax.eval_shape(lambda t: GPT(small, rngs=nnx.Rngs(0))(t), jnp.zeros((1, 9), "int32"))


def test_token_accuracy_counts_only_a_unique_most_likely_target():
    targets = jnp.array([[0, 1, 2]])
    batch = {"targets": targets, "mask": jnp.ones((1, 3))}
    uniform = jnp.zeros((1, 3, 4))  # ln 4 loss: no prediction at all
    assert float(masked_nll(uniform, batch)[1]["accuracy"]) == 0.0
    logits = jnp.array([[[5.0, 0, 0, 0], [0, 1, 1, 0], [0, 0, 2, 3]]])  # right, tie, wrong
    assert np.isclose(float(masked_nll(logits, batch)[1]["accuracy"]), 1 / 3)
    distinct = logits.at[0, 1, 2].set(0.5)  # without ties it is argmax's accuracy: 2 of 3
    want = (np.argmax(np.asarray(distinct), -1) == np.asarray(targets)).mean()
    assert np.isclose(float(masked_nll(distinct, batch)[1]["accuracy"]), want) and want > 0.5
