"""The *Rank collapse* tab: the chosen metric against layer, one curve per preset, mean and band
over seeds (:class:`RankCollapseView`), with the sweep's tidy tables as CSV downloads."""

from __future__ import annotations

import io

import pandas as pd
import panel as pn
import param

from osa_lab.dashboard.figure_view import (
    FIGURE_HEIGHT,
    FigureView,
    message_pane,
    radio_buttons,
    small_title,
)
from osa_lab.dashboard.state import METRIC_LABELS, label_of, markdown_literal
from osa_lab.dashboard.sweep import SweepState
from osa_lab.errors import ConfigurationError
from osa_lab.plots import depth as plots


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
            return small_title(plots.metric_vs_depth(metrics, metric, site=site, logy=logy, title=title,
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
            radio_buttons(self.controls.param.site, 280),
            pn.pane.Markdown("y scale", margin=(0, 5, 0, 30), width=70, height=34, align="center", sizing_mode="fixed"),
            radio_buttons(self.controls.param.scale, 220),
            sizing_mode="stretch_width",
        )
        downloads = pn.Row(
            pn.widgets.FileDownload(callback=self._csv, filename="osa_sweep_metrics.csv",
                                    label="CSV: tidy metrics of this sweep", color="primary", embed=False,
                                    width=260),
            pn.widgets.FileDownload(callback=self._spectra_csv, filename="osa_sweep_spectra.csv",
                                    label="CSV: tidy spectra of this sweep", color="light", embed=False,
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
