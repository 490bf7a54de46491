"""The four communication patterns of seed 002, each made by a tiny program and audited.

Seed 002 draws all-reduce (data parallelism: sum local gradients), all-gather (model
parallelism: rebuild sharded data everywhere) and reduce-scatter (efficient data parallelism:
each device keeps its slice of the sum); all-to-all is the fourth pattern (resharding, expert
parallelism). Here each is one line of `jax.shard_map` on 8 devices, and `shardkit.inspect`
reports it with its bytes per device next to the ring formula, checked against the analytic
value, and the number each device ends up with checked against NumPy.

The values are the seed's: devices hold 1, 2, ..., 8 (as float32 vectors of 1024 elements).

Run: `python examples/inspect_patterns.py` (expected output at the end).
"""

import shardkit as sk

sk.simulate_cpu_devices(8)  # before any JAX computation: the script runs on any machine

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

L = 1024  # elements per device
F32 = 4


def all_reduce(g):  # g: this device's gradient, (1, L)
    return jax.lax.psum(g, "data")


def all_gather(w):  # w: this device's slice of a weight, (1, L)
    return jax.lax.all_gather(w, "data", tiled=True)


def reduce_scatter(g):  # g: this device's full gradient, (8, L); keep one summed row
    return jax.lax.psum_scatter(g, "data", scatter_dimension=0, tiled=True)


def all_to_all(x):  # x: (8, L) rows bound for each device; receive one row from each
    return jax.lax.all_to_all(x, "data", 0, 0, tiled=True)


def main() -> dict:
    """Audits the four patterns; returns {pattern: (report, analytic bytes per device)}."""
    mesh = sk.make_mesh({"data": 8})
    n = mesh.shape["data"]
    per_device = np.repeat(np.arange(1, n + 1, dtype=np.float32), L).reshape(n, L)  # 1..8
    stacked = np.repeat(per_device[:, None, :], n, axis=1).reshape(n * n, L)  # (8 x 8, L)
    cases = {
        # name: (local fn, in spec, out spec, input, expected global output, analytic bytes)
        "all-reduce": (all_reduce, P("data"), P(), per_device, per_device.sum(0, keepdims=True)),
        "all-gather": (all_gather, P("data"), P(), per_device, per_device),
        "reduce-scatter": (
            reduce_scatter,
            P("data"),
            P("data"),
            stacked,
            per_device.sum(0) * np.ones((n, 1), np.float32),
        ),
        "all-to-all": (
            all_to_all,
            P("data"),
            P("data"),
            stacked,
            stacked.reshape(n, n, L).transpose(1, 0, 2).reshape(n * n, L),
        ),
    }
    analytic = {
        "all-reduce": 2 * (n - 1) / n * L * F32,  # 2(n-1)/n x local gradient
        "all-gather": (n - 1) / n * n * L * F32,  # (n-1)/n x gathered weight
        "reduce-scatter": (n - 1) / n * n * L * F32,  # (n-1)/n x local full gradient
        "all-to-all": (n - 1) / n * n * L * F32,  # (n-1)/n x local block
    }
    out = {}
    for name, (local, pin, pout, x, want) in cases.items():
        f = jax.shard_map(local, mesh=mesh, in_specs=pin, out_specs=pout, check_vma=False)
        xs = jax.device_put(x, NamedSharding(mesh, pin))
        np.testing.assert_allclose(np.asarray(jax.jit(f)(xs)), want)
        report = sk.inspect(f, xs)
        (c,) = report.collectives
        assert c.kind == name and c.bytes_moved == analytic[name], (name, c)
        print(f"{name:15s} {c.describe().partition(' at ')[0]}")
        print(f"{'':15s} {c.formula} = {c.bytes_moved:.0f} B (analytic {analytic[name]:.0f} B)")
        out[name] = (report, analytic[name])
    return out


if __name__ == "__main__":
    main()

# Expected output:
# all-reduce      all-reduce f32[1,1024] over data (n=8): 7.0 KiB per device x 1
#                 2(n-1)/n x operand bytes = 7168 B (analytic 7168 B)
# all-gather      all-gather f32[1,1024] -> f32[8,1024] over data (n=8): 28.0 KiB per device x 1
#                 (n-1)/n x gathered result bytes = 28672 B (analytic 28672 B)
# reduce-scatter  reduce-scatter f32[8,1024] -> f32[1,1024] over data (n=8): 28.0 KiB per device x 1
#                 (n-1)/n x operand bytes = 28672 B (analytic 28672 B)
# all-to-all      all-to-all 8 x f32[1,1024] over data (n=8): 28.0 KiB per device x 1
#                 (n-1)/n x operand bytes = 28672 B (analytic 28672 B)
