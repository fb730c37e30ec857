"""Exclusive ownership of a run folder: a lock file naming its owner, stale locks taken over."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import warnings
from pathlib import Path

from osa_lab.errors import (
    OutputPathError,
    RunLockedError,
)

#: the lock file that makes a run folder owned by one process (JSON: pid, host, started, command)
LOCK_NAME = "run.lock"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


class RunLock:
    """Exclusive ownership of a run folder through ``folder/run.lock`` (a context manager).

    The lock file is created atomically (``O_CREAT | O_EXCL``) and names the owner (PID, host,
    start time, command). A second writer gets :class:`~osa_lab.errors.RunLockedError` naming
    the owner. A lock left by a dead process on this host is stale: it is taken over with a
    ``RuntimeWarning``. A lock from another host cannot be checked and is never taken over.
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": " ".join(sys.argv),
        }
        self.held = False

    def _read(self) -> dict | None:
        try:
            info = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) else None

    def acquire(self) -> RunLock:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputPathError(
                f"cannot create output folder {self.folder} ({exc.strerror or exc}); choose another --output"
            ) from None
        for _ in range(50):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                info = self._read()
                if info is None:  # being written right now, or garbage: look again shortly
                    time.sleep(0.05)
                    info = self._read()
                    if info is None:
                        info = {"pid": None, "host": self.owner["host"]}
                pid, host = info.get("pid"), info.get("host")
                same_host = host == self.owner["host"]
                if same_host and (not isinstance(pid, int) or not _pid_alive(pid)):
                    warnings.warn(
                        f"taking over the stale lock {self.path} of process {pid} on {host} (no longer running)",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                    with contextlib.suppress(FileNotFoundError):
                        self.path.unlink()
                    continue
                raise RunLockedError(
                    f"output folder {self.folder} is in use by process {pid} on host {host} "
                    f"(started {info.get('started', '?')}: {info.get('command', '?')}); wait for it to finish "
                    f"or choose another --output" + ("" if same_host else f" (if that process is gone, delete {self.path})")
                ) from None
            except OSError as exc:  # read-only or special file system: a user error, not a crash
                raise OutputPathError(
                    f"cannot create {self.path} ({exc.strerror or exc}); choose a writable --output"
                ) from None
            with os.fdopen(fd, "w") as fh:
                json.dump(self.owner, fh)
            self.held = True
            return self
        raise RunLockedError(f"could not take the lock {self.path}; another process keeps replacing it")

    def release(self) -> None:
        if self.held:
            info = self._read()
            if info is not None and info.get("pid") == self.owner["pid"] and info.get("host") == self.owner["host"]:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
            self.held = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def check_output_dir(path: str | os.PathLike) -> Path:
    """``path`` as a ``Path`` after checking a run folder can be made there, before any work starts.

    Raises :class:`~osa_lab.errors.OutputPathError` when ``path`` is a file, when an existing
    parent is a file, or when no file can be created in the nearest existing parent. Uses the
    CLI's real write probe (:func:`osa_lab.arguments.check_output_dir`): ``os.access`` is wrong for
    root, read-only or special file systems (``/proc``) and ACLs. Creates nothing.
    """
    from osa_lab.arguments import check_output_dir as _check_dir

    return _check_dir(path, "--output")
