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

The package's rooms:

* :mod:`~osa_lab.studies.grid.options`: :class:`Task`, :class:`GridOptions` and the grid
  arguments of a sub-command;
* :mod:`~osa_lab.studies.grid.results`: :class:`TaskOutcome`, :class:`GridResult` and the
  summary lines;
* :mod:`~osa_lab.studies.grid.store`: the folder of finished results (resume);
* :mod:`~osa_lab.studies.grid.local`: one task's execution (in-process or on a worker), the
  progress bar, the in-process loop;
* :mod:`~osa_lab.studies.grid.cluster`: the local Dask cluster, an existing scheduler, and the
  outcomes of its futures;
* :mod:`~osa_lab.studies.grid.runner`: :func:`run_grid`.
"""

from osa_lab.studies.grid.cluster import cluster_client, dashboard_address, shared_cluster
from osa_lab.studies.grid.local import execute_task
from osa_lab.studies.grid.options import (
    ENV_SCHEDULER,
    LOCAL_HOST,
    GridOptions,
    Task,
    add_grid_arguments,
    options_from_args,
    task_key,
)
from osa_lab.studies.grid.results import (
    SCHEDULER_LOST,
    STATUS_COLUMNS,
    GridResult,
    TaskOutcome,
    summary_lines,
)
from osa_lab.studies.grid.runner import run_grid

__all__ = [
    "ENV_SCHEDULER", "LOCAL_HOST", "SCHEDULER_LOST", "STATUS_COLUMNS", "GridOptions", "GridResult", "Task",
    "TaskOutcome", "add_grid_arguments", "cluster_client", "dashboard_address", "execute_task", "options_from_args",
    "run_grid", "shared_cluster", "summary_lines", "task_key",
]  # fmt: skip
