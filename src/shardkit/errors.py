"""shardkit's exception base, and the rule errors every layer above the rules may raise.

Every error shardkit raises derives from :class:`ShardkitError`, so ``except ShardkitError``
catches them all, and also from the built-in type users already catch (``ValueError``,
``TypeError``, ``RuntimeError``). Messages say what is wrong, where (argument or pytree path,
shapes, mesh axis sizes) and end with a fix.
"""

from __future__ import annotations

__all__ = ["ShardingRuleError", "ShardkitError"]


class ShardkitError(Exception):
    """Base of every error shardkit raises."""


class ShardingRuleError(ShardkitError, ValueError):
    """Partition rules are malformed, or do not fit a tree/mesh (base of all rule errors)."""
