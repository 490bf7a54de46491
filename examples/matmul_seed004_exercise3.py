"""Seed 004, exercise 3: sharded matrix products by the compiler and by hand, then A·B·C·D.

The exercise notebook multiplies 16x16 matrices on a 4x2 mesh ("x", "y"):

  3.   the compiler's layouts for A row x B column, A row x B replicated, A replicated x B column;
  3.1  the same three written by hand with ``shard_map`` (no communication needed);
  3.2  A block-sharded x B row-sharded, which needs a collective (a ``psum`` over "y");
  3.3  A·B·C·D "with the least amount of collectives".

Each hand-written product is checked the way the notebook does: equal values and an equal
output sharding to the ``jit`` version (compared with ``is_equivalent_to``: JAX writes the same
layout as ``P('x',)`` or ``P('x', None)`` depending on the path, and those compare unequal).
Then ``shardkit.matmul`` runs the same layouts and ``shardkit.matmul.chain`` plans exercise
3.3, printing its predicted collectives next to those of the compiled program and of the
compiler's own left-to-right product.

The notebook's mesh has Auto axes semantics (``with_sharding_constraint``), so the mesh here is
built with ``axis_types=Auto``; shardkit.matmul works the same on Explicit axes.

Run: ``python examples/matmul_seed004_exercise3.py`` (expected output at the end).
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardkit as sk  # noqa: E402
from shardkit.inspection import inspect  # noqa: E402
from shardkit.matmul.chain import gspmd_chain  # noqa: E402


def same(x, y) -> bool:
    """Same layout: JAX writes one layout as P('x',) or P('x', None), which compare unequal."""
    return x.sharding.is_equivalent_to(y.sharding, x.ndim)


def counts(compiled) -> str:
    c = {k: v for k, v in inspect(compiled).counts().items() if v}
    return ", ".join(f"{v} {k}" for k, v in c.items()) or "no collectives"


def main() -> None:
    mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    A = jax.random.normal(jax.random.key(0), (16, 16))
    B = jax.random.normal(jax.random.key(1), (16, 16))
    row = NamedSharding(mesh, P("x", None))
    col = NamedSharding(mesh, P(None, "y"))
    rep = NamedSharding(mesh, P())
    A_row, B_col = jax.device_put(A, row), jax.device_put(B, col)
    A_rep, B_rep = jax.device_put(A, rep), jax.device_put(B, rep)
    matmul = jax.jit(jnp.matmul)

    # 3 / 3.1: three layouts that need no communication, by the compiler and by hand.
    def local(a, b):  # each device multiplies its own blocks
        return a @ b

    cases = {
        "A row x B column": (A_row, B_col, P("x", "y")),
        "A row x B replicated": (A_row, B_rep, P("x", None)),
        "A replicated x B column": (A_rep, B_col, P(None, "y")),
    }
    print("exercise 3 / 3.1: compiler vs shard_map vs shardkit.matmul")
    for name, (a, b, out) in cases.items():
        by_jit = matmul(a, b)
        hand = jax.shard_map(
            local, mesh=mesh, in_specs=(a.sharding.spec, b.sharding.spec), out_specs=out
        )
        by_hand = jax.jit(hand)(a, b)
        by_sk = sk.matmul(a, b, algorithm="allgather")
        assert jnp.allclose(by_hand, by_jit, rtol=1e-5, atol=1e-5)
        assert same(by_jit, by_hand), (by_jit.sharding, by_hand.sharding)
        assert same(by_sk, by_jit) and jnp.allclose(by_sk, by_jit, atol=1e-5)
        hand_coll = counts(jax.jit(hand).lower(a, b).compile())
        print(f"  {name:<24} C {by_jit.sharding.spec}: same values, layout; {hand_coll}")

    # 3.2: A block-sharded x B row-sharded: K is split over "y" on both sides, so each device
    # holds a partial sum C{U_y}; a psum over "y" completes it (scaling-book case 3).
    A_blk = jax.device_put(A, NamedSharding(mesh, P("x", "y")))
    B_r = jax.device_put(B, NamedSharding(mesh, P("y", None)))

    def block_row(a, b):  # a (4, 8), b (8, 16)
        return lax.psum(a @ b, "y")  # (4, 16), summed over the two "y" devices

    hand = jax.jit(
        jax.shard_map(
            block_row, mesh=mesh, in_specs=(P("x", "y"), P("y", None)), out_specs=P("x", None)
        )
    )
    by_jit = matmul(A_blk, B_r)
    by_hand = hand(A_blk, B_r)
    assert jnp.allclose(by_hand, by_jit, rtol=1e-5, atol=1e-5)
    assert same(by_jit, by_hand), (by_jit.sharding, by_hand.sharding)
    print("exercise 3.2: A block x B row")
    print(f"  compiler   C {by_jit.sharding.spec}: {counts(matmul.lower(A_blk, B_r).compile())}")
    print(f"  shard_map  C {by_hand.sharding.spec}: {counts(hand.lower(A_blk, B_r).compile())}")
    by_sk = sk.matmul(A_blk, B_r, algorithm="reduce_scatter", out_spec=P("x", None))
    assert jnp.allclose(by_sk, by_jit, atol=1e-5) and same(by_sk, by_jit)
    chosen = sk.matmul.explain(A_blk, B_r).chosen
    print(f"  shardkit auto: {chosen.algorithm}, C {P(*chosen.out_spec)}:")
    print(f"    {chosen.detail}")

    # 3.3: A·B·C·D with the fewest collectives.
    keys = jax.random.split(jax.random.key(2), 2)
    C = jax.random.normal(keys[0], (16, 16))
    D = jax.random.normal(keys[1], (16, 16))
    ref = A @ B @ C @ D
    print("exercise 3.3: A·B·C·D")
    # (a) The answer to the exercise: shard only A's rows; every product then stays local.
    xs = [jax.device_put(A, row)] + [jax.device_put(m, rep) for m in (B, C, D)]
    plan = sk.matmul.chain(xs)
    E = plan(*xs)
    assert jnp.allclose(E, ref, rtol=1e-4, atol=1e-4)
    print(
        f"  A row-sharded, B C D replicated -> {plan.comm_bytes} bytes, "
        f"{counts(plan.function.lower(*xs).compile())}"
    )
    # (b) All four row-sharded (memory-lean): the planner picks the order and layouts.
    xs = [jax.device_put(m, row) for m in (A, B, C, D)]
    plan = sk.matmul.chain(xs)
    E = plan(*xs)
    assert jnp.allclose(E, ref, rtol=1e-4, atol=1e-4)
    print("  all four row-sharded:")
    print(str(plan))
    print(
        f"  compiled plan: {counts(plan.function.lower(*xs).compile())}, "
        f"{int(inspect(plan.function.lower(*xs).compile()).total_bytes):,} bytes"
    )
    g = inspect(gspmd_chain(xs, out_spec=plan.out_spec))
    print(
        f"  compiler's left-to-right product: "
        f"{', '.join(f'{v} {k}' for k, v in g.counts().items() if v)}, "
        f"{int(g.total_bytes):,} bytes"
    )
    # Bonus (iterative algorithms): keep every operand in the layout the next product wants,
    # as case (a) does, and an iteration needs no collective at all.
    np.testing.assert_allclose(np.asarray(E), np.asarray(ref), rtol=1e-4, atol=1e-4)


if __name__ == "__main__":
    main()


# Expected output:
#   exercise 3 / 3.1: compiler vs shard_map vs shardkit.matmul
#     A row x B column         C P('x', 'y'): same values, layout; no collectives
#     A row x B replicated     C P('x', None): same values, layout; no collectives
#     A replicated x B column  C P(None, 'y'): same values, layout; no collectives
#   exercise 3.2: A block x B row
#     compiler   C P('x',): 1 all-reduce
#     shard_map  C P('x',): 1 all-reduce
#     shardkit auto: collective, C P('x', 'y'):
#       matmul-reduce-scatter: partial C column blocks travel; 1-step unidirectional ring over 'y'
#   exercise 3.3: A·B·C·D
#     A row-sharded, B C D replicated -> 0 bytes, no collectives
#     all four row-sharded:
#   chain plan (A·(B·(C·D))) on mesh {'x': 4, 'y': 2}:
#     1,536 bytes moved per device, 4,096 FLOPs per device
#     C P('x', None) @ D P('x', None) -> P('x', 'y'): allgather, 1 all-gather, 768 bytes
#     B P('x', None) @ (C·D) P('x', 'y') -> P('x', 'y'): allgather, 1 all-gather, 384 bytes
#     A P('x', None) @ (B·(C·D)) P('x', 'y') -> P('x', 'y'): allgather, 1 all-gather, 384 bytes
#     compiled plan: 3 all-gather, 1,536 bytes
#     compiler's left-to-right product: 3 all-gather, 2,304 bytes
