"""Debugging sharding (seed 002, "Debugging sharding"), on today's JAX and shardkit.

The seed lists four checks for a sharded array: its sharding, a picture of the layout, the
devices that hold it, and each shard's device and shape. They are run here on the seed's own
2-D (data + model) example, a layer ``y = x @ w`` on a 4x2 mesh with ``x`` split over "data"
and ``w`` over "model", whose output should be split both ways with no communication. Then the
same checks find a mistake: ``w`` split on the wrong dim.

shardkit adds: ``shardkit.show`` (any rank, plain text), ``shard_table`` (device, process,
index slices, shard shape, bytes), ``tree_table`` (leaf, shape, spec in ``W[D_X, F_Y]``
notation, bytes per device), ``lint`` (checks a layout at full size before any array exists),
``diff_specs`` (intended against actual) and the collectives of the compiled program.

What changed since the seed was written (JAX 0.10): ``mesh_utils.create_device_mesh`` is not
needed (``shardkit.make_mesh({"data": 4, "model": 2})``); mesh axes are **Explicit** by default,
so an array's sharding is part of its type (``jax.typeof(y)`` prints ``float32[128@data,
256@model]``) and is known while tracing. Both Auto and Explicit meshes are shown; here they
agree. The batch is the seed's (128); features and hidden are the seed's divided by 8 (512 and
256) so the script runs in seconds; the lint step checks the seed's full sizes (features 4096,
hidden 2048) without allocating them.

Run: ``python examples/seed002_debugging.py`` (expected output at the end).
"""

import shardkit as sk

sk.simulate_cpu_devices(8)  # before any JAX computation: the script runs on any machine

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from shardkit.inspection.hlo import collective_summary  # noqa: E402
from shardkit.layout import format_rows  # noqa: E402
from shardkit.linter import lint  # noqa: E402


def section(title: str) -> None:
    print(f"\n== {title}")


def collectives(compiled) -> str:
    """The collectives XLA put in a compiled program, e.g. 'all-reduce x1' or 'none'."""
    return collective_summary(compiled.as_text())


batch, features, hidden = 128, 512, 256
rng = np.random.default_rng(0)
x_host = rng.normal(size=(batch, features)).astype(np.float32)
w_host = rng.normal(size=(features, hidden)).astype(np.float32) / np.sqrt(features)
reference = x_host @ w_host


@jax.jit
def forward(x, w):
    y = x @ w
    # Explicit axes make the layout part of the type, so it can be printed while tracing.
    print(f"  while tracing: y is {jax.typeof(y)}")
    return y


# The intended layout, as partition rules over the tree of inputs.
rules = sk.Rules([(r"^x$", P("data", None)), (r"^w$", P(None, "model"))])
mesh = sk.make_mesh({"data": 4, "model": 2})
print(sk.mesh_table(mesh))

section("lint the layout at the seed's full size (no arrays allocated)")
full = {
    "x": jax.ShapeDtypeStruct((128, 4096), jnp.float32),
    "w": jax.ShapeDtypeStruct((4096, 2048), jnp.float32),
}
report = lint(full, rules, mesh)
print(report.summary())
print(format_rows(sk.tree_table(full, rules, mesh)))

for kind in ("auto", "explicit"):
    section(f"{kind} mesh: the four checks on y = x @ w")
    mesh = sk.make_mesh({"data": 4, "model": 2}, axis_types=kind)
    params = sk.shard({"x": x_host, "w": w_host}, rules, mesh)
    print(format_rows(sk.tree_table(params)))
    compiled = forward.lower(params["x"], params["w"]).compile()
    y = compiled(params["x"], params["w"])
    print("matches numpy:", np.allclose(y, reference, rtol=1e-5, atol=1e-5))
    print("collectives:", collectives(compiled))

    # 1. Check sharding.
    print("y.sharding:", y.sharding)
    print("jax.typeof(y):", jax.typeof(y))
    # 2. Visualize sharding.
    sk.show(y, name="y", format="text")
    # 3. Check device placement.
    print("y.devices():", sorted(y.devices(), key=lambda d: d.id))
    # 4. Inspect shards.
    for shard in sorted(y.addressable_shards, key=lambda s: s.device.id)[:2]:
        print(f"Device: {shard.device}, Shape: {shard.data.shape}, Index: {shard.index}")
    print("...")
    print(format_rows(sk.shard_table(y), title="shard table"))

section("debugging a mistake: w split over 'model' on its first dim")
for kind in ("auto", "explicit"):
    mesh = sk.make_mesh({"data": 4, "model": 2}, axis_types=kind)
    intended = rules.specs({"x": x_host, "w": w_host}, mesh)
    wrong = sk.shard(
        {"x": x_host, "w": w_host}, {"x": P("data", None), "w": P("model", None)}, mesh
    )
    print(f"-- [{kind}]")
    for path, want, got in sk.diff_specs(intended, wrong):
        print(f"{path}: intended {want}, actual {got}")
        # The same in scaling-book notation, w's dims named D (features) and F (hidden).
        print(
            f"  {sk.spec_notation(('D', 'F'), want, name=path)} -> "
            f"{sk.spec_notation(('D', 'F'), got, name=path)}"
        )
    compiled = forward.lower(wrong["x"], wrong["w"]).compile()
    y = compiled(wrong["x"], wrong["w"])
    print("matches numpy:", np.allclose(y, reference, rtol=1e-5, atol=1e-5))
    # The contraction is now split: each device adds a partial sum, then an all-reduce over
    # 'model' combines them, and y is replicated over 'model' (twice the bytes per device).
    print("collectives:", collectives(compiled))
    print("y spec:", y.sharding.spec, "| shard shape:", y.addressable_shards[0].data.shape)
    sk.show(y, name="y", format="text")

# The output below keeps long lines whole.
# ruff: noqa: E501
# Expected output:
#
# Mesh(data=4, model=2; explicit; 8 devices cpu:0-7, 1 process)
# data\model   0   1
# 0            0   1
# 1            2   3
# 2            4   5
# 3            6   7
#
# == lint the layout at the seed's full size (no arrays allocated)
# lint: 2 leaves, 34.0 MiB total, 16.5 MiB per device, 0.0% of per-device bytes fully replicated, 74.2% of all device memory holds copies, 0 errors, 0 warnings
# path  shape         dtype    spec          bytes_per_device
# ----  ------------  -------  ------------  ----------------
# w     (4096, 2048)  float32  [A, B_model]  16.0 MiB
# x     (128, 4096)   float32  [A_data, B]   512.0 KiB
#
# == auto mesh: the four checks on y = x @ w
# path  shape       dtype    spec          bytes_per_device
# ----  ----------  -------  ------------  ----------------
# w     (512, 256)  float32  [A, B_model]  256.0 KiB
# x     (128, 512)  float32  [A_data, B]   64.0 KiB
#   while tracing: y is float32[128,256]
# matches numpy: True
# collectives: none
# y.sharding: NamedSharding(mesh=Mesh('data': 4, 'model': 2, axis_types=(Auto, Auto)), spec=P('data', 'model'), memory_kind=device)
# jax.typeof(y): float32[128,256]
# y: f32[128,256]  y[A_data, B_model]  mesh data=4, model=2
#             B 0:128    B 128:256
#          +-----------+-----------+
# A 0:32   |   cpu 0   |   cpu 1   |
#          +-----------+-----------+
# A 32:64  |   cpu 2   |   cpu 3   |
#          +-----------+-----------+
# A 64:96  |   cpu 4   |   cpu 5   |
#          +-----------+-----------+
# A 96:128 |   cpu 6   |   cpu 7   |
#          +-----------+-----------+
# y.devices(): [CpuDevice(id=0), CpuDevice(id=1), CpuDevice(id=2), CpuDevice(id=3), CpuDevice(id=4), CpuDevice(id=5), CpuDevice(id=6), CpuDevice(id=7)]
# Device: cpu:0, Shape: (32, 128), Index: (slice(0, 32, None), slice(0, 128, None))
# Device: cpu:1, Shape: (32, 128), Index: (slice(0, 32, None), slice(128, 256, None))
# ...
# shard table
# device  process  index              shard_shape  bytes
# ------  -------  -----------------  -----------  --------
# cpu 0   0        [0:32, 0:128]      (32, 128)    16.0 KiB
# cpu 1   0        [0:32, 128:256]    (32, 128)    16.0 KiB
# cpu 2   0        [32:64, 0:128]     (32, 128)    16.0 KiB
# cpu 3   0        [32:64, 128:256]   (32, 128)    16.0 KiB
# cpu 4   0        [64:96, 0:128]     (32, 128)    16.0 KiB
# cpu 5   0        [64:96, 128:256]   (32, 128)    16.0 KiB
# cpu 6   0        [96:128, 0:128]    (32, 128)    16.0 KiB
# cpu 7   0        [96:128, 128:256]  (32, 128)    16.0 KiB
#
# == explicit mesh: the four checks on y = x @ w
# path  shape       dtype    spec          bytes_per_device
# ----  ----------  -------  ------------  ----------------
# w     (512, 256)  float32  [A, B_model]  256.0 KiB
# x     (128, 512)  float32  [A_data, B]   64.0 KiB
#   while tracing: y is float32[128@data,256@model]
# matches numpy: True
# collectives: none
# y.sharding: NamedSharding(mesh=Mesh('data': 4, 'model': 2, axis_types=(Explicit, Explicit)), spec=P('data', 'model'), memory_kind=device)
# jax.typeof(y): float32[128@data,256@model]
# y: f32[128,256]  y[A_data, B_model]  mesh data=4, model=2
#             B 0:128    B 128:256
#          +-----------+-----------+
# A 0:32   |   cpu 0   |   cpu 1   |
#          +-----------+-----------+
# A 32:64  |   cpu 2   |   cpu 3   |
#          +-----------+-----------+
# A 64:96  |   cpu 4   |   cpu 5   |
#          +-----------+-----------+
# A 96:128 |   cpu 6   |   cpu 7   |
#          +-----------+-----------+
# y.devices(): [CpuDevice(id=0), CpuDevice(id=1), CpuDevice(id=2), CpuDevice(id=3), CpuDevice(id=4), CpuDevice(id=5), CpuDevice(id=6), CpuDevice(id=7)]
# Device: cpu:0, Shape: (32, 128), Index: (slice(0, 32, None), slice(0, 128, None))
# Device: cpu:1, Shape: (32, 128), Index: (slice(0, 32, None), slice(128, 256, None))
# ...
# shard table
# device  process  index              shard_shape  bytes
# ------  -------  -----------------  -----------  --------
# cpu 0   0        [0:32, 0:128]      (32, 128)    16.0 KiB
# cpu 1   0        [0:32, 128:256]    (32, 128)    16.0 KiB
# cpu 2   0        [32:64, 0:128]     (32, 128)    16.0 KiB
# cpu 3   0        [32:64, 128:256]   (32, 128)    16.0 KiB
# cpu 4   0        [64:96, 0:128]     (32, 128)    16.0 KiB
# cpu 5   0        [64:96, 128:256]   (32, 128)    16.0 KiB
# cpu 6   0        [96:128, 0:128]    (32, 128)    16.0 KiB
# cpu 7   0        [96:128, 128:256]  (32, 128)    16.0 KiB
#
# == debugging a mistake: w split over 'model' on its first dim
# -- [auto]
# w: intended P(None, 'model'), actual P('model', None)
#   w[D, F_model] -> w[D_model, F]
# matches numpy: True
# collectives: all-reduce x1
# y spec: P('data', None) | shard shape: (32, 256)
# y: f32[128,256]  y[A_data, B]  mesh data=4, model=2
#              B 0:256
#          +--------------+
# A 0:32   | cpu 0, cpu 1 |
#          +--------------+
# A 32:64  | cpu 2, cpu 3 |
#          +--------------+
# A 64:96  | cpu 4, cpu 5 |
#          +--------------+
# A 96:128 | cpu 6, cpu 7 |
#          +--------------+
# -- [explicit]
# w: intended P(None, 'model'), actual P('model', None)
#   w[D, F_model] -> w[D_model, F]
#   while tracing: y is float32[128@data,256]
# matches numpy: True
# collectives: all-reduce x1
# y spec: P('data', None) | shard shape: (32, 256)
# y: f32[128,256]  y[A_data, B]  mesh data=4, model=2
#              B 0:256
#          +--------------+
# A 0:32   | cpu 0, cpu 1 |
#          +--------------+
# A 32:64  | cpu 2, cpu 3 |
#          +--------------+
# A 64:96  | cpu 4, cpu 5 |
#          +--------------+
# A 96:128 | cpu 6, cpu 7 |
#          +--------------+
