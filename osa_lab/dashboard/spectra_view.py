"""The *Spectra* tab: singular-value spectra across depth, heatmaps per preset on a shared log
colour scale and selected layers as lines (:class:`SpectraView`)."""

from __future__ import annotations

import holoviews as hv
import panel as pn
import param

from osa_lab.dashboard.figure_view import FigureView, message_pane
from osa_lab.dashboard.sweep import SweepState
from osa_lab.plots import depth as plots

#: The figures' background: Bokeh's default ``border_fill_color``.
CANVAS_BACKGROUND = "#ffffff"

#: Bokeh options of every spectra panel: a border line in the background colour along the
#: canvas's edge, repainted with every paint. A panel of these fixed-size grids is painted once at
#: a provisional layout (every label piled up at the canvas's top-left corner) before its final
#: one, on the same canvas; BokehJS clears a canvas half a pixel in (it translates by
#: (0.5, 0.5) before ``clearRect``), so without this line that first paint's marks stayed in the
#: outermost column and row as a sliver at the left edge of each heatmap. The line is 2 px wide
#: (centred half a pixel in, it covers the outermost column and row whole, the corner pixel
#: included, which a 1-px line leaves partly uncovered) and lies in the canvas's empty margin.
CLEAN_EDGE_OPTIONS = {"plot.border_line_color": CANVAS_BACKGROUND, "plot.border_line_width": 2,
                      "plot.border_line_alpha": 1.0, "plot.border_line_join": "miter"}


def with_clean_edges(layout: hv.Layout) -> hv.Layout:
    """``layout`` with :data:`CLEAN_EDGE_OPTIONS` on each panel (heatmap or line overlay), in place."""
    for panel in layout:
        panel.opts(backend_opts=CLEAN_EDGE_OPTIONS, backend="bokeh")
    return layout


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
            return with_clean_edges(plots.spectra_heatmaps(spectra, site=site, title=title, panel_width=width,
                                                           cols=cols)), None

        def lines():
            title = f"normalised spectra of selected layers · {settings}"
            return with_clean_edges(plots.spectra_lines(spectra, layers=list(layers) or None, site=site,
                                                        title=title, panel_width=width, cols=cols)), None

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
