"""Training traffic at its lower bound: bytes each device sends per compiled step
(`measure_gpt`, through `shardkit.inspect`, loop bodies times their trip counts) against
`traffic_lower_bound`, at 1 and 4 micro-batches.

CPU normalisation (`measure_gpt`): an all-reduce XLA:CPU emits where a GPU emits a
reduce-scatter (over "fsdp", or over "tensor" under sequence parallelism) counts as one.
Everything is float32, so XLA:CPU's upcast of bf16 collectives does not enter.
"""

import pytest

from shardkit.models import GPTConfig
from shardkit.strategies import FSDP, DataParallel, Hybrid, Pipeline, TensorParallel
from shardkit.verify import measure_gpt
from shardkit.verify.bounds import traffic_lower_bound

CFG = GPTConfig(vocab=16, d_model=64, n_layers=2, n_heads=8, seq_len=32)
BATCH = 32
SP = {"sequence_parallel": True}
OVERLAP = {"sequence_parallel": True, "collective_matmul": True}
STRATEGIES = {
    "dp": DataParallel(),
    "zero1": FSDP(zero=1),
    "zero3": FSDP(),
    "tp+sp": TensorParallel(**SP),
    "tp+sp+overlap": TensorParallel(**OVERLAP),
    "hybrid-data2-tensor4+sp": Hybrid(data=2, tensor=4, **SP),
    "hybrid-data2-tensor4+sp+overlap": Hybrid(data=2, tensor=4, **OVERLAP),
    "hybrid-data2-fsdp2-tensor2-zero1+sp": Hybrid(data=2, fsdp=2, tensor=2, zero=1, **SP),
    "hybrid-fsdp2-tensor4+sp+overlap": Hybrid(fsdp=2, tensor=4, **OVERLAP),
    "hybrid-data2-fsdp2-tensor2-zero1+sp+overlap": Hybrid(data=2, fsdp=2, tensor=2, zero=1,
                                                          **OVERLAP),
}  # fmt: skip


@pytest.mark.parametrize("micro", [1, 4])
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_compiled_bytes_are_within_5_percent_of_the_lower_bound(name, micro):
    strategy = STRATEGIES[name]
    got = measure_gpt(CFG, strategy, devices=8, batch=BATCH, grad_accum=micro,
                      precision="float32")  # fmt: skip
    sent = sum(v["bytes"] for v in got.collectives.values())
    bound = traffic_lower_bound(CFG, strategy, devices=8, batch=BATCH, grad_accum=micro)
    # far below would mean the bound counts what the step need not send (ZeRO-3 at 4
    # micro-batches is 0.985: XLA gathers a few small parameters once, not per micro-batch)
    assert 0.95 <= sent / bound["total"] <= 1.05, (sent, bound, got.collectives)


def test_the_bound_counts_what_each_layout_must_send():
    tp = traffic_lower_bound(CFG, TensorParallel(), devices=8, batch=BATCH)
    act = BATCH * CFG.seq_len * CFG.d_model * 4
    # 8 ring-passes of an activation per block; the head 2; the 16 x 64 table gathered
    # (3.5 KiB) instead of reducing the embedding's output (448 KiB)
    assert tp["activations"] == pytest.approx(7 / 8 * (8 * 2 * act + 2 * act + 16 * 64 * 4))
    assert tp["gradients"] == 0
    zero3 = traffic_lower_bound(CFG, FSDP(), devices=8, batch=BATCH, grad_accum=4)
    assert zero3["parameters"] == pytest.approx(4 * 7 / 8 * 4 * CFG.n_params())
    with pytest.raises(ValueError, match="pipeline"):
        traffic_lower_bound(CFG, Hybrid(data=4, pipeline=Pipeline(stages=2)), devices=8,
                            batch=BATCH)  # fmt: skip
