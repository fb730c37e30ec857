"""The sweep of one dashboard session: tidy metrics and spectra tables, short ones computed in a
thread, long ones in a worker process with an estimate, progress and *Cancel sweep*.

:class:`SweepSettings` names one sweep (frozen, hashable: the key of the process-wide cache
:data:`~osa_lab.dashboard.caches.SWEEPS`); :func:`compute_sweep` computes it. :class:`SweepState`
is what the rank-collapse and spectra views draw from. A sweep estimated above
:data:`WORKER_SWEEP_SECONDS` runs one model run
(:class:`~osa_lab.studies.settings.StudyPoint`) after another in a worker (:func:`osa_lab.dashboard.jobs.start_sweep_job`), followed on the
event loop by :func:`osa_lab.dashboard.state.follow_job`, the path Jacobians take too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import param

from osa_lab.dashboard import jobs
from osa_lab.dashboard.caches import SWEEP_UNITS, SWEEPS
from osa_lab.dashboard.state import (
    Controls,
    Job,
    describe_error,
    follow_job,
    is_served,
    progress_text,
)
from osa_lab.errors import ComputationCancelledError, ConfigurationError
from osa_lab.studies.settings import StudyPoint

__all__ = ["WORKER_SWEEP_SECONDS", "SweepSettings", "SweepState", "assemble_sweep", "compute_sweep"]


#: Sweeps estimated above this many seconds run in a worker process with an estimate, progress
#: and *Cancel sweep* (:meth:`SweepState.refresh`); shorter ones in a thread (no worker start).
WORKER_SWEEP_SECONDS = 5.0


@dataclass(frozen=True)
class SweepSettings:
    """The settings of one sweep: ``presets`` at ``depth`` blocks, ``tokens`` N, width ``dim``,
    ``heads`` (``None``: each preset's own), OSA ``alpha`` (``None``: the derived α₀) and
    ``seeds`` seeds (0 … seeds − 1). Its model runs are :meth:`points`.

    Frozen and hashable; the fields are normalised (a tuple of names, ints, a float α) so that
    equal settings, however they were written, are one key of :data:`SWEEPS` (whose
    :class:`~osa_lab.dashboard.caches.SharedCache` compares keys by ``repr``).
    """

    presets: tuple[str, ...]
    depth: int
    tokens: int
    dim: int
    heads: int | None
    alpha: float | None
    seeds: int

    def __post_init__(self) -> None:
        normal = {"presets": tuple(str(p) for p in self.presets), "depth": int(self.depth),
                  "tokens": int(self.tokens), "dim": int(self.dim),
                  "heads": None if self.heads is None else int(self.heads),
                  "alpha": None if self.alpha is None else float(self.alpha), "seeds": int(self.seeds)}
        for name, value in normal.items():
            object.__setattr__(self, name, value)

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> SweepSettings:
        """The settings of a configuration dict (:meth:`Controls.config`)."""
        return cls(**{name: cfg[name] for name in cls.__dataclass_fields__})

    def points(self) -> list[StudyPoint]:
        """The sweep's model runs, preset by preset, seed by seed."""
        return [StudyPoint(p, self.depth, self.tokens, self.dim, self.heads, self.alpha, s)
                for p in self.presets for s in range(self.seeds)]


def compute_sweep(settings: SweepSettings, should_stop: Callable[[], bool] | None = None
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tidy metrics and spectra tables of one sweep (:func:`osa_lab.studies.depth.sweep`),
    cached process-wide in :data:`SWEEPS` under ``settings``.

    With ``should_stop`` (a session's sweep, which newer settings supersede) the sweep runs model by
    model (:func:`osa_lab.dashboard.jobs.compute_sweep_unit`, each cached in :data:`SWEEP_UNITS`) and
    asks ``should_stop()`` before each one: ``True`` stops it there with
    :class:`~osa_lab.errors.ComputationCancelledError`, so a superseded sweep stops computing instead of
    finishing unseen. The tables are the same either way (:func:`assemble_sweep`)."""
    hit = SWEEPS.get(settings)
    if hit is not None:
        return hit
    s = settings
    if should_stop is not None:
        units = s.points()
        results = {}
        for done, unit in enumerate(units):
            if should_stop():
                raise ComputationCancelledError(
                    f"sweep superseded by newer settings after {done} of {len(units)} model runs")
            cached = SWEEP_UNITS.get(unit)
            if cached is None:
                cached = jobs.compute_sweep_unit(unit)
                SWEEP_UNITS.put(unit, cached)
            results[unit] = cached
        tables = assemble_sweep(units, results)
        SWEEPS.put(settings, tables)
        return tables
    from osa_lab.studies.depth import sweep

    result = sweep(list(s.presets), depths=[s.depth], tokens=[s.tokens], dims=[s.dim], heads=[s.heads],
                   alphas=[s.alpha], seeds=list(range(s.seeds)), site="both", progress=False)
    SWEEPS.put(settings, (result.metrics, result.spectra))
    return result.metrics, result.spectra


def assemble_sweep(units: list[StudyPoint], results: Mapping[StudyPoint, tuple[pd.DataFrame, pd.DataFrame]]
                   ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The tidy metrics and spectra tables of a sweep from those of its ``units`` (the rows
    :func:`compute_sweep` gives for the same configuration, in the same order)."""
    parts = [results[u] for u in units]
    return (pd.concat([m for m, _ in parts], ignore_index=True),
            pd.concat([sp for _, sp in parts], ignore_index=True))


class SweepState(Job):
    """The current sweep of one session: tidy metrics and spectra tables of the last good settings.

    A sweep estimated above :data:`WORKER_SWEEP_SECONDS` (the largest sizes a link can ask for
    compute for minutes) runs in a worker process, one model run after another, with the
    estimate and then the progress in :attr:`notice` and a *Cancel sweep* button
    (:attr:`cancel`); the figures of the last settings stay meanwhile.
    """

    controls = param.ClassSelector(class_=Controls)
    metrics = param.DataFrame(default=None, allow_None=True, doc="Tidy metrics table (osa_lab.studies.depth).")
    spectra = param.DataFrame(default=None, allow_None=True, doc="Tidy spectra table (osa_lab.studies.depth).")
    config = param.Dict(default={}, doc="Configuration of the tables shown.")
    notice = param.String(default="", doc="Estimate and progress of a long sweep, or that it was cancelled.")
    running = param.Boolean(default=False, doc="A long sweep runs in a worker process.")
    cancel = param.Event(label="Cancel sweep", doc="Stop the long sweep that is running.")

    def __init__(self, **params):
        super().__init__(**params)
        self._worker: jobs.WorkerJob | None = None
        self._worker_config: dict[str, Any] = {}

    @param.depends("controls.presets", "controls.depth", "controls.tokens", "controls.dim", "controls.heads",
                   "controls.derived_alpha", "controls.alpha", "controls.seeds", watch=True)
    def refresh(self) -> None:
        """Recompute for the current controls (cached); on error keep the tables and set ``error``."""
        controls = self.controls
        try:
            controls.validate()
        except ConfigurationError as exc:
            self._generation += 1  # drop any result still running for earlier settings
            self.stop_worker()
            self.error = str(exc)
            return
        cfg = controls.config()
        if cfg == self.config and self.metrics is not None and not self.busy:
            self.error = ""
            return  # e.g. the α slider following α₀ while derived
        if self._worker is not None and cfg == self._worker_config:
            return  # this sweep is running in a worker already

        settings = SweepSettings.of(cfg)
        mine = self._generation + 1  # the generation :meth:`run` gives this request

        def superseded() -> bool:
            return self._generation != mine

        def compute():
            return cfg, compute_sweep(settings, should_stop=superseded)

        def cached():
            hit = SWEEPS.get(settings)
            return None if hit is None else (cfg, hit)

        def apply(value):
            cfg, (metrics, spectra) = value
            with param.parameterized.batch_call_watchers(self):
                self.config = cfg
                self.metrics = metrics
                self.spectra = spectra

        self.stop_worker()
        self.notice = ""  # new settings: an earlier "Cancelled …" no longer applies
        if cached() is None and is_served():
            units = settings.points()
            missing = [u for u in units if u not in SWEEP_UNITS]
            eta = jobs.estimate_sweep_seconds(len(missing), cfg["tokens"], cfg["dim"], cfg["depth"])
            if eta > WORKER_SWEEP_SECONDS:
                self._start_worker(cfg, units, missing, eta, apply)
                return
        self.run(compute, apply, cached)

    def _start_worker(self, cfg: dict[str, Any], units: list[StudyPoint], missing: list[StudyPoint],
                      eta: float, apply: Callable[[object], None]) -> None:
        """Run the ``missing`` model runs of ``cfg`` in a worker process (:func:`follow_job`), then
        apply the assembled tables; the notice gives the estimate, then the progress."""
        self._generation += 1  # a sweep still running in a thread for earlier settings is dropped
        results = {u: SWEEP_UNITS.get(u) for u in units if u not in missing}
        what = (f"the sweep ({len(missing)} model runs: {len(cfg['presets'])} presets × {cfg['seeds']} seeds, "
                f"depth {cfg['depth']}, N = {cfg['tokens']}, d = {cfg['dim']})")
        job = jobs.start_sweep_job(missing)
        self._worker, self._worker_config = job, cfg
        with param.parameterized.batch_call_watchers(self):
            self.error, self.busy, self.running = "", True, True
            self.notice = (f"Computing {what}, estimated {jobs.format_seconds(eta)} on this machine. *Cancel sweep* "
                           "stops it; the figures below are from earlier settings until it is done.")

        def on_unit(unit, result) -> None:
            SWEEP_UNITS.put(unit, result)
            results[unit] = result

        def on_progress(done: int, elapsed: float) -> None:
            if self._worker is job:
                self.notice = progress_text(what, done, len(missing), elapsed, eta, cancel="Cancel sweep")

        def on_error(exc: BaseException) -> None:
            if self._worker is job:
                self.error = describe_error(exc)

        def on_end(seconds: float) -> None:
            if self._worker is not job:
                return  # cancelled, or overtaken by newer settings
            self._worker = None
            complete = not job.cancelled and all(u in results for u in units)
            with param.parameterized.batch_call_watchers(self):
                self.running, self.busy, self.notice = False, False, ""
                if complete:
                    tables = assemble_sweep(units, results)
                    SWEEPS.put(SweepSettings.of(cfg), tables)
                    self.seconds, self.from_cache = seconds, False
            if complete:
                try:
                    apply((cfg, tables))
                except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the page
                    self.error = describe_error(exc)

        follow_job(job, on_unit, on_progress, on_error, on_end)

    @param.depends("cancel", watch=True)
    def _on_cancel(self) -> None:
        cfg = self._worker_config
        if self._worker is None:
            return
        shown = (f"the figures show the last settings computed ({self.controls.describe(self.config)})"
                 if self.config else "no figures were computed yet")
        self.stop_worker(f"Cancelled the sweep at {self.controls.describe(cfg)}: {shown}. Change a setting to compute "
                         "again.")

    def stop_worker(self, notice: str = "") -> None:
        """Stop a long sweep's worker process, if one runs (a cancel, new settings, a closed tab)."""
        job, self._worker = self._worker, None
        if job is None:
            return
        job.cancel()
        with param.parameterized.batch_call_watchers(self):
            self.running, self.busy, self.notice = False, False, notice
