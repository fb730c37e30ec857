"""Exclusive ownership of a run folder: a lock file naming its owner, stale locks taken over."""

from __future__ import annotations

import os
from pathlib import Path

from osa_lab.errors import OutputPathError
from osa_lab.fileio import OutputLock

#: the lock file that makes a run folder owned by one process (JSON: pid, host, started, command)
LOCK_NAME = "run.lock"


class RunLock(OutputLock):
    """Exclusive ownership of a run folder through ``folder/run.lock`` (a context manager).

    :class:`osa_lab.fileio.OutputLock` on the folder: the lock file names the owner (PID, host,
    start time, command); a second writer gets :class:`~osa_lab.errors.RunLockedError` naming
    it; a lock left by a dead process on this host is taken over with a ``RuntimeWarning``; a
    lock from another host is never taken over.
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        super().__init__(self.folder / LOCK_NAME, f"output folder {self.folder}", instead="another --output")

    def acquire(self) -> RunLock:
        """Create the run folder (an :class:`~osa_lab.errors.OutputPathError` if that fails), then lock it."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputPathError(
                f"cannot create output folder {self.folder} ({exc.strerror or exc}); choose another --output"
            ) from None
        super().acquire()
        return self


def check_output_dir(path: str | os.PathLike, flag: str = "--output") -> Path:
    """``path`` as a ``Path`` after checking a run folder can be made there, before any work starts.

    Raises :class:`~osa_lab.errors.OutputPathError` when ``path`` is a file, when an existing
    parent is a file, or when no file can be created in the nearest existing parent. Uses the
    CLI's real write probe (:func:`osa_lab.arguments.check_output_dir`): ``os.access`` is wrong for
    root, read-only or special file systems (``/proc``) and ACLs. Creates nothing.
    """
    from osa_lab.arguments import check_output_dir as _check_dir

    return _check_dir(path, flag)
