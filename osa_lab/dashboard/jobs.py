"""Long computations of the dashboard, run in a worker process that can be stopped at any time.

Jacobians of deep models and sweeps at the largest sizes take seconds to minutes. The dashboard
(:mod:`osa_lab.dashboard.jacobian_view`, :mod:`osa_lab.dashboard.sweep`) runs each such job in a
separate process started by :func:`start_job`, so that

* a *Cancel* button, a closed browser tab or the server's SIGTERM stops the work at once
  (:meth:`WorkerJob.cancel` terminates the process; a thread could not be stopped),
* the server's event loop and the other sessions stay responsive meanwhile.

A job is a list of *units*, each computed by one function: :func:`compute_unit` for a Jacobian
unit (:class:`Unit`, preset × seed: :func:`osa_lab.studies.jacobian.jacobian_depth_profile` and,
for exact Jacobians, :func:`osa_lab.studies.jacobian.jacobian_singular_values`) and
:func:`compute_sweep_unit` for a sweep unit (a :class:`~osa_lab.studies.settings.StudyPoint`, preset × seed: one model run of
:func:`osa_lab.studies.depth.sweep`). The worker sends each finished unit back through a pipe, so
the parent can show progress and cache every unit on its own (a later request that shares
presets or seeds computes only the missing units). :func:`estimate_seconds` and
:func:`estimate_sweep_seconds` give the estimate shown before a job starts.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from osa_lab.studies.settings import StudyPoint

__all__ = ["Unit", "WorkerJob", "compute_sweep_unit", "compute_unit", "estimate_seconds",
           "estimate_sweep_seconds", "start_jacobian_job", "start_job", "start_sweep_job"]


@dataclass(frozen=True)
class Unit:
    """One preset × seed of a Jacobian request (primitive fields: the cache key)."""

    preset: str
    depth: int
    tokens: int
    dim: int
    heads: int | None
    alpha: float | None
    seed: int
    algorithm: str  # "exact" or "matrix-free" (never "auto": resolved first, so both choices share results)
    layers: tuple[int, ...]

    @property
    def point(self) -> StudyPoint:
        """The unit's grid point (:class:`osa_lab.studies.settings.StudyPoint`)."""
        from osa_lab.studies.settings import StudyPoint

        return StudyPoint(self.preset, self.depth, self.tokens, self.dim, self.heads, self.alpha, self.seed)


#: The figures of :func:`estimate_seconds`, measured on the 2-core CPU machine under load (seconds per preset ×
#: seed unit, depth 12, 6 layers, both scopes): exact 5.7 s for two units at N·d = 256 and 126 s
#: at N·d = 1024 (∝ (N·d)^2.25, ∝ depth); matrix-free ≈ 13 s per ARPACK solve (layer × scope)
#: at N·d ≤ 256 (158 s for two units at 256, 103 s for one unit of 3 layers at 64), growing
#: about linearly beyond (no result within 600 s at 1024).
_EXACT_PER_UNIT, _MF_PER_SOLVE = 2.8, 13.0


def estimate_seconds(unit_count: int, algorithm: str, tokens: int, dim: int, depth: int, points: int) -> float:
    """A rough wall-time estimate of ``unit_count`` units, shown before a job starts (the measured
    figures above; ``points`` layers per unit)."""
    n = tokens * dim
    if algorithm == "exact":
        per = _EXACT_PER_UNIT * (n / 256) ** 2.25 * depth / 12
    else:
        per = _MF_PER_SOLVE * 2 * min(points, depth) * max(1.0, n / 256)
    return unit_count * max(per, 0.05)


def compute_unit(unit: Unit) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """κ profile (both scopes) and, for exact Jacobians, the last layer's singular values."""
    from osa_lab.studies import jacobian

    prof = jacobian.jacobian_depth_profile(unit.point, algorithm=unit.algorithm, layers=list(unit.layers))
    svals = None
    if (prof["algorithm"] == "exact").all():
        svals = jacobian.jacobian_singular_values(unit.point, algorithm="exact")
    return prof, svals


#: The sweep cost model, measured on the 2-core CPU machine under load (one torch thread, both
#: sites, spectra included): 11 ms per block at N·d = 1024 (N = d = 32), 55 ms at 8192
#: (N = 128, d = 64), 66–128 ms at 32768 (N = 256, d = 128; vit to skipless-ssa), i.e. about
#: ∝ (N·d)^0.63; a sweep of 7 presets × 5 seeds at depth 48 and that size took 118 s.
_SWEEP_PER_BLOCK, _SWEEP_EXPONENT = 0.011, 0.63


def estimate_sweep_seconds(unit_count: int, tokens: int, dim: int, depth: int) -> float:
    """A rough wall-time estimate of ``unit_count`` sweep units (model runs) of ``depth`` blocks."""
    per_block = _SWEEP_PER_BLOCK * (tokens * dim / 1024) ** _SWEEP_EXPONENT
    return unit_count * depth * per_block


def compute_sweep_unit(unit: StudyPoint) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tidy metrics and spectra tables of one model run (both sites), as
    :func:`osa_lab.studies.depth.sweep` gives them for this preset and seed: the rows of a sweep
    over several presets and seeds are those of its units, concatenated preset by preset, seed by seed."""
    from osa_lab.studies.depth import sweep

    result = sweep([unit.preset], depths=[unit.depth], tokens=[unit.tokens], dims=[unit.dim], heads=[unit.heads],
                   alphas=[unit.alpha], seeds=[unit.seed], site="both", progress=False)
    return result.metrics, result.spectra


def _worker(conn, compute: Callable[[Any], Any], units: list, threads: int) -> None:  # pragma: no cover - child
    import torch

    torch.set_num_threads(max(int(threads), 1))
    try:
        for unit in units:
            start = time.perf_counter()
            result = compute(unit)
            conn.send(("unit", unit, result, time.perf_counter() - start))
        conn.send(("done", None, None, 0.0))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the page
        try:
            conn.send(("error", None, exc, 0.0))
        except Exception:  # noqa: BLE001 - an unpicklable exception
            conn.send(("error", None, RuntimeError(f"{type(exc).__name__}: {exc}"), 0.0))
    finally:
        conn.close()


_CTX_LOCK = threading.Lock()
_LIVE: set[WorkerJob] = set()


def _context():
    """A forkserver context with osa_lab's Jacobian and sweep code preloaded (fast starts, no fork of a
    multi-threaded server); spawn where forkserver does not exist."""
    with _CTX_LOCK:
        try:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["osa_lab.dashboard.jobs", "osa_lab.studies.jacobian", "osa_lab.studies.depth"])
        except ValueError:  # pragma: no cover - platforms without forkserver
            ctx = mp.get_context("spawn")
        return ctx


@dataclass(eq=False)
class WorkerJob:
    """A running worker process: poll it for finished units, cancel it at any time."""

    units: list
    process: Any
    conn: Any
    started: float = field(default_factory=time.perf_counter)
    finished: bool = False
    cancelled: bool = False

    def poll(self) -> list[tuple[str, Unit | None, Any, float]]:
        """Messages received so far (non-blocking): ``("unit", unit, result, s)``, ``("done", …)``
        or ``("error", None, exception, 0)``. A worker that died without a word gives an error."""
        out = []
        try:
            while self.conn.poll():
                msg = self.conn.recv()
                out.append(msg)
                if msg[0] in ("done", "error"):
                    self._close()
                    return out
        except (EOFError, OSError):
            self._close()
            if not self.cancelled:
                code = self.process.exitcode
                out.append(("error", None, RuntimeError(f"the worker process stopped (exit code {code})"), 0.0))
        return out

    def cancel(self) -> None:
        """Stop the worker now (SIGTERM, then SIGKILL after 1 s)."""
        self.cancelled = True
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(1.0)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(1.0)
        self._close()

    def _close(self) -> None:
        self.finished = True
        _LIVE.discard(self)
        try:
            self.conn.close()
        except OSError:
            pass
        if not self.process.is_alive():
            self.process.join(0)


def start_job(compute: Callable[[Any], Any], units: list, threads: int = 1) -> WorkerJob:
    """Start a worker process computing ``compute(unit)`` for each of ``units`` in turn
    (daemonic: it never outlives the server). ``compute`` must be a module-level function (it is
    sent to the worker by name)."""
    ctx = _context()
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_worker, args=(child, compute, list(units), threads), daemon=True,
                       name="osa-lab-worker")
    proc.start()
    child.close()
    job = WorkerJob(list(units), proc, parent)
    _LIVE.add(job)
    return job


def start_jacobian_job(units: list[Unit], threads: int = 1) -> WorkerJob:
    """Start a worker process computing the Jacobian ``units`` (:func:`compute_unit`)."""
    return start_job(compute_unit, units, threads)


def start_sweep_job(units: list[StudyPoint], threads: int = 1) -> WorkerJob:
    """Start a worker process computing the sweep ``units`` (:func:`compute_sweep_unit`)."""
    return start_job(compute_sweep_unit, units, threads)


def cancel_all() -> int:
    """Cancel every live job of this process (server shutdown); returns how many were running.

    Every worker is sent SIGTERM first and only then waited for, so n jobs cost one grace period
    (1 s, then SIGKILL), not n of them.
    """
    jobs = list(_LIVE)
    for job in jobs:
        job.cancelled = True
        if job.process.is_alive():
            job.process.terminate()
    for job in jobs:
        job.cancel()
    return len(jobs)


def exit_now(signum: int = 0, frame: object = None) -> None:
    """SIGTERM handler of the dashboard server: stop every worker, then leave at once.

    The server holds no state worth a graceful teardown (results are caches), and a graceful
    one waits for computations running in threads; ``os._exit`` makes shutdown take the time of
    :func:`cancel_all` only.
    """
    import os

    try:
        cancel_all()
    finally:
        os._exit(0)


def format_seconds(seconds: float) -> str:
    """``"≈ 4 s"``, ``"≈ 2.5 min"``, ``"≈ 1.2 h"`` (estimates are rough: one significant figure)."""
    if not math.isfinite(seconds):
        return "unknown"
    if seconds < 90:
        return f"≈ {max(round(seconds), 1)} s"
    if seconds < 5400:
        return f"≈ {seconds / 60:.1f} min"
    return f"≈ {seconds / 3600:.1f} h"
