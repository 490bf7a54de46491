"""`shardkit.overlap`: the collective matmuls against `jnp.einsum` on one device, and their
errors. float32 sums in another order (values up to ~100): 1e-4 relative and absolute."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from shardkit.overlap import all_gather_matmul, matmul_reduce_scatter
from shardkit.placement import sequence_parallel

KEYS = jax.random.split(jax.random.key(0), 3)
X = jax.random.normal(KEYS[0], (4, 16, 8))  # (batch, sequence, model)
W_IN = jax.random.normal(KEYS[1], (8, 6, 4))  # (model, heads, head dim): heads split
W_OUT = jax.random.normal(KEYS[2], (6, 4, 8))


def block(x, w_in, w_out):
    h = jax.nn.gelu(all_gather_matmul("btd,dhk->bthk", x, w_in, split=1))
    return matmul_reduce_scatter("bthk,hkd->btd", h, w_out, split=0)


def reference(x, w_in, w_out):
    return jnp.einsum("bthk,hkd->btd", jax.nn.gelu(jnp.einsum("btd,dhk->bthk", x, w_in)), w_out)


@pytest.mark.parametrize("ring", [True, False])  # False: plain sequence parallelism
@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
@pytest.mark.parametrize("tensor", [2, 4])  # heads = 6: 4 does not divide them: plain einsum
def test_rings_equal_the_einsum_and_its_gradients(tensor, axis_types, ring):
    kind = getattr(jax.sharding.AxisType, axis_types.capitalize())
    mesh = jax.make_mesh((8 // tensor, tensor), ("data", "tensor"), axis_types=(kind, kind))
    loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a)))
    want = jax.value_and_grad(loss(reference), argnums=(0, 1, 2))(X, W_IN, W_OUT)

    def run(x, w_in, w_out):
        with sequence_parallel(mesh, "tensor", ("data",), collective_matmul=ring):
            return jax.value_and_grad(loss(block), argnums=(0, 1, 2))(x, w_in, w_out)

    with jax.sharding.use_mesh(mesh) if hasattr(jax.sharding, "use_mesh") else jax.set_mesh(mesh):
        put = lambda a, s: jax.device_put(a, jax.sharding.NamedSharding(mesh, s))
        heads = "tensor" if 6 % tensor == 0 else None  # the weights split where they can be
        args = put(X, P("data", "tensor")), put(W_IN, P(None, heads)), put(W_OUT, P(heads))
        step = jax.jit(run)
        got = step(*args)
        text = step.lower(*args).compile().as_text()
    assert ("collective-permute" in text) == (ring and 6 % tensor == 0)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_outside_sequence_parallelism_they_are_einsums():
    np.testing.assert_allclose(block(X, W_IN, W_OUT), reference(X, W_IN, W_OUT), rtol=1e-6)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: all_gather_matmul("btd,dhk", X, W_IN, split=1), "explicit two-operand"),
        (lambda: all_gather_matmul("bd,dhk->bhk", X, W_IN, split=1), "does not match"),
        (lambda: all_gather_matmul("btd,dhk->bthk", X, W_IN, split=3), "split=3"),
        (lambda: all_gather_matmul("btd,dhk->bhk", X, W_IN, split=1), "sequence 't'"),
        (lambda: all_gather_matmul("btd,dhk->bthk", X, W_IN, split=0), "contracted"),
        (lambda: matmul_reduce_scatter("btd,dhk->bthk", X, W_IN, split=1), "must be contracted"),
    ],
)
def test_bad_calls_name_the_problem_and_the_fix(call, match):
    with pytest.raises(ValueError, match=match) as err:
        call()
    assert "fix:" in str(err.value)
