"""Running tasks in this process: :func:`execute_task` (also what a Dask worker runs), the progress
bar and the in-process loop of :func:`~osa_lab.studies.grid.runner.run_grid`.

:func:`execute_task` sets the torch thread count for the task (in-process too, so results do not
depend on the placement) and turns an exception into text on the spot, so that errors whose
classes cannot be pickled still reach the client intact.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from osa_lab.studies.grid.options import Task
from osa_lab.studies.grid.results import TaskOutcome
from osa_lab.studies.grid.store import TaskStore


def _where() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return "in-process"


def execute_task(fn: Callable[..., Any], kwargs: Mapping[str, Any], threads: int | None) -> dict:
    """Run ``fn(**kwargs)`` with ``threads`` torch threads; never raises an ``Exception``.

    Returns ``{"ok": True, "value": …}`` or ``{"ok": False, "error_type", "error", "traceback"}``
    plus ``seconds`` and ``worker``. Exceptions are turned into text here, on the worker, so
    that errors whose classes cannot be pickled still reach the client intact.
    """
    import torch

    t0 = time.perf_counter()
    old = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        value = fn(**kwargs)
    except Exception as err:  # noqa: BLE001 - a failing task is a result of the grid
        return {
            "ok": False,
            "error_type": type(err).__name__,
            "error": str(err) or repr(err),
            "traceback": traceback.format_exc(),
            "seconds": time.perf_counter() - t0,
            "worker": _where(),
        }
    finally:
        if threads is not None:
            torch.set_num_threads(old)
    return {"ok": True, "value": value, "seconds": time.perf_counter() - t0, "worker": _where()}


class ProgressBar:
    """One tqdm bar over tasks; the postfix shows running and failed counts.

    The bar is drawn on the first :meth:`status` (or :meth:`show`), not when it is made: a grid
    that fails before its first task (e.g. an unreachable scheduler) prints no empty 0 % bar
    above its one-line error."""

    def __init__(self, total: int, initial: int, desc: str, enabled: bool) -> None:
        self.failed = 0
        self._args = {"total": total, "initial": initial, "desc": desc, "disable": not enabled}
        self.bar = None

    def show(self) -> None:
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(**self._args, unit="task", file=sys.stderr, dynamic_ncols=True)

    def status(self, running: int) -> None:
        self.show()
        self.bar.set_postfix_str(f"running={running} failed={self.failed}", refresh=True)

    def done(self, ok: bool, running: int) -> None:
        self.failed += not ok
        self.show()
        self.bar.update(1)
        self.status(running)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def outcome_from_payload(task: Task, payload: dict, attempts: int) -> TaskOutcome:
    """The :class:`TaskOutcome` of ``task`` from what :func:`execute_task` returned."""
    if payload["ok"]:
        return TaskOutcome(task, "ok", payload["value"], seconds=payload["seconds"], worker=payload["worker"],
                           attempts=attempts)  # fmt: skip
    return TaskOutcome(task, "failed", None, seconds=payload["seconds"], worker=payload["worker"], attempts=attempts,
                       error_type=payload["error_type"], error=payload["error"],
                       traceback=payload["traceback"])  # fmt: skip


def record_outcome(outcome: TaskOutcome, store: TaskStore) -> TaskOutcome:
    """Store the value of a successful ``outcome`` and return it."""
    if outcome.ok:
        store.save(outcome.task, outcome.value)
    return outcome


def run_serial(tasks, todo, outcomes, options, store, bar) -> None:
    """Run the tasks ``todo`` (indices into ``tasks``) one after the other in this process."""
    for n, i in enumerate(todo):
        task = tasks[i]
        kwargs = dict(task.kwargs)
        if task.progress_kwarg and options.progress:
            kwargs[task.progress_kwarg] = True
        bar.status(1)
        outcomes[i] = record_outcome(
            outcome_from_payload(task, execute_task(task.fn, kwargs, options.threads_per_worker), 1), store
        )
        bar.done(outcomes[i].ok, 1 if n + 1 < len(todo) else 0)
