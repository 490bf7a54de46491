"""The silent all-gather under `jnp.fft.fftn`, `jnp.linalg.solve` and `lax.linalg.lu` (seed 004).

The seed notebook finds that XLA does not partition FFTs or LU factorisations by grepping
`compile().as_text()` for "all-gather". `shardkit.inspect` says more: which collective, over
which mesh axes, how many bytes per device, and the line of this file that caused it; and it
warns that a whole sharded operand is materialised on every device.

Today's JAX: on an Explicit mesh (the default) `jnp.linalg.solve` on an array sharded on a
non-batch dimension raises `ShardingTypeError` ("Input 0 to lu must be unsharded on non-batch
dimensions") instead of gathering silently; the seed's behaviour is that of an Auto mesh,
which this script uses for the solver. The FFT gathers on both kinds of mesh.

Run: `python examples/inspect_fft_solve.py` (expected output at the end).
"""

import shardkit as sk

sk.simulate_cpu_devices(8)  # before any JAX computation: the script runs on any machine

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402


def fft3d(a):
    return jnp.fft.fftn(a)  # the all-gather is attributed to this line


def solve(a, b):
    return jnp.linalg.solve(a, b)  # and here


def lu(a):
    return jax.lax.linalg.lu(a)  # and here


def main() -> dict:
    """Audits the three programs; returns their reports."""
    mesh = sk.make_mesh({"x": 4, "y": 2}, axis_types="explicit")
    a = jax.random.normal(jax.random.key(0), (16, 16, 16))
    a_sharded = jax.device_put(a, NamedSharding(mesh, P("x", "y")))
    np.testing.assert_allclose(jax.jit(fft3d)(a_sharded), jnp.fft.fftn(a), rtol=1e-4, atol=1e-4)
    fft_report = sk.inspect(fft3d, a_sharded)

    mesh_rows = sk.make_mesh({"x": 8, "y": 1}, axis_types=AxisType.Auto)
    m = jax.random.normal(jax.random.key(1), (16, 16)) + 16 * jnp.eye(16)
    b = jax.random.normal(jax.random.key(2), (16,))
    m_sharded = jax.device_put(m, NamedSharding(mesh_rows, P("x", None)))
    x = jax.jit(solve)(m_sharded, b)
    np.testing.assert_allclose(m @ x, b, rtol=1e-4, atol=1e-4)
    solve_report = sk.inspect(solve, m_sharded, b)
    lu_report = sk.inspect(lu, m_sharded)

    for title, report in (
        ("jnp.fft.fftn on x[A_x, B_y, C]", fft_report),
        ("jnp.linalg.solve on A[A_x, B]", solve_report),
        ("lax.linalg.lu on A[A_x, B]", lu_report),
    ):
        print(f"== {title}")
        for c in report.of_kind("all-gather"):
            what, _, where = c.describe().partition(" at ")
            print(f"  {what}\n    at {where.replace(__file__, 'inspect_fft_solve.py')}")
        codes = sorted({w.code for w in report.warnings})
        print(f"  warnings: {', '.join(codes)}")
    return {"fft": fft_report, "solve": solve_report, "lu": lu_report}


if __name__ == "__main__":
    main()

# Expected output:
# == jnp.fft.fftn on x[A_x, B_y, C]
#   all-gather c64[4,8,16] -> c64[4,16,16] over y (n=2): 4.0 KiB per device x 1
#     at inspect_fft_solve.py:28 (fft3d)
#   all-gather c64[4,16,16] -> c64[16,16,16] over x (n=4): 24.0 KiB per device x 1
#     at inspect_fft_solve.py:28 (fft3d)
#   warnings: implicit-gather
# == jnp.linalg.solve on A[A_x, B]
#   all-gather f32[2,16] -> f32[16,16] over x (n=8): 896 B per device x 1
#     at inspect_fft_solve.py:32 (solve)
#   warnings: implicit-gather
# == lax.linalg.lu on A[A_x, B]
#   all-gather f32[2,16] -> f32[16,16] over x (n=8): 896 B per device x 1
#     at inspect_fft_solve.py:36 (lu)
#   warnings: implicit-gather, replicated-output
