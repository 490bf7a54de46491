"""The rule linter: every problem with a layout, found before anything compiles.

``lint(tree, rules_or_specs, mesh)`` checks each leaf's PartitionSpec against its shape and the
mesh, and reports, with the leaf path: leaves no rule matched, unknown mesh axis names, a mesh
axis used twice in one spec, a spec longer than the array's rank, and dims not divisible by the
mesh axes they are split over (with the padding needed and the mesh shapes that would divide).
It also sums bytes per device and the share of bytes that is replicated.

The result is a :class:`LintReport`: structured for tests (``report.findings``), printable as a
table, and able to raise the first error as a precise exception.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec

from shardkit.common import deprecated_aliases, format_bytes
from shardkit.errors import ShardingRuleError
from shardkit.leaves import is_variable, leaf_path_items, leaf_shape_dtype

__all__ = [
    "DuplicateMeshAxisError",
    "LintFinding",
    "IndivisibleShardingError",
    "LeafLayout",
    "LintReport",
    "SpecRankError",
    "UnknownMeshAxisError",
    "UnmatchedLeafError",
    "lint",
    "spec_axes",
]


class UnmatchedLeafError(ShardingRuleError):
    """A leaf that no partition rule (nor annotation nor default) covers."""


class UnknownMeshAxisError(ShardingRuleError):
    """A spec names a mesh axis the mesh does not have."""


class DuplicateMeshAxisError(ShardingRuleError):
    """A spec uses one mesh axis on two dims."""


class SpecRankError(ShardingRuleError):
    """A spec has more entries than the array has dims."""


class IndivisibleShardingError(ShardingRuleError):
    """A dim's size is not divisible by the product of the mesh axes it is split over."""


_ERRORS: dict[str, type[ShardingRuleError]] = {
    "unmatched": UnmatchedLeafError,
    "unknown-axis": UnknownMeshAxisError,
    "duplicate-axis": DuplicateMeshAxisError,
    "rank": SpecRankError,
    "indivisible": IndivisibleShardingError,
    "not-array": ShardingRuleError,
}


@dataclass(frozen=True)
class LintFinding:
    """One problem: ``code`` is one of unmatched, unknown-axis, duplicate-axis, rank,
    indivisible; ``severity`` is ``"error"`` or ``"warning"``."""

    path: str
    code: str
    severity: str
    message: str

    def __str__(self) -> str:
        return f"[{self.severity}] {self.code} at {self.path!r}: {self.message}"


@dataclass(frozen=True)
class LeafLayout:
    """A leaf's layout: its spec, which rule gave it, and its bytes (global, per device)."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    spec: PartitionSpec | None
    source: str | None
    bytes_global: int
    bytes_per_device: int
    replicated: bool


def spec_axes(spec: PartitionSpec) -> list[tuple[int, tuple[str, ...]]]:
    """``[(dim, mesh axes)]`` for each sharded dim of ``spec`` (unconstrained dims skipped)."""
    out = []
    for dim, entry in enumerate(spec):
        if entry is None or entry is PartitionSpec.UNCONSTRAINED:
            continue
        out.append((dim, (entry,) if isinstance(entry, str) else tuple(entry)))
    return out


def _mesh_sizes(mesh: Any) -> dict[str, int] | None:
    if mesh is None:
        return None
    if isinstance(mesh, Mapping):
        bad = {k: v for k, v in mesh.items() if isinstance(v, bool) or not isinstance(
            v, (int, np.integer)) or v < 1}  # fmt: skip
        if bad:
            raise ShardingRuleError(
                f"mesh: axis sizes {bad} are not positive ints (mesh {dict(mesh)}); fix: give "
                "each mesh axis its device count, e.g. {'data': 4, 'model': 2}."
            )
        return {str(k): int(v) for k, v in mesh.items()}
    if not hasattr(mesh, "shape") or not isinstance(mesh.shape, Mapping):
        raise ShardingRuleError(
            f"mesh: expected a Mesh, AbstractMesh or {{axis: size}} dict, got "
            f"{type(mesh).__name__}; fix: pass the mesh (shardkit.make_mesh(...)) or its sizes."
        )
    return {str(k): int(v) for k, v in mesh.shape.items()}


def _fmt_sizes(sizes: Mapping[str, int]) -> str:
    return "{" + ", ".join(f"{k!r}: {v}" for k, v in sizes.items()) + "}"


def _factorizations(n: int, k: int) -> list[tuple[int, ...]]:
    """All ways to write n as an ordered product of k positive integers."""
    if k == 1:
        return [(n,)]
    divs = [d for d in range(1, n + 1) if n % d == 0]
    return [(d, *rest) for d in divs for rest in _factorizations(n // d, k - 1)]


def _dividing_meshes(
    shape: tuple[int, ...], spec: PartitionSpec, sizes: Mapping[str, int], limit: int = 3
) -> list[dict[str, int]]:
    """Mesh shapes with the same device count and axis names under which ``spec`` divides
    ``shape``, nearest to the current one first."""
    names, cur = list(sizes), tuple(sizes.values())
    n = math.prod(cur)
    if len(names) > 5 or n > 4096:
        return []
    good = []
    for cand in _factorizations(n, len(names)):
        s = dict(zip(names, cand))
        if all(shape[d] % math.prod(s[a] for a in axes) == 0 for d, axes in spec_axes(spec)):
            dist = sum(abs(math.log2(a) - math.log2(b)) for a, b in zip(cand, cur))
            good.append((dist, cand, s))
    good.sort(key=lambda t: (t[0], t[1]))
    return [s for _, cand, s in good if cand != cur][:limit]


def check_leaf(
    path: str, shape: tuple[int, ...], spec: PartitionSpec, sizes: Mapping[str, int] | None
) -> list[LintFinding]:
    """All findings for one leaf's spec against its shape and the mesh axis sizes."""
    out: list[LintFinding] = []
    where = f"leaf {path!r} shape {shape} spec {spec}"
    mesh_txt = f" on mesh {_fmt_sizes(sizes)}" if sizes is not None else ""
    if len(spec) > len(shape):
        out.append(
            LintFinding(
                path,
                "rank",
                "error",
                f"{where}: the spec has {len(spec)} entries but the array has rank "
                f"{len(shape)}; fix: drop the extra entries, e.g. "
                f"{PartitionSpec(*tuple(spec)[: len(shape)])}, or match this leaf with a "
                "narrower rule.",
            )
        )
    axes_used = [a for _, axes in spec_axes(spec) for a in axes]
    for a in sorted({a for a in axes_used if axes_used.count(a) > 1}):
        out.append(
            LintFinding(
                path,
                "duplicate-axis",
                "error",
                f"{where}: mesh axis {a!r} is used on more than one dim; a mesh axis can split "
                "only one dim of an array; fix: use it once, e.g. shard the other dim over a "
                "different mesh axis or leave it None.",
            )
        )
    if sizes is None:
        return out
    unknown = sorted({a for a in axes_used if a not in sizes})
    for a in unknown:
        out.append(
            LintFinding(
                path,
                "unknown-axis",
                "error",
                f"{where}: mesh axis {a!r} is not in the mesh {_fmt_sizes(sizes)}; fix: use one of "
                f"{list(sizes)}, or map the logical name with Rules(..., logical={{{a!r}: "
                f"{next(iter(sizes))!r}}}).",
            )
        )
    if unknown or len(spec) > len(shape):
        return out
    for dim, axes in spec_axes(spec):
        k = math.prod(sizes[a] for a in axes)
        if shape[dim] % k:
            pad = -shape[dim] % k
            alts = _dividing_meshes(shape, spec, sizes)
            alt_txt = (
                f"use a mesh shape that divides, e.g. {', '.join(map(_fmt_sizes, alts))}; or "
                if alts
                else ""
            )
            axes_txt = " x ".join(f"{a!r} (size {sizes[a]})" for a in axes)
            out.append(
                LintFinding(
                    path,
                    "indivisible",
                    "error",
                    f"{where}: dim {dim} has size {shape[dim]}, which mesh axis {axes_txt} "
                    f"(product {k}) does not divide{mesh_txt}; fix: {alt_txt}pad dim {dim} to "
                    f"{shape[dim] + pad} (+{pad}); or leave dim {dim} unsharded (None).",
                )
            )
    return out


def _bytes(shape: tuple[int, ...], dtype: np.dtype, spec: PartitionSpec | None, sizes) -> int:
    local = list(shape)
    if spec is not None and sizes is not None:
        for dim, axes in spec_axes(spec):
            if dim < len(local) and all(a in sizes for a in axes):
                k = math.prod(sizes[a] for a in axes)
                local[dim] = -(-local[dim] // k)
    return int(math.prod(local)) * dtype.itemsize


@dataclass
class LintReport:
    """What :func:`lint` found: ``findings`` (problems) and ``leaves`` (each leaf's layout)."""

    findings: list[LintFinding]
    leaves: list[LeafLayout]
    mesh_sizes: dict[str, int] | None
    top: int = field(default=5, repr=False)
    # decisions worth knowing that are not problems (e.g. unannotated biases replicated)
    notes: list[str] = field(default_factory=list)
    # how each optimizer-state leaf was placed: rows with path, spec, how, param
    optimizer: list[Any] = field(default_factory=list)

    @property
    def errors(self) -> list[LintFinding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def bytes_global(self) -> int:
        return sum(leaf.bytes_global for leaf in self.leaves)

    @property
    def bytes_per_device(self) -> int:
        return sum(leaf.bytes_per_device for leaf in self.leaves)

    @property
    def replicated_fraction(self) -> float:
        """Share of per-device bytes held by fully replicated leaves."""
        total = self.bytes_per_device
        rep = sum(leaf.bytes_per_device for leaf in self.leaves if leaf.replicated)
        return rep / total if total else 0.0

    @property
    def redundant_fraction(self) -> float:
        """Share of all devices' memory for these leaves that holds copies (partial replication
        included): ``1 - bytes_global / (n_devices * bytes_per_device)``."""
        if not self.mesh_sizes:
            return 0.0
        n = math.prod(self.mesh_sizes.values())
        held = n * self.bytes_per_device
        return max(0.0, 1 - self.bytes_global / held) if held else 0.0

    def largest_replicated(self, n: int | None = None) -> list[LeafLayout]:
        reps = sorted((x for x in self.leaves if x.replicated), key=lambda x: -x.bytes_global)
        return reps[: self.top if n is None else n]

    def raise_if_errors(self) -> None:
        """Raises the first error as its precise exception (message lists how many more)."""
        if self.ok:
            return
        first = self.errors[0]
        more = len(self.errors) - 1
        tail = (
            f" ({more} more problem{'s' * (more != 1)}: run shardkit.lint for all)" if more else ""
        )
        raise _ERRORS[first.code](first.message + tail)

    def summary(self) -> str:
        n_err = len(self.errors)
        n_warn = len(self.findings) - n_err
        per_device = [
            f"{format_bytes(self.bytes_per_device)} per device",
            f"{100 * self.replicated_fraction:.1f}% of per-device bytes fully replicated",
            f"{100 * self.redundant_fraction:.1f}% of all device memory holds copies",
        ]
        if self.mesh_sizes is None:
            per_device = ["per-device bytes unknown (no mesh given)"]
        parts = [
            f"{len(self.leaves)} leaves",
            f"{format_bytes(self.bytes_global)} total",
            *per_device,
            f"{n_err} error{'s' * (n_err != 1)}",
            f"{n_warn} warning{'s' * (n_warn != 1)}",
        ]
        if self.notes:
            parts.append(f"{len(self.notes)} note{'s' * (len(self.notes) != 1)}")
        if self.optimizer:
            kinds: dict[str, int] = {}
            for row in self.optimizer:
                kinds[row.how] = kinds.get(row.how, 0) + 1
            parts.append(
                "optimizer state " + ", ".join(f"{n} {how}" for how, n in sorted(kinds.items()))
            )
        return "lint: " + ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "mesh": self.mesh_sizes,
            "bytes_global": self.bytes_global,
            "bytes_per_device": self.bytes_per_device,
            "replicated_fraction": self.replicated_fraction,
            "redundant_fraction": self.redundant_fraction,
            "findings": [f.__dict__ for f in self.findings],
            "notes": list(self.notes),
            "optimizer": [
                {"path": r.path, "spec": str(r.spec), "how": r.how, "param": r.param}
                for r in self.optimizer
            ],
            "leaves": [
                {**leaf.__dict__, "spec": None if leaf.spec is None else str(leaf.spec)}
                for leaf in self.leaves
            ],
        }

    def __str__(self) -> str:
        lines = [self.summary()]
        for f in self.findings:
            lines.append(f"  {f}")
        lines += [f"  [note] {n}" for n in self.notes]
        if self.optimizer:
            lines.append("  optimizer state:")
            for r in self.optimizer:
                after = f" (after {r.param})" if r.param else ""
                lines.append(f"    {r.path}  {r.how}  {r.spec}{after}")
        reps = self.largest_replicated()
        if reps:
            lines.append("  largest replicated leaves:")
            for leaf in reps:
                lines.append(f"    {leaf.path}  {leaf.shape}  {format_bytes(leaf.bytes_global)}")
        return "\n".join(lines)

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table

        table = Table(title=self.summary(), title_justify="left")
        for col in ("severity", "code", "leaf", "message"):
            table.add_column(col, overflow="fold")
        for f in self.findings:
            style = "red" if f.severity == "error" else "yellow"
            table.add_row(f"[{style}]{f.severity}[/]", f.code, f.path, f.message)
        reps = Table(title="largest replicated leaves", title_justify="left")
        for col in ("leaf", "shape", "bytes"):
            reps.add_column(col)
        for leaf in self.largest_replicated():
            reps.add_row(leaf.path, str(leaf.shape), format_bytes(leaf.bytes_global))
        return Group(table, reps)


def _check_not_swapped(tree: Any, rules_or_specs: Any) -> None:
    """`lint(specs, params, mesh)`: the specs came first; say so instead of failing later."""
    is_spec = lambda x: isinstance(x, PartitionSpec)  # noqa: E731
    first = jax.tree.leaves(tree, is_leaf=is_spec)
    if not first or not all(is_spec(x) for x in first):
        return
    second = jax.tree.leaves(rules_or_specs, is_leaf=is_spec)
    if second and all(hasattr(x, "shape") and not is_spec(x) for x in second):
        raise ShardingRuleError(
            "lint(tree, rules_or_specs, mesh): the first argument holds PartitionSpecs and the "
            "second arrays, so they are swapped; fix: lint(params, specs, mesh)."
        )


def _spec_leaves(tree: Any, specs: Any) -> list[Any]:
    """The spec for each leaf of `tree` (NNX Variables whole) from a spec tree mirroring it: a
    PartitionSpec, a NamedSharding (its spec), an NNX Variable holding one, or None
    (replicated); None subtrees of `tree` (a missing bias) may be None in `specs` too."""
    treedef = jax.tree.structure(tree, is_leaf=is_variable)
    try:
        flat = treedef.flatten_up_to(specs)
    except (ValueError, TypeError) as e:
        raise ShardingRuleError(
            f"rules_or_specs: the spec tree does not mirror the tree ({str(e).splitlines()[0]});"
            " fix: build the specs from the same tree, e.g. rules.specs(tree, mesh), or pass "
            "one PartitionSpec for every leaf."
        ) from None
    out = []
    for x in flat:
        x = x.get_value() if is_variable(x) else x
        out.append(getattr(x, "spec", x) if isinstance(x, jax.sharding.NamedSharding) else x)
    return out


def lint(tree: Any, rules_or_specs: Any, mesh: Any = None, *, top: int = 5) -> LintReport:
    """Checks a layout before compiling: every problem, with its leaf path.

    Args:
      tree: the pytree to be sharded (arrays, ``jax.ShapeDtypeStruct``, NNX Variables).
      rules_or_specs: a :class:`~shardkit.Rules`, a tree of PartitionSpec mirroring ``tree``,
        or one PartitionSpec for every leaf.
      mesh: a Mesh, AbstractMesh or ``{mesh axis: size}`` dict. Without it, only mesh-free
        checks run (unmatched leaves, repeated axes, rank).
      top: how many of the largest replicated leaves the summary lists.

    Returns:
      A :class:`LintReport`.

    Example:
      >>> report = lint(params, rules, mesh)
      >>> report.ok, report.bytes_per_device
      (True, 1048576)
      >>> print(report)             # a table of findings and the largest replicated leaves

    See also: :meth:`LintReport.raise_if_errors`, :meth:`shardkit.Rules.specs`.
    """
    _check_not_swapped(tree, rules_or_specs)
    if isinstance(rules_or_specs, str):  # P("data") was meant: a str would read as 4 entries
        raise ShardingRuleError(
            f"rules_or_specs is the string {rules_or_specs!r}; fix: P({rules_or_specs!r}) for "
            "every leaf, a tree of PartitionSpec, or a shardkit.Rules."
        )
    sizes = _mesh_sizes(mesh)
    items = leaf_path_items(tree)
    if callable(getattr(rules_or_specs, "match", None)):  # a shardkit.Rules
        matches = [(rules_or_specs.match(p, leaf), p, leaf) for p, leaf in items]
        assigned = [(m.spec, m.source) for m, _, _ in matches]
    elif isinstance(rules_or_specs, PartitionSpec):
        assigned = [(rules_or_specs, "spec")] * len(items)
    else:
        spec_leaves = _spec_leaves(tree, rules_or_specs)
        assigned = [(s if s is not None else PartitionSpec(), "spec") for s in spec_leaves]

    findings: list[LintFinding] = []
    leaves: list[LeafLayout] = []
    for (path, leaf), (spec, source) in zip(items, assigned, strict=True):
        shape, dtype = leaf_shape_dtype(leaf)
        if getattr(dtype, "kind", "") in ("O", "U", "S"):  # a function, a string: not placeable
            findings.append(
                LintFinding(
                    path,
                    "not-array",
                    "error",
                    f"leaf {path!r} is {type(leaf).__name__}, not an array, so it cannot be "
                    "placed on devices; fix: pass the arrays only (Equinox: eqx.filter(model, "
                    "eqx.is_array); NNX: nnx.state(model)).",
                )
            )
        elif spec is None:
            findings.append(
                LintFinding(
                    path,
                    "unmatched",
                    "error",
                    f"leaf {path!r} shape {shape} is matched by no partition rule and has no "
                    "logical annotation; fix: add a rule for it, e.g. "
                    f"({path.split('/')[-1]!r}, P()), or pass default=P() to replicate every "
                    "unmatched leaf.",
                )
            )
        else:
            findings.extend(check_leaf(path, shape, spec, sizes))
        used = [] if spec is None else [a for _, axes in spec_axes(spec) for a in axes]
        # without a mesh an axis the spec names is taken to split the leaf
        replicated = spec is None or (
            not used if sizes is None else all(sizes.get(a, 1) == 1 for a in used)
        )
        leaves.append(
            LeafLayout(
                path=path,
                shape=shape,
                dtype=str(dtype),
                spec=spec,
                source=source,
                bytes_global=int(math.prod(shape)) * dtype.itemsize,
                bytes_per_device=_bytes(shape, dtype, spec, sizes),
                replicated=replicated,
            )
        )
    return LintReport(findings=findings, leaves=leaves, mesh_sizes=sizes, top=top)


# renamed: one class per name (shardkit.inspection has its own Finding)
__getattr__ = deprecated_aliases(__name__, {"Finding": ("LintFinding", LintFinding)})
