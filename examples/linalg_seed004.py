"""Seed 004's linear solvers redone with shardkit.linalg: batched systems and a distributed solve.

Exercise 2 of the seed solves 8 independent 16 x 16 systems, one per device: `batched_solve`
does it with zero collectives. The seed's "distributed linear solver" section then finds that
`jnp.linalg.solve` and `lax.linalg.lu` on a row-sharded matrix all-gather the whole matrix
(and, on today's default Explicit axes, refuse to run), and asks how LU could be distributed:
`shardkit.linalg.solve` is that answer, a blocked LU with partial pivoting on a
column-block-cyclic layout that never gathers the matrix.

    python examples/linalg_seed004.py

Expected output:
    exercise 2: 8 systems (8, 16, 16) sharded P('x', None, None), shards (1, 16, 16)
    batched_solve: collectives 0, output shards (1, 16), A @ x == b (1e-4): True
    distributed solve, A: float32[16, 16] sharded P('x', None) on mesh (8,) ('x',)
    jnp.linalg.solve, Auto axes:     all-gather 1 (the whole matrix), A @ x == b: True
    jnp.linalg.solve, Explicit axes: ShardingTypeError
    shardkit solve, Explicit axes:   all-gather 0, all-to-all 1, A @ x == b: True
    equal to jnp.linalg.solve (1e-5): True
    factors: A[perm] == L @ U: True, max |L| <= 1 (partial pivoting): True
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardkit.linalg as sl  # noqa: E402
from shardkit.inspection.hlo import collective_counts  # noqa: E402


def counts(fn, *args):
    return collective_counts(jax.jit(fn).lower(*args).compile().as_text())


def main():
    # Exercise 2: 8 systems, one per device.
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
    a_stack = jnp.stack([jax.random.normal(jax.random.key(i), (16, 16)) for i in range(8)])
    b_stack = jnp.stack([jax.random.normal(jax.random.key(i + 8), (16,)) for i in range(8)])
    a_stack = jax.device_put(a_stack, NamedSharding(mesh, P("x", None, None)))
    b_stack = jax.device_put(b_stack, NamedSharding(mesh, P("x", None)))
    print(
        f"exercise 2: 8 systems {a_stack.shape} sharded P('x', None, None), "
        f"shards {a_stack.addressable_shards[0].data.shape}"
    )
    xs = sl.batched_solve(a_stack, b_stack)
    c = counts(lambda a, b: sl.batched_solve(a, b, mesh=mesh), a_stack, b_stack)
    ok = np.allclose(np.einsum("bij,bj->bi", a_stack, xs), b_stack, rtol=1e-4, atol=1e-4)
    print(
        f"batched_solve: collectives {sum(c.values())}, output shards "
        f"{xs.addressable_shards[0].data.shape}, A @ x == b (1e-4): {ok}"
    )

    # The distributed linear solver section: one 16 x 16 system, rows sharded over 8 devices.
    a = jax.random.normal(jax.random.key(0), (16, 16))
    b = jax.random.normal(jax.random.key(1), (16,))
    print("distributed solve, A: float32[16, 16] sharded P('x', None) on mesh (8,) ('x',)")
    auto = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    a_auto = jax.device_put(a, NamedSharding(auto, P("x", None)))
    x_jnp = jnp.linalg.solve(a_auto, b)
    ag = counts(jnp.linalg.solve, a_auto, b)["all-gather"]
    ok = np.allclose(a @ x_jnp, b, atol=1e-5, rtol=1e-5)
    print(f"jnp.linalg.solve, Auto axes:     all-gather {ag} (the whole matrix), A @ x == b: {ok}")
    a_exp = jax.device_put(a, NamedSharding(mesh, P("x", None)))
    try:
        jnp.linalg.solve(a_exp, b)
        print("jnp.linalg.solve, Explicit axes: ran")
    except Exception as e:  # noqa: BLE001  (the point is which error)
        print(f"jnp.linalg.solve, Explicit axes: {type(e).__name__}")
    x = sl.solve(a_exp, b, block_size=2)  # 8 blocks of 2 columns: one per device
    c = counts(lambda a, b: sl.solve(a, b, block_size=2, mesh=mesh), a_exp, b)
    ok = np.allclose(a @ x, b, atol=1e-5, rtol=1e-5)
    print(
        f"shardkit solve, Explicit axes:   all-gather {c['all-gather']}, all-to-all "
        f"{c['all-to-all']}, A @ x == b: {ok}"
    )
    print(f"equal to jnp.linalg.solve (1e-5): {np.allclose(x, x_jnp, atol=1e-5, rtol=1e-5)}")
    perm, lower, upper = sl.lu(a_exp, block_size=2).unpack()
    rebuilt = np.allclose(np.asarray(a)[np.asarray(perm)], lower @ upper, atol=1e-5)
    print(
        f"factors: A[perm] == L @ U: {rebuilt}, max |L| <= 1 (partial pivoting): "
        f"{bool(jnp.abs(lower).max() <= 1.0 + 1e-6)}"
    )


if __name__ == "__main__":
    main()
