"""The peak-memory model against XLA:CPU over a grid of small GPTs on 8 simulated devices.

For shardkit's GPT (vocab 64, d_model 64, 8 heads, seq 16, scanned blocks) and every point of
precision {shardkit (bf16 compute, fp32 weights), fp32} x layout {data=8, fsdp=8 (ZeRO-3),
tensor=8, data=2 fsdp=2 tensor=2} x batch {16, 64, 256} x layers {2, 8} under remat "block"
(and "dots" at batch 16 and 64 with --dots), the training step is compiled (memory only, no
collectives read) and the predicted peak (arguments + temporaries, `Plan.verify`'s figure) is
printed next to the compiled one with the relative error (predicted - compiled) / compiled.
The predicted breakdown in KiB (activations: stash + block-backward working set; the loss
phase beyond it; gathered weights; gradients) is shown per point.

Compiled figures are cached in a JSON file (--cache) so the model can be re-evaluated
against them without compiling again (--no-compile uses the cache only).

Run: python benchmarks/plan_peak.py [--dots] [--cache /tmp/plan_peak.json]
"""

import argparse
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

from shardkit.models import GPTConfig  # noqa: E402
from shardkit.plan import Transformer, evaluate  # noqa: E402
from shardkit.plan.hardware import get_hardware  # noqa: E402
from shardkit.verify import BOUNDS, measure_gpt  # noqa: E402

LAYOUTS = ({"data": 8}, {"fsdp": 8}, {"tensor": 8}, {"data": 2, "fsdp": 2, "tensor": 2})
PRECISIONS = ("shardkit", "fp32")


def grid(dots: bool) -> list[tuple[str, str, int, int, dict[str, int]]]:
    """(precision, remat, batch, layers, layout) points."""
    points = [
        (p, "block", b, n, lay)
        for p in PRECISIONS
        for lay in LAYOUTS
        for b in (16, 64, 256)
        for n in (2, 8)
    ]
    if dots:
        points += [
            (p, "dots", b, n, lay)
            for p in PRECISIONS
            for lay in LAYOUTS
            for b in (16, 64)
            for n in (2, 8)
        ]
    return points


def config(layers: int, remat: str) -> GPTConfig:
    return GPTConfig(vocab=64, d_model=64, n_layers=layers, n_heads=8, seq_len=16, remat=remat)


def predict(precision: str, remat: str, batch: int, layers: int, layout: dict[str, int]):
    """The `Candidate` `Plan.verify` compares for this point (CPU habits, ZeRO-3 with fsdp)."""
    w = Transformer.from_gpt_config(config(layers, remat), batch=batch, precision=precision)
    cpu = get_hardware("cpu")
    return evaluate(w, cpu, remat=remat, zero=3, dot_bytes=cpu.dot_output_bytes, **layout)


def key(precision, remat, batch, layers, layout) -> str:
    lay = " ".join(f"{k}={v}" for k, v in layout.items())
    return f"{precision}|{remat}|{batch}|{layers}|{lay}"


def compiled_peak(point, cache: dict, compile_: bool) -> float | None:
    k = key(*point)
    if k not in cache and compile_:
        precision, remat, batch, layers, layout = point
        c = predict(*point)
        m = measure_gpt(config(layers, remat), c.strategy(), devices=8, batch=batch,
                        precision="float32" if precision == "fp32" else "bfloat16",
                        abstract=False, inspect_text=False)  # fmt: skip
        cache[k] = {"peak": m.peak_bytes, "arguments": m.argument_bytes, "temps": m.temp_bytes}
    return cache.get(k, {}).get("peak")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dots", action="store_true", help="add remat 'dots' at batch 16, 64")
    parser.add_argument("--cache", default="", help="JSON file of compiled figures")
    parser.add_argument("--no-compile", action="store_true", help="use the cache only")
    args = parser.parse_args()
    cache = {}
    if args.cache and os.path.exists(args.cache):
        with open(args.cache) as f:
            cache = json.load(f)
    print(f"jax {jax.__version__}; peak = arguments + temporaries, KiB per device")
    head = f"{'precision':9} {'remat':5} {'batch':>5} {'layers':>6} {'layout':22} "
    head += f"{'predicted':>9} {'compiled':>9} {'error':>7}  activations/loss/gathered/grads"
    print(head)
    worst = 0.0
    for point in grid(args.dots):
        c = predict(*point)
        compiled = compiled_peak(point, cache, not args.no_compile)
        if args.cache:
            with open(args.cache, "w") as f:
                json.dump(cache, f)
        precision, remat, batch, layers, layout = point
        lay = " ".join(f"{k}={v}" for k, v in layout.items())
        kib = [x / 1024 for x in (c.activation_bytes, c.logits_bytes, c.gathered_bytes,
                                  c.grad_bytes)]  # fmt: skip
        parts = "/".join(f"{x:.0f}" for x in kib)
        if compiled is None:
            print(f"{precision:9} {remat:5} {batch:5} {layers:6} {lay:22} "
                  f"{c.peak_bytes / 1024:9.0f} {'-':>9} {'-':>7}  {parts}")  # fmt: skip
            continue
        err = (c.peak_bytes - compiled) / compiled
        worst = max(worst, abs(err))
        mark = "" if abs(err) <= BOUNDS["peak"] else " *"
        print(f"{precision:9} {remat:5} {batch:5} {layers:6} {lay:22} "
              f"{c.peak_bytes / 1024:9.0f} {compiled / 1024:9.0f} {err:+7.1%}  {parts}{mark}",
              flush=True)  # fmt: skip
    verdict = "holds" if worst <= BOUNDS["peak"] else "NOT within"
    print(f"largest |peak error| {worst:.1%} (bound {BOUNDS['peak']:.0%}: {verdict})")
    sys.exit(0 if worst <= BOUNDS["peak"] else 1)


if __name__ == "__main__":
    main()
