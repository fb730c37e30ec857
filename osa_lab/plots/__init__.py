"""Shared plot builders: HoloViews objects built from osa_lab's tidy tables.

Notebooks and the dashboard draw only through these builders (docs/design.md §6). Each module
takes the long-format DataFrames that the analyses return:

* :mod:`osa_lab.plots.depth`: rank collapse, spectra and Jacobian conditioning across depth.
* :mod:`osa_lab.plots.expm`: accuracy and timing of the matrix-exponential methods.
* :mod:`osa_lab.plots.training`: learning curves and training diagnostics.

Render to bokeh (interactive, hover) or to matplotlib (static PNG) with ``holoviews.render``.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["PRESET_COLOURS", "preset_colour", "colour_map"]

#: One fixed colour per model preset, used by every figure (dashboard, reports, training plots),
#: so a preset keeps its colour whatever else is shown and in whatever order it was picked.
#: Okabe–Ito colours (colour-blind safe): SSA variants in warm colours, OSA variants in blues.
PRESET_COLOURS: dict[str, str] = {
    "vit": "#555555",
    "skipless-ssa": "#D55E00",
    "skipless-osa": "#0072B2",
    "pure-ssa": "#E69F00",
    "pure-osa": "#56B4E9",
    "ssa-cutting-skip": "#CC79A7",
    "ssa-value-skipinit": "#009E73",
}

#: Colours for anything that is not a preset (layers, dtypes, …), in order of appearance.
_OTHER = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#999999"]


def preset_colour(name: str) -> str:
    """The fixed colour of preset ``name`` (a stable colour derived from the name for others)."""
    if name in PRESET_COLOURS:
        return PRESET_COLOURS[name]
    return _OTHER[sum(ord(c) for c in str(name)) % len(_OTHER)]


def colour_map(groups: Iterable[object]) -> dict[object, str]:
    """Colours for the values of a grouping column.

    When every value is a preset name each gets its fixed :data:`PRESET_COLOURS` entry;
    otherwise (layers, token counts, …) the values get distinct colours in order of appearance.
    """
    groups = list(dict.fromkeys(groups))
    if groups and all(str(g) in PRESET_COLOURS for g in groups):
        return {g: PRESET_COLOURS[str(g)] for g in groups}
    return {g: _OTHER[i % len(_OTHER)] for i, g in enumerate(groups)}
