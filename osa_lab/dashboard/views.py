"""The dashboard's views: OSA-check badges, rank collapse, spectra and Jacobians.

* :class:`OSACheckView`: orthogonality and dense-vs-low-rank error badges (:mod:`osa_lab.studies.self_check`);
* :class:`RankCollapseView`: the chosen metric against layer, mean and band over seeds;
* :class:`SpectraView`: spectra heatmaps per preset (shared log colour scale) and selected layers;
* :class:`JacobianView`: κ across depth and the end-to-end Jacobian's singular-value histogram.

Each view draws only while its tab is visible (:class:`FigureView`); figures are cached
process-wide in :data:`osa_lab.dashboard.caches.FIGURES`. Jacobians run in a worker process
(:mod:`osa_lab.dashboard.jobs`) with an estimate, progress and *Cancel*
(:func:`osa_lab.dashboard.state.follow_job`, the path long sweeps take too).
"""

from __future__ import annotations

import hashlib
import html
import io
import math
from collections.abc import Callable
from typing import Any

import holoviews as hv
import pandas as pd
import panel as pn
import param

from osa_lab.dashboard import jobs
from osa_lab.dashboard.caches import CHECKS, FIGURES, JACOBIANS
from osa_lab.dashboard.state import (
    AUTO_JACOBIAN_SECONDS,
    FIGURE_LOCK,
    METRIC_LABELS,
    SCOPE_LABELS,
    Controls,
    Job,
    compute_osa_check,
    compute_unit,
    describe_error,
    follow_job,
    in_daemon_thread,
    is_served,
    jacobian_layers,
    label_of,
    markdown_literal,
    progress_text,
)
from osa_lab.dashboard.sweep import SweepState
from osa_lab.errors import ConfigurationError
from osa_lab.plots import depth as plots
from osa_lab.plots.style import with_options
from osa_lab.studies.jacobian import resolve_algorithm

#: The group of :func:`placeholder` figures (no data: nothing to export).
PLACEHOLDER_GROUP = "OSALabPlaceholder"


def placeholder(text: str) -> hv.Curve:
    """An empty figure with ``text`` as its title (HoloViews panes need a HoloViews object)."""
    return hv.Curve([], group=PLACEHOLDER_GROUP).opts(
        title=text, xaxis=None, yaxis=None, toolbar=None, height=120, backend="bokeh").opts(
        title=text, xaxis=None, yaxis=None, backend="matplotlib")


def is_placeholder(obj: object) -> bool:
    """Whether ``obj`` is a :func:`placeholder` (a message in place of a figure)."""
    return isinstance(obj, hv.Curve) and obj.group == PLACEHOLDER_GROUP


def message_pane(*errors) -> pn.pane.Alert:
    """One alert showing the distinct non-empty bound messages (each message once), as literal
    text (:func:`~osa_lab.dashboard.state.markdown_literal`): error messages quote settings and
    exception texts, which must never become markup."""

    def text(*messages: str) -> str:
        return "\n\n".join(markdown_literal(m) for m in dict.fromkeys(m for m in messages if m))

    bound = pn.bind(text, *errors)
    return pn.pane.Alert(bound, alert_type="warning", visible=pn.bind(bool, bound), sizing_mode="stretch_width")


def _radio(parameter: param.Parameter, width: int) -> pn.widgets.RadioButtonGroup:
    """A radio group whose selected option is filled in the accent colour (others outlined)."""
    return pn.widgets.RadioButtonGroup.from_param(parameter, button_type="primary", button_style="outline",
                                                  width=width, height=34, sizing_mode="fixed")


#: Height in pixels of the line figures (rank collapse, κ across depth); they take the page's
#: width, after data updates too (a fixed width would shrink them on the first slider move).
FIGURE_HEIGHT = 380
#: Height in pixels of the Jacobian singular-value histogram.
HISTOGRAM_HEIGHT = 360


def _small_title(obj: hv.core.Dimensioned) -> hv.core.Dimensioned:
    """Titles that carry the settings are long: a smaller title font in the browser."""
    return obj.opts(fontsize={"title": "10pt"}, backend="bokeh")


def _digest(table: pd.DataFrame | None) -> str:
    if table is None:
        return ""
    return hashlib.sha1(pd.util.hash_pandas_object(table, index=False).values.tobytes()).hexdigest()[:16]


#: Plot options that follow the data (a data update applies them, :func:`apply_limits`) or that
#: the DynamicMap of a data-updated pane adds to its frames.
DATA_OPTIONS = ("title", "xlim", "ylim", "framewise", "hooks")


def _identity(data: hv.core.Dimensioned) -> hv.core.Dimensioned:
    return data


def apply_limits(plot: Any, element: hv.core.Dimensioned) -> None:
    """HoloViews hook: set the Bokeh axis ranges to the frame's own ``xlim``/``ylim``.

    A DynamicMap's plot keeps the limits of its first frame; the figures set limits from their
    data (e.g. a log axis down to the smallest value), so each data update applies its own.
    """
    try:
        opts = element.opts.get("plot", "bokeh").kwargs
    except Exception:  # noqa: BLE001 - objects without options
        return
    for axis in ("x", "y"):
        lim, rng = opts.get(f"{axis}lim"), plot.handles.get(f"{axis}_range")
        if rng is None or not lim or len(lim) != 2:
            continue
        lo, hi = lim
        if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi) and lo < hi:
            rng.start, rng.end = float(lo), float(hi)


def figure_signature(obj: hv.core.Dimensioned) -> tuple | None:
    """What a figure's Bokeh models depend on besides its data: element types, groups, labels,
    dimensions and plot options (title aside). Two figures with equal signatures differ only in
    data and title, so one can replace the other as a data update. ``None`` for layouts and
    grids, which a :class:`~holoviews.DynamicMap` cannot hold."""
    if isinstance(obj, hv.Layout | hv.NdLayout | hv.GridSpace):
        return None

    def options(o) -> tuple:
        try:
            kwargs = o.opts.get("plot", "bokeh").kwargs
            style = o.opts.get("style", "bokeh").kwargs
        except Exception:  # noqa: BLE001 - objects without options
            return ()
        return tuple(sorted((k, repr(v)) for k, v in {**kwargs, **style}.items() if k not in DATA_OPTIONS))

    parts = []
    for o in obj.traverse(lambda x: x):
        dims = tuple(d.label for d in o.dimensions()) if hasattr(o, "dimensions") else ()
        parts.append((type(o).__name__, getattr(o, "group", ""), getattr(o, "label", ""), dims, options(o)))
    return tuple(parts)


def prepared(obj: hv.core.Dimensioned) -> tuple[hv.core.Dimensioned, tuple | None]:
    """``(figure as drawn, its signature)``: the figure with the options a data update needs
    (``framewise``, :func:`apply_limits`) and :func:`figure_signature`, computed once per figure
    object and kept on it, so that returning to cached settings pays for neither (an options
    operation on the DynamicMap re-applied them to every frame, ≈ 0.1–0.2 s for 5 presets)."""
    cached = getattr(obj, "_osa_lab_prepared", None)
    if cached is not None:
        return cached
    signature = figure_signature(obj)
    shown = obj if signature is None else with_options(obj, framewise=True, hooks=[apply_limits])
    try:
        obj._osa_lab_prepared = (shown, signature)
    except AttributeError:  # objects that take no attributes are prepared on every show
        pass
    return shown, signature


class FigureView(pn.viewable.Viewer):
    """Base of the views: draws its figures only while ``active``; stale ones redraw when shown.

    ``figures[key]`` is always the object on screen in ``panes[key]`` (placeholders included),
    so a PNG download is the figure shown (:meth:`png`).
    """

    controls = param.ClassSelector(class_=Controls)
    active = param.Boolean(default=False, doc="The view's tab is visible.")
    exportable = param.List(default=[], doc="Keys of the panes that show a figure (not a placeholder message).")

    def __init__(self, **params):
        super().__init__(**params)
        self.figures: dict[str, hv.core.Dimensioned] = {}
        self.tables: dict[str, pd.DataFrame | None] = {}
        self.panes: dict[str, pn.pane.HoloViews] = {}
        self.job = Job()
        self.stale = True
        self._layout: pn.viewable.Viewable | None = None
        self._streams: dict[str, tuple[tuple, hv.streams.Pipe]] = {}

    # subclasses: the figures to draw, {key: (cache key or None, builder -> (figure, table))}
    def specs(self) -> dict[str, tuple[tuple | None, Callable[[], tuple[hv.core.Dimensioned, Any]]]]:
        raise NotImplementedError

    def _build(self) -> pn.viewable.Viewable:
        raise NotImplementedError

    def __panel__(self) -> pn.viewable.Viewable:
        """The view's layout, built once."""
        if self._layout is None:
            self._layout = self._build()
            self.stale = True
            self.redraw()
        return self._layout

    def _pane(self, key: str, **kwargs) -> pn.pane.HoloViews:
        pane = pn.pane.HoloViews(placeholder("Computing…"), backend="bokeh", sizing_mode="stretch_width",
                                 loading=self.job.param.busy, **kwargs)
        self.panes[key] = pane
        self.figures[key] = pane.object
        return pane

    @param.depends("active", watch=True)
    def _on_active(self) -> None:
        if self.active and self.stale:
            self._activated()

    def _activated(self) -> None:
        self.redraw()

    def redraw(self) -> None:
        """Build the figures of the current data and options (cached) and show them."""
        if not self.active or not self.panes:
            self.stale = True
            return
        self.stale = False
        specs = self.specs()
        if not specs:
            return

        def compute():
            out = {}
            for key, (cache_key, build) in specs.items():
                hit = FIGURES.get(cache_key) if cache_key is not None else None
                if hit is None:
                    with FIGURE_LOCK:
                        hit = build()
                        prepared(hit[0])  # off the event loop, once per figure
                    if cache_key is not None:
                        FIGURES.put(cache_key, hit)
                out[key] = hit
            return out

        def cached():
            hits = {key: FIGURES.get(k) if k is not None else None for key, (k, _) in specs.items()}
            return hits if all(v is not None for v in hits.values()) else None

        def apply(out):
            for key, (obj, table) in out.items():
                self.figures[key], self.tables[key] = obj, table
                self.show(key, obj)

        self.job.run(compute, apply, cached)

    def show(self, key: str, obj: hv.core.Dimensioned) -> None:
        """Put ``obj`` on screen in pane ``key``: as a data update of the figure already drawn when
        only its data differ (same elements, labels and options: a depth, size or seed change),
        else as a new figure.

        A data update goes through a :class:`~holoviews.streams.Pipe` into the pane's
        :class:`~holoviews.DynamicMap`, so HoloViews updates the existing Bokeh data sources,
        title and ranges instead of building every Bokeh model again (≈ 4× faster for 5 presets).
        Layouts (the spectra grids) are always drawn anew.
        """
        self.exportable = [k for k, f in self.figures.items() if not is_placeholder(f)]
        shown, signature = prepared(obj)
        current = self._streams.get(key)
        if signature is not None and current is not None and current[0] == signature:
            current[1].send(shown)
            return
        if signature is None:
            self._streams.pop(key, None)
            self.panes[key].object = obj
            return
        pipe = hv.streams.Pipe(data=shown)
        self._streams[key] = (signature, pipe)
        self.panes[key].object = hv.DynamicMap(_identity, streams=[pipe])

    def png(self, key: str) -> bytes:
        """PNG of the figure on screen in pane ``key`` (:func:`export`)."""
        return self.export(key, "png")

    def export(self, key: str, format: str = "png") -> bytes:
        """The figure on screen in pane ``key`` as PNG (at :data:`~osa_lab.plots.depth.EXPORT_DPI`),
        SVG or PDF; its title goes into the file's metadata."""
        obj = self.figures.get(key)
        if obj is None or is_placeholder(obj):
            raise ConfigurationError(f"no figure to export: the page shows a message instead "
                                     f"({plots.figure_title(obj) if obj is not None else 'nothing drawn yet'})")
        meta = {"Title": plots.figure_title(obj), "Description": f"data {_digest(self.tables.get(key))}",
                "Software": "osa_lab dashboard"}
        return plots.figure_bytes(obj, format, metadata=meta)

    def export_filename(self, key: str, stem: str, format: str) -> str:
        """``stem`` followed by the settings of the figure on screen (from its title), e.g.
        ``rank_collapse_relative-residual-rank-collapse-after-each-block_depth-12_N-32_d-32_….svg``."""
        return export_filename(stem, plots.figure_title(self.figures.get(key)) if key in self.figures else "", format)

    def _png_download(self, key: str, filename: str) -> pn.Row:
        """PNG and SVG buttons of pane ``key`` (rendered off the event loop, with a loading
        indicator); the downloaded file's name carries the figure's settings."""
        stem = filename.rsplit(".", 1)[0]
        return pn.Row(self._download(key, stem, "png", f"PNG: {filename}"), self._download(key, stem, "svg", "SVG"))

    def _download(self, key: str, stem: str, format: str, label: str) -> pn.widgets.FileDownload:
        button = pn.widgets.FileDownload(
            filename=f"{stem}.{format}", label=label, button_type="light", embed=False, width=260 if format == "png" else 70,
            disabled=pn.bind(lambda keys: key not in keys, self.param.exportable),  # a message is no figure
            description=pn.bind(lambda keys: None if key in keys else "no figure to download: the pane shows a message",
                                self.param.exportable))

        def render() -> io.BytesIO:
            data = self.export(key, format)
            button.filename = self.export_filename(key, stem, format)
            return io.BytesIO(data)

        async def callback() -> io.BytesIO:
            button.loading = True
            try:
                data = await in_daemon_thread(lambda: self.export(key, format))
                button.filename = self.export_filename(key, stem, format)  # on the event loop
                return io.BytesIO(data)
            finally:
                button.loading = False

        button.callback = callback if is_served() else render
        return button


#: Words of figure titles spelled in ASCII in file names.
_ASCII_NAMES = {"α₀": "alpha0", "α": "alpha", "κ": "kappa", "σᵢ/σ₁": "sigma-ratio", "∂": "d", "→": "to"}


def export_filename(stem: str, title: str, format: str, limit: int = 150) -> str:
    """A file name: ``stem``, then the settings of ``title`` (``depth 12 · N 32 · …``) in ASCII
    letters, digits, ``-`` and ``_`` (one ``_`` between the title's ``·`` parts), then ``.format``."""
    import re

    text = title
    for word, ascii_word in _ASCII_NAMES.items():
        text = text.replace(word, ascii_word)
    parts = [re.sub(r"[^A-Za-z0-9.]+", "-", part).strip("-.") for part in text.split("·")]
    settings = "_".join(p for p in parts if p)[:limit].rstrip("-_")
    return f"{stem}_{settings}.{format}" if settings else f"{stem}.{format}"


class RankCollapseView(FigureView):
    """The chosen metric against layer, one curve per preset, min–max band over seeds."""

    state = param.ClassSelector(class_=SweepState)

    @param.depends("state.metrics", "controls.metric", "controls.site", "controls.scale", watch=True)
    def _changed(self) -> None:
        self.redraw()

    def specs(self):
        metrics, c = self.state.metrics, self.controls
        if metrics is None:
            return {}
        cfg, metric, site, scale = self.state.config, c.metric, c.site, c.scale
        settings = c.describe(cfg)

        def build():
            table = plots.metric_vs_depth_data(metrics, metric, site=site)
            logy = None if scale == "auto" else scale == "log"
            label = label_of(METRIC_LABELS, metric)
            where = "after each block" if site == "block" else "after attention"
            title = f"{label} {where} · {settings}"
            return _small_title(plots.metric_vs_depth(metrics, metric, site=site, logy=logy, title=title,
                                                      width=None, height=FIGURE_HEIGHT)), table

        return {"metric": (("metric", tuple(sorted(cfg.items())), metric, site, scale), build)}

    def _csv(self) -> io.BytesIO:
        if self.state.metrics is None:
            raise ConfigurationError("no sweep yet")
        return io.BytesIO(self.state.metrics.to_csv(index=False).encode())

    def _spectra_csv(self) -> io.BytesIO:
        if self.state.spectra is None:
            raise ConfigurationError("no sweep yet")
        return io.BytesIO(self.state.spectra.to_csv(index=False).encode())

    def _build(self) -> pn.viewable.Viewable:
        fig = self._pane("metric", min_height=FIGURE_HEIGHT)
        options = pn.Row(
            pn.pane.Markdown("hidden state after", margin=(0, 5, 0, 10), width=130, height=34, align="center",
                             sizing_mode="fixed"),
            _radio(self.controls.param.site, 280),
            pn.pane.Markdown("y scale", margin=(0, 5, 0, 30), width=70, height=34, align="center", sizing_mode="fixed"),
            _radio(self.controls.param.scale, 220),
            sizing_mode="stretch_width",
        )
        downloads = pn.Row(
            pn.widgets.FileDownload(callback=self._csv, filename="osa_sweep_metrics.csv",
                                    label="CSV: tidy metrics of this sweep", button_type="primary", embed=False,
                                    width=260),
            pn.widgets.FileDownload(callback=self._spectra_csv, filename="osa_sweep_spectra.csv",
                                    label="CSV: tidy spectra of this sweep", button_type="light", embed=False,
                                    width=260),
            self._png_download("metric", "rank_collapse.png"),
        )
        hidden = pn.pane.Markdown(pn.bind(self.hidden_note, self.state.param.metrics, self.controls.param.metric,
                                          self.controls.param.site, self.controls.param.scale),
                                  styles={"font-size": "12px"},
                                  sizing_mode="stretch_width", margin=(0, 10))
        return pn.Column(message_pane(self.job.param.error), options, fig, hidden, downloads,
                         sizing_mode="stretch_width", name="Rank collapse")

    @staticmethod
    def hidden_note(metrics: pd.DataFrame | None, metric: str, site: str, scale: str = "auto") -> str:
        """Which presets' curves lie under another's in the figure (means within
        :data:`osa_lab.reporting.texts.COINCIDE` of the y axis at every layer), so no curve is
        hidden silently."""
        if metrics is None:
            return ""
        from osa_lab.reporting.texts import COINCIDE, hidden_curves

        logy = None if scale == "auto" else scale == "log"
        pairs = hidden_curves(metrics, metric, site=site, logy=logy)
        if not pairs:
            return ""
        return markdown_literal(f"Hidden curves: {'; '.join(f'{a} lies under {b}' for a, b in pairs)} (means within "
                                f"{COINCIDE:.0%} of the y axis at every layer).")


class SpectraView(FigureView):
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

    @param.depends("state.spectra", "layers", "controls.site", watch=True)
    def _changed(self) -> None:
        self.redraw()

    def specs(self):
        spectra, c = self.state.spectra, self.controls
        if spectra is None:
            return {}
        cfg, site, layers = self.state.config, c.site, tuple(sorted(self.layers))
        n = len(cfg["presets"])
        width, cols = (max(250, 1000 // n), n) if n <= 3 else (320, 3)
        settings = c.describe(cfg)
        where = "after each block" if site == "block" else "after attention"
        key = tuple(sorted(cfg.items()))

        def heat():
            title = f"σᵢ/σ₁ across depth {where} · {settings}"
            return plots.spectra_heatmaps(spectra, site=site, title=title, panel_width=width, cols=cols), None

        def lines():
            title = f"normalised spectra of selected layers · {settings}"
            return plots.spectra_lines(spectra, layers=list(layers) or None, site=site, title=title,
                                       panel_width=width, cols=cols), None

        return {"heatmaps": (("heatmaps", key, site), heat), "lines": (("lines", key, site, layers), lines)}

    def _build(self) -> pn.viewable.Viewable:
        heat = self._pane("heatmaps", min_height=340)
        lines = self._pane("lines", min_height=380)
        chooser = pn.widgets.MultiChoice.from_param(self.param.layers, name="layers drawn as lines", width=400,
                                                    placeholder="none chosen: the input, ¼, ½ and the last layer")
        downloads = pn.Row(self._png_download("heatmaps", "spectra_heatmaps.png"),
                           self._png_download("lines", "spectra_lines.png"))
        return pn.Column(message_pane(self.job.param.error), heat, chooser, lines, downloads,
                         sizing_mode="stretch_width", name="Spectra")


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
        from dataclasses import replace

        from osa_lab.dashboard.state import DIMS, TOKENS

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
            fig = _small_title(plots.kappa_vs_depth(profile, scope=scope, title=title, width=None,
                                                    height=FIGURE_HEIGHT))
            return fig, plots.kappa_vs_depth_data(profile, scope=scope)

        def histogram():
            if svals is None:
                return placeholder(f"No histogram: the {algorithm} algorithm gives only σ_max and σ_min "
                                    f"(choose exact) · {settings}"), None
            title = f"Singular values of the end-to-end Jacobian [{algorithm}] · {settings}"
            return (_small_title(plots.jacobian_histogram(svals, title=title, width=None, height=HISTOGRAM_HEIGHT)),
                    plots.jacobian_histogram_data(svals))

        return {"kappa": (("kappa", key, scope), kappa), "histogram": (("histogram", key), histogram)}

    def badge(self, profile: pd.DataFrame | None) -> str:
        """Which computation produced the figures."""
        used = self.algorithms_used()
        if not used:
            return ""
        how = {"exact": "exact (torch.func.jacrev, all singular values)",
               "matrix-free": "matrix-free (jvp/vjp + Lanczos: σ_max and σ_min only)"}
        return "**Jacobian computed:** " + "; ".join(how.get(m, m) for m in used.split(", "))

    def _build(self) -> pn.viewable.Viewable:
        kappa = self._pane("kappa", min_height=FIGURE_HEIGHT)
        hist = self._pane("histogram", min_height=HISTOGRAM_HEIGHT)
        options = pn.Row(_radio(self.controls.param.jacobian, 330), _radio(self.controls.param.scope, 300))
        sizes = pn.Row(
            throttled(self.controls, "points", pn.widgets.IntSlider, name="layers evaluated", width=220),
            throttled(self, "seeds", pn.widgets.IntSlider, name="Jacobian seeds", width=180),
            pn.widgets.Button.from_param(self.param.compute, button_type="primary", width=170,
                                         disabled=self.param.running),
            pn.widgets.Button.from_param(self.param.cancel, button_type="danger", width=100,
                                         visible=self.param.running),
        )
        notice = pn.pane.Alert(self.param.notice, alert_type="info", visible=pn.bind(bool, self.param.notice),
                               sizing_mode="stretch_width")
        downloads = pn.Row(self._png_download("kappa", "jacobian_kappa.png"),
                           self._png_download("histogram", "jacobian_histogram.png"))
        return pn.Column(message_pane(self.job.param.error), notice, options, sizes,
                         pn.pane.Markdown(pn.bind(self.badge, self.param.profile)), kappa, hist, downloads,
                         sizing_mode="stretch_width", name="Jacobian")


class OSACheckView(pn.viewable.Viewer):
    """Badges with the OSA check of the current sizes: orthogonality and dense vs low-rank error."""

    controls = param.ClassSelector(class_=Controls)
    result = param.Dict(default=None, allow_None=True, doc="Last good osa_check result.")

    def __init__(self, compute_now: bool = True, **params):
        super().__init__(**params)
        self.job = Job()
        if compute_now:
            self.refresh()

    @param.depends("controls.tokens", "controls.dim", "controls.heads", "controls.derived_alpha", "controls.alpha",
                   "controls.presets", watch=True)
    def refresh(self) -> None:
        """Run the (cached) check for the current sizes (impossible sizes: the page says so once)."""
        c = self.controls
        try:
            c.validate()
            args = c.check_args()
        except ConfigurationError:
            return

        def compute():
            return compute_osa_check(*args)

        def apply(value):
            self.result = value

        self.job.run(compute, apply, lambda: CHECKS.get(args))

    @staticmethod
    def badges_html(result: dict | None) -> str:
        """HTML badges: ✓ on green within the check's tolerance, ✗ on red outside it (the mark,
        not the colour alone, says which); each badge's tooltip gives the tolerance, and a
        failed check is explained in a line below the badges."""
        if not result:
            return ""
        from osa_lab.studies.self_check import TOLERANCES

        labels = {
            "orthogonality_error": "‖AᵀA − I‖max",
            "dense_vs_lowrank": "dense vs low-rank",
            "lowrank_vs_float64": "low-rank vs float64",
            "norm_preservation": "norm preservation",
        }
        tolerances = next((t for d, t in TOLERANCES.items() if str(d).endswith(str(result["dtype"]))), {})
        parts, failed = [], []
        for key, label in labels.items():
            ok = result["passed"][key]
            colour = "#1a7f37" if ok else "#b42318"
            tol = tolerances.get(key)
            tip = (f"{'within' if ok else 'outside'} the {result['dtype']} tolerance {tol:.0e}" if tol is not None
                   else ("passed" if ok else "failed"))
            if not ok:
                failed.append(f"{label} {result[key]:.1e} > {tol:.0e}" if tol is not None else label)
            parts.append(
                f'<span class="osa-badge" data-check="{key}" data-passed="{str(ok).lower()}" title="{html.escape(tip)}" '
                'style="display:inline-block;margin:2px 6px 2px 0;'
                f'padding:3px 10px;border-radius:12px;background:{colour};color:white;font-size:13px">'
                f"{'✓' if ok else '✗'} {label}: {result[key]:.1e}</span>"
            )
        alpha = result["alpha"]
        meta = (f'<span style="font-size:12px;color:#555">OSA check at N={result["tokens"]}, d={result["dim"]}, '
                f'heads={result["heads"]}, α={alpha:.3g}, {result["dtype"]}, method {result["method"]}</span>')
        note = ""
        if failed:
            note = ('<div class="osa-check-note" style="font-size:12px;color:#b42318;margin-top:2px">✗ outside the '
                    f"tolerance: {html.escape('; '.join(failed))}. The check runs the OSA operator in "
                    f"{html.escape(str(result['dtype']))} at these N, d and α; its rounding error grows with "
                    "‖S‖₂ (α and the size of the tokens), so a large α or N can exceed the tolerance.</div>")
        return "<div>" + "".join(parts) + meta + note + "</div>"

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.HTML(pn.bind(self.badges_html, self.param.result), sizing_mode="stretch_width",
                         loading=self.job.param.busy, min_height=30),
            message_pane(self.job.param.error),
            sizing_mode="stretch_width",
        )



def throttled(obj: param.Parameterized, pname: str, widget_type: type, **kwargs) -> pn.widgets.Widget:
    """A slider for ``obj.<name>`` that sets the parameter when released (``value_throttled``)
    and follows it when it changes elsewhere (URL, code)."""
    name = pname
    p = obj.param[name]
    if widget_type is pn.widgets.DiscreteSlider:
        widget = widget_type(options=list(p.objects), value=getattr(obj, name), **kwargs)
    else:
        lo, hi = p.bounds
        widget = widget_type(start=lo, end=hi, value=getattr(obj, name), **kwargs)

    def push(event) -> None:
        if event.new is not None and event.new != getattr(obj, name):
            setattr(obj, name, event.new)

    widget.param.watch(push, "value_throttled" if widget_type is not pn.widgets.DiscreteSlider else "value")
    obj.param.watch(lambda e: setattr(widget, "value", e.new), name)
    return widget
