"""`shardkit inspect`: audit a function's compiled collectives from the command line.

Two ways to name what to compile:

- a function and its argument shapes:
  `shardkit inspect mypkg.model:step --mesh data=4,model=2 --args "f32[1024,1024]@data,model"
  "f32[1024]"` (each `--args` item is `DTYPE[DIMS]` with an optional `@SPEC`, where SPEC lists
  one mesh axis per dimension: `data,model`, `_` for an unsplit dimension, `data+model` for a
  dimension split over two mesh axes); the target may also be `path/to/file.py:function`;
- a small Python spec file, `shardkit inspect spec.py`, that defines `fn` and `args` (a tuple of
  arrays or `jax.ShapeDtypeStruct`), and optionally `kwargs`.

The report is printed as a table; `--json` prints the dict form, `--html FILE` writes the HTML
fragment. Nothing heavy is imported until the command runs.

Example:
    $ shardkit inspect jax.numpy.fft:fftn --mesh x=4,y=2 --args "c64[64,64,64]@x,y"
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import re
import sys
from typing import Any

from shardkit.cli_args import at_least, parse_mesh_arg, parse_spec_arg
from shardkit.common import html_page
from shardkit.errors import ShardkitValueError

_DTYPES = {
    "f16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "f64": "float64",
    "c64": "complex64",
    "c128": "complex128",
    "s8": "int8",
    "i8": "int8",
    "s16": "int16",
    "i16": "int16",
    "s32": "int32",
    "i32": "int32",
    "s64": "int64",
    "i64": "int64",
    "u8": "uint8",
    "u32": "uint32",
    "pred": "bool",
    "bool": "bool",
}
_ARG_RE = re.compile(r"^\s*([a-z0-9]+)\[([0-9,\s]*)\]\s*(?:@(.*))?$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `inspect` options to `parser` (imports nothing heavy)."""
    parser.description = (
        "Compile a function and report its collectives (kind, bytes per device, mesh axes, "
        "executions, source line), per-device memory and FLOPs. Example: shardkit inspect "
        'jax.numpy.fft:fftn --mesh x=4,y=2 --args "c64[64,64,64]@x,y"'
    )
    parser.add_argument(
        "target",
        help="module:function, path/to/file.py:function, or a spec file defining fn and args",
    )
    parser.add_argument(
        "--args",
        nargs="+",
        default=[],
        metavar="ARG",
        help='argument shapes, e.g. "f32[1024,1024]@data,model" "f32[1024]"',
    )
    parser.add_argument("--mesh", help="mesh axes, e.g. data=4,model=2")
    parser.add_argument("--axis-types", choices=["explicit", "auto"], default="explicit")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--text", action="store_true", help="print plain text, not a table")
    parser.add_argument("--html", metavar="FILE", help="also write the report as HTML to FILE")
    parser.add_argument(
        "--large-bytes",
        type=float,
        default=None,
        help="warn about collectives moving more bytes per device per call",
    )
    parser.add_argument(
        "--simulate",
        type=at_least(1),
        metavar="N",
        default=None,
        help="run on N simulated CPU devices (default: the mesh size, on CPU)",
    )


def parse_arg_spec(text: str) -> tuple[str, tuple[int, ...], str | None]:
    """`"f32[1024,512]@data,model"` -> `("float32", (1024, 512), "data,model")`.

    Raises:
        ValueError: when the text is not `DTYPE[DIMS]` with an optional `@SPEC`.
    """
    m = _ARG_RE.match(text)
    if not m or m.group(1) not in _DTYPES:
        raise ShardkitValueError(
            f"--args {text!r}: write each argument as DTYPE[DIMS] with an optional @SPEC, "
            f"DTYPE one of {', '.join(sorted(_DTYPES))}. Example: --args "
            '"f32[1024,1024]@data,model" "f32[1024]".'
        )
    dims = tuple(int(d) for d in m.group(2).replace(" ", "").split(",") if d)
    spec = m.group(3)
    return _DTYPES[m.group(1)], dims, (spec.strip() if spec is not None else None)


def check_arg_spec(text: str, shape: tuple[int, ...], spec: Any, mesh: Any) -> None:
    """Checks one `--args` item's PartitionSpec against its shape and the mesh, as the rule
    linter checks a leaf, before JAX sees it.

    Raises:
        SpecRankError: the spec has more entries than the array has dims.
        DuplicateMeshAxisError: a mesh axis splits two dims.
        UnknownMeshAxisError: the spec names a mesh axis `--mesh` does not have.
        IndivisibleShardingError: a dim is not divisible by the mesh axes it is split over.
        (All are `ValueError`s; the message names the `--args` item and ends with a fix.)
    """
    # lazy: `shardkit inspect --help` starts no JAX (the linter imports it)
    from shardkit.linter import LintFinding, LintReport, check_leaf

    sizes = {str(k): int(v) for k, v in dict(mesh.shape).items()}
    errors = [f for f in check_leaf(text, shape, spec, sizes) if f.severity == "error"]
    if not errors:
        return
    first = errors[0]
    detail = first.message.removeprefix(f"leaf {text!r} ")
    detail += " On the command line: " + _cli_fix(first.code, text, shape, spec, sizes)
    # the linter raises the precise error of its finding (IndivisibleShardingError, ...)
    finding = LintFinding(text, first.code, "error", f"--args {text!r}: {detail}")
    LintReport(findings=[finding], leaves=[], mesh_sizes=sizes).raise_if_errors()


def _cli_fix(code: str, text: str, shape: tuple[int, ...], spec: Any, sizes: dict) -> str:
    """The fix of a linter finding in `--args` syntax (`_` for an unsplit dimension)."""
    head = text.split("@", 1)[0].strip()
    entries = list(spec)

    def item(spec_entries: list) -> str:
        cells = [
            "_" if e is None else e if isinstance(e, str) else "+".join(e) for e in spec_entries
        ]
        return f"--args '{head}@{','.join(cells)}'"

    if code == "rank":
        return f"{item(entries[: len(shape)])}."
    if code == "indivisible":
        for dim, e in enumerate(entries):
            axes = () if e is None else (e,) if isinstance(e, str) else tuple(e)
            if shape[dim] % math.prod(sizes[a] for a in axes):
                entries[dim] = None
        return f"{item(entries)}, or a --mesh whose sizes divide the dims."
    if code == "unknown-axis":
        return f"name only mesh axes of --mesh ({', '.join(sizes)}), or add the axis to --mesh."
    return "use each mesh axis once in @SPEC."


def _load_target(target: str) -> tuple[Any, dict[str, Any] | None]:
    """(function, namespace of a spec file or None)."""
    if target.endswith(".py") and ":" not in target.rsplit("/", 1)[-1]:
        import runpy

        if not os.path.exists(target):
            raise ShardkitValueError(f"shardkit inspect {target}: no such spec file.")
        ns = runpy.run_path(target, run_name="__shardkit_inspect__")
        if "fn" not in ns or "args" not in ns:
            raise ShardkitValueError(
                f"spec file {target} must define `fn` (the function) and `args` (a tuple of "
                "arrays or jax.ShapeDtypeStruct); fix: add e.g. `fn = my_step` and "
                "`args = (x_spec,)`."
            )
        return ns["fn"], ns
    mod_name, sep, attr = target.rpartition(":")
    if not sep or not mod_name or not attr:
        raise ShardkitValueError(
            f"shardkit inspect {target!r}: name a function as module:function or "
            "path/to/file.py:function, or pass a spec file ending in .py."
        )
    if mod_name.endswith(".py"):
        import runpy

        if not os.path.exists(mod_name):
            raise ShardkitValueError(f"shardkit inspect {target}: no such file {mod_name}.")
        ns = runpy.run_path(mod_name, run_name="__shardkit_inspect__")
        obj = ns.get(attr.split(".")[0])
        for part in attr.split(".")[1:]:
            obj = getattr(obj, part, None)
    else:
        try:
            module = importlib.import_module(mod_name)
        except ImportError as e:
            raise ShardkitValueError(
                f"shardkit inspect {target}: cannot import {mod_name}: {e}"
            ) from None
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part, None)
    if obj is None or not callable(obj):
        raise ShardkitValueError(
            f"shardkit inspect {target}: {attr!r} is not a function of {mod_name}; fix: "
            "check the name after the colon."
        )
    return obj, None


def _setup_devices(n: int | None) -> None:
    if n is None:
        return
    from shardkit.mesh import simulate_cpu_devices  # lazy: `shardkit inspect --help` starts no JAX

    try:
        simulate_cpu_devices(n)
    except RuntimeError:
        import jax

        if jax.device_count() < n:
            raise


def _mesh_size(text: str | None) -> int | None:
    if not text:
        return None
    sizes = parse_mesh_arg(text).values()
    if any(s <= 0 for s in sizes):
        return None
    out = 1
    for s in sizes:
        out *= s
    return out


def run(args: argparse.Namespace) -> int:
    """Runs `shardkit inspect`; returns the exit status (0 on success)."""
    parsed = [parse_arg_spec(a) for a in args.args]
    simulate = args.simulate
    cpu = os.environ.get("JAX_PLATFORMS", "cpu") in ("", "cpu")
    has_flag = "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
    if simulate is None and cpu and not has_flag:
        simulate = _mesh_size(args.mesh) or 8
    _setup_devices(simulate)

    import jax
    from jax.sharding import NamedSharding

    from shardkit.inspection.audit import (  # lazy: `shardkit inspect --help` starts no JAX
        DEFAULT_LARGE_BYTES,
        inspect,
    )

    fn, ns = _load_target(args.target)
    mesh = None
    if args.mesh:
        from shardkit.mesh import (  # lazy: `shardkit inspect --help` starts no JAX
            first_devices,
            make_mesh,
        )

        sizes = parse_mesh_arg(args.mesh)
        mesh = make_mesh(sizes, axis_types=args.axis_types, devices=first_devices(sizes))
    if ns is not None:
        call_args = tuple(ns["args"])
        kwargs = dict(ns.get("kwargs") or {})
        mesh = mesh or ns.get("mesh")
    else:
        call_args = []
        for text, (dtype, shape, spec) in zip(args.args, parsed, strict=True):
            sharding = None
            if spec is not None:
                if mesh is None:
                    raise ShardkitValueError(
                        f"--args {text!r} names mesh axes but no mesh is given; fix: add "
                        "--mesh data=4,model=2 (your mesh axis names and sizes)."
                    )
                spec = parse_spec_arg(spec)
                check_arg_spec(text, shape, spec, mesh)
                sharding = NamedSharding(mesh, spec)
            call_args.append(jax.ShapeDtypeStruct(shape, jax.numpy.dtype(dtype), sharding=sharding))
        call_args = tuple(call_args)
        kwargs = {}
    large = args.large_bytes if args.large_bytes is not None else DEFAULT_LARGE_BYTES
    if mesh is not None:
        with jax.set_mesh(mesh):
            report = inspect(fn, *call_args, mesh=mesh, large_bytes=large, **kwargs)
    else:
        report = inspect(fn, *call_args, large_bytes=large, **kwargs)
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(html_page(f"shardkit inspect: {report.name}", report.to_html()))
    if args.json:
        print(report.to_json(indent=2))
    elif args.text or not sys.stdout.isatty():
        print(report.to_text())
    else:
        from rich.console import Console

        Console().print(report)
    return 0
