"""Tasks and where they run: :class:`Task`, :class:`GridOptions` and the grid arguments of a sub-command.

A :class:`Task` is one independent unit of a grid, keyed by its settings (:func:`task_key`);
:class:`GridOptions` says where the grid runs (in-process, an embedded local Dask cluster, or an
existing scheduler, :meth:`GridOptions.plan`); :func:`add_grid_arguments` and
:func:`options_from_args` are the command line's ``--workers``, ``--threads-per-worker``,
``--scheduler``, ``--serial`` and ``--cluster-host``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from osa_lab.errors import ConfigurationError

#: environment variable naming an existing scheduler (the ``dask`` convention)
ENV_SCHEDULER = "DASK_SCHEDULER_ADDRESS"

#: address the embedded local cluster listens on unless told otherwise (loopback only)
LOCAL_HOST = "127.0.0.1"


def task_key(prefix: str, settings: Mapping[str, Any]) -> str:
    """A stable key from ``settings``: ``<prefix>-<24 hex digits of SHA-256 of the sorted JSON>``."""
    blob = json.dumps(dict(settings), sort_keys=True, default=str)
    return f"{prefix}-{hashlib.sha256(blob.encode()).hexdigest()[:24]}"


@dataclass(frozen=True)
class Task:
    """One independent unit of a grid.

    Attributes:
        fn: a module-level (importable, picklable) function, called as ``fn(**kwargs)``.
        kwargs: its keyword arguments (picklable).
        settings: what identifies the task in tables and messages (preset, N, d, seed …).
        key: unique within the grid and stable across runs (the store file name); default
            :func:`task_key` of ``fn``'s name and ``settings``.
        progress_kwarg: name of a boolean keyword of ``fn`` that switches its own progress bar
            on; it is set to True only in-process with progress on (a cluster shows the one
            grid bar).
        check: a module-level function that raises ``TypeError``/``ValueError`` for a value
            that is not a result of ``fn`` (e.g. not a pair of tables); a stored result it
            refuses is computed again. ``None``: any stored value is accepted.
    """

    fn: Callable[..., Any]
    kwargs: Mapping[str, Any]
    settings: Mapping[str, Any]
    key: str = ""
    progress_kwarg: str | None = None
    check: Callable[[Any], None] | None = None

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ConfigurationError(f"Task.fn must be callable, got {type(self.fn).__name__}")
        if not self.key:
            object.__setattr__(self, "key", task_key(getattr(self.fn, "__name__", "task"), self.settings))
        if "/" in self.key or os.sep in self.key:
            raise ConfigurationError(f"Task.key {self.key!r} must not contain a path separator")

    @property
    def label(self) -> str:
        """``preset=pure-osa tokens=16 seed=0``: the settings as one short line."""
        return " ".join(f"{k}={_fmt(v)}" for k, v in self.settings.items())


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "None" if math.isnan(v) else f"{v:g}"
    return str(v)


def cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class GridOptions:
    """Where and how a grid runs.

    Attributes:
        workers: worker processes of the embedded local cluster (``None``: one per core, or the
            ``DASK_SCHEDULER_ADDRESS`` cluster when that is set); ``1`` runs in-process.
        threads_per_worker: torch intra-op threads of each task (``torch.set_num_threads``),
            in-process too, so results do not depend on the placement; ``None`` leaves the
            thread count alone (in-process only). Dask itself runs one task at a time per worker.
        scheduler: address of an existing scheduler (``tcp://host:8786``).
        serial: run in-process, one task after the other (the same as ``workers=1``); giving
            it together with ``scheduler`` is an error.
        progress: show the tqdm bar over tasks.
        dashboard_address: where the local cluster serves its dashboard (``":8787"``: that port
            on ``host``; ``None``: off).
        connect_timeout: seconds to wait for an external scheduler and its first worker.
        timeout: give up on tasks still unfinished after this many seconds (recorded as
            failed with ``GridTimeout``; ``None``: wait forever).
        host: the address the local cluster's scheduler, workers and dashboard listen on
            (default ``127.0.0.1``: this machine only; ``"0.0.0.0"`` for every interface).
    """

    workers: int | None = None
    threads_per_worker: int | None = 1
    scheduler: str | None = None
    serial: bool = False
    progress: bool = True
    dashboard_address: str | None = ":8787"
    connect_timeout: float = 30.0
    timeout: float | None = None
    host: str = LOCAL_HOST

    def __post_init__(self) -> None:
        for name in ("workers", "threads_per_worker"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ConfigurationError(f"`{name}` must be an int ≥ 1 (or None), got {v!r}")
        if self.scheduler is not None and (not isinstance(self.scheduler, str) or not self.scheduler.strip()):
            raise ConfigurationError(
                f"`scheduler` must be an address like tcp://host:8786, got {self.scheduler!r}"
            )
        if self.scheduler and (self.serial or self.workers is not None):
            raise ConfigurationError(
                "give either a scheduler address (--scheduler) or a local size (--workers N / --serial), not both"
            )
        if not isinstance(self.host, str) or not self.host.strip() or "://" in self.host:
            raise ConfigurationError(
                f"`host` must be an interface address such as 127.0.0.1 or 0.0.0.0, got {self.host!r}"
            )
        if self.timeout is not None and not (self.timeout > 0):
            raise ConfigurationError(f"`timeout` must be a positive number of seconds, got {self.timeout!r}")

    @classmethod
    def in_process(cls, *, threads: int | None = 1, progress: bool = True) -> GridOptions:
        """Run in this process (the default of the Python API)."""
        return cls(serial=True, threads_per_worker=threads, progress=progress)

    def plan(self, n_tasks: int) -> tuple[str, int | str]:
        """``("serial", 1)``, ``("local", n_workers)`` or ``("remote", address)`` for ``n_tasks`` tasks."""
        if self.serial or self.workers == 1 or n_tasks == 0:
            return "serial", 1
        address = self.scheduler or (os.environ.get(ENV_SCHEDULER) if self.workers is None else None)
        if address:
            return "remote", address
        n = min(self.workers or cpu_count(), n_tasks)
        return ("serial", 1) if n <= 1 else ("local", n)


def add_grid_arguments(parser: argparse.ArgumentParser) -> None:
    """The grid options of a sub-command: ``--workers``, ``--threads-per-worker``, ``--scheduler``, ``--serial``."""
    g = parser.add_argument_group(
        "grid (Dask)",
        "each configuration is an independent task; finished tasks are stored and skipped on a rerun",
    )
    g.add_argument("--workers", type=_positive_int, default=None, metavar="N",
                   help="worker processes of the local Dask cluster (default: one per core; 1 = in-process)")  # fmt: skip
    g.add_argument("--threads-per-worker", type=_positive_int, default=1, metavar="T",
                   help="torch threads per task (default 1; also in-process, so results match)")  # fmt: skip
    g.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help=f"run on an existing Dask cluster, e.g. tcp://host:8786 (default: ${ENV_SCHEDULER} if set)")  # fmt: skip
    g.add_argument(
        "--serial", action="store_true", help="run every task in this process (same as --workers 1)"
    )
    g.add_argument("--cluster-host", default=LOCAL_HOST, metavar="ADDRESS",
                   help=f"address the local cluster's scheduler, workers and dashboard listen on (default "
                   f"{LOCAL_HOST}: this machine only; 0.0.0.0: every interface)")  # fmt: skip


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def options_from_args(args: argparse.Namespace, *, progress: bool = True) -> GridOptions:
    """The :class:`GridOptions` of parsed :func:`add_grid_arguments` arguments."""
    return GridOptions(
        workers=1 if getattr(args, "serial", False) else getattr(args, "workers", None),
        threads_per_worker=getattr(args, "threads_per_worker", 1),
        scheduler=getattr(args, "scheduler", None),
        progress=progress,
        host=getattr(args, "cluster_host", LOCAL_HOST),
    )
