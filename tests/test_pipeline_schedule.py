"""Pipeline schedules, step tables and the event simulator against closed-form results.

No JAX here: the schedules, tables and simulator are pure Python/numpy. Closed forms checked
exactly (float tolerance 1e-12): bubble (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v*m) of compute
for interleaved, ZB-H1's idle (p-1)(t_f+t_b-t_w) per device, step counts and in-flight peaks.
"""

import itertools

import numpy as np
import pytest

from shardkit.pipeline import (
    BI,
    IDLE,
    Costs,
    F,
    GPipe,
    Interleaved,
    OneFOneB,
    Op,
    W,
    ZeroBubbleH1,
    table,
)
from shardkit.pipeline.simulate import simulate

PS = (1, 2, 3, 4, 8)


def _schedules(p, m):
    """Every schedule variant that accepts (p, m)."""
    out = [GPipe(), OneFOneB(), OneFOneB(fused=False)]
    if m >= p:
        out += [ZeroBubbleH1(), ZeroBubbleH1(fused=True)]
    if m % p == 0:
        out += [Interleaved(v=1), Interleaved(v=2), Interleaved(v=3)]
    return out


GRID = [(s, p, m) for p in PS for m in range(1, 4 * p + 1) for s in _schedules(p, m)]


def _check_contract(t, schedule):
    """Independent check of a Table: each op once, lockstep dependencies, program order."""
    p, m, v, lanes = t.p, t.m, schedule.virtual, t.lanes
    assert t.ops.dtype == np.int32 and t.ops.shape == (t.steps, p, lanes, 3)
    split = schedule.name.startswith("zb-h1")
    at = {}  # (kind, microbatch, stage) -> (step, lane)
    for step, d, lane in itertools.product(range(t.steps), range(p), range(lanes)):
        k, i, c = (int(x) for x in t.ops[step, d, lane])
        if k == IDLE:
            assert i == 0 and c == 0
            continue
        assert 0 <= i < m and 0 <= c < v
        if lanes == 2:
            assert (lane == 0) == (k == F), "lane 0 carries the forwards, lane 1 the rest"
        if lanes == 3:
            assert lane == {F: 0, BI: 1, W: 2}[k], "lanes F, BI, W"
        key = (k, i, c * p + d)
        assert key not in at, f"{key} twice"
        at[key] = (step, lane)
    kinds = (F, BI, W) if split else (F, 2)
    want = {(k, i, s) for k in kinds for i in range(m) for s in range(p * v)}
    assert set(at) == want, "every (microbatch, chunk) runs F and B (or BI + W) once per device"
    last = p * v - 1
    for (k, i, s), (step, lane) in at.items():
        if k == F and s > 0:  # input from the previous stage, sent at the end of an earlier step
            assert at[F, i, s - 1][0] < step
        if k in (2, BI):
            assert at[F, i, s] < (step, lane)  # same device, earlier in program order
            if s < last:
                assert at[BI if split else 2, i, s + 1][0] < step
        if k == W:
            assert at[BI, i, s] < (step, lane)
    for d, order in enumerate(schedule.orders(p, m)):
        assert [op for _, _, op in t.device_ops(d)] == order
    assert all((t.ops[step, :, :, 0] != IDLE).any() for step in range(t.steps))


@pytest.mark.parametrize("p", PS)
def test_tables_respect_the_lockstep_contract(p):
    cases = [(s, m) for s, q, m in GRID if q == p]
    assert len(cases) >= 3 * 4 * p
    for schedule, m in cases:
        _check_contract(table(schedule, p, m), schedule)


def test_step_counts_match_closed_forms():
    for schedule, p, m in GRID:
        v = schedule.virtual
        want = {
            "gpipe": 2 * (m + p - 1),
            "1f1b": m + 2 * p - 2,
            "1f1b-unfused": 2 * (m + p - 1),
            "zb-h1": 3 * m + p - 1,
            "zb-h1-fused": m + 2 * p - 2,
        }.get(schedule.name, 2 * (v * m + p - 1))
        assert table(schedule, p, m).steps == want, (schedule, p, m)
    assert table(OneFOneB(), 4, 8).steps == 14


def test_fused_1f1b_places_f_and_b_at_closed_form_steps():
    p, m = 4, 8
    t = table(OneFOneB(), p, m)
    with pytest.raises(ValueError, match="read-only"):
        t.ops[0, 0, 0, 0] = W
    for d in range(p):
        for j in range(m):
            assert tuple(t.ops[d + j, d, 0]) == (F, j, 0)
            assert tuple(t.ops[2 * p - 2 - d + j, d, 1]) == (2, j, 0)


@pytest.mark.parametrize("p", (2, 4, 8))
def test_gpipe_and_1f1b_bubble_is_exact(p):
    schedules = (GPipe(), OneFOneB(), OneFOneB(fused=False))
    for m, schedule in itertools.product(range(p, 4 * p + 1), schedules):
        want = (p - 1) / (m + p - 1)
        for costs in (Costs(), Costs(1.0, 1.0), Costs(1.0, 3.0, 0.5)):
            tl = simulate(schedule, p, m, costs)
            assert tl.bubble == pytest.approx(want, abs=1e-12), (schedule, m, costs)
            total = (m + p - 1) * (costs.t_f + costs.t_b + costs.t_w)
            assert tl.makespan == pytest.approx(total, abs=1e-9)
            assert tl.bubble_over_compute == pytest.approx((p - 1) / m, abs=1e-12)
        # in lockstep the fused table takes GPipe's time; the textbook table is slower
        t = table(schedule, p, m)
        if schedule.lanes == 2 or schedule.name == "gpipe":
            assert t.bubble(Costs()) == pytest.approx(want, abs=1e-12)
            assert t.lockstep_time(Costs()) == pytest.approx(3 * (m + p - 1))
        else:
            assert t.lockstep_time(Costs()) > 3 * (m + p - 1)


def test_bubble_with_communication_latency():
    p, m, c = 4, 8, 0.25
    tl = simulate(GPipe(), p, m, Costs(t_comm=c))
    assert tl.makespan == pytest.approx((p - 1) * (3 + 2 * c) + 3 * m)
    free = simulate(GPipe(), p, m, Costs(0.0, 0.0))
    assert (free.makespan, free.bubble, free.bubble_over_compute) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("p", (2, 4, 8))
def test_interleaved_bubble_over_compute_is_exact(p):
    for v, k in itertools.product((2, 3, 4), (1, 2, 3, 4)):
        m = k * p
        tl = simulate(Interleaved(v=v), p, m)
        assert tl.bubble_over_compute == pytest.approx((p - 1) / (v * m), abs=1e-12)
        assert tl.bubble < simulate(OneFOneB(), p, m).bubble


@pytest.mark.parametrize("p", (2, 4, 8))
def test_zero_bubble_h1_halves_the_1f1b_bubble(p):
    for m in range(p, 4 * p + 1):
        unit = Costs(1.0, 1.0, 1.0)
        zb, fb = simulate(ZeroBubbleH1(), p, m, unit), simulate(OneFOneB(), p, m, unit)
        assert zb.bubble <= fb.bubble / 2
        assert zb.idle == pytest.approx([p - 1] * p)  # vs 1F1B's 3(p-1)
        assert fb.idle == pytest.approx([3 * (p - 1)] * p)
        for costs in (Costs(1.0, 1.2, 0.8), Costs(1.0, 1.5, 0.5)):
            want = (p - 1) * (costs.t_f + costs.t_b - costs.t_w)
            assert simulate(ZeroBubbleH1(), p, m, costs).idle == pytest.approx([want] * p)


def test_table_idle_fraction_equals_simulation_with_unit_costs():
    for schedule, p, m in GRID:
        unit = Costs(1.0, 1.0, 1.0 if schedule.name.startswith("zb-h1") else 0.0)
        t = table(schedule, p, m)
        if schedule.lanes == 3:
            # fused ZB-H1: the simulator runs the textbook idle (p-1 per device); lockstep
            # prices the table at 3m + 2(p-1), between textbook ZB-H1 and fused 1F1B
            sim = simulate(schedule, p, m, unit)
            assert sim.idle == pytest.approx([p - 1] * p), (p, m)
            assert t.lockstep_time(unit) == 3 * m + 2 * (p - 1), (p, m)
            assert t.lockstep_time(unit) <= table(OneFOneB(), p, m).lockstep_time(Costs(1.0, 2.0))
            continue
        assert t.idle_fraction == pytest.approx(simulate(schedule, p, m, unit).bubble, abs=1e-12)
        slots = (2 * p - 2) / (m + 2 * p - 2) if t.lanes == 2 else t.idle_fraction
        assert t.slot_idle_fraction == pytest.approx(slots, abs=1e-12)


def test_peak_in_flight():
    for p, m in itertools.product((2, 4, 8), (1, 3, 8, 16, 32)):
        cases = {
            GPipe(): [m] * p,
            OneFOneB(): [min(m, 2 * (p - 1 - d) + 1) for d in range(p)],  # <= 2p-1
            OneFOneB(fused=False): [min(m, p - d) for d in range(p)],  # <= p
        }
        if m >= p:
            cases[ZeroBubbleH1()] = [p] * p
            cases[ZeroBubbleH1(fused=True)] = [min(m, 2 * p - 1 - d) for d in range(p)]
        for schedule, want in cases.items():
            assert list(table(schedule, p, m).peak_in_flight) == want, (schedule, p, m)
            for costs in (Costs(), Costs(1.0, 1.0, 1.0, 0.5)):
                assert list(simulate(schedule, p, m, costs).peak_in_flight) == want
    # interleaved holds (micro-batch, chunk) pairs: p*v*(1 + (p-1)/(p*v)) on device 0
    assert table(Interleaved(v=2), 4, 8).peak_in_flight == (11, 9, 7, 5)
    assert simulate(Interleaved(v=2), 4, 8).peak_in_flight == (11, 9, 7, 5)


def test_orders_and_ops():
    assert GPipe().orders(1, 2) == [[Op("F", 0), Op("F", 1), Op("B", 1), Op("B", 0)]]
    zb = ZeroBubbleH1().orders(3, 3)[2]
    assert [(o.kind, o.microbatch) for o in zb] == [
        ("F", 0), ("BI", 0), ("F", 1), ("BI", 1), ("F", 2), ("BI", 2), ("W", 0), ("W", 1), ("W", 2)
    ]  # fmt: skip
    il = Interleaved(v=2).orders(2, 2)[0]
    assert [(o.kind, o.microbatch, o.chunk) for o in il[:5]] == [
        ("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1), ("B", 0, 1)
    ]  # fmt: skip
    assert Op("BI", 0).code == BI and Op("W", 1, 2).code == W
    assert (OneFOneB().lanes, OneFOneB(fused=False).lanes, Interleaved(v=3).virtual) == (2, 1, 3)
    assert (ZeroBubbleH1(fused=True).lanes, ZeroBubbleH1(fused=True).name) == (3, "zb-h1-fused")


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: table(GPipe(), 0, 4), r"p=0 .*fix: give the 'stage' mesh axis"),
        (lambda: simulate(OneFOneB(), 2, 0), r"m=0 .*fix: use microbatches >= 1"),
        (lambda: table(Interleaved(v=2), 4, 6), r"m=6 .*not a multiple of p=4.*fix: .*=8 or 4"),
        (lambda: table(Interleaved(v=2), 4, 2), r"m=2 .*< p=4.*fix: use microbatches=4"),
        (lambda: table(ZeroBubbleH1(), 4, 3), r"m=3 .*< p=4.*fix: .*=4 or more"),
        (lambda: Interleaved(v=0), r"v=0 .*fix: use an int v >= 1"),
        (lambda: OneFOneB().check(4, 8, layers=6), r"6 layers .*4\*1 = 4 stages.*fix: .*1, 2, 3"),
        (lambda: Interleaved(v=2).check(2, 4, layers=6), r"p\*v = 2\*2 = 4 stages"),
        (lambda: Costs(t_b=-1.0), r"t_b=-1.0 must be >= 0; fix"),
        (lambda: Op("X", 0), r"kind='X'.*fix: use 'F'"),
    ],
)
def test_bad_input_names_the_fix(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_non_integer_counts_are_rejected():
    with pytest.raises(TypeError, match=r"m=2.0 must be an int; fix"):
        table(GPipe(), 2, 2.0)


def _pixels_near(img, colour, tol=0.02):
    rgb = np.array([int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(img[..., :3] - rgb).max(axis=-1) < tol).sum())


def test_plot_writes_a_timeline_png(tmp_path):
    import matplotlib.image

    from shardkit.pipeline import plot
    from shardkit.pipeline.plot import COLOURS

    unit = Costs(1.0, 1.0, 1.0)
    one = plot(simulate(GPipe(), 2, 4), tmp_path / "gpipe.png")
    zb_items = [table(ZeroBubbleH1(), 2, 4), simulate(ZeroBubbleH1(), 2, 4, unit)]
    both = plot(zb_items, tmp_path / "zb.png")
    gpipe, zb = matplotlib.image.imread(one), matplotlib.image.imread(both)
    assert zb.shape[0] > gpipe.shape[0] > 100 and gpipe.shape[1] > 1000
    # GPipe: forward and backward boxes of equal count, backward twice as long (t_b = 2 t_f)
    f, b = _pixels_near(gpipe, COLOURS["F"]), _pixels_near(gpipe, COLOURS["B"])
    assert 1.6 < b / f < 2.4
    assert _pixels_near(gpipe, COLOURS["W"]) == 0 < _pixels_near(zb, COLOURS["W"])
    with pytest.raises(TypeError, match=r"items\[0\] is a str.*fix: pass simulate"):
        plot(["gpipe"], tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"not a .png file; fix: end it in '.png'"):
        plot(zb_items, tmp_path / "zb.svg")


def test_timelines_example_prints_its_expected_output(tmp_path, capsys):
    import ast
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "pipeline_timelines.py"
    spec = importlib.util.spec_from_file_location("pipeline_timelines", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main(tmp_path, plots=False)  # the pictures cost seconds; plot() is tested above
    doc = ast.get_docstring(ast.parse(path.read_text()))
    expected = doc.split("Expected output:\n", 1)[1].strip().splitlines()[:-1]  # no "wrote"
    assert capsys.readouterr().out.strip().splitlines() == [line.strip() for line in expected]


def test_every_schedule_name_round_trips_and_the_planner_uses_the_same_names():
    from shardkit import pipeline as pp
    from shardkit.pipeline.names import SCHEDULE_NAMES, UnknownScheduleError, schedule_from_name
    from shardkit.plan.pipe import SCHEDULES, schedule_object

    schedules = [pp.GPipe(), pp.OneFOneB(), pp.OneFOneB(fused=False), pp.Interleaved(v=2),
                 pp.Interleaved(v=5), pp.ZeroBubbleH1(), pp.ZeroBubbleH1(fused=True)]  # fmt: skip
    for s in schedules:
        assert schedule_from_name(s.name) == s
    for name in SCHEDULE_NAMES:
        assert schedule_from_name(name).name.startswith(name)
    assert set(SCHEDULES) <= set(SCHEDULE_NAMES)
    for name in SCHEDULES:
        assert schedule_object(name, virtual=3) == schedule_from_name(name, virtual=3)
    with pytest.raises(UnknownScheduleError, match=r"unknown pipeline schedule 'x'; fix"):
        schedule_from_name("x")
