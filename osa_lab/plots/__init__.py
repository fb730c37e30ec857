"""Shared plot builders: HoloViews objects built from osa_lab's tidy tables.

Notebooks and the dashboard draw only through these builders (DESIGN.md §6). Each module
takes the long-format DataFrames that the analyses return:

* :mod:`osa_lab.plots.depth`: rank collapse, spectra and Jacobian conditioning across depth.
* :mod:`osa_lab.plots.expm`: accuracy and timing of the matrix-exponential methods.
* :mod:`osa_lab.plots.training`: learning curves and training diagnostics.

Render to bokeh (interactive, hover) or to matplotlib (static PNG) with ``holoviews.render``.
"""
