"""The planner's one check of a number given by the user: its kind, and its value normalised.

The planner is arithmetic on the sizes it is given, so a negative width, a NaN FLOP count or a
zero bandwidth comes out as a negative peak, a NaN time or a `ZeroDivisionError` far from where
it went in. `checked` stops it where it enters (a workload's or a profile's constructor, an
argument of `plan`) with one `ShardkitValueError` that names the argument and its value and
ends with a fix. Counts are ints, and numpy integers are ints too; a bool is no count, and a
float is not truncated in silence, even when it holds a whole number.

Example:
    >>> checked(numpy.int64(8), "devices", "count", where="plan: ")  # a numpy integer is a count
    8
    >>> checked(16.0, "batch", "count", where="plan: ")  # raises ShardkitValueError:
    plan: batch=16.0 must be a positive int, not a float; fix: batch=int(16.0).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Literal

from shardkit.errors import ShardkitValueError

Kind = Literal["count", "size", "positive", "nonnegative", "fraction", "share"]

# what each kind needs, as the message says it
_NEEDS: dict[str, str] = {
    "count": "a positive int",
    "size": "an int >= 0",
    "positive": "a finite number > 0",
    "nonnegative": "a finite number >= 0",
    "fraction": "a number in (0, 1]",
    "share": "a number in [0, 1]",
}


def _fits(value: Any, kind: str) -> bool:
    if kind in ("count", "size"):
        return isinstance(value, numbers.Integral) and value >= (1 if kind == "count" else 0)
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        return False
    low_ok = value > 0 or (value == 0 and kind in ("nonnegative", "share"))
    return low_ok and (kind in ("positive", "nonnegative") or value <= 1)


def checked(
    value: Any,
    arg: str,
    kind: Kind,
    *,
    where: str = "",
    optional: str | None = None,
    fix: str | None = None,
    setter: str = "{arg}={value}",
    need: str | None = None,
) -> Any:
    """`value` as an `int` (counts, sizes) or a `float` (the others), else raises.

    Args:
        value: what the user gave.
        arg: the argument or field it was given as.
        kind: "count" (int >= 1), "size" (int >= 0), "positive" / "nonnegative" (finite
            real > 0 / >= 0), "fraction" (in (0, 1]) or "share" (in [0, 1]).
        where: the message's prefix naming the owner ("Transformer ", "plan: ").
        optional: None is allowed, and means this (e.g. "the default: 4 x d_model"); the fix
            then offers `arg=None`.
        fix: the fix to propose (default: `setter` with what `kind` needs); a float that
            holds a whole number gets `int(...)` instead.
        setter: how the user types the fix, with `{arg}` and `{value}` (e.g.
            "Hardware.replace({arg}={value})").
        need: what the message says `value` must be (default: what `kind` needs).

    Raises:
        ShardkitValueError: naming `arg=value`, what it must be, and a fix. A bool is refused
            where a number is needed; a float holding a whole number where an int is needed
            gets `int(...)` as its fix.
    """
    if value is None and optional is not None:
        return None
    if not isinstance(value, bool) and _fits(value, kind):
        return int(value) if kind in ("count", "size") else float(value)
    need = (need or _NEEDS[kind]) + (f" or None ({optional})" if optional is not None else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        need += f", not a {type(value).__name__}"
    elif kind in ("count", "size") and not isinstance(value, numbers.Integral):
        need += ", not a float"
        if math.isfinite(value) and value == int(value) and _fits(int(value), kind):
            fix = setter.format(arg=arg, value=f"int({value!r})")  # the closest fix
    if fix is None:
        fix = setter.format(arg=arg, value=f"<{_NEEDS[kind]}>")
        if optional is not None:
            fix = f"{setter.format(arg=arg, value='None')} ({optional}), or {fix}"
    raise ShardkitValueError(f"{where}{arg}={value!r} must be {need}; fix: {fix}.")


def checked_fields(obj: Any, kinds: dict[str, str], *, where: str, **options: Any) -> None:
    """Checks the fields of a frozen dataclass `obj` with `checked`, storing the normalised
    values (a numpy integer becomes an `int`, so the value serialises to JSON).

    `options` are `checked`'s keywords, applied to every field; a field whose kind ends with
    "?" (e.g. "count?") may be None, with `optional[field]` (a dict) saying what None means.
    """
    optional = options.pop("optional", {})
    for field, kind in kinds.items():
        none = optional.get(field, "unset") if kind.endswith("?") else None
        value = checked(getattr(obj, field), field, kind.rstrip("?"), where=where,
                        optional=none, **options)  # fmt: skip
        object.__setattr__(obj, field, value)  # frozen: the same value, normalised
