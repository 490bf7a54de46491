"""Three modes of parallel computation side by side (seed 003), on today's JAX and shardkit.

The seed (JAX's GSPMD/pjit documentation) names three modes:

  ===========  ==========  =================  ====================
  mode         view        explicit sharding  explicit collectives
  ===========  ==========  =================  ====================
  automatic    global      no                 no
  explicit     global      yes (in the type)  no
  manual       per device  yes                yes (``shard_map``)
  ===========  ==========  =================  ====================

Here one computation, a two-layer MLP block ``tanh(x @ w1) @ w2`` with a mean-square loss and
its gradient, runs in all three modes on a 4x2 ("data", "model") mesh: ``x`` split over
"data", ``w1`` column-parallel and ``w2`` row-parallel over "model" (Megatron style). Each mode
is checked against a single-device reference, with the output layout, the gradients' layout
and the collectives XLA compiled.

Then the seed's sharp bit on random numbers: ``jax_threefry_partitionable``. It is now on by
default; with it, random values do not depend on the layout and each device draws only its own
block, with no communication. Turned off (the old stream), the values differ and a sharded
draw needs collectives.

What changed since the seed was written (JAX 0.10): ``pjit`` is ``jax.jit``; ``jax.make_mesh``
builds Explicit mesh axes by default, so the automatic mode needs ``axis_types="auto"``;
``jax.experimental.shard_map.shard_map`` is ``jax.shard_map``; ``PositionalSharding`` is gone
(use ``NamedSharding``).

Run: ``python examples/seed003_three_modes.py`` (expected output at the end).
"""

import shardkit as sk

sk.simulate_cpu_devices(8)  # before any JAX computation: the script runs on any machine

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from shardkit.inspection.hlo import collective_summary  # noqa: E402
from shardkit.layout import format_rows  # noqa: E402


def section(title: str) -> None:
    print(f"\n== {title}")


def collectives(compiled) -> str:
    """The collectives XLA put in a compiled program, e.g. 'all-reduce x1' or 'none'."""
    return collective_summary(compiled.as_text())


batch, d_model, d_ff = 16, 8, 16
rng = np.random.default_rng(0)
host = {
    "x": rng.normal(size=(batch, d_model)).astype(np.float32),
    "w1": rng.normal(size=(d_model, d_ff)).astype(np.float32) / np.sqrt(d_model),
    "w2": rng.normal(size=(d_ff, d_model)).astype(np.float32) / np.sqrt(d_ff),
}
rules = sk.Rules(
    [(r"^x$", P("data", None)), (r"^w1$", P(None, "model")), (r"^w2$", P("model", None))]
)


def loss_of(mlp):
    def loss(w1, w2, x):
        return jnp.mean(mlp(x, w1, w2) ** 2)

    return loss


# Reference: one device, plain code.
def mlp(x, w1, w2):
    h = jnp.tanh(x @ w1)  # (B, F)
    return h @ w2  # (B, D)


ref_y = mlp(**host)
ref_loss, ref_grads = jax.value_and_grad(loss_of(mlp), argnums=(0, 1))(
    host["w1"], host["w2"], host["x"]
)
print(f"reference (1 device): loss {float(ref_loss):.6f}")


def check(mode: str, mesh, forward) -> dict:
    """Runs forward and value_and_grad in one mode; returns a row of the comparison table."""
    params = sk.shard(host, rules, mesh)
    x, w1, w2 = params["x"], params["w1"], params["w2"]
    step = jax.jit(jax.value_and_grad(loss_of(forward), argnums=(0, 1)))
    with jax.set_mesh(mesh):  # lets a bare PartitionSpec name mesh axes (out_sharding=P(...))
        y = jax.jit(forward)(x, w1, w2)
        compiled = step.lower(w1, w2, x).compile()  # compile once: run it and read it
        loss, (g1, g2) = compiled(w1, w2, x)
    ok = (
        np.allclose(y, ref_y, atol=1e-5)
        and np.allclose(loss, ref_loss, atol=1e-6)
        and np.allclose(g1, ref_grads[0], atol=1e-5)
        and np.allclose(g2, ref_grads[1], atol=1e-5)
    )
    axes = "/".join(sorted({str(t).split(".")[-1] for t in mesh.axis_types}))
    tag = f"[{mode}, {axes} mesh]"
    print(f"{tag} y: {jax.typeof(y)} spec {y.sharding.spec}; loss {float(loss):.6f}")
    print(f"{tag} grad w1 spec {g1.sharding.spec}, grad w2 spec {g2.sharding.spec}")
    print(f"{tag} matches the reference: {ok}")
    return {
        "mode": mode,
        "mesh axes": axes,
        "y spec": str(y.sharding.spec),
        "grad w1": str(g1.sharding.spec),
        "step collectives": collectives(compiled),
        "matches": ok,
    }


rows = []

# 1. Automatic: Auto mesh axes; the compiler propagates the input shardings and adds the
#    all-reduce of the row-parallel matmul on its own. The code is the single-device code.
section("1. automatic: jax.jit on an Auto mesh, code unchanged")
auto_mesh = sk.make_mesh({"data": 4, "model": 2}, axis_types="auto")
rows.append(check("automatic", auto_mesh, mlp))

# 2. Explicit: the layout is part of every array's type. The same code raises, because the
#    second matmul contracts a dim split over "model" on both sides: say where the result goes.
section("2. explicit: Explicit mesh axes, layouts in the types")
explicit_mesh = sk.make_mesh({"data": 4, "model": 2})
params = sk.shard(host, rules, explicit_mesh)
try:
    jax.jit(mlp)(params["x"], params["w1"], params["w2"])
except Exception as err:  # jax's ShardingTypeError (not exported under a public name)
    if type(err).__name__ != "ShardingTypeError":
        raise
    print("unchanged code ->", type(err).__name__ + ":", str(err).split(". ")[0] + ".")


def mlp_explicit(x, w1, w2):
    h = jnp.tanh(x @ w1)  # float32[16@data,16@model]: follows the inputs, no communication
    print(f"  while tracing: h is {jax.typeof(h)}")
    return jnp.matmul(h, w2, out_sharding=P("data", None))  # the all-reduce over "model"


rows.append(check("explicit", explicit_mesh, mlp_explicit))


# 3. Manual: shard_map gives per-device code; the collective is written by hand. The mesh's
#    axis type does not matter inside shard_map: the same code runs on both kinds of mesh.
section("3. manual: jax.shard_map with psum")


def mlp_block(x, w1, w2):
    print(f"  per device: x {x.shape}, w1 {w1.shape}, w2 {w2.shape}")  # (4, 8) (8, 8) (8, 8)
    h = jnp.tanh(x @ w1)  # (B/4, F/2)
    return jax.lax.psum(h @ w2, "model")  # partial sums over F -> (B/4, D)


def mlp_manual(mesh):
    return jax.shard_map(
        mlp_block,
        mesh=mesh,
        in_specs=(P("data", None), P(None, "model"), P("model", None)),
        out_specs=P("data", None),
    )


rows.append(check("manual", explicit_mesh, mlp_manual(explicit_mesh)))
rows.append(check("manual", auto_mesh, mlp_manual(auto_mesh)))

section("side by side")
print(format_rows(rows))

# 4. Random numbers: jax_threefry_partitionable.
section("4. random numbers and jax_threefry_partitionable")
print("jax_threefry_partitionable default:", jax.config.jax_threefry_partitionable)
key = jax.random.key(0)
for flag in (True, False):
    with jax.threefry_partitionable(flag):
        unsharded = np.asarray(jax.random.normal(key, (16, 16)))
        out = {}
        for kind, mesh in (("auto", auto_mesh), ("explicit", explicit_mesh)):
            draw = jax.jit(
                lambda k: jax.random.normal(k, (16, 16)),
                out_shardings=NamedSharding(mesh, P("data", "model")),
            )
            compiled = draw.lower(key).compile()
            out[kind] = compiled(key)
            same = np.array_equal(np.asarray(out[kind]), unsharded)
            print(
                f"partitionable={flag} [{kind}] sharded draw == unsharded draw: {same}; "
                f"collectives: {collectives(compiled)}"
            )
        print(f"partitionable={flag} first values: {np.round(unsharded[0, :3], 4)}")
    if flag:
        noise_partitionable = out["explicit"]
        sk.show(noise_partitionable, name="noise", format="text")

# Explicit axes can also take the layout as an argument of the draw itself.
with jax.set_mesh(explicit_mesh):
    noise = jax.random.normal(key, (16, 16), out_sharding=P("data", "model"))
print(
    "out_sharding= draw:",
    jax.typeof(noise),
    "equal:",
    bool(jnp.array_equal(noise, noise_partitionable)),
)

# The output below keeps long lines whole.
# ruff: noqa: E501
# Expected output:
#
# reference (1 device): loss 0.363855
#
# == 1. automatic: jax.jit on an Auto mesh, code unchanged
# [automatic, Auto mesh] y: float32[16,8] spec P('data', None); loss 0.363855
# [automatic, Auto mesh] grad w1 spec P(None, 'model'), grad w2 spec P('model',)
# [automatic, Auto mesh] matches the reference: True
#
# == 2. explicit: Explicit mesh axes, layouts in the types
# unchanged code -> ShardingTypeError: Contracting dimensions are sharded and it is ambiguous how the output should be sharded.
#   while tracing: h is float32[16@data,16@model]
#   while tracing: h is float32[16@data,16@model]
# [explicit, Explicit mesh] y: float32[16@data,8] spec P('data', None); loss 0.363855
# [explicit, Explicit mesh] grad w1 spec P(None, 'model'), grad w2 spec P('model', None)
# [explicit, Explicit mesh] matches the reference: True
#
# == 3. manual: jax.shard_map with psum
#   per device: x (4, 8), w1 (8, 8), w2 (8, 8)
#   per device: x (4, 8), w1 (8, 8), w2 (8, 8)
# [manual, Explicit mesh] y: float32[16@data,8] spec P('data', None); loss 0.363855
# [manual, Explicit mesh] grad w1 spec P(None, 'model'), grad w2 spec P('model', None)
# [manual, Explicit mesh] matches the reference: True
#   per device: x (4, 8), w1 (8, 8), w2 (8, 8)
#   per device: x (4, 8), w1 (8, 8), w2 (8, 8)
# [manual, Auto mesh] y: float32[16,8] spec P('data', None); loss 0.363855
# [manual, Auto mesh] grad w1 spec P(None, 'model'), grad w2 spec P('model',)
# [manual, Auto mesh] matches the reference: True
#
# == side by side
# mode       mesh axes  y spec           grad w1           step collectives  matches
# ---------  ---------  ---------------  ----------------  ----------------  -------
# automatic  Auto       P('data', None)  P(None, 'model')  all-reduce x2     True
# explicit   Explicit   P('data', None)  P(None, 'model')  all-reduce x2     True
# manual     Explicit   P('data', None)  P(None, 'model')  all-reduce x2     True
# manual     Auto       P('data', None)  P(None, 'model')  all-reduce x2     True
#
# == 4. random numbers and jax_threefry_partitionable
# jax_threefry_partitionable default: True
# partitionable=True [auto] sharded draw == unsharded draw: True; collectives: none
# partitionable=True [explicit] sharded draw == unsharded draw: True; collectives: none
# partitionable=True first values: [ 1.6226  2.0253 -0.4336]
# noise: f32[16,16]  noise[A_data, B_model]  mesh data=4, model=2
#           B 0:8    B 8:16
#         +--------+--------+
# A 0:4   | cpu 0  | cpu 1  |
#         +--------+--------+
# A 4:8   | cpu 2  | cpu 3  |
#         +--------+--------+
# A 8:12  | cpu 4  | cpu 5  |
#         +--------+--------+
# A 12:16 | cpu 6  | cpu 7  |
#         +--------+--------+
# partitionable=False [auto] sharded draw == unsharded draw: True; collectives: all-gather x2, collective-permute x4
# partitionable=False [explicit] sharded draw == unsharded draw: True; collectives: all-gather x2, collective-permute x4
# partitionable=False first values: [ 1.4349 -0.1293  1.6427]
# out_sharding= draw: float32[16@data,16@model] equal: True
