"""The planner's pipelined layouts: terms from `shardkit.pipeline`, strategies, compiled checks.

References: the pipeline package's own step tables and simulator (`table`, `simulate`), the
GPipe / 1F1B bubble (p-1)/(m+p-1), and XLA's compiled step on 8 simulated CPU devices.
"""

import jax
import pytest

from shardkit.models import GPTConfig
from shardkit.pipeline import Costs, simulate, table
from shardkit.plan import Transformer, evaluate, plan
from shardkit.plan.pipe import SCHEDULES, facts, schedule_object
from shardkit.plan.verify import verify
from shardkit.strategies import Hybrid, Pipeline
from shardkit.train.config import TrainConfig
from shardkit.train.run import _data, auto_plan, build_trainer, model_config, runnable_best

CFG = GPTConfig(vocab=64, d_model=64, n_layers=4, n_heads=8, seq_len=16, remat="block")
BATCH = 16


def grid():
    for name in SCHEDULES:
        for p in (2, 3, 4):
            for m in (p, p + 1, 2 * p, 4 * p):
                if name == "interleaved" and m % p:
                    continue
                yield name, p, m


@pytest.mark.parametrize("name", SCHEDULES)
def test_planner_in_flight_and_bubble_equal_the_pipeline_package(name):
    costs = Costs(t_f=1, t_b=1, t_w=1) if name == "zb-h1" else Costs(t_f=1, t_b=2)
    for _, p, m in (g for g in grid() if g[0] == name):
        v = 2 if name == "interleaved" else 1
        f = facts(name, p, m, v)
        sched = schedule_object(name, virtual=v)
        t = table(sched, p, m)
        assert f.steps == t.steps, (name, p, m)
        assert f.lanes == t.lanes
        assert f.in_flight_pairs == max(t.peak_in_flight), (name, p, m)
        assert f.in_flight_pairs == max(simulate(sched, p, m, costs).peak_in_flight)
        assert f.in_flight == f.in_flight_pairs / v
        assert f.bubble == pytest.approx(t.bubble(costs)), (name, p, m)
        if name in ("gpipe", "1f1b"):  # lockstep = event simulation = the closed form
            assert f.bubble == pytest.approx(simulate(sched, p, m, costs).bubble)
            assert f.bubble == pytest.approx((p - 1) / (m + p - 1))
    assert facts("1f1b", 4, 16).in_flight == 7  # fused 1F1B: 2p - 1, not textbook's p


def test_evaluate_uses_the_executor_steps_in_flight_and_bubble():
    w = Transformer.from_gpt_config(CFG, batch=BATCH)
    for name in ("gpipe", "1f1b"):
        c = evaluate(w, "cpu", data=2, stage=4, microbatches=8, remat="block", schedule=name)
        f = facts(name, 4, 8)
        act = 2 * CFG.seq_len * c.micro_batch * CFG.d_model  # one bf16 activation
        assert c.collectives["collective-permute"] == 2 * f.steps * act
        busy = c.step_time - c.bubble_time - c.exposed_comm_time - c.update_time
        assert c.bubble_time == pytest.approx(busy * f.bubble / (1 - f.bubble))
    g = evaluate(w, "cpu", data=2, stage=4, microbatches=8, remat="block", schedule="gpipe")
    o = evaluate(w, "cpu", data=2, stage=4, microbatches=8, remat="block", schedule="1f1b")
    z = evaluate(w, "cpu", data=2, stage=4, microbatches=8, remat="block", schedule="zb-h1")
    # kept activations grow with the micro-batches in flight: GPipe 8, fused 1F1B 2p - 1 = 7,
    # ZB-H1 p = 4 (the same working set on top of each)
    gap = g.activation_bytes - o.activation_bytes
    assert gap > 0 and o.activation_bytes - z.activation_bytes == pytest.approx(3 * gap)


@pytest.mark.parametrize("name", SCHEDULES)
def test_a_pipelined_row_becomes_the_pipeline_strategy(name):
    w = Transformer.from_gpt_config(CFG, batch=BATCH)
    v = 2 if name == "interleaved" else 1
    c = evaluate(w, "cpu", data=2, stage=2, microbatches=4, remat="block", schedule=name,
                 virtual=v)  # fmt: skip
    s = c.strategy()
    assert isinstance(s, Hybrid) and isinstance(s.pipeline, Pipeline)
    assert (s.data, s.fsdp, s.tensor) == (2, 1, 1)
    assert s.pipeline.stages == 2 and s.pipeline.microbatches == 4
    assert s.pipeline.schedule == schedule_object(name, virtual=v)
    assert s.pipeline.residuals == "recompute"  # remat="block": each backward reruns its stage
    assert s.mesh_axes(c.devices) == c.mesh_axes
    dots = evaluate(w, "cpu", data=2, stage=2, microbatches=4, remat="dots", schedule=name,
                    virtual=v)  # fmt: skip
    assert dots.strategy().pipeline.residuals == "stash"


def test_fsdp_inside_stages_is_a_prediction_only():
    w = Transformer.from_gpt_config(CFG, batch=BATCH)
    c = evaluate(w, "cpu", fsdp=2, stage=4, zero=1, microbatches=4, remat="block")
    assert not c.runnable
    with pytest.raises(ValueError, match=r"prediction only.*fsdp=2.*stage=4.*fix: "):
        c.strategy()


@pytest.fixture(scope="module")
def verification():
    # bf16 compute; the data x tensor x stage row compiles in float32 (XLA:CPU aborts on it
    # in bf16), which verify says in a note
    w = Transformer.from_gpt_config(CFG, batch=BATCH)
    p = plan(w, devices=8, hardware="cpu")
    rows = [p.find(data=2, stage=4), p.find(data=2, tensor=2, stage=2)]
    assert all(c is not None and c.remat == "block" for c in rows), rows
    return verify(p, candidates=rows, quiet=True)


def test_verify_compiles_data_x_stage_within_bounds(verification):
    check = next(c for c in verification.checks if c.candidate.tensor == 1)
    assert check.measurement.mesh == {"stage": 4, "data": 2}
    assert {r.quantity for r in check.rows} >= {"arguments", "peak", "collective-permute",
                                                "all-reduce", "flops"}  # fmt: skip
    for r in check.rows:
        assert r.ok, r
    assert abs(check.row("arguments").error) < 0.01
    assert abs(check.row("collective-permute").error) < 0.05
    assert abs(check.row("flops").error) < 0.05
    assert "lax.switch" in " ".join(verification.notes)


def test_verify_compiles_data_x_tensor_x_stage(verification):
    check = next(c for c in verification.checks if c.candidate.tensor == 2)
    assert check.measurement.mesh == {"stage": 2, "data": 2, "tensor": 2}
    assert abs(check.row("arguments").error) < 0.01
    assert abs(check.row("peak").error) < 0.15
    assert any("compiled and predicted in float32" in n for n in verification.notes)
    # two layers per stage: each backward reruns the stage's first layer for the second's
    # input, then each block under remat; the compiled count matches the planner's
    assert abs(check.row("flops").error) < 0.05
    # collectives inside the executor's switch branches counted as the step table runs them
    # on the busiest device (stage 0 here: its F and B ops both run the forward's all-reduces)
    assert check.measurement.branch_choice == 0
    assert abs(check.row("all-reduce").error) < 0.05, check.row("all-reduce")
    assert any("as often as the step table runs each branch" in n for n in verification.notes)


def test_verify_data_x_tensor_x_stage_every_collective_kind_within_5_percent(verification):
    # the executor all-gathers the embedding table whole from its 'tensor' pieces once per
    # step (predicted); nothing moves the table over every mesh axis or sums the lookups
    # over 'stage' (the compiler's own gather from the split table did both: permutes -11%)
    check = next(c for c in verification.checks if c.candidate.tensor == 2)
    kinds = set(check.measurement.collectives)
    assert kinds == {"all-reduce", "collective-permute", "all-gather"}, kinds
    assert kinds <= set(check.predicted.collectives)
    for kind in sorted(kinds):
        assert abs(check.row(kind).error) <= 0.05, check.row(kind)
    permutes = check.measurement.report.of_kind("collective-permute")
    assert all(c.axes == ("stage",) for c in permutes), permutes


def test_pipelined_step_measures_the_same_on_an_abstract_mesh(verification):
    # the AbstractMesh path (how GPT-3 175B is verified) compiles the 3-D step to the same
    # collectives as the 8 simulated devices
    from shardkit.plan.measure import measure_gpt

    check = next(c for c in verification.checks if c.candidate.tensor == 2)
    m = measure_gpt(CFG, check.candidate.strategy(), devices=8, batch=BATCH,
                    precision="float32", abstract=True)  # fmt: skip
    assert m.abstract and m.collectives == check.measurement.collectives


def test_branch_counts_follow_the_table_and_differ_only_on_the_last_stage():
    # the lockstep claim behind counting one device: per lane, every device runs each kind
    # equally often; only the last stage runs them as their last-stage (loss head) twins
    from shardkit.pipeline.engine import branch_counts

    for name, p, m in grid():
        v = 2 if name == "interleaved" else 1
        t = table(schedule_object(name, virtual=v), p, m)
        for lane, counts in enumerate(branch_counts(t)):
            assert counts.shape[0] == p and (counts.sum(axis=1) == t.steps).all()
            kinds = sorted({int(k) for k in t.ops[:, :, lane, 0].ravel()} - {0})
            for j, k in enumerate(kinds):
                per_device = counts[:, 1 + 2 * j] + counts[:, 2 + 2 * j]
                expect = (t.ops[:, :, lane, 0] == k).sum(axis=0)
                assert (per_device == expect).all() and len(set(per_device)) == 1, (name, p, m)
                assert counts[:-1, 2 + 2 * j].sum() == 0  # head twins: last stage only
                last = (t.ops[:, -1, lane, 0] == k) & (t.ops[:, -1, lane, 2] == v - 1)
                assert counts[-1, 2 + 2 * j] == last.sum()


def test_strategy_auto_trains_a_pipelined_row_when_it_ranks_first():
    # the reversal task: vocab 16, 16 tokens; 4 layers split over 2 or 4 stages
    cfg = TrainConfig(strategy="auto", n_layers=4, batch=BATCH, steps=1, remat="block")
    planned = auto_plan(cfg, model_config(cfg, _data(cfg)), jax.devices())
    assert any(c.stage > 1 for c in planned.candidates)  # pipelines compete
    planned.candidates = [c for c in planned.candidates if c.stage > 1]
    best = runnable_best(planned)
    trainer, _, _ = build_trainer(cfg, planned=planned)
    assert trainer.pipeline is not None and trainer.pipeline.stages == best.stage
    assert dict(trainer.mesh.shape) == best.mesh_axes


def test_pipe_docstring_examples_run_as_written():
    import doctest

    from shardkit.plan import pipe

    result = doctest.testmod(pipe, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
