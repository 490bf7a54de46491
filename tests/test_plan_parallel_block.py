"""`Transformer(parallel_block=True)` (GPT-J, PaLM, MaxText's 2023 decoder) against JAX itself.

In a parallel block attention and MLP read one norm of the block input, and their outputs are
added to it. No gradient needs the attention's output projection then, so JAX neither saves it
under a dots policy nor reruns it under full remat: the planner's stash and recompute must say
the same as `jax.ad_checkpoint.print_saved_residuals` and the matmul FLOPs of the gradient's
jaxpr.
"""

import contextlib
import io
import math
import re

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import print_saved_residuals

from shardkit.plan import Transformer, evaluate
from shardkit.plan import memory as mem

S, D, F, HEADS = 64, 256, 1024, 4


def _norm(x):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)


def _attention(p, h):
    q, k, v = (jnp.reshape(h @ p[n], (S, HEADS, D // HEADS)) for n in "qkv")
    scores = jnp.einsum("shd,thd->hst", q, k) / jnp.sqrt(D // HEADS)
    mask = jnp.tril(jnp.ones((S, S), bool))
    probs = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    return jnp.einsum("hst,thd->shd", probs, v).reshape(S, D) @ p["o"]


def _mlp(p, h):
    return jax.nn.relu(h @ p["up"]) @ p["down"]


def parallel_block(p, x):
    h = _norm(x)
    return x + _attention(p, h) + _mlp(p, h)


def sequential_block(p, x):
    x = x + _attention(p, _norm(x))
    return x + _mlp(p, _norm(x))


def _dot_flops(jaxpr) -> float:
    """2 x output elements x contracted size over every dot_general, sub-jaxprs included."""
    total = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            k = math.prod(lhs[d] for d in contract)
            total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * k
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr
                if hasattr(sub, "eqns"):
                    total += _dot_flops(sub)
    return total


def _params():
    shapes = dict(q=(D, D), k=(D, D), v=(D, D), o=(D, D), up=(D, F), down=(F, D))
    keys = jax.random.split(jax.random.key(0), len(shapes))
    return {n: jax.random.normal(k, s) / D**0.5 for k, (n, s) in zip(keys, shapes.items())}


def _workload(parallel: bool, attention: str = "flash") -> Transformer:
    return Transformer(layers=1, d_model=D, heads=HEADS, d_ff=F, vocab=64, seq=S, batch=1,
                       parallel_block=parallel, attention=attention, precision="fp32",
                       optimizer="none")  # fmt: skip


def _saved_shapes(block, policy) -> list[tuple[int, ...]]:
    """Shapes of the residuals JAX keeps for `block` under `policy`, arguments aside."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # JAX's only public view of the residuals
        print_saved_residuals(jax.checkpoint(block, policy=policy), _params(), jnp.ones((S, D)))
    return sorted(tuple(map(int, m.group(1).split(",")))
                  for line in out.getvalue().splitlines() if "argument" not in line
                  for m in [re.match(r"f32\[([\d,]+)\]", line)] if m)  # fmt: skip


# the dot outputs JAX keeps (f32) in a parallel block, besides the block input: q, k, v and
# the MLP-up; the scores and the attention output (matmuls with a batch dim: heads) under
# "dots" only; neither the output projection's nor the MLP-down's (both only feed the residual
# sum). (A sequential block also keeps the projection's: the second norm's input is rebuilt
# from it.)
QKV_UP = [(S, D)] * 3 + [(S, F)]
CASES = {
    "dots_no_batch": QKV_UP,
    "dots": QKV_UP + [(HEADS, S, S), (HEADS, S, D // HEADS)],
}
POLICIES = {"dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
            "dots": jax.checkpoint_policies.dots_saveable}  # fmt: skip


@pytest.mark.parametrize("remat", list(CASES))
def test_the_dots_stash_of_a_parallel_block_is_what_jax_saves(remat):
    kept = _saved_shapes(parallel_block, POLICIES[remat])
    assert kept == sorted(CASES[remat])
    got = 4 * (sum(math.prod(a) for a in kept) + S * D)  # + the block input
    w = _workload(True, attention="naive")  # the scores are a dot here, not a kernel
    assert mem.layer_activation_bytes(w, micro_batch=1, remat=remat) == got
    # a sequential block keeps more: the projection's output (and the planner counts the
    # MLP-down's too, see docs/plan.md)
    assert mem.layer_activation_bytes(_workload(False, "naive"), micro_batch=1, remat=remat) > got


@pytest.mark.parametrize("parallel", [True, False])
def test_full_remat_reruns_only_the_matmuls_a_gradient_needs(parallel):
    """JAX drops the reruns no gradient needs (partial evaluation removes them before XLA
    sees the program): the MLP-down, and in a parallel block the output projection too. The
    matmul FLOPs of the remat gradient over the plain one equal the planner's extra FLOPs
    for "block" remat."""
    block = parallel_block if parallel else sequential_block
    p, x = _params(), jnp.ones((S, D))

    def flops(f):
        loss = lambda p, x: jnp.sum(jnp.sin(f(p, x)))  # noqa: E731
        return _dot_flops(jax.make_jaxpr(jax.grad(loss))(p, x).jaxpr)

    measured = flops(jax.checkpoint(block)) - flops(block)
    w = _workload(parallel)
    planned = evaluate(w, "cpu", remat="block").flops - evaluate(w, "cpu", remat="none").flops
    assert measured == pytest.approx(planned)
    # the parallel block reruns one h x h matmul less per token
    if parallel:
        other = _workload(False)
        more = evaluate(other, "cpu", remat="block").flops - evaluate(other, "cpu").flops
        assert more - planned == pytest.approx(2 * S * D * D)
