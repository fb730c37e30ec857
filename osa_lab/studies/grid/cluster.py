"""Running tasks on Dask: the embedded local cluster, an existing scheduler, and what became of
each future.

:func:`cluster_client` connects (or starts a loopback-only :class:`dask.distributed.LocalCluster`
whose scheduler retries a task once after a lost worker); :func:`shared_cluster` keeps one
local cluster for several grids; :func:`run_on_dask` submits the tasks and gathers their
outcomes, recording a lost scheduler (:data:`~osa_lab.studies.grid.results.SCHEDULER_LOST`), a
killed worker and the grid timeout as failed tasks.
"""

from __future__ import annotations

import logging
import math
import sys
import time
import traceback
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from osa_lab.errors import SchedulerConnectionError
from osa_lab.studies.grid.local import execute_task, outcome_from_payload, record_outcome
from osa_lab.studies.grid.options import ENV_SCHEDULER, GridOptions, Task, cpu_count
from osa_lab.studies.grid.results import SCHEDULER_LOST, TaskOutcome, first_line


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
def cluster_client(options: GridOptions, mode: str, where: int | str) -> Iterator[tuple[Any, str | None]]:
    """A connected ``distributed.Client`` (and the dashboard link) for ``mode``; closed afterwards."""
    import dask
    from distributed import Client, LocalCluster

    if mode == "local":
        # One task at a time per worker process; tasks wait on the scheduler (not pre-assigned to
        # a worker), so a lost worker takes at most its one running task with it, which is
        # retried once (allowed-failures = 1).
        with (
            dask.config.set(
                {
                    "distributed.scheduler.worker-saturation": 1.0,
                    "distributed.nanny.pre-spawn-environ": _worker_environ(),
                }
            ),
            warnings.catch_warnings(),
        ):
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
            f"invalid Dask scheduler address {address!r} ({first_line(str(err) or type(err).__name__)}); "
            f"give one like tcp://host:8786 to --scheduler (or ${ENV_SCHEDULER})"
        ) from None
    except (OSError, TimeoutError) as err:
        raise SchedulerConnectionError(
            f"cannot reach the Dask scheduler at {address!r} ({first_line(str(err) or type(err).__name__)}); "
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
    mode, where = options.plan(options.workers or cpu_count())
    if mode != "local":
        yield options
        return
    with cluster_client(options, mode, where) as (client, link):
        if link:
            print(f"local Dask cluster of {where} workers; dashboard: {link}", file=sys.stderr)
        yield GridOptions(threads_per_worker=options.threads_per_worker, scheduler=client.scheduler.address,
                          progress=options.progress, connect_timeout=options.connect_timeout,
                          timeout=options.timeout)  # fmt: skip


def run_on_dask(tasks, todo, outcomes, options, store, bar, mode, where, desc) -> str | None:
    """Run the tasks ``todo`` (indices into ``tasks``) on the cluster of ``mode``/``where``; return
    the dashboard link (or ``None``)."""
    from distributed import as_completed

    with cluster_client(options, mode, where) as (client, link):
        n_workers = len(client.scheduler_info().get("workers", {}))
        place = (
            f"{n_workers} local workers"
            if mode == "local"
            else f"the cluster at {where} ({n_workers} workers)"
        )
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
                outcomes[i] = record_outcome(_future_outcome(tasks[i], fut, scheduler_name), store)
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


def _future_outcome(task: Task, fut, scheduler: str = "?") -> TaskOutcome:
    if fut.status == "finished":
        try:
            return outcome_from_payload(task, fut.result(), 1)
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
