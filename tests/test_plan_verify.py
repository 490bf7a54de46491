"""The planner checked against the compiler: `shardkit.plan.measure` and `Plan.verify`.

Compiled figures come from XLA on 8 simulated CPU devices (real mesh) or an AbstractMesh;
closed-form references are computed here from parameter counts.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.collectives import KINDS
from shardkit.inspection.groups import _mesh_groups
from shardkit.models import GPTConfig
from shardkit.plan import Transformer, evaluate, plan, preset
from shardkit.plan.hardware import bf16_dot_dtype
from shardkit.plan.measure import measure, measure_gpt
from shardkit.plan.verify import verify
from shardkit.strategies import Hybrid

CFG = GPTConfig(vocab=64, d_model=64, n_layers=2, n_heads=8, seq_len=16, remat="block")
BATCH = 16
PSI = CFG.n_params()
LAYOUTS = (dict(data=8), dict(fsdp=8), dict(tensor=8), dict(data=2, fsdp=2, tensor=2))


@pytest.fixture(scope="module")
def verification():
    """Plan.verify of shardkit's GPT (bf16 compute, fp32 Adam) for DP, FSDP, TP and hybrid."""
    p = plan(Transformer.from_gpt_config(CFG, batch=BATCH), devices=8, hardware="cpu")
    layouts = [p.find(**degrees, zero=3 if "fsdp" in degrees else None) for degrees in LAYOUTS]
    assert all(c is not None and c.remat == "block" for c in layouts), layouts
    return verify(p, candidates=layouts, quiet=True)


def check_of(verification, **degrees):
    want = {"data": 1, "fsdp": 1, "tensor": 1} | degrees
    return next(c for c in verification.checks if all(getattr(c.candidate, k) == v
                                                      for k, v in want.items()))  # fmt: skip


def test_generic_measure_on_abstract_mesh_beyond_present_devices():
    n = 512
    mesh = AbstractMesh((n,), ("data",))
    x = jax.ShapeDtypeStruct((1024, 64), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    w = jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=NamedSharding(mesh, P()))
    m = measure(jax.jit(lambda x, w: (x @ w).sum()), x, w, mesh=mesh)
    assert m.abstract and m.mesh == {"data": n}
    assert m.argument_bytes == 1024 * 64 * 4 // n + 64 * 32 * 4
    ar = m.collectives["all-reduce"]
    assert ar["count"] == 1
    assert ar["bytes"] == pytest.approx(2 * (n - 1) / n * 4)  # one f32 scalar, ring all-reduce
    assert m.flops == 2 * (1024 // n) * 64 * 32  # the local matmul
    assert json.loads(json.dumps(m.to_dict()))["peak_bytes"] == m.peak_bytes


def test_matmul_flops_count_every_scanned_layer():
    # cost_analysis() counts a loop body once; measure multiplies by the trip count
    def step(x, ws):
        return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0].sum()

    mesh = AbstractMesh((2,), ("data",))
    x = jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    for layers in (3, 6):
        ws = jax.ShapeDtypeStruct((layers, 16, 16), jnp.float32, sharding=NamedSharding(mesh, P()))
        m = measure(jax.jit(step), x, ws, mesh=mesh)
        assert m.flops == layers * 2 * 4 * 16 * 16


def test_generic_measure_rejects_a_non_mesh():
    with pytest.raises(ValueError, match=r"Mesh or AbstractMesh.*fix: mesh="):
        measure(jax.jit(lambda x: x), jnp.ones(3), mesh={"data": 8})


def test_generic_measure_refuses_arguments_laid_out_on_another_mesh():
    mesh = AbstractMesh((4, 2), ("data", "model"))
    other = AbstractMesh((8,), ("d",))
    w = jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=NamedSharding(mesh, P()))
    x = jax.ShapeDtypeStruct((128, 64), jnp.float32, sharding=NamedSharding(other, P("d")))
    with pytest.raises(ValueError, match=r"args\[1\]\['x'\].*\(d=8\).*\(data=4, model=2\).*fix:"):
        measure(jax.jit(lambda w, t: (t["x"] @ w).sum()), w, {"x": x}, mesh=mesh)


@pytest.mark.parametrize("zero_axis", ["fsdp", ("data", "nope")])
def test_generic_measure_refuses_a_zero_axis_the_mesh_lacks(zero_axis):
    mesh = AbstractMesh((4, 2), ("data", "model"))
    x = jax.ShapeDtypeStruct((128, 64), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    match = r"zero_axis=.*not an axis of the mesh \(data=4, model=2\).*fix:"
    with pytest.raises(ValueError, match=match):
        measure(jax.jit(lambda x: x.sum()), x, mesh=mesh, zero_axis=zero_axis)


def test_measure_gpt_asks_for_abstract_beyond_present_devices():
    with pytest.raises(ValueError, match=r"only 8 devices are present; fix: abstract=True"):
        measure_gpt(CFG, Hybrid(data=16), devices=16, batch=16, abstract=False)


def test_measure_gpt_rejects_an_indivisible_batch():
    with pytest.raises(ValueError, match=r"batch=12\) does not divide .* fix: batch=8"):
        measure_gpt(CFG, Hybrid(data=8), devices=8, batch=12)


def test_data_parallel_gradient_all_reduce_is_the_ring_bound_in_bf16(verification):
    # DP: one all-reduce of every gradient, 2(n-1)/n x 2 bytes x params, once XLA:CPU's f32
    # upcast is undone (4 bytes as compiled); plus a few f32 scalars of the loss and metrics.
    m = check_of(verification, data=8).measurement
    ar = m.collectives["all-reduce"]
    assert ar["bytes"] == pytest.approx(2 * 7 / 8 * 2 * PSI, rel=1e-4)
    assert ar["raw_bytes"] == pytest.approx(2 * 7 / 8 * 4 * PSI, rel=1e-4)
    assert any("f32 on bf16" in n for n in m.notes)
    # arguments: fp32 weights, Adam m and v (12 bytes per parameter), step counters, the batch
    assert m.argument_bytes == 12 * PSI + 4 + 4 + 12 * BATCH * CFG.seq_len // 8


def test_fsdp_gradients_count_as_a_reduce_scatter(verification):
    m = check_of(verification, fsdp=8).measurement
    rs = m.collectives["reduce-scatter"]
    assert rs["bytes"] == pytest.approx(7 / 8 * 2 * PSI, rel=1e-4)  # bf16 grads, ZeRO-3
    assert m.collectives["all-reduce"]["bytes"] < 1e-3 * rs["bytes"]  # only the loss scalar
    assert any("reduce-scatter" in n for n in m.notes)
    dp = check_of(verification, data=8).measurement
    assert m.argument_bytes < dp.argument_bytes / 7  # state split 8 ways


def test_abstract_mesh_compiles_the_same_program_as_the_real_mesh(verification):
    real = check_of(verification, data=2, fsdp=2, tensor=2).measurement
    strategy = Hybrid(data=2, fsdp=2, tensor=2)
    abstract = measure_gpt(CFG, strategy, devices=8, batch=BATCH, abstract=True)
    assert (real.abstract, abstract.abstract) == (False, True)
    for field in ("argument_bytes", "temp_bytes", "output_bytes", "flops", "collectives"):
        assert getattr(real, field) == getattr(abstract, field), field


def test_iota_device_ids_of_3d_mesh_groups_decode():
    # XLA prints mesh groups of a make_mesh 3-D mesh with device ids as a transposed iota
    spec = "mesh['a'=1,'b'=2,'c'=4], device_ids=([2,2,2]T(1,0,2)) {'b'}"
    ids = np.arange(8).reshape(2, 2, 2).transpose(1, 0, 2).reshape(-1)
    want = [sorted([int(ids[c]), int(ids[4 + c])]) for c in range(4)]
    assert sorted(sorted(g) for g in _mesh_groups(spec)) == sorted(want)


@pytest.mark.parametrize(
    "degrees", LAYOUTS, ids=lambda d: "x".join(f"{k}{v}" for k, v in d.items())
)
def test_predictions_match_the_compiler(verification, degrees):
    check = check_of(verification, **degrees)
    assert abs(check.row("arguments").error) <= 0.01
    assert abs(check.row("flops").error) <= 0.05
    judged = [r for r in check.rows if r.quantity in ("all-gather", "reduce-scatter",
                                                       "all-reduce", "collectives")]  # fmt: skip
    assert judged and all(abs(r.error) <= 0.05 for r in judged if r.bound), judged


@pytest.mark.parametrize(
    "degrees", LAYOUTS, ids=lambda d: "x".join(f"{k}{v}" for k, v in d.items())
)
def test_peak_memory_within_15_percent(verification, degrees):
    # predicted with XLA:CPU's habits (Hardware("cpu"): bf16 matmul outputs and activations
    # kept in f32), the stash plus the larger of the loss phase and one block's backward
    # working set (+ one partial-sum input gradient under tensor parallelism)
    assert abs(check_of(verification, **degrees).row("peak").error) <= 0.15


def test_verify_predicts_memory_with_the_compiling_backends_habits(verification, monkeypatch):
    # a plan for H100s ranks with bf16 activations; verify predicts what XLA:CPU compiles
    # (get_hardware("cpu"): its habits for the running jaxlib, `cpu_habits`), here for the
    # tensor=8 layout whose compiled measurement the module already holds
    import shardkit.plan.measure as measure_module

    compiled = check_of(verification, tensor=8).measurement
    monkeypatch.setattr(measure_module, "measure_gpt", lambda *a, **k: compiled)
    w = Transformer.from_gpt_config(CFG, batch=BATCH)
    target_plan = plan(w, devices=8, hardware="h100")
    target = target_plan.find(tensor=8)
    check = verify(target_plan, candidates=[target], quiet=True).checks[0]
    on_cpu = evaluate(w, "cpu", tensor=8, remat="block")
    assert target.remat == "block" and target.activation_bytes > 0
    assert check.predicted.peak_bytes == pytest.approx(on_cpu.peak_bytes)
    if bf16_dot_dtype() == "f32":
        # XLA:CPU runs bf16 matmuls in f32 (jaxlib 0.10): block inputs, residual stream and
        # norms in f32 (x 2); the MLP hidden of the backward working set stays bf16 but for
        # the GELU input: 3 x 2 + 4 bytes where a GPU keeps 4 x 2
        tok_f = BATCH * CFG.seq_len * CFG.ff / 8
        upcast = 2 * target.activation_bytes - (16 - 10) * tok_f
    else:
        # bf16 matmuls in bf16 (jaxlib 0.12): activations as a GPU keeps them, but for both
        # norms' inputs in f32 (2 x 2 extra bytes per b x s x h element)
        upcast = target.activation_bytes + 2 * (4 - 2) * BATCH * CFG.seq_len * CFG.d_model
    assert check.predicted.activation_bytes == pytest.approx(upcast)
    assert abs(check.row("peak").error) <= 0.15


@pytest.mark.parametrize(
    "precision, batch, degrees",
    [("fp32", 16, {"fsdp": 8}), ("shardkit", 64, {"fsdp": 8}), ("fp32", 256, {"tensor": 8})],
    ids=["fp32-fsdp8-batch16", "bf16-fsdp8-batch64", "fp32-tensor8-batch256"],
)
def test_peak_within_15_percent_at_the_mechanisms_extremes(precision, batch, degrees):
    # fp32 fsdp=8, batch 16: gathered weights are most of the temporaries; XLA:CPU runs the
    # all-gathers synchronously and holds one block's weights (+ the MLP-up kernel's full
    # gradient in the MLP-down kernel's place), not two blocks (was +35%). bf16 fsdp=8,
    # batch 64: the MLP hidden of the block-backward working set is bf16 on XLA:CPU but for
    # the GELU input (was +16%). fp32 tensor=8, batch 256: b x s = 4,096 rows per norm, so the
    # norms' backward reductions run as YNNPACK fusions and their broadcast factors are
    # materialised (was -20%).
    w = Transformer.from_gpt_config(CFG, batch=batch).replace(precision=precision)
    p = plan(w, devices=8, hardware="cpu")
    zero = 3 if "fsdp" in degrees else None
    check = verify(p, candidates=[p.find(**degrees, zero=zero, remat="block")], quiet=True)
    check = check.checks[0]
    assert abs(check.row("arguments").error) <= 0.01
    assert abs(check.row("peak").error) <= 0.15, check.row("peak")


def test_gathered_weights_one_block_in_f32_on_cpu_two_blocks_on_gpu():
    # closed form: a ZeRO-3 block's weights (matmul kernels + 2 norms) and the untied
    # embedding and head, gathered whole; GPU/TPU: 2 blocks at 2 bytes (the next prefetched),
    # XLA:CPU: 1 block at 4 bytes (synchronous all-gathers; in f32 with f32 matmuls, jaxlib
    # 0.10; with bf16 matmuls, jaxlib 0.12, gathered in bf16 but the block's f32 weight
    # gradients take their place: 4 bytes on both)
    w = Transformer.from_gpt_config(CFG, batch=BATCH)
    d, f, v = CFG.d_model, CFG.ff, CFG.vocab
    block, tables = 4 * d * d + 2 * d * f + 2 * d, 2 * v * d
    cast = PSI / 8 * 2  # the local fp32 shard cast to bf16
    gpu = evaluate(w, "h100", fsdp=8, zero=3, remat="block")
    cpu = evaluate(w, "cpu", fsdp=8, zero=3, remat="block")
    assert gpu.gathered_bytes == pytest.approx((2 * block + tables) * 2 + cast)
    assert cpu.gathered_bytes == pytest.approx((block + tables) * 4 + cast)


def test_norm_broadcasts_counted_from_4096_rows_on_cpu_only():
    # activations are linear in the batch but for XLA:CPU's YNNPACK norm reductions: from
    # b x s = 4,096 rows per device, 2 norms x 2 broadcast factors of b x s x h in f32
    def acts(batch, hardware):
        w = Transformer.from_gpt_config(CFG, batch=batch).replace(precision="fp32")
        return evaluate(w, hardware, tensor=8, remat="block").activation_bytes

    rows = 256 * CFG.seq_len
    for hardware, extra in (("cpu", 2 * 2 * 4 * rows * CFG.d_model), ("h100", 0)):
        assert acts(256, hardware) - acts(192, hardware) * 256 / 192 == pytest.approx(extra)


def test_verify_prints_predicted_next_to_compiled_and_says_what_it_normalised(verification):
    text = verification.render()
    assert "predicted vs compiled (XLA:CPU)" in text
    assert text.count("arguments") == len(LAYOUTS)
    assert "f32 upcast of bf16" in text and "all-reduce-then-slice" in text
    assert "simulated mesh of data=2 x fsdp=2 x tensor=2" in text
    assert "activation_upcast" in text
    errors = json.loads(json.dumps(verification.to_dict()))["max_errors"]
    assert errors["arguments"] <= 0.01 and errors["flops"] <= 0.05


def test_verify_rejects_a_workload_without_a_model():
    with pytest.raises(TypeError, match=r"Dense with no model to compile; fix: .*measure\("):
        verify(plan("resnet50", devices=8, hardware="h100", batch=64), quiet=True)


def test_verify_rejects_only_prediction_rows():
    p = plan(Transformer.from_gpt_config(CFG, batch=BATCH), devices=8, hardware="cpu")
    fsdp_in_stages = [c for c in p.candidates if c.stage > 1 and c.fsdp > 1][:1]
    assert fsdp_in_stages and not fsdp_in_stages[0].runnable
    with pytest.raises(ValueError, match=r"all are predictions only .* fix: plan with zero=\(\)"):
        verify(p, candidates=fsdp_in_stages, quiet=True)


def test_train_strategy_auto_trains_the_planners_top_layout():
    from shardkit.train.config import TrainConfig
    from shardkit.train.data import ReverseTask
    from shardkit.train.run import auto_plan, build_trainer, model_config, plan_rows, runnable_best

    cfg = TrainConfig(steps=2, batch=16)
    devices = jax.devices()[:8]
    planned = auto_plan(cfg, model_config(cfg, ReverseTask(digits=15, length=8)), devices)
    assert planned.hardware.name == "cpu" and planned.devices == 8
    assert planned.best is runnable_best(planned)  # pipelines compete; none wins here
    trainer, _, _ = build_trainer(cfg, devices, planned=planned)
    assert trainer.strategy == planned.best.strategy()
    assert dict(trainer.mesh.shape) == planned.best.mesh_axes
    assert trainer.strategy_reason == planned.why()
    rows = plan_rows(planned)
    assert len(rows) == 3 and rows[0].startswith(planned.best.layout + ", remat=none")


def test_train_strategy_auto_needs_a_hardware_profile():
    from types import SimpleNamespace

    from shardkit.train.run import hardware_profile

    gpu = SimpleNamespace(platform="gpu", device_kind="NVIDIA H100 80GB HBM3")
    assert hardware_profile([gpu]) == "h100"
    odd = SimpleNamespace(platform="gpu", device_kind="Quantum Widget 9000")
    with pytest.raises(ValueError, match=r"no hardware profile for 'Quantum Widget 9000'; fix:"):
        hardware_profile([odd])


def test_cli_plan_verify_json_is_one_json_document(verification, monkeypatch, capsys):
    # --verify --json prints one document holding the plan and the verification (the
    # verification is the module's compiled one, so the CLI's own compile is not repeated)
    from shardkit.cli import main
    from shardkit.plan import command, search

    tiny = Transformer.from_gpt_config(CFG, batch=BATCH)
    monkeypatch.setattr(command, "preset", lambda name, **changes: tiny)
    calls = []
    monkeypatch.setattr(search.Plan, "verify", lambda self, **kw: calls.append(kw) or verification)
    argv = ["plan", "--model", "tiny", "--devices", "8", "--hardware", "cpu", "--top", "2"]
    assert main([*argv, "--verify", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert calls and calls[0]["quiet"] is True
    assert len(data["candidates"]) == 2 and data["devices"] == 8
    assert data["verification"] == json.loads(json.dumps(verification.to_dict()))
    assert main([*argv, "--verify"]) == 0  # text: the table, then the verification
    out = capsys.readouterr().out
    assert out.index("Why:") < out.index("predicted vs compiled (XLA:CPU)")


def test_cli_plan_verify_exits_1_when_a_quantity_is_out_of_bounds(verification, monkeypatch,
                                                                 capsys):  # fmt: skip
    from types import SimpleNamespace

    from shardkit.cli import main
    from shardkit.plan import command, search

    tiny = Transformer.from_gpt_config(CFG, batch=BATCH)
    monkeypatch.setattr(command, "preset", lambda name, **changes: tiny)
    failed = SimpleNamespace(ok=False, render=lambda: "row out of bounds", to_dict=lambda: {})
    monkeypatch.setattr(search.Plan, "verify", lambda self, **kw: failed)
    argv = ["plan", "--model", "tiny", "--devices", "8", "--hardware", "cpu", "--top", "2"]
    assert main([*argv, "--verify"]) == 1
    assert "outside its bound" in capsys.readouterr().err
    monkeypatch.setattr(search.Plan, "verify", lambda self, **kw: verification)
    assert main([*argv, "--verify"]) == (0 if verification.ok else 1)


ACCUMULATED = (dict(data=8), dict(data=2, fsdp=4), dict(data=2, fsdp=4, zero=1),
               dict(fsdp=8, zero=1), dict(data=2, tensor=4))  # fmt: skip


@pytest.mark.parametrize(
    "degrees", ACCUMULATED, ids=lambda d: "x".join(f"{k}{v}" for k, v in d.items())
)
def test_gradient_accumulation_reductions_counted_in_the_trainers_float32(degrees):
    # with 4 micro-batches the Trainer sums unreduced gradients in float32 and reduces the
    # sums once per step (the all-reduce over "data"; ZeRO-1's reduce-scatter over "fsdp",
    # compiled by XLA:CPU as an all-reduce read through a slice); the planner counts the same
    # reductions once per step on bf16 gradients
    from shardkit.verify.compare import gradient_reductions, trainer_collectives

    degrees = dict(degrees)
    zero = degrees.pop("zero", 3)
    w = Transformer.from_gpt_config(CFG, batch=2 * BATCH)
    pred = evaluate(w, "cpu", **degrees, zero=zero, microbatches=4, remat="block")
    m = measure_gpt(CFG, Hybrid(**degrees, zero=zero), devices=8, batch=2 * BATCH, grad_accum=4)
    once, counted = gradient_reductions(pred, w), trainer_collectives(pred, w)
    assert once and set(once) <= {"all-reduce", "reduce-scatter"}
    for kind, nbytes in once.items():
        compiled = m.collectives[kind]["bytes"]
        assert counted[kind] == pytest.approx(pred.collectives[kind] + nbytes)  # 4 bytes, not 2
        assert counted[kind] == pytest.approx(compiled, rel=0.01), kind
        assert pred.collectives[kind] < 0.95 * compiled  # the planner's own bytes: bf16
    single = evaluate(w, "cpu", **degrees, zero=zero, microbatches=1, remat="block")
    assert trainer_collectives(single, w) == single.collectives  # m = 1: nothing converted
    fp32 = w.replace(precision="fp32")
    assert trainer_collectives(pred, fp32) == pred.collectives  # float32: the same bytes


def test_verify_compares_the_trainers_gradient_reductions_and_says_so():
    p = plan(Transformer.from_gpt_config(CFG, batch=2 * BATCH), devices=8, hardware="cpu")
    rows = [evaluate(p.workload, "cpu", data=2, fsdp=4, zero=z, microbatches=4, remat="block")
            for z in (3, 1)]  # fmt: skip
    result = verify(p, candidates=rows, quiet=True)
    for check in result.checks:
        judged = [r for r in check.rows if r.quantity != "peak" and r.bound is not None]
        assert all(r.ok for r in judged), check.rows
    assert any("gradient accumulation (data=2 fsdp=4: m = 4, data=2 fsdp=4 (ZeRO-1): m = 4)"
               in n for n in result.notes), result.notes  # fmt: skip


def test_sequence_parallel_rows_with_micro_batches_verify_every_kind():
    # data x tensor at 4 micro-batches, bf16, remat="block": plain and with sequence
    # parallelism, every collective kind within 5%; with collective matmul the rings exactly,
    # the all-reduces and the total within 5%, and not its few all-gathers and reduce-
    # scatters (the head's and embedding's, 8% of its bytes: XLA also gathers the vocab table)
    w = Transformer.from_gpt_config(CFG, batch=2 * BATCH)
    settings = ({}, {"sequence_parallel": True},
                {"sequence_parallel": True, "collective_matmul": True})  # fmt: skip
    rows = [evaluate(w, "cpu", data=2, tensor=4, microbatches=4, remat="block", **kw)
            for kw in settings]  # fmt: skip
    assert [r.layout for r in rows] == ["data=2 tensor=4", "data=2 tensor=4 +SP",
                                        "data=2 tensor=4 +SP+CM"]  # fmt: skip
    assert rows[2].strategy().collective_matmul
    checks = verify(plan(w, devices=8, hardware="cpu"), candidates=rows, quiet=True).checks
    for check in checks:
        cm = check.candidate.collective_matmul
        for r in check.rows:
            small = cm and r.quantity in ("all-gather", "reduce-scatter")
            if r.quantity in KINDS + ("collectives",) and not small:
                assert r.compiled == pytest.approx(r.predicted, rel=0.05), (check.candidate, r)
    ring = {r.quantity: r for r in checks[2].rows}["collective-permute"]
    assert ring.compiled == pytest.approx(ring.predicted, rel=1e-6)


def test_data32_tensor8_at_8_micro_batches_verifies_every_kind():
    # llama3-8b on 256 devices (an AbstractMesh): once this verify was -13.6% on all-reduce
    # bytes, the compiled step reducing gradients once per micro-batch
    w = preset("llama3-8b", batch=512)
    p = plan(w, devices=256, hardware="h100", batch=512)
    rows = [evaluate(p.workload, "h100", data=32, tensor=8, microbatches=8, remat="block", **kw)
            for kw in ({}, {"sequence_parallel": True})]  # fmt: skip
    for check in verify(p, candidates=rows, quiet=True).checks:
        judged = [r for r in check.rows if r.quantity in KINDS + ("collectives",)]
        assert len(judged) >= 2
        for r in judged:
            assert r.compiled == pytest.approx(r.predicted, rel=0.05), (check.candidate.layout, r)


def test_verify_judges_the_peak_without_remat_at_its_bound():
    # remat "none" is judged at its own, wider bound (docs/plan.md, mechanism (8)): a row
    # with a bound can fail, so its prediction is a claim `verify` checks, not a printout
    from shardkit.verify import BOUNDS

    w = Transformer.from_gpt_config(dataclasses.replace(CFG, remat="none"), batch=16)
    p = plan(w, devices=8, hardware="cpu")
    check = verify(p, candidates=[p.find(data=8, remat="none")], quiet=True).checks[0]
    peak = check.row("peak")
    assert peak.bound == BOUNDS["peak_none"] == 0.20
    assert peak.ok, peak
    p = plan(Transformer.from_gpt_config(CFG, batch=16), devices=8, hardware="cpu")
    block = verify(p, candidates=[p.find(data=8, remat="block")], quiet=True).checks[0]
    assert block.row("peak").bound == BOUNDS["peak"] == 0.15
