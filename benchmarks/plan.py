"""The planner against the compiler at 256-1,024 devices, and `shardkit plan --verify` timed.

1. A small GPT (scanned blocks, d_model 1024, 8 layers, 16 heads, seq 1024, vocab 8192) is
   planned on H100s and its DP, FSDP, TP and hybrid layouts are compiled with shardkit's real
   training step (Trainer, AdamW) on an AbstractMesh of 256 and 1,024 devices (one CPU,
   nothing allocated; `Plan.verify`). For each layout the relative errors (predicted -
   compiled) / compiled are printed for: arguments, peak (arguments + temporaries), collective
   bytes per kind and in total, FLOPs. Collective bytes are compared after normalising
   XLA:CPU's habits: bf16 collectives run in f32 (counted at 2 bytes per element) and ZeRO
   gradients all-reduced then sliced (counted as the reduce-scatter GPUs and TPUs emit).
   Precisions: bf16 compute with fp32 weights and Adam (shardkit's mixed precision) and fp32;
   remat "block" everywhere, and "dots" at 1,024 devices. Memory is predicted with XLA:CPU's
   habits (`Hardware("cpu")`: bf16 matmul outputs and activations kept in f32).
2. One layout of the same GPT at 16,384 devices (data=128 fsdp=16 tensor=8), verified.
3. `shardkit plan --model gpt3-175b --devices 1024 --hardware h100 --batch 1536 --verify` in
   a fresh process, timed (target: under 2 minutes).

Run: python benchmarks/plan.py [--quick]   (--quick: 256 devices, bf16 and block only)
"""

import argparse
import os
import subprocess
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

from shardkit.models import GPTConfig  # noqa: E402
from shardkit.plan import Transformer, evaluate, plan  # noqa: E402
from shardkit.verify import BOUNDS, verify  # noqa: E402

CFG = GPTConfig(vocab=8192, d_model=1024, n_layers=8, n_heads=16, seq_len=1024)
QUANTITIES = ("arguments", "peak", "all-gather", "reduce-scatter", "all-reduce", "collectives")


def layouts(n: int) -> list[dict[str, int]]:
    """DP, FSDP, DP x TP, FSDP x TP and DP x FSDP x TP over n devices."""
    return [
        {"data": n},
        {"fsdp": n},
        {"data": n // 8, "tensor": 8},
        {"fsdp": n // 8, "tensor": 8},
        {"data": 2, "fsdp": n // 16, "tensor": 8},
    ]


def run(n: int, precision: str, remat: str) -> list:
    w = Transformer.from_gpt_config(CFG, batch=2 * n, remat=remat, precision=precision)
    p = plan(w, devices=n, hardware="h100")
    candidates = [evaluate(w, "h100", remat=remat, **deg) for deg in layouts(n)]
    return list(verify(p, candidates=candidates, quiet=True).checks)


def _cell(check, quantity: str) -> str:
    try:
        row = check.row(quantity)
    except KeyError:
        return "-"
    mark = "" if row.ok else "*"
    return f"{row.error:+.1%}{mark}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.device_count()} CPU device(s); AbstractMesh compiles")
    cases = [(256, "shardkit", "block")]
    if not args.quick:
        cases += [(256, "fp32", "block"), (1024, "shardkit", "block"), (1024, "fp32", "block")]
        cases += [(1024, "shardkit", "dots"), (1024, "fp32", "dots")]
    print(
        f"\n== GPT d_model={CFG.d_model} layers={CFG.n_layers} heads={CFG.n_heads} "
        f"seq={CFG.seq_len} vocab={CFG.vocab}, batch 2 x devices: relative error of the "
        "prediction, (predicted - compiled) / compiled, per device per step; * = outside the "
        "bound"
    )
    head = ["devices", "precision", "remat", "layout", *QUANTITIES, "flops", "compile s"]
    widths = [7, 9, 5, 26, 9, 9, 10, 14, 10, 11, 8, 9]
    print("  ".join(h.rjust(wd) if i > 3 else h.ljust(wd) for i, (h, wd) in
                    enumerate(zip(head, widths, strict=True))))  # fmt: skip
    worst: dict[str, float] = {}
    worst_by_precision: dict[tuple[str, str], float] = {}
    total_t = time.perf_counter()
    notes: list[str] = []
    for n, precision, remat in cases:
        for check in run(n, precision, remat):
            cells = [str(n), precision, remat, check.candidate.layout]
            cells += [_cell(check, q) for q in (*QUANTITIES, "flops")]
            cells.append(f"{check.measurement.compile_seconds:.1f}")
            print("  ".join(c.rjust(wd) if i > 3 else c.ljust(wd) for i, (c, wd) in
                            enumerate(zip(cells, widths, strict=True))), flush=True)  # fmt: skip
            for r in check.rows:
                key = r.quantity if r.quantity in BOUNDS else "collectives"
                if r.bound is None and key != "peak":
                    continue
                worst[key] = max(worst.get(key, 0.0), abs(r.error))
                k2 = (key, precision)
                worst_by_precision[k2] = max(worst_by_precision.get(k2, 0.0), abs(r.error))
            notes.extend(x for x in check.measurement.notes if x not in notes)
    print(f"({time.perf_counter() - total_t:.0f} s for all compiles)")
    print("\nlargest |error| per quantity (bound):")
    for key, bound in BOUNDS.items():
        per = ", ".join(
            f"{p} {worst_by_precision[(key, p)]:.1%}"
            for p in ("shardkit", "fp32")
            if (key, p) in worst_by_precision
        )
        verdict = "holds" if worst.get(key, 0.0) <= bound else "NOT within"
        print(f"  {key:<12} {worst.get(key, 0.0):6.1%}  (bound {bound:.0%}: {verdict}; {per})")
    print("collective bytes normalised for XLA:CPU: f32 upcast of bf16 collectives counted at")
    print("2 bytes per element; ZeRO gradient all-reduce + slice counted as a reduce-scatter.")

    if args.quick:
        return
    n = 16384
    w = Transformer.from_gpt_config(CFG, batch=4096, remat="block")
    print(f"\n== {n:,} devices (data=128 fsdp=16 tensor=8, remat block, bf16): Plan.verify")
    candidate = evaluate(w, "tpu-v5p", data=128, fsdp=16, tensor=8, remat="block")
    result = verify(plan(w, devices=n, hardware="tpu-v5p"), candidates=[candidate], quiet=True)
    check = result.checks[0]
    print(", ".join(f"{r.quantity} {r.error:+.1%}" for r in check.rows))
    print(
        f"compiled in {check.measurement.compile_seconds:.1f} s; verified in {result.seconds:.1f} s"
    )

    cmd = [sys.executable, "-m", "shardkit.cli", "plan", "--model", "gpt3-175b", "--devices",
           "1024", "--hardware", "h100", "--batch", "1536", "--verify"]  # fmt: skip
    print("\n== " + " ".join(["shardkit", *cmd[3:]]) + " (fresh process)")
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - t0
    tail = out.stdout.strip().splitlines()
    start = next(i for i, line in enumerate(tail) if line.startswith("verify:"))
    print("\n".join(tail[start:]))
    print(f"wall time {seconds:.1f} s (target < 120 s): {'holds' if seconds < 120 else 'NOT'}")


if __name__ == "__main__":
    main()
