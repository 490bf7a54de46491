"""Hardware profiles: peak FLOP/s, memory, link bandwidths and achievable fractions per chip.

Bandwidths are stored **per chip, per direction** (bytes/s), as the scaling book does:

* `intra_bw`: inside the fast domain (NVLink/NVSwitch node, xGMI mesh, TPU ICI slice). For
  TPUs this is one ICI link; a ring over a torus axis with wraparound uses a link in each
  direction, so a mesh axis gets `2 * intra_bw` (`axis_bw`).
* `inter_bw`: leaving the domain (InfiniBand NIC per GPU, TPU data-centre network per chip).

Sources (figures as collected in the project's planner notes):

* SB-g: jax-ml/scaling-book `gpus.md` (H100 450 GB/s NVLink per GPU, 400 GB/s node egress on a
  DGX H100 SuperPod, B200 900 GB/s, B200 HBM 8.0 TB/s, ring busBW ~370 of 450 GB/s).
* SB-t: jax-ml/scaling-book `tpus.md` (ICI 45 GB/s per link per direction on v4/v5e, 90 on
  v5p/v6e as the effective value; ~1 us per hop; topologies and pod sizes).
* GC: cloud.google.com/tpu/docs/{v5e,v5p,v6e} (peak bf16, HBM size and bandwidth, DCN).
* GK: glennklockwood.com/garden/processors/{A100,h100,B200} quoting NVIDIA datasheets
  (dense bf16 312 / 989 / 2,250 TFLOP/s; HBM 80 GB 2.039 TB/s, 80 GB 3.35 TB/s, 180 GB usable).
* nccl-tests#149 (8xA100 busBW ~200 of 300 GB/s), #212 (8xH100 ~370 of 450), #290 (NDR
  46-49 of 50 GB/s per NIC); nccl#1244 (cross-node all-reduce latency floor ~46 us).
* MI300X: wheelersnetwork 2024-01 (7 xGMI links x 64 GB/s per direction, HBM 192 GB 5.3 TB/s);
  peak FLOP/s recalled from AMD's datasheet (1,307 bf16 dense). No RCCL measurement was found,
  so its achievable fractions are assumptions.
* XLA:TPU capacity: the HBM a TPU program may fill, as XLA:TPU's compile-time out-of-memory
  error states it ("Ran out of memory in memory space hbm. Used ... of 15.75G hbm" on a 16 GiB
  v5e, 30.75G on a 32 GiB v4 with 1.25G reserved (EasyDeL issue 166), 31.25G on a v6e, 95.74G
  on a v5p). XLA:TPU places every buffer when it compiles, so a TPU profile's
  `memory_fraction` is that capacity over `hbm_bytes`; the GPUs keep 0.9 for their runtimes'
  allocators.
* CPU: this machine (`lscpu`: 2 AMD EPYC cores at 2.6 GHz with AVX-512 FMA, i.e. 2 x 2.6e9 x
  32 FLOP/cycle in f32; XLA:CPU runs bf16 matmuls at about f32 speed) as one device. Simulated
  devices time-share these cores: `Auto` and `shardkit train` divide the profile among them
  (`Hardware.shared_by`).

Achievable fractions are parameters (`Hardware.replace(mfu_ceiling=...)`):

* `mfu_ceiling`: the share of peak a large bf16 matmul-bound training step reaches with no
  communication or bubble, applied to the FLOPs executed (recompute included, so it is
  calibrated on hardware-FLOP rates). It is the default runtime's ("shardkit"); the runtimes
  of other stacks carry their own per-chip figures, fitted to their published runs
  (`shardkit.plan.runtime`). Calibrated per chip from published runs: A100 0.62 (Megatron,
  arXiv:2104.04473: 138-163 TFLOP/s per GPU counted with recomputation, ~45-52% of peak after
  its tensor-parallel all-reduces and bubble), H100 0.39 (torchtitan, Llama-3.1 8B FSDP on 8
  GPUs: 33-39% MFU; H200, B200 and MI300X assumed alike), TPU v4 0.6 (PaLM: 46.2% MFU,
  57.8% HFU), v5p 0.7 and v5e 0.6 (MaxText README: 64-72% and 55-61%).
* `eff_intra` / `eff_inter`: achieved over nominal bandwidth (NVLink ring 0.82, IB 0.92,
  ICI 0.9 assumed).
* `overlap` / `overlap_inter`: the share of FSDP and data-parallel traffic that compute hides,
  inside a fast domain (0.9, assumed) and across domains. For GPUs across nodes the share is
  fitted: torchtitan's Llama-3.1 8B FSDP runs (local batch 2, selective checkpointing; its
  `benchmarks/llama3_h100_202412_torchtitan.md` Tables 1 and 3) lose 2.7% (eager), 2.3%
  (torch.compile) and 1.8% (Float8) of their tokens/s per GPU going from 8 GPUs (one node) to
  128 (16 nodes). The torch.compile run is the one the H100 ceiling describes (6,667 tokens/s
  x 57.9 GFLOP/token = 39% of 989 TFLOP/s); the planner predicts its 2.3% loss at a hidden
  share of 0.4 (`shardkit.plan.cost._exposed`; `tests/test_plan_model.py` checks the fit), so
  GPU profiles take 0.4 across nodes. TPU profiles hide nothing across slices (0): XLA
  reduces a scanned layer stack's gradients over the data-centre network after the loop, with
  no compute left to hide it, and MaxText's multi-slice tables (v5e 16B: 61.1% on 1 slice,
  54.7% on 32; v5p 128B: 68.8% on 1, 59.7% on 2) lose more than the planner predicts even so
  (`tests/data/published_tpu.toml`).

Example:
    >>> h100 = get_hardware("h100")
    >>> h100.peak("bf16") / 1e12, h100.hbm_bytes / 1e9
    (989.0, 80.0)
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from typing import Any, Literal

from shardkit.errors import ShardkitError, ShardkitValueError
from shardkit.plan.checks import checked, checked_fields

Topology = Literal["switch", "mesh", "torus2d", "torus3d", "host"]
_TOPOLOGIES = typing.get_args(Topology)

# how each figure of a profile is checked (`checks.checked`); "?": None is allowed, meaning
# `_OPTIONAL[field]`; `peak_flops` and `topology` are checked on their own
_FIELDS = {"hbm_bytes": "positive", "hbm_bw": "positive", "intra_bw": "positive",
           "inter_bw": "positive", "domain": "count", "latency_intra": "nonnegative",
           "latency_inter": "nonnegative", "eff_intra": "fraction", "eff_inter": "fraction",
           "mfu_ceiling": "fraction", "memory_fraction": "fraction", "overlap": "share",
           "overlap_inter": "share?", "dot_output_bytes": "count?", "activation_upcast": "count?",
           "gathered_layers": "count?", "library_reduce_rows": "count?",
           "gathered_bytes": "count?", "norm_input_bytes": "count?",
           "accumulated_grad_bytes": "count?"}  # fmt: skip
_OPTIONAL = {"overlap_inter": "the default: `overlap`", "gathered_layers": "the default: 2",
             "library_reduce_rows": "the default: no such habit"} | dict.fromkeys(
    ("dot_output_bytes", "activation_upcast", "gathered_bytes", "norm_input_bytes",
     "accumulated_grad_bytes"), "the default: the compute dtype's bytes",
)  # fmt: skip


class UnknownHardwareError(ShardkitError, ValueError):
    """A hardware name that has no profile."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Hardware:
    """One accelerator chip and how it is connected.

    Attributes:
        name: profile name (lower case).
        description: one line for tables.
        peak_flops: dtype -> dense peak FLOP/s per chip ("bf16", "fp8", "fp32", ...).
        hbm_bytes: device memory in bytes.
        hbm_bw: device memory bandwidth in bytes/s.
        intra_bw: bytes/s per chip per direction inside the fast domain (one ICI link on TPU).
        inter_bw: bytes/s per chip per direction between domains.
        domain: chips in one fast domain (GPUs per NVLink node, chips per TPU slice/pod).
        topology: "switch" (NVSwitch), "mesh" (all-to-all links), "torus2d"/"torus3d" (TPU ICI),
            "host" (simulated devices in one process).
        latency_intra: seconds per collective step inside the domain (per hop on a torus).
        latency_inter: seconds per collective call across domains.
        eff_intra: achieved / nominal bandwidth inside the domain.
        eff_inter: achieved / nominal bandwidth across domains.
        mfu_ceiling: share of peak a matmul-bound step reaches without communication.
        memory_fraction: share of `hbm_bytes` a plan may use (the rest: runtime, fragmentation;
            on a TPU what XLA:TPU reserves, see the sources).
        overlap: share of data-parallel/FSDP communication inside the fast domain hidden
            behind compute (1 = fully).
        overlap_inter: the same share for the traffic across domains (InfiniBand, DCN); None:
            `overlap`. GPU profiles fit it to a published scaling measurement (module
            docstring).
        dot_output_bytes: bytes of a bf16 matmul's output as the compiler keeps it (None: the
            compute dtype; XLA:CPU of jaxlib 0.10 runs bf16 matmuls in f32 and keeps f32
            outputs: 4; that of 0.12 runs them in bf16: None; see `cpu_habits`).
        activation_upcast: bytes per element at which the compiler keeps bf16 activations
            (block inputs stashed for the backward pass, the residual stream, norms and the
            recomputed block's working set); None: the compute dtype. Only XLA:CPU with f32
            matmuls (jaxlib 0.10) sets it (4: it holds them in f32, measured on shardkit's
            GPT; with bf16 matmuls see `norm_input_bytes`); GPU and TPU profiles leave
            it None so their predictions keep bf16 activations. `Plan.verify` predicts with
            the compiling backend's value, the ranking with the target's.
        gathered_layers: scanned blocks whose ZeRO-3-gathered weights are live at once in the
            backward pass under remat (None: 2, the block being differentiated and the next
            one, whose all-gather an asynchronous collective prefetches). XLA:CPU runs
            collectives synchronously and frees each gathered matrix after its last use: 1
            (the MLP-down kernel, dead once its gradient is taken, leaves room for the full
            gradient of the MLP-up kernel before its reduce-scatter; measured on shardkit's
            GPT, docs/plan.md).
        library_reduce_rows: XLA:CPU only: a norm over at least this many rows (b x s
            tokens per device) has its backward reduction run as a YNNPACK library fusion,
            which takes its operands as buffers, so each norm's broadcast rsqrt factor and
            scale are materialised as b x s x h f32 tensors (4 per block) instead of being
            fused into the loop (measured on shardkit's GPT: at 4,096 and 16,384 rows, not at
            2,048 or 3,072, whatever h). None: no such habit (GPU and TPU fuse them).
        gathered_bytes: bytes per element of the ZeRO-3-gathered block's share of the peak
            (None: `activation_upcast`, else the compute dtype). XLA:CPU with bf16 dots
            gathers bf16 weights but materialises the block's full-size weight gradients in
            f32 (the fp32 parameters' gradient, converted from the bf16 dot output before its
            reduce-scatter), which take the gathered weights' place: 4 (measured on
            shardkit's GPT, `cpu_habits`).
        norm_input_bytes: bytes per element of each norm's input in the backward working
            set of a block (None: as the other activations). XLA:CPU with bf16 dots keeps
            the two norms' inputs as the model computes them, in f32 (shardkit's `_norm`
            upcasts; the residual add is fused into the upcast), while every matmul operand
            and result stays bf16: 4 (`cpu_habits`).
        accumulated_grad_bytes: bytes per element of each of the two gradient copies
            (the micro-batch's gradient and the accumulator) that fp32 weights hold with more
            than one micro-batch (None: the weights' bytes). XLA:CPU with bf16 dots keeps
            both in bf16, as the weight-gradient dots produce them: 2 (measured on
            shardkit's pipeline executor, data=2 x stage=4, `cpu_habits`).
        primitive_residuals: remat "none" stashes what JAX's linearisation keeps per
            primitive (each norm's f32 input and square derivative, the softmax's f32 exp
            next to the probabilities, five tanh-GELU tensors, the bf16 weight casts) and the
            forward of the last block holds its f32 s x s temporaries and the causal mask's
            hoisted f32 broadcast next to the full stash (`memory._primitive_stash`; measured
            on shardkit's GPT under XLA:CPU, docs/plan.md). False: Korthikanti's per-tensor
            count (GPU and TPU profiles, not measured there).
        source: where the figures come from.

    Raises:
        ValueError: when built (or `replace`d) with a figure the cost model cannot use: a
            peak, memory size or bandwidth that is not a finite number > 0, a latency below 0,
            an efficiency, ceiling or memory fraction outside (0, 1], an overlap outside
            [0, 1], a domain or byte count that is not a positive int (a float is refused,
            even 8.0), or an unknown topology; the message names the field and its value and
            ends with a fix.
    """

    name: str
    description: str
    peak_flops: dict[str, float]
    hbm_bytes: float
    hbm_bw: float
    intra_bw: float
    inter_bw: float
    domain: int
    topology: Topology
    latency_intra: float = 5e-6
    latency_inter: float = 25e-6
    eff_intra: float = 0.82
    eff_inter: float = 0.92
    mfu_ceiling: float = 0.5
    memory_fraction: float = 0.9
    overlap: float = 0.9
    overlap_inter: float | None = None
    dot_output_bytes: int | None = None
    activation_upcast: int | None = None
    gathered_layers: int | None = None
    library_reduce_rows: int | None = None
    gathered_bytes: int | None = None
    norm_input_bytes: int | None = None
    accumulated_grad_bytes: int | None = None
    primitive_residuals: bool = False
    source: str = ""

    def __post_init__(self):
        where, setter = f"Hardware {self.name!r}: ", "Hardware.replace({arg}={value})"
        peaks = self.peak_flops
        if not isinstance(peaks, dict) or not peaks:
            raise ShardkitValueError(
                f"{where}peak_flops={peaks!r} must map dtypes to FLOP/s; fix: "
                "Hardware.replace(peak_flops={'bf16': <dense bf16 FLOP/s per chip>})."
            )
        for dtype, flops in peaks.items():
            fix = f"Hardware.replace(peak_flops={{..., {dtype!r}: <FLOP/s per chip>}})"
            checked(flops, f"peak_flops[{dtype!r}]", "positive", where=where, fix=fix)
        checked_fields(self, _FIELDS, where=where, setter=setter, optional=_OPTIONAL)
        if self.topology not in _TOPOLOGIES:
            raise ShardkitValueError(
                f"{where}topology={self.topology!r} is not one of {', '.join(_TOPOLOGIES)}; "
                "fix: Hardware.replace(topology='switch') (an NVSwitch node)."
            )

    def peak(self, dtype: str = "bf16") -> float:
        """Dense peak FLOP/s for `dtype`.

        Raises:
            ValueError: if the chip has no figure for `dtype` (the message lists those it has).
        """
        key = _DTYPE_ALIASES.get(dtype, dtype)
        if key not in self.peak_flops:
            raise ShardkitValueError(
                f"hardware {self.name!r} has no peak FLOP/s for dtype {dtype!r}; it has "
                f"{sorted(self.peak_flops)}; fix: use one of those."
            )
        return self.peak_flops[key]

    @property
    def inter_overlap(self) -> float:
        """Share of cross-domain data-parallel/FSDP traffic hidden behind compute."""
        return self.overlap if self.overlap_inter is None else self.overlap_inter

    @property
    def usable_bytes(self) -> float:
        """Device memory a plan may fill: `hbm_bytes * memory_fraction`."""
        return self.hbm_bytes * self.memory_fraction

    @property
    def torus(self) -> bool:
        return self.topology.startswith("torus")

    def axis_bw(self) -> float:
        """Nominal bytes/s per chip for a collective along one mesh axis inside the domain.

        A torus axis with wraparound uses one link in each direction (2 x one link, the
        scaling book's bidirectional W_ICI); a switch or mesh gives each chip its full egress.
        """
        return 2 * self.intra_bw if self.torus else self.intra_bw

    def node_egress(self) -> float:
        """Nominal bytes/s leaving one domain node: inter_bw x chips per node (8 for GPUs)."""
        return self.inter_bw * min(self.domain, 8)

    def replace(self, **changes) -> Hardware:
        """A copy with some fields changed, e.g. `replace(mfu_ceiling=0.4)`."""
        return dataclasses.replace(self, **changes)

    def shared_by(self, devices: int) -> Hardware:
        """The profile of each of `devices` devices that time-share this one's chip, as the
        simulated CPU devices of one process do (`--xla_force_host_platform_device_count`:
        their threads run on the same cores and memory): its peak FLOP/s and bandwidths
        divided among them, its collective latencies multiplied, so every time the planner
        predicts is `devices` times longer and its ranking of layouts does not change. Its
        memory (`hbm_bytes`) is left as it is.

        Example:
            >>> cpu = get_hardware("cpu")
            >>> cpu.shared_by(8).peak("fp32") == cpu.peak("fp32") / 8
            True
        """
        devices = checked(devices, "devices", "count", where=f"Hardware {self.name!r}: shared_by: ",
                          need="a positive int (devices >= 1)",
                          fix="pass the number of devices that share the chip")  # fmt: skip
        share = 1.0 / devices
        return self.replace(
            peak_flops={k: v * share for k, v in self.peak_flops.items()},
            hbm_bw=self.hbm_bw * share, intra_bw=self.intra_bw * share,
            inter_bw=self.inter_bw * share, latency_intra=self.latency_intra * devices,
            latency_inter=self.latency_inter * devices,
        )  # fmt: skip


_DTYPE_ALIASES = {"bfloat16": "bf16", "float32": "fp32", "f32": "fp32", "float8": "fp8"}

_GB = 1e9
# HBM sizes sold as "GB" are GiB: an A100's 80GB is 81920 MiB (nvidia-smi); JAX reports
# 31.25 GiB allocatable on a 32 GiB TPU v6e (33,550,237,696 bytes, vllm#16211's usage log)
_GIB = 2**30
_T = 1e12
# share of FSDP / data-parallel traffic across GPU nodes (NCCL over InfiniBand/RoCE) hidden
# behind compute: fitted to torchtitan's Llama-3.1 8B FSDP runs on 8 vs 128 H100s (module
# docstring); inside the NVLink node the default 0.9 stays
_IB_OVERLAP = 0.4

PROFILES: dict[str, Hardware] = {
    "a100": Hardware(
        name="a100", description="NVIDIA A100 SXM 80GB, 8 per NVSwitch node, HDR InfiniBand",
        peak_flops={"bf16": 312 * _T, "fp16": 312 * _T, "tf32": 156 * _T, "fp32": 19.5 * _T},
        hbm_bytes=80 * _GIB, hbm_bw=2.039 * _T, intra_bw=300 * _GB, inter_bw=25 * _GB,
        domain=8, topology="switch", eff_intra=0.67, mfu_ceiling=0.62, overlap_inter=_IB_OVERLAP,
        source="GK (datasheet), SB-g, nccl-tests#149; nvidia-smi memory.total 81920 MiB",
    ),
    "a100-40gb": Hardware(
        name="a100-40gb", description="NVIDIA A100 SXM 40GB",
        peak_flops={"bf16": 312 * _T, "fp16": 312 * _T, "tf32": 156 * _T, "fp32": 19.5 * _T},
        hbm_bytes=40 * _GIB, hbm_bw=1.555 * _T, intra_bw=300 * _GB, inter_bw=25 * _GB,
        domain=8, topology="switch", eff_intra=0.67, mfu_ceiling=0.62, overlap_inter=_IB_OVERLAP,
        source="GK (datasheet), SB-g, nccl-tests#149; nvidia-smi memory.total 40960 MiB",
    ),
    "h100": Hardware(
        name="h100", description="NVIDIA H100 SXM 80GB, 8 per NVSwitch node, NDR 400G per GPU",
        peak_flops={"bf16": 989 * _T, "fp16": 989 * _T, "fp8": 1979 * _T, "fp32": 67 * _T},
        hbm_bytes=80 * _GB, hbm_bw=3.35 * _T, intra_bw=450 * _GB, inter_bw=50 * _GB,
        domain=8, topology="switch", mfu_ceiling=0.39, overlap_inter=_IB_OVERLAP,
        source="GK (datasheet), SB-g, nccl-tests#212/#290",
    ),
    "h100-96gb": Hardware(
        name="h100-96gb", description="NVIDIA H100 96GB HBM2e at 500 W (torchtitan's benchmarks)",
        peak_flops={"bf16": 989 * _T, "fp16": 989 * _T, "fp8": 1979 * _T, "fp32": 67 * _T},
        hbm_bytes=96 * _GB, hbm_bw=2.4 * _T, intra_bw=450 * _GB, inter_bw=50 * _GB,
        domain=8, topology="switch", mfu_ceiling=0.39, overlap_inter=_IB_OVERLAP,
        source="torchtitan benchmarks/llama3_h100_202412 (peak between SXM and NVL: SXM used)",
    ),
    "h200": Hardware(
        name="h200", description="NVIDIA H200 SXM 141GB, 8 per NVSwitch node",
        peak_flops={"bf16": 989 * _T, "fp16": 989 * _T, "fp8": 1979 * _T, "fp32": 67 * _T},
        hbm_bytes=141 * _GB, hbm_bw=4.8 * _T, intra_bw=450 * _GB, inter_bw=50 * _GB,
        domain=8, topology="switch", mfu_ceiling=0.39, overlap_inter=_IB_OVERLAP, source="SB-g",
    ),
    "b200": Hardware(
        name="b200", description="NVIDIA B200 (1000 W) 180GB usable, NVLink5, 8 per node",
        peak_flops={"bf16": 2250 * _T, "fp16": 2250 * _T, "fp8": 4500 * _T, "fp32": 80 * _T},
        hbm_bytes=180 * _GB, hbm_bw=8.0 * _T, intra_bw=900 * _GB, inter_bw=50 * _GB,
        domain=8, topology="switch", mfu_ceiling=0.39, overlap_inter=_IB_OVERLAP,
        source="GK (datasheet), SB-g",
    ),
    "mi300x": Hardware(
        name="mi300x", description="AMD MI300X 192GB, 8-GPU xGMI mesh (7 links x 64 GB/s)",
        peak_flops={"bf16": 1307 * _T, "fp16": 1307 * _T, "fp8": 2615 * _T, "fp32": 163 * _T},
        hbm_bytes=192 * _GB, hbm_bw=5.3 * _T, intra_bw=448 * _GB, inter_bw=50 * _GB,
        domain=8, topology="mesh", eff_intra=0.7, mfu_ceiling=0.39, overlap_inter=_IB_OVERLAP,
        source="wheelersnetwork 2024-01; peak recalled from AMD's datasheet; fractions assumed",
    ),
    "tpu-v4": Hardware(
        name="tpu-v4", description="TPU v4 32GB, 3-D torus ICI, 4096-chip pod",
        peak_flops={"bf16": 275 * _T, "int8": 275 * _T},
        hbm_bytes=32 * _GIB, hbm_bw=1.2 * _T, intra_bw=45 * _GB, inter_bw=6.25 * _GB,
        domain=4096, topology="torus3d", latency_intra=1e-6, eff_intra=0.9, mfu_ceiling=0.6,
        overlap_inter=0.0, memory_fraction=30.75 / 32,
        source="SB-t; PaLM (arXiv:2204.02311) for the ceiling; XLA:TPU capacity 30.75 GiB",
    ),
    "tpu-v5e": Hardware(
        name="tpu-v5e", description="TPU v5e 16GB, 2-D torus ICI 16x16",
        peak_flops={"bf16": 197 * _T, "int8": 394 * _T},
        hbm_bytes=16 * _GIB, hbm_bw=0.82 * _T, intra_bw=45 * _GB, inter_bw=3.125 * _GB,
        domain=256, topology="torus2d", latency_intra=1e-6, eff_intra=0.9, mfu_ceiling=0.6,
        overlap_inter=0.0, memory_fraction=15.75 / 16,
        source="GC, SB-t; MaxText v5e README for the ceiling; XLA:TPU capacity 15.75 GiB",
    ),
    "tpu-v5p": Hardware(
        name="tpu-v5p", description="TPU v5p 95GB, 3-D torus ICI, slices to 8960 chips",
        peak_flops={"bf16": 459 * _T, "int8": 918 * _T, "fp8": 459 * _T},
        hbm_bytes=96 * _GIB, hbm_bw=2.765 * _T, intra_bw=90 * _GB, inter_bw=6.25 * _GB,
        domain=8960, topology="torus3d", latency_intra=1e-6, eff_intra=0.9, mfu_ceiling=0.7,
        overlap_inter=0.0, memory_fraction=95.74 / 96,
        source="GC (sold as 95 GB), SB-t (90 GB/s effective per link); MaxText README for "
        "the ceiling; XLA:TPU capacity 95.74 GiB",
    ),
    "tpu-v6e": Hardware(
        name="tpu-v6e", description="TPU v6e (Trillium) 32GB, 2-D torus ICI 16x16",
        peak_flops={"bf16": 918 * _T, "int8": 1836 * _T},
        hbm_bytes=32 * _GIB, hbm_bw=1.64 * _T, intra_bw=90 * _GB, inter_bw=12.5 * _GB,
        domain=256, topology="torus2d", latency_intra=1e-6, eff_intra=0.9, mfu_ceiling=0.55,
        overlap_inter=0.0, memory_fraction=31.25 / 32,
        source="GC, SB-t; MaxText custom-model guide (39.8% at 900B dense) for the ceiling; "
        "XLA:TPU capacity 31.25 GiB",
    ),
    "cpu": Hardware(
        name="cpu", description="this machine: 2 AMD EPYC cores, simulated devices in one host",
        peak_flops={"bf16": 166 * _GB, "fp32": 166 * _GB},
        hbm_bytes=24 * 2**30, hbm_bw=20 * _GB, intra_bw=10 * _GB, inter_bw=10 * _GB,
        domain=1 << 20, topology="host", latency_intra=20e-6, eff_intra=1.0, eff_inter=1.0,
        mfu_ceiling=0.3,  # XLA:CPU's memory habits: `cpu_habits()`, set by `get_hardware`
        source="lscpu on this machine (2 cores x 2.6 GHz x 32 FLOP/cycle)",
    ),
}  # fmt: skip

# XLA:CPU's memory habits, keyed on how the running XLA compiles a bf16 matmul
# (`bf16_dot_dtype`), measured on shardkit's GPT (8 simulated devices, docs/plan.md) from the
# buffers live at the heap peak (`--xla_dump_to`: *-live-range.txt "Live ranges at N (peak)")
_CPU_HABITS: dict[str, dict[str, int | None]] = {
    # jax/jaxlib 0.10.2: bf16 dots run in f32 (their operands converted to f32, an f32
    # result): the f32 copies are what the step keeps, so the stashed block inputs
    # (f32[2,16,16,64] at tensor=8), the ZeRO-3-gathered weights, the MLP-up output
    # (the GELU input) and every matmul output are f32
    "f32": dict(dot_output_bytes=4, activation_upcast=4, gathered_layers=1,
                library_reduce_rows=4096, gathered_bytes=None, norm_input_bytes=None,
                accumulated_grad_bytes=None, primitive_residuals=True),
    # jax/jaxlib 0.12.0.1: bf16 dots run natively as bf16 YNNPACK fusions (bf16 operands and
    # result): the stash is bf16[2,16,16,64], gathered weights bf16[64,64], the MLP hidden
    # bf16 throughout; what the model itself computes in f32 stays f32: both norms' inputs
    # (f32[16,16,64] x 2), the softmax, and the fp32 weights' full-size gradients (the bf16
    # gradient dot, then an f32 copy for the reduce-scatter: bf16 + f32[256,64]); with
    # micro-batches, the weight gradients and their accumulator are bf16 (bf16[64,256] x 2
    # where 0.10 held f32[64,256] x 2, pipeline data=2 x stage=4)
    "bf16": dict(dot_output_bytes=None, activation_upcast=None, gathered_layers=1,
                 library_reduce_rows=4096, gathered_bytes=4, norm_input_bytes=4,
                 accumulated_grad_bytes=2, primitive_residuals=True),
}  # fmt: skip


@functools.cache
def bf16_dot_dtype() -> str:
    """The dtype in which the running XLA:CPU computes a bf16 x bf16 matmul: "f32" or "bf16".

    Compiles one small bf16 matmul for the CPU backend and reads the compiled `dot`'s result
    type (jaxlib 0.10.2: f32, converted back after; 0.12: bf16). Without JAX, or when the
    compiled text has no dot, "f32" (the habits measured first).
    """
    try:
        import jax
        import jax.numpy as jnp

        x = jax.ShapeDtypeStruct((256, 64), jnp.bfloat16)
        y = jax.ShapeDtypeStruct((64, 256), jnp.bfloat16)
        lowered = jax.jit(lambda a, b: a @ b).trace(x, y).lower(lowering_platforms=("cpu",))
        text = lowered.compile(device_assignment=(jax.devices("cpu")[0],)).as_text()
    except Exception:  # no JAX or no CPU backend: the habits measured first
        return "f32"
    found = re.search(r"= (\w+)\[[\d,]*\]\S* dot\(", text)
    return "bf16" if found and found.group(1) == "bf16" else "f32"


def cpu_habits() -> dict[str, int | None]:
    """XLA:CPU's memory habits for the running jaxlib (`Hardware` fields; see `_CPU_HABITS`).

    Chosen once, by `bf16_dot_dtype()`: whether XLA:CPU runs bf16 matmuls in f32 (and so
    keeps the activations, gathered weights and matmul outputs around them in f32) or
    natively in bf16.
    """
    return dict(_CPU_HABITS[bf16_dot_dtype()])


_ALIASES = {"a100-80gb": "a100", "h100-sxm": "h100", "v4": "tpu-v4", "v5e": "tpu-v5e",
            "v5p": "tpu-v5p", "v6e": "tpu-v6e", "trillium": "tpu-v6e", "host": "cpu"}  # fmt: skip


def known_hardware() -> list[str]:
    """Names of the built-in profiles."""
    return sorted(PROFILES)


def get_hardware(name: str | Hardware) -> Hardware:
    """Returns the profile called `name` (case-insensitive; "v5p" = "tpu-v5p").

    Args:
        name: a profile name or a `Hardware` (returned unchanged).

    Raises:
        UnknownHardwareError: for an unknown name; the message lists the known ones.

    Example:
        >>> get_hardware("v5p").name
        'tpu-v5p'
    """
    if isinstance(name, Hardware):
        return name
    key = str(name).strip().lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    if key not in PROFILES:
        raise UnknownHardwareError(
            f"unknown hardware {name!r}; known: {', '.join(known_hardware())}; fix: pass one "
            "of those, or a shardkit.plan.Hardware(...) with your chip's figures."
        )
    if key == "cpu":  # the running XLA:CPU's habits (`cpu_habits`)
        return _cpu_profile()
    return PROFILES[key]


# substrings of a JAX device's `device_kind` (lower case) -> profile name; first match wins
_KINDS = (("h100", "h100"), ("h200", "h200"), ("b200", "b200"), ("a100", "a100"),
          ("mi300", "mi300x"), ("v4", "tpu-v4"), ("v5 lite", "tpu-v5e"), ("v5e", "tpu-v5e"),
          ("v5p", "tpu-v5p"), ("v5", "tpu-v5p"), ("v6", "tpu-v6e"))  # fmt: skip


def hardware_for(devices: Any) -> str:
    """The profile name of these JAX devices: "cpu" on CPU, else by `device_kind`.

    Reads only the first device's `platform` and `device_kind`, so the planner stays free of
    JAX (pass `jax.devices()`).

    Raises:
        UnknownHardwareError: for an accelerator with no profile (names the known ones).

    Example:
        >>> import jax
        >>> hardware_for(jax.devices())  # on the simulated CPU devices
        'cpu'
    """
    device = devices[0]
    if device.platform == "cpu":
        return "cpu"
    kind = device.device_kind.lower()
    for key, name in _KINDS:
        if key in kind:
            return name
    raise UnknownHardwareError(
        f"no hardware profile for {device.device_kind!r}; fix: name the closest profile "
        "(Auto(hardware='h100'), shardkit plan --hardware h100), pass --strategy with --mesh, "
        f"or give a shardkit.plan.Hardware(...) (known: {', '.join(known_hardware())})."
    )


@functools.cache
def _cpu_profile() -> Hardware:
    return PROFILES["cpu"].replace(**cpu_habits())
