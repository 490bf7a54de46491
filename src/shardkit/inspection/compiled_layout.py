"""Input and output shardings of a compiled program, requested vs compiled.

`jax.jit` lets the compiler choose what you did not fix: the sharding of outputs (by
propagation) and of arguments that were not placed. `compiled_layout` shows both sides in the
scaling-book notation, `x[A_data, B]` (dimension A of `x` sharded over mesh axis `data`,
dimension B replicated), and lists what the compiler changed.

Example:
    >>> mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    >>> x = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("data")))
    >>> print(compiled_layout(jax.jit(lambda x: x * 2), x))
    input x float32[64, 32]: requested x[A_data, B], compiled x[A_data, B]
    output out float32[64, 32]: requested (compiler's choice), compiled out[A_data, B]  <- changed
    >>> print(compiled_layout(lambda x: x * 2, x, out_shardings=P(None, "data")))
    input x float32[64, 32]: requested x[A_data, B], compiled x[A_data, B]
    output out float32[64, 32]: requested out[A, B_data], compiled out[A, B_data]
"""

from __future__ import annotations

import dataclasses
import inspect as _pyinspect
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from shardkit.common import path_str
from shardkit.compat import context_mesh
from shardkit.errors import ShardkitValueError
from shardkit.inspection.compiling import Compilation, compile_for, kind_of
from shardkit.layout import spec_notation

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _notation(name: str, shape: tuple[int, ...], spec: Any) -> str:
    """`name[A_data, B]` for `spec` on an array of `shape` (letters name the dimensions)."""
    try:  # the project-wide notation
        return spec_notation(shape, PartitionSpec(*spec), name=name)
    except (TypeError, ValueError):
        pass
    entries = list(spec) + [None] * (len(shape) - len(spec))
    dims = []
    for i, entry in enumerate(entries[: len(shape)]):
        letter = _LETTERS[i % 26] + ("" if i < 26 else str(i // 26))
        if entry is None or entry == ():
            dims.append(letter)
        elif isinstance(entry, tuple | list):
            dims.append(f"{letter}_{{{','.join(map(str, entry))}}}")
        else:
            dims.append(f"{letter}_{entry}")
    return f"{name}[{', '.join(dims)}]"


def _spec_of(sharding: Any, ndim: int) -> tuple | None:
    """The PartitionSpec of a sharding as a normalised tuple (None = not a mesh sharding)."""

    if isinstance(sharding, NamedSharding):
        spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
        return tuple(
            (e[0] if len(e) == 1 else tuple(e)) if isinstance(e, tuple | list) else e for e in spec
        )
    if sharding is not None and getattr(sharding, "is_fully_replicated", False):
        return (None,) * ndim
    return None


@dataclasses.dataclass(frozen=True)
class LayoutEntry:
    """One input or output of a compiled program.

    Attributes:
        side: `input` or `output`.
        path: the argument name and key path (`params/w`), or `out`, `out[0]`.
        shape: global shape.
        dtype: dtype name.
        requested: the requested notation, or None when the compiler was free to choose.
        compiled: the notation the compiled program uses (`(unused: pruned by jit)` for a
            pruned input).
        pruned: an input the function does not use, which `jax.jit` dropped from the program
            (its compiled `input_shardings` entry is None); never counted as changed.
    """

    side: str
    path: str
    shape: tuple[int, ...]
    dtype: str
    requested: str | None
    compiled: str
    pruned: bool = False

    @property
    def changed(self) -> bool:
        """True when the compiled layout differs from the request (or nothing was requested);
        False for a pruned input, which has no compiled layout."""
        return not self.pruned and self.requested != self.compiled

    def describe(self) -> str:
        """One line: side, path, shape, requested -> compiled."""
        req = self.requested if self.requested is not None else "(compiler's choice)"
        return (
            f"{self.side} {self.path} {self.dtype}{list(self.shape)}: requested {req}, "
            f"compiled {self.compiled}"
        )


@dataclasses.dataclass(frozen=True)
class CompiledLayout:
    """Input and output layouts of a compiled program (`compiled_layout`)."""

    inputs: tuple[LayoutEntry, ...]
    outputs: tuple[LayoutEntry, ...]

    def changed(self) -> tuple[LayoutEntry, ...]:
        """The entries whose compiled layout differs from the request: what the compiler chose."""
        return tuple(e for e in (*self.inputs, *self.outputs) if e.changed)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "inputs": [dataclasses.asdict(e) for e in self.inputs],
            "outputs": [dataclasses.asdict(e) for e in self.outputs],
        }

    def __str__(self) -> str:
        lines = []
        for e in (*self.inputs, *self.outputs):
            mark = "  <- changed" if e.changed else ""
            lines.append(e.describe() + mark)
        return "\n".join(lines)


def _path_str(prefix: str, keypath: tuple) -> str:
    rest = path_str(keypath)
    return f"{prefix}/{rest}" if rest else prefix


PRUNED = "(unused: pruned by jit)"


def input_pairs(compiled: Any) -> list[tuple[tuple, Any, Any]]:
    """(key path, ArgInfo, compiled sharding) for each input leaf of `(args, kwargs)`.

    The sharding is None for an argument `jax.jit` pruned (unused, `keep_unused=False`): the
    shardings are flattened up to the arguments' structure, so a None keeps its place instead
    of shifting every later argument onto the wrong sharding.
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(compiled.args_info)
    shardings = treedef.flatten_up_to(compiled.input_shardings)
    return [(path, info, sh) for (path, info), sh in zip(flat, shardings, strict=True)]


def _input_name(path: tuple, arg_names: tuple[str, ...] | None) -> str:
    """`w`, `params/w` or `args[2]` for a positional leaf, the keyword's name for a keyword."""
    if path and getattr(path[0], "idx", 0) == 1 and len(path) > 1:  # (args, kwargs)[1]
        return _path_str(str(getattr(path[1], "key", path[1])), path[2:])
    i = getattr(path[1], "idx", 0) if len(path) > 1 else 0
    prefix = arg_names[i] if arg_names and i < len(arg_names) else f"args[{i}]"
    return _path_str(prefix, path[2:])


def layout_of(
    compiled: Any,
    *,
    arg_names: tuple[str, ...] | None = None,
    requested_in: Any = None,
    requested_out: Any = None,
) -> CompiledLayout:
    """The `CompiledLayout` of a `jax.stages.Compiled`.

    Args:
        compiled: the compiled program.
        arg_names: names for the positional arguments (default `args[i]`); keyword arguments
            are named by their keyword.
        requested_in: requested shardings, one per leaf of `(args, kwargs)` (or a tree with
            those leaves), None leaves where nothing was requested.
        requested_out: requested shardings, one per output leaf (or a tree like the outputs).

    Returns:
        A `CompiledLayout`.
    """
    req_in = _leaves_or_none(requested_in)
    inputs = []
    for k, (path, info, sh) in enumerate(input_pairs(compiled)):
        name = _input_name(path, arg_names)
        leaf = name.rsplit("/", 1)[-1]
        inputs.append(_entry("input", name, leaf, info, sh, _nth(req_in, k)))
    outputs = []
    flat_out, treedef = jax.tree_util.tree_flatten_with_path(compiled.out_info)
    out_sh = treedef.flatten_up_to(compiled.output_shardings)
    req_out = _leaves_or_none(requested_out)
    for k, ((path, info), sh) in enumerate(zip(flat_out, out_sh, strict=True)):
        outputs.append(_entry("output", _path_str("out", path), "out", info, sh, _nth(req_out, k)))
    return CompiledLayout(tuple(inputs), tuple(outputs))


def _leaves_or_none(tree: Any) -> list | None:
    return None if tree is None else jax.tree.leaves(tree, is_leaf=lambda x: x is None)


def _nth(items: list | None, k: int) -> Any:
    return items[k] if items is not None and k < len(items) else None


def _entry(side: str, path: str, leaf: str, info: Any, sh: Any, req: Any) -> LayoutEntry:
    """One row: the compiled sharding `sh` and the requested `req` of a leaf, in notation."""
    shape = tuple(info.shape)
    comp = _spec_of(sh, len(shape))
    rspec = _spec_of(req, len(shape)) if req is not None else None
    if sh is None:
        compiled = PRUNED
    else:
        compiled = _notation(leaf, shape, comp) if comp is not None else str(sh)
    return LayoutEntry(
        side=side,
        path=path,
        shape=shape,
        dtype=str(info.dtype),
        requested=None if rspec is None else _notation(leaf, shape, rspec),
        compiled=compiled,
        pruned=side == "input" and sh is None,
    )


def requested_shardings(args: tuple, kwargs: dict | None = None) -> list[Any]:
    """The shardings the arguments ask for: a `NamedSharding` per placed leaf of
    `(args, kwargs)`, else None."""

    def req(x):
        sh = getattr(x, "sharding", None)
        return sh if isinstance(sh, NamedSharding) else None

    return [req(x) for x in jax.tree.leaves((args, kwargs or {}))]


def merged_requests(jit_requests: tuple, own: list[Any], n: int) -> list[Any]:
    """Per input leaf: the sharding `jax.jit` was given, else the argument's own sharding.

    `own` counts only when it has one entry per compiled input (`n`): static arguments have
    leaves that the compiled program does not.
    """
    own = own if len(own) == n else [None] * n
    return [j if j is not None else o for j, o in zip(list(jit_requests) + [None] * n, own)]


def layout_for(compilation: Compilation, fn: Any, args: tuple, kwargs: dict) -> CompiledLayout:
    """The layout of what `compile_for` compiled: requests from jit and from the arguments."""
    if kind_of(fn) not in ("function", "jitted"):
        return layout_of(compilation.compiled)
    n = len(input_pairs(compilation.compiled))
    return layout_of(
        compilation.compiled,
        arg_names=arg_names_of(getattr(fn, "__wrapped__", fn), len(args)),
        requested_in=merged_requests(
            compilation.requested_in, requested_shardings(args, kwargs), n
        ),
        requested_out=list(compilation.requested_out) or None,
    )


def _mesh_for_specs(args: tuple, kwargs: dict) -> Any:
    """The mesh a PartitionSpec in in/out_shardings names: the arguments' own, else
    `jax.set_mesh`'s; None when neither exists."""
    for x in jax.tree.leaves((args, kwargs)):
        sh = getattr(x, "sharding", None)
        if isinstance(sh, NamedSharding):
            return sh.mesh
    ctx = context_mesh()
    return None if ctx is None or ctx.empty else ctx


def resolve_specs(tree: Any, arg: str, args: tuple, kwargs: dict) -> Any:
    """`tree` with each PartitionSpec made a NamedSharding on the arguments' mesh (else
    `jax.set_mesh`'s), as `jax.jit` reads it under `jax.set_mesh`."""
    if tree is None:
        return None
    is_spec = lambda x: isinstance(x, PartitionSpec)  # noqa: E731
    if not any(is_spec(x) for x in jax.tree.leaves(tree, is_leaf=is_spec)):
        return tree
    mesh = _mesh_for_specs(args, kwargs)
    if mesh is None:
        spec = next(x for x in jax.tree.leaves(tree, is_leaf=is_spec) if is_spec(x))
        raise ShardkitValueError(
            f"compiled_layout({arg}=PartitionSpec{tuple(spec)}): a PartitionSpec needs a mesh, "
            "and there is no mesh: no argument carries a NamedSharding and no jax.set_mesh is "
            f"active; fix: {arg}=NamedSharding(mesh, P(...)), or place the arguments with "
            "jax.device_put(x, NamedSharding(mesh, P(...))), or call inside "
            "`with jax.set_mesh(mesh):`."
        )
    return jax.tree.map(
        lambda x: NamedSharding(mesh, x) if is_spec(x) else x,
        tree,
        is_leaf=lambda x: x is None or is_spec(x),
    )


def arg_names_of(fn: Any, nargs: int) -> tuple[str, ...] | None:
    """Parameter names of `fn` for its first `nargs` positional arguments, if known."""
    try:
        params = list(_pyinspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    names = []
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            names.extend(f"{p.name}[{j}]" for j in range(nargs - len(names)))
            break
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    return tuple(names[:nargs]) if len(names) >= nargs else None


def compiled_layout(
    fn: Any,
    *args: Any,
    in_shardings: Any = None,
    out_shardings: Any = None,
    **kwargs: Any,
) -> CompiledLayout:
    """Input and output shardings of `fn` compiled for `args`, requested vs compiled.

    Args:
        fn: a function, a `jax.jit`-wrapped function, or a `Lowered`/`Compiled` object.
        *args: arrays or `jax.ShapeDtypeStruct` (their `NamedSharding`s are the request).
        in_shardings: requested input shardings, passed to `jax.jit` as its `in_shardings`
            (a sharding, or a tuple with one per positional argument); default: each placed
            argument's own sharding, or those of a `jax.jit(f, in_shardings=...)` given as
            `fn`.
        out_shardings: requested output shardings, passed to `jax.jit` as its `out_shardings`
            (a tree like the outputs, or one sharding for all); default: those of a
            `jax.jit(f, out_shardings=...)` given as `fn`, else none (the compiler's choice,
            always listed as changed). In both, a `PartitionSpec` means a `NamedSharding` on
            the arguments' mesh, else on the mesh of `jax.set_mesh`; a None leaf leaves that
            layout to the compiler.
        **kwargs: keyword arguments for `fn`.

    Returns:
        A `CompiledLayout`; `.changed()` lists what the compiler decided: what was not
        requested, or (never for a request `jax.jit` honours) differs from the request. An
        input `jax.jit` pruned (unused) is marked `pruned` and never changed.

    Raises:
        TypeError: when `fn` is not callable or the arguments do not match it, or when
            `in_shardings`/`out_shardings` are given with a Lowered or Compiled `fn`.
        ValueError: a `PartitionSpec` is given and there is no mesh to resolve it on.

    Example:
        >>> mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
        >>> x = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("data")))
        >>> print(compiled_layout(lambda x: x.T, x).changed()[0].compiled)
        out[A, B_data]
        >>> compiled_layout(lambda x: x.T, x, out_shardings=P("data")).changed()
        ()

    See also:
        `shardkit.inspect` (its report carries the same layout).
    """
    compilation = compile_for(
        fn,
        args,
        kwargs,
        who="compiled_layout",
        in_shardings=resolve_specs(in_shardings, "in_shardings", args, kwargs),
        out_shardings=resolve_specs(out_shardings, "out_shardings", args, kwargs),
    )
    return layout_for(compilation, fn, args, kwargs)
