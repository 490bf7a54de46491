"""Parsers for the command line's values (mesh axes, shapes, partition specs).

A leaf module: the ``shardkit`` command and each subcommand's module (``shardkit.train.command``,
``shardkit.inspection.command``) import it, and it imports no shardkit layer, so no layer
depends on the CLI. JAX is imported only where a value needs it (a PartitionSpec), so
``shardkit --help`` stays instant.
"""

from __future__ import annotations

import argparse
import math
import re

from shardkit.errors import ShardkitError

__all__ = [
    "CLIError",
    "OneLineParser",
    "at_least",
    "parse_mesh_arg",
    "parse_shape_arg",
    "parse_spec_arg",
    "port_number",
]


class CLIError(ShardkitError, ValueError):
    """A bad command-line value; the message says how to write it."""


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line with a fix, exit status 2."""

    def error(self, message: str):  # argparse's hook: print, then exit 2
        self.exit(2, f"{self.prog}: error: {message}; fix: see {self.prog} --help.\n")


def at_least(low: int):
    """An argparse `type`: an integer >= `low` (the message names the bound)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}, the smallest allowed")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def port_number(text: str) -> int:
    """An argparse `type`: a TCP port, 1 to 65535."""
    value = at_least(1)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1 to 65535)")
    return value


def positive_seconds(text: str) -> float:
    """An argparse `type`: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{value:g} is not a positive number of seconds")
    return value


def parse_mesh_arg(text: str) -> dict[str, int]:
    """``"data=4,model=2"`` -> ``{"data": 4, "model": 2}`` (``-1`` allowed once)."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, size = part.partition("=")
        if not eq or not name:
            raise CLIError(f"--mesh {text!r}: write mesh axes as name=size, e.g. data=4,model=2.")
        if name.strip() in out:
            raise CLIError(
                f"--mesh {text!r}: mesh axis {name.strip()!r} is given twice; fix: name each "
                "axis once, e.g. --mesh data=4,model=2."
            )
        try:
            out[name.strip()] = int(size)
        except ValueError:
            raise CLIError(
                f"--mesh {text!r}: size of mesh axis {name!r} is {size!r}, not an integer. "
                "Example: --mesh data=4,model=2."
            ) from None
    if not out:
        raise CLIError("--mesh is empty. Example: --mesh data=4,model=2.")
    return out


def parse_shape_arg(text: str) -> tuple[int, ...]:
    """``"16,16"`` -> ``(16, 16)``."""
    try:
        shape = tuple(int(s) for s in re.split(r"[,x]", text.strip()))
    except ValueError:
        raise CLIError(f"--shape {text!r}: write dims as integers, e.g. --shape 16,16.") from None
    if not shape or any(d <= 0 for d in shape):
        raise CLIError(f"--shape {text!r}: dims must be positive integers, e.g. --shape 16,16.")
    return shape


def parse_spec_arg(text: str):
    """``"data,model"`` -> ``P('data', 'model')``; ``none``/``_``/empty = unsharded dim;
    ``data+model`` = a dim split over two mesh axes."""
    from jax.sharding import PartitionSpec

    entries: list[str | tuple[str, ...] | None] = []
    for part in (p.strip() for p in text.split(",")) if text.strip() else []:
        if part.lower() in ("", "none", "_", "-"):
            entries.append(None)
        elif "+" in part:
            entries.append(tuple(a for a in part.split("+") if a))
        else:
            entries.append(part)
    return PartitionSpec(*entries)
