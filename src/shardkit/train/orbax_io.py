"""Plain orbax checkpoints in and out: weights another tool saved, restored into a sharded run.

`import_orbax(path, trainer)` reads a checkpoint written with plain orbax (a
`StandardCheckpointer` / `PyTreeCheckpointer` folder, or a `CheckpointManager` folder, whose
newest step is taken) by any tool: `nnx.state(model)`, `nnx.to_pure_dict(...)`, Linen's
`variables`, `{"params": ..., "opt_state": ...}`, shardkit's own. Each of the trainer's
leaves is found by path: the checkpoint path that ends with the leaf's path after one common
prefix per group (parameters, model state, optimizer state), NNX's trailing `value` ignored.
That prefix is the one under which the most leaves match; among equals, the trainer's own name
(`params/` beside `ema/`), and for model and optimizer state the one nearest the parameters.
Copies of the parameters' tree inside the trainer's optimizer state (Adam's `mu`, `nu`) never
count. Equal prefixes left after that (`{"teacher": ..., "student": ...}`) are refused, never
guessed: `import_orbax(path, trainer, prefix="student")` chooses.
Arrays are read straight into the trainer's shardings (each device reads its shard), so the
values are bit-exact on any mesh. `ImportReport` says what matched and what did not.

`export_orbax(path, state)` writes parameters (and optionally the rest) as a plain orbax
checkpoint that `ocp.StandardCheckpointer().restore(path)` reads without shardkit.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardkit.common import path_str
from shardkit.errors import ShardkitValueError
from shardkit.train.checkpoint import CheckpointMismatchError, checkpoint_path
from shardkit.train.trainer import TrainState

__all__ = ["ImportReport", "export_orbax", "import_orbax"]

_VALUE_SUFFIXES = ("/value", "/raw_value")  # an nnx.State saved whole keeps Variable fields


@dataclasses.dataclass
class ImportReport:
    """What `import_orbax` matched: model leaf -> checkpoint path, and what it did not."""

    source: str
    matched: dict[str, str]  # "params/l1/kernel" -> checkpoint path
    missing: list[str]  # the model's leaves the checkpoint lacks
    reshaped: list[tuple[str, tuple, tuple]]  # (leaf, checkpoint shape, model shape)
    unused: list[str]  # checkpoint leaves no model leaf took
    optimizer: str  # "restored" or "initialized from the restored parameters"

    @property
    def ok(self) -> bool:
        """Every parameter found in its shape (missing model state is initialized)."""
        return not any(p.startswith("params/") for p in self.missing) and not self.reshaped

    def __str__(self) -> str:
        lines = [
            f"import from {self.source}: {len(self.matched)} leaves matched, "
            f"{len(self.missing)} missing, {len(self.reshaped)} reshaped, "
            f"{len(self.unused)} unused in the checkpoint; optimizer state {self.optimizer}"
        ]
        lines += [f"  missing: {p}" for p in self.missing[:10]]
        lines += [f"  reshaped: {p} checkpoint {a} vs model {b}" for p, a, b in self.reshaped[:10]]
        lines += [f"  unused: {p}" for p in self.unused[:10]]
        return "\n".join(lines)


def _item_dir(path: epath.Path) -> epath.Path:
    """The folder holding the tree: `path`, or a CheckpointManager's newest step's item."""
    if (path / "_METADATA").exists():
        return path
    steps = sorted(
        (int(p.name), p) for p in path.iterdir() if p.name.isdigit() and p.is_dir()
    ) if path.is_dir() else []  # fmt: skip
    if steps:
        step_dir = steps[-1][1]
        items = [p for p in step_dir.iterdir() if p.is_dir() and (p / "_METADATA").exists()]
        for name in ("state", "default", "params", "model"):
            for item in items:
                if item.name == name:
                    return item
        if len(items) == 1:
            return items[0]
    raise FileNotFoundError(
        f"{path} holds no orbax checkpoint (no _METADATA, and no step folder with one item); "
        "fix: pass the folder StandardCheckpointer().save(path, ...) wrote, or a "
        "CheckpointManager folder."
    )


def _flat(tree: Any) -> dict[str, Any]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {path_str(p): x for p, x in flat}


def _norm(path: str) -> str:
    for suffix in _VALUE_SUFFIXES:
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def _votes(want: dict[str, Any], have: dict[str, str]) -> dict[str, int]:
    """Checkpoint prefix -> how many of `want`'s paths sit under it (`have` is normalized)."""
    votes: dict[str, int] = {}
    for w in want:
        for h in have:
            if h == w or h.endswith("/" + w):
                prefix = h[: len(h) - len(w)]
                votes[prefix] = votes.get(prefix, 0) + 1
    return votes


def _mirrors(want: dict[str, Any], want_opt: dict[str, Any]) -> set[str]:
    """The optimizer state's sub-paths that hold a copy of the parameters' tree (Adam's
    "0/mu/", "0/nu/"), so that a checkpoint's optimizer state is never taken for them."""
    out = set()
    for path in want_opt:
        parts = path.split("/")
        out.update("/".join(parts[:i]) + "/" for i in range(1, len(parts))
                   if "/".join(parts[i:]) in want)  # fmt: skip
    return out


def _common(a: str, b: str) -> int:
    """How many leading path components two prefixes share."""
    n = 0
    for x, y in zip(a.split("/")[:-1], b.split("/")[:-1]):
        if x != y:
            break
        n += 1
    return n


def _pick(group: str, votes: dict[str, int], near: str | None) -> tuple[str | None, list[str]]:
    """`(prefix, [])` of the one prefix that matches the most of `group`'s leaves, or
    `(None, tied)` when several match equally well. Among equals, the trainer's own name
    (`params/`) wins, then the prefix nearest `near` (the parameters' prefix)."""
    if not votes:
        return None, []
    best = max(votes.values())
    tied = sorted(p for p, n in votes.items() if n == best)
    if len(tied) > 1 and f"{group}/" in tied:
        tied = [f"{group}/"]
    if len(tied) > 1 and near is not None:
        top = max(_common(p, near) for p in tied)
        tied = [p for p in tied if _common(p, near) == top]
    return (tied[0], []) if len(tied) == 1 else (None, tied)


def _ambiguous(item: Any, group: str, tied: list[str], best: int, of: int) -> ShardkitValueError:
    names = ", ".join(repr(p.rstrip("/")) for p in tied)
    what = {"params": "parameters", "model_state": "model state"}[group]
    return ShardkitValueError(
        f"{item} holds the model's {what} under {len(tied)} prefixes that match equally well "
        f"({best} of {of} leaves each): {names}; not guessing which to load; fix: "
        f"import_orbax(..., prefix={tied[0].rstrip('/')!r}) to read the parameters from one "
        "(model and optimizer state are then read from beside them)."
    )


def _check_prefix(item: Any, prefix: str, have: dict[str, str]) -> str:
    """`prefix` as a checkpoint path prefix ("params" -> "params/"), if the checkpoint has it."""
    norm = prefix.strip("/")
    if norm == "" or any(h.startswith(norm + "/") for h in have):
        return norm + "/" if norm else ""
    top = sorted({h.split("/")[0] for h in have})
    shown = ", ".join(repr(t) for t in top[:10]) + (", ..." if len(top) > 10 else "")
    raise ShardkitValueError(
        f"prefix={prefix!r}: {item} has no subtree of that name; its top-level prefixes are "
        f"{shown}; fix: import_orbax(..., prefix={top[0] if top else 'params'!r})."
    )


def import_orbax(
    path: str | epath.Path,
    trainer: Any,
    *,
    seed: int = 0,
    strict: bool = True,
    prefix: str | None = None,
) -> tuple[TrainState, ImportReport]:
    """Restores parameters (and model state, optimizer state when present) from a plain orbax
    checkpoint into `trainer`'s layouts.

    Args:
        path: the checkpoint folder (local, `gs://`, `file://`).
        trainer: the target `Trainer`: its leaves, shapes and shardings.
        seed: initializes what the checkpoint lacks (with `strict=False`).
        strict: refuse a checkpoint that lacks a parameter or holds any leaf in another
            shape. Model state it lacks (BatchNorm statistics, RNG streams) is initialized
            from `seed` and listed as missing.
        prefix: the checkpoint's subtree to read the parameters from (`"params"`,
            `"student"`, `"ema"`, `"model/params"`; `""` for the top of the tree), for a
            checkpoint that holds the model more than once. Model state and optimizer state
            are then read from the subtree nearest it. None (default): the one prefix that
            matches the most parameters, preferring the trainer's own name (`params/`) among
            equals; equal others are refused.

    Returns:
        `(state, report)`: a `TrainState` at step 0, or at the checkpoint's `step` (the integer
        leaf beside its optimizer state) when its optimizer state was restored too, and what
        matched.

    Raises:
        CheckpointMismatchError: with `strict`, a parameter missing or reshaped (named, with
            the fix).
        ShardkitValueError: the parameters (or model state) match equally well under several
            prefixes (e.g. `{"teacher": ..., "student": ...}`), or `prefix` names no subtree of
            the checkpoint; the message lists the prefixes.
        FileNotFoundError: no orbax checkpoint at `path`.

    Example:
        >>> ocp.StandardCheckpointer().save(path, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
        >>> state, report = import_orbax(path, trainer)  # doctest: +SKIP
        >>> print(report)
        import from ...: 4 leaves matched, 0 missing, 0 reshaped, 0 unused in the checkpoint; ...
    """
    item = _item_dir(checkpoint_path(path))
    with ocp.PyTreeCheckpointer() as ckptr:
        meta = ckptr.metadata(item)
    tree = getattr(meta, "item_metadata", meta)
    tree = getattr(tree, "tree", tree)
    stored = _flat(tree)

    abstract = trainer.abstract_state
    matched, missing, reshaped, opt_ok, opt_tied = _match(abstract, stored, item, prefix)
    report = ImportReport(
        source=str(item),
        matched=matched,
        missing=missing,
        reshaped=reshaped,
        unused=sorted(set(stored) - set(matched.values())),
        optimizer=_optimizer_note(opt_ok, opt_tied),
    )
    if strict and not report.ok:
        raise CheckpointMismatchError(
            f"{item} does not hold every parameter of the model:\n{report}\nfix: check the "
            "model matches the one saved (paths are compared after a common prefix, e.g. "
            "'params/'), or import_orbax(..., strict=False) to initialize the missing leaves "
            f"from seed={seed}."
        )

    # read each matched leaf straight into its target sharding; the rest of the checkpoint
    # is a placeholder, never read
    targets = _flat(abstract)
    by_stored = {where: _restore_target(targets[key]) for key, where in matched.items()}
    target_tree = jax.tree_util.tree_map_with_path(
        lambda p, _: by_stored.get(path_str(p), ocp.PLACEHOLDER), tree
    )
    restored = _restore(item, target_tree)
    values = {key: _from_stored(_get(restored, where), targets[key])
              for key, where in matched.items()}  # fmt: skip

    fresh = trainer.init(seed)
    state = jax.tree_util.tree_map_with_path(
        lambda p, x: values.get(path_str(p), x), fresh._asdict()
    )
    state = TrainState(**state)
    if not opt_ok:  # optimizer state from the restored parameters, in its layout
        opt = jax.jit(trainer.optimizer.init, out_shardings=trainer.state_shardings.opt_state)
        state = state._replace(opt_state=opt(state.params))
    return state, report


def _match(abstract: TrainState, stored: dict[str, Any], item: Any, prefix: str | None):
    """(matched model path -> stored path, missing, reshaped, whether the optimizer state
    matched whole, the optimizer state's equal prefixes) for a trainer's abstract state and a
    checkpoint's flat metadata."""
    have = {_norm(p): p for p in stored}
    under = None if prefix is None else _check_prefix(item, prefix, have)
    want_opt = _flat(abstract.opt_state)
    groups = {"params": abstract.params, "model_state": abstract.model_state}
    mirrors = _mirrors(_flat(abstract.params), want_opt) - {""}
    matched: dict[str, str] = {}
    missing, reshaped = [], []
    near = under
    for group, sub in groups.items():
        want = _flat(sub)
        votes = {p: n for p, n in _votes(want, have).items()
                 if not any(p == m or p.endswith("/" + m) for m in mirrors)}  # fmt: skip
        if group == "params" and under is not None:
            votes = {p: n for p, n in votes.items() if p.startswith(under) and (under or not p)}
        found, tied = _pick(group, votes, near)
        if tied:
            raise _ambiguous(item, group, tied, votes[tied[0]], len(want))
        near = found if group == "params" and found is not None else near
        for w, leaf in want.items():
            key = f"{group}/{w}"
            if found is None or found + w not in have:
                missing.append(key)
            elif tuple(stored[have[found + w]].shape) != tuple(_stored_shape(leaf)):
                reshaped.append((key, tuple(stored[have[found + w]].shape), tuple(leaf.shape)))
            else:
                matched[key] = have[found + w]
    taken = set(matched.values())
    free = {k: v for k, v in have.items() if v not in taken}
    # a tie between optimizer states leaves the optimizer state initialized, as if absent
    found, opt_tied = _pick("opt_state", _votes(want_opt, free), near)
    opt_ok = (
        bool(want_opt)
        and found is not None
        and all(
            found + w in free and tuple(stored[free[found + w]].shape) == tuple(_stored_shape(x))
            for w, x in want_opt.items()
        )
    )
    if opt_ok:
        matched.update({f"opt_state/{w}": free[found + w] for w in want_opt})
        step = _step_leaf(found, free, stored)
        if step is not None:
            matched["step"] = step
    return matched, missing, reshaped, opt_ok, opt_tied


def _optimizer_note(restored: bool, tied: list[str]) -> str:
    if restored:
        return "restored"
    note = "initialized from the restored parameters"
    if tied:
        names = ", ".join(repr(p.rstrip("/")) for p in tied)
        note += f" (it matches equally well under {names}; prefix= chooses the one beside the "
        note += "parameters)"
    return note


def _step_leaf(opt_prefix: str, have: dict[str, str], stored: dict[str, Any]) -> str | None:
    """The stored path of the integer scalar `step` beside the optimizer state, if any
    (shardkit's and Flax's `TrainState`, `nnx.Optimizer`)."""
    parent = opt_prefix.rstrip("/").rpartition("/")[0]
    where = have.get(f"{parent}/step" if parent else "step")
    if where is None:
        return None
    meta = stored[where]
    dtype = getattr(meta, "dtype", None)
    if tuple(getattr(meta, "shape", ())) != () or (
        dtype is not None and not jax.numpy.issubdtype(dtype, jax.numpy.integer)
    ):
        return None
    return where


def _stored_shape(leaf) -> tuple:
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return jax.eval_shape(jax.random.key_data, leaf).shape
    return leaf.shape


def _restore_target(leaf):
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        data = jax.eval_shape(jax.random.key_data, leaf)
        return jax.ShapeDtypeStruct(data.shape, data.dtype,
                                    sharding=NamedSharding(leaf.sharding.mesh, P()))  # fmt: skip
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)


def _from_stored(x, leaf):
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key) and not jax.dtypes.issubdtype(
        x.dtype, jax.dtypes.prng_key
    ):
        return jax.random.wrap_key_data(x, impl=jax.random.key_impl(leaf))
    return x


def _get(tree: Any, path: str) -> Any:
    node = tree
    for part in path.split("/"):
        node = node[int(part)] if isinstance(node, (list, tuple)) else node[part]
    return node


def _restore(item: epath.Path, target: Any) -> Any:
    restore_args = jax.tree.map(
        lambda x: ocp.PLACEHOLDER if x is ocp.PLACEHOLDER else ocp.ArrayRestoreArgs(
            sharding=x.sharding, global_shape=x.shape, dtype=x.dtype),
        target,
    )  # fmt: skip
    with ocp.PyTreeCheckpointer() as ckptr:
        return ckptr.restore(
            item, args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args)
        )


def export_orbax(
    path: str | epath.Path, state: TrainState, *, include: tuple[str, ...] = ("params",)
) -> epath.Path:
    """Writes `state`'s parts as a plain orbax checkpoint (`StandardCheckpointer`).

    Args:
        path: a folder that does not exist yet.
        state: a `TrainState` from a `Trainer`.
        include: which parts: "params" (default), "opt_state", "model_state", "step". With
            one part, the checkpoint's tree is that part itself (e.g. the parameter dict).

    Returns:
        The folder written; `ocp.StandardCheckpointer().restore(path)` reads it back.

    Example:
        >>> export_orbax("/tmp/weights", state)  # doctest: +SKIP
    """
    parts = {"params", "opt_state", "model_state", "step"}
    bad = sorted(set(include) - parts)
    if bad or not include:
        raise ShardkitValueError(
            f"include={include!r}: {bad or 'nothing'} is not one of {sorted(parts)}; fix: "
            "include=('params',) or ('params', 'opt_state', 'model_state', 'step')."
        )
    tree = {k: getattr(state, k) for k in include if getattr(state, k) is not None}
    if len(include) == 1:
        tree = tree[include[0]]
    target = checkpoint_path(path)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(target, tree)
    return target
