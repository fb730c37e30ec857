"""What every view of the dashboard shares: the figure pane base class and its helpers.

* :class:`FigureView`: a tab's view that draws its figures only while the tab is visible, from
  the process-wide figure cache (:data:`osa_lab.dashboard.caches.FIGURES`), as data updates of
  the figure on screen when only the data differ, with PNG and SVG downloads of what is shown;
* :func:`placeholder` / :func:`is_placeholder`: a message in place of a figure;
* :func:`message_pane`, :func:`radio_buttons`, :func:`throttled`: widgets the views and the
  page's sidebar share.

The views themselves live one per tab: :mod:`osa_lab.dashboard.rank_view`,
:mod:`osa_lab.dashboard.spectra_view`, :mod:`osa_lab.dashboard.jacobian_view` and
:mod:`osa_lab.dashboard.check_view`.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Callable
from typing import Any

import holoviews as hv
import pandas as pd
import panel as pn
import param

from osa_lab.dashboard.caches import FIGURES
from osa_lab.dashboard.state import FIGURE_LOCK, Controls, Job, in_daemon_thread, is_served, markdown_literal
from osa_lab.errors import ConfigurationError
from osa_lab.plots import depth as plots
from osa_lab.plots.style import with_options

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


def radio_buttons(parameter: param.Parameter, width: int) -> pn.widgets.RadioButtonGroup:
    """A radio group whose selected option is filled in the accent colour (others outlined)."""
    return pn.widgets.RadioButtonGroup.from_param(parameter, color="primary", variant="outline",
                                                  width=width, height=34, sizing_mode="fixed")


#: Height in pixels of the line figures (rank collapse, κ across depth); they take the page's
#: width, after data updates too (a fixed width would shrink them on the first slider move).
FIGURE_HEIGHT = 380
#: Height in pixels of the Jacobian singular-value histogram.
HISTOGRAM_HEIGHT = 360


def small_title(obj: hv.core.Dimensioned) -> hv.core.Dimensioned:
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
            filename=f"{stem}.{format}", label=label, color="light", embed=False, width=260 if format == "png" else 70,
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

    widget.param.watch(push, "value_throttled")  # on release: a drag or held arrow key is one change, not many
    obj.param.watch(lambda e: setattr(widget, "value", e.new), name)
    return widget
