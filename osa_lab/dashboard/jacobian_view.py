"""The *Jacobian* tab: κ of the Jacobian across depth and the end-to-end Jacobian's
singular-value histogram (:class:`JacobianView`).

Jacobians run in a worker process (:mod:`osa_lab.dashboard.jobs`) with an estimate, progress
and *Cancel* (:func:`osa_lab.dashboard.state.follow_job`, the path long sweeps take too).
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import panel as pn
import param

from osa_lab.dashboard import jobs
from osa_lab.dashboard.caches import JACOBIANS
from osa_lab.dashboard.figure_view import (
    FIGURE_HEIGHT,
    HISTOGRAM_HEIGHT,
    FigureView,
    message_pane,
    placeholder,
    radio_buttons,
    small_title,
    throttled,
)
from osa_lab.dashboard.state import (
    AUTO_JACOBIAN_SECONDS,
    DIMS,
    SCOPE_LABELS,
    TOKENS,
    compute_unit,
    describe_error,
    follow_job,
    is_served,
    jacobian_layers,
    label_of,
    progress_text,
)
from osa_lab.errors import ConfigurationError
from osa_lab.plots import depth as plots
from osa_lab.studies.jacobian import resolve_algorithm


class JacobianView(FigureView):
    """κ of the Jacobian across depth and the end-to-end singular-value histogram.

    Computed only while the tab is open, per preset × seed *unit* (cached process-wide, so the
    modes share results: ``auto`` resolves to the cheaper of exact and matrix-free first). A
    request estimated under :data:`AUTO_JACOBIAN_SECONDS` starts at once; longer ones show the
    estimate and wait for *Compute Jacobians*. Served sessions compute in a worker process with
    progress and a *Cancel* button; closing the tab cancels it too.
    """

    seeds = param.Integer(default=1, bounds=(1, 5), label="Jacobian seeds", doc="Seeds (capped by the sidebar).")
    compute = param.Event(label="Compute Jacobians")
    cancel = param.Event(label="Cancel")
    running = param.Boolean(default=False, doc="A Jacobian job is running.")
    profile = param.DataFrame(default=None, allow_None=True)
    svals = param.DataFrame(default=None, allow_None=True)
    notice = param.String(default="", doc="Estimate, progress, or why nothing was computed.")
    shown = param.Dict(default={}, doc="Settings of the figures shown.")

    def __init__(self, **params):
        super().__init__(**params)
        self._job: jobs.WorkerJob | None = None

    # -- requests ---------------------------------------------------------------------------

    def units(self) -> tuple[list[jobs.Unit], str]:
        """The units of the current settings and the Jacobian algorithm that runs."""
        c = self.controls
        c.validate()
        cfg = c.config()
        layers = tuple(jacobian_layers(cfg["depth"], c.points))
        algorithm = resolve_algorithm(c.jacobian, cfg["tokens"], cfg["dim"], cfg["depth"], layers=layers)
        seeds = min(int(self.seeds), int(cfg["seeds"]))
        units = [jobs.Unit(p, cfg["depth"], cfg["tokens"], cfg["dim"], cfg["heads"], cfg["alpha"], s, algorithm, layers)
                 for p in cfg["presets"] for s in range(seeds)]
        return units, algorithm

    @param.depends("compute", watch=True)
    def _on_compute(self) -> None:
        self.request(force=True)

    @param.depends("cancel", watch=True)
    def _on_cancel(self) -> None:
        self.stop("Cancelled: the figures below are from earlier settings.")

    def stop(self, notice: str = "") -> None:
        """Cancel a running job (its worker process is terminated)."""
        if self._job is not None:
            self._job.cancel()
            self._job = None
        if self.running:
            self.running = False
            self.notice = notice

    @param.depends("controls.presets", "controls.depth", "controls.tokens", "controls.dim", "controls.heads",
                   "controls.derived_alpha", "controls.alpha", "controls.seeds", "controls.jacobian",
                   "controls.points", "seeds", watch=True)
    def _settings_changed(self) -> None:
        self.request()

    @param.depends("controls.scope", watch=True)
    def _scope_changed(self) -> None:
        self.redraw()

    def _activated(self) -> None:  # the tab opened: compute (or draw) what is missing
        self.request()

    def request(self, force: bool = False) -> None:
        """Show the current settings' Jacobians: from the cache, or computed (large ones on *Compute*)."""
        if not self.active or not self.panes:
            self.stale = True
            return
        self.stale = False
        self.stop()
        try:
            units, algorithm = self.units()
        except ConfigurationError as exc:
            self.job.error = str(exc)
            self._nothing_shown("No Jacobian figures: see the message above")
            return
        self.job.error = ""
        missing = [u for u in units if u not in JACOBIANS]
        if not missing:
            self.notice = ""
            self._show(units)
            return
        c = self.controls
        eta = jobs.estimate_seconds(len(missing), algorithm, int(c.tokens), int(c.dim), int(c.depth), int(c.points))
        what = f"{len(missing)} {algorithm} Jacobian profile{'s' if len(missing) > 1 else ''} (N·d = {c.tokens * c.dim})"
        if eta > AUTO_JACOBIAN_SECONDS and not force:
            wait = (f"{what}: estimated {jobs.format_seconds(eta)} on this machine. Press **Compute Jacobians** to "
                    "run them (*Cancel* stops them)")
            preview = self.preview_units(units)
            if preview is None:
                self.notice = wait + "; the figures below are from earlier settings."
                self._nothing_shown("No Jacobian figures yet: press Compute Jacobians")
                return
            p = preview[0]
            self.notice = (wait + f". Meanwhile the figures show a **preview at N = {p.tokens}, d = {p.dim}** "
                           "(same presets, depth and layers; their titles say so).")
            units, missing = preview, [u for u in preview if u not in JACOBIANS]
            if not missing:
                self._show(units)
                return
            eta = jobs.estimate_seconds(len(missing), p.algorithm, p.tokens, p.dim, p.depth, len(p.layers))
        else:
            self.notice = f"Computing {what}, estimated {jobs.format_seconds(eta)}…"
        self._nothing_shown("Computing Jacobians…")
        done_notice = self.notice if units[0].tokens != int(c.tokens) or units[0].dim != int(c.dim) else ""
        if is_served():
            self._start(units, missing, eta, done_notice)
        else:
            self._run_here(units, missing, done_notice)

    def preview_units(self, units: list[jobs.Unit]) -> list[jobs.Unit] | None:
        """The units of a preview: the same presets, seeds, depth and layers at the largest N and d
        (no larger than requested, d divisible by every preset's heads) whose Jacobians are
        estimated to take at most :data:`AUTO_JACOBIAN_SECONDS`; ``None`` if none is that cheap."""
        first = units[0]
        heads = [self.controls.heads_of(p) for p in self.controls.presets]
        best = None
        for n in (t for t in TOKENS if t <= first.tokens):
            for d in (x for x in DIMS if x <= first.dim and all(x % h == 0 for h in heads)):
                if (n, d) == (first.tokens, first.dim):
                    continue
                algorithm = resolve_algorithm(self.controls.jacobian, n, d, first.depth, layers=first.layers)
                eta = jobs.estimate_seconds(len(units), algorithm, n, d, first.depth, len(first.layers))
                if eta <= AUTO_JACOBIAN_SECONDS and (best is None or n * d > best[0] * best[1]):
                    best = (n, d, algorithm)
        if best is None:
            return None
        n, d, algorithm = best
        return [replace(u, tokens=n, dim=d, algorithm=algorithm) for u in units]

    def _run_here(self, units: list[jobs.Unit], missing: list[jobs.Unit], done_notice: str = "") -> None:
        try:
            for unit in missing:
                JACOBIANS.put(unit, compute_unit(unit))
        except Exception as exc:  # noqa: BLE001
            self.job.error = describe_error(exc)
            self.notice = ""
            self._nothing_shown("No Jacobian figures: the computation failed (message above)")
            return
        self.notice = done_notice
        self._show(units)

    def _start(self, units: list[jobs.Unit], missing: list[jobs.Unit], eta: float, done_notice: str = "") -> None:
        """Compute ``missing`` in a worker process with progress and *Cancel*; then show ``units``
        and set the notice to ``done_notice`` (a preview keeps saying what it is)."""
        job = jobs.start_jacobian_job(missing)
        self._job, self.running = job, True
        what = "Jacobians"

        def on_unit(unit, result) -> None:
            JACOBIANS.put(unit, result)

        def on_progress(done: int, elapsed: float) -> None:
            if self._job is job:
                self.notice = progress_text(what, done, len(missing), elapsed, eta)

        def on_error(exc: BaseException) -> None:
            if self._job is job:
                self.job.error = describe_error(exc)
                self.notice = ""
                self._nothing_shown("No Jacobian figures: the computation failed (message above)")

        def on_end(_seconds: float) -> None:
            if self._job is job:
                self._job, self.running = None, False
                if not job.cancelled and all(u in JACOBIANS for u in units):
                    self.notice = done_notice
                    self._show(units)

        follow_job(job, on_unit, on_progress, on_error, on_end)

    def _nothing_shown(self, text: str) -> None:
        """While no Jacobian figure has been drawn, say why instead of the initial "Computing…"."""
        if self.profile is not None:
            return  # earlier figures stay on screen
        for key in self.panes:
            self.figures[key], self.tables[key] = placeholder(text), None
            self.show(key, self.figures[key])

    def _show(self, units: list[jobs.Unit]) -> None:
        results = [JACOBIANS.get(u) for u in units]
        profile = pd.concat([r[0] for r in results], ignore_index=True)
        svals = [r[1] for r in results if r[1] is not None]
        cfg = self.controls.config()
        preview = (units[0].tokens, units[0].dim) != (cfg["tokens"], cfg["dim"])
        with param.parameterized.batch_call_watchers(self):
            self.shown = cfg | {"jacobian": units[0].algorithm, "jseeds": len({u.seed for u in units}),
                                "tokens": units[0].tokens, "dim": units[0].dim, "preview": preview}
            self.profile = profile
            self.svals = pd.concat(svals, ignore_index=True) if len(svals) == len(results) else None
        self.redraw()

    # -- figures ----------------------------------------------------------------------------

    def algorithms_used(self) -> str:
        """'exact', 'matrix-free' or both, from the ``algorithm`` column of the current profile."""
        if self.profile is None or "algorithm" not in self.profile:
            return ""
        return ", ".join(sorted({str(m) for m in self.profile["algorithm"].unique()}))

    def specs(self):
        profile, svals, scope = self.profile, self.svals, self.controls.scope
        if profile is None:
            return {}
        shown = dict(self.shown)
        algorithm = self.algorithms_used()
        settings = self.controls.describe({**shown, "seeds": shown.get("jseeds", 1)})
        if shown.get("preview"):
            settings = f"PREVIEW at smaller N, d · {settings}"
        key = tuple(sorted((k, v) for k, v in shown.items()))

        def kappa():
            title = f"Jacobian κ across depth ({label_of(SCOPE_LABELS, scope)}) [{algorithm}] · {settings}"
            fig = small_title(plots.kappa_vs_depth(profile, scope=scope, title=title, width=None,
                                                    height=FIGURE_HEIGHT))
            return fig, plots.kappa_vs_depth_data(profile, scope=scope)

        def histogram():
            if svals is None:
                return placeholder(f"No histogram: the {algorithm} algorithm gives only σ_max and σ_min "
                                    f"(choose exact) · {settings}"), None
            title = f"Singular values of the end-to-end Jacobian [{algorithm}] · {settings}"
            return (small_title(plots.jacobian_histogram(svals, title=title, width=None, height=HISTOGRAM_HEIGHT)),
                    plots.jacobian_histogram_data(svals))

        return {"kappa": (("kappa", key, scope), kappa), "histogram": (("histogram", key), histogram)}

    def figures_are_current(self) -> bool:
        """Whether the figures shown are of the current controls (a preview counts as current: its
        titles say what it is); ``False`` while earlier figures wait for a new computation."""
        shown, c = self.shown, self.controls
        if not shown:
            return False
        cfg = c.config()
        same = all(shown.get(k) == v for k, v in cfg.items() if k not in ("tokens", "dim"))
        same = same and (shown.get("preview") or (shown.get("tokens"), shown.get("dim")) == (cfg["tokens"], cfg["dim"]))
        mode_ok = c.jacobian == "auto" or c.jacobian == shown.get("jacobian")
        return bool(same and mode_ok and shown.get("jseeds") == int(self.seeds))

    def badge(self, profile: pd.DataFrame | None, *_watched: object) -> str:
        """Which computation produced the figures, and whether they are of earlier settings."""
        used = self.algorithms_used()
        if not used:
            return ""
        how = {"exact": "exact (torch.func.jacrev, all singular values)",
               "matrix-free": "matrix-free (jvp/vjp + Lanczos: σ_max and σ_min only)"}
        text = "**Jacobian computed:** " + "; ".join(how.get(m, m) for m in used.split(", "))
        if not self.figures_are_current():
            text = ("*The figures below are of earlier settings* (" + self.controls.describe(
                {**self.shown, "seeds": self.shown.get("jseeds", 1)}) + "). " + text.replace("computed", "computed there"))
        return text

    def _build(self) -> pn.viewable.Viewable:
        kappa = self._pane("kappa", min_height=FIGURE_HEIGHT)
        hist = self._pane("histogram", min_height=HISTOGRAM_HEIGHT)
        options = pn.Row(radio_buttons(self.controls.param.jacobian, 330), radio_buttons(self.controls.param.scope, 300))
        sizes = pn.Row(
            throttled(self.controls, "points", pn.widgets.IntSlider, label="layers evaluated", width=220),
            throttled(self, "seeds", pn.widgets.IntSlider, label="Jacobian seeds", width=180),
            pn.widgets.Button.from_param(self.param.compute, color="primary", width=170,
                                         disabled=self.param.running),
            pn.widgets.Button.from_param(self.param.cancel, color="danger", width=100,
                                         visible=self.param.running),
        )
        notice = pn.pane.Alert(self.param.notice, alert_type="info", visible=pn.bind(bool, self.param.notice),
                               sizing_mode="stretch_width")
        downloads = pn.Row(self._png_download("kappa", "jacobian_kappa.png"),
                           self._png_download("histogram", "jacobian_histogram.png"))
        return pn.Column(message_pane(self.job.param.error), notice, options, sizes,
                         pn.pane.Markdown(pn.bind(self.badge, self.param.profile, self.param.notice, self.param.shown,
                                                  self.param.running)), kappa, hist, downloads,
                         sizing_mode="stretch_width", name="Jacobian")
