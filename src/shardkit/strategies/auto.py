"""`Auto`: picks a simple, sensible strategy from model and device sizes, and says why."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from shardkit.errors import ShardkitValueError
from shardkit.strategies.core import TENSOR_NAMES, DataParallel, Hybrid

_ADAM_BYTES_PER_PARAM = 16  # fp32 weights 4 + grads 4 + Adam m and v 8 (theory notes, ZeRO)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Auto:
    """Chooses data, FSDP and tensor degrees from sizes; `choose` returns the strategy and why.

    Rules, in order:
      1. one device: `DataParallel` (nothing to split);
      2. tensor=2 when the model names "mlp"/"heads"/"vocab" dims that 2 divides and there are
         at least 4 devices (the smallest degree that splits every matmul; Megatron TP stays
         compute-bound while its degree is below d_ff x bandwidth / peak FLOP/s);
      3. the other devices split the batch: "data" when the training state (16 bytes per
         parameter with Adam) fits in `fraction` of `memory_per_device`, else "fsdp" (ZeRO-3).

    Args:
        memory_per_device: bytes per device; default 16 GiB.
        fraction: share of device memory the replicated state may use (default 0.5).

    Example:
        >>> import jax
        >>> params = {"w": jax.ShapeDtypeStruct((64, 64), "float32")}
        >>> strategy, why = Auto().choose(params, n_devices=8)
        >>> strategy
        DataParallel(data=-1)

    See also: `Hybrid`, `shardkit.strategies.resolve`.
    """

    memory_per_device: int = 16 << 30
    fraction: float = 0.5

    def __post_init__(self):
        if self.memory_per_device <= 0 or not 0 < self.fraction <= 1:
            raise ShardkitValueError(
                f"Auto(memory_per_device={self.memory_per_device}, fraction={self.fraction}) "
                "needs a positive memory and 0 < fraction <= 1; fix: Auto(fraction=0.5)."
            )

    def choose(
        self, params: Any, *, n_devices: int, logical: Any = None, batch: int | None = None
    ) -> tuple[Any, str]:
        """Returns (strategy, one-paragraph reason) for `params` on `n_devices`.

        Args:
            params: pytree of arrays or ShapeDtypeStructs.
            n_devices: number of devices.
            logical: tree of logical axis names (enables tensor parallelism).
            batch: global batch size; batch-split degrees are kept to divisors of it.
        """
        leaves = jax.tree.leaves(params)
        n_params = sum(math.prod(x.shape) for x in leaves)
        state = _ADAM_BYTES_PER_PARAM * n_params
        budget = self.fraction * self.memory_per_device
        if n_devices == 1:
            return DataParallel(), "one device: nothing to split."
        tensor = 2 if n_devices >= 4 and n_devices % 2 == 0 and _tp_ok(params, logical) else 1
        rest = n_devices // tensor
        if batch is not None and batch % rest:
            raise ShardkitValueError(
                f"batch={batch} is not divisible by the {rest} devices that split the batch "
                f"({n_devices} devices / tensor={tensor}); fix: use a batch that is a multiple "
                f"of {rest}."
            )
        mb = state / 2**20
        fits = state <= budget
        split = "data" if fits else "fsdp"
        why = (
            f"{n_params:,} parameters need {mb:,.1f} MiB of training state (16 B/param with "
            f"Adam), which {'fits' if fits else 'does not fit'} in {self.fraction:.0%} of "
            f"{self.memory_per_device / 2**30:.0f} GiB per device, so the batch is split over "
            f"'{split}' ({rest}-way{'' if fits else ', ZeRO-3: state split too'})"
        )
        if tensor > 1:
            why += (
                "; tensor=2 because the model names heads/mlp/vocab dims: Megatron splits every "
                "matmul at the smallest degree, keeping communication per layer to 2 all-reduces"
            )
        why += "."
        if tensor == 1:
            strategy = DataParallel() if fits else Hybrid(fsdp=-1)
        else:
            strategy = Hybrid(data=-1, tensor=tensor) if fits else Hybrid(fsdp=-1, tensor=tensor)
        return strategy, why


def _tp_ok(params, logical) -> bool:
    if logical is None:
        return False
    shapes = jax.tree.leaves(params)
    names = jax.tree.structure(params).flatten_up_to(logical)
    for leaf, nm in zip(shapes, names, strict=True):
        for t in TENSOR_NAMES:
            if nm and t in nm and leaf.shape[nm.index(t)] % 2 == 0:
                return True  # dims 2 does not divide stay replicated (shown in the layout table)
    return False
