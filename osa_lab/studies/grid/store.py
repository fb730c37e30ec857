"""The folder of finished task results that makes a grid resumable (:class:`TaskStore`).

Each finished task's value is written as ``<key>.npz`` by :mod:`osa_lab.studies.result_store`
(NumPy arrays and one JSON record, read without pickle). A stored file that is damaged, of
another task or refused by :attr:`~osa_lab.studies.grid.options.Task.check` is not used, and a
pickle (``<key>.pkl``) is never loaded: the task runs again, with a
:class:`~osa_lab.errors.TaskStoreWarning` naming the file.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from osa_lab.errors import MalformedResultError, OutputWriteError, TaskStoreWarning, UnstorableResultError
from osa_lab.studies.grid.options import Task
from osa_lab.studies.grid.results import first_line
from osa_lab.studies.result_store import load_result, save_result

#: suffix of a stored result
STORE_SUFFIX = ".npz"
#: suffix of pickled results from earlier versions: never loaded (a pickle can run code)
PICKLE_SUFFIX = ".pkl"


class TaskStore:
    """The folder of finished results of one :func:`run_grid` call (``None``: nothing is stored)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.pickles: list[Path] = []
        self.writable = True

    def path(self, task: Task) -> Path | None:
        return None if self.folder is None else self.folder / f"{task.key}{STORE_SUFFIX}"

    def load(self, task: Task) -> tuple[bool, Any]:
        """``(True, value)`` for a usable stored result of ``task``, else ``(False, None)``."""
        path = self.path(task)
        if path is None:
            return False, None
        if not path.exists():
            legacy = path.with_suffix(PICKLE_SUFFIX)
            if legacy.exists():
                self.pickles.append(legacy)
            return False, None
        try:
            value = load_result(path, task.key)
        except MalformedResultError as err:
            warnings.warn(f"{first_line(str(err))}; computing task {task.label} again", TaskStoreWarning,
                          stacklevel=3)  # fmt: skip
            return False, None
        if task.check is not None:
            try:
                task.check(value)
            except Exception as err:  # noqa: BLE001 - a refused stored value is recomputed, whatever the check raised
                warnings.warn(
                    f"{path}: not a result of task {task.label} ({type(err).__name__}: {first_line(str(err))}); "
                    "computing it again",
                    TaskStoreWarning,
                    stacklevel=3,
                )
                return False, None
        return True, value

    def warn_pickles(self) -> None:
        if self.pickles:
            warnings.warn(
                f"{len(self.pickles)} stored result(s) in {self.folder} are pickles (e.g. {self.pickles[0].name}), "
                "which are never loaded because a pickle can run code; those tasks are computed again and stored "
                f"as {STORE_SUFFIX}",
                TaskStoreWarning,
                stacklevel=3,
            )

    def save(self, task: Task, value: Any) -> None:
        """Store ``value``; a value that cannot be stored or a failed write only warns (the grid goes on)."""
        path = self.path(task)
        if path is None or not self.writable:
            return
        try:
            save_result(path, value, task.key)
        except UnstorableResultError as err:
            warnings.warn(f"task {task.label}: its result is not stored ({first_line(str(err))}); a rerun "
                          "computes it again", TaskStoreWarning, stacklevel=3)  # fmt: skip
        except OutputWriteError as err:
            self.writable = False
            warnings.warn(f"{first_line(str(err))}; no further results of this grid are stored (a rerun "
                          "computes them again)", TaskStoreWarning, stacklevel=3)  # fmt: skip
