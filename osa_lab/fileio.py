"""Output files that are whole or absent, and outputs owned by one process at a time.

* :func:`atomic_writer` (and :func:`atomic_write_bytes`, :func:`atomic_write_text`,
  :func:`atomic_to_csv`, :func:`write_all_or_nothing`): every file is written to a temporary
  with a unique name in the same folder and renamed over the target only once it is complete.
  A reader never sees half a file, two writers never share a temporary, and a failed write
  (a full disk, a read-only file system) leaves the earlier file untouched and no temporary
  behind; it raises :class:`~osa_lab.errors.OutputWriteError`, whose one-line message names
  the path.
* :class:`OutputLock`: exclusive ownership of an output through a lock file created with
  ``O_CREAT | O_EXCL`` that names the owner (PID, host, start time, command). A second writer
  gets :class:`~osa_lab.errors.RunLockedError` naming the owner; a lock left by a dead process
  on this host is taken over with a ``RuntimeWarning``; a lock from another host is never taken
  over.

Every byte goes through :func:`os.write` on the temporary's descriptor, so a test can inject a
write error (``ENOSPC``) by replacing ``os.write``. The descriptor's writer remembers the
``OSError`` it met, so a writer that wraps it in another exception (``torch.save`` turns it into
``RuntimeError: [enforce fail at inline_container.cc] . unexpected pos …``) still ends in the
one-line :class:`~osa_lab.errors.OutputWriteError` naming the path and the reason
(``No space left on device``, ``Read-only file system``).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import socket
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from osa_lab.errors import OutputPathError, OutputWriteError, RunLockedError

__all__ = [
    "OutputLock",
    "atomic_to_csv",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_writer",
    "write_all_or_nothing",
]


class _DescriptorWriter(io.RawIOBase):
    """A raw binary stream over a file descriptor that writes with :func:`os.write`."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd
        self.failure: OSError | None = None  # the first write error, even if a caller wraps it

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def seekable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        try:
            return os.write(self.fd, data)
        except OSError as exc:
            self.failure = self.failure or exc
            raise

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return os.lseek(self.fd, offset, whence)

    def tell(self) -> int:
        return os.lseek(self.fd, 0, io.SEEK_CUR)

    def close(self) -> None:
        if not self.closed:
            try:
                os.close(self.fd)
            finally:
                super().close()


#: errors of a location that cannot be written at all (as opposed to a full one)
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def _write_error(path: Path, exc: OSError, action: str = "write") -> OutputWriteError:
    reason = exc.strerror or str(exc) or type(exc).__name__
    fix = ("the location is read-only: choose a writable location" if exc.errno in _READ_ONLY
           else "free some space or choose another location")  # fmt: skip
    return OutputWriteError(
        f"cannot {action} {path} ({reason}); nothing was written there (an earlier file is kept): {fix}"
    )


def _missing_folders(path: Path) -> list[Path]:
    """The folders above ``path`` that do not exist yet, deepest first."""
    missing = []
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            break
        missing.append(parent)
    return missing


def _remove_empty(folders: Sequence[Path]) -> None:
    """Remove the folders a failed write created (deepest first), if they are still empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def _temporary(path: Path) -> tuple[int, Path]:
    """A new, uniquely named temporary file beside ``path`` (folders created)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
            try:  # mode 0o666 minus the umask, as a plain open() would give the file
                return os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666), tmp
            except FileExistsError:
                continue
        raise FileExistsError(f"no free temporary name beside {path}")
    except OSError as exc:
        raise _write_error(path, exc, "create") from None


@contextlib.contextmanager
def _temporary_stream(path: Path, text: bool, encoding: str, newline: str | None) -> Iterator[tuple[IO, Path]]:
    """A stream to a fresh temporary beside ``path``, flushed and closed on exit; the temporary
    is removed (and :class:`OutputWriteError` raised for an ``OSError``) when the block fails."""
    created = _missing_folders(path)
    try:
        fd, tmp = _temporary(path)
    except OutputWriteError:
        _remove_empty(created)
        raise
    raw = _DescriptorWriter(fd)
    try:
        buffered = io.BufferedWriter(raw)
        stream: IO = io.TextIOWrapper(buffered, encoding=encoding, newline=newline) if text else buffered
        try:
            yield stream, tmp
            stream.flush()
            os.fsync(fd)
        finally:
            with contextlib.suppress(OSError, ValueError):  # the error that matters is already raised
                stream.close()
            if not raw.closed:
                with contextlib.suppress(OSError):
                    raw.close()
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        _remove_empty(created)
        raise _write_error(path, exc) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        _remove_empty(created)
        if raw.failure is not None:  # a write error that the writing code wrapped (torch.save: RuntimeError)
            raise _write_error(path, raw.failure) from None
        raise


@contextlib.contextmanager
def atomic_writer(
    path: str | os.PathLike, mode: str = "w", *, encoding: str = "utf-8", newline: str | None = None
) -> Iterator[IO]:
    """Open a unique temporary beside ``path`` for writing; rename it over ``path`` on success.

    ``mode`` is ``"w"`` (text) or ``"wb"`` (bytes). On an exception inside the block, or a
    failed write or flush, the temporary is removed and ``path`` keeps its earlier content; an
    ``OSError`` becomes :class:`~osa_lab.errors.OutputWriteError` naming ``path``.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_writer mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    with _temporary_stream(path, mode == "w", encoding, newline) as (stream, tmp):
        yield stream
    _rename_into_place([(tmp, path)])


def _rename_into_place(pairs: Sequence[tuple[Path, Path]]) -> None:
    try:
        for tmp, path in pairs:
            os.replace(tmp, path)
    except OSError as exc:
        for tmp, _ in pairs:
            tmp.unlink(missing_ok=True)
        raise _write_error(path, exc, "rename a temporary file onto") from None


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_writer`); returns the path."""
    with atomic_writer(path, "wb") as fh:
        fh.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_writer`); returns the path."""
    with atomic_writer(path, "w", encoding=encoding) as fh:
        fh.write(text)
    return Path(path)


def atomic_to_csv(df: Any, path: str | os.PathLike, **to_csv_kwargs: Any) -> Path:
    """``df.to_csv(path, index=False, **to_csv_kwargs)`` written atomically; returns the path."""
    to_csv_kwargs.setdefault("index", False)
    with atomic_writer(path, "w", newline="") as fh:
        df.to_csv(fh, **to_csv_kwargs)
    return Path(path)


def write_all_or_nothing(writes: Sequence[tuple[str | os.PathLike, Callable[[IO], object], str]]) -> list[Path]:
    """Write several files so that either all of them are replaced or none is.

    ``writes`` are ``(path, write, mode)``: ``write(stream)`` fills a temporary opened with
    ``mode`` (``"w"`` or ``"wb"``). Every temporary is written first; only when all are complete
    are they renamed into place. On any failure every temporary is removed and the targets keep
    their earlier content (:class:`~osa_lab.errors.OutputWriteError` names the failing path).
    """
    done: list[tuple[Path, Path]] = []
    created = sorted({f for target, _, _ in writes for f in _missing_folders(Path(target))},
                     key=lambda f: len(f.parts), reverse=True)  # fmt: skip
    try:
        for target, write, mode in writes:
            path = Path(target)
            text = mode == "w"
            with _temporary_stream(path, text, "utf-8", "" if text else None) as (stream, tmp):
                done.append((tmp, path))
                write(stream)
    except BaseException:
        for tmp, _ in done:
            tmp.unlink(missing_ok=True)
        for folder in created:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    _rename_into_place(done)
    return [path for _, path in done]


# --------------------------------------------------------------------------------------------
# ownership of an output
# --------------------------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """True if a process with ``pid`` runs on this host (or may: one we may not signal)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


class OutputLock:
    """Exclusive ownership of an output through the lock file ``path`` (a context manager).

    Use :meth:`for_file` (``results.csv`` → ``results.csv.lock``) or :meth:`for_folder`
    (``folder/run.lock``). ``what`` names the output in the messages (``"--output results.csv"``).
    """

    def __init__(self, path: str | os.PathLike, what: str | None = None, instead: str = "another output") -> None:
        self.path = Path(path)
        self.what = what or str(self.path)
        self.instead = instead  # what the message suggests choosing instead
        self.owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": " ".join(sys.argv),
        }
        self.held = False

    @classmethod
    def for_file(cls, path: str | os.PathLike, what: str | None = None) -> OutputLock:
        """The lock of the output file ``path``: ``<path>.lock`` beside it."""
        path = Path(path)
        return cls(path.with_name(f"{path.name}.lock"), what or str(path))

    @classmethod
    def for_folder(cls, folder: str | os.PathLike, what: str | None = None, name: str = "run.lock") -> OutputLock:
        """The lock of the output folder ``folder``: ``folder/run.lock``."""
        return cls(Path(folder) / name, what or str(folder))

    def _read(self) -> dict | None:
        try:
            info = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) else None

    def acquire(self) -> OutputLock:
        """Take the lock or raise :class:`~osa_lab.errors.RunLockedError` naming its owner."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputPathError(
                f"cannot create the folder of {self.what} ({exc.strerror or exc}); choose another location"
            ) from None
        for _ in range(50):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                info = self._read()
                if info is None:  # being written right now, or garbage: look again shortly
                    time.sleep(0.05)
                    info = self._read() or {"pid": None, "host": self.owner["host"]}
                pid, host = info.get("pid"), info.get("host")
                same_host = host == self.owner["host"]
                if same_host and (not isinstance(pid, int) or not pid_alive(pid)):
                    warnings.warn(
                        f"taking over the stale lock {self.path} of process {pid} on {host} (no longer running)",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                    with contextlib.suppress(FileNotFoundError):
                        self.path.unlink()
                    continue
                raise RunLockedError(
                    f"{self.what} is in use by process {pid} on host {host} (started {info.get('started', '?')}: "
                    f"{info.get('command', '?')}); wait for it to finish or choose {self.instead}"
                    + ("" if same_host else f" (if that process is gone, delete {self.path})")
                ) from None
            except OSError as exc:  # read-only or special file system: a user error, not a crash
                raise OutputPathError(
                    f"cannot create the lock file {self.path} ({exc.strerror or exc}); choose a writable location"
                ) from None
            try:
                os.write(fd, json.dumps(self.owner).encode())
            except OSError as exc:
                os.close(fd)
                self.path.unlink(missing_ok=True)
                raise _write_error(self.path, exc) from None
            os.close(fd)
            self.held = True
            return self
        raise RunLockedError(f"could not take the lock {self.path}; another process keeps replacing it")

    def release(self) -> None:
        """Remove the lock file if this process still owns it."""
        if self.held:
            info = self._read()
            if info is not None and info.get("pid") == self.owner["pid"] and info.get("host") == self.owner["host"]:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
            self.held = False

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def output_locks(locks: Sequence[OutputLock]) -> Iterator[list[OutputLock]]:
    """Hold every lock of ``locks`` (taken in path order) for the block; all or none are taken."""
    held: list[OutputLock] = []
    try:
        for lock in sorted({lk.path.resolve(): lk for lk in locks}.values(), key=lambda lk: str(lk.path)):
            held.append(lock.acquire())
        yield held
    finally:
        for lock in reversed(held):
            lock.release()
