"""Per-leaf PartitionSpecs of a strategy on a mesh: what `strategy.param_specs` computes.

Each leaf's layout comes from one of two places. Without `rules=`, tensor parallelism splits
the dim its logical name ("mlp", "heads", "vocab") or the strategy's `tensor_rules` picks, a
pipeline splits the stacked "layers" axis over "stage", and FSDP then splits the largest
remaining dim the fsdp axis divides. With a `shardkit.Rules`, the rules give each leaf's spec
(axes the mesh lacks dropped, so one Rules serves every strategy); when the rules never name
"fsdp", FSDP's split still applies to the dims they leave whole, so a Rules written for tensor
parallelism keeps FSDP from silently becoming data parallelism:

    >>> rules = Rules(logical={"hidden": "tensor", "in": None}, default=P())
    >>> FSDP(rules=rules).param_specs({"w": ShapeDtypeStruct((16, 64), "f4")}, mesh,
    ...                               logical={"w": ("in", "hidden")})
    {'w': PartitionSpec(None, 'fsdp')}
"""

from __future__ import annotations

import re

import jax
from jax.sharding import PartitionSpec as P

from shardkit.common import path_str
from shardkit.errors import ShardkitValueError
from shardkit.linter import UnmatchedLeafError, lint

TENSOR_NAMES = ("mlp", "heads", "vocab")  # logical names split by tensor parallelism
# mesh-axis names that annotations written for a hand-made mesh use for the tensor axis
# (Flax's guides annotate `(None, "model")`): they split over "tensor" too
TENSOR_AXIS_NAMES = ("model", "tensor")
NEVER_SHARDED = ("layers",)  # the stacked-layer axis is scanned over, never split


def axis_size(mesh, axis: str) -> int:
    """The size of mesh axis `axis` on `mesh` (1 when the mesh has no such axis)."""
    # `mesh.shape` (name -> size) exists on both Mesh and AbstractMesh, so layouts can be
    # planned for a mesh larger than the devices present (no `mesh.devices` needed).
    return int(dict(mesh.shape).get(axis, 1))


def drop_axis(entry, axis: str):
    """One PartitionSpec entry without mesh axis `axis` (None when nothing is left)."""
    if entry is None or entry == axis:
        return None
    if isinstance(entry, tuple):
        rest = tuple(e for e in entry if e != axis)
        return rest if len(rest) > 1 else (rest[0] if rest else None)
    return entry


def map_specs(strategy, params, mesh, logical, *, for_optimizer: bool):
    """The PartitionSpec tree of `params` under `strategy` on `mesh` (`param_specs` and, with
    `for_optimizer`, `opt_state_specs`): from the strategy's `rules` when it has them, else
    leaf by leaf (`leaf_spec`)."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    names = [None] * len(flat) if logical is None else treedef.flatten_up_to(logical)
    rules = getattr(strategy, "rules", None)
    if rules is not None:  # a shardkit.Rules gives the layouts (validated against the mesh)
        specs = _rule_specs(rules, flat, names, mesh)
        if strategy.zero == 3 or for_optimizer:
            specs = _fsdp_beside_rules(rules, specs, flat, names, mesh)
        lint(params, jax.tree_util.tree_unflatten(treedef, specs), mesh).raise_if_errors()
        specs = jax.tree_util.tree_unflatten(treedef, specs)
        if strategy.zero == 1 and not for_optimizer:
            specs = jax.tree.map(strategy.compute_spec, specs, is_leaf=lambda x: isinstance(x, P))
        return specs
    specs = [
        leaf_spec(
            strategy,
            path_str(path),
            tuple(getattr(leaf, "shape", ())),
            nm,
            mesh,
            for_optimizer=for_optimizer,
        )
        for (path, leaf), nm in zip(flat, names, strict=True)
    ]
    _check_tensor_names(strategy, mesh, names)
    return jax.tree_util.tree_unflatten(treedef, specs)


def _rule_specs(rules, flat, names, mesh) -> list[P]:
    """Each leaf's spec from `rules`: a matching path rule, else its annotation's names
    translated by `rules.logical`, else the default. A strategy axis ("data", "fsdp",
    "tensor", "stage") that the mesh lacks has size 1 there (the mesh drops such axes), so
    it is dropped from the spec: one Rules serves every degree."""
    absent = {"data", "fsdp", "tensor", "stage"} - set(dict(mesh.shape))
    out = []
    for (path, leaf), nm in zip(flat, names, strict=True):
        where = path_str(path)
        match = rules.match(where)
        spec = match.spec
        if match.source in (None, "default") and nm:
            spec = rules.translate(P(*nm))
        if spec is None:
            raise UnmatchedLeafError(
                f"leaf {where!r} (shape {tuple(leaf.shape)}) is matched by no rule of {rules!r}"
                " and has no axis names; fix: add a rule for it, e.g. "
                f"({where.split('/')[-1]!r}, P()), or Rules(..., default=P())."
            )
        for axis in absent:
            spec = P(*(drop_axis(e, axis) for e in spec))
        out.append(spec)
    return out


def _fsdp_beside_rules(rules, specs, flat, names, mesh) -> list[P]:
    """Rules that never name "fsdp" leave FSDP's own split on: each leaf's largest dim the
    rules leave whole and the fsdp axis divides is split over it, as without rules (so a Rules
    written for tensor parallelism does not turn FSDP into data parallelism). Rules that name
    "fsdp" anywhere (a rule, the default, a logical mapping, an annotation) give every layout."""
    fsdp = axis_size(mesh, "fsdp")
    if fsdp == 1 or _uses_axis(specs, rules, "fsdp"):
        return specs
    out = []
    for spec, (_, leaf), nm in zip(specs, flat, names, strict=True):
        shape = tuple(leaf.shape)
        entries = list(spec) + [None] * (len(shape) - len(spec))
        dim = _fsdp_dim(shape, nm, entries, fsdp) if len(spec) <= len(shape) else None
        if dim is not None:
            entries[dim] = "fsdp"
        out.append(spec if dim is None else P(*entries))
    return out


def _uses_axis(specs, rules, axis: str) -> bool:
    given = [rules.translate(s) for _, s in rules.rules] + list(specs)
    given += [rules.translate(rules.default)] if rules.default is not None else []
    entries = [e for s in given for e in s] + list(rules.logical.values())
    return any(e == axis or (isinstance(e, tuple) and axis in e) for e in entries)


def _check_tensor_names(strategy, mesh, names) -> None:
    """Tensor parallelism over names none of which it knows would replicate every weight."""
    if axis_size(mesh, "tensor") == 1 or getattr(strategy, "tensor_rules", None) is not None:
        return
    found = sorted({n for nm in names if nm for n in nm if n is not None})
    if not found or set(found) & set(TENSOR_NAMES + TENSOR_AXIS_NAMES):
        return
    raise UnmatchedLeafError(
        f"{strategy!r} splits dims named {', '.join(TENSOR_NAMES)} (or the mesh axis names "
        f"{', '.join(TENSOR_AXIS_NAMES)}) over 'tensor', but the model's parameters are "
        f"annotated only with {found}: every weight would be replicated; fix: annotate the "
        "column-parallel dims 'mlp' / 'heads' / 'vocab' (e.g. ('embed', 'mlp')), or pass "
        "Hybrid(tensor=..., rules=shardkit.Rules([...])) mapping your names to mesh axes."
    )


def leaf_spec(strategy, path: str, shape: tuple[int, ...], names, mesh, *, for_optimizer=False):
    """The PartitionSpec of one leaf: tensor dims from logical names or patterns, then FSDP."""
    spec: list = [None] * len(shape)
    stage = axis_size(mesh, "stage")
    if stage > 1 and names and names[0] == "layers" and shape[0] % stage == 0:
        spec[0] = "stage"  # consecutive layers per stage: the pipeline's split is local
    tensor = axis_size(mesh, "tensor")
    if tensor > 1:
        dim = _tensor_dim(strategy, path, shape, names, tensor)
        if dim is not None:
            spec[dim] = "tensor"
    fsdp = axis_size(mesh, "fsdp")
    if fsdp > 1 and (strategy.zero == 3 or for_optimizer):
        dim = _fsdp_dim(shape, names, spec, fsdp)
        if dim is not None:
            spec[dim] = "fsdp"
    return P(*spec)


def _tensor_dim(strategy, path, shape, names, tensor):
    dim = tensor_request(strategy, path, shape, names)
    # indivisible: replicated, and listed in the Trainer's notes (`indivisible_notes`)
    return None if dim is None or shape[dim] % tensor else dim


def tensor_request(strategy, path: str, shape: tuple[int, ...], names) -> int | None:
    """The dim of a leaf that tensor parallelism is asked to split (by its logical names or
    the strategy's `tensor_rules`), whether or not the tensor axis divides it; None if none."""
    if names:
        for logical in TENSOR_NAMES + TENSOR_AXIS_NAMES:
            if logical in names:
                return names.index(logical)
        return None
    rules = getattr(strategy, "tensor_rules", None)
    if rules is None:
        if len(shape) <= 1:  # a norm scale or bias without names: replicated (a lint note)
            return None
        raise UnmatchedLeafError(
            f"leaf {path!r} (shape {shape}) has no logical axis names and {strategy!r} has no "
            "tensor_rules, so tensor parallelism cannot tell which dim to split; fix: annotate "
            "the parameter (kernel_init=nnx.with_partitioning(init, ('embed', 'mlp')) in NNX, "
            "nn.with_logical_partitioning in Linen) or pass tensor_rules=((r'<path regex>', "
            "<dim or None>), ..., (r'.*', None))."
        )
    for pattern, dim in rules:
        if re.search(pattern, path):
            if dim is None or not shape:
                return None
            if not -len(shape) <= dim < len(shape):
                raise ShardkitValueError(
                    f"tensor_rules: the rule ({pattern!r}, {dim}) splits dim {dim} of leaf "
                    f"{path!r}, which has {len(shape)} dims (shape {shape}); fix: a dim in "
                    f"{-len(shape)}..{len(shape) - 1}, or None to replicate it."
                )
            return dim % len(shape)
    raise UnmatchedLeafError(
        f"leaf {path!r} (shape {shape}) matches no tensor_rules pattern of {strategy!r}; "
        "fix: add a rule for it, e.g. (r'.*', None) last to replicate everything else."
    )


def _fsdp_dim(shape, names, spec, fsdp):
    best = None
    for dim, size in enumerate(shape):
        if spec[dim] is not None or size % fsdp:
            continue
        if names and names[dim] in NEVER_SHARDED:
            continue
        if best is None or size > shape[best]:
            best = dim
    return best
