"""Shared plot builders: HoloViews objects built from osa_lab's tidy tables.

Notebooks and the dashboard draw only through these builders (docs/design.md §6). Each module
takes the long-format DataFrames that the analyses return:

* :mod:`osa_lab.plots.style`: palette, log-axis limits, backends, helpers shared by the builders.
* :mod:`osa_lab.plots.depth`: rank collapse, spectra and Jacobian conditioning across depth.
* :mod:`osa_lab.plots.expm`: accuracy and timing of the matrix-exponential methods.
* :mod:`osa_lab.plots.training`: learning curves and training diagnostics.
* :mod:`osa_lab.plots.layout`: the layout rules of the report figures (width, legends) and their check.

Render to bokeh (interactive, hover) or to matplotlib (static PNG) with ``holoviews.render``.
"""

from __future__ import annotations

from osa_lab.extras import require_lab

require_lab("osa_lab.plots")  # before the builders import holoviews: a missing extra is named

from osa_lab.plots.style import OTHER_COLOURS, PRESET_COLOURS, colour_map, preset_colour  # noqa: E402

__all__ = ["OTHER_COLOURS", "PRESET_COLOURS", "preset_colour", "colour_map"]
