"""The *Spectra* tab: singular-value spectra across depth, heatmaps per preset on a log colour
scale (one range for all with a chosen floor, or one per panel) and selected layers as lines
(:class:`SpectraView`)."""

from __future__ import annotations

import panel as pn
import param

from osa_lab.dashboard.figure_view import FigureView, message_pane, radio_buttons
from osa_lab.dashboard.sweep import SweepState
from osa_lab.plots import depth as plots


class SpectraView(FigureView):
    """Singular-value spectra across depth: heatmaps per preset and selected layers as lines."""

    state = param.ClassSelector(class_=SweepState)
    layers = param.ListSelector(default=[], objects=[], doc="Layers drawn as lines (empty: a default choice).")

    @param.depends("state.spectra", "controls.layers", watch=True, on_init=True)
    def _update_layers(self) -> None:
        """The chooser offers the sweep's layers and shows the URL's choice (``controls.layers``);
        layers the sweep does not have are left out, the others kept."""
        spectra = self.state.spectra
        if spectra is None:
            return
        available = sorted(int(x) for x in spectra["layer"].unique())
        self.param.layers.objects = available
        kept = [x for x in self.controls.layers if x in available]
        if kept != list(self.layers):
            self.layers = kept

    @param.depends("layers", watch=True)
    def _layers_to_controls(self) -> None:
        if self.state.spectra is not None and list(self.layers) != list(self.controls.layers):
            self.controls.layers = sorted(int(x) for x in self.layers)

    @param.depends("state.spectra", "layers", "controls.site", "controls.colours", "controls.floor", watch=True)
    def _changed(self) -> None:
        self.redraw()

    def specs(self):
        spectra, c = self.state.spectra, self.controls
        if spectra is None:
            return {}
        cfg, site, layers = self.state.config, c.site, tuple(sorted(self.layers))
        colours, floor = c.colours, c.floor
        n = len(cfg["presets"])
        width, cols = (max(250, 1000 // n), n) if n <= 3 else (320, 3)
        settings = c.describe(cfg)
        where = "after each block" if site == "block" else "after attention"
        key = tuple(sorted(cfg.items()))

        def heat():
            title = f"σᵢ/σ₁ across depth {where} · {settings}"
            return plots.spectra_heatmaps(spectra, site=site, title=title, panel_width=width, cols=cols,
                                          colour_range="shared" if colours == "shared" else "per panel",
                                          floor=None if floor == "auto" else float(floor)), None

        def lines():
            title = f"normalised spectra of selected layers · {settings}"
            return plots.spectra_lines(spectra, layers=list(layers) or None, site=site, title=title,
                                       panel_width=width, cols=cols), None

        return {"heatmaps": (("heatmaps", key, site, colours, floor), heat), "lines": (("lines", key, site, layers), lines)}

    def _build(self) -> pn.viewable.Viewable:
        heat = self._pane("heatmaps", min_height=340)
        options = pn.Row(
            pn.pane.Markdown("colour range", margin=(0, 5, 0, 10), width=110, height=34, align="center",
                             sizing_mode="fixed"),
            radio_buttons(self.controls.param.colours, 220),
            pn.pane.Markdown("colour floor", margin=(0, 5, 0, 30), width=110, height=34, align="center",
                             sizing_mode="fixed"),
            radio_buttons(self.controls.param.floor, 330),
            sizing_mode="stretch_width",
        )
        lines = self._pane("lines", min_height=380)
        chooser = pn.widgets.MultiChoice.from_param(self.param.layers, label="layers drawn as lines", width=400,
                                                    placeholder="none chosen: the input, ¼, ½ and the last layer")
        downloads = pn.Row(self._png_download("heatmaps", "spectra_heatmaps.png"),
                           self._png_download("lines", "spectra_lines.png"))
        return pn.Column(message_pane(self.job.param.error), options, heat, chooser, lines, downloads,
                         sizing_mode="stretch_width", name="Spectra")
