"""Experiment grids on Dask: one runner for sweeps, Jacobian studies and training comparisons.

A study here is a grid (presets × depths × N × d × α × seeds for the signal-propagation sweeps
and Jacobian κ; presets × learning rates × seeds for training). :func:`run_grid` turns such a
grid into independent :class:`Task` objects, each keyed by its settings, and runs them

* **in-process** (``GridOptions(serial=True)`` / ``workers=1``; ``--serial`` / ``--workers 1``):
  one after the other in this process, for debuggers and notebooks on a laptop;
* on an embedded :class:`dask.distributed.LocalCluster` (the command-line default): one worker
  process per core, one task at a time per worker, ``threads_per_worker`` torch threads each;
* on an **existing Dask cluster** (``scheduler="tcp://host:8786"``, ``--scheduler``, or the
  ``DASK_SCHEDULER_ADDRESS`` environment variable when neither ``--workers`` nor ``--serial``
  is given), started with ``dask scheduler`` / ``dask worker`` or dask-jobqueue.

Guarantees
----------
* **Same numbers whatever the placement.** Every task sets ``torch.set_num_threads`` to
  ``threads_per_worker`` while it runs (in-process too), seeds everything from its settings,
  and the results come back in task order, so ``--workers 1`` and ``--workers N`` give
  bit-identical tables on CPU.
* **Resumable.** With a ``store`` folder, each finished task's result is written there as
  ``<key>.npz`` as soon as it arrives (:mod:`osa_lab.studies.result_store`: NumPy arrays and one
  JSON record, read without pickle, so a stored file never runs code); a rerun loads those and
  runs only the rest, so an interrupted grid resumes where it stopped. Failed tasks are not
  stored (a rerun retries them). A stored file that is damaged, of another task, of the wrong
  kind (:attr:`Task.check`) or a pickle (``<key>.pkl``) is not used: the task runs again, with a
  :class:`~osa_lab.errors.TaskStoreWarning` naming the file.
* **Failures are results.** A task that raises is recorded (settings, error type, message,
  traceback) and the rest of the grid finishes; :meth:`GridResult.table` lists every task with
  its status. A task whose worker dies is retried once (the local cluster's scheduler runs
  with ``allowed-failures = 1``; an external scheduler uses its own
  ``distributed.scheduler.allowed-failures``, 3 by default); a second loss is a failure.
* **One progress bar** over tasks (finished / running / failed), and the Dask dashboard link
  printed (stderr) when a cluster is used.
* **Local services stay local.** The embedded cluster's scheduler, workers and dashboard listen
  on 127.0.0.1 only, unless ``GridOptions(host=…)`` (``--cluster-host``) says otherwise.
* **A lost scheduler is named.** When the scheduler of a cluster goes away mid-grid, the tasks
  it had not finished are recorded as failed with ``SchedulerLost`` (and finished ones stay
  stored, so a rerun resumes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import sys
import time
import traceback
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from osa_lab.errors import (
    ConfigurationError,
    GridTaskFailedWarning,
    MalformedResultError,
    OutputWriteError,
    SchedulerConnectionError,
    TaskStoreWarning,
    UnstorableResultError,
)
from osa_lab.studies.result_store import load_result, save_result

#: environment variable naming an existing scheduler (the ``dask`` convention)
ENV_SCHEDULER = "DASK_SCHEDULER_ADDRESS"

#: columns of :meth:`GridResult.table` after the settings columns
STATUS_COLUMNS = ("key", "status", "cached", "attempts", "seconds", "worker", "error_type", "error")

_STORE_SUFFIX = ".npz"
#: suffix of pickled results from earlier versions: never loaded (a pickle can run code)
_PICKLE_SUFFIX = ".pkl"

#: address the embedded local cluster listens on unless told otherwise (loopback only)
LOCAL_HOST = "127.0.0.1"


# --------------------------------------------------------------------------------------
# Tasks and options
# --------------------------------------------------------------------------------------


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


def _cpu_count() -> int:
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
            raise ConfigurationError(f"`scheduler` must be an address like tcp://host:8786, got {self.scheduler!r}")
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
        n = min(self.workers or _cpu_count(), n_tasks)
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
    g.add_argument("--serial", action="store_true", help="run every task in this process (same as --workers 1)")
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


# --------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------


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
        return [f"{o.task.label}: {o.error_type}: {_first_line(o.error)}" for o in self.failed]

    def warn_failures(self, what: str = "grid", stacklevel: int = 3) -> None:
        """Issue one :class:`GridTaskFailedWarning` naming the failed tasks (none if all succeeded)."""
        if self.failed:
            warnings.warn(
                f"{what}: {len(self.failed)} of {len(self.outcomes)} tasks failed (the others finished): "
                + "; ".join(self.failure_lines()),
                GridTaskFailedWarning,
                stacklevel=stacklevel,
            )


def _first_line(text: str, limit: int = 300) -> str:
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


# --------------------------------------------------------------------------------------
# Execution of one task (in-process or on a worker)
# --------------------------------------------------------------------------------------


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


class _Store:
    """The folder of finished results of one :func:`run_grid` call (``None``: nothing is stored)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.pickles: list[Path] = []
        self.writable = True

    def path(self, task: Task) -> Path | None:
        return None if self.folder is None else self.folder / f"{task.key}{_STORE_SUFFIX}"

    def load(self, task: Task) -> tuple[bool, Any]:
        """``(True, value)`` for a usable stored result of ``task``, else ``(False, None)``."""
        path = self.path(task)
        if path is None:
            return False, None
        if not path.exists():
            legacy = path.with_suffix(_PICKLE_SUFFIX)
            if legacy.exists():
                self.pickles.append(legacy)
            return False, None
        try:
            value = load_result(path, task.key)
        except MalformedResultError as err:
            warnings.warn(f"{_first_line(str(err))}; computing task {task.label} again", TaskStoreWarning,
                          stacklevel=3)  # fmt: skip
            return False, None
        if task.check is not None:
            try:
                task.check(value)
            except Exception as err:  # noqa: BLE001 - a refused stored value is recomputed, whatever the check raised
                warnings.warn(
                    f"{path}: not a result of task {task.label} ({type(err).__name__}: {_first_line(str(err))}); "
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
                f"as {_STORE_SUFFIX}",
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
            warnings.warn(f"task {task.label}: its result is not stored ({_first_line(str(err))}); a rerun "
                          "computes it again", TaskStoreWarning, stacklevel=3)  # fmt: skip
        except OutputWriteError as err:
            self.writable = False
            warnings.warn(f"{_first_line(str(err))}; no further results of this grid are stored (a rerun "
                          "computes them again)", TaskStoreWarning, stacklevel=3)  # fmt: skip


# --------------------------------------------------------------------------------------
# Progress bar
# --------------------------------------------------------------------------------------


class _Bar:
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


# --------------------------------------------------------------------------------------
# The runner
# --------------------------------------------------------------------------------------


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
    task_store = _Store(Path(store) if store is not None else None)
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
    bar = _Bar(len(tasks), len(tasks) - len(todo), desc, options.progress)
    link = None
    try:
        if mode == "serial":
            _run_serial(tasks, todo, outcomes, options, task_store, bar)
        else:
            link = _run_dask(tasks, todo, outcomes, options, task_store, bar, mode, where, desc)
        bar.status(0)  # a grid of stored results only still shows its full bar
    finally:
        bar.close()
    result = GridResult([o for o in outcomes if o is not None], mode, link, time.perf_counter() - t_start)
    assert len(result.outcomes) == len(tasks)
    return result


def _outcome(task: Task, payload: dict, attempts: int) -> TaskOutcome:
    if payload["ok"]:
        return TaskOutcome(task, "ok", payload["value"], seconds=payload["seconds"], worker=payload["worker"],
                           attempts=attempts)  # fmt: skip
    return TaskOutcome(task, "failed", None, seconds=payload["seconds"], worker=payload["worker"], attempts=attempts,
                       error_type=payload["error_type"], error=payload["error"],
                       traceback=payload["traceback"])  # fmt: skip


def _record(outcome: TaskOutcome, store: _Store) -> TaskOutcome:
    if outcome.ok:
        store.save(outcome.task, outcome.value)
    return outcome


def _run_serial(tasks, todo, outcomes, options, store, bar) -> None:
    for n, i in enumerate(todo):
        task = tasks[i]
        kwargs = dict(task.kwargs)
        if task.progress_kwarg and options.progress:
            kwargs[task.progress_kwarg] = True
        bar.status(1)
        outcomes[i] = _record(_outcome(task, execute_task(task.fn, kwargs, options.threads_per_worker), 1), store)
        bar.done(outcomes[i].ok, 1 if n + 1 < len(todo) else 0)


def _check_address(address: str) -> None:
    """Raise ``ValueError`` for an address Dask cannot parse (no port, unknown scheme, a port
    that is not a number), without connecting or starting an event loop."""
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import get_backend

    scheme, location = parse_address(address)
    get_backend(scheme)
    if scheme in ("tcp", "tls", "ws", "wss"):
        parse_host_port(location)


def dashboard_address(options: GridOptions) -> str | None:
    """Where the local cluster's dashboard listens: a bare port (``":8787"``) is put on
    ``options.host`` (Dask itself would listen on every interface for a bare port)."""
    address = options.dashboard_address
    if address is None or not address.startswith(":"):
        return address
    host = f"[{options.host}]" if ":" in options.host else options.host
    return f"{host}{address}"


def _worker_environ() -> dict[str, Any]:
    """Environment of the local cluster's worker processes (set before they start).

    Dask's default also sets ``MALLOC_TRIM_THRESHOLD_=65536``; setting any glibc malloc tunable
    freezes the dynamic mmap threshold at 128 KiB, so every tensor larger than that is a fresh
    ``mmap`` whose pages are faulted in again on each allocation. With it, one exact-κ task took
    1.2–1.4× longer in a worker than in a plain process (BENCHMARKS.md, "Grids on Dask"). Keep
    the one-thread BLAS settings, drop the malloc tunable.
    """
    import dask

    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {})
    environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    return environ


@contextmanager
def _client(options: GridOptions, mode: str, where: int | str) -> Iterator[tuple[Any, str | None]]:
    """A connected ``distributed.Client`` (and the dashboard link) for ``mode``; closed afterwards."""
    import dask
    from distributed import Client, LocalCluster

    if mode == "local":
        # One task at a time per worker process; tasks wait on the scheduler (not pre-assigned to
        # a worker), so a lost worker takes at most its one running task with it, which is
        # retried once (allowed-failures = 1).
        with dask.config.set({"distributed.scheduler.worker-saturation": 1.0,
                              "distributed.nanny.pre-spawn-environ": _worker_environ()}), \
                warnings.catch_warnings():
            # "Port 8787 is already in use ... Hosting the HTTP server on port N instead": the link
            # printed below names the port actually used.
            warnings.filterwarnings("ignore", message=r"(?s).*already in use", category=UserWarning)
            cluster = LocalCluster(
                n_workers=int(where),
                threads_per_worker=1,
                processes=True,
                memory_limit=0,
                host=options.host,
                dashboard_address=dashboard_address(options),
                silence_logs=logging.ERROR,
                scheduler_kwargs={"allowed_failures": 1},
            )
        try:
            client = Client(cluster)
            try:
                yield client, cluster.dashboard_link if options.dashboard_address else None
            finally:
                client.close()
        finally:
            cluster.close()
        return
    address = str(where)
    try:
        _check_address(address)  # before Client starts its event loop
        client = Client(address, timeout=options.connect_timeout)
    except ValueError as err:  # "missing port number", "unknown address scheme", a bad port, …
        raise SchedulerConnectionError(
            f"invalid Dask scheduler address {address!r} ({_first_line(str(err) or type(err).__name__)}); "
            f"give one like tcp://host:8786 to --scheduler (or ${ENV_SCHEDULER})"
        ) from None
    except (OSError, TimeoutError) as err:
        raise SchedulerConnectionError(
            f"cannot reach the Dask scheduler at {address!r} ({_first_line(str(err) or type(err).__name__)}); "
            f"start one with `dask scheduler` and `dask worker {address}`, or drop --scheduler (and "
            f"${ENV_SCHEDULER}) to use a local cluster"
        ) from None
    try:
        try:
            client.wait_for_workers(1, timeout=options.connect_timeout)
        except (OSError, TimeoutError):
            raise SchedulerConnectionError(
                f"the Dask scheduler at {address!r} has no workers after {options.connect_timeout:g} s; "
                f"start some with `dask worker {address}`"
            ) from None
        services = client.scheduler_info().get("services", {})
        yield client, client.dashboard_link if "dashboard" in services else None
    finally:
        client.close()


@contextmanager
def shared_cluster(options: GridOptions | None) -> Iterator[GridOptions | None]:
    """Start the local cluster of ``options`` once for several :func:`run_grid` calls.

    Yields options that send every grid to that cluster (as if it were an external scheduler),
    so a command made of several grids (``train --tune``: one comparison per learning rate)
    pays the cluster start-up once. In-process and external-scheduler options are yielded
    unchanged. The cluster is closed on exit.
    """
    if options is None or options.serial or options.workers == 1:
        yield options
        return
    mode, where = options.plan(options.workers or _cpu_count())
    if mode != "local":
        yield options
        return
    with _client(options, mode, where) as (client, link):
        if link:
            print(f"local Dask cluster of {where} workers; dashboard: {link}", file=sys.stderr)
        yield GridOptions(threads_per_worker=options.threads_per_worker, scheduler=client.scheduler.address,
                          progress=options.progress, connect_timeout=options.connect_timeout,
                          timeout=options.timeout)  # fmt: skip


def _run_dask(tasks, todo, outcomes, options, store, bar, mode, where, desc) -> str | None:
    from distributed import as_completed

    with _client(options, mode, where) as (client, link):
        n_workers = len(client.scheduler_info().get("workers", {}))
        place = f"{n_workers} local workers" if mode == "local" else f"the cluster at {where} ({n_workers} workers)"
        scheduler_name = "of the local cluster" if mode == "local" else f"at {where}"
        if link:
            print(f"{desc}: {len(todo)} tasks on {place}; Dask dashboard: {link}", file=sys.stderr)
        else:
            print(f"{desc}: {len(todo)} tasks on {place}", file=sys.stderr)
        token = uuid.uuid4().hex[:8]
        by_key: dict[str, int] = {}
        futures = []
        for i in todo:
            t = tasks[i]
            fut = client.submit(execute_task, t.fn, dict(t.kwargs), options.threads_per_worker,
                                key=f"{desc}-{t.key}-{token}", pure=False)  # fmt: skip
            by_key[fut.key] = i
            futures.append(fut)
        slots, last = _slots(client), time.monotonic()
        pending = len(futures)
        bar.status(min(pending, slots))
        deadline = None if options.timeout is None else time.monotonic() + options.timeout
        ac = as_completed(futures, timeout=options.timeout)
        try:
            for fut in ac:
                i = by_key[fut.key]
                outcomes[i] = _record(_future_outcome(tasks[i], fut, scheduler_name), store)
                fut.release()
                pending -= 1
                if time.monotonic() - last > 1.0:
                    slots, last = _slots(client), time.monotonic()
                bar.done(outcomes[i].ok, min(pending, slots))
        except TimeoutError:
            pass
        for fut in futures:
            i = by_key[fut.key]
            if outcomes[i] is None:
                fut.cancel()
                waited = options.timeout if deadline is not None else math.nan
                outcomes[i] = TaskOutcome(tasks[i], "failed", error_type="GridTimeout",
                                          error=f"not finished after the grid timeout of {waited:g} s")  # fmt: skip
                bar.done(False, 0)
    return link


def _slots(client) -> int:
    try:
        return max(1, sum(client.nthreads().values()))
    except Exception:  # noqa: BLE001 - only for the progress display
        return 1


#: ``error_type`` of a task whose scheduler went away before it finished
SCHEDULER_LOST = "SchedulerLost"


def _future_outcome(task: Task, fut, scheduler: str = "?") -> TaskOutcome:
    if fut.status == "finished":
        try:
            return _outcome(task, fut.result(), 1)
        except Exception as err:  # noqa: BLE001 - e.g. a result that cannot be unpickled here
            return TaskOutcome(task, "failed", error_type=type(err).__name__, error=str(err),
                               traceback=traceback.format_exc())  # fmt: skip
    try:
        err = fut.exception()
    except Exception as raised:  # noqa: BLE001 - a cancelled future may raise instead of returning
        err = raised
    if err is None or fut.status in ("cancelled", "lost") or type(err).__name__ == "CancelledError":
        # The client cancels every pending future when its connection to the scheduler is gone
        # for good; the future then carries no exception of its own.
        return TaskOutcome(task, "failed", error_type=SCHEDULER_LOST, attempts=0, error=(
            f"the Dask scheduler {scheduler} was lost before this task finished (its connection closed and did "
            "not come back); finished tasks are kept, rerun to compute the others"))  # fmt: skip
    name = type(err).__name__
    message = str(err) or repr(err)
    attempts = 1
    if name == "KilledWorker":
        allowed = getattr(err, "allowed_failures", None)
        attempts = allowed + 1 if isinstance(allowed, int) else 0
        message = (
            f"the worker running it was lost {attempts or 'several'} times (a crash, an out-of-memory kill, "
            f"a killed process); last worker {getattr(err, 'last_worker', '?')}"
        )
    return TaskOutcome(task, "failed", error_type=name, error=message, attempts=attempts)


def summary_lines(result: GridResult, what: str) -> list[str]:
    """Lines for the end of a command: counts, then one line per failed task."""
    n, bad = len(result.outcomes), len(result.failed)
    cached = sum(o.cached for o in result.outcomes)
    head = f"{what}: {n - bad} of {n} tasks finished ({cached} from earlier runs)"
    if not bad:
        return [head]
    return [f"{head}; {bad} failed:"] + [f"  {line}" for line in result.failure_lines()]


__all__: Sequence[str] = (
    "ENV_SCHEDULER",
    "LOCAL_HOST",
    "SCHEDULER_LOST",
    "GridOptions",
    "GridResult",
    "Task",
    "TaskOutcome",
    "add_grid_arguments",
    "dashboard_address",
    "execute_task",
    "options_from_args",
    "run_grid",
    "shared_cluster",
    "summary_lines",
    "task_key",
)
