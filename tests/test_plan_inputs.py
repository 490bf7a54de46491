"""The planner refuses nonsensical inputs at its boundary, with one error that names the argument.

Every refusal is a `ShardkitValueError` raised where the bad value enters (the workload's or the
hardware profile's constructor, `plan()`'s arguments, `Plan.find`), naming the argument and its
value and ending with "fix: ...". Nothing is truncated or replaced by a default in silence, and
no raw `TypeError`/`ZeroDivisionError` escapes from deep inside the cost model.
"""

import json
import math

import numpy as np
import pytest

from shardkit.errors import ShardkitValueError
from shardkit.plan import Dense, Transformer, get_hardware, plan

T = dict(layers=2, d_model=64, heads=4, vocab=100, seq=16, batch=16)
D = dict(params=10**6, flops_per_example=1e9, activation_bytes_per_example=1e6, batch=64)
NAN, INF = float("nan"), float("inf")


def _refused(excinfo, arg: str, value: str) -> None:
    """The message names `arg=value` and ends with a fix the user can type."""
    msg = str(excinfo.value)
    assert type(excinfo.value) is ShardkitValueError, type(excinfo.value)
    assert f"{arg}={value}" in msg, msg
    assert "\n" not in msg and "fix: " in msg and msg.endswith("."), msg
    assert msg.index("fix: ") > msg.index(f"{arg}={value}"), msg


# -- workloads ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, shown, match",
    [
        ("d_ff", 0, "0", r"fix: d_ff=None"),  # 0 is not the default: None is
        ("d_ff", -1000, "-1000", r"must be a positive int or None"),
        ("kv_heads", 0, "0", r"fix: kv_heads=None"),
        ("kv_heads", -4, "-4", r"must be a positive int or None"),
        ("head_dim", -16, "-16", r"must be a positive int or None"),
        ("head_dim", 0, "0", r"fix: head_dim=None"),
        ("head_dim", 16.0, "16.0", r"fix: head_dim=int\(16\.0\)"),
        ("batch", 16.5, "16.5", r"must be a positive int, not a float"),
        ("batch", 16.0, "16.0", r"fix: batch=int\(16\.0\)"),  # not truncated in silence
        ("batch", True, "True", r"not a bool"),
        ("layers", 0, "0", r"must be a positive int"),
        ("d_model", "64", "'64'", r"not a str"),
        ("heads", NAN, "nan", r"must be a positive int"),
        ("seq", None, "None", r"must be a positive int"),
        ("vocab", -100, "-100", r"must be a positive int"),
        ("norm_params", -1, "-1", r"must be an int >= 0"),
        ("logits_bytes", -4, "-4", r"must be an int >= 0"),
        ("input_bytes_per_token", 1.5, "1.5", r"must be an int >= 0"),
    ],
)
def test_transformer_refuses_bad_sizes(field, value, shown, match):
    with pytest.raises(ShardkitValueError, match=match) as excinfo:
        Transformer(**{**T, field: value})
    _refused(excinfo, field, shown)


@pytest.mark.parametrize(
    "field, value, shown, match",
    [
        ("activation_bytes_per_example", -1e9, "-1000000000.0", r"finite number >= 0"),
        ("activation_bytes_per_example", NAN, "nan", r"finite number >= 0"),
        ("flops_per_example", NAN, "nan", r"finite number > 0"),
        ("flops_per_example", INF, "inf", r"finite number > 0"),
        ("flops_per_example", 0, "0", r"finite number > 0"),
        ("flops_per_example", "1e9", "'1e9'", r"not a str"),
        ("layers", 0, "0", r"must be a positive int"),
        ("params", 1e6, "1000000.0", r"fix: params=int\(1000000\.0\)"),
        ("params", 0, "0", r"must be a positive int"),
        ("batch", True, "True", r"not a bool"),
        ("largest_layer_params", -1, "-1", r"must be an int >= 0"),
        ("input_bytes_per_example", -1.0, "-1.0", r"finite number >= 0"),
        ("input_bytes_per_example", INF, "inf", r"finite number >= 0"),
    ],
)
def test_dense_refuses_bad_sizes(field, value, shown, match):
    with pytest.raises(ShardkitValueError, match=match) as excinfo:
        Dense(**{**D, field: value})
    _refused(excinfo, field, shown)


@pytest.mark.parametrize(
    "field, value",
    [("remat", "sometimes"), ("precision", "fp7"), ("optimizer", "lion9")],
)
def test_dense_refuses_unknown_choices_when_built(field, value):
    with pytest.raises(ShardkitValueError, match=rf"{value}.*fix: "):
        Dense(**{**D, field: value})


def test_workload_defaults_stay_none_and_numpy_integers_are_counts():
    w = Transformer(**T)
    assert (w.d_ff, w.kv_heads, w.head_dim) == (None, None, None)
    assert (w.ff, w.kv, w.hd) == (4 * 64, 4, 16)
    given = Transformer(**{k: np.int64(v) for k, v in T.items()}, d_ff=np.int32(96))
    assert given == Transformer(**T, d_ff=96)
    assert type(given.batch) is int and type(given.d_ff) is int  # JSON-safe
    dense = Dense(**{**D, "params": np.int64(10**6), "flops_per_example": np.float32(1e9)})
    assert type(dense.params) is int and type(dense.flops_per_example) is float
    # zeros that mean "not counted" stay allowed (Auto's Dense of an arbitrary pytree)
    assert Dense(**{**D, "activation_bytes_per_example": 0}).activation_bytes_per_example == 0


# -- hardware -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, shown, match",
    [
        ("hbm_bytes", 0, "0", r"finite number > 0"),  # was a raw ZeroDivisionError
        ("hbm_bytes", -80e9, "-80000000000.0", r"finite number > 0"),
        ("hbm_bw", NAN, "nan", r"finite number > 0"),
        ("intra_bw", -1e9, "-1000000000.0", r"finite number > 0"),  # was a negative step time
        ("inter_bw", 0, "0", r"finite number > 0"),
        ("inter_bw", INF, "inf", r"finite number > 0"),
        ("latency_intra", -1e-6, "-1e-06", r"finite number >= 0"),
        ("latency_inter", NAN, "nan", r"finite number >= 0"),
        ("eff_intra", 0, "0", r"in \(0, 1\]"),
        ("eff_inter", 1.5, "1.5", r"in \(0, 1\]"),
        ("mfu_ceiling", NAN, "nan", r"in \(0, 1\]"),
        ("memory_fraction", 0.0, "0.0", r"in \(0, 1\]"),
        ("overlap", -0.1, "-0.1", r"in \[0, 1\]"),
        ("overlap", NAN, "nan", r"in \[0, 1\]"),
        ("overlap_inter", 2, "2", r"in \[0, 1\] or None"),
        ("domain", 0, "0", r"must be a positive int"),
        ("domain", 8.0, "8.0", r"fix: Hardware.replace\(domain=int\(8\.0\)\)"),
        ("domain", True, "True", r"not a bool"),
        ("dot_output_bytes", 0, "0", r"positive int or None"),
        ("gathered_layers", -1, "-1", r"positive int or None"),
        ("library_reduce_rows", 4096.5, "4096.5", r"positive int or None"),
        ("accumulated_grad_bytes", True, "True", r"not a bool"),
        ("topology", "ring", "'ring'", r"is not one of"),
    ],
)
def test_hardware_refuses_bad_figures(field, value, shown, match):
    with pytest.raises(ShardkitValueError, match=match) as excinfo:
        get_hardware("h100").replace(**{field: value})
    _refused(excinfo, field, shown)
    assert "Hardware 'h100'" in str(excinfo.value)


@pytest.mark.parametrize(
    "peak, shown",
    [({"bf16": 0}, "peak_flops['bf16']=0"),
     ({"bf16": -1e15}, "peak_flops['bf16']=-1000000000000000.0"),
     ({"bf16": NAN}, "peak_flops['bf16']=nan"), ({}, "peak_flops={}"),
     ([989e12], "peak_flops=[989000000000000.0]")],
)  # fmt: skip
def test_hardware_refuses_bad_peaks(peak, shown):
    with pytest.raises(ShardkitValueError, match=r"fix: Hardware.replace\(peak_flops=") as e:
        get_hardware("h100").replace(peak_flops=peak)
    assert shown in str(e.value) and str(e.value).endswith(".")


def test_hardware_keeps_its_zeros_and_numpy_integers():
    h = get_hardware("h100").replace(latency_intra=0, overlap=0, overlap_inter=0.0)
    assert (h.latency_intra, h.overlap, h.inter_overlap) == (0, 0, 0)
    assert type(get_hardware("h100").replace(domain=np.int64(8)).domain) is int
    with pytest.raises(ShardkitValueError, match=r"devices=0 .*fix: "):
        get_hardware("cpu").shared_by(0)
    with pytest.raises(ShardkitValueError, match=r"devices=8\.0 .*fix: devices=int\(8\.0\)"):
        get_hardware("cpu").shared_by(8.0)


# -- plan() and Plan.find -------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, arg, shown, match",
    [
        (dict(devices=True), "devices", "True", r"not a bool"),
        (dict(devices=8.0), "devices", "8.0", r"fix: devices=int\(8\.0\)"),
        (dict(devices="8"), "devices", "'8'", r"not a str"),
        (dict(devices=-8), "devices", "-8", r"must be a positive int"),
        (dict(batch=16.0), "batch", "16.0", r"fix: batch=int\(16\.0\)"),  # was a raw TypeError
        (dict(batch=16.5), "batch", "16.5", r"not a float"),
        (dict(batch=False), "batch", "False", r"not a bool"),
        (dict(zero=3), "zero", "3", r"allowed stages are 1 and 3.*fix: zero=\(3,\)"),
        (dict(zero=(2,)), "zero", "(2,)", r"allowed stages are 1 and 3"),
        (dict(zero=(True,)), "zero", "(True,)", r"allowed stages are 1 and 3"),
        (dict(zero="31"), "zero", "'31'", r"allowed stages are 1 and 3"),
        (dict(zero=None), "zero", "None", r"allowed stages are 1 and 3"),
        (dict(max_stage=2.0), "max_stage", "2.0", r"fix: max_stage=int\(2\.0\)"),
        (dict(max_stage=True), "max_stage", "True", r"not a bool"),
        (dict(virtual=2.0), "virtual", "2.0", r"fix: virtual=int\(2\.0\)"),
        (dict(remat="sometimes"), "remat", "'sometimes'", r"is not one of"),
        (dict(remat=""), "remat", "''", r"is not one of"),  # not the default in silence
    ],
)
def test_plan_refuses_bad_arguments(kwargs, arg, shown, match):
    with pytest.raises(ShardkitValueError, match=match) as excinfo:
        plan(Transformer(**T), **{"devices": 8, **kwargs})
    _refused(excinfo, arg, shown)


def test_plan_takes_numpy_integers_and_zero_lists():
    p = plan(Transformer(**T), devices=np.int64(8), batch=np.int32(16), zero=[np.int64(3), 1])
    q = plan(Transformer(**T), devices=8, batch=16, zero=(3, 1))
    assert p.devices == 8 and type(p.devices) is int
    assert [c.layout for c in p.candidates] == [c.layout for c in q.candidates]
    assert p.best.step_time == q.best.step_time > 0 and p.best.peak_bytes > 0
    json.loads(p.to_json())  # numpy integers converted, nothing unserialisable kept


def test_plan_find_refuses_unknown_degree_names():
    p = plan(Transformer(**T), devices=8)
    with pytest.raises(ShardkitValueError, match=r"datas=8.*known: data, fsdp, tensor, stage") as e:
        p.find(datas=8)
    assert str(e.value).rstrip().endswith(".") and "fix: " in str(e.value)
    assert p.find(data=8) is not None or p.find(fsdp=8) is not None  # known names still work


@pytest.mark.parametrize(
    "workload",
    [Transformer(**T), Transformer(**T, d_ff=1, head_dim=1, kv_heads=1),
     Dense(**{**D, "activation_bytes_per_example": 0, "largest_layer_params": 0})],
)  # fmt: skip
def test_accepted_inputs_plan_to_positive_memory_and_time(workload):
    for c in plan(workload, devices=8).candidates:
        assert c.peak_bytes > 0 and c.step_time > 0 and math.isfinite(c.step_time), c.layout
