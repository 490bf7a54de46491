"""`shardkit launch`: run N copies of a command as the ranks of one multi-process JAX job.

The coordinator is process 0 on 127.0.0.1 at a free port. Each rank gets the variables that
`shardkit.distributed.initialize()` reads (`SHARDKIT_COORDINATOR_ADDRESS`,
`SHARDKIT_NUM_PROCESSES`, `SHARDKIT_PROCESS_ID`) and, with `devices_per_process`, that many
simulated CPU devices. Output lines are prefixed `[rank i]`; the launcher's own lines
(`[launch] ...`) go to stderr. When a rank fails, the launcher
stops the others (SIGTERM, then SIGKILL after a grace period) and returns the failing rank's
status, so a dead rank never leaves the rest hanging in a collective.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO

from shardkit.cli_args import at_least, port_number, positive_seconds
from shardkit.distributed import environment as _env
from shardkit.distributed.runtime import local_device_env
from shardkit.errors import ShardkitValueError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rank_env(
    rank: int,
    processes: int,
    address: str,
    *,
    devices_per_process: int | None = None,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment of one rank (launcher variables, unbuffered output, device count)."""
    env = dict(os.environ if base is None else base)
    if devices_per_process is not None:
        env = local_device_env(devices_per_process, env)
        env[_env.DEVICES_PER_PROCESS] = str(devices_per_process)
        env.setdefault("JAX_PLATFORMS", "cpu")
    env.update(
        {
            _env.COORDINATOR: address,
            _env.NUM_PROCESSES: str(processes),
            _env.PROCESS_ID: str(rank),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _status(code: int) -> int:
    """A shell-style exit status: a death by signal N becomes 128 + N."""
    return 128 - code if code < 0 else code


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


# signals that come from outside a rank (an operator, the OOM killer, a scheduler), unlike
# SIGABRT or SIGSEGV, which a rank raises itself
_OUTSIDE_SIGNALS = frozenset(
    {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}
)
# an error that says a peer went away: the rank saw another's failure, it is not the cause
_PEER_LOST = re.compile(
    r"connection (closed|reset|refused)|by peer|broken pipe|socket closed|heartbeat"
    r"|coordination service|barrier timed out|deadline_exceeded|unavailable:"
    r"|gloo \w+ failed|task .* (has )?(died|disconnected)",
    re.IGNORECASE,
)
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b(:|$)")


# gloo's connection chatter (one line per peer at start-up, written by several threads so two
# may share a line, and a line's tail, a bare count, may land on the next): hidden unless
# --verbose. A piece without the tag is dropped only right after a tagged line: a program's own
# bare numbers stay.
_CHATTER = re.compile(r"\[Gloo\]")
_GLOO_WORDS = frozenset(  # of "[Gloo] Rank 3 is connected to 3 peer ranks. Expected ... : 3"
    {"Rank", "is", "connected", "to", "peer", "ranks.", "Expected", "number", "of", "ranks", ":"}
)


def _gloo_tail(line: str) -> bool:
    """A piece of gloo's message cut off from its tag: blank, a count, or only its words."""
    words = re.sub(r"\d+", " ", line).split()
    return all(w in _GLOO_WORDS for w in words)


def _pump(
    rank: int,
    stream,
    out: TextIO,
    lock: threading.Lock,
    last: dict,
    verbose: bool = False,
    prefix: bool = True,
) -> None:
    chatter = False  # the previous line was gloo's
    for line in iter(stream.readline, ""):
        if not verbose and (_CHATTER.search(line) or (chatter and _gloo_tail(line))):
            chatter = True
            continue
        chatter = False
        end = "" if line.endswith("\n") else "\n"  # a last line without a newline
        with lock:
            out.write(f"[rank {rank}] {line}{end}" if prefix else f"{line}{end}")
            out.flush()
        text = line.strip()
        # a rank's error line (`ValueError: ...`) wins over later lines (JAX's traceback note)
        if text and (_ERROR_LINE.match(text) or not _ERROR_LINE.match(last.get(rank, ""))):
            last[rank] = text
    stream.close()


class _Pumps:
    """A rank's output readers (its stdout, and its stderr when read apart), joined as one."""

    def __init__(self, threads: list[threading.Thread]):
        self.threads = threads

    def join(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self.threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))


def _start_pumps(proc, rank, plain_rank, out, err, lock, last, verbose) -> _Pumps:
    """Threads copying a rank's output: to `out` prefixed, or for `plain_rank` its stdout to
    `out` as it is and its stderr to `err` prefixed (other ranks then go to `err`)."""
    streams = [(proc.stdout, out if plain_rank in (None, rank) else err, rank != plain_rank)]
    if rank == plain_rank:
        streams.append((proc.stderr, err, True))
    threads = [
        threading.Thread(
            target=_pump, args=(rank, stream, to, lock, last, verbose, prefix), daemon=True
        )
        for stream, to, prefix in streams
    ]
    for t in threads:
        t.start()
    return _Pumps(threads)


def launch(
    command: Sequence[str],
    *,
    processes: int,
    devices_per_process: int | None = None,
    port: int | None = None,
    grace: float = 5.0,
    timeout: float | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    env: dict[str, str] | None = None,
    verbose: bool = False,
    plain_rank: int | None = None,
) -> int:
    """Runs `command` as `processes` ranks of one job on this machine; returns the exit status.

    Args:
        command: the program and its arguments, e.g. `["python", "train.py"]`.
        processes: number of ranks (>= 1).
        devices_per_process: simulated CPU devices per rank (default: leave the device
            configuration alone).
        port: coordinator port on 127.0.0.1 (default: a free one).
        grace: seconds between SIGTERM and SIGKILL when stopping ranks.
        timeout: stop all ranks after this many seconds (default: no limit).
        out: where prefixed output goes (default stdout).
        err: where the launcher's own lines (``[launch] ...``: a timeout, a failed rank) go,
            and with `plain_rank` the other output (default `out` when given, else stderr).
        env: base environment (default `os.environ`).
        verbose: keep gloo's per-rank connection lines (hidden by default).
        plain_rank: this rank's stdout goes to `out` as it is, without the prefix (a rank
            printing a JSON document); its stderr and the other ranks' output go to `err`,
            prefixed.

    Returns:
        0 when every rank succeeded; else the status of the rank that failed first (128 + N
        for a death by signal N), which is the worst: the ranks stopped because of it do not
        count.

    Raises:
        ValueError: for processes < 1, devices_per_process < 1 or an empty command.

    Example:
        >>> launch(["python", "-c", "print('hi')"], processes=2)  # doctest: +SKIP
        [rank 0] hi
        [rank 1] hi
        0
    """
    if processes < 1:
        raise ShardkitValueError(
            f"processes={processes} must be >= 1; fix: shardkit launch -n 2 -- ..."
        )
    if devices_per_process is not None and devices_per_process < 1:
        raise ShardkitValueError(
            f"devices_per_process={devices_per_process} must be >= 1; fix: --devices-per-process 1."
        )
    if not command:
        raise ShardkitValueError(
            "no command to launch; fix: shardkit launch -n 2 -- python train.py"
        )
    err = err if err is not None else out if out is not None else sys.stderr
    out = sys.stdout if out is None else out
    address = f"127.0.0.1:{port or free_port()}"
    lock = threading.Lock()
    last: dict[int, str] = {}  # each rank's last line of output (its error, when it fails)
    procs, pumps = [], []
    for rank in range(processes):
        proc = subprocess.Popen(
            list(command),
            env=rank_env(rank, processes, address, devices_per_process=devices_per_process,
                         base=env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if rank == plain_rank else subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # so a stop reaches the rank's own children too
        )  # fmt: skip
        procs.append(proc)
        pumps.append(_start_pumps(proc, rank, plain_rank, out, err, lock, last, verbose))

    def say(text: str) -> None:
        with lock:
            err.write(f"[launch] {text}\n")
            err.flush()

    ended: dict[int, float] = {}  # rank -> when it exited, seen by a thread waiting on it
    with _terminate_as_interrupt():
        failed = _watch(procs, timeout, say, ended, pumps, last)
    if failed is not None and failed[0] >= 0:
        rank, code = failed
        # the other ranks that did not succeed: stopped here, or ended by the broken collective
        others = [i for i, p in enumerate(procs) if i != rank and p.returncode != 0]
        say(f"rank {rank} {_describe(code)}" + (f"; stopping ranks {others}" if others else ""))
    if failed is not None and any(p.poll() is None for p in procs):
        _stop(procs, grace)
    for t in pumps:
        t.join(timeout=5)
    if failed is not None and failed[0] in last:  # its error, once its output is all read
        say(f"rank {failed[0]}'s error: {last[failed[0]][:300]}")
    return 0 if failed is None else _status(failed[1])


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM to the launcher stops its ranks as Ctrl-C does (it never leaves them running)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _watch(
    procs: list[subprocess.Popen],
    timeout: float | None,
    say,
    ended: dict[int, float],
    pumps: list[_Pumps],
    last: dict[int, str],
) -> tuple[int, int] | None:
    """Waits for the ranks: ``(rank, status)`` of the rank to blame (rank -1 for a timeout,
    status 124, or Ctrl-C, 130), or None when all succeeded. `ended` gets each rank's exit
    time; `pumps` and `last` are the ranks' output readers and last lines."""
    failed: tuple[int, int] | None = None
    start = time.monotonic()

    def wait(rank: int, p: subprocess.Popen) -> None:
        p.wait()
        ended[rank] = time.monotonic()

    for rank, p in enumerate(procs):
        threading.Thread(target=wait, args=(rank, p), daemon=True).start()

    def first_failure() -> tuple[int, int] | None:
        bad = [r for r in list(ended) if procs[r].returncode]
        if not bad:
            return None
        # A rank's death breaks the others' collectives a moment later, and on a loaded host
        # the survivors' exits are sometimes seen first. So let the exits and the failing
        # ranks' output arrive, then blame, in order: a rank killed from outside (SIGKILL,
        # SIGTERM, ...), a rank whose error is its own rather than a lost peer, the earliest.
        time.sleep(0.5)
        deadline = time.monotonic() + 2.0
        for r in [r for r in list(ended) if procs[r].returncode]:
            pumps[r].join(timeout=max(0.0, deadline - time.monotonic()))
        bad = [r for r in list(ended) if procs[r].returncode]
        return min(((r, procs[r].returncode) for r in bad),
                   key=lambda x: (-x[1] not in _OUTSIDE_SIGNALS,
                                  bool(_PEER_LOST.search(last.get(x[0], ""))),
                                  ended[x[0]]))  # fmt: skip

    try:
        while any(p.poll() is None for p in procs):
            failed = first_failure()
            if failed is not None:
                return failed
            time.sleep(0.02)
            if timeout is not None and time.monotonic() - start > timeout:
                say(f"timeout after {timeout:g} s; stopping all ranks")
                return (-1, 124)
        time.sleep(0.05)  # the waiting threads note the last exits
        failed = first_failure()
    except KeyboardInterrupt:
        say("interrupted; stopping all ranks")
        for p in procs:  # they stop in launch(); this status is the launcher's
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        return (-1, 130)
    return failed


def _stop(procs: list[subprocess.Popen], grace: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, sig)
        deadline = time.monotonic() + wait
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)


# -- command line -------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `shardkit launch` flags."""
    parser.description = (
        "Run a command as N ranks of one multi-process JAX job on this machine (coordinator on "
        "127.0.0.1, free port). In the script, call shardkit.distributed.initialize() first. "
        "Example: shardkit launch -n 2 --devices-per-process 4 -- python train.py"
    )
    parser.add_argument(
        "-n", "--processes", type=at_least(1), required=True, help="number of ranks"
    )
    parser.add_argument(
        "--devices-per-process", type=at_least(1), default=None,
        help="simulated CPU devices per rank (sets XLA_FLAGS in each rank)",
    )  # fmt: skip
    parser.add_argument(
        "--port", type=port_number, default=None, help="coordinator port (default free)"
    )
    parser.add_argument(
        "--timeout", type=positive_seconds, default=None, help="stop all ranks after S s"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="keep gloo's per-rank connection lines"
    )
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command and its arguments")


def run(args: argparse.Namespace) -> int:
    """Runs `shardkit launch`."""
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if cmd and cmd[0] in ("python", "python3"):
        cmd[0] = sys.executable  # the interpreter shardkit runs in, with its packages
    return launch(
        cmd,
        processes=args.processes,
        devices_per_process=args.devices_per_process,
        port=args.port,
        timeout=args.timeout,
        verbose=args.verbose,
    )
