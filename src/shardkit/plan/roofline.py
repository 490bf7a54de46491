"""The scaling book's closed forms: when each parallelism stays compute-bound.

From jax-ml/scaling-book (`roofline.md`, `training.md`, `gpus.md`), with C the peak FLOP/s of
a chip and W the bandwidth a collective gets per chip (α = C / W):

* a bf16 matmul [B, D] x [D, F] is compute-bound when B > C / HBM bandwidth (`matmul_batch`):
  ~240 on TPU v5e, ~298 on H100 (the book rounds H100's peak to 1e15);
* data parallelism and FSDP stay compute-bound while the tokens per device exceed C / W
  (`dp_batch`): ~2550 on TPU v5p (850 over 3 axes), ~2200 inside an H100 node, ~2475 across
  nodes (400 GB/s node egress);
* Megatron tensor parallelism stays compute-bound while its degree is below F x W / C
  (`tp_max_degree`), independent of the batch;
* FSDP(X) x TP(Y) over N chips: the best FSDP degree is sqrt((B / F)(M_X / M_Y) N)
  (`fsdp_tp_optimal`), compute-bound while B / N > 4 α^2 / (M_X M_Y F) (`fsdp_tp_min_batch`),
  M_X and M_Y the number of mesh axes each spans.

Example:
    >>> from shardkit.plan.hardware import get_hardware
    >>> round(dp_batch(get_hardware("tpu-v5p")))
    2550
"""

from __future__ import annotations

import math

from shardkit.plan.hardware import Hardware, get_hardware


def _bw(hw: Hardware, across_nodes: bool) -> float:
    return hw.node_egress() if across_nodes else hw.axis_bw()


def matmul_batch(hardware: str | Hardware, dtype: str = "bf16") -> float:
    """Rows of a matmul above which it is compute-bound: peak FLOP/s / HBM bandwidth."""
    hw = get_hardware(hardware)
    return hw.peak(dtype) / hw.hbm_bw


def dp_batch(hardware: str | Hardware, *, axes: int = 1, across_nodes: bool = False) -> float:
    """Tokens per device above which DP/FSDP is compute-bound: C / (W x axes).

    Args:
        hardware: profile.
        axes: mesh axes the data/FSDP collective runs over (TPU torus axes add bandwidth).
        across_nodes: use the node egress bandwidth (GPU clusters) instead of NVLink / ICI.
    """
    hw = get_hardware(hardware)
    return hw.peak("bf16") / (_bw(hw, across_nodes) * axes)


def tp_max_degree(hardware: str | Hardware, d_ff: int) -> float:
    """Largest compute-bound Megatron tensor-parallel degree: F x W / C."""
    hw = get_hardware(hardware)
    return d_ff * hw.axis_bw() / hw.peak("bf16")


def fsdp_tp_optimal(tokens: float, d_ff: int, devices: int, m_x: int = 1, m_y: int = 1):
    """The FSDP degree X minimising communication for FSDP(X) x TP(Y) on N = X Y chips."""
    return math.sqrt(tokens / d_ff * (m_x / m_y) * devices)


def fsdp_tp_min_batch(hardware: str | Hardware, d_ff: int, m_x: int = 1, m_y: int = 1):
    """Tokens per chip above which FSDP x TP is compute-bound: 4 α^2 / (M_X M_Y F)."""
    hw = get_hardware(hardware)
    alpha = hw.peak("bf16") / hw.axis_bw()
    return 4 * alpha**2 / (m_x * m_y * d_ff)
