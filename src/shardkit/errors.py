"""shardkit's exception base, and the rule errors every layer above the rules may raise.

Every error shardkit raises derives from :class:`ShardkitError`, so ``except ShardkitError``
catches them all, and also from the built-in type users already catch (``ValueError``,
``TypeError``, ``RuntimeError``). Messages say what is wrong, where (argument or pytree path,
shapes, mesh axis sizes) and end with a fix.
"""

from __future__ import annotations

__all__ = [
    "ShardingRuleError",
    "ShardkitError",
    "ShardkitRuntimeError",
    "ShardkitTypeError",
    "ShardkitValueError",
]


class ShardkitError(Exception):
    """Base of every error shardkit raises."""


class ShardingRuleError(ShardkitError, ValueError):
    """Partition rules are malformed, or do not fit a tree/mesh (base of all rule errors)."""


class ShardkitValueError(ShardkitError, ValueError):
    """A bad value: an argument, a shape, a mesh axis size, a layout that cannot run."""


class ShardkitTypeError(ShardkitError, TypeError):
    """An argument of the wrong type."""


class ShardkitRuntimeError(ShardkitError, RuntimeError):
    """A failure while running (a process, a schedule, the environment), with its fix."""
