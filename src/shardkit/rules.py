"""Partition rules: from pytree key paths (or logical axis names) to PartitionSpecs.

A :class:`Rules` value is an ordered list of ``(regex, PartitionSpec)`` pairs matched against
each leaf's path string (``"layers/attn/q/kernel"``), plus optional logical-axis rules that map
logical names (``"embed"``, ``"mlp"``: Flax NNX ``sharding`` annotations, or names used in the
specs themselves) to mesh axes. The first pattern that matches wins; a leaf matched by no
pattern uses its logical annotation, then ``default``; with neither it is an error, never a
silent replication.

Everything here works on ``jax.ShapeDtypeStruct`` trees: planning and linting never need real
arrays.

Example::

    rules = Rules([(r"attn/(q|k|v)/kernel", P(None, "model")),
                   (r"attn/out/kernel", P("model", None))],
                  default=P())
    specs = rules.specs(params, mesh)          # a tree of PartitionSpec mirroring params
    params = shard(params, rules.shardings(params, mesh))
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from shardkit.common import path_str
from shardkit.errors import ShardingRuleError
from shardkit.leaves import is_variable, leaf_path_items, leaf_shape_dtype, logical_names
from shardkit.linter import lint

__all__ = [
    "Rules",
    "ShardingRuleError",
    "leaf_path_items",
    "leaf_shape_dtype",
    "path_str",
    "shard",
]

LogicalTarget = str | tuple[str, ...] | None


def _as_spec(spec: Any, where: str) -> PartitionSpec:
    if isinstance(spec, PartitionSpec):
        return spec
    if spec is None:
        return PartitionSpec()
    if isinstance(spec, (tuple, list)):
        return PartitionSpec(*spec)
    raise ShardingRuleError(
        f"{where}: expected a PartitionSpec, got {type(spec).__name__} {spec!r}; fix: write "
        "P('data', None) (from jax.sharding import PartitionSpec as P)."
    )


@dataclass(frozen=True)
class Match:
    """How a leaf got its spec: ``source`` is ``"rule 3: <pattern>"``, ``"logical"``,
    ``"default"`` or ``None`` when nothing matched."""

    spec: PartitionSpec | None
    source: str | None


class Rules:
    """Ordered partition rules over pytree key paths, with logical-axis translation.

    Args:
      rules: ``(regex, PartitionSpec)`` pairs, tried in order with ``re.search`` against the
        leaf path (``"/"``-joined keys). The first match wins.
      logical: logical name → mesh axis (``str``), several mesh axes (tuple) or ``None``
        (replicated). Applied to names inside rule specs and to NNX logical annotations.
      default: spec for leaves no rule or annotation covers. ``None`` (the default) makes such
        leaves an error, so nothing is replicated by accident; pass ``P()`` to replicate them.

    Raises:
      ShardingRuleError: a rule that is not a ``(str, PartitionSpec)`` pair or whose regex does
        not compile.

    Example:
      >>> rules = Rules([(r"kernel$", P(None, "mlp"))], logical={"mlp": "model"}, default=P())
      >>> rules.specs({"w": {"kernel": jax.ShapeDtypeStruct((8, 16), jnp.float32)}})
      {'w': {'kernel': PartitionSpec(None, 'model')}}

    See also: :func:`shardkit.lint`, :func:`shard`.
    """

    def __init__(
        self,
        rules: Iterable[tuple[str, Any]] = (),
        *,
        logical: Mapping[str, LogicalTarget] | None = None,
        default: PartitionSpec | None = None,
    ):
        compiled = []
        for i, rule in enumerate(rules):
            if not (isinstance(rule, (tuple, list)) and len(rule) == 2):
                raise ShardingRuleError(
                    f"rules[{i}] = {rule!r} is not a (pattern, PartitionSpec) pair; fix: "
                    "Rules([(r'attn/q/kernel', P(None, 'model')), ...])."
                )
            pattern, spec = rule
            if not isinstance(pattern, str):
                raise ShardingRuleError(f"rules[{i}]: pattern {pattern!r} must be a string.")
            try:
                rx = re.compile(pattern)
            except re.error as e:
                raise ShardingRuleError(
                    f"rules[{i}]: pattern {pattern!r} is not a valid regex ({e}); fix: escape "
                    "special characters, e.g. re.escape('a.b')."
                ) from None
            compiled.append((rx, _as_spec(spec, f"rules[{i}] ({pattern!r})")))
        self._rules: tuple[tuple[re.Pattern[str], PartitionSpec], ...] = tuple(compiled)
        self._logical: dict[str, LogicalTarget] = dict(logical or {})
        for name, target in self._logical.items():
            ok = target is None or isinstance(target, str)
            ok = ok or (isinstance(target, tuple) and all(isinstance(t, str) for t in target))
            if not ok:
                raise ShardingRuleError(
                    f"logical[{name!r}] = {target!r}: a logical axis maps to a mesh axis name, a "
                    "tuple of mesh axis names, or None (replicated)."
                )
        self._default = None if default is None else _as_spec(default, "default")

    @property
    def rules(self) -> tuple[tuple[str, PartitionSpec], ...]:
        return tuple((rx.pattern, spec) for rx, spec in self._rules)

    @property
    def logical(self) -> dict[str, LogicalTarget]:
        return dict(self._logical)

    @property
    def default(self) -> PartitionSpec | None:
        return self._default

    def __repr__(self) -> str:
        body = ", ".join(f"({p!r}, {s})" for p, s in self.rules)
        return f"Rules([{body}], logical={self._logical!r}, default={self._default})"

    def translate(self, spec: PartitionSpec) -> PartitionSpec:
        """Replaces logical names in ``spec`` by mesh axes (unknown names are kept)."""

        def one(name: str) -> tuple[str, ...]:
            if name in self._logical:
                t = self._logical[name]
                return () if t is None else ((t,) if isinstance(t, str) else t)
            return (name,)

        out = []
        for entry in spec:
            if entry is None or entry is PartitionSpec.UNCONSTRAINED:
                out.append(entry)
                continue
            names = (entry,) if isinstance(entry, str) else tuple(entry)
            axes = tuple(a for n in names for a in one(n))
            out.append(None if not axes else (axes[0] if len(axes) == 1 else axes))
        return PartitionSpec(*out)

    def match(self, path: str, leaf: Any = None) -> Match:
        """The spec for one leaf path (and its annotation, if ``leaf`` is an NNX Variable)."""
        for i, (rx, spec) in enumerate(self._rules):
            if rx.search(path):
                return Match(self.translate(spec), f"rule {i}: {rx.pattern}")
        names = logical_names(leaf)
        if names is not None:
            return Match(self.translate(PartitionSpec(*names)), "logical")
        if self._default is not None:
            return Match(self.translate(self._default), "default")
        return Match(None, None)

    def specs(self, tree: Any, mesh: Any = None, *, validate: bool = True) -> Any:
        """A tree of PartitionSpec mirroring ``tree`` (NNX Variables keep their wrapper).

        Args:
          tree: any pytree of arrays, ``jax.ShapeDtypeStruct`` or NNX Variables/State.
          mesh: a Mesh/AbstractMesh to validate against (mesh axis names, divisibility).
          validate: raise the first error :func:`shardkit.lint` finds (unmatched leaf, unknown
            or repeated mesh axis, spec longer than the array, indivisible dim).

        Raises:
          ShardingRuleError (or a subclass naming the problem) when ``validate`` finds one.
        """
        if validate:
            lint(tree, self, mesh).raise_if_errors()
        return _map_leaves(tree, lambda path, leaf: self.match(path, leaf).spec)

    def shardings(self, tree: Any, mesh: Any) -> Any:
        """A tree of NamedSharding mirroring ``tree``; see :meth:`specs`."""
        if mesh is None:
            raise ShardingRuleError("shardings(tree, mesh) needs a mesh; fix: pass make_mesh(...).")
        specs = self.specs(tree, mesh)
        return jax.tree.map(
            lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
        )


def _map_leaves(tree: Any, fn: Callable[[str, Any], Any]) -> Any:
    """Maps ``fn(path, leaf)`` over leaves, NNX Variables kept whole and re-wrapped."""

    def one(keypath, leaf):
        out = fn(path_str(keypath), leaf)
        if is_variable(leaf):
            return leaf.replace(out)
        return out

    return jax.tree_util.tree_map_with_path(one, tree, is_leaf=is_variable)


def shard(tree: Any, shardings: Any, mesh: Any = None) -> Any:
    """Places the arrays of ``tree`` with ``shardings`` (a tree of NamedSharding or
    PartitionSpec, or one sharding for every leaf, or a :class:`Rules`).

    Raises:
      ShardingRuleError (or the subclass :func:`shardkit.lint` names): a spec that names an
        unknown mesh axis, repeats one, is longer than its leaf or does not divide it; a
        shardings tree that does not mirror ``tree``; a NamedSharding on another mesh than
        ``mesh``. Each message names the leaf path, its shape and the mesh axis sizes.

    Example:
      >>> params = shard(params, rules, mesh)
    """
    if mesh is not None and not hasattr(mesh, "shape"):
        raise ShardingRuleError(
            f"shard: mesh is {type(mesh).__name__} {mesh!r}, not a Mesh; fix: "
            "shard(tree, specs, shardkit.make_mesh({...}))."
        )
    if isinstance(shardings, str):
        raise ShardingRuleError(
            f"shard: shardings is the string {shardings!r}; fix: P({shardings!r}) for every "
            "leaf, a tree of PartitionSpec, or a Rules."
        )
    if isinstance(shardings, Rules):
        if mesh is None:
            raise ShardingRuleError(
                "shard(tree, rules) needs mesh=; fix: shard(tree, rules, mesh)."
            )
        return jax.device_put(tree, shardings.shardings(tree, mesh))  # validated there
    if isinstance(shardings, PartitionSpec) and mesh is None:
        raise ShardingRuleError(
            "shard(tree, P(...)) needs mesh=; fix: pass NamedSharding(mesh, spec) or mesh=."
        )
    _check_shardings(tree, shardings, mesh)
    if isinstance(shardings, PartitionSpec):
        shardings = NamedSharding(mesh, shardings)
    elif mesh is not None:
        shardings = jax.tree.map(
            lambda s: NamedSharding(mesh, s) if isinstance(s, PartitionSpec) else s,
            shardings,
            is_leaf=lambda x: isinstance(x, PartitionSpec),
        )
    return jax.device_put(tree, shardings)


def _is_sharding_leaf(x: Any) -> bool:
    return x is None or isinstance(x, (PartitionSpec, NamedSharding))


def _check_shardings(tree: Any, shardings: Any, mesh: Any) -> None:
    """Raises what :func:`shardkit.lint` finds in a tree of PartitionSpecs or NamedShardings (or
    one for every leaf) before ``jax.device_put`` does, with leaf paths, shapes and mesh axis
    sizes, and a NamedSharding on another mesh than ``mesh``.

    A sharding tree may be a prefix of ``tree`` (as for ``device_put``); trees holding other
    shardings (a device, a SingleDeviceSharding) are left to ``device_put``."""
    if isinstance(shardings, (PartitionSpec, NamedSharding)):
        full = jax.tree.map(lambda _: shardings, tree, is_leaf=is_variable)
    else:
        try:
            full = jax.tree.map(
                lambda s, sub: jax.tree.map(lambda _: s, sub, is_leaf=is_variable),
                shardings,
                tree,
                is_leaf=_is_sharding_leaf,
            )
        except (ValueError, TypeError) as e:
            why = " ".join(line.strip() for line in str(e).splitlines())  # JAX's, on one line
            raise ShardingRuleError(
                f"shard: the shardings tree does not mirror the tree ({why}); fix: build it from "
                "the same tree, e.g. rules.shardings(tree, mesh), or pass one PartitionSpec for "
                "every leaf."
            ) from None
    flat = jax.tree.leaves(full, is_leaf=_is_sharding_leaf)
    if not all(_is_sharding_leaf(s) for s in flat):
        return
    meshes = {id(s.mesh): s.mesh for s in flat if isinstance(s, NamedSharding)}

    def layout(m: Any) -> tuple:  # axis types aside: the sharding's own mesh places the leaf
        return tuple(m.shape.items()), tuple(d.id for d in m.devices.flat)

    other = next(
        (m for m in meshes.values() if mesh is not None and layout(m) != layout(mesh)), None
    )
    if other is not None:
        raise ShardingRuleError(
            f"shard: a NamedSharding in shardings is on mesh {dict(other.shape)} (devices "
            f"{[d.id for d in other.devices.flat]}) but mesh= is {dict(mesh.shape)} (devices "
            f"{[d.id for d in mesh.devices.flat]}); fix: build the shardings on mesh=, or pass "
            "PartitionSpecs and mesh= alone."
        )
    if mesh is None and len({tuple(m.shape.items()) for m in meshes.values()}) == 1:
        mesh = next(iter(meshes.values()))  # else several meshes: only mesh-free checks
    lint(tree, full, mesh).raise_if_errors()


def sharded_model(model_fn: Callable[[], Any], rules: Rules, mesh: Any) -> Any:
    """Builds an NNX model directly in the layout `rules` gives it on `mesh`.

    Flax 0.12 shards annotated variables as they are created (eager sharding) and then needs
    a mesh whose axes are the annotation's names. Here the model is traced with eager sharding
    off, `rules` maps its annotations (or paths) to `mesh`'s axes, and the variables are
    created inside one `jit` with those shardings: no full copy on one device first.

    Args:
      model_fn: `() -> nnx.Module`, e.g. `lambda: MyModel(nnx.Rngs(0))`.
      rules: the layouts (logical names translated by `rules.logical`).
      mesh: the mesh.

    Returns:
      The model, its variables sharded.

    Raises:
      ShardingRuleError: what `rules.specs` finds (a leaf no rule covers, an unknown axis...).

    Example:
      >>> rules = Rules(logical={"embed": None, "mlp": "model"}, default=P())
      >>> model = sharded_model(lambda: MLP((8, 32, 4), rngs=nnx.Rngs(0)), rules, mesh)
      ... # doctest: +SKIP
    """
    from flax import nnx  # flax's NNX: the rules themselves work on any pytree

    if not isinstance(rules, Rules):
        raise ShardingRuleError(
            f"sharded_model: rules is a {type(rules).__name__}, not a shardkit.Rules; fix: "
            "Rules([(path regex, P(...)), ...], default=P()) (or Rules(default=P()) to "
            "replicate)."
        )
    with nnx.use_eager_sharding(False):
        abstract_model = nnx.eval_shape(model_fn)
        if not isinstance(abstract_model, nnx.Module):
            raise ShardingRuleError(
                f"sharded_model: model_fn returned a {type(abstract_model).__name__}, not an "
                "nnx.Module; fix: for a pytree of arrays use shard(tree, rules, mesh), or "
                "return the module, e.g. lambda: MyModel(nnx.Rngs(0))."
            )
        graphdef, abstract = nnx.split(abstract_model)
        specs = rules.specs(abstract, mesh)
        shardings = jax.tree.map(
            lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
        )
        state = jax.jit(lambda: nnx.split(model_fn())[1], out_shardings=shardings)()
        return nnx.merge(graphdef, state)
