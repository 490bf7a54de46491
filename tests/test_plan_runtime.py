"""Runtimes: the planner predicts other stacks' execution (pipeline, recompute, FSDP lifetime).

References: Narayanan et al. 2021 (arXiv:2104.04473) §2.2 for the asynchronous bubble
(p - 1) / (v m) and in-flight micro-batches p (1 + (p - 1) / (p v)); §5.1 for full recomputation
costing one more forward (hardware FLOPs 4/3 of the model's); PyTorch FSDP's
reshard_after_forward for weights gathered again in the backward.
"""

import pytest

from shardkit.plan import Runtime, Transformer, evaluate, get_runtime, known_runtimes, plan
from shardkit.plan.pipe import facts

W = Transformer(layers=32, d_model=4096, heads=32, vocab=51200, seq=2048, batch=512)


@pytest.mark.parametrize("p, m, v", [(4, 8, 1), (8, 64, 1), (8, 64, 4), (16, 128, 3)])
def test_async_pipeline_bubble_and_in_flight_are_megatrons(p, m, v):
    schedule = "interleaved" if v > 1 else "1f1b"
    f = facts(schedule, p, m, v, runtime="async")
    # bubble time / ideal time = (p - 1) / (v m): as a share of the step
    assert f.bubble == pytest.approx((p - 1) / (v * m) / (1 + (p - 1) / (v * m)))
    assert f.in_flight == pytest.approx(p * (1 + (p - 1) / (p * v)) if v > 1 else p)
    lock = facts(schedule, p, m, v)
    assert lock.in_flight >= f.in_flight and lock.bubble >= f.bubble - 1e-12


def test_async_1f1b_holds_p_microbatches_not_2p_minus_1():
    kw = dict(data=1, tensor=8, stage=8, microbatches=64, remat="none")
    lock = evaluate(W, "a100", **kw)
    mega = evaluate(W, "a100", runtime="megatron", **kw)
    # activations scale with micro-batches in flight: 15 (fused 1F1B) vs 8
    assert lock.activation_bytes / mega.activation_bytes == pytest.approx(15 / 8, rel=0.05)
    assert mega.bubble_time < lock.bubble_time
    assert not mega.runnable
    with pytest.raises(ValueError, match=r"'megatron' runtime's pipeline.*runtime='shardkit'"):
        mega.strategy()


def test_full_recompute_costs_four_thirds_of_the_layers_forward_and_backward():
    kw = dict(data=8, microbatches=1)
    none = evaluate(W, "a100", runtime="megatron", remat="none", **kw)
    full = evaluate(W, "a100", runtime="megatron", remat="block", **kw)
    xla = evaluate(W, "a100", remat="block", **kw)
    head = 6 * W.d_model * W.vocab * W.tokens / 8
    layers = none.flops - head
    assert full.flops - head == pytest.approx(layers * 4 / 3, rel=1e-9)
    # XLA drops the MLP-down matmul from the recomputation: less than 4/3
    assert none.flops < xla.flops < full.flops
    assert full.model_flops == none.model_flops  # MFU counts the model's FLOPs only
    assert full.hfu > full.mfu * 1.25


def test_pytorch_fsdp_gathers_again_for_the_backward_and_frees_after_the_forward():
    kw = dict(fsdp=8, remat="none", microbatches=1)
    xla = evaluate(W.replace(batch=8), "h100", **kw)
    torch = evaluate(W.replace(batch=8), "h100", runtime="torchtitan", **kw)
    assert torch.gathered_bytes < xla.gathered_bytes / 8  # 2 layers, not all 32
    assert torch.collectives["all-gather"] > 1.9 * xla.collectives["all-gather"] * 32 / 33


def test_runtime_names_and_bad_values():
    assert {"shardkit", "megatron", "torchtitan", "pytorch-fsdp", "maxtext"} <= set(
        known_runtimes()
    )
    assert get_runtime("NeMo").name == "megatron-core"
    with pytest.raises(ValueError, match=r"unknown runtime 'deepspeedy'; known: maxtext"):
        plan(W, devices=8, hardware="a100", runtime="deepspeedy")
    with pytest.raises(ValueError, match=r"pipeline='eager'; fix: 'lockstep' or 'async'"):
        Runtime(name="x", pipeline="eager")
    with pytest.raises(ValueError, match=r"tensor_overlap=2 must lie in \[0, 1\]"):
        Runtime(name="x", tensor_overlap=2)


def test_tensor_overlap_hides_tensor_traffic():
    kw = dict(data=2, tensor=4, microbatches=1, remat="none")
    plain = evaluate(W.replace(batch=16), "tpu-v5p", **kw)
    over = evaluate(W.replace(batch=16), "tpu-v5p", runtime="maxtext", **kw)
    assert over.comm_time == plain.comm_time
    assert plain.step_time - over.step_time == pytest.approx(
        0.9 * plain.comm_time["tensor"], rel=1e-6
    )


def test_cli_plans_for_a_runtime_and_shows_hfu_and_margin(capsys):
    from shardkit.cli import main

    argv = ["plan", "--model", "gpt3-175b", "--devices", "1024", "--hardware", "a100"]
    assert main([*argv, "--runtime", "megatron", "--zero", "none", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "as the megatron runtime runs them" in out and "MFU / HFU" in out
    assert "margin)" in out and "(HFU " in out
    with pytest.raises(SystemExit):
        main([*argv, "--runtime", "megatronn"])
    assert "invalid choice: 'megatronn'" in capsys.readouterr().err
