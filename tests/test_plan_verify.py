"""The planner checked against the compiler: `shardkit.plan.measure` and `Plan.verify`.

Compiled figures come from XLA on 8 simulated CPU devices (real mesh) or an AbstractMesh;
closed-form references are computed here from parameter counts.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.inspection.groups import _mesh_groups
from shardkit.models import GPTConfig
from shardkit.plan.measure import measure, measure_gpt
from shardkit.strategies import Hybrid

CFG = GPTConfig(vocab=64, d_model=64, n_layers=2, n_heads=4, seq_len=16, remat="block")
BATCH = 16
PSI = CFG.n_params()


@functools.cache
def measured(data=1, fsdp=1, tensor=1, abstract=False, precision="bfloat16"):
    strategy = Hybrid(data=data, fsdp=fsdp, tensor=tensor)
    return measure_gpt(CFG, strategy, devices=8, batch=BATCH, abstract=abstract,
                       precision=precision)  # fmt: skip


def test_generic_measure_on_abstract_mesh_beyond_present_devices():
    n = 512
    mesh = AbstractMesh((n,), ("data",))
    x = jax.ShapeDtypeStruct((1024, 64), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    m = measure(jax.jit(lambda x: (x * 2).sum()), x, mesh=mesh)
    assert m.abstract and m.mesh == {"data": n}
    assert m.argument_bytes == 1024 * 64 * 4 // n
    ar = m.collectives["all-reduce"]
    assert ar["count"] == 1
    assert ar["bytes"] == pytest.approx(2 * (n - 1) / n * 4)  # one f32 scalar, ring all-reduce
    assert m.flops == pytest.approx(2 * 1024 * 64 / n, rel=0.05)  # multiply + add per element


def test_generic_measure_rejects_a_non_mesh():
    with pytest.raises(ValueError, match=r"Mesh or AbstractMesh.*fix: mesh="):
        measure(jax.jit(lambda x: x), jnp.ones(3), mesh={"data": 8})


def test_measure_gpt_asks_for_abstract_beyond_present_devices():
    with pytest.raises(ValueError, match=r"only 8 devices are present; fix: abstract=True"):
        measure_gpt(CFG, Hybrid(data=16), devices=16, batch=16, abstract=False)


def test_measure_gpt_rejects_an_indivisible_batch():
    with pytest.raises(ValueError, match=r"batch=12\) does not divide .* fix: batch=8"):
        measure_gpt(CFG, Hybrid(data=8), devices=8, batch=12)


def test_data_parallel_gradient_all_reduce_is_the_ring_bound_in_bf16():
    # DP: one all-reduce of every gradient, 2(n-1)/n x 2 bytes x params, once XLA:CPU's f32
    # upcast is undone (4 bytes as compiled); plus a few f32 scalars of the loss and metrics.
    m = measured(data=8)
    ar = m.collectives["all-reduce"]
    assert ar["bytes"] == pytest.approx(2 * 7 / 8 * 2 * PSI, rel=1e-4)
    assert ar["raw_bytes"] == pytest.approx(2 * 7 / 8 * 4 * PSI, rel=1e-4)
    assert any("f32 on bf16" in n for n in m.notes)
    # arguments: fp32 weights, Adam m and v (12 bytes per parameter), step counters, the batch
    assert m.argument_bytes == 12 * PSI + 4 + 4 + 12 * BATCH * CFG.seq_len // 8


def test_fsdp_gradients_count_as_a_reduce_scatter():
    m = measured(fsdp=8)
    rs = m.collectives["reduce-scatter"]
    assert rs["bytes"] == pytest.approx(7 / 8 * 2 * PSI, rel=1e-4)  # bf16 grads, ZeRO-3
    assert m.collectives["all-reduce"]["bytes"] < 1e-3 * rs["bytes"]  # only the loss scalar
    assert any("reduce-scatter" in n for n in m.notes)
    assert m.argument_bytes < measured(data=8).argument_bytes / 7  # state split 8 ways


def test_abstract_mesh_compiles_the_same_program_as_the_real_mesh():
    real, abstract = measured(data=2, fsdp=2, tensor=2), measured(2, 2, 2, abstract=True)
    assert (real.abstract, abstract.abstract) == (False, True)
    for field in ("argument_bytes", "temp_bytes", "output_bytes", "flops", "collectives"):
        assert getattr(real, field) == getattr(abstract, field), field


def test_iota_device_ids_of_3d_mesh_groups_decode():
    # XLA prints mesh groups of a make_mesh 3-D mesh with device ids as a transposed iota
    spec = "mesh['a'=1,'b'=2,'c'=4], device_ids=([2,2,2]T(1,0,2)) {'b'}"
    ids = np.arange(8).reshape(2, 2, 2).transpose(1, 0, 2).reshape(-1)
    want = [sorted([int(ids[c]), int(ids[4 + c])]) for c in range(4)]
    assert sorted(sorted(g) for g in _mesh_groups(spec)) == sorted(want)
