"""The grid runner, :func:`run_grid`: stored results first, then in-process or on Dask, outcomes in task order."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from osa_lab.errors import ConfigurationError
from osa_lab.studies.grid.cluster import run_on_dask
from osa_lab.studies.grid.local import ProgressBar, run_serial
from osa_lab.studies.grid.options import GridOptions, Task
from osa_lab.studies.grid.results import GridResult, TaskOutcome
from osa_lab.studies.grid.store import TaskStore


def run_grid(
    tasks: Iterable[Task],
    options: GridOptions | None = None,
    *,
    store: str | os.PathLike | None = None,
    desc: str = "grid",
) -> GridResult:
    """Run every task of a grid and gather the outcomes in task order.

    Args:
        tasks: the grid; keys must be unique.
        options: where to run (default: in-process, one torch thread per task).
        store: folder of finished results (``<key>.npz``, read without pickle): those are loaded
            instead of run, and each new result is written there as soon as it arrives. The folder is created with
            the first result, so a grid that fails before any task finishes (e.g. the scheduler
            cannot be reached) leaves no empty store behind.
        desc: label of the progress bar and of the Dask task names.

    Returns:
        :class:`GridResult`; failed tasks are in it (``status="failed"``), nothing is raised for
        them. Use :meth:`GridResult.warn_failures` or :meth:`GridResult.failure_lines`.

    Raises:
        ConfigurationError: duplicate task keys.
        SchedulerConnectionError: ``scheduler`` cannot be reached, or has no workers.
    """
    options = options or GridOptions.in_process()
    tasks = list(tasks)
    seen: dict[str, Task] = {}
    for t in tasks:
        if t.key in seen:
            raise ConfigurationError(
                f"two tasks of the grid have the same key {t.key!r} ({seen[t.key].label} and {t.label}); "
                "give each configuration once"
            )
        seen[t.key] = t
    task_store = TaskStore(Path(store) if store is not None else None)
    t_start = time.perf_counter()
    outcomes: list[TaskOutcome | None] = [None] * len(tasks)
    todo: list[int] = []
    for i, t in enumerate(tasks):
        ok, value = task_store.load(t)
        if ok:
            outcomes[i] = TaskOutcome(t, "ok", value, cached=True)
            continue
        todo.append(i)
    task_store.warn_pickles()
    mode, where = options.plan(len(todo))
    bar = ProgressBar(len(tasks), len(tasks) - len(todo), desc, options.progress)
    link = None
    try:
        if mode == "serial":
            run_serial(tasks, todo, outcomes, options, task_store, bar)
        else:
            link = run_on_dask(tasks, todo, outcomes, options, task_store, bar, mode, where, desc)
        bar.status(0)  # a grid of stored results only still shows its full bar
    finally:
        bar.close()
    result = GridResult([o for o in outcomes if o is not None], mode, link, time.perf_counter() - t_start)
    assert len(result.outcomes) == len(tasks)
    return result
