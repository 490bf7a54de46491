"""Benchmark: pipeline schedules side by side at p = 4 stages (shardkit.pipeline).

For each micro-batch count m and each schedule (GPipe by autodiff, with and without remat; the
GPipe table; fused and plain 1F1B; interleaved v=2; ZB-H1; each table schedule with recomputed
and with stashed residuals) one compiled program runs the same model (8 residual-MLP blocks
cut into p * v stages, a mean-squared-error head) in interleaved rounds, so drift in machine
load hits all of them alike. Printed per row:

  step      median step time over rounds, and the median over rounds of its ratio to the
            non-pipelined step (the sequential reference on one device) and to GPipe by
            autodiff timed in the same round (so drift in machine load cancels);
  temp      per-device temporaries from ``memory_analysis()`` (``input_grad=False``: the
            m-sized input cotangent is left out, so the row shows the schedule's own memory);
  steps     lockstep steps the program scans over;
  bubble    the event simulator's bubble (t_f = 1, t_b = 2; for ZB-H1 t_b = t_w = 1) next to
            the step table's idle fraction (every op one unit).

The 4 stages are simulated devices sharing this machine's CPU cores: step times are ratios
within one run (per-step overhead and FLOPs, not bubbles, dominate on CPU); memory and step
counts are exact.

Run: ``python benchmarks/pipeline.py [--micro 8 16 32] [--rounds 5] [--width 256]
[--only 'zb-h1' '1f1b stash']``.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from shardkit.pipeline import (  # noqa: E402
    Costs,
    GPipe,
    Interleaved,
    OneFOneB,
    ZeroBubbleH1,
    gpipe_value_and_grad,
    pipeline_value_and_grad,
    reference_value_and_grad,
    simulate,
    table,
)

P_STAGES = 4


LAYERS = 8  # every schedule runs the same 8 blocks: 2 per stage, or 1 per interleaved chunk


def stage_fn(w, x):
    """The stage's residual MLP blocks x + gelu(x @ w1) @ w2, scanned over its layers."""

    def block(h, wl):
        return h + jax.nn.gelu(h @ wl["w1"]) @ wl["w2"], None

    return jax.lax.scan(block, x, w)[0]


def last_fn(_, y, t):
    return jnp.mean((y - t) ** 2)


def params(rng, S, D):
    """Weights of LAYERS blocks as S stages of LAYERS // S blocks: [S, LAYERS // S, ...]."""

    def normal(*shape):
        w = rng.standard_normal((LAYERS, *shape)) / np.sqrt(shape[0])
        return jnp.asarray(w.reshape(S, LAYERS // S, *shape), jnp.float32)

    return {"w1": normal(D, 2 * D), "w2": normal(2 * D, D)}


def configs():
    """(label, schedule or None for autodiff, residuals, remat)."""
    out = [("gpipe autodiff", None, None, False), ("gpipe autodiff+remat", None, None, True)]
    schedules = (GPipe(), OneFOneB(), OneFOneB(fused=False), Interleaved(v=2), ZeroBubbleH1(),
                 ZeroBubbleH1(fused=True))  # fmt: skip
    for sched in schedules:
        for res in ("recompute", "stash"):
            out.append((f"{sched.name} {res}", sched, res, False))
    return out


def build(mesh, label, sched, res, remat, m):
    if sched is None:
        return gpipe_value_and_grad(
            stage_fn, last_fn, mesh=mesh, microbatches=m, remat=remat, input_grad=False
        )
    return pipeline_value_and_grad(
        stage_fn,
        last_fn,
        mesh=mesh,
        schedule=sched,
        microbatches=m,
        residuals=res,
        input_grad=False,
    )


def bubbles(sched, m):
    if sched is None:
        sched = GPipe()
    costs = Costs(1.0, 1.0, 1.0) if isinstance(sched, ZeroBubbleH1) else Costs(1.0, 2.0)
    sim = simulate(sched, P_STAGES, m, costs=costs).bubble
    return sim, table(sched, P_STAGES, m).idle_fraction


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--micro", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--width", type=int, default=256, help="model width D (hidden 2D)")
    ap.add_argument("--batch", type=int, default=64, help="micro-batch size")
    ap.add_argument(
        "--only",
        nargs="+",
        default=None,
        help="run only rows whose label contains one of these (GPipe by autodiff "
        "and the reference always run), e.g. --only 'zb-h1 stash' '1f1b stash'",
    )
    args = ap.parse_args()
    p, D, MB = P_STAGES, args.width, args.batch
    mesh = jax.make_mesh((p,), ("stage",), axis_types=(jax.sharding.AxisType.Auto,))
    print(f"p={p}, {LAYERS} blocks, D={D}, hidden={2 * D}, micro-batch={MB}, rounds={args.rounds}, "
          f"{jax.device_count()} simulated CPU devices")  # fmt: skip
    for m in args.micro:
        rng = np.random.default_rng(0)
        xs = jnp.asarray(rng.standard_normal((m, MB, D)), jnp.float32)
        ts = jnp.asarray(rng.standard_normal((m, MB, D)), jnp.float32)

        runs = {}
        for label, sched, res, remat in configs():
            if args.only and label != "gpipe autodiff" and not any(o in label for o in args.only):
                continue
            v = 1 if sched is None else sched.virtual
            if sched is not None:
                try:
                    sched.check(p, m)
                except ValueError:
                    continue
            w = params(rng, p * v, D)
            w = jax.tree.map(lambda a: jax.device_put(a, NamedSharding(mesh, P("stage"))), w)
            f = build(mesh, label, sched, res, remat, m)
            compiled = jax.jit(f).lower(w, None, xs, ts).compile()
            temp = compiled.memory_analysis().temp_size_in_bytes
            runs[label] = (compiled, (w, None, xs, ts), temp, f.steps, sched)
        w1 = jax.device_put(params(rng, p, D), jax.devices()[0])
        ref = jax.jit(reference_value_and_grad(stage_fn, last_fn)).lower(w1, None, xs, ts)
        runs["reference (1 device)"] = (ref.compile(), (w1, None, xs, ts), None, None, None)
        times = {k: [] for k in runs}
        for compiled, a, *_ in runs.values():
            jax.block_until_ready(compiled(*a))  # warm up
        for _ in range(args.rounds):
            for k, (compiled, a, *_) in runs.items():
                t0 = time.perf_counter()
                jax.block_until_ready(compiled(*a))
                times[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        ref_k, ad_k = "reference (1 device)", "gpipe autodiff"

        def ratio(k, base, times=times):  # median of per-round ratios: load drift cancels
            return statistics.median(a / b for a, b in zip(times[k], times[base], strict=True))

        print(f"\nm = {m}")
        print(f"{'schedule':<26}{'step ms':>9}{'/ref':>7}{'/AD':>7}{'temp MiB':>10}"
              f"{'steps':>7}{'sim bubble':>12}{'table idle':>12}")  # fmt: skip
        for k, (_, _, temp, steps, sched) in runs.items():
            head = f"{k:<26}{med[k] * 1e3:>9.1f}{ratio(k, ref_k):>7.2f}{ratio(k, ad_k):>7.2f}"
            if temp is None:
                print(head)
                continue
            sim, idle = bubbles(sched, m)
            print(f"{head}{temp / 2**20:>10.2f}{steps:>7}{sim:>12.3f}{idle:>12.3f}")


if __name__ == "__main__":
    main()
