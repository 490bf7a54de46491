"""The planner against the compiler on pipelined layouts: docs/plan.md's table, every row.

A 4-layer GPT (d_model 64, 8 heads, seq 16, vocab 64, batch 16, remat "block") is planned
on 8 simulated CPU devices and four pipelined layouts are compiled with shardkit's training
step (the Trainer with the SPMD pipeline executor, 1F1B, `residuals="recompute"`;
`Plan.verify`): data=2 stage=4 with 8 micro-batches and data=4 stage=2 with 4, each in bf16
compute (fp32 weights and Adam) and in float32, and data=2 tensor=2 stage=2 with 2
micro-batches in float32 (XLA:CPU aborts compiling its bf16 step). Printed per layout: the
relative error (predicted - compiled) / compiled of arguments, peak (arguments +
temporaries), collective bytes per kind and FLOPs; "-" where neither side has the kind, "*"
outside the bound.

Then the same for activations dominating (seq 128, batch 32, data=2 stage=4): m = 8 and 16 in
bf16, m = 16 in float32.

Run: python benchmarks/plan_pipeline.py   (under a minute)
"""

import shardkit as sk

sk.simulate_cpu_devices(8)

import jax  # noqa: E402

from shardkit.models import GPTConfig  # noqa: E402
from shardkit.plan import Transformer, evaluate, plan  # noqa: E402
from shardkit.verify import verify  # noqa: E402

CFG = GPTConfig(vocab=64, d_model=64, n_layers=4, n_heads=8, seq_len=16, remat="block")
QUANTITIES = ("arguments", "peak", "all-reduce", "collective-permute", "all-gather", "flops")
ROWS = (  # (degrees, micro-batches, precision)
    ({"data": 2, "stage": 4}, 8, "shardkit"),
    ({"data": 2, "stage": 4}, 8, "fp32"),
    ({"data": 4, "stage": 2}, 4, "shardkit"),
    ({"data": 4, "stage": 2}, 4, "fp32"),
    ({"data": 2, "tensor": 2, "stage": 2}, 2, "fp32"),
)
LONG = GPTConfig(vocab=64, d_model=64, n_layers=4, n_heads=8, seq_len=128, remat="block")
LONG_ROWS = (
    ({"data": 2, "stage": 4}, 8, "shardkit"),
    ({"data": 2, "stage": 4}, 16, "shardkit"),
    ({"data": 2, "stage": 4}, 16, "fp32"),
)


def _cell(check, quantity: str) -> str:
    try:
        row = check.row(quantity)
    except KeyError:
        return "-"
    return f"{row.error:+.1%}{'' if row.ok else '*'}"


def table(cfg: GPTConfig, batch: int, rows: tuple) -> None:
    print(
        f"\nGPT d_model={cfg.d_model} layers={cfg.n_layers} heads={cfg.n_heads} "
        f"seq={cfg.seq_len} vocab={cfg.vocab}, batch {batch}, remat block, 1F1B: (predicted - "
        "compiled) / compiled, per device per step; * = outside the bound"
    )
    head = ["layout", "m", "precision", *QUANTITIES]
    widths = [24, 2, 9, 9, 9, 10, 18, 10, 9]
    print("  ".join(h.ljust(w) if i < 3 else h.rjust(w) for i, (h, w) in
                    enumerate(zip(head, widths, strict=True))))  # fmt: skip
    for degrees, m, precision in rows:
        w = Transformer.from_gpt_config(cfg, batch=batch, precision=precision)
        c = evaluate(w, "cpu", **degrees, microbatches=m, remat="block")
        check = verify(plan(w, devices=8, hardware="cpu"), candidates=[c], quiet=True).checks[0]
        name = "bf16" if precision == "shardkit" else "float32"
        cells = [check.candidate.layout, str(m), name, *(_cell(check, q) for q in QUANTITIES)]
        print("  ".join(x.ljust(w) if i < 3 else x.rjust(w) for i, (x, w) in
                        enumerate(zip(cells, widths, strict=True))), flush=True)  # fmt: skip


def main() -> None:
    print(f"jax {jax.__version__}, {jax.device_count()} simulated CPU devices")
    table(CFG, 16, ROWS)
    table(LONG, 32, LONG_ROWS)


if __name__ == "__main__":
    main()
