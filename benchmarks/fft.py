"""Distributed 3-D FFT: shardkit pencil/slab vs sharded and single-device `jnp.fft.fftn`.

Runs on 8 simulated CPU devices (Auto mesh axes, the only kind jaxDecomp compiles on) and prints,
per size and mesh, side by side in one run: each method's median time over interleaved rounds,
the speed-up over the sharded `jnp.fft` call it replaces (jnp/this), the time relative to jaxDecomp
and to the one-device `jnp.fft.fftn` (this/jaxdecomp and this/1dev: the median of the per-round
ratios, with their spread, the 10th to 90th percentile, in brackets; <= 1.0 means at least as
fast), the collectives in the compiled program, and the per-device temporaries as a multiple of
the local shard L. jaxDecomp's pure-JAX backend is included when `import jaxdecomp` works
(`pip install jaxdecomp`). Simulated devices share the CPU cores, so only ratios within one run
mean anything; the per-round ratios cancel load that hits both methods of a round alike.

    python benchmarks/fft.py                    # 64^3 and 128^3
    python benchmarks/fft.py --big              # also 256^3
    python benchmarks/fft.py --sizes 128 256 --meshes 2x4 --rounds 21
    python benchmarks/fft.py --sizes 128 --floor   # also the floor of any all-to-all transform

With `--floor`, two programs join the rounds: the transform's exchanges alone (XLA's cheapest
all-to-all of the shard: chunks along the leading dim, joined there; two for a pencil, over b
then over both mesh axes, one for a slab) and the FFT work alone (`jnp.fft.fftn` of each local
block, shorter transforms than the distributed one needs). Every distributed transform that
moves the data with all-to-alls does at least both, on the same cores, so the median of the
per-round sums over the one-device `fftn` is a floor for this/1dev on this machine.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardkit.fft as skfft  # noqa: E402
from shardkit.inspection.hlo import collective_counts  # noqa: E402

try:
    import jaxdecomp
except Exception:  # noqa: BLE001  (any import failure means "not available")
    jaxdecomp = None

ROUNDS = 9


def _interleaved_ms(fns: dict, args: dict, rounds: int = ROUNDS) -> dict:
    """Per-round ms of each function over interleaved rounds (each round runs every function
    once, so a change of load hits the methods of one round alike). Each round runs the
    methods in a fresh random order (fixed seed): a distributed transform right after one of
    the sharded `jnp.fft` calls, which gather the whole array on every device, measured about
    a third slower than after another method (128^3 pencil: 21.5 against 16.3 ms; the
    one-device `fftn` did not slow down), and rotating one fixed order, which keeps each
    method's neighbours, put the same methods behind those calls in almost every round."""
    for name, fn in fns.items():
        jax.block_until_ready(fn(args[name]))  # compile and warm up
    times = {name: [] for name in fns}
    order = np.random.default_rng(0)
    for _ in range(rounds):
        for name in order.permutation(list(fns)):
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name](args[name]))
            times[name].append(1e3 * (time.perf_counter() - t0))
    return {name: np.array(t) for name, t in times.items()}


def _ratio(times: np.ndarray, base: np.ndarray | None) -> str:
    """Median of the per-round ratios times / base, and their 10th-90th percentile spread."""
    if base is None:
        return "-"
    r = times / base
    lo, mid, hi = np.percentile(r, [10, 50, 90])
    return f"{mid:.2f} [{lo:.2f}-{hi:.2f}]"


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


def _floor_programs(mesh, spec) -> dict:
    """The exchanges alone and the FFT work alone of a transform of `x[X_a, Y_b, Z]` (see the
    module docstring), each one jitted program over the mesh."""
    axes = [a for a in mesh.axis_names if mesh.shape[a] > 1]
    exchanges = [axes[-1:], axes] if len(axes) == 2 else [axes]  # pencil: over b, then (a, b)

    def exchange_only(blk):
        for group in exchanges:  # the shard as p contiguous chunks, one per peer
            p = int(np.prod([mesh.shape[a] for a in group]))
            flat = lax.all_to_all(blk.reshape(p, -1), tuple(group), 0, 0, tiled=True)
            blk = flat.reshape(blk.shape)
        return blk

    def program(body):
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))

    return {
        FLOOR_EXCHANGES: program(exchange_only),
        FLOOR_FFTS: program(jnp.fft.fftn),
    }


FLOOR_EXCHANGES = "floor: exchanges alone"
FLOOR_FFTS = "floor: local FFTs alone"


def run(n: int, mesh_shape: tuple[int, int], rounds: int, floor: bool = False) -> None:
    mesh = jax.make_mesh(mesh_shape, ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    kind = "pencil" if min(mesh_shape) > 1 else "slab"
    spec = P("x", "y")  # inside jit on Auto axes the spec cannot be read from a traced value
    sharding = NamedSharding(mesh, spec)
    real_host = jax.random.normal(jax.random.key(0), (n, n, n), jnp.float32)
    host = real_host.astype(jnp.complex64)
    x = jax.device_put(host, sharding)
    xr = jax.device_put(real_host, sharding)
    one = jax.device_put(host, jax.devices()[0])
    local = x.nbytes / 8
    # name -> (function, argument, the sharded jnp method it replaces)
    methods = {
        f"shardkit {kind}, natural": (skfft.pfft3d, x, "fftn"),
        f"shardkit {kind}, transposed": (
            lambda a: skfft.pfft3d(a, layout="transposed", spec=spec),
            x,
            "fftn",
        ),
        "jnp.fft.fftn, sharded": (jnp.fft.fftn, x, "fftn"),
    }
    if jaxdecomp is not None:
        methods["jaxdecomp pfft3d (JAX)"] = (lambda a: jaxdecomp.fft.pfft3d(a), x, "fftn")
    methods["jnp.fft.fftn, 1 device"] = (jnp.fft.fftn, one, "fftn")
    methods[f"shardkit prfft3d {kind} (real)"] = (skfft.prfft3d, xr, "rfftn")
    methods["jnp.fft.rfftn, sharded (real)"] = (jnp.fft.rfftn, xr, "rfftn")
    fns = {
        name: jax.jit(
            fn if fn not in (skfft.pfft3d, skfft.prfft3d) else (lambda a, fn=fn: fn(a, spec=spec))
        )
        for name, (fn, _, _) in methods.items()
    }
    args = {name: arg for name, (_, arg, _) in methods.items()}
    floors = _floor_programs(mesh, spec) if floor else {}
    fns.update(floors)
    args.update(dict.fromkeys(floors, x))
    refs = {"fftn": np.fft.fftn(np.asarray(host)), "rfftn": np.fft.rfftn(np.asarray(real_host))}
    rounds_ms = _interleaved_ms(fns, args, rounds)
    times = {name: float(np.median(t)) for name, t in rounds_ms.items()}
    audits = {}
    for name, fn in fns.items():
        if name in floors:
            continue
        ref = refs[methods[name][2]]
        if "1 device" in name:
            audits[name] = ("none", float("nan"))
        else:
            audits[name] = _audit(fn, args[name], local)
        out = np.asarray(fn(args[name]))
        if "transposed" in name or "jaxdecomp" in name:
            out = np.moveaxis(out, -1, 0)
        audits[name] += (float(np.linalg.norm(out - ref) / np.linalg.norm(ref)),)
    base = {"fftn": times["jnp.fft.fftn, sharded"], "rfftn": times["jnp.fft.rfftn, sharded (real)"]}
    t_jd = rounds_ms.get("jaxdecomp pfft3d (JAX)")
    t_one = rounds_ms["jnp.fft.fftn, 1 device"]
    print(
        f"\n{n}^3 complex64, mesh {mesh_shape} ({kind}), L = {local / 2**20:.2f} MiB per device, "
        f"median of {rounds} interleaved rounds"
    )
    head = f"  {'method':32s} {'ms':>7s} {'jnp/this':>8s} {'this/jaxdecomp':>16s}"
    print(f"{head} {'this/1dev':>16s}  {'collectives':14s} {'temp/L':>6s} {'rel.err':>8s}")
    for name, t in times.items():
        if name in floors:
            print(f"  {name:32s} {t:7.1f} {'':8s} {'':>16s} {_ratio(rounds_ms[name], t_one):>16s}")
            continue
        coll, temp, err = audits[name]
        real = methods[name][2] == "rfftn"
        vs_jd = _ratio(rounds_ms[name], None if real else t_jd)
        vs_one = _ratio(rounds_ms[name], None if real else t_one)
        speedup = base[methods[name][2]] / t
        print(
            f"  {name:32s} {t:7.1f} {speedup:8.2f} {vs_jd:>16s} {vs_one:>16s}  {coll:14s} "
            f"{temp:6.2f} {err:8.1e}"
        )
    if floors:
        both = rounds_ms[FLOOR_EXCHANGES] + rounds_ms[FLOOR_FFTS]
        print(f"  floor of this/1dev (exchanges + local FFTs, per round): {_ratio(both, t_one)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--big", action="store_true", help="add 256^3 to the default sizes")
    parser.add_argument("--sizes", type=int, nargs="+", help="grid sizes n (n^3), e.g. 128 256")
    parser.add_argument(
        "--meshes", nargs="+", default=["2x4", "4x2", "8x1"], help="meshes, e.g. 2x4 8x1"
    )
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds")
    parser.add_argument(
        "--floor", action="store_true", help="also time the exchanges alone and the FFTs alone"
    )
    opts = parser.parse_args()
    sizes = opts.sizes or [64, 128] + ([256] if opts.big else [])
    meshes = [tuple(int(s) for s in m.split("x")) for m in opts.meshes]
    print(
        f"jax {jax.__version__}, {jax.device_count()} devices ({jax.default_backend()}), "
        f"jaxdecomp {'not installed' if jaxdecomp is None else jaxdecomp.__version__}"
    )
    print("jnp/this: speed-up over the sharded jnp.fft call it replaces (fftn, or rfftn for real")
    print("input); this/jaxdecomp: time over jaxDecomp's (same output layout as 'transposed');")
    print("this/1dev: time over the one-device jnp.fft.fftn; both as the median [10th-90th")
    print("percentile] of per-round ratios; temp/L: per-device temporaries over the local shard L.")
    for n in sizes:
        for mesh_shape in meshes:
            run(n, mesh_shape, opts.rounds, opts.floor)


if __name__ == "__main__":
    main()
