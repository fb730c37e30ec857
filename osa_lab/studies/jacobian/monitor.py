"""Progress and cancellation of long Jacobian computations.

:class:`JacobianProgress` is what a ``progress`` callback receives; :class:`SolveMonitor` checks
the ``should_stop`` hook on every Jacobian product (raising
:class:`~osa_lab.errors.ComputationCancelledError`) and calls ``progress`` at most every 0.2 s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from osa_lab.errors import ComputationCancelledError


@dataclass(frozen=True)
class JacobianProgress:
    """What a long Jacobian computation reports to its ``progress`` callback.

    ``task_index`` of ``tasks`` (layer × scope solves, or blocks of an exact profile) is under
    way; ``products`` of at most ``max_products`` Jacobian products (rows for the exact algorithm)
    of that task are done; ``estimate`` is the current σ_min estimate (NaN when none yet).
    """

    algorithm: str
    task: str
    task_index: int
    tasks: int
    products: int
    max_products: int
    estimate: float = math.nan

    @property
    def fraction(self) -> float:
        """Share of the whole call done, in [0, 1] (the product budget is an upper bound, so it
        is a lower estimate while a solve runs)."""
        inner = min(self.products / self.max_products, 1.0) if self.max_products > 0 else 0.0
        return min((self.task_index + inner) / max(self.tasks, 1), 1.0)


ProgressCallback = Callable[[JacobianProgress], None]
StopHook = Callable[[], bool]


class SolveMonitor:
    """Checks ``should_stop`` on every product and calls ``progress`` at most every 0.2 s."""

    def __init__(self, progress: ProgressCallback | None, should_stop: StopHook | None, algorithm: str,
                 tasks: int = 1, interval: float = 0.2) -> None:  # fmt: skip
        self.progress, self.should_stop, self.algorithm = progress, should_stop, algorithm
        self.tasks, self.interval = tasks, interval
        self.task, self.task_index, self.max_products, self.last, self.products = "", 0, 1, 0.0, 0

    def start(self, task: str, task_index: int, max_products: int) -> None:
        self.task, self.task_index, self.max_products = task, task_index, max(int(max_products), 1)
        self.check()
        self.report(0, force=True)

    def check(self) -> None:
        if self.should_stop is not None and self.should_stop():
            raise ComputationCancelledError(
                f"Jacobian computation cancelled by its should_stop hook during {self.task or 'setup'}"
            )

    def report(self, products: int, estimate: float = math.nan, force: bool = False) -> None:
        self.products = products
        if self.progress is None:
            return
        now = time.monotonic()
        if force or now - self.last >= self.interval:
            self.last = now
            self.progress(
                JacobianProgress(self.algorithm, self.task, self.task_index, self.tasks, products, self.max_products,
                                 estimate)
            )  # fmt: skip

    def tick(self, products: int, estimate: float = math.nan) -> None:
        self.check()
        self.report(products, estimate)
