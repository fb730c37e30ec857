"""The house style of every figure: palette, log-axis limits, backends and shared helpers.

Every plot builder (:mod:`osa_lab.plots.depth`, :mod:`osa_lab.plots.expm`,
:mod:`osa_lab.plots.training`) and the dashboard draw through these, so a preset keeps its colour
and a log axis its limits wherever it appears (docs/design.md §6).

* palette: :data:`PRESET_COLOURS`, :func:`preset_colour`, :func:`colour_map`, :data:`PALETTE`;
* log axes: :data:`LOG_FLOOR`, :data:`LOG_CEILING`, :func:`spans_decades`;
* backends: :func:`ensure_backends` (bokeh + matplotlib, called once at import);
* helpers: :func:`require_columns`, :func:`dual_options`, :func:`band_over_seeds`,
  :func:`curves_with_bands`, :func:`integer_xticks`, :func:`bars_by_preset`, :func:`wide_figure`.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import holoviews as hv
import numpy as np
import pandas as pd

from osa_lab.errors import OSAInputError

__all__ = [
    "LOG_CEILING",
    "LOG_FLOOR",
    "OTHER_COLOURS",
    "PALETTE",
    "PRESET_COLOURS",
    "PRESET_STYLES",
    "PresetStyle",
    "band_over_seeds",
    "bars_by_preset",
    "bokeh_size",
    "colour_map",
    "curves_with_bands",
    "dual_options",
    "ensure_backends",
    "integer_xticks",
    "is_integral",
    "preset_colour",
    "preset_style",
    "require_columns",
    "spans_decades",
    "stacked",
    "wide_figure",
]

# --------------------------------------------------------------------------------------------
# palette
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PresetStyle:
    """How one preset is drawn in every figure: colour, line dash and marker.

    ``dash`` is a name both backends know (``"solid"``, ``"dashed"``, ``"dotted"``,
    ``"dashdot"``); ``marker`` is a matplotlib marker (static figures draw it at each point).
    """

    colour: str
    dash: str
    marker: str


#: One fixed style per model preset and training control, used by every figure (dashboard,
#: reports, training plots), so a preset keeps its look whatever else is shown and in whatever
#: order it was picked. Colours are colour-blind safe (Okabe & Ito 2008 for the seven sweep
#: presets, Paul Tol's "muted" scheme for the controls and baselines): SSA variants in warm
#: colours, OSA variants in blues; a control draws dashed or dotted with its own marker, so it
#: stays apart from its model where colour vision or a grey-scale print cannot tell two
#: colours apart (tested in tests/plots/test_plots.py).
PRESET_STYLES: dict[str, PresetStyle] = {
    "vit": PresetStyle("#000000", "solid", "o"),
    "skipless-ssa": PresetStyle("#D55E00", "solid", "s"),
    "skipless-osa": PresetStyle("#0072B2", "solid", "^"),
    "skipless-osa-shaped": PresetStyle("#204C60", "solid", "d"),
    "skipless-ssa-shaped": PresetStyle("#532060", "solid", "p"),
    "pure-ssa": PresetStyle("#E69F00", "solid", "D"),
    "pure-osa": PresetStyle("#56B4E9", "solid", "v"),
    "ssa-cutting-skip": PresetStyle("#CC79A7", "solid", "P"),
    "ssa-value-skipinit": PresetStyle("#009E73", "solid", "X"),
    "skipless-osa-alpha0": PresetStyle("#332288", "dashed", "<"),
    "vit-no-attn": PresetStyle("#999999", "dashed", ">"),
    "mlp": PresetStyle("#999933", "dotted", "h"),
    "cnn1d": PresetStyle("#882255", "dashdot", "*"),
}

#: The fixed colour of each preset (:data:`PRESET_STYLES`).
PRESET_COLOURS: dict[str, str] = {name: style.colour for name, style in PRESET_STYLES.items()}

#: Colours for anything that is not a preset (layers, dtypes, …), in order of appearance.
OTHER_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#999999"]
#: Dashes for groups that are not presets, in order of appearance (with :data:`OTHER_COLOURS`).
OTHER_DASHES = ["solid", "dashed", "dotted", "dashdot"]


def preset_style(name: str) -> PresetStyle:
    """The fixed :class:`PresetStyle` of preset ``name`` (a stable one derived from the name for
    others)."""
    if name in PRESET_STYLES:
        return PRESET_STYLES[name]
    h = sum(ord(c) for c in str(name))
    return PresetStyle(OTHER_COLOURS[h % len(OTHER_COLOURS)], OTHER_DASHES[(h // len(OTHER_COLOURS)) % 4], "o")


def preset_colour(name: str) -> str:
    """The fixed colour of preset ``name`` (a stable colour derived from the name for others)."""
    return preset_style(name).colour


def colour_map(groups: Iterable[object]) -> dict[object, str]:
    """Colours for the values of a grouping column.

    Every preset name gets its fixed :data:`PRESET_COLOURS` entry, whatever else is in the
    group and in whatever order; other values (layers, token counts, …) get distinct colours in
    order of appearance, skipping the colours the presets present already use.
    """
    groups = list(dict.fromkeys(groups))
    out: dict[object, str] = {g: PRESET_COLOURS[str(g)] for g in groups if str(g) in PRESET_COLOURS}
    free = [c for c in OTHER_COLOURS if c not in set(out.values())] or OTHER_COLOURS
    others = [g for g in groups if g not in out]
    out.update({g: free[i % len(free)] for i, g in enumerate(others)})
    return {g: out[g] for g in groups}


#: Colour per preset, stable across figures (Okabe–Ito, colour-blind safe).
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]

#: Smallest positive value shown on log axes / log colour scales (values below are clipped).
LOG_FLOOR = 1e-16

#: Largest value drawn on log axes: 1/ε of float64. Condition numbers above it are unresolved
#: (the smallest singular value is rounding noise) and +inf means rank deficient; both are drawn
#: at this ceiling (matplotlib's log ticks also overflow near 1e278).
LOG_CEILING = float(1.0 / np.finfo(np.float64).eps)


# --------------------------------------------------------------------------------------------
# backends
# --------------------------------------------------------------------------------------------

_backend_lock = threading.Lock()


def ensure_backends() -> None:
    """Register the bokeh and matplotlib plotting backends of HoloViews (idempotent, no output).

    Options for a backend can only be set once its plotting module is imported; this imports
    both without calling ``hv.extension`` (which would print notebook output) and without
    changing ``hv.Store.current_backend``.
    """
    with _backend_lock:
        current = hv.Store.current_backend
        if "bokeh" not in hv.Store.renderers:
            import holoviews.plotting.bokeh  # noqa: F401
        if "matplotlib" not in hv.Store.renderers:
            # The user's matplotlib backend is left as it is (a headless process falls back to
            # Agg by itself); switching it here would be process-wide state set by an import.
            import holoviews.plotting.mpl  # noqa: F401
        hv.Store.current_backend = current


ensure_backends()


# --------------------------------------------------------------------------------------------
# helpers shared by the builders
# --------------------------------------------------------------------------------------------


def require_columns(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    """Raise :class:`~osa_lab.errors.OSAInputError` unless ``df`` is a non-empty DataFrame with ``columns``."""
    if not isinstance(df, pd.DataFrame):
        raise OSAInputError(f"{what} must be a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise OSAInputError(
            f"{what} lacks column(s) {missing}; it has {list(df.columns)} (see osa_lab.plots.depth docs)"
        )
    if df.empty:
        raise OSAInputError(f"{what} is empty: nothing to plot")


#: The figures' background: Bokeh's default ``border_fill_color``.
CANVAS_BACKGROUND = "#ffffff"

#: Bokeh options of every spectra panel (:func:`with_clean_edges`, applied by
#: ``spectra_heatmaps`` and ``spectra_lines``): a border line in the background colour along the
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


#: Legend entries an overlay shows before HoloViews drops its legend (its default, 25, is less than
#: every preset's curve and band together).
LEGEND_LIMIT = 100


def dual_options(obj, bokeh: dict, mpl: dict):
    """Set options for the bokeh and the matplotlib backend on ``obj`` (returns the object); an
    overlay keeps its legend up to :data:`LEGEND_LIMIT` entries."""
    if isinstance(obj, hv.Overlay):
        bokeh, mpl = {"legend_limit": LEGEND_LIMIT, **bokeh}, {"legend_limit": LEGEND_LIMIT, **mpl}
    return obj.opts(backend="bokeh", **bokeh).opts(backend="matplotlib", **mpl)


def spans_decades(values: np.ndarray | pd.Series, decades: float = 2.0) -> bool:
    """True when no finite value is negative and the positive ones span more than ``decades``.

    Exact zeros (complete collapse, e.g. identical tokens) count as :data:`LOG_FLOOR`, where log
    axes clip them. The builders use log axes exactly when this holds (``logy=None``).
    """
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0 or (v < 0).any() or not (v > 0).any():
        return False
    v = np.where(v > 0, v, LOG_FLOOR)
    return bool(np.log10(v.max() / v.min()) > decades)


def band_over_seeds(df: pd.DataFrame, x: str, y: str, by: Sequence[str] = ("preset",)) -> pd.DataFrame:
    """Mean, min, max, std and count of ``y`` over seeds (and any other rows) per ``by`` × ``x``.

    ``+inf`` (e.g. the condition number of a rank-deficient matrix) counts as
    :data:`LOG_CEILING`; NaN is left out of the statistics and ``n`` counts the rest.

    Returns columns ``*by, x, mean, lo, hi, std, n`` sorted by ``by`` then ``x``; ``lo``/``hi``
    are the min/max over seeds (the band drawn around the mean).
    """
    require_columns(df, [*by, x, y], "table")
    vals = df[y].to_numpy(dtype=float)
    if not np.isfinite(vals).all():  # +inf → ceiling, -inf / NaN → left out
        vals = np.where(np.isposinf(vals), LOG_CEILING, np.where(np.isfinite(vals), vals, np.nan))
        df = df.assign(**{y: vals})
    g = df.groupby([*by, x], sort=False)[y]
    out = g.agg(mean="mean", lo="min", hi="max", std="std", n="count").reset_index()
    out["std"] = out["std"].fillna(0.0)
    order = {p: i for i, p in enumerate(dict.fromkeys(df[by[0]].tolist()))}
    out["_o"] = out[by[0]].map(order)
    return out.sort_values(["_o", *by[1:], x]).drop(columns="_o").reset_index(drop=True)


def is_integral(values: np.ndarray | pd.Series | Sequence[float]) -> bool:
    """True when every finite value is a whole number (layers, depths, epochs, steps, …)."""
    v = np.asarray(values)
    if v.dtype.kind in "iu":
        return v.size > 0
    if v.dtype.kind != "f":
        return False
    v = v[np.isfinite(v)]
    return bool(v.size and np.all(v == np.round(v)))


def _bokeh_integer_xticks(plot, element) -> None:
    """Bokeh hook: integer ticks (1, 2, 5, 10, … layers apart) on the x axis and its grid."""
    from bokeh.models import AdaptiveTicker

    fig = plot.state
    if not hasattr(fig, "xaxis"):
        return
    for axis in fig.xaxis:
        if getattr(axis.ticker, "min_interval", 0) >= 1 and getattr(axis.ticker, "num_minor_ticks", 1) == 0:
            continue  # already integer (a data update of the same figure)
        ticker = AdaptiveTicker(min_interval=1, mantissas=[1, 2, 5], num_minor_ticks=0)
        axis.ticker = ticker
        for grid in fig.xgrid:
            grid.ticker = ticker


def _mpl_integer_xticks(plot, element) -> None:
    """Matplotlib hook: integer ticks on the x axis (``MaxNLocator(integer=True)`` with the tick
    density of matplotlib's default ``AutoLocator``)."""
    from matplotlib.ticker import MaxNLocator

    axis = plot.handles.get("axis")
    if axis is not None:
        axis.xaxis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], integer=True))


def integer_xticks(obj):
    """Integer-only ticks on the x axis of ``obj`` in both backends (returns ``obj``).

    A layer, depth or epoch axis must not show half or quarter layers. Matplotlib
    gets a ``MaxNLocator(integer=True)``; bokeh an ``AdaptiveTicker(min_interval=1)`` installed
    by a hook on each element (element level, so the hook survives the dashboard's DynamicMap,
    whose own options replace the overlay's hooks), which keeps integer ticks when zoomed.
    """
    targets = list(obj) if isinstance(obj, hv.Overlay) else [obj]
    for el in targets:
        hooks = list(hv.Store.lookup_options("bokeh", el, "plot").kwargs.get("hooks", []) or [])
        if _bokeh_integer_xticks not in hooks:
            el.opts(hooks=[*hooks, _bokeh_integer_xticks], backend="bokeh")
    hooks = list(hv.Store.lookup_options("matplotlib", obj, "plot").kwargs.get("hooks", []) or [])
    if _mpl_integer_xticks not in hooks:
        obj.opts(hooks=[*hooks, _mpl_integer_xticks], backend="matplotlib")
    return obj


def named_xticks(obj, ticks: list[tuple[int, str]], xlabel: str):
    """Named ticks at fixed x positions in both backends (returns ``obj``), for an x axis of categories
    drawn at whole numbers (sub-blocks along a network): :func:`integer_xticks`' hooks, which
    :func:`curves_with_bands` installs, are taken off, since their locator would move the ticks away
    from their names."""
    targets = list(obj) if isinstance(obj, hv.Overlay) else [obj]
    for el in targets:
        hooks = list(hv.Store.lookup_options("bokeh", el, "plot").kwargs.get("hooks", []) or [])
        el.opts(hooks=[h for h in hooks if h is not _bokeh_integer_xticks], backend="bokeh")
    hooks = list(hv.Store.lookup_options("matplotlib", obj, "plot").kwargs.get("hooks", []) or [])
    obj.opts(hooks=[h for h in hooks if h is not _mpl_integer_xticks], backend="matplotlib")
    return obj.opts(xticks=ticks, xlabel=xlabel, backend="bokeh").opts(xticks=ticks, xlabel=xlabel, backend="matplotlib")


def _mpl_colour_bars(plot, element) -> None:
    """Matplotlib hook of :func:`bars_by_preset`: colour each bar by its preset.

    HoloViews' matplotlib bars take one style per category, so a per-bar colour is set here:
    the bars of a container follow the first key dimension's declared ``values`` (the presets
    in order); a second key dimension (grouped bars) draws its later categories lighter and
    hatched.
    """
    order = list(element.kdims[0].values)
    containers = plot.handles.get("artist") or []
    for c, container in enumerate(containers):
        for preset, patch in zip(order, container.patches, strict=False):
            patch.set_facecolor(preset_colour(str(preset)))
            patch.set_alpha(1.0 if c == 0 else 0.45)
            if c:
                patch.set_hatch("//")
            patch.set_edgecolor("white" if c else "none")


def bars_by_preset(bars: hv.Bars) -> hv.Bars:
    """Colour each bar of ``bars`` (first key dimension: preset) by the preset's fixed colour.

    Both backends: bokeh through a ``dim`` colour mapping (grouped bars: later categories of the
    second key dimension lighter), matplotlib through :func:`_mpl_colour_bars`. The preset
    dimension gets explicit ``values`` (its order of appearance) so both draw the same order.
    """
    pdim = bars.kdims[0]
    presets = list(dict.fromkeys(bars.dimension_values(pdim).tolist()))
    bars = bars.redim.values(**{pdim.name: presets})
    colours = {p: preset_colour(str(p)) for p in presets}
    bokeh: dict[str, object] = dict(color=hv.dim(pdim.name).categorize(colours))
    if len(bars.kdims) > 1:
        cats = list(dict.fromkeys(bars.dimension_values(bars.kdims[1]).tolist()))
        bokeh["alpha"] = hv.dim(bars.kdims[1].name).categorize({c: 1.0 if i == 0 else 0.45 for i, c in enumerate(cats)})
        bokeh["show_legend"] = False
    return dual_options(bars, bokeh, dict(hooks=[_mpl_colour_bars], show_legend=False))


def bokeh_size(width: int | None, height: int) -> dict[str, object]:
    """Bokeh size options: ``width`` × ``height`` pixels, or (``width=None``) the container's
    width at ``height`` pixels (``responsive``; a fixed width would win over it)."""
    return dict(width=width, height=height) if width is not None else dict(responsive=True, height=height)


def curves_with_bands(
    data: pd.DataFrame,
    x: str,
    ylabel: str,
    title: str,
    logy: bool,
    logx: bool = False,
    group: str = "preset",
    width: int | None = 520,
    height: int = 340,
    extra: Sequence[hv.Element] = (),
    colours: dict[object, str] | None = None,
    dashes: dict[object, str] | None = None,
) -> hv.Overlay:
    """One curve (mean) and one shaded band (min–max) per ``group`` value (then ``extra`` elements).

    Each band takes its curve's colour in both backends (``colours``, default :func:`colour_map`,
    so a preset has its fixed colour); a preset's curve has its fixed dash and (matplotlib)
    marker (:data:`PRESET_STYLES`), ``dashes`` (``"solid"``, ``"dashed"``, …) per group value
    replaces them. An x axis of whole numbers (layers, epochs, steps) gets integer ticks
    (:func:`integer_xticks`). ``width=None`` makes the bokeh figure stretch to its container's
    width at ``height`` (``responsive``), also when a dashboard updates its data. The static
    (matplotlib) figure is :func:`wide_figure`: wide axes, the legend right of them.
    """
    groups = list(dict.fromkeys(data[group].tolist()))
    colours = {**colour_map(groups), **(colours or {})}
    dashes = {**{g: PRESET_STYLES[str(g)].dash for g in groups if str(g) in PRESET_STYLES}, **(dashes or {})}
    markers = {g: PRESET_STYLES[str(g)].marker if str(g) in PRESET_STYLES else "o" for g in groups}
    elements = []
    ydim = hv.Dimension("mean", label=ylabel)
    for g in groups:
        d = data[data[group] == g].copy()
        if logy:
            for c in ("mean", "lo", "hi"):
                d[c] = d[c].clip(lower=LOG_FLOOR, upper=LOG_CEILING)
        label = str(g)
        vdims = [ydim, "lo", "hi", "n", group]
        colour = colours[g]
        # matplotlib's Area defaults to facecolor=Cycle(), which wins over `color`: set both
        area = dual_options(
            hv.Area((d[x], d["lo"], d["hi"]), x, [ydim, "hi"], label=label),
            dict(color=colour, fill_color=colour, alpha=0.2, line_width=0),
            dict(color=colour, facecolor=colour, alpha=0.2, linewidth=0),
        )
        dash = dashes.get(g, "solid")
        curve = dual_options(
            hv.Curve(d, x, vdims, label=label),
            dict(color=colour, line_width=2, line_dash=dash, tools=["hover"], hover_line_width=3),
            dict(color=colour, linewidth=2, linestyle=dash, marker=markers[g]),
        )
        elements += [area, curve]
    elements += list(extra)
    lims: dict[str, object] = {}
    if logy:  # a log axis spanning the data (HoloViews would pad down towards the band's base)
        vals = data[["mean", "lo", "hi"]].to_numpy(dtype=float).ravel()
        vals = np.clip(vals[np.isfinite(vals)], LOG_FLOOR, LOG_CEILING)
        if vals.size:
            lo, hi = float(vals.min()), float(vals.max())
            # headroom of 5 % of the decades shown (at least ×2), so markers at the extremes
            # (e.g. κ at the float64 ceiling) are not cut by the frame
            pad = max(2.0, 10 ** (0.05 * math.log10(hi / lo)))
            lims["ylim"] = (lo / pad, hi * pad)
    xs = data[x].to_numpy(dtype=float)
    integral_x = not logx and is_integral(xs)  # layers, epochs, steps
    if integral_x:  # whole markers at the first and last layer
        xs = xs[np.isfinite(xs)]
        x_pad = max(0.3, 0.03 * float(xs.max() - xs.min()))
        lims["xlim"] = (float(xs.min()) - x_pad, float(xs.max()) + x_pad)
    overlay = dual_options(
        hv.Overlay(elements),
        dict(
            **lims,
            title=title,
            logy=logy,
            logx=logx,
            legend_position="right",
            **bokeh_size(width, height),
            show_grid=True,
        ),
        dict(**lims, title=title, logy=logy, logx=logx, legend_position="right", fig_inches=(6, 3.6),
             show_grid=True),
    )
    if any(dashes.get(g, "solid") != "solid" for g in groups):  # long enough legend lines to show the dash
        overlay.opts(legend_opts={"handlelength": 4.0}, backend="matplotlib")
    if integral_x:
        integer_xticks(overlay)
    return wide_figure(overlay)  # a static figure at least 600 px wide, its legend beside the axes


def mpl_wide_axes(plot, element) -> None:
    """matplotlib hook of :func:`wide_figure`: axes 2.2× as wide as tall, whatever their scales
    (HoloViews' numeric ``aspect`` is a data ratio, which squeezes a log axis)."""
    ax = plot.handles["axis"]
    ax.set_aspect("auto")
    ax.set_box_aspect(1 / 2.2)


def wide_figure(overlay: hv.Overlay, inches: tuple[float, float] = (9.5, 3.8)) -> hv.Overlay:
    """``overlay`` as a wide static figure (matplotlib): ``inches`` (9.5 inches: 855 px in the
    reports), axes about 2.2× as wide as tall, the legend right of the axes. Hooks already set
    (e.g. :func:`integer_xticks`) are kept; the bokeh options are left as they are."""
    hooks = list(hv.Store.lookup_options("matplotlib", overlay, "plot").kwargs.get("hooks", []) or [])
    if mpl_wide_axes not in hooks:
        hooks.append(mpl_wide_axes)
    return overlay.opts(fig_inches=inches, hooks=hooks, legend_position="right", backend="matplotlib")


def stacked(panels: Sequence[hv.Overlay]) -> hv.Layout:
    """Wide panels (:func:`wide_figure`) in one column, each with its own axes and legend; the
    static figure keeps each panel's size (side by side, a panel's legend would lie over its
    neighbour; without a size, matplotlib squeezes the panels into one default-sized figure)."""
    width, height = 9.5, 3.8
    layout = hv.Layout([wide_figure(p, (width, height)) for p in panels]).cols(1)
    return dual_options(layout, dict(shared_axes=False),
                        dict(shared_axes=False, sublabel_format="", fig_inches=(width, height * len(panels))))


#: what HoloViews raises when two threads clean up the bookkeeping of the same options tree at once
#: (a garbage-collection race on ``Store._weakrefs``, not a property of the figure)
_OPTIONS_CLEANUP_RACE = "Cleanup of custom options tree"


def with_options(obj, attempts: int = 3, backend: str = "bokeh", **options):
    """``obj.opts(**options, backend=backend, clone=True)``, tried again when HoloViews' options
    cleanup races with another thread (the operation only clones, so repeating it is safe); the
    dashboard prepares figures off the event loop, where that race happens."""
    for attempt in range(attempts):
        try:
            return obj.opts(**options, backend=backend, clone=True)
        except RuntimeError as err:
            if _OPTIONS_CLEANUP_RACE not in str(err) or attempt == attempts - 1:
                raise
            logging.getLogger(__name__).info("HoloViews options cleanup raced with another thread; applying again")
    raise AssertionError("unreachable")
