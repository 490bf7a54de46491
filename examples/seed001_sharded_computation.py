"""Introduction to sharded computation (seed 001), on today's JAX and shardkit.

The seed tutorial walks from one array on one device to a neural-network layer sharded three
ways. Every step is here, in the seed's order, on 8 simulated CPU devices:

  1. devices and data sharding: ``x.devices()``, ``x.sharding``, a layout view;
  2. a NamedSharding on a 2x4 mesh (``mesh_utils.create_device_mesh`` is not needed any more);
  3. automatic parallelism: jit follows the data (element-wise), a partially replicated sum;
  4. ``with_sharding_constraint`` to ask for a fully sharded output;
  5. manual parallelism with ``jax.shard_map`` (local shapes, per-shard sum, ``psum``);
  6. the three ways to shard a layer: sharded inputs, constraints, ``shard_map``.

What changed since the seed was written (JAX 0.10):

  * ``jax.make_mesh`` (and ``shardkit.make_mesh``) now build **Explicit** mesh axes by
    default. The seed's code assumed Auto axes. Where the two differ, both forms are shown:
    ``with_sharding_constraint`` only accepts Auto axes (use ``jax.sharding.reshard`` on
    Explicit ones), a matmul whose contracting dim is sharded on both sides needs
    ``out_sharding=``, and ``shard_map`` on Explicit axes wants inputs already laid out as
    ``in_specs`` says.
  * ``jax.experimental.shard_map.shard_map`` became ``jax.shard_map``.
  * Devices are CPU devices numbered in order; the seed ran on a TPU whose mesh followed the
    torus, so its device numbers were not in order.

Mesh axis names "x" and "y" are kept from the seed so the two texts read side by side.

Run: ``python examples/seed001_sharded_computation.py`` (expected output at the end).
"""

import shardkit as sk

sk.simulate_cpu_devices(8)  # before any JAX computation: the script runs on any machine

from functools import partial  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from shardkit.inspection.hlo import collective_summary  # noqa: E402
from shardkit.linter import lint  # noqa: E402


def section(title: str) -> None:
    print(f"\n== {title}")


def collectives(compiled) -> str:
    """The collectives XLA put in a compiled program, e.g. 'all-reduce x1' or 'none'."""
    return collective_summary(compiled.as_text())


def first_sentence(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err).split('. ')[0].strip().rstrip('.')}."


def rounded(x) -> np.ndarray:
    return np.round(np.asarray(x), 4)


# 1. Devices and data sharding ------------------------------------------------------------
section("1. devices and data sharding")
print("devices:", jax.devices())
arr = jnp.arange(32.0).reshape(4, 8)
print("arr.devices():", arr.devices())
print("arr.sharding:", arr.sharding)
sk.show(arr, name="arr", format="text")  # jax.debug.visualize_array_sharding, any rank

# 2. A NamedSharding on a 2x4 mesh ----------------------------------------------------------
# Seed: devices = mesh_utils.create_device_mesh((2, 4)); mesh = Mesh(devices, P('x', 'y')).
# Today one call builds the mesh; JAX orders the devices for the hardware topology.
section("2. NamedSharding on a 2x4 mesh")
meshes = {
    "auto": sk.make_mesh({"x": 2, "y": 4}, axis_types="auto"),
    "explicit": sk.make_mesh({"x": 2, "y": 4}),  # the default, as jax.make_mesh
}
print(sk.mesh_table(meshes["explicit"]))
sharded = {}
for kind, mesh in meshes.items():
    sharding = NamedSharding(mesh, P("x", "y"))
    sharded[kind] = jax.device_put(arr, sharding)
    print(f"[{kind}] {sharding}")
    # Under Explicit axes the sharding is part of the array's type: float32[4@x,8@y].
    print(f"[{kind}] jax.typeof(arr_sharded) = {jax.typeof(sharded[kind])}")
print(sharded["explicit"])
sk.show(sharded["explicit"], name="arr_sharded", format="text")


# 3. Automatic parallelism: computation follows data ------------------------------------------
@jax.jit
def f_elementwise(x):
    return 2 * jnp.sin(x) + 1


@jax.jit
def f_contract(x):
    return x.sum(axis=0)


section("3. jit follows the data")
for kind, x in sharded.items():
    result = f_elementwise(x)
    print(f"[{kind}] f_elementwise: shardings match: {result.sharding == x.sharding}")
for kind, x in sharded.items():
    result = f_contract(x)
    print(f"[{kind}] f_contract: spec {result.sharding.spec}, value {result}")
# Summing over mesh axis "x" leaves each block of the result on two devices: partially
# replicated (cpu 0 and cpu 4 hold the first two elements, and so on).
sk.show(f_contract(sharded["explicit"]), name="sum0", format="text")

# 4. Semi-automatic: ask for a layout with a constraint ------------------------------------
section("4. with_sharding_constraint: a fully sharded sum")
mesh8_auto = sk.make_mesh({"x": 8}, axis_types="auto")


@jax.jit
def f_contract_2(x):
    out = x.sum(axis=0)
    # Seed: a mesh built inside the function with mesh_utils; any 8-device mesh will do.
    return jax.lax.with_sharding_constraint(out, NamedSharding(mesh8_auto, P("x")))


result = f_contract_2(sharded["auto"])
print(f"[auto] spec {result.sharding.spec}, value {result}")
sk.show(result, name="sum0", format="text")


@jax.jit
def f_contract_2_wsc(x):
    out = x.sum(axis=0)
    return jax.lax.with_sharding_constraint(out, NamedSharding(meshes["explicit"], P(("x", "y"))))


try:
    f_contract_2_wsc(sharded["explicit"])
except ValueError as err:  # a constraint may only name Auto mesh axes
    print(f"[explicit] with_sharding_constraint -> {first_sentence(err)}")


@jax.jit
def f_contract_2_explicit(x):
    out = x.sum(axis=0)  # type float32[8@y]
    # Explicit axes: reshard changes the type; both mesh axes now split the one dim.
    return jax.sharding.reshard(out, P(("x", "y")))


with jax.set_mesh(meshes["explicit"]):  # lets a bare PartitionSpec name the mesh axes
    result = f_contract_2_explicit(sharded["explicit"])
print(f"[explicit] reshard: spec {result.sharding.spec}, value {result}")
sk.show(result, name="sum0", format="text")

# 5. Manual parallelism with shard_map -------------------------------------------------------
section("5. shard_map")
mesh1d = {
    "auto": sk.make_mesh({"x": 8}, axis_types="auto"),
    "explicit": sk.make_mesh({"x": 8}),
}
x = jnp.arange(32)
print(f"global shape: {x.shape=}")


def f_local(x):
    print(f"device local shape: {x.shape=}")  # runs once, at trace time
    return x * 2


def f_sum(x):
    return jnp.sum(x, keepdims=True)


def f_psum(x):
    sum_in_shard = x.sum()
    return jax.lax.psum(sum_in_shard, "x")


for kind, mesh in mesh1d.items():
    # Explicit axes: shard_map checks that the input already has the in_specs layout, so place
    # it first (an unsharded input raises "in_specs ... does not match the specs of the input").
    xin = x if kind == "auto" else jax.device_put(x, NamedSharding(mesh, P("x")))
    y = jax.shard_map(f_elementwise, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(xin)
    print(f"[{kind}] shard_map(f_elementwise): {rounded(y)[:4]}... shape {y.shape}")
    y = jax.shard_map(f_local, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(xin)
    print(f"[{kind}] x * 2 per shard: {np.asarray(y)[:6]}... spec {y.sharding.spec}")
    y = jax.shard_map(f_sum, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(xin)
    print(f"[{kind}] sum per shard: {y}")
    y = jax.shard_map(f_psum, mesh=mesh, in_specs=P("x"), out_specs=P())(xin)
    print(f"[{kind}] psum over 'x': {y} (jnp.sum: {jnp.sum(x)})")

try:
    jax.shard_map(f_sum, mesh=mesh1d["explicit"], in_specs=P("x"), out_specs=P("x"))(x)
except ValueError as err:
    print(f"[explicit] unsharded input -> {first_sentence(err)}")


# 6. Three ways to shard a layer ----------------------------------------------------------------
@jax.jit
def layer(x, weights, bias):
    return jax.nn.sigmoid(x @ weights + bias)


section("6. three ways to shard a layer")
rng = np.random.default_rng(0)
params = {
    "x": rng.normal(size=(32,)).astype(np.float32),
    "weights": rng.normal(size=(32, 4)).astype(np.float32),
    "bias": rng.normal(size=(4,)).astype(np.float32),
}
reference = layer(**params)
print("single device:", rounded(reference))

# The layout as partition rules; lint checks it against the mesh before anything compiles.
rules = sk.Rules([(r"^x$", P("x")), (r"^weights$", P("x", None))], default=P())
print(lint(params, rules, mesh1d["auto"]).summary())


def in_order(tree: dict) -> tuple:
    """The layer's arguments from a dict (device_put returns dicts with sorted keys)."""
    return tree["x"], tree["weights"], tree["bias"]


def report(way: str, jitted, *args) -> None:
    """Prints a way's result, its collectives, and whether it matches one device."""
    compiled = jitted.lower(*args).compile()  # compile once: run it and read its program
    out = compiled(*args)
    print(f"{way}: {rounded(out)}  [{collectives(compiled)}]")
    print("  matches single device:", np.allclose(out, reference, atol=1e-6))


def shard_map_layer(mesh):
    """Way 3 for a given mesh: per-shard code, the collective written by hand."""

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=(P("x"), P("x", None), P(None)), out_specs=P(None))
    def layer_sharded(x, weights, bias):
        return jax.nn.sigmoid(jax.lax.psum(x @ weights, "x") + bias)

    return layer_sharded


# -- Auto mesh axes: the seed's code works unchanged.
mesh = mesh1d["auto"]
print(f"-- {sk.describe_mesh(mesh)}")
placed = sk.shard(params, rules, mesh)  # device_put with the rules' NamedShardings
sharding = NamedSharding(mesh, P("x"))


@jax.jit
def layer_auto(x, weights, bias):
    x = jax.lax.with_sharding_constraint(x, sharding)
    weights = jax.lax.with_sharding_constraint(weights, sharding)
    return layer(x, weights, bias)


# Way 1: jit with sharded inputs; the compiler adds the all-reduce of the contraction.
report("way 1, sharded inputs", layer, *in_order(placed))
# Way 2: constraints inside jit distribute unsharded inputs.
report("way 2, with_sharding_constraint", layer_auto, *in_order(params))
# Way 3: shard_map with psum (unsharded inputs are split as in_specs say).
report("way 3, shard_map + psum", shard_map_layer(mesh), *in_order(params))

# -- Explicit mesh axes (today's default).
mesh = mesh1d["explicit"]
print(f"-- {sk.describe_mesh(mesh)}")
placed = sk.shard(params, rules, mesh)
try:
    layer(*in_order(placed))  # the seed's way 1
except Exception as err:  # jax's ShardingTypeError (not exported under a public name)
    if type(err).__name__ != "ShardingTypeError":
        raise
    print(f"way 1, sharded inputs -> {first_sentence(err)}")


# The contracting dim is split on both sides: say how the result is laid out (replicated).
@jax.jit
def layer_out_sharding(x, weights, bias):
    return jax.nn.sigmoid(jnp.matmul(x, weights, out_sharding=P()) + bias)


# with_sharding_constraint refuses Explicit mesh axes: reshard takes its place.
@jax.jit
def layer_reshard(x, weights, bias):
    x = jax.sharding.reshard(x, P("x"))
    weights = jax.sharding.reshard(weights, P("x"))
    return layer_out_sharding(x, weights, bias)


with jax.set_mesh(mesh):  # lets a bare PartitionSpec (P(), P("x")) name the mesh axes
    report("way 1, out_sharding=P()", layer_out_sharding, *in_order(placed))
    report("way 2, reshard + out_sharding", layer_reshard, *in_order(params))
# Way 3: on Explicit axes shard_map wants inputs already laid out as in_specs say.
report("way 3, shard_map + psum", shard_map_layer(mesh), *in_order(placed))

# The output below keeps long lines whole.
# ruff: noqa: E501
# Expected output:
#
# == 1. devices and data sharding
# devices: [CpuDevice(id=0), CpuDevice(id=1), CpuDevice(id=2), CpuDevice(id=3), CpuDevice(id=4), CpuDevice(id=5), CpuDevice(id=6), CpuDevice(id=7)]
# arr.devices(): {CpuDevice(id=0)}
# arr.sharding: SingleDeviceSharding(device=CpuDevice(id=0), memory_kind=device)
# arr: f32[4,8]
#         B 0:8
#       +-------+
# A 0:4 | cpu 0 |
#       +-------+
#
# == 2. NamedSharding on a 2x4 mesh
# Mesh(x=2, y=4; explicit; 8 devices cpu:0-7, 1 process)
# x\y   0   1   2   3
# 0     0   1   2   3
# 1     4   5   6   7
# [auto] NamedSharding(mesh=Mesh('x': 2, 'y': 4, axis_types=(Auto, Auto)), spec=P('x', 'y'), memory_kind=device)
# [auto] jax.typeof(arr_sharded) = float32[4,8]
# [explicit] NamedSharding(mesh=Mesh('x': 2, 'y': 4, axis_types=(Explicit, Explicit)), spec=P('x', 'y'), memory_kind=device)
# [explicit] jax.typeof(arr_sharded) = float32[4@x,8@y]
# [[ 0.  1.  2.  3.  4.  5.  6.  7.]
#  [ 8.  9. 10. 11. 12. 13. 14. 15.]
#  [16. 17. 18. 19. 20. 21. 22. 23.]
#  [24. 25. 26. 27. 28. 29. 30. 31.]]
# arr_sharded: f32[4,8]  arr_sharded[A_x, B_y]  mesh x=2, y=4
#         B 0:2   B 2:4   B 4:6   B 6:8
#       +-------+-------+-------+-------+
# A 0:2 | cpu 0 | cpu 1 | cpu 2 | cpu 3 |
#       +-------+-------+-------+-------+
# A 2:4 | cpu 4 | cpu 5 | cpu 6 | cpu 7 |
#       +-------+-------+-------+-------+
#
# == 3. jit follows the data
# [auto] f_elementwise: shardings match: True
# [explicit] f_elementwise: shardings match: True
# [auto] f_contract: spec P('y',), value [48. 52. 56. 60. 64. 68. 72. 76.]
# [explicit] f_contract: spec P('y',), value [48. 52. 56. 60. 64. 68. 72. 76.]
# sum0: f32[8]  sum0[A_y]  mesh x=2, y=4
#      A 0:2          A 2:4          A 4:6          A 6:8
# +--------------+--------------+--------------+--------------+
# | cpu 0, cpu 4 | cpu 1, cpu 5 | cpu 2, cpu 6 | cpu 3, cpu 7 |
# +--------------+--------------+--------------+--------------+
#
# == 4. with_sharding_constraint: a fully sharded sum
# [auto] spec P('x',), value [48. 52. 56. 60. 64. 68. 72. 76.]
# sum0: f32[8]  sum0[A_x]  mesh x=8
#   A 0:1   A 1:2   A 2:3   A 3:4   A 4:5   A 5:6   A 6:7   A 7:8
# +-------+-------+-------+-------+-------+-------+-------+-------+
# | cpu 0 | cpu 1 | cpu 2 | cpu 3 | cpu 4 | cpu 5 | cpu 6 | cpu 7 |
# +-------+-------+-------+-------+-------+-------+-------+-------+
# [explicit] with_sharding_constraint -> ValueError: The spec of NamedSharding passed to with_sharding_constraint can only refer to Auto axes of the mesh.
# [explicit] reshard: spec P(('x', 'y'),), value [48. 52. 56. 60. 64. 68. 72. 76.]
# sum0: f32[8]  sum0[A_{x,y}]  mesh x=2, y=4
#   A 0:1   A 1:2   A 2:3   A 3:4   A 4:5   A 5:6   A 6:7   A 7:8
# +-------+-------+-------+-------+-------+-------+-------+-------+
# | cpu 0 | cpu 1 | cpu 2 | cpu 3 | cpu 4 | cpu 5 | cpu 6 | cpu 7 |
# +-------+-------+-------+-------+-------+-------+-------+-------+
#
# == 5. shard_map
# global shape: x.shape=(32,)
# [auto] shard_map(f_elementwise): [1.     2.6829 2.8186 1.2822]... shape (32,)
# device local shape: x.shape=(4,)
# [auto] x * 2 per shard: [ 0  2  4  6  8 10]... spec P('x',)
# [auto] sum per shard: [  6  22  38  54  70  86 102 118]
# [auto] psum over 'x': 496 (jnp.sum: 496)
# [explicit] shard_map(f_elementwise): [1.     2.6829 2.8186 1.2822]... shape (32,)
# device local shape: x.shape=(4,)
# [explicit] x * 2 per shard: [ 0  2  4  6  8 10]... spec P('x',)
# [explicit] sum per shard: [  6  22  38  54  70  86 102 118]
# [explicit] psum over 'x': 496 (jnp.sum: 496)
# [explicit] unsharded input -> ValueError: in_specs passed to shard_map: P('x',) does not match the specs of the input: P(None,) for arg: int32[32].
#
# == 6. three ways to shard a layer
# single device: [0.0214 0.8931 0.5989 0.9774]
# lint: 3 leaves, 656 B total, 96 B per device, 16.7% of per-device bytes fully replicated, 14.6% of all device memory holds copies, 0 errors, 0 warnings
# -- Mesh(x=8; auto; 8 devices cpu:0-7, 1 process)
# way 1, sharded inputs: [0.0214 0.8931 0.5989 0.9774]  [all-reduce x1]
#   matches single device: True
# way 2, with_sharding_constraint: [0.0214 0.8931 0.5989 0.9774]  [all-reduce x1]
#   matches single device: True
# way 3, shard_map + psum: [0.0214 0.8931 0.5989 0.9774]  [all-reduce x1]
#   matches single device: True
# -- Mesh(x=8; explicit; 8 devices cpu:0-7, 1 process)
# way 1, sharded inputs -> ShardingTypeError: Contracting dimensions are sharded and it is ambiguous how the output should be sharded.
# way 1, out_sharding=P(): [0.0214 0.8931 0.5989 0.9774]  [all-reduce x1]
#   matches single device: True
# way 2, reshard + out_sharding: [0.0214 0.8931 0.5989 0.9774]  [all-reduce x1]
#   matches single device: True
# way 3, shard_map + psum: [0.0214 0.8931 0.5989 0.9774]  [all-reduce x1]
#   matches single device: True
