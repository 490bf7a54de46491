"""How often each computation of a parsed HLO module runs: through while loops whose trip
count XLA states, and through conditionals weighted by how often each branch is taken. The
public names are re-exported by `shardkit.inspection.hlo`."""

from __future__ import annotations

import collections
import re
from collections.abc import Mapping, Sequence

from shardkit.errors import ShardkitValueError
from shardkit.inspection.hlo_parse import HloModule, Instruction

_CALLEE_RE = re.compile(
    r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
)
_BRANCHES_RE = re.compile(r"\bbranch_computations=\{([^}]*)\}")
_NAME_RE = re.compile(r"%([\w.\-]+)")


def conditional_matches(module: HloModule, key: str) -> list[Instruction]:
    """The `conditional` instructions that `key` names, in text order.

    A key names a conditional by its instruction name (`conditional.3`) or by one component
    of its `op_name` (JAX's name stack, e.g. the `jax.named_scope` it was traced under:
    `jit(f)/while/body/lane0/cond` has components `jit(f)`, `while`, `body`, `lane0`, `cond`).

    Example:
        >>> from shardkit.inspection.hlo import parse_hlo
        >>> def f(c, ks):
        ...     def step(c, k):
        ...         with jax.named_scope("lane0"):
        ...             c = jax.lax.switch(k, [lambda c: c + 1, lambda c: c * 2, jnp.sin], c)
        ...         return c, None
        ...     return jax.lax.scan(step, c, ks)[0]
        >>> text = jax.jit(f).lower(1.0, jnp.array([0, 1, 1, 0, 2])).compile().as_text()
        >>> [c.opcode for c in conditional_matches(parse_hlo(text), "lane0")]
        ['conditional']
    """
    return [
        ins
        for ins in module.instructions()
        if ins.opcode == "conditional"
        and (ins.name == key or key in (ins.op_name or "").split("/"))
    ]


def _branches(ins: Instruction) -> list[str]:
    """Branch computations of a conditional, by branch index (false, true for a predicate)."""
    b = _BRANCHES_RE.search(ins.attrs)
    if b:
        return _NAME_RE.findall(b.group(1)) or [n.strip() for n in b.group(1).split(",")]
    named = dict(_CALLEE_RE.findall(ins.attrs))
    return [named[r] for r in ("false_computation", "true_computation") if r in named]


def _branch_weights(
    module: HloModule, branch_counts: Mapping[str, Sequence[int]]
) -> dict[tuple[str, str], tuple[int, ...]]:
    """(computation, conditional name) -> executions per branch, checked against the text."""
    out: dict[tuple[str, str], tuple[int, ...]] = {}
    for key, weights in branch_counts.items():
        weights = tuple(int(w) for w in weights)
        found = conditional_matches(module, key)
        if not found:
            names = sorted({i.op_name or i.name for i in module.instructions()
                            if i.opcode == "conditional"})  # fmt: skip
            raise ShardkitValueError(
                f"execution_counts(branch_counts=...): key {key!r} names no conditional of "
                f"module {module.name} (its conditionals: {names[:6] or 'none'}); fix: key by "
                "an instruction name or an op_name component, e.g. the jax.named_scope the "
                "lax.switch runs under."
            )
        if min(weights, default=-1) < 0 or not sum(weights):
            raise ShardkitValueError(
                f"execution_counts(branch_counts=...): branch_counts[{key!r}] = {weights} "
                "must be executions per branch, >= 0 and not all 0; fix: count how often "
                "each branch index is taken, e.g. numpy.bincount(indices, minlength=n)."
            )
        for ins in found:
            n = len(_branches(ins))
            if n != len(weights):
                raise ShardkitValueError(
                    f"execution_counts(branch_counts=...): branch_counts[{key!r}] has "
                    f"{len(weights)} counts but conditional {ins.name} has {n} branches; fix: "
                    f"give one count per branch, in branch-index order ({n} values)."
                )
            where = (ins.computation, ins.name)
            if where in out and out[where] != weights:
                raise ShardkitValueError(
                    f"execution_counts(branch_counts=...): conditional {ins.name} is named by "
                    f"two keys with different counts ({out[where]} and {weights}); fix: key "
                    "each conditional once."
                )
            out[where] = weights
    return out


def execution_counts(
    module: HloModule, branch_counts: Mapping[str, Sequence[int]] | None = None
) -> dict[str, int | None]:
    """How many times each computation runs per call of the ENTRY computation.

    While bodies run `known_trip_count` times per execution of the loop (conditions once more);
    when XLA states no trip count the result is None ("unknown"). Branches of a conditional
    count as if taken (an upper bound) unless `branch_counts` says how often each is taken.
    Fusion and reducer computations get their caller's count.

    Args:
        module: a parsed program.
        branch_counts: conditional key -> executions per branch (branch-index order; false,
            true for a predicated conditional), for conditionals whose branch is chosen by
            data, e.g. a `lax.switch` over a table inside a `lax.scan`. Of every sum(counts)
            executions of the conditional, branch k runs counts[k] times; a key is an
            instruction name or an `op_name` component (`conditional_matches`). Counts are
            exact when the conditional's executions are a multiple of sum(counts) (a
            conditional in the body of a scan over a table of sum(counts) rows), else rounded.

    Raises:
        ValueError: a key names no conditional, has the wrong number of counts, or counts
            below 0 or all 0.

    Example:
        >>> from shardkit.inspection.hlo import parse_hlo
        >>> def f(c, ks):  # a 5-step scan whose body switches between 3 branches
        ...     def step(c, k):
        ...         with jax.named_scope("lane0"):
        ...             c = jax.lax.switch(k, [lambda c: c + 1, lambda c: c * 2, jnp.sin], c)
        ...         return c, None
        ...     return jax.lax.scan(step, c, ks)[0]
        >>> text = jax.jit(f).lower(1.0, jnp.array([0, 1, 1, 0, 2])).compile().as_text()
        >>> module = parse_hlo(text)
        >>> (cond,) = conditional_matches(module, "lane0")
        >>> execution_counts(module)[cond.computation]   # the body of the scan
        5
        >>> branch_1 = _branches(cond)[1]
        >>> execution_counts(module)[branch_1]            # as if taken at every step
        5
        >>> # of the 5 steps, branch 0 runs twice, branch 1 twice, branch 2 once
        >>> execution_counts(module, {"lane0": (2, 2, 1)})[branch_1]
        2
    """
    weights = _branch_weights(module, branch_counts or {})
    calls: dict[str, list[tuple[str, str, Instruction, int]]] = collections.defaultdict(list)
    for comp, instrs in module.computations.items():
        for ins in instrs:
            if "=" not in ins.attrs or ins.opcode.endswith(("-done", "-update")):
                continue  # the -done/-update half of an async op names the same callee
            if ins.opcode == "conditional":
                for k, callee in enumerate(_branches(ins)):
                    calls[callee].append((comp, "branch", ins, k))
                continue
            for role, callee in _CALLEE_RE.findall(ins.attrs):
                calls[callee].append((comp, role, ins, 0))
    counts: dict[str, int | None] = {}
    visiting: set[str] = set()

    def count(comp: str) -> int | None:
        if comp in counts:
            return counts[comp]
        if comp == module.entry:
            return 1
        if comp in visiting:  # recursion cannot happen in HLO; be safe
            return None
        visiting.add(comp)
        total: int | None = 0
        for caller, role, ins, k in calls.get(comp, []):
            c = count(caller)
            w = weights.get((caller, ins.name)) if role == "branch" else None
            if role in ("body", "condition"):
                trip = ins.trip_count
                mult = None if trip is None else trip + (role == "condition")
            else:
                mult = 1
            if c is None or mult is None or total is None:
                total = None
            elif w is not None:
                total += (2 * c * w[k] + sum(w)) // (2 * sum(w))  # c x w[k] / sum(w), rounded
            else:
                total += c * mult
        visiting.discard(comp)
        counts[comp] = total
        return total

    for comp in module.computations:
        counts[comp] = count(comp)
    return counts
