"""One run per folder: a lock file naming its owner's host and process.

`RunLock(folder)` creates `<folder>.lock` (with `name`: `<folder>/<name>`) atomically
(`O_CREAT | O_EXCL`) with the owner's host, pid and start time. A second run on the same
folder is refused with the owner named; a lock left by a process that no longer runs on this
host is stale and taken over (said so). A lock from another host cannot be checked from
here: the message says how to remove it by hand.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import time

from shardkit.errors import ShardkitError

__all__ = ["RunLock", "RunLockedError"]


class RunLockedError(ShardkitError, RuntimeError):
    """Another live run holds the checkpoint folder."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


class RunLock:
    """A lock on `folder` held from `acquire()` to `release()` (or the `with` block).

    Args:
        folder: the folder to guard (the lock file is its sibling `<folder>.lock`).
        name: the lock file's name inside `folder` instead (`shardkit train` locks its
            `--out` with `<out>/run.lock` when the checkpoints are elsewhere).

    Attributes:
        stale: the owner of a stale lock that was taken over ("host pid"), else None.

    Raises:
        RunLockedError: from `acquire`, when a live process (or one on another host) holds it.

    Example:
        >>> with RunLock("runs/a/checkpoints"):       # doctest: +SKIP
        ...     train()
    """

    def __init__(self, folder: str | pathlib.Path, *, name: str | None = None):
        folder = pathlib.Path(folder).absolute()
        self.folder = folder
        self.path = folder / name if name else folder.parent / f"{folder.name}.lock"
        self.stale: str | None = None
        self._held = False

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        for _ in range(2):
            if self._create(json.dumps(me)):
                self._held = True
                return self
            self._check_owner(me["host"])  # stale: removed, try again
        raise RunLockedError(f"could not take the lock {self.path}; fix: run again.")

    def _create(self, owner: str) -> bool:
        """Creates the lock file with `owner` in it, or returns False when it exists.

        The owner is written to a private file first and hard-linked into place, so the lock
        never exists empty (another run would take an empty one for stale); where the file
        system has no hard links, it is created exclusively and then written.
        """
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(owner)
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError:  # no hard links on this file system
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                f.write(owner)
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def _check_owner(self, host: str) -> None:
        try:
            owner = json.loads(self.path.read_text())
            who, pid = str(owner["host"]), int(owner["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            self.stale = "unreadable lock file"
            self.path.unlink(missing_ok=True)
            return
        if who == host and not _alive(pid):
            self.stale = f"{who} pid {pid}"
            self.path.unlink(missing_ok=True)
            return
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner.get("started", 0)))
        where = "this host" if who == host else f"host {who}"
        raise RunLockedError(
            f"{self.folder} is in use by pid {pid} on {where} since {since} "
            f"(lock file {self.path}); fix: wait for that run, use another --out, or delete "
            f"{self.path} if that run is gone."
        )

    def release(self) -> None:
        if self._held:
            self.path.unlink(missing_ok=True)
            self._held = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
