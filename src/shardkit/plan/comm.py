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

import dataclasses
import math
from typing import Any

from shardkit.collectives import KINDS, bytes_moved
from shardkit.errors import ShardkitValueError
from shardkit.plan.hardware import Hardware


def split_domains(hw: Hardware, size: int, inner: int = 1) -> tuple[int, int]:
    """(a, k): chips of a group of `size` per fast domain, and domains the group spans."""
    if inner * size <= hw.domain:
        return size, 1
    if inner >= hw.domain:
        return 1, size
    a = max(1, hw.domain // inner)
    return a, math.ceil(size / a)


def _rs_parts(
    nbytes: float, size: int, hw: Hardware, inner: int, flat: bool = False
) -> tuple[float, float]:
    a, k = split_domains(hw, size, inner)
    intra = inter = 0.0
    if a > 1:
        hops = a / 2 if hw.torus else 1
        intra = hw.latency_intra * hops + nbytes * (a - 1) / a / (hw.axis_bw() * hw.eff_intra)
    if k > 1:
        # hierarchical: the domain reduces first and 1/a of the array crosses per chip; flat:
        # every chip sends its whole share over its own link
        crossing = nbytes if flat else nbytes / a
        inter = hw.latency_inter + crossing * (k - 1) / k / (hw.inter_bw * hw.eff_inter)
    return intra, inter


def collective_time(
    kind: str, nbytes: float, size: int, hw: Hardware, *, inner: int = 1, flat: bool = False
):
    """Seconds for one collective on a V = `nbytes` array over a mesh axis of `size` chips.

    Args:
        kind: "all-gather", "reduce-scatter", "all-reduce", "all-to-all" or
            "collective-permute".
        nbytes: the full array (gathered result, unreduced operand, or the permuted buffer).
        size: devices on the mesh axis.
        hw: the hardware profile.
        inner: product of the sizes of the mesh axes laid out inside this one.
        flat: across domains, a flat ring (each chip's whole share crosses its own link)
            instead of a hierarchical one (the domain reduces first); see `Traffic.add`.

    Raises:
        ValueError: for an unknown kind.
    """
    return sum(collective_time_parts(kind, nbytes, size, hw, inner=inner, flat=flat))


def collective_time_parts(
    kind: str, nbytes: float, size: int, hw: Hardware, *, inner: int = 1, flat: bool = False
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
        return _rs_parts(nbytes, size, hw, inner, flat)
    if kind == "all-reduce":
        intra, inter = _rs_parts(nbytes, size, hw, inner, flat)
        return 2 * intra, 2 * inter
    if kind == "all-to-all":  # each device keeps 1/n and sends (n-1)/n^2 of V to each peer
        return _rs_parts(nbytes / size, size, hw, inner, flat)
    if kind == "collective-permute":
        if inner < hw.domain:
            return hw.latency_intra + nbytes / (hw.intra_bw * hw.eff_intra), 0.0
        return 0.0, hw.latency_inter + nbytes / (hw.inter_bw * hw.eff_inter)
    raise ShardkitValueError(f"unknown collective {kind!r}; fix: one of {KINDS}.")


@dataclasses.dataclass
class Traffic:
    """One layout's collectives per device per step.

    Attributes:
        collectives: kind -> bytes moved (`bytes_moved` units).
        times: mesh axis -> seconds of its collectives.
        across: mesh axis -> the part of `times` spent between fast domains.
        per_micro: (seconds, of which across domains) of traffic repeated per micro-batch
            (ZeRO-3's gathers and reduce-scatters), which overlaps the whole step.
        rings: seconds of "tensor" traffic sent as collective-matmul rings, which the
            matmuls they feed may hide.
    """

    collectives: dict[str, float] = dataclasses.field(default_factory=dict)
    times: dict[str, float] = dataclasses.field(
        default_factory=lambda: {"tensor": 0.0, "fsdp": 0.0, "data": 0.0, "stage": 0.0}
    )
    across: dict[str, float] = dataclasses.field(
        default_factory=lambda: {"tensor": 0.0, "fsdp": 0.0, "data": 0.0, "stage": 0.0}
    )
    per_micro: tuple[float, float] = (0.0, 0.0)
    rings: float = 0.0

    def add(self, kind, nbytes, count, axis, size, inner, hw: Hardware) -> None:
        """`count` collectives of `kind` on `nbytes` over mesh axis `axis` of `size` devices,
        `inner` devices inside it."""
        if size <= 1 or count <= 0:
            return
        self.collectives[kind] = self.collectives.get(kind, 0.0) + count * bytes_moved(
            kind, nbytes, size
        )
        # tensor parallelism's per-layer collectives sit on the critical path: across
        # domains they run as flat rings, every chip's share over its own NIC
        flat = axis == "tensor"
        intra, inter = collective_time_parts(kind, nbytes, size, hw, inner=inner, flat=flat)
        self.times[axis] += count * (intra + inter)
        self.across[axis] += count * inter


def layout_traffic(
    w: Any,
    hw: Hardware,
    *,
    transformer: bool,
    data: int,
    fsdp: int,
    tensor: int,
    stage: int,
    zero: int,
    remat: str,
    microbatches: int,
    micro_batch: int,
    steps: int,
    stage_params: float,
    compute_bytes: int,
    weight_bytes: float,
    block_bytes: float,
    gather_calls: int,
    activation_bytes: float,
    tp_count: int,
    sequence_parallel: bool,
    head_on_busiest: bool,
    tp_rings: int = 0,
    block_runs: int = 0,
    fsdp_regather: bool = False,
    split_sends: bool = False,
) -> Traffic:
    """The collectives of one layout per device per step, with their times.

    FSDP (ZeRO-3) gathers each block per micro-batch (again when remat recomputes it) and
    reduce-scatters its gradients; ZeRO-1 reduce-scatters gradients and gathers the updated
    weights once per step; "data" all-reduces the gradient shard once per step; Megatron
    tensor parallelism all-reduces `tp_count` b x s x h activations (an all-gather and a
    reduce-scatter each under sequence parallelism; with collective matmul `tp_rings` of them
    are rings of tensor - 1 collective-permutes of a sequence slice, the same bytes; `block_runs`
    blocks run per step, for the gathers "block" remat repeats);
    a pipeline sends an activation and a gradient at every one of the executor's `steps`
    (1/tensor of it with `split_sends`: Megatron's scatter/gather); `fsdp_regather`: blocks
    are gathered again for the backward (PyTorch FSDP) without remat."""
    t, (m, b, c), replicas = Traffic(), (microbatches, micro_batch, compute_bytes), data * fsdp

    def add(kind, nbytes, count, axis, size, inner):
        t.add(kind, nbytes, count, axis, size, inner, hw)

    weights_c = stage_params * c
    if fsdp > 1 and zero == 3:  # gathered and reduced one layer at a time
        passes, calls = (1 if remat == "none" and not fsdp_regather else 2), gather_calls
        # the blocks are gathered again when remat recomputes them; the embedding, head and
        # final norm live outside the scanned, rematerialised blocks and are gathered once
        blocks = calls - 1 if transformer else calls
        add("all-gather", block_bytes / blocks, passes * m * blocks, "fsdp", fsdp, tensor)
        add("all-gather", weights_c - block_bytes, m, "fsdp", fsdp, tensor)
        add("reduce-scatter", weights_c / calls, m * calls, "fsdp", fsdp, tensor)
        t.per_micro = (t.times["fsdp"], t.across["fsdp"])
    elif fsdp > 1:
        add("reduce-scatter", weights_c, 1, "fsdp", fsdp, tensor)
        add("all-gather", stage_params * weight_bytes, 1, "fsdp", fsdp, tensor)
    add("all-reduce", weights_c / max(fsdp, 1), 1, "data", data, tensor * fsdp)
    sp = sequence_parallel
    if sp:  # all-gather before and reduce-scatter after each pair of tensor-parallel matmuls
        # "block" remat reruns the forward's gathers before q/k/v and the MLP, and its
        # reduce-scatter after the attention output: one all-gather more than all-reduces
        regather = block_runs if remat == "block" else 0
        # the vocab-parallel embedding's partial rows are only reduce-scattered, or its table
        # gathered whole when that is fewer bytes (XLA's choice for a small vocabulary)
        lookups = microbatches if stage == 1 and transformer else 0
        table = w.vocab * w.d_model * c if lookups else 0.0
        rings = (tp_rings + regather, tp_rings) if tp_rings else (0, 0)
        gathers = tp_count + regather - lookups - rings[0]
        small_table = bool(lookups) and table < activation_bytes
        scatters = tp_count - rings[1] - (lookups if small_table else 0)
        add("all-gather", activation_bytes, gathers, "tensor", tensor, 1)
        add("reduce-scatter", activation_bytes, scatters, "tensor", tensor, 1)
        if small_table:
            add("all-gather", table, lookups, "tensor", tensor, 1)
        before = t.times["tensor"]
        steps = sum(rings) * (tensor - 1)  # each ring: one slice per step
        # a ring longer than a fast domain waits at every step for its slowest (inter) link
        slowest = 1 if tensor <= hw.domain else hw.domain
        add("collective-permute", activation_bytes / tensor, steps, "tensor", tensor, slowest)
        t.rings = t.times["tensor"] - before
    else:
        add("all-reduce", activation_bytes, tp_count, "tensor", tensor, 1)
    if transformer and head_on_busiest:  # vocab-parallel softmax: max, sum and the target
        # logit (f32), on the last stage
        add("all-reduce", 4 * w.seq * b, 3 * m, "tensor", tensor, 1)
    add("all-reduce", 4, 1, "data", replicas, tensor)  # the loss, averaged over the batch
    sends = activation_bytes / (tensor if sp or split_sends else 1)  # each rank's slice
    # the lockstep executor sends an activation and a gradient every step, idle lanes too
    add("collective-permute", sends, 2 * steps, "stage", stage, tensor * fsdp * data)
    if stage > 1 and getattr(w, "ends_on_every_stage", False):
        # the input cotangent (for the embedding) and the head's gradients, summed over stage
        head = w.norm_params * w.d_model + w.vocab * w.d_model / tensor
        add("all-reduce", activation_bytes * m, 1, "stage", stage, tensor * fsdp * data)
        add("all-reduce", head * c, 1, "stage", stage, tensor * fsdp * data)
        # the embedding table, all-gathered whole from its "tensor" pieces once per step
        add("all-gather", w.vocab * w.d_model * c, 1, "tensor", tensor, 1)
    return t
