"""Multi-device sharding exercises (seed 004, exercise 1), solved on today's JAX and shardkit.

The seed notebook shards a 16x16 array over 8 devices and asks for the mesh and PartitionSpec
that give six pictures: rows over 8 devices, a subset of the devices ("half mesh"), columns
("transposed"), a 2x4 block grid, its transpose, a 2x2 grid over every other device ("partial
mesh") and a "mysterious" 4x2 grid whose device numbers are out of order. Each solution below
is drawn with ``shardkit.show`` and checked against the seed's picture.

What changed since the seed was written (JAX 0.10):

  * ``jax.make_mesh`` (and ``shardkit.make_mesh``) build **Explicit** mesh axes by default,
    and ``lax.with_sharding_constraint`` only accepts Auto mesh axes. The seed's
    ``lax.with_sharding_constraint(a, sharding)`` therefore becomes
    ``jax.sharding.reshard(a, sharding)`` on an Explicit mesh (``jax.device_put`` works on
    both). Each exercise also runs the seed's form on an Auto mesh and checks that the two
    layouts agree.
  * ``jax.debug.visualize_array_sharding`` needs ``rich`` and at most 2-D arrays;
    ``shardkit.show(..., format="text")`` prints plain text for any rank.

Run: ``python examples/seed004_exercise1_layouts.py`` (expected output at the end).
"""

import shardkit as sk

sk.simulate_cpu_devices(8)  # before any JAX computation: the script runs on any machine

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from shardkit.layout import format_rows  # noqa: E402
from shardkit.linter import lint  # noqa: E402

a = jax.random.normal(jax.random.key(0), (16, 16))


def device_grid(x) -> list[list[int]]:
    """Device ids of an array's blocks, rows by columns (a replicated block lists one id)."""
    index = x.sharding.devices_indices_map(x.shape)
    rows = sorted({i[0].start or 0 for i in index.values()})
    cols = sorted({i[1].start or 0 for i in index.values()})
    grid = [[-1] * len(cols) for _ in rows]
    for dev, (r, c) in sorted(index.items(), key=lambda kv: -kv[0].id):
        grid[rows.index(r.start or 0)][cols.index(c.start or 0)] = dev.id
    return grid


def exercise(title: str, mesh_axes: dict, spec: P, expected: list[list[int]], **mesh_kw):
    """Places ``a`` with ``spec`` on an Explicit mesh (reshard) and on an Auto mesh (the seed's
    with_sharding_constraint), shows the layout, and checks it against the seed's picture."""
    print(f"\n== {title}")
    mesh = sk.make_mesh(mesh_axes, **mesh_kw)  # Explicit mesh axes, the default
    print(sk.describe_mesh(mesh))
    x = jax.sharding.reshard(a, NamedSharding(mesh, spec))
    sk.show(x, name="a", format="text")
    auto_mesh = sk.make_mesh(mesh_axes, axis_types="auto", **mesh_kw)
    x_auto = lax.with_sharding_constraint(a, NamedSharding(auto_mesh, spec))
    same = x_auto.sharding.devices_indices_map(a.shape) == x.sharding.devices_indices_map(a.shape)
    print("[auto] with_sharding_constraint gives the same layout:", same)
    print("matches the seed's picture:", device_grid(x) == expected)
    print("values unchanged:", bool(np.array_equal(np.asarray(x), np.asarray(a))))
    return x


# The seed's starting point: rows over 8 devices.
exercise("rows over 8 devices: P('x')", {"x": 8}, P("x"), [[d] for d in range(8)])

# The seed's form, for the record: on an Explicit mesh the constraint is refused.
try:
    lax.with_sharding_constraint(a, NamedSharding(sk.make_mesh({"x": 8}), P("x")))
except ValueError as err:
    print("[explicit] with_sharding_constraint ->", str(err).split(". ")[0] + ".")

# Half mesh: a mesh over a subset of the devices.
exercise(
    "subset of devices: half mesh over devices 0-3",
    {"x": 4},
    P("x"),
    [[0], [1], [2], [3]],
    devices=jax.devices()[:4],
)

# Exercise 1.1: transposed sharding, columns over the 8 devices.
exercise("1.1 transposed: P(None, 'x')", {"x": 8}, P(None, "x"), [list(range(8))])

# Exercise 1.2: a 2x4 block grid.
exercise(
    "1.2 2-D: P('x', 'y') on x=2, y=4", {"x": 2, "y": 4}, P("x", "y"), [[0, 1, 2, 3], [4, 5, 6, 7]]
)

# Exercise 1.2 (second part): the same mesh, mesh axes swapped in the spec.
exercise(
    "1.2 transposed 2-D: P('y', 'x') on x=2, y=4",
    {"x": 2, "y": 4},
    P("y", "x"),
    [[0, 4], [1, 5], [2, 6], [3, 7]],
)

# Exercise 1.3: a 2x2 mesh over every other device.
exercise(
    "1.3 partial mesh: x=2, y=2 over devices 0, 2, 4, 6",
    {"x": 2, "y": 2},
    P("x", "y"),
    [[0, 2], [4, 6]],
    devices=jax.devices()[::2],
)

# Exercise 1.4: rows read 0 2 / 4 6 / 1 3 / 5 7. Device d sits at mesh coordinate
# (a, b, c) = bits of d on a 2x2x2 mesh; rows are split over c then a, columns over b.
mysterious = [[0, 2], [4, 6], [1, 3], [5, 7]]
f = exercise(
    "1.4 mysterious: P(('c', 'a'), 'b') on a=2, b=2, c=2",
    {"a": 2, "b": 2, "c": 2},
    P(("c", "a"), "b"),
    mysterious,
)
# The same picture from a 4x2 mesh whose devices are listed in that order.
f2 = exercise(
    "1.4 mysterious, second answer: P('x', 'y') on x=4, y=2 over devices reordered",
    {"x": 4, "y": 2},
    P("x", "y"),
    mysterious,
    devices=[jax.devices()[i] for i in (0, 2, 4, 6, 1, 3, 5, 7)],
)
print("\nboth answers put every block on the same device:", device_grid(f) == device_grid(f2))

# The shard table of the mysterious layout: which rows and columns each device holds.
print(format_rows(sk.shard_table(f), title="shards of the mysterious layout"))

# A layout can be drawn from a spec alone (no array), and bad specs are caught before use.
print()
sk.show(
    shape=(16, 16), mesh=sk.make_mesh({"x": 2, "y": 4}), spec=P("y", "x"), name="w", format="text"
)
print(lint({"a": a}, P("x", "x"), {"x": 8}).findings[0].code)
print(lint({"a": a}, P(None, "y"), {"x": 2, "y": 3}).findings[0].message)

# The output below keeps long lines whole.
# ruff: noqa: E501
# Expected output:
#
# == rows over 8 devices: P('x')
# Mesh(x=8; explicit; 8 devices cpu:0-7, 1 process)
# a: f32[16,16]  a[A_x, B]  mesh x=8
#           B 0:16
#         +--------+
# A 0:2   | cpu 0  |
#         +--------+
# A 2:4   | cpu 1  |
#         +--------+
# A 4:6   | cpu 2  |
#         +--------+
# A 6:8   | cpu 3  |
#         +--------+
# A 8:10  | cpu 4  |
#         +--------+
# A 10:12 | cpu 5  |
#         +--------+
# A 12:14 | cpu 6  |
#         +--------+
# A 14:16 | cpu 7  |
#         +--------+
# [auto] with_sharding_constraint gives the same layout: True
# matches the seed's picture: True
# values unchanged: True
# [explicit] with_sharding_constraint -> The spec of NamedSharding passed to with_sharding_constraint can only refer to Auto axes of the mesh.
#
# == subset of devices: half mesh over devices 0-3
# Mesh(x=4; explicit; 4 devices cpu:0-3, 1 process)
# a: f32[16,16]  a[A_x, B]  mesh x=4
#           B 0:16
#         +--------+
# A 0:4   | cpu 0  |
#         +--------+
# A 4:8   | cpu 1  |
#         +--------+
# A 8:12  | cpu 2  |
#         +--------+
# A 12:16 | cpu 3  |
#         +--------+
# [auto] with_sharding_constraint gives the same layout: True
# matches the seed's picture: True
# values unchanged: True
#
# == 1.1 transposed: P(None, 'x')
# Mesh(x=8; explicit; 8 devices cpu:0-7, 1 process)
# a: f32[16,16]  a[A, B_x]  mesh x=8
#           B 0:2     B 2:4     B 4:6     B 6:8     B 8:10   B 10:12   B 12:14   B 14:16
#        +---------+---------+---------+---------+---------+---------+---------+---------+
# A 0:16 |  cpu 0  |  cpu 1  |  cpu 2  |  cpu 3  |  cpu 4  |  cpu 5  |  cpu 6  |  cpu 7  |
#        +---------+---------+---------+---------+---------+---------+---------+---------+
# [auto] with_sharding_constraint gives the same layout: True
# matches the seed's picture: True
# values unchanged: True
#
# == 1.2 2-D: P('x', 'y') on x=2, y=4
# Mesh(x=2, y=4; explicit; 8 devices cpu:0-7, 1 process)
# a: f32[16,16]  a[A_x, B_y]  mesh x=2, y=4
#           B 0:4     B 4:8     B 8:12   B 12:16
#        +---------+---------+---------+---------+
# A 0:8  |  cpu 0  |  cpu 1  |  cpu 2  |  cpu 3  |
#        +---------+---------+---------+---------+
# A 8:16 |  cpu 4  |  cpu 5  |  cpu 6  |  cpu 7  |
#        +---------+---------+---------+---------+
# [auto] with_sharding_constraint gives the same layout: True
# matches the seed's picture: True
# values unchanged: True
#
# == 1.2 transposed 2-D: P('y', 'x') on x=2, y=4
# Mesh(x=2, y=4; explicit; 8 devices cpu:0-7, 1 process)
# a: f32[16,16]  a[A_y, B_x]  mesh x=2, y=4
#           B 0:8    B 8:16
#         +--------+--------+
# A 0:4   | cpu 0  | cpu 4  |
#         +--------+--------+
# A 4:8   | cpu 1  | cpu 5  |
#         +--------+--------+
# A 8:12  | cpu 2  | cpu 6  |
#         +--------+--------+
# A 12:16 | cpu 3  | cpu 7  |
#         +--------+--------+
# [auto] with_sharding_constraint gives the same layout: True
# matches the seed's picture: True
# values unchanged: True
#
# == 1.3 partial mesh: x=2, y=2 over devices 0, 2, 4, 6
# Mesh(x=2, y=2; explicit; 4 devices cpu:0,2,4,6, 1 process)
# a: f32[16,16]  a[A_x, B_y]  mesh x=2, y=2
#          B 0:8    B 8:16
#        +--------+--------+
# A 0:8  | cpu 0  | cpu 2  |
#        +--------+--------+
# A 8:16 | cpu 4  | cpu 6  |
#        +--------+--------+
# [auto] with_sharding_constraint gives the same layout: True
# matches the seed's picture: True
# values unchanged: True
#
# == 1.4 mysterious: P(('c', 'a'), 'b') on a=2, b=2, c=2
# Mesh(a=2, b=2, c=2; explicit; 8 devices cpu:0-7, 1 process)
# a: f32[16,16]  a[A_{c,a}, B_b]  mesh a=2, b=2, c=2
#           B 0:8    B 8:16
#         +--------+--------+
# A 0:4   | cpu 0  | cpu 2  |
#         +--------+--------+
# A 4:8   | cpu 4  | cpu 6  |
#         +--------+--------+
# A 8:12  | cpu 1  | cpu 3  |
#         +--------+--------+
# A 12:16 | cpu 5  | cpu 7  |
#         +--------+--------+
# [auto] with_sharding_constraint gives the same layout: True
# matches the seed's picture: True
# values unchanged: True
#
# == 1.4 mysterious, second answer: P('x', 'y') on x=4, y=2 over devices reordered
# Mesh(x=4, y=2; explicit; 8 devices cpu:0-7, 1 process)
# a: f32[16,16]  a[A_x, B_y]  mesh x=4, y=2
#           B 0:8    B 8:16
#         +--------+--------+
# A 0:4   | cpu 0  | cpu 2  |
#         +--------+--------+
# A 4:8   | cpu 4  | cpu 6  |
#         +--------+--------+
# A 8:12  | cpu 1  | cpu 3  |
#         +--------+--------+
# A 12:16 | cpu 5  | cpu 7  |
#         +--------+--------+
# [auto] with_sharding_constraint gives the same layout: True
# matches the seed's picture: True
# values unchanged: True
#
# both answers put every block on the same device: True
# shards of the mysterious layout
# device  process  index          shard_shape  bytes
# ------  -------  -------------  -----------  -----
# cpu 0   0        [0:4, 0:8]     (4, 8)       128 B
# cpu 1   0        [8:12, 0:8]    (4, 8)       128 B
# cpu 2   0        [0:4, 8:16]    (4, 8)       128 B
# cpu 3   0        [8:12, 8:16]   (4, 8)       128 B
# cpu 4   0        [4:8, 0:8]     (4, 8)       128 B
# cpu 5   0        [12:16, 0:8]   (4, 8)       128 B
# cpu 6   0        [4:8, 8:16]    (4, 8)       128 B
# cpu 7   0        [12:16, 8:16]  (4, 8)       128 B
#
# w: f32[16,16]  w[A_y, B_x]  mesh x=2, y=4
#           B 0:8    B 8:16
#         +--------+--------+
# A 0:4   | cpu 0  | cpu 4  |
#         +--------+--------+
# A 4:8   | cpu 1  | cpu 5  |
#         +--------+--------+
# A 8:12  | cpu 2  | cpu 6  |
#         +--------+--------+
# A 12:16 | cpu 3  | cpu 7  |
#         +--------+--------+
# duplicate-axis
# leaf 'a' shape (16, 16) spec P(None, 'y'): dim 1 has size 16, which mesh axis 'y' (size 3) (product 3) does not divide on mesh {'x': 2, 'y': 3}; fix: use a mesh shape that divides, e.g. {'x': 3, 'y': 2}, {'x': 6, 'y': 1}; or pad dim 1 to 18 (+2); or leave dim 1 unsharded (None).
