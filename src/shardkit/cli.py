"""The ``shardkit`` command: devices, show, inspect, train, plan, launch.

Only argparse is imported up front so ``shardkit --help`` answers at once; each subcommand
imports JAX when it runs. ``inspect`` and ``train`` live with their packages
(``shardkit.inspection.command``, ``shardkit.train.command``), which provide
``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import errno
import html
import importlib
import json
import logging
import os
import sys
import threading
from collections.abc import Sequence

from shardkit.cli_args import (
    CLIError,
    OneLineParser,
    at_least,
    parse_mesh_arg,
    parse_shape_arg,
    parse_spec_arg,
)
from shardkit.common import format_bytes, html_page
from shardkit.compat import version_line
from shardkit.errors import ShardkitError

__all__ = ["CLIError", "main", "parse_mesh_arg", "parse_shape_arg", "parse_spec_arg"]

# subcommand -> module providing add_arguments(parser) and run(args)
_DELEGATED = {
    "inspect": ("shardkit.inspection.command", "audit a function's compiled collectives"),
    "train": ("shardkit.train.command", "train a model with a parallel strategy"),
    "plan": ("shardkit.plan.command", "rank parallel layouts by predicted memory and time"),
    "launch": ("shardkit.distributed.launch", "run a command as N ranks of a multi-process job"),
}


def _add_simulate(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--simulate",
        type=at_least(1),
        metavar="N",
        default=None,
        help="run on N simulated CPU devices (set before JAX starts)",
    )


def _setup_devices(n: int | None) -> None:
    if n is not None:
        # lazy: the CLI starts JAX only when a command runs
        from shardkit.mesh import simulate_cpu_devices

        simulate_cpu_devices(n)


def _cmd_devices(args: argparse.Namespace) -> int:
    # 8 simulated CPU devices by default, as `show`, `inspect` and `train` use
    _setup_devices(args.simulate if args.simulate is not None else _default_simulate())
    import jax

    devs = jax.devices()
    rows = []
    for d in devs:
        limit = None
        try:
            stats = d.memory_stats()
            limit = (stats or {}).get("bytes_limit")
        except Exception:  # noqa: BLE001 - memory_stats is unsupported on some backends (CPU)
            pass
        rows.append({"id": d.id, "kind": d.device_kind, "process": d.process_index,
                     "platform": d.platform, "memory_bytes": limit})  # fmt: skip
    if args.json:
        info = {"versions": version_line(), "backend": jax.default_backend(),
                "processes": jax.process_count(), "devices": rows}  # fmt: skip
        print(json.dumps(info, indent=1))
        return 0
    print(
        f"{version_line()}, backend {jax.default_backend()}, {len(devs)} device(s), "
        f"{jax.process_count()} process(es)"
    )
    print(f"{'id':>4}  {'kind':<24} {'process':>7}  memory")
    for r in rows:
        mem = "unknown" if r["memory_bytes"] is None else format_bytes(r["memory_bytes"])
        print(f"{r['id']:>4}  {r['kind']:<24} {r['process']:>7}  {mem}")
    return 0


def _demo_layouts() -> list[tuple[str, dict, tuple[int, ...], tuple]]:
    return [
        ("1-D, split over both mesh axes", {"data": 4, "model": 2}, (16,), (("data", "model"),)),
        ("2-D, rows over data, columns over model", {"data": 4, "model": 2}, (16, 16),
         ("data", "model")),
        ("2-D, partially replicated (rows over data only)", {"data": 4, "model": 2}, (16, 16),
         ("data", None)),
        ("3-D, batch over data, last dim over model", {"data": 4, "model": 2}, (8, 4, 16),
         ("data", None, "model")),
        ("4-D, three sharded dims (panels)", {"a": 2, "b": 2, "c": 2}, (4, 4, 4, 4),
         ("a", None, "b", "c")),
    ]  # fmt: skip


def _cmd_show(args: argparse.Namespace) -> int:
    _setup_devices(args.simulate if args.simulate is not None else _default_simulate())
    from jax.sharding import PartitionSpec

    from shardkit.layout import show  # lazy: the CLI starts JAX only when a command runs
    from shardkit.mesh import make_mesh  # lazy: the CLI starts JAX only when a command runs

    fmt = args.format
    if args.shape is None:
        if args.spec is not None or args.mesh is not None:
            raise CLIError("--mesh/--spec need --shape. Example: --shape 16,16 --spec data,model.")
        parts = []
        for title, axes, shape, spec in _demo_layouts():
            mesh = make_mesh(axes, axis_types=args.axis_types)
            if fmt != "html":  # "terminal" and "text" print themselves
                print(f"\n# {title}")
            out = show(shape=shape, mesh=mesh, spec=PartitionSpec(*spec), format=fmt, name="x")
            if fmt == "html":
                parts.append(f"<h2>{html.escape(title)}</h2>{out}")
        if fmt == "html":
            print(html_page("shardkit show", "".join(parts)), end="")
        return 0
    shape = parse_shape_arg(args.shape)
    mesh = make_mesh(parse_mesh_arg(args.mesh or "data=-1"), axis_types=args.axis_types)
    spec = parse_spec_arg(args.spec or "")
    dims = None if args.dims is None else [int(d) for d in args.dims.split(",")]
    out = show(shape=shape, mesh=mesh, spec=spec, dims=dims, format=fmt, name="x")
    if fmt == "html":
        print(html_page(f"shardkit show {shape}", out), end="")
    return 0


def _default_simulate() -> int | None:
    """8 simulated CPU devices unless JAX is told otherwise (accelerators, XLA_FLAGS)."""
    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return None
    if os.environ.get("JAX_PLATFORMS", "cpu") not in ("", "cpu"):
        return None
    return 8


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; a delegated subcommand's module is imported only when
    ``command`` names it (so ``shardkit --help`` imports no JAX)."""
    parser = OneLineParser(
        prog="shardkit",
        description="Sharded and parallel computation on JAX: meshes, layouts, collective "
        "audits, parallel training.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=version_line(),
        help="shardkit, jax and jaxlib versions",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (one line without)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)

    p = sub.add_parser("devices", help="list devices, processes and memory")
    _add_simulate(p)
    p.add_argument("--json", action="store_true", help="print the devices as JSON")
    p.set_defaults(func=_cmd_devices)

    p = sub.add_parser(
        "show",
        help="draw the layout of a sharded array (a demo tour without --shape)",
        description="Example: shardkit show --mesh data=4,model=2 --shape 16,16 --spec data,model",
    )
    p.add_argument("--mesh", help="mesh axes, e.g. data=4,model=2 (default data=-1)")
    p.add_argument("--shape", help="array shape, e.g. 16,16 or 8,8,4")
    p.add_argument("--spec", help="partition spec, e.g. data,model or data+model,none")
    p.add_argument("--dims", help="the two dims to draw, e.g. 0,2 (others are folded)")
    p.add_argument("--format", choices=["terminal", "text", "html"], default="terminal")
    p.add_argument("--axis-types", choices=["explicit", "auto"], default="explicit")
    _add_simulate(p)
    p.set_defaults(func=_cmd_show)

    for name, (module, help_text) in _DELEGATED.items():
        p = sub.add_parser(name, help=help_text)
        if name != command:
            p.set_defaults(func=_unavailable(name))
            continue
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError:
            p.set_defaults(func=_unavailable(name))
            continue
        mod.add_arguments(p)
        p.set_defaults(func=mod.run)
    return parser


def _unavailable(name: str):
    def run(args: argparse.Namespace) -> int:
        print(f"shardkit {name}: not available in this installation.", file=sys.stderr)
        return 2

    return run


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--debug" in argv[1:]:  # also after the command: shardkit train --debug
        argv = ["--debug", *(a for a in argv if a != "--debug")]
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt as e:  # a run stopped by SIGINT/SIGTERM after saving (or Ctrl-C)
        if args.debug:
            raise
        print(f"shardkit {args.command}: {e or 'interrupted'}", file=sys.stderr)
        return getattr(e, "exit_code", 130)
    except (ShardkitError, ValueError, TypeError, RuntimeError, OSError, SyntaxError) as e:
        if args.debug:
            raise
        print(f"shardkit {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return getattr(e, "exit_code", 2)


_OS_FIXES = {
    errno.ENOSPC: "free space, or point --out / --checkpoint-dir at a disk with room",
    errno.EDQUOT: "free space, or point --out / --checkpoint-dir at a disk with room",
    errno.EROFS: "choose a writable --out / --checkpoint-dir",
    errno.EACCES: "choose a writable --out / --checkpoint-dir, or fix its permissions",
    errno.EPERM: "choose a writable --out / --checkpoint-dir, or fix its permissions",
    errno.ENOTDIR: "a part of the path is a file; choose another --out / --checkpoint-dir",
    errno.ENOENT: "check the path",
}


_WRITE_FAILED = ("No space left", "File too large", "os_error_code='28'", "os_error_code='27'",
                 "Read-only file system", "Permission denied")  # fmt: skip


def _one_line(e: BaseException) -> str:
    """The error in one line; an operating-system error with the fix for its cause."""
    if isinstance(e, SyntaxError):
        return (
            f"{e.filename}:{e.lineno}: {e.msg}; fix: correct the syntax there "
            "(python -m py_compile FILE shows it too)."
        )
    if isinstance(e, OSError) and e.errno is None and "fix:" in str(e):
        return " ".join(str(e).split())  # shardkit's own message, with its fix
    if isinstance(e, OSError) and not isinstance(e, ShardkitError):
        where = f" {e.filename}" if e.filename else ""
        fix = _OS_FIXES.get(e.errno or 0, "check the path and the disk")
        return f"{e.strerror or e}{':' if where else ''}{where}; fix: {fix} (--debug: traceback)."
    text = " ".join(str(e).split())
    if not isinstance(e, ShardkitError) and any(m in text for m in _WRITE_FAILED):
        # a failed checkpoint write reported by orbax / tensorstore
        return (
            f"{text}; fix: free space or make the folder writable, or point --out / "
            "--checkpoint-dir elsewhere; then --resume (--debug: traceback)."
        )
    return text


def _quiet_background_errors() -> None:
    """Without --debug, errors in background threads (orbax's asynchronous saves) are not
    printed as they happen: the save's error reaches the command, which prints it once."""
    logging.getLogger("absl").setLevel(logging.CRITICAL)
    threading.excepthook = lambda args: None
    sys.unraisablehook = lambda args: None


def entry() -> None:
    """The `shardkit` program: `main`, then a failing command exits at once.

    After a failure has been printed in one line, background threads that are still winding
    down (an asynchronous checkpoint save that failed, its event loop) could print their own
    tracebacks or keep the process alive; the process ends without waiting for them.
    """
    debug = "--debug" in sys.argv[1:]
    if not debug:  # the program's own process: a library caller of `main` keeps its hooks
        _quiet_background_errors()
    code = main()
    if code and not debug:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
