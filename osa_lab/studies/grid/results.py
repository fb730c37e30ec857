"""What a grid returns: one :class:`TaskOutcome` per task and the :class:`GridResult` of them all.

:meth:`GridResult.table` lists every task with its settings and status (:data:`STATUS_COLUMNS`);
:func:`summary_lines` and :meth:`GridResult.failure_lines` are the lines a command prints at its
end. :data:`SCHEDULER_LOST` is the ``error_type`` of a task whose scheduler went away.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from osa_lab.errors import GridTaskFailedWarning
from osa_lab.studies.grid.options import Task

#: columns of :meth:`GridResult.table` after the settings columns
STATUS_COLUMNS = ("key", "status", "cached", "attempts", "seconds", "worker", "error_type", "error")

#: ``error_type`` of a task whose scheduler went away before it finished
SCHEDULER_LOST = "SchedulerLost"


@dataclass
class TaskOutcome:
    """What became of one task: ``status`` is ``"ok"`` or ``"failed"``; ``value`` its return value."""

    task: Task
    status: str
    value: Any = None
    cached: bool = False
    seconds: float = math.nan
    worker: str = ""
    attempts: int = 0
    error_type: str = ""
    error: str = ""
    traceback: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class GridResult:
    """The outcomes of :func:`run_grid`, in task order (never completion order)."""

    outcomes: list[TaskOutcome]
    mode: str = "serial"
    dashboard_link: str | None = None
    wall_seconds: float = math.nan
    extra: dict = field(default_factory=dict)

    @property
    def failed(self) -> list[TaskOutcome]:
        return [o for o in self.outcomes if not o.ok]

    def values(self) -> list[Any]:
        """Return values of the successful tasks, in task order."""
        return [o.value for o in self.outcomes if o.ok]

    def table(self) -> pd.DataFrame:
        """One row per task: its settings, then :data:`STATUS_COLUMNS`."""
        rows = []
        for o in self.outcomes:
            rows.append(
                {
                    **dict(o.task.settings),
                    "key": o.task.key,
                    "status": o.status,
                    "cached": o.cached,
                    "attempts": o.attempts,
                    "seconds": o.seconds,
                    "worker": o.worker,
                    "error_type": o.error_type,
                    "error": o.error,
                }
            )
        return pd.DataFrame(rows)

    def failure_lines(self) -> list[str]:
        """``<settings>: <ErrorType>: <first line of the message>`` per failed task."""
        return [f"{o.task.label}: {o.error_type}: {first_line(o.error)}" for o in self.failed]

    def warn_failures(self, what: str = "grid", stacklevel: int = 3) -> None:
        """Issue one :class:`GridTaskFailedWarning` naming the failed tasks (none if all succeeded)."""
        if self.failed:
            warnings.warn(
                f"{what}: {len(self.failed)} of {len(self.outcomes)} tasks failed (the others finished): "
                + "; ".join(self.failure_lines()),
                GridTaskFailedWarning,
                stacklevel=stacklevel,
            )


def first_line(text: str, limit: int = 300) -> str:
    """The first line of ``text``, cut to ``limit`` characters (for one-line messages)."""
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def summary_lines(result: GridResult, what: str) -> list[str]:
    """Lines for the end of a command: counts, then one line per failed task."""
    n, bad = len(result.outcomes), len(result.failed)
    cached = sum(o.cached for o in result.outcomes)
    head = f"{what}: {n - bad} of {n} tasks finished ({cached} from earlier runs)"
    if not bad:
        return [head]
    return [f"{head}; {bad} failed:"] + [f"  {line}" for line in result.failure_lines()]
