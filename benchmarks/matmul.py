"""Benchmark: shardkit.matmul algorithms vs jax.jit with the same shardings vs one device.

For each N and each layout, every algorithm that fits runs side by side in one process, in
interleaved rounds (so drift in machine load hits all of them alike). Printed per row:

  time     median over rounds, and its ratio to one device's ``jnp.dot`` and to ``jax.jit`` of
           ``jnp.matmul`` with the same input and output shardings (GSPMD);
  bytes    bytes each device receives per call, from the audit of the compiled program
           (``shardkit.inspection.inspect``: executions x ring-model bytes);
  peak     per-device argument + output + temp bytes from ``memory_analysis()``.

The 8 devices are simulated on this machine's CPU cores, which they share: the times are
ratios within one run, never accelerator figures, and communication cannot overlap compute
here (a collective-permute is a memory copy competing for the same cores), so collective
matmul's overlap cannot show on shared CPU cores. Bytes and peak memory are exact.

Run: ``python benchmarks/matmul.py [--sizes 1024 2048 4096] [--rounds 3]``.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from shardkit.inspection import inspect  # noqa: E402
from shardkit.matmul._layout import MatmulLayoutError, layout_of  # noqa: E402
from shardkit.matmul.api import kernel  # noqa: E402
from shardkit.matmul.cost import fit  # noqa: E402

LAYOUTS = [
    # (mesh shape, names, A spec, B spec, [(label, algorithm, out_spec, bidirectional)])
    (
        (8,),
        ("x",),
        ("x", None),
        (None, "x"),
        [
            ("allgather", "allgather", (None, "x"), False),
            ("collective", "collective", (None, "x"), False),
            ("collective bidi", "collective", (None, "x"), True),
        ],
    ),
    (
        (8,),
        ("x",),
        (None, "x"),
        ("x", None),
        [
            ("reduce_scatter", "reduce_scatter", ("x", None), False),
            ("collective", "collective", ("x", None), False),
            ("collective bidi", "collective", ("x", None), True),
            ("allgather", "allgather", ("x", None), False),
        ],
    ),
    (
        (8,),
        ("x",),
        (None, "x"),
        (None, None),
        [
            ("allgather", "allgather", (None, None), False),
            ("reduce_scatter", "reduce_scatter", (None, None), False),
            ("collective", "collective", (None, None), False),
            ("collective bidi", "collective", (None, None), True),
        ],
    ),
    (
        (2, 4),
        ("r", "c"),
        ("r", "c"),
        ("r", "c"),
        [("summa", "summa", ("r", "c"), False), ("allgather", "allgather", ("r", "c"), False)],
    ),
]


def _peak(compiled) -> int:
    m = compiled.memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes


def _time(fns: dict, args: dict, rounds: int) -> dict[str, float]:
    for name, f in fns.items():  # warm-up
        jax.block_until_ready(f(*args[name]))
    runs: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, f in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(*args[name]))
            runs[name].append(time.perf_counter() - t0)
    return {name: statistics.median(r) for name, r in runs.items()}


def bench(n: int, rounds: int) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    dev0 = jax.devices()[0]
    one = jax.jit(lambda x, y: jnp.dot(x, y, precision=lax.Precision.HIGHEST))
    a0, b0 = jax.device_put(a, dev0), jax.device_put(b, dev0)
    one_peak = _peak(one.lower(a0, b0).compile())
    for mesh_shape, names, sa, sb, algos in LAYOUTS:
        mesh = jax.make_mesh(mesh_shape, names)
        A = jax.device_put(a, NamedSharding(mesh, P(*sa)))
        B = jax.device_put(b, NamedSharding(mesh, P(*sb)))
        L = layout_of(A, B)
        fns = {"one device": one}
        args = {"one device": (a0, b0)}
        info = {"one device": (0, one_peak)}
        jit_of = {}  # algorithm label -> the jit row with the same output sharding
        for label, algorithm, out, bidi in algos:
            try:
                method = fit(L, algorithm, out, bidirectional=bidi)
            except MatmulLayoutError as e:  # e.g. odd block for bidirectional
                print(f"  {label}: skipped ({e})")
                continue
            f = kernel(L, method, jnp.dtype(jnp.float32))
            compiled = f.lower(A, B).compile()
            fns[label], args[label] = compiled, (A, B)
            info[label] = (inspect(compiled).total_bytes, _peak(compiled))
            out_sharding = NamedSharding(mesh, P(*out))
            g = jax.jit(
                lambda x, y, s=out_sharding: jnp.matmul(
                    x, y, out_sharding=s, precision=lax.Precision.HIGHEST
                )
            )
            key = f"jit -> {P(*out)}"
            jit_of[label] = key
            if key not in fns:
                gc = g.lower(A, B).compile()
                fns[key], args[key] = gc, (A, B)
                info[key] = (inspect(gc).total_bytes, _peak(gc))
        times = _time(fns, args, rounds)
        title = f"N={n}  A {P(*sa)} @ B {P(*sb)} on mesh {dict(mesh.shape)}"
        print(title)
        print(
            f"  {'':<26}{'time ms':>10}{'vs 1 dev':>10}{'vs jit':>8}"
            f"{'bytes/dev':>14}{'peak/dev':>14}"
        )
        for name in fns:
            jit_key = jit_of.get(name)
            vs_jit = f"{times[name] / times[jit_key]:.2f}" if jit_key else "-"
            nbytes, peak = info[name]
            print(
                f"  {name:<26}{times[name] * 1e3:>10.1f}{times[name] / times['one device']:>10.2f}"
                f"{vs_jit:>8}{int(nbytes):>14,}{peak:>14,}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(
        f"jax {jax.__version__}, {jax.device_count()} simulated {jax.default_backend()} devices "
        f"on {os.cpu_count()} cores; times are medians of {args.rounds} interleaved rounds."
    )
    print("Overlap of communication with compute cannot show on shared CPU cores; bytes and")
    print("peak memory are exact, times are ratios within this run only.")
    for n in args.sizes:
        bench(n, args.rounds)


if __name__ == "__main__":
    main()
