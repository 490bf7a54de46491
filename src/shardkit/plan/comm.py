"""Collective times and bytes: α-β ring formulas over a hierarchy of fast domains.

Per-device bytes moved follow `shardkit.inspection`'s formulas (so predictions and compiled
programs are compared in the same unit): an all-gather or reduce-scatter over n devices moves
(n-1)/n of the full array V, an all-reduce 2(n-1)/n, a collective-permute V.

Time (scaling book, `sharding.md` and `gpus.md`; Alpa's α-β model):

* inside one fast domain: T = α + V (n-1) / (n W) for an all-gather/reduce-scatter, W the
  achieved per-chip bandwidth of the axis (NVLink egress, or both directions of a torus ring:
  the scaling book's V / W_ICI); on a torus α is paid per hop (n/2 hops);
* across domains, hierarchically (the node reduces first): T = T_intra(a) + α' +
  (V/a)(k-1)/(k W'), a = chips of the group per domain, k = domains, W' per chip across
  domains. With a = 8 H100s per node this is V/(8 x 50 GB/s) = V / 400 GB/s, the scaling
  book's node-egress figure;
* all-reduce = reduce-scatter + all-gather.

Mesh axes are laid out innermost first ("tensor", then "fsdp", "data", "stage"): `inner` is the
product of the axis sizes inside the one being costed.

Example:
    >>> from shardkit.plan.hardware import get_hardware
    >>> t = collective_time("all-gather", 1e9, 8, get_hardware("h100"))
    >>> round(t * 1e3, 2)  # 1 GB over 8 GPUs of one node at 0.82 x 450 GB/s
    2.38
"""

from __future__ import annotations

import math

from shardkit.plan.hardware import Hardware

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


def bytes_moved(kind: str, nbytes: float, size: int) -> float:
    """Bytes each device sends for one collective over `size` devices on a V = `nbytes` array.

    Same formulas as `shardkit.inspection.FORMULAS` (gathered result for an all-gather, full
    operand for the reductions, the sent buffer for a permute).

    Raises:
        ValueError: for an unknown kind.
    """
    n = size
    if kind == "collective-permute":
        return float(nbytes) if n > 1 else 0.0
    if n <= 1:
        return 0.0
    if kind in ("all-gather", "reduce-scatter", "all-to-all"):
        return nbytes * (n - 1) / n
    if kind == "all-reduce":
        return 2 * nbytes * (n - 1) / n
    raise ValueError(f"unknown collective {kind!r}; fix: one of {KINDS}.")


def split_domains(hw: Hardware, size: int, inner: int = 1) -> tuple[int, int]:
    """(a, k): chips of a group of `size` per fast domain, and domains the group spans."""
    if inner * size <= hw.domain:
        return size, 1
    if inner >= hw.domain:
        return 1, size
    a = max(1, hw.domain // inner)
    return a, math.ceil(size / a)


def _rs_parts(nbytes: float, size: int, hw: Hardware, inner: int) -> tuple[float, float]:
    a, k = split_domains(hw, size, inner)
    intra = inter = 0.0
    if a > 1:
        hops = a / 2 if hw.torus else 1
        intra = hw.latency_intra * hops + nbytes * (a - 1) / a / (hw.axis_bw() * hw.eff_intra)
    if k > 1:
        inter = hw.latency_inter + (nbytes / a) * (k - 1) / k / (hw.inter_bw * hw.eff_inter)
    return intra, inter


def collective_time(kind: str, nbytes: float, size: int, hw: Hardware, *, inner: int = 1):
    """Seconds for one collective on a V = `nbytes` array over a mesh axis of `size` chips.

    Args:
        kind: "all-gather", "reduce-scatter", "all-reduce", "all-to-all" or
            "collective-permute".
        nbytes: the full array (gathered result, unreduced operand, or the permuted buffer).
        size: devices on the mesh axis.
        hw: the hardware profile.
        inner: product of the sizes of the mesh axes laid out inside this one.

    Raises:
        ValueError: for an unknown kind.
    """
    return sum(collective_time_parts(kind, nbytes, size, hw, inner=inner))


def collective_time_parts(
    kind: str, nbytes: float, size: int, hw: Hardware, *, inner: int = 1
) -> tuple[float, float]:
    """`collective_time` split into (inside the fast domain, across domains) seconds.

    The planner hides the two parts behind compute in different shares (`Hardware.overlap`,
    `Hardware.overlap_inter`).

    Example:
        >>> from shardkit.plan.hardware import get_hardware
        >>> intra, inter = collective_time_parts("all-gather", 1e9, 16, get_hardware("h100"))
        >>> round(intra * 1e3, 2), round(inter * 1e3, 2)  # 8 GPUs per node, then 2 nodes
        (2.38, 1.38)
    """
    if size <= 1 or nbytes <= 0:
        return 0.0, 0.0
    if kind in ("all-gather", "reduce-scatter"):
        return _rs_parts(nbytes, size, hw, inner)
    if kind == "all-reduce":
        intra, inter = _rs_parts(nbytes, size, hw, inner)
        return 2 * intra, 2 * inter
    if kind == "all-to-all":  # each device keeps 1/n and sends (n-1)/n^2 of V to each peer
        return _rs_parts(nbytes / size, size, hw, inner)
    if kind == "collective-permute":
        if inner < hw.domain:
            return hw.latency_intra + nbytes / (hw.intra_bw * hw.eff_intra), 0.0
        return 0.0, hw.latency_inter + nbytes / (hw.inter_bw * hw.eff_inter)
    raise ValueError(f"unknown collective {kind!r}; fix: one of {KINDS}.")
