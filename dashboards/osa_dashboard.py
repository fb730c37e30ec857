"""osa_lab dashboard: rank collapse, singular-value spectra and Jacobian conditioning, OSA vs SSA.

Serve it with::

    panel serve dashboards/osa_dashboard.py --show      # or: osa-lab dashboard

Layout (DESIGN.md §6 Panel conventions): a :class:`~panel.template.FastListTemplate` whose sidebar
holds the :class:`Controls` (presets, depth, tokens N, width d, heads, α, seeds, metric) and whose
main area holds one :class:`~panel.viewable.Viewer` per view:

* :class:`OSACheckView`: orthogonality and dense-vs-low-rank error badges (:mod:`osa_lab.checks`);
* :class:`RankCollapseView`: the chosen metric against layer, mean and band over seeds;
* :class:`SpectraView`: spectra heatmaps per preset (shared log colour scale) and selected layers;
* :class:`JacobianView`: κ across depth and the end-to-end Jacobian's singular-value histogram,
  exact where it fits and matrix-free otherwise (the view says which).

All figures come from the shared builders of :mod:`osa_lab.plots.depth`. Computations are
cached on their primitive arguments with ``pn.cache`` and run off the event loop when served.
Impossible or too expensive settings put a message in the page and keep the last good figures.
Every browser session builds its own objects (the module runs once per session), so sessions
share nothing but the read-only caches. The page loads no resource from the internet: Panel
serves its bundled JavaScript and CSS, and :class:`OfflineFast` drops the Fast design's Google
Fonts stylesheet.
"""

from __future__ import annotations

import asyncio
import io
import logging
import threading
import time
from collections.abc import Callable

import holoviews as hv
import pandas as pd
import panel as pn
import param
from panel.io.resources import CDN_DIST
from panel.theme.fast import Fast

from osa_lab.errors import ConfigurationError, OSAInputError, UnknownNameError
from osa_lab.plots import depth as plots

log = logging.getLogger("osa_lab.dashboard")

#: Errors whose message is shown to the user as is (bad or too-expensive settings).
USER_ERRORS: tuple[type[BaseException], ...] = (ConfigurationError, OSAInputError, UnknownNameError, ValueError,
                                                MemoryError)

#: Controls mirrored in the page URL's query string (shareable links; the browser tests use them).
URL_PARAMETERS = ("depth", "tokens", "dim", "heads", "seeds", "metric", "derived_alpha", "alpha")

TOKENS = [4, 8, 16, 32, 48, 64, 96, 128, 192, 256]
DIMS = [4, 8, 16, 24, 32, 48, 64, 96, 128]


def _preset_names() -> list[str]:
    from osa_lab.presets import preset_names

    return preset_names()


def _metric_names() -> list[str]:
    from osa_lab.metrics import METRICS

    return list(METRICS)


class OfflineFast(Fast):
    """The Fast design without its Google Fonts stylesheet, every script served by the app.

    ``Fast`` lists ``fonts.googleapis.com/css?family=Open+Sans``; offline that request fails.
    The text falls back to the system sans-serif font. The design's own module is pointed at
    Panel's bundled copy (a subclass would otherwise look for it under its own name).
    """

    _resources = {
        **Fast._resources,
        "font": {},
        "js_modules": {
            **Fast._resources["js_modules"],
            "fast-design": f"{CDN_DIST}bundled/fast/js/fast_design.js",
        },
    }


# ---------------------------------------------------------------------------------------------
# cached computations (primitive arguments only: pn.cache cannot hash tensors)
# ---------------------------------------------------------------------------------------------


#: Serialises the model computations of all sessions. The models switch torch's *global* default
#: dtype while they build (osa_lab.models), so two sweeps in parallel threads can mix float32 and
#: float64 weights; one computation at a time also avoids oversubscribing small machines. This
#: module runs once per session, so the lock lives in the process-wide ``pn.state.cache``.
COMPUTE_LOCK: threading.Lock = pn.state.cache.setdefault("osa_lab.dashboard.compute_lock", threading.Lock())


@pn.cache(max_items=24)
def compute_sweep(
    presets: tuple[str, ...], depth: int, tokens: int, dim: int, heads: int, alpha: float | None, seeds: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tidy metrics and spectra tables of one configuration (:func:`osa_lab.analysis.sweep`)."""
    from osa_lab.analysis import sweep

    with COMPUTE_LOCK:
        result = sweep(
            list(presets), depths=[depth], tokens=[tokens], dims=[dim], heads=[heads], alphas=[alpha],
            seeds=list(range(seeds)), site="both", progress=False,
        )
    return result.metrics, result.spectra


def jacobian_layers(depth: int, points: int) -> list[int]:
    """``points`` layers from 1 to ``depth``, evenly spaced, always including the last."""
    points = max(1, min(points, depth))
    return sorted({round(depth * (i + 1) / points) for i in range(points)})


@pn.cache(max_items=24)
def compute_jacobian(
    presets: tuple[str, ...], depth: int, tokens: int, dim: int, heads: int, alpha: float | None, seeds: int,
    method: str, points: int = 6,
) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """κ at ``points`` layers (both scopes) and, for exact Jacobians, the last layer's singular values.

    Uses :func:`osa_lab.jacobian.jacobian_depth_profile` and
    :func:`osa_lab.jacobian.jacobian_singular_values` per preset and seed. The singular-value table
    is ``None`` when the matrix-free method ran (it yields only the two extremes).
    """
    from osa_lab import jacobian

    layers = jacobian_layers(depth, points)
    profiles, svals = [], []
    for preset in presets:
        for seed in range(seeds):
            with COMPUTE_LOCK:  # per preset and seed, so sweeps of other sessions can interleave
                prof = jacobian.jacobian_depth_profile(preset, depth, tokens, dim, heads, alpha, seed,
                                                       method=method, layers=layers)
                profiles.append(prof)
                if (prof["method"] == "exact").all():
                    svals.append(jacobian.jacobian_singular_values(preset, depth, tokens, dim, heads, alpha, seed,
                                                                   method="exact"))
    return pd.concat(profiles, ignore_index=True), (pd.concat(svals, ignore_index=True) if svals else None)


@pn.cache(max_items=64)
def compute_osa_check(tokens: int, dim: int, heads: int, alpha: float | None) -> dict[str, object]:
    """The OSA check of :mod:`osa_lab.checks` for these sizes (seed 0, float32)."""
    from osa_lab.checks import osa_check

    with COMPUTE_LOCK:
        return osa_check(tokens, dim, heads, alpha, seed=0)


def _describe(exc: BaseException) -> str:
    """A one-paragraph message for the page (never a traceback)."""
    if isinstance(exc, USER_ERRORS):
        return str(exc)
    log.exception("dashboard computation failed", exc_info=exc)
    return f"The computation failed ({type(exc).__name__}: {exc}). The last good figures are kept."


# ---------------------------------------------------------------------------------------------
# controls and shared per-session state
# ---------------------------------------------------------------------------------------------


class Controls(param.Parameterized):
    """The sidebar settings of one session (primitive values only)."""

    presets = param.ListSelector(default=["pure-ssa", "pure-osa"], objects=[], doc="Presets to compare (two or more).")
    depth = param.Integer(default=12, bounds=(1, 48), doc="Number of blocks.")
    tokens = param.Selector(default=32, objects=TOKENS, doc="Tokens N.")
    dim = param.Selector(default=32, objects=DIMS, doc="Width d.")
    heads = param.Integer(default=2, bounds=(1, 16), doc="Attention heads (d must be divisible by heads).")
    derived_alpha = param.Boolean(default=True, label="derived α₀ (OSA init)",
                                  doc="Use the derived OSA initialisation α₀ instead of the α slider.")
    alpha = param.Number(default=0.05, bounds=(0.0, 2.0), step=0.005, label="α (OSA)",
                         doc="OSA α when 'derived α₀' is off (SSA presets ignore it).")
    seeds = param.Integer(default=2, bounds=(1, 5), doc="Random seeds; plots show the mean and min–max band.")
    metric = param.Selector(default="relative_residual", objects=[], doc="Depth-wise metric (DESIGN.md §4).")

    def __init__(self, **params):
        presets, metrics = _preset_names(), _metric_names()
        self.param.presets.objects = presets
        self.param.metric.objects = metrics
        super().__init__(**params)

    @property
    def alpha_value(self) -> float | None:
        """α passed to the analyses: ``None`` for the derived initialisation."""
        return None if self.derived_alpha else float(self.alpha)

    def config(self) -> dict[str, object]:
        """The primitive configuration the analyses are cached on."""
        return dict(presets=tuple(self.presets), depth=int(self.depth), tokens=int(self.tokens), dim=int(self.dim),
                    heads=int(self.heads), alpha=self.alpha_value, seeds=int(self.seeds))

    def validate(self) -> None:
        """Raise :class:`ConfigurationError` with a user-facing message for impossible settings."""
        if len(self.presets) < 2:
            raise ConfigurationError("choose at least two presets to compare")
        if self.dim % self.heads:
            divisors = [h for h in range(1, 17) if self.dim % h == 0]
            raise ConfigurationError(
                f"width d = {self.dim} is not divisible by heads = {self.heads}: each head gets d / heads "
                f"value columns. Choose heads from {divisors} or change d."
            )

    def panel(self) -> pn.Param:
        """Widgets generated from the parameters; sliders act on release (``value_throttled``)."""
        return pn.Param(
            self.param,
            parameters=["presets", "depth", "tokens", "dim", "heads", "derived_alpha", "alpha", "seeds", "metric"],
            widgets={
                "presets": {"type": pn.widgets.MultiChoice, "name": "presets"},
                "depth": {"type": pn.widgets.IntSlider, "throttled": True},
                "tokens": {"type": pn.widgets.DiscreteSlider, "throttled": True, "name": "tokens N"},
                "dim": {"type": pn.widgets.DiscreteSlider, "throttled": True, "name": "width d"},
                "heads": {"type": pn.widgets.IntSlider, "throttled": True},
                "alpha": {"type": pn.widgets.FloatSlider, "throttled": True},
                "seeds": {"type": pn.widgets.IntSlider, "throttled": True},
            },
            show_name=False,
            sizing_mode="stretch_width",
        )


class _AsyncComputation(param.Parameterized):
    """Runs a computation off the event loop when served (synchronously otherwise), keeping the
    last good result on error and dropping results that a newer request has overtaken."""

    busy = param.Boolean(default=False, doc="A computation is running.")
    error = param.String(default="", doc="Message of the last failed computation ('' if it succeeded).")
    seconds = param.Number(default=0.0, doc="Wall time of the last successful computation.")

    def __init__(self, **params):
        super().__init__(**params)
        self._generation = 0

    def _run(self, compute: Callable[[], object], apply: Callable[[object], None]) -> None:
        """Compute now (tests, scripts) or schedule it on the server's loop (served sessions)."""
        if pn.state.curdoc is not None and pn.state.curdoc.session_context is not None:

            async def task() -> None:
                await self._run_async(compute, apply)

            pn.state.execute(task)
        else:
            self._run_sync(compute, apply)

    def _run_sync(self, compute: Callable[[], object], apply: Callable[[object], None]) -> None:
        self._generation += 1
        start = time.perf_counter()
        try:
            value = compute()
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the page
            self.error = _describe(exc)
            return
        self.seconds = time.perf_counter() - start
        self.error = ""
        apply(value)

    async def _run_async(self, compute: Callable[[], object], apply: Callable[[object], None]) -> None:
        self._generation += 1
        generation = self._generation
        self.busy = True
        start = time.perf_counter()
        try:
            value = await asyncio.to_thread(compute)
        except Exception as exc:  # noqa: BLE001
            if generation == self._generation:
                self.error = _describe(exc)
                self.busy = False
            return
        if generation != self._generation:
            return  # a newer request is running; its result will be shown
        try:
            self.seconds = time.perf_counter() - start
            self.error = ""
            apply(value)
        except Exception as exc:  # noqa: BLE001
            self.error = _describe(exc)
        finally:
            self.busy = False


class SweepState(_AsyncComputation):
    """The current sweep of one session: tidy metrics and spectra tables of the last good settings."""

    controls = param.ClassSelector(class_=Controls)
    metrics = param.DataFrame(default=None, allow_None=True, doc="Tidy metrics table (osa_lab.analysis).")
    spectra = param.DataFrame(default=None, allow_None=True, doc="Tidy spectra table (osa_lab.analysis).")
    config = param.Dict(default={}, doc="Configuration of the tables shown.")

    @param.depends("controls.presets", "controls.depth", "controls.tokens", "controls.dim", "controls.heads",
                   "controls.derived_alpha", "controls.alpha", "controls.seeds", watch=True)
    def refresh(self) -> None:
        """Recompute for the current controls (cached); on error keep the tables and set ``error``."""
        controls = self.controls

        def compute():
            controls.validate()
            cfg = controls.config()
            return cfg, compute_sweep(**cfg)

        def apply(value):
            cfg, (metrics, spectra) = value
            with param.parameterized.batch_call_watchers(self):
                self.config = cfg
                self.metrics = metrics
                self.spectra = spectra

        self._run(compute, apply)


# ---------------------------------------------------------------------------------------------
# views
# ---------------------------------------------------------------------------------------------


def _placeholder(text: str) -> hv.Curve:
    """An empty figure with ``text`` as its title (HoloViews panes need a HoloViews object)."""
    return hv.Curve([]).opts(title=text, xaxis=None, yaxis=None, toolbar=None, height=120, backend="bokeh")


def _message_pane(*errors) -> pn.pane.Alert:
    """An alert that shows whichever of the bound error strings is non-empty."""

    def text(*messages: str) -> str:
        return "\n\n".join(m for m in messages if m)

    bound = pn.bind(text, *errors)
    return pn.pane.Alert(bound, alert_type="warning", visible=pn.bind(lambda t: bool(t), bound),
                         sizing_mode="stretch_width")


def _png_download(view: _FigureHolder, key: str, filename: str) -> pn.widgets.FileDownload:
    def callback() -> io.BytesIO:
        obj = view.figures.get(key)
        if obj is None:
            raise ConfigurationError("no figure to export yet")
        return io.BytesIO(plots.png_bytes(obj))

    return pn.widgets.FileDownload(callback=callback, filename=filename, label=f"PNG: {filename}",
                                   color="light", embed=False, width=260)


class _FigureHolder(pn.viewable.Viewer):
    """Base of the views: the last good HoloViews figure per key and a message for failed redraws."""

    message = param.String(default="", doc="Why the last redraw failed ('' if it succeeded).")

    def __init__(self, **params):
        super().__init__(**params)
        self.figures: dict[str, hv.core.Dimensioned] = {}
        self.tables: dict[str, pd.DataFrame] = {}
        self.panes: dict[str, pn.pane.HoloViews] = {}
        self._layout: pn.viewable.Viewable | None = None

    def _build(self) -> pn.viewable.Viewable:
        raise NotImplementedError

    def __panel__(self) -> pn.viewable.Viewable:
        """The view's layout, built once (its panes stay bound to the parameters)."""
        if self._layout is None:
            self._layout = self._build()
        return self._layout

    def _draw(self, key: str, build: Callable[[], hv.core.Dimensioned]) -> hv.core.Dimensioned:
        """Build figure ``key``; on failure keep the previous one and set :attr:`message`."""
        try:
            obj = build()
        except Exception as exc:  # noqa: BLE001
            self.message = _describe(exc)
            return self.figures.get(key, _placeholder("No figure: see the message above"))
        self.figures[key] = obj
        self.message = ""
        return obj


class RankCollapseView(_FigureHolder):
    """The chosen metric against layer, one curve per preset, min–max band over seeds."""

    controls = param.ClassSelector(class_=Controls)
    state = param.ClassSelector(class_=SweepState)
    site = param.Selector(default="block", objects=["block", "attention"],
                          doc="Hidden state per layer: after the whole block or after attention.")
    scale = param.Selector(default="auto", objects=["auto", "log", "linear"], label="y scale",
                           doc="Log y where the metric spans decades ('auto').")

    def figure(self, metrics: pd.DataFrame | None, metric: str, site: str, scale: str):
        """The figure for these tables and options (also stores the reduced data in ``tables``)."""
        if metrics is None:
            return _placeholder("Computing…")

        def build():
            self.tables["metric"] = plots.metric_vs_depth_data(metrics, metric, site=site)
            logy = None if scale == "auto" else scale == "log"
            return plots.metric_vs_depth(metrics, metric, site=site, logy=logy)

        return self._draw("metric", build)

    def _csv(self) -> io.BytesIO:
        frames = [f for f in (self.state.metrics,) if f is not None]
        if not frames:
            raise ConfigurationError("no sweep yet")
        return io.BytesIO(frames[0].to_csv(index=False).encode())

    def _spectra_csv(self) -> io.BytesIO:
        if self.state.spectra is None:
            raise ConfigurationError("no sweep yet")
        return io.BytesIO(self.state.spectra.to_csv(index=False).encode())

    def _build(self) -> pn.viewable.Viewable:
        fig = pn.pane.HoloViews(
            pn.bind(self.figure, self.state.param.metrics, self.controls.param.metric, self.param.site,
                    self.param.scale),
            backend="bokeh", sizing_mode="stretch_width", min_height=360, loading=self.state.param.busy,
        )
        options = pn.Row(
            pn.pane.Markdown("hidden state after", margin=(12, 5, 0, 10), sizing_mode="fixed", width=130),
            pn.widgets.RadioButtonGroup.from_param(self.param.site, width=200, sizing_mode="fixed"),
            pn.pane.Markdown("y scale", margin=(12, 5, 0, 30), sizing_mode="fixed", width=70),
            pn.widgets.RadioButtonGroup.from_param(self.param.scale, width=220, sizing_mode="fixed"),
            sizing_mode="stretch_width",
        )
        self.panes["metric"] = fig
        downloads = pn.Row(
            pn.widgets.FileDownload(callback=self._csv, filename="osa_sweep_metrics.csv",
                                    label="CSV: tidy metrics of this sweep", color="primary", embed=False,
                                    width=260),
            pn.widgets.FileDownload(callback=self._spectra_csv, filename="osa_sweep_spectra.csv",
                                    label="CSV: tidy spectra of this sweep", color="light", embed=False,
                                    width=260),
            _png_download(self, "metric", "rank_collapse.png"),
        )
        return pn.Column(_message_pane(self.param.message), options, fig, downloads, sizing_mode="stretch_width",
                         name="Rank collapse")


class SpectraView(_FigureHolder):
    """Singular-value spectra across depth: heatmaps per preset and selected layers as lines."""

    state = param.ClassSelector(class_=SweepState)
    layers = param.ListSelector(default=[], objects=[], doc="Layers drawn as lines (empty: a default choice).")

    @param.depends("state.spectra", watch=True, on_init=True)
    def _update_layers(self) -> None:
        spectra = self.state.spectra
        if spectra is None:
            return
        available = sorted(int(x) for x in spectra["layer"].unique())
        self.param.layers.objects = available
        kept = [x for x in self.layers if x in available]
        if kept != list(self.layers):
            self.layers = kept

    def heatmaps(self, spectra: pd.DataFrame | None):
        """Heatmaps of σᵢ/σ₁ (layer × normalised index), shared colour scale."""
        if spectra is None:
            return _placeholder("Computing…")

        def build():
            self.tables["heatmaps"] = spectra
            return plots.spectra_heatmaps(spectra)

        return self._draw("heatmaps", build)

    def lines(self, spectra: pd.DataFrame | None, layers: list[int]):
        """Normalised spectra of the selected layers."""
        if spectra is None:
            return _placeholder("Computing…")
        return self._draw("lines", lambda: plots.spectra_lines(spectra, layers=sorted(layers) or None))

    def _build(self) -> pn.viewable.Viewable:
        heat = pn.pane.HoloViews(pn.bind(self.heatmaps, self.state.param.spectra), backend="bokeh",
                                 sizing_mode="stretch_width", min_height=330, loading=self.state.param.busy)
        lines = pn.pane.HoloViews(pn.bind(self.lines, self.state.param.spectra, self.param.layers), backend="bokeh",
                                  sizing_mode="stretch_width", min_height=330, loading=self.state.param.busy)
        self.panes.update(heatmaps=heat, lines=lines)
        chooser = pn.widgets.MultiChoice.from_param(self.param.layers, name="layers drawn as lines", width=400)
        downloads = pn.Row(_png_download(self, "heatmaps", "spectra_heatmaps.png"),
                           _png_download(self, "lines", "spectra_lines.png"))
        return pn.Column(_message_pane(self.param.message), heat, chooser, lines, downloads,
                         sizing_mode="stretch_width", name="Spectra")


class JacobianView(_FigureHolder):
    """κ of the Jacobian across depth and the end-to-end singular-value histogram.

    Jacobians cost far more than the forward sweep, so this view computes only while ``active``
    (its tab is open), at ``points`` layers and for ``seeds`` seeds. Inputs of up to
    ``auto_limit`` entries (N·d) are computed as soon as the settings change; larger ones wait for
    the *Compute* button and say so. ``method="auto"`` is exact where the Jacobian fits
    (:data:`osa_lab.jacobian.MAX_EXACT_DIM` inputs) and matrix-free otherwise; the figure titles
    and a badge say which ran. An exact Jacobian too large for memory gives a message.
    """

    controls = param.ClassSelector(class_=Controls)
    method = param.Selector(default="auto", objects=["auto", "exact", "matrix-free"],
                            doc="Jacobian computation: exact (torch.func) or matrix-free (svds on jvp/vjp).")
    scope = param.Selector(default="end_to_end", objects=["end_to_end", "layer"],
                           doc="κ of ∂X_l/∂X_0 (end_to_end) or of block l alone (layer).")
    points = param.Integer(default=6, bounds=(1, 48), label="layers evaluated",
                           doc="Number of layers (evenly spaced, last included) at which κ is computed.")
    seeds = param.Integer(default=1, bounds=(1, 5), label="Jacobian seeds", doc="Seeds (capped by the sidebar).")
    auto_limit = param.Integer(default=512, doc="Largest N·d computed without pressing Compute.")
    compute = param.Event(label="Compute Jacobians")
    active = param.Boolean(default=False, doc="Compute only when True (the tab is visible).")
    profile = param.DataFrame(default=None, allow_None=True)
    svals = param.DataFrame(default=None, allow_None=True)
    notice = param.String(default="", doc="Why nothing was computed (e.g. waiting for Compute).")

    def __init__(self, **params):
        super().__init__(**params)
        self.job = _AsyncComputation()

    @param.depends("compute", watch=True)
    def _on_compute(self) -> None:
        self.refresh(force=True)

    @param.depends("controls.presets", "controls.depth", "controls.tokens", "controls.dim", "controls.heads",
                   "controls.derived_alpha", "controls.alpha", "controls.seeds", "method", "points", "seeds",
                   "active", watch=True)
    def refresh(self, force: bool = False) -> None:
        """Recompute for the current controls when active (cached); large inputs wait for ``compute``."""
        if not self.active:
            return
        controls, method, points = self.controls, self.method, self.points
        inputs = int(controls.tokens) * int(controls.dim)
        if inputs > self.auto_limit and not force:
            self.notice = (f"N·d = {inputs} inputs: Jacobians at this size can take minutes on a small machine. "
                           "Press *Compute Jacobians* to run them (the figures below are from earlier settings).")
            return
        self.notice = ""

        def compute():
            controls.validate()
            cfg = controls.config()
            cfg["seeds"] = min(self.seeds, cfg["seeds"])
            return compute_jacobian(**cfg, method=method, points=points)

        def apply(value):
            profile, svals = value
            with param.parameterized.batch_call_watchers(self):
                self.profile, self.svals = profile, svals

        self.job._run(compute, apply)

    def methods_used(self) -> str:
        """'exact', 'matrix-free' or both, from the ``method`` column of the current profile."""
        if self.profile is None or "method" not in self.profile:
            return ""
        return ", ".join(sorted({str(m) for m in self.profile["method"].unique()}))

    def kappa(self, profile: pd.DataFrame | None, scope: str):
        """κ across depth per preset."""
        if profile is None:
            return _placeholder("Jacobians are computed while this tab is open")

        def build():
            self.tables["kappa"] = plots.kappa_vs_depth_data(profile, scope=scope)
            return plots.kappa_vs_depth(profile, scope=scope)

        return self._draw("kappa", build)

    def histogram(self, svals: pd.DataFrame | None, profile: pd.DataFrame | None):
        """Histogram of the end-to-end Jacobian's singular values (exact method only)."""
        if svals is None:
            text = "Histogram needs the exact Jacobian (matrix-free gives only σ_max and σ_min)" if (
                profile is not None) else ""
            return _placeholder(text)
        return self._draw("histogram", lambda: plots.jacobian_histogram(svals))

    def badge(self, profile: pd.DataFrame | None) -> str:
        """Which computation produced the figures."""
        used = self.methods_used()
        if not used:
            return ""
        how = {"exact": "exact (torch.func.jacrev, all singular values)",
               "matrix-free": "matrix-free (jvp/vjp + ARPACK: σ_max and σ_min only)"}
        return "**Jacobian computed:** " + "; ".join(how.get(m, m) for m in used.split(", "))

    def _build(self) -> pn.viewable.Viewable:
        kappa = pn.pane.HoloViews(pn.bind(self.kappa, self.param.profile, self.param.scope), backend="bokeh",
                                  sizing_mode="stretch_width", min_height=360, loading=self.job.param.busy)
        hist = pn.pane.HoloViews(pn.bind(self.histogram, self.param.svals, self.param.profile), backend="bokeh",
                                 sizing_mode="stretch_width", min_height=360, loading=self.job.param.busy)
        self.panes.update(kappa=kappa, histogram=hist)
        options = pn.Row(
            pn.widgets.RadioButtonGroup.from_param(self.param.method, width=300),
            pn.widgets.RadioButtonGroup.from_param(self.param.scope, width=220),
        )
        sizes = pn.Row(
            pn.Param(self.param, parameters=["points", "seeds"], show_name=False, default_layout=pn.Row,
                     widgets={"points": {"type": pn.widgets.IntSlider, "throttled": True, "width": 220},
                              "seeds": {"type": pn.widgets.IntSlider, "throttled": True, "width": 180}}),
            pn.widgets.Button.from_param(self.param.compute, color="primary", width=200),
        )
        notice = pn.pane.Alert(self.param.notice, alert_type="info", visible=pn.bind(bool, self.param.notice),
                               sizing_mode="stretch_width")
        downloads = pn.Row(_png_download(self, "kappa", "jacobian_kappa.png"),
                           _png_download(self, "histogram", "jacobian_histogram.png"))
        return pn.Column(_message_pane(self.job.param.error, self.param.message), notice, options, sizes,
                         pn.pane.Markdown(pn.bind(self.badge, self.param.profile)), kappa, hist, downloads,
                         sizing_mode="stretch_width", name="Jacobian")


class OSACheckView(pn.viewable.Viewer):
    """Badges with the OSA check of the current sizes: orthogonality and dense vs low-rank error."""

    controls = param.ClassSelector(class_=Controls)
    result = param.Dict(default=None, allow_None=True, doc="Last good osa_check result.")

    def __init__(self, **params):
        super().__init__(**params)
        self.job = _AsyncComputation()
        self.refresh()

    @param.depends("controls.tokens", "controls.dim", "controls.heads", "controls.derived_alpha", "controls.alpha",
                   watch=True)
    def refresh(self) -> None:
        """Run the (cached) check for the current sizes."""
        c = self.controls

        def compute():
            c.validate()
            return compute_osa_check(int(c.tokens), int(c.dim), int(c.heads), c.alpha_value)

        def apply(value):
            self.result = value

        self.job._run(compute, apply)

    @staticmethod
    def badges_html(result: dict | None) -> str:
        """HTML badges, green when within tolerance and red otherwise."""
        if not result:
            return ""
        labels = {
            "orthogonality_error": "‖AᵀA − I‖max",
            "dense_vs_lowrank": "dense vs low-rank",
            "lowrank_vs_float64": "low-rank vs float64",
            "norm_preservation": "norm preservation",
        }
        parts = []
        for key, label in labels.items():
            ok = result["passed"][key]
            colour = "#1a7f37" if ok else "#b42318"
            parts.append(
                f'<span class="osa-badge" data-check="{key}" style="display:inline-block;margin:2px 6px 2px 0;'
                f'padding:3px 10px;border-radius:12px;background:{colour};color:white;font-size:13px">'
                f"{label}: {result[key]:.1e}</span>"
            )
        alpha = result["alpha"]
        meta = (f'<span style="font-size:12px;color:#555">OSA check at N={result["tokens"]}, d={result["dim"]}, '
                f'heads={result["heads"]}, α={alpha:.3g}, {result["dtype"]}, method {result["method"]}</span>')
        return "<div>" + "".join(parts) + meta + "</div>"

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.HTML(pn.bind(self.badges_html, self.param.result), sizing_mode="stretch_width",
                         loading=self.job.param.busy),
            _message_pane(self.job.param.error),
            sizing_mode="stretch_width",
        )


# ---------------------------------------------------------------------------------------------
# the app
# ---------------------------------------------------------------------------------------------


class Dashboard(pn.viewable.Viewer):
    """One session's dashboard: controls, the shared sweep state and the four views."""

    controls = param.ClassSelector(class_=Controls)

    def __init__(self, compute_now: bool = True, **params):
        controls = params.pop("controls", None) or Controls(
            **{k: params.pop(k) for k in list(params) if k in Controls.param and k != "name"}
        )
        super().__init__(controls=controls, **params)
        self.state = SweepState(controls=controls)
        self.check_view = OSACheckView(controls=controls)
        self.rank_view = RankCollapseView(controls=controls, state=self.state)
        self.spectra_view = SpectraView(state=self.state)
        self.jacobian_view = JacobianView(controls=controls)
        self.tabs = pn.Tabs(
            ("Rank collapse", self.rank_view), ("Spectra", self.spectra_view), ("Jacobian", self.jacobian_view),
            dynamic=True, sizing_mode="stretch_width",
        )
        self.tabs.param.watch(self._on_tab, "active")
        if compute_now:
            self.state.refresh()

    def _on_tab(self, event) -> None:
        self.jacobian_view.active = event.new == 2

    def _status(self, busy: bool, seconds: float, config: dict) -> str:
        if busy:
            return "⏳ computing…"
        if not config:
            return ""
        return f"last sweep: {seconds:.2f} s · {len(config['presets'])} presets × {config['seeds']} seeds"

    def main(self) -> pn.Column:
        """The main area (also usable without the template)."""
        return pn.Column(
            _message_pane(self.state.param.error),
            pn.pane.Markdown("### OSA check"),
            self.check_view,
            self.tabs,
            sizing_mode="stretch_width",
        )

    def sidebar(self) -> list:
        """The sidebar: controls and a status line."""
        status = pn.pane.Markdown(pn.bind(self._status, self.state.param.busy, self.state.param.seconds,
                                          self.state.param.config))
        return [self.controls.panel(), status]

    def template(self) -> pn.template.FastListTemplate:
        """The page: a FastListTemplate with the offline Fast design."""
        return pn.template.FastListTemplate(
            title="osa_lab · Orthogonal vs softmax self-attention across depth",
            sidebar=self.sidebar(),
            main=[self.main()],
            design=OfflineFast,
            font_url="",
            font="system-ui, 'DejaVu Sans', sans-serif",
            accent="#0072B2",
            sidebar_width=330,
        )

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Row(pn.Column(*self.sidebar(), width=330), self.main())


def build_app(**params) -> Dashboard:
    """A dashboard for one session; keyword arguments set the initial controls (e.g. ``depth=4``)."""
    return Dashboard(**params)


def limit_torch_threads() -> int:
    """Use ``OSA_DASHBOARD_TORCH_THREADS`` (default 1) intra-op threads in the server process.

    Sessions compute concurrently in worker threads on small matrices; on a 2-core machine shared
    with other work, torch's own thread pool spin-waits and made a depth-24 sweep 15× slower
    (16 s with 2 threads vs 1.1 s with 1, measured under load). Returns the thread count set.
    """
    import os

    import torch

    threads = int(os.environ.get("OSA_DASHBOARD_TORCH_THREADS", "1"))
    torch.set_num_threads(max(threads, 1))
    return torch.get_num_threads()


if pn.state.served:
    limit_torch_threads()
    pn.extension(sizing_mode="stretch_width")
    dashboard = Dashboard(compute_now=False)
    if pn.state.location is not None:  # ?depth=6&tokens=16 … sets the controls and follows them
        pn.state.location.sync(dashboard.controls, {k: k for k in URL_PARAMETERS})
    dashboard.template().servable()
    pn.state.onload(lambda: dashboard.state.refresh())

__all__ = [
    "Controls", "Dashboard", "JacobianView", "OSACheckView", "OfflineFast", "RankCollapseView", "SpectraView",
    "SweepState", "build_app", "compute_jacobian", "limit_torch_threads", "compute_osa_check", "compute_sweep",
]
