"""How long the audit takes next to compiling: a 24-layer transformer training step.

The step (forward, loss, gradients, SGD update) of a small GPT-style transformer, its 24 layers
unrolled in Python so the compiled HLO text is large, is compiled on a (data=4, model=2) mesh
with Megatron-style tensor parallelism (column-parallel QKV/up, row-parallel out/down) and data
parallelism over the batch. The script times, in one run:

- lowering + compiling the step (`jit(step).lower(...).compile()`),
- `shardkit.inspect` on the compiled object (reading the text, decoding every collective,
  source lines, warnings; memory/cost analysis included),

and prints the audit time as a fraction of compile time (target: under 10%).

Run: `python benchmarks/inspection.py [--layers 24] [--repeats 3]`.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardkit.inspection as si  # noqa: E402
from shardkit.inspection import hlo  # noqa: E402


def build(layers: int, d: int, heads: int, seq: int, batch: int, vocab: int):
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)

    def s(shape, spec):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))

    params = {
        "embed": s((vocab, d), P(None, None)),
        "layers": [
            {
                "qkv": s((d, 3 * d), P(None, "model")),
                "out": s((d, d), P("model", None)),
                "up": s((d, 4 * d), P(None, "model")),
                "down": s((4 * d, d), P("model", None)),
            }
            for _ in range(layers)
        ],
    }
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=NamedSharding(mesh, P("data")))

    def norm(x):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)

    def block(p, x):  # x: (B, T, D)
        b, t, _ = x.shape
        q, k, v = jnp.split(norm(x) @ p["qkv"], 3, axis=-1)
        q, k, v = (a.reshape(b, t, heads, d // heads) for a in (q, k, v))
        att = jnp.einsum("bqhd,bkhd->bhqk", q, k) / (d // heads) ** 0.5
        att = jnp.where(jnp.tril(jnp.ones((t, t), bool)), att, -1e9)
        y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(att, -1), v).reshape(b, t, d)
        x = x + y @ p["out"]
        return x + jax.nn.gelu(norm(x) @ p["up"]) @ p["down"]

    def loss(params, tokens):
        x = params["embed"][tokens]
        for p in params["layers"]:  # unrolled: one copy of the block per layer in the HLO
            x = block(p, x)
        logits = norm(x) @ params["embed"].T
        labels = jnp.roll(tokens, -1, axis=1)
        logp = jax.nn.log_softmax(logits, -1)
        return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], -1))

    def step(params, tokens):
        l, g = jax.value_and_grad(loss)(params, tokens)
        return jax.tree.map(lambda w, gw: w - 1e-3 * gw, params, g), l

    return jax.jit(step, donate_argnums=0), params, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    step, params, tokens = build(a.layers, a.d_model, heads=8, seq=128, batch=8, vocab=512)

    t0 = time.perf_counter()
    compiled = step.lower(params, tokens).compile()
    compile_s = time.perf_counter() - t0
    text = compiled.as_text()

    audit, parse, count = [], [], []
    for _ in range(a.repeats):
        t = time.perf_counter()
        report = si.inspect(compiled)
        audit.append(time.perf_counter() - t)
        t = time.perf_counter()
        hlo.parse_hlo(text)
        parse.append(time.perf_counter() - t)
        t = time.perf_counter()
        hlo.collective_counts(text)
        count.append(time.perf_counter() - t)
    audit_s, parse_s, count_s = (statistics.median(x) for x in (audit, parse, count))

    print(
        f"{a.layers}-layer transformer step, d_model={a.d_model}, mesh data=4 x model=2 "
        f"(8 simulated CPU devices)"
    )
    print(
        f"compiled HLO text: {len(text) / 2**20:.1f} MiB, {text.count(chr(10)):,} lines, "
        f"{len(report.collectives)} collectives"
    )
    print(f"lower + compile:             {compile_s:8.2f} s")
    print(f"shardkit.inspect(compiled):  {audit_s:8.3f} s  = {audit_s / compile_s:6.1%} of compile")
    print(f"  of which text+parse+decode:{report.parse_seconds:8.3f} s")
    print(f"parse_hlo(text) alone:       {parse_s:8.3f} s  = {parse_s / compile_s:6.1%} of compile")
    print(f"collective_counts(text):     {count_s:8.3f} s  = {count_s / compile_s:6.1%} of compile")
    print(
        "target: inspect under 10% of compile:", "met" if audit_s < 0.1 * compile_s else "NOT met"
    )
    kinds = ", ".join(f"{k} {v['count']}x" for k, v in report.by_kind().items())
    print(f"collectives per step: {kinds}; {report.total_bytes / 2**20:.1f} MiB per device")


if __name__ == "__main__":
    main()
