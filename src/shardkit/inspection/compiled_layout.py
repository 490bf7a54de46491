"""Input and output shardings of a compiled program, requested vs compiled.

`jax.jit` lets the compiler choose what you did not fix: the sharding of outputs (by
propagation) and of arguments that were not placed. `compiled_layout` shows both sides in the
scaling-book notation, `x[A_data, B]` (dimension A of `x` sharded over mesh axis `data`,
dimension B replicated), and lists what the compiler changed.

Example:
    >>> layout = compiled_layout(jax.jit(f), x)
    >>> print(layout)
    input  x   f32[64,32]  requested x[A_data, B]  compiled x[A_data, B]
    output out f32[64,32]  requested (compiler's choice)  compiled out[A, B]  <- changed
"""

from __future__ import annotations

import dataclasses
import inspect as _pyinspect
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from shardkit.common import path_str
from shardkit.inspection.compiling import compile_for
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
        compiled: the notation the compiled program uses.
    """

    side: str
    path: str
    shape: tuple[int, ...]
    dtype: str
    requested: str | None
    compiled: str

    @property
    def changed(self) -> bool:
        """True when the compiled layout differs from the request (or nothing was requested)."""
        return self.requested != self.compiled

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
        arg_names: names for the positional arguments (default `args[i]`).
        requested_in: a tree (like the arguments) of requested shardings or None leaves.
        requested_out: a tree (like the outputs) of requested shardings, or None.

    Returns:
        A `CompiledLayout`.
    """

    in_shardings, _ = compiled.input_shardings
    args_info, _ = compiled.args_info
    inputs = []
    flat_in = jax.tree_util.tree_flatten_with_path(args_info)[0]
    req_in = _leaves_or_none(requested_in)
    for k, ((path, info), sh) in enumerate(
        zip(flat_in, jax.tree.leaves(in_shardings), strict=False)
    ):
        i = path[0].idx if path and hasattr(path[0], "idx") else 0
        prefix = arg_names[i] if arg_names and i < len(arg_names) else f"args[{i}]"
        name = _path_str(prefix, path[1:])
        leaf = name.rsplit("/", 1)[-1]
        inputs.append(_entry("input", name, leaf, info, sh, _nth(req_in, k)))
    outputs = []
    flat_out = jax.tree_util.tree_flatten_with_path(compiled.out_info)[0]
    req_out = _leaves_or_none(requested_out)
    out_sh = jax.tree.leaves(compiled.output_shardings)
    for k, ((path, info), sh) in enumerate(zip(flat_out, out_sh, strict=False)):
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
    return LayoutEntry(
        side=side,
        path=path,
        shape=shape,
        dtype=str(info.dtype),
        requested=None if rspec is None else _notation(leaf, shape, rspec),
        compiled=_notation(leaf, shape, comp) if comp is not None else str(sh),
    )


def requested_shardings(args: tuple) -> Any:
    """The shardings the arguments ask for: a `NamedSharding` per placed leaf, else None."""

    def req(x):
        sh = getattr(x, "sharding", None)
        return sh if isinstance(sh, NamedSharding) else None

    return [req(x) for x in jax.tree.leaves(args)]


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
        in_shardings: requested input shardings (a tree like `args`); default: each placed
            argument's own sharding.
        out_shardings: requested output shardings (a tree like the outputs); default: none
            (the compiler's choice, always listed as changed).
        **kwargs: keyword arguments for `fn`.

    Returns:
        A `CompiledLayout`; `.changed()` lists what the compiler decided.

    Raises:
        TypeError: when `fn` is not callable or the arguments do not match it.

    Example:
        >>> x = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("data")))
        >>> print(compiled_layout(lambda x: x.T, x).changed()[0].compiled)
        out[A, B_data]

    See also:
        `shardkit.inspect` (its report carries the same layout).
    """
    compiled, _ = compile_for(fn, args, kwargs, who="compiled_layout")
    requested_in = in_shardings if in_shardings is not None else requested_shardings(args)
    return layout_of(
        compiled,
        arg_names=arg_names_of(fn, len(args)),
        requested_in=requested_in,
        requested_out=out_shardings,
    )
