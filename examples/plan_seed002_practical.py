"""Seed 002's practical examples, planned with corrected memory numbers.

Seed 002 counts 12 GB for a 1B-parameter model trained with AdamW ("Model 2 GB, Gradients
2 GB, Optimizer 4 GB, Activations 4 GB"). Mixed-precision Adam keeps bf16 weights and
gradients plus fp32 master weights, momentum and variance: 2 + 2 + 12 = 16 bytes per parameter,
16 GB before any activation (ZeRO, arXiv:1910.02054). Its three examples, planned by
`shardkit.plan` for 80 GB GPUs:

1. ResNet-50 (25.6M parameters) on 8 GPUs, batch 256: the state is 0.4 GB, not "100 MB";
   every layout is compute-bound, plain data parallelism among them.
2. GPT-2 1.5B on 4 GPUs, batch 64: 1.5B parameters are 3 GB in fp16 (not 6) and 25 GB of
   training state. The seed's "model parallel" picture splits layers across GPUs, i.e. a
   4-stage pipeline; Megatron tensor parallelism cannot split GPT-2's 25 heads 4 ways. ZeRO
   over the 4 GPUs is faster than either.
3. GPT-3 175B, batch 1536: "64 nodes of data parallelism x TP8 x PP16" matches no published
   run. Megatron-LM's GPT-3 script uses TP8 x PP16, so on 1,024 A100s data parallelism is 8;
   with Megatron's 18 B/param and no optimizer sharding it is among the planner's top rows.

Run: python examples/plan_seed002_practical.py

Expected output:
1B params, mixed-precision Adam: weights 2.0 + grads 2.0 + optimizer 12.0 = 16.0 GB (seed: 12)
resnet50 on 8 x a100, batch 256
  best fsdp=8: 0.1 GB state/device, peak 1.8 GB, MFU 60%
  data=8 (the seed's choice): rank 7, 0.4 GB state/device, step +7%
gpt2-1.5b on 4 x a100, batch 64
  best fsdp=4: 6.2 GB state/device, peak 53.1 GB, MFU 61%
  stage=4 (the seed's choice): rank 8, 7.2 GB state/device, step +19%
  tensor=4 is no layout: tensor parallelism splits the 25 heads, 25 % 4 > 0
gpt3-175b on 1024 x a100, batch 1536
  best stage=16 data=8 tensor=8: 26.3 GB state/device, peak 64.1 GB, MFU 46%
  stage=16 data=8 tensor=8 (the seed's choice): rank 1, 26.3 GB state/device, step +0%
  bubble with 192 micro-batches of 1 on 16 stages: 7.2% (the seed's (m-p+1)/m would say 7.8%)
"""

from shardkit.plan import model_state_bytes, plan, preset
from shardkit.plan.memory import bubble_fraction


def _state(c) -> float:
    return (c.param_bytes + c.grad_bytes + c.opt_bytes) / 1e9


def show(workload, devices, hardware, seed_layout, **kwargs):
    p = plan(workload, devices=devices, hardware=hardware, **kwargs)
    best = p.best
    print(f"{p.workload.name} on {devices} x {hardware}, batch {p.workload.batch}")
    print(
        f"  best {best.layout}: {_state(best):.1f} GB state/device, peak "
        f"{best.peak_bytes / 1e9:.1f} GB, MFU {best.mfu:.0%}"
    )
    seed = p.find(**seed_layout)
    print(
        f"  {seed.layout} (the seed's choice): rank {p.rank(seed)}, {_state(seed):.1f} GB "
        f"state/device, step {seed.step_time / best.step_time - 1:+.0%}"
    )
    return seed


def main() -> None:
    s = model_state_bytes(1e9, zero=0, shards=1, precision="mixed")
    print(
        f"1B params, mixed-precision Adam: weights {s.params / 1e9:.1f} + grads "
        f"{s.grads / 1e9:.1f} + optimizer {s.optimizer / 1e9:.1f} = {s.total / 1e9:.1f} GB "
        "(seed: 12)"
    )
    show("resnet50", 8, "a100", {"data": 8}, batch=256)
    show("gpt2-1.5b", 4, "a100", {"stage": 4}, batch=64)
    heads = preset("gpt2-1.5b").heads
    print(f"  tensor=4 is no layout: tensor parallelism splits the {heads} heads, {heads} % 4 > 0")
    gpt3 = preset("gpt3-175b", precision="megatron")
    seed = show(gpt3, 1024, "a100", {"data": 8, "tensor": 8, "stage": 16}, batch=1536, zero=())
    m, stages = seed.microbatches, seed.stage
    print(
        f"  bubble with {m} micro-batches of {seed.micro_batch} on {stages} stages: "
        f"{bubble_fraction(stages, m):.1%} (the seed's (m-p+1)/m would say "
        f"{1 - (m - stages + 1) / m:.1%})"
    )


if __name__ == "__main__":
    main()
