"""Schedule names: one vocabulary for the CLI, the strategies and the planner.

Every schedule's ``.name`` reads back into an equal schedule (``schedule_from_name(s.name) ==
s``): "gpipe", "1f1b" (fused two-lane 1F1B), "1f1b-unfused" (the textbook one-lane table),
"interleaved-v2" (any v; plain "interleaved" takes ``virtual``), "zb-h1" and "zb-h1-fused".

Example:
    >>> schedule_from_name("interleaved", virtual=3).name
    'interleaved-v3'
    >>> schedule_from_name("interleaved-v3") == schedule_from_name("interleaved", virtual=3)
    True
"""

from __future__ import annotations

import re

from shardkit.errors import ShardkitError
from shardkit.pipeline.schedule import GPipe, Interleaved, OneFOneB, Schedule, ZeroBubbleH1

__all__ = ["SCHEDULE_NAMES", "UnknownScheduleError", "schedule_from_name"]

SCHEDULE_NAMES = ("gpipe", "1f1b", "1f1b-unfused", "interleaved", "zb-h1", "zb-h1-fused")

_MAKERS = {
    "gpipe": GPipe,
    "1f1b": OneFOneB,
    "1f1b-unfused": lambda: OneFOneB(fused=False),
    "zb-h1": ZeroBubbleH1,
    "zbh1": ZeroBubbleH1,
    "zb-h1-fused": lambda: ZeroBubbleH1(fused=True),
}


class UnknownScheduleError(ShardkitError, ValueError):
    """A pipeline schedule name shardkit does not know."""


def schedule_from_name(name: str, *, virtual: int = 2) -> Schedule:
    """The `shardkit.pipeline` schedule for a name (case and ``_``/``-`` do not matter).

    Args:
        name: one of `SCHEDULE_NAMES`, or any schedule's ``.name`` ("interleaved-v4").
        virtual: virtual stages per device for a plain "interleaved".

    Raises:
        UnknownScheduleError: for an unknown name (a ValueError; lists the known ones).
    """
    key = name.strip().lower().replace("_", "-")
    inter = re.fullmatch(r"interleaved(?:-v(\d+))?", key)
    if inter:
        return Interleaved(v=int(inter.group(1)) if inter.group(1) else virtual)
    if key not in _MAKERS:
        raise UnknownScheduleError(
            f"unknown pipeline schedule {name!r}; fix: use one of {', '.join(SCHEDULE_NAMES)}, "
            "e.g. --schedule 1f1b."
        )
    return _MAKERS[key]()
