"""Distributed 3-D FFT: shardkit pencil/slab vs sharded and single-device `jnp.fft.fftn`.

Runs on 8 simulated CPU devices (Auto mesh axes, the only kind jaxDecomp compiles on) and prints,
per size and mesh, side by side in one run: the median time of each method and its ratio to
shardkit's natural layout, the collectives in the compiled program, and the per-device
temporaries as a multiple of the local shard L. jaxDecomp's pure-JAX backend is included when
`import jaxdecomp` works (`pip install jaxdecomp`). Simulated devices share the CPU cores, so
only ratios within one run mean anything.

    python benchmarks/fft.py            # 64^3 and 128^3
    python benchmarks/fft.py --big      # also 256^3
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardkit.fft as skfft  # noqa: E402
from shardkit.inspection.hlo import collective_counts  # noqa: E402

try:
    import jaxdecomp
except Exception:  # noqa: BLE001  (any import failure means "not available")
    jaxdecomp = None

ROUNDS = 7


def _median_ms(fn, x, rounds=ROUNDS):
    jax.block_until_ready(fn(x))
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(x))
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def _audit(fn, x, local_bytes):
    compiled = jax.jit(fn).lower(x).compile()
    counts = collective_counts(compiled.as_text())
    short = {
        "all-to-all": "A2A",
        "all-gather": "AG",
        "all-reduce": "AR",
        "collective-permute": "CP",
        "reduce-scatter": "RS",
    }
    text = " ".join(f"{short.get(k, k)}={v}" for k, v in counts.items() if v) or "none"
    temp = compiled.memory_analysis().temp_size_in_bytes / local_bytes
    return text, temp


def run(n: int, mesh_shape: tuple[int, int]) -> None:
    mesh = jax.make_mesh(mesh_shape, ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    kind = "pencil" if min(mesh_shape) > 1 else "slab"
    spec = P("x", "y")  # inside jit on Auto axes the spec cannot be read from a traced value
    sharding = NamedSharding(mesh, spec)
    key = jax.random.key(0)
    host = jax.random.normal(key, (n, n, n), jnp.float32).astype(jnp.complex64)
    x = jax.device_put(host, sharding)
    one = jax.device_put(host, jax.devices()[0])
    local = x.nbytes / 8
    methods = {
        f"shardkit {kind}, natural": jax.jit(lambda a: skfft.pfft3d(a, spec=spec)),
        f"shardkit {kind}, transposed": jax.jit(
            lambda a: skfft.pfft3d(a, layout="transposed", spec=spec)
        ),
        "jnp.fft.fftn, sharded": jax.jit(jnp.fft.fftn),
    }
    if jaxdecomp is not None:
        methods["jaxdecomp pfft3d (JAX)"] = jax.jit(lambda a: jaxdecomp.fft.pfft3d(a))
    ref = np.asarray(jax.jit(jnp.fft.fftn)(one))
    times, audits = {}, {}
    for _ in range(2):  # two interleaved passes so no method owns a quiet moment of the machine
        for name, fn in methods.items():
            times.setdefault(name, []).append(_median_ms(fn, x))
        times.setdefault("jnp.fft.fftn, 1 device", []).append(
            _median_ms(jax.jit(jnp.fft.fftn), one)
        )
    for name, fn in methods.items():
        audits[name] = _audit(fn, x, local)
        out = np.asarray(fn(x))
        if "transposed" in name or "jaxdecomp" in name:
            out = np.moveaxis(out, -1, 0)
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        audits[name] += (err,)
    audits["jnp.fft.fftn, 1 device"] = ("none", float("nan"), 0.0)
    base = min(times[f"shardkit {kind}, natural"])
    print(f"\n{n}^3 complex64, mesh {mesh_shape} ({kind}), L = {local / 2**20:.2f} MiB per device")
    print(
        f"  {'method':30s} {'ms':>8s} {'x shardkit':>10s}  {'collectives':22s} {'temp/L':>7s} "
        f"{'rel.err':>8s}"
    )
    for name in times:
        t = min(times[name])
        coll, temp, err = audits[name]
        print(f"  {name:30s} {t:8.1f} {t / base:10.2f}  {coll:22s} {temp:7.2f} {err:8.1e}")


def main() -> None:
    sizes = [64, 128] + ([256] if "--big" in sys.argv else [])
    print(
        f"jax {jax.__version__}, {jax.device_count()} devices ({jax.default_backend()}), "
        f"jaxdecomp {'not installed' if jaxdecomp is None else jaxdecomp.__version__}"
    )
    for n in sizes:
        for mesh_shape in [(2, 4), (4, 2), (8, 1)]:
            run(n, mesh_shape)


if __name__ == "__main__":
    main()
