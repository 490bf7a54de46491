"""Resharding rows to columns: which collective, how many bytes (seed 000).

The seed's "dynamic sharding and resharding" demo moves an array from row-sharded
(`P('x')`) to column-sharded (`P(None, 'x')`) with a pjit identity function, and runs a
column reduction on row-sharded data, saying only that JAX "will trigger automatic
resharding". `shardkit.inspect` names the collective XLA chose and its bytes per device.

Today's JAX: `pjit` and `in_axis_resources` are gone; `jax.jit(..., out_shardings=...)` on an
Explicit mesh (the default) or `jax.sharding.reshard` do the same.

Per device, x[A_x, B] holds 8 x 64 f32 = 2 KiB. Going to x[A, B_x] every device keeps 1/8 of
its block and sends the other 7/8 to the 7 other devices: one all-to-all of
(n-1)/n x 2 KiB = 1.75 KiB per device.

Run: `python examples/inspect_reshard.py` (expected output at the end).
"""

import shardkit as sk

sk.simulate_cpu_devices(8)  # before any JAX computation: the script runs on any machine

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402


def main() -> dict:
    """Audits the identity reshard and the column sum on row-sharded data."""
    mesh = sk.make_mesh({"x": 8})
    n = mesh.shape["x"]
    rows = NamedSharding(mesh, P("x"))
    cols = NamedSharding(mesh, P(None, "x"))
    x = jax.device_put(
        jax.random.normal(jax.random.key(50), (n * 8, 64)), rows
    )  # x[A_x, B], (64, 64) f32

    to_columns = jax.jit(lambda a: a, out_shardings=cols)
    y = to_columns(x)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    assert y.sharding.spec == P(None, "x")
    reshard = sk.inspect(to_columns, x)

    def column_sums(a):
        return jnp.sum(jax.sharding.reshard(a, cols), axis=0)  # the seed's pjit_col_op

    np.testing.assert_allclose(jax.jit(column_sums)(x), np.asarray(x).sum(0), rtol=1e-5)
    col_op = sk.inspect(column_sums, x)

    for title, report in (("rows -> columns", reshard), ("column sums of rows", col_op)):
        print(f"== {title}: {len(report.collectives)} collective(s)")
        for c in report.collectives:
            print(f"  {c.describe().partition(' at ')[0]}")
            print(f"    {c.formula} = {c.bytes_moved:.0f} bytes")
        print(f"  output layout: {', '.join(e.compiled for e in report.layout.outputs)}")
    return {"reshard": reshard, "column_sums": col_op}


if __name__ == "__main__":
    main()

# Expected output:
# == rows -> columns: 1 collective(s)
#   all-to-all 8 x f32[8,1,8] over x (n=8): 1.8 KiB per device x 1
#     (n-1)/n x operand bytes = 1792 bytes
#   output layout: out[A, B_x]
# == column sums of rows: 1 collective(s)
#   all-to-all 8 x f32[8,1,8] over x (n=8): 1.8 KiB per device x 1
#     (n-1)/n x operand bytes = 1792 bytes
#   output layout: out[A_x]
