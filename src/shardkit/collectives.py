"""The bytes a collective moves per device: one formula for the planner and the audit.

Ring formulas over a group of n devices, per device and per execution: an all-gather moves
(n-1)/n of the gathered result, a reduce-scatter or all-to-all (n-1)/n of its operand, an
all-reduce 2(n-1)/n of its operand (a reduce-scatter and an all-gather), a collective-permute
or collective-broadcast its whole operand. The planner predicts with them
(`shardkit.plan.comm`) and the audit measures compiled programs with them
(`shardkit.inspection`), so predictions and programs compare in one unit.
"""

from __future__ import annotations

import numbers

from shardkit.errors import ShardkitTypeError, ShardkitValueError

__all__ = ["FORMULAS", "KINDS", "bytes_moved"]

FORMULAS = {
    "all-gather": "(n-1)/n x gathered result bytes",
    "reduce-scatter": "(n-1)/n x operand bytes",
    "all-reduce": "2(n-1)/n x operand bytes",
    "all-to-all": "(n-1)/n x operand bytes",
    "collective-permute": "1 x operand bytes",
    "collective-broadcast": "1 x operand bytes",
}
KINDS = tuple(FORMULAS)


def bytes_moved(kind: str, nbytes: float, size: int) -> float:
    """Bytes each device sends for one `kind` collective over `size` devices.

    Args:
        kind: one of `KINDS`.
        nbytes: the gathered result for an all-gather, the operand otherwise.
        size: devices in the group (a permute moves its operand whenever it runs).

    Raises:
        ValueError: for an unknown kind, negative bytes, or a group size that is not a whole
            number >= 1.
        TypeError: `kind` is not a string, or `nbytes`/`size` not numbers.

    Example:
        >>> bytes_moved("all-reduce", 1000, 4), bytes_moved("all-gather", 1000, 4)
        (1500.0, 750.0)
    """
    if not isinstance(kind, str):
        raise ShardkitTypeError(
            f"bytes_moved: kind is {type(kind).__name__} {kind!r}, not a string; fix: one of "
            f"{KINDS}."
        )
    if kind not in FORMULAS:
        raise ShardkitValueError(f"unknown collective {kind!r}; fix: one of {KINDS}.")
    for name, v in (("nbytes", nbytes), ("size", size)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise ShardkitTypeError(
                f"bytes_moved({kind!r}, ...): {name}={v!r} is {type(v).__name__}, not a "
                "number; fix: bytes_moved('all-reduce', 1000, 4)."
            )
    if nbytes < 0:
        raise ShardkitValueError(
            f"bytes_moved({kind!r}, ...): nbytes={nbytes} is negative; fix: the buffer's size "
            "in bytes (>= 0)."
        )
    if kind in ("collective-permute", "collective-broadcast"):
        return float(nbytes)  # whatever the group: an empty permute in HLO text has size 0
    if size < 1 or size != int(size):
        raise ShardkitValueError(
            f"bytes_moved({kind!r}, ...): size={size} is not a whole number of devices >= 1; "
            "fix: the devices in the collective's group, e.g. the mesh axis size."
        )
    if size == 1:
        return 0.0
    share = nbytes * (size - 1) / size
    return 2 * share if kind == "all-reduce" else share
