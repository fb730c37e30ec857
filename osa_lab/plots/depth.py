"""Plot builders for rank collapse, singular-value spectra and Jacobian conditioning across depth.

Shared by the Panel dashboard (``dashboards/osa_dashboard.py``, bokeh backend, hover tools) and
the report notebooks (matplotlib backend, static PNG), following docs/design.md §6 ("tidy tables
first, plots second"). Every builder takes one of the long-format tables of
:mod:`osa_lab.studies.depth` / :mod:`osa_lab.studies.jacobian` and returns a HoloViews object with options
set for **both** backends, so the same object renders with::

    hv.render(obj, backend="bokeh")        # interactive (dashboard)
    hv.render(obj, backend="matplotlib")   # a matplotlib Figure (notebooks)
    png_bytes(obj)                         # PNG through matplotlib (downloads, reports)

Tables (column names as produced by the analysis issue):

* metrics: ``preset, depth, tokens, dim, heads, alpha, seed, layer, site, metric, value``
* spectra: ``preset, depth, tokens, dim, heads, alpha, seed, layer, site, index, sigma,
  sigma_normalized``
* Jacobian profile: ``preset, depth, ..., seed, layer, scope, algorithm, sigma_max, sigma_min,
  kappa``
* Jacobian singular values: ``preset, ..., sigma`` (one row per singular value)

Builders reduce over seeds themselves (mean and a min–max band); the ``*_data`` helpers return
the reduced tables that a plot draws, so tests and notebooks can assert on exactly what is shown.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Sequence

import holoviews as hv
import numpy as np
import pandas as pd

from osa_lab.errors import OSAInputError
from osa_lab.plots.style import (
    LOG_CEILING,
    LOG_FLOOR,
    PALETTE,
    PRESET_COLOURS,
    band_over_seeds,
    bokeh_size,
    colour_map,
    curves_with_bands,
    dual_options,
    ensure_backends,
    integer_xticks,
    require_columns,
    spans_decades,
    with_clean_edges,
)

__all__ = [
    "COLOUR_RANGES",
    "LOG_CEILING",
    "LOG_FLOOR",
    "ensure_backends",
    "PALETTE",
    "PRESET_COLOURS",
    "band_over_seeds",
    "jacobian_histogram",
    "jacobian_histogram_data",
    "kappa_vs_depth",
    "kappa_vs_depth_data",
    "kappa_vs_parameter",
    "beyond_float64",
    "EXPORT_DPI",
    "figure_bytes",
    "figure_title",
    "metric_vs_depth",
    "metric_vs_depth_data",
    "png_bytes",
    "select_site",
    "spectra_grid",
    "spectra_heatmaps",
    "spectra_lines",
    "spans_decades",
]

#: Keys that identify one configuration of a sweep row (besides preset, seed and layer).
CONFIG_KEYS = ("depth", "tokens", "dim", "heads", "alpha")

_mpl_lock = threading.Lock()

# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _presets_in_order(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df["preset"].tolist()))


def select_site(df: pd.DataFrame, site: str | None = None) -> pd.DataFrame:
    """Rows of one hidden-state site (e.g. after attention vs after the block).

    ``site=None`` keeps a table with a single site as it is, and otherwise picks the site of
    the last row of layer 0… in practice the site recorded for whole blocks: ``"block"`` when
    present, else the last site name in order of appearance.
    """
    if "site" not in df.columns:
        return df
    sites = list(dict.fromkeys(df["site"].tolist()))
    if site is None:
        if len(sites) <= 1:
            return df
        site = "block" if "block" in sites else sites[-1]
    if site not in sites:
        raise OSAInputError(f"site {site!r} is not in the table; it has {sites}")
    return df[df["site"] == site]


def _single_depth(df: pd.DataFrame, depth: int | None) -> pd.DataFrame:
    """Keep one network depth (the largest by default) when a sweep holds several."""
    if "depth" not in df.columns:
        return df
    depths = sorted(df["depth"].unique())
    if depth is None:
        depth = depths[-1]
    if depth not in depths:
        raise OSAInputError(f"depth {depth} is not in the table; it has {depths}")
    return df[df["depth"] == depth]


# --------------------------------------------------------------------------------------------
# rank collapse across depth
# --------------------------------------------------------------------------------------------


def metric_vs_depth_data(
    metrics: pd.DataFrame, metric: str, *, site: str | None = None, depth: int | None = None
) -> pd.DataFrame:
    """The reduced table :func:`metric_vs_depth` draws: ``preset, layer, mean, lo, hi, std, n``."""
    require_columns(metrics, ["preset", "layer", "metric", "value"], "metrics table")
    known = list(dict.fromkeys(metrics["metric"].tolist()))
    if metric not in known:
        raise OSAInputError(f"metric {metric!r} is not in the table; it has {known}")
    df = metrics[metrics["metric"] == metric]
    df = _single_depth(select_site(df, site), depth)
    return band_over_seeds(df, "layer", "value")


def metric_vs_depth(
    metrics: pd.DataFrame,
    metric: str,
    *,
    site: str | None = None,
    depth: int | None = None,
    logy: bool | None = None,
    title: str | None = None,
    width: int | None = 520,
    height: int = 340,
) -> hv.Overlay:
    """A depth-wise metric (docs/design.md §4) against layer: one curve per preset, min–max band over seeds.

    Args:
        metrics: tidy metrics table of :func:`osa_lab.studies.depth.sweep`.
        metric: a name in its ``metric`` column (e.g. ``"relative_residual"``).
        site: which hidden state per layer (see :func:`select_site`).
        depth: network depth to show when the table holds several (default: the largest).
        logy: log y axis; ``None`` chooses log when the values span more than two decades.
        width, height: bokeh size in pixels; ``width=None`` stretches to the container's width.
    """
    data = metric_vs_depth_data(metrics, metric, site=site, depth=depth)
    if logy is None:
        logy = spans_decades(data[["mean", "lo", "hi"]].to_numpy().ravel())
    label = metric.replace("_", " ")
    return curves_with_bands(data, "layer", label, title or f"{label} across depth", logy, width=width, height=height)


# --------------------------------------------------------------------------------------------
# singular-value spectra across depth
# --------------------------------------------------------------------------------------------


def spectra_grid(
    spectra: pd.DataFrame, *, site: str | None = None, depth: int | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Mean normalised spectra per preset as ``{preset: (layers, rank_fraction, Z)}``.

    ``Z[i, j]`` is the mean over seeds of ``σ_i / σ_1`` at layer ``layers[j]``, with
    ``rank_fraction = (index + 0.5) / k`` (k singular values per layer), so spectra of
    different sizes share one axis from 0 to 1. Missing cells are NaN.
    """
    require_columns(spectra, ["preset", "layer", "index", "sigma_normalized"], "spectra table")
    df = _single_depth(select_site(spectra, site), depth)
    out: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for preset in _presets_in_order(df):
        d = df[df["preset"] == preset]
        table = d.pivot_table(index="index", columns="layer", values="sigma_normalized", aggfunc="mean")
        table = table.sort_index().sort_index(axis=1)
        layers = table.columns.to_numpy()
        full_layers = np.arange(layers.min(), layers.max() + 1)
        table = table.reindex(columns=full_layers)
        k = len(table.index)
        frac = (table.index.to_numpy(dtype=float) + 0.5) / k
        out[preset] = (full_layers, frac, table.to_numpy(dtype=float))
    return out


#: How :func:`spectra_heatmaps` sets its colour ranges: one for every panel, or each panel its own.
COLOUR_RANGES = ("shared", "per panel")


def _positive_range(z: np.ndarray, floor: float | None) -> tuple[float, float]:
    """``(low, 1)``: the smallest positive finite value (at least :data:`LOG_FLOOR`), or ``floor``."""
    if floor is not None:
        return (float(floor), 1.0)
    vals = z[np.isfinite(z) & (z > 0)]
    return (max(float(vals.min()), LOG_FLOOR) if vals.size else LOG_FLOOR, 1.0)


def spectra_heatmaps(
    spectra: pd.DataFrame,
    *,
    site: str | None = None,
    depth: int | None = None,
    cmap: str = "viridis",
    clim: tuple[float, float] | None = None,
    colour_range: str = "shared",
    floor: float | None = None,
    title: str | None = None,
    panel_width: int = 380,
    cols: int | None = None,
) -> hv.Layout:
    """One heatmap per preset (layer × normalised index, log colour of ``σ_i/σ_1``).

    ``colour_range="shared"`` gives every panel the same range (``clim``, by default the positive
    range of all values, floored at :data:`LOG_FLOOR`) and one colour bar, on the last panel, so
    the panels compare directly. A preset whose spectrum collapses stretches a shared range over
    many decades and leaves the others one colour: ``floor`` clips the range's low end (values
    below it take its colour), or ``colour_range="per panel"`` gives each panel its own range and
    colour bar. Hovering shows layer, normalised index and ``σ_i/σ_1``. ``title`` heads the whole
    layout; ``panel_width`` and ``cols`` size the bokeh panels so a row fits.
    """
    if colour_range not in COLOUR_RANGES:
        raise OSAInputError(f"colour_range must be one of {COLOUR_RANGES}, got {colour_range!r}")
    if floor is not None and not (0 < floor < 1):
        raise OSAInputError(f"floor must lie in (0, 1) (the low end of the σᵢ/σ₁ colour range), got {floor!r}")
    grids = spectra_grid(spectra, site=site, depth=depth)
    shared = colour_range == "shared"
    if shared and clim is None:
        clim = _positive_range(np.concatenate([z.ravel() for _, _, z in grids.values()] or [np.ones(1)]), floor)
    panels = []
    for i, (preset, (layers, frac, z)) in enumerate(grids.items()):
        lim = clim if shared else _positive_range(z, floor)
        bar = not shared or i == len(grids) - 1  # one colour bar for a shared range
        img = hv.Image(
            (layers, frac, np.clip(z, lim[0], None)),
            kdims=[hv.Dimension("layer"), hv.Dimension("rank_fraction", label="normalised index i/k")],
            vdims=[hv.Dimension("sigma_normalized", label="σᵢ/σ₁")],
            label=str(preset),
        )
        common = dict(cmap=cmap, logz=True, clim=lim, colorbar=bar, title=str(preset), invert_yaxis=True)
        img = dual_options(
            img,
            dict(common, tools=["hover"], width=panel_width + (0 if bar else -60), height=300),
            dict(common, fig_inches=(4, 3.2), aspect=1.25),
        )
        panels.append(integer_xticks(img))
    # hspace: room between panels for a colour bar's label and the next panel's y label
    layout = dual_options(hv.Layout(panels), dict(shared_axes=False), dict(sublabel_format="", hspace=0.9))
    if title:
        layout = layout.opts(title=title, backend="bokeh").opts(title=title, backend="matplotlib")
    return with_clean_edges(layout.cols(cols or max(len(panels), 1)))


def spectra_lines(
    spectra: pd.DataFrame,
    layers: Sequence[int] | None = None,
    *,
    site: str | None = None,
    depth: int | None = None,
    title: str | None = None,
    panel_width: int = 380,
    cols: int | None = None,
) -> hv.Layout:
    """Normalised spectra ``σ_i/σ_1`` against index for selected layers, one panel per preset (log y).

    ``layers=None`` picks the input, a quarter, the middle and the last layer. Curves are the
    mean over seeds; the same layer has the same colour and dash in every panel, later layers
    are drawn thinner on top so that coinciding spectra (e.g. an orthogonal stack, whose
    spectrum does not change) stay visible. The y axis ends just above 1 (σᵢ/σ₁ ≤ 1). The
    legend never covers curves or axis labels: in bokeh it sits in its own area below each
    panel; in matplotlib (where a legend below the axes covers the "index" label) one legend,
    valid for every panel, sits to the right of the last panel.
    """
    grids = spectra_grid(spectra, site=site, depth=depth)
    all_layers = sorted({int(x) for g in grids.values() for x in g[0]})
    if layers is None:
        last = all_layers[-1]
        first = all_layers[0]
        layers = sorted({first, first + (last - first) // 4, first + (last - first) // 2, last})
    layers = [int(x) for x in layers]
    unknown = [x for x in layers if x not in all_layers]
    if unknown:
        raise OSAInputError(
            f"layer(s) {unknown} not in the spectra table; layers are {all_layers[0]}…{all_layers[-1]}"
        )
    colours = {lay: PALETTE[i % len(PALETTE)] for i, lay in enumerate(layers)}
    dashes = [("solid", "-"), ("dashed", "--"), ("dotted", ":"), ("dashdot", "-.")]
    style = {lay: dashes[i % len(dashes)] for i, lay in enumerate(layers)}
    widths = {lay: max(3.5 - 0.6 * i, 1.2) for i, lay in enumerate(layers)}
    floor = LOG_FLOOR
    mins = [np.nanmin(z) for _, _, z in grids.values() if np.isfinite(z).any()]
    if mins:
        floor = max(min(mins), LOG_FLOOR)
    ylim = (floor / 3, 2.0)
    panels = []
    n_panels = len(grids)
    for p_i, (preset, (lays, _frac, z)) in enumerate(grids.items()):
        curves = []
        k = z.shape[0]
        index = np.arange(1, k + 1)
        for lay in layers:
            col = int(np.searchsorted(lays, lay))
            s = np.clip(z[:, col], LOG_FLOOR, None)
            df = pd.DataFrame({"index": index, "sigma_normalized": s, "layer": lay})
            curve = hv.Curve(
                df, "index", [hv.Dimension("sigma_normalized", label="σᵢ/σ₁"), "layer"], label=f"layer {lay}"
            )
            curves.append(
                dual_options(
                    curve,
                    dict(color=colours[lay], line_width=widths[lay], line_dash=style[lay][0], tools=["hover"]),
                    dict(color=colours[lay], linewidth=widths[lay] * 0.7, linestyle=style[lay][1]),
                )
            )
        common = dict(title=str(preset), logy=True, show_grid=True, ylim=ylim)
        last = p_i == n_panels - 1
        panels.append(
            integer_xticks(
                dual_options(
                    hv.Overlay(curves),
                    dict(common, width=panel_width, height=340, legend_position="bottom", legend_cols=2),
                    dict(common, fig_inches=(4, 3.6), legend_position="right", show_legend=last, legend_cols=1),
                )
            )
        )
    layout = dual_options(hv.Layout(panels), dict(shared_axes=True), dict(sublabel_format=""))
    if title:
        layout = layout.opts(title=title, backend="bokeh").opts(title=title, backend="matplotlib")
    return with_clean_edges(layout.cols(cols or max(len(panels), 1)))


# --------------------------------------------------------------------------------------------
# Jacobian conditioning
# --------------------------------------------------------------------------------------------


def _algorithm_label(df: pd.DataFrame) -> str:
    if "algorithm" not in df.columns:
        return ""
    return ", ".join(sorted({str(m) for m in df["algorithm"].unique()}))


def kappa_vs_depth_data(
    jacobian: pd.DataFrame, *, scope: str | None = None, depth: int | None = None
) -> pd.DataFrame:
    """The reduced table :func:`kappa_vs_depth` draws: ``preset, layer, mean, lo, hi, std, n``.

    ``scope`` selects a Jacobian scope when the profile holds several (default: the first, which
    for :func:`osa_lab.studies.jacobian.jacobian_depth_profile` is the end-to-end Jacobian of the first
    l layers).
    """
    require_columns(jacobian, ["preset", "layer", "kappa"], "Jacobian profile")
    df = jacobian
    if "scope" in df.columns:
        scopes = list(dict.fromkeys(df["scope"].tolist()))
        if scope is None:
            scope = scopes[0]
        if scope not in scopes:
            raise OSAInputError(f"scope {scope!r} is not in the Jacobian profile; it has {scopes}")
        df = df[df["scope"] == scope]
    df = _single_depth(df, depth)
    return band_over_seeds(df, "layer", "kappa")


SCOPE_LABELS = {"end_to_end": "end-to-end ∂X_l/∂X_0", "layer": "single block ∂X_l/∂X_l−1"}


def beyond_float64(kappa: pd.DataFrame | pd.Series | np.ndarray) -> np.ndarray:
    """Mask of condition numbers that float64 cannot resolve: ``κ ≥ 1/ε`` (≈ 4.5e15) or infinite."""
    v = np.asarray(kappa, dtype=float)
    return np.isposinf(v) | (v >= LOG_CEILING)


def kappa_vs_depth(
    jacobian: pd.DataFrame,
    *,
    scope: str | None = None,
    depth: int | None = None,
    logy: bool | None = None,
    title: str | None = None,
    width: int | None = 520,
    height: int = 340,
) -> hv.Overlay:
    """Condition number κ of the Jacobian against layer, one curve per preset, min–max band over seeds.

    The title names the computation (``exact`` or ``matrix-free``) from the ``algorithm`` column
    (``title`` replaces it). Layers where some seed's κ is beyond float64's range (κ ≥ 1/ε or
    infinite: the smallest singular value is rounding noise) are drawn at the ceiling
    :data:`LOG_CEILING` with a black ✕ labelled as such, never silently clipped.
    """
    data = kappa_vs_depth_data(jacobian, scope=scope, depth=depth)
    if logy is None:
        logy = bool((data["lo"] > 0).all() and data["hi"].max() / max(data["lo"].min(), LOG_FLOOR) > 10)
    algorithm = _algorithm_label(jacobian)
    scope_txt = ""
    if "scope" in jacobian.columns:
        sc = scope or jacobian["scope"].iloc[0]
        scope_txt = f" ({SCOPE_LABELS.get(sc, sc)})"
    if title is None:
        title = f"Jacobian κ across depth{scope_txt}" + (f" [{algorithm}]" if algorithm else "")
    over = data[beyond_float64(data["hi"])]
    marks = []
    if len(over):
        marks.append(dual_options(
            hv.Scatter((over["layer"], np.full(len(over), LOG_CEILING)), "layer", "mean",
                       label="κ beyond float64 (≥ 1/ε)"),
            dict(color="black", marker="x", size=12, line_width=2),
            # edgecolors=None: HoloViews' default 'none' makes matplotlib warn for the unfilled 'x'
            dict(color="black", marker="x", s=80, linewidth=2, edgecolors=None),
        ))
    return curves_with_bands(data, "layer", "κ(J)", title, logy, extra=marks, width=width, height=height)


def jacobian_histogram_data(svals: pd.DataFrame, *, bins: int = 30, group: str = "preset") -> pd.DataFrame:
    """Histogram of ``log10 σ`` per ``group`` on shared bins: ``group, left, right, count``."""
    require_columns(svals, [group, "sigma"], "Jacobian singular-value table")
    sig = svals["sigma"].to_numpy(dtype=float)
    logs = np.log10(np.clip(sig, LOG_FLOOR, None))
    lo, hi = float(logs.min()), float(logs.max())
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    edges = np.linspace(lo, hi, bins + 1)
    rows = []
    for g in dict.fromkeys(svals[group].tolist()):
        counts, _ = np.histogram(logs[(svals[group] == g).to_numpy()], bins=edges)
        rows.append(pd.DataFrame({group: g, "left": edges[:-1], "right": edges[1:], "count": counts}))
    return pd.concat(rows, ignore_index=True)


def jacobian_histogram(
    svals: pd.DataFrame, *, bins: int = 30, group: str = "preset", title: str | None = None,
    width: int | None = 520, height: int = 340,
) -> hv.Overlay:
    """Histogram of the Jacobian's singular values (log10 σ), one translucent histogram per preset
    (bokeh size ``width`` × ``height``; ``width=None`` stretches to the container's width)."""
    data = jacobian_histogram_data(svals, bins=bins, group=group)
    groups = list(dict.fromkeys(data[group].tolist()))
    colours = colour_map(groups)
    hists = []
    for g in groups:
        d = data[data[group] == g]
        edges = np.append(d["left"].to_numpy(), d["right"].to_numpy()[-1])
        hists.append(
            dual_options(
                hv.Histogram(
                    (edges, d["count"].to_numpy()),
                    kdims=[hv.Dimension("log10_sigma", label="log₁₀ σ")],
                    vdims=["count"],
                    label=str(g),
                ),
                dict(color=colours[g], alpha=0.5, line_color=None, tools=["hover"]),
                dict(facecolor=colours[g], alpha=0.5, edgecolor="none"),
            )
        )
    algorithm = _algorithm_label(svals)
    if title is None:
        title = "Singular values of the end-to-end Jacobian" + (f" [{algorithm}]" if algorithm else "")
    # whole decades on the log10 σ axis: fractional ticks (−12.5, −10.0, −7.5) ran into each other
    return integer_xticks(dual_options(
        hv.Overlay(hists),
        dict(title=title, **bokeh_size(width, height), legend_position="right"),
        dict(title=title, fig_inches=(6, 3.6), legend_position="right"),
    ))


def kappa_vs_parameter(
    table: pd.DataFrame,
    parameter: str,
    *,
    y: str = "kappa",
    group: str = "preset",
    logx: bool | None = None,
    logy: bool | None = None,
    title: str | None = None,
) -> hv.Overlay:
    """κ (or another column ``y``) against a parameter such as ``alpha``, ``tokens`` or ``dim``.

    One curve per ``group`` value (a column, e.g. ``preset`` or ``tokens``) with a min–max band
    over seeds and other repeated rows. ``logx``/``logy`` default to log when the positive
    values span more than a decade (x, only when every x is positive) / two decades (y).
    """
    require_columns(table, [group, parameter, y], "table")
    data = band_over_seeds(table, parameter, y, by=(group,))
    if logx is None:  # a zero on the x axis (layer 0, α = 0) has no place on a log axis
        logx = bool((data[parameter] > 0).all()) and spans_decades(data[parameter], decades=1.0)
    if logy is None:
        logy = spans_decades(data[["lo", "hi"]].to_numpy().ravel())
    ylabel = "κ(J)" if y == "kappa" else y
    return curves_with_bands(
        data, parameter, ylabel, title or f"{ylabel} against {parameter}", logy, logx, group=group
    )


# --------------------------------------------------------------------------------------------
# static output
# --------------------------------------------------------------------------------------------


#: Resolution of exported raster figures (the dashboard's PNG downloads): fit for a paper.
EXPORT_DPI = 200
#: Formats :func:`figure_bytes` writes: a raster one and two vector ones.
EXPORT_FORMATS = ("png", "svg", "pdf")
#: Titles longer than this many characters are wrapped in exported figures (a long title on
#: one line squeezed the axes).
TITLE_WRAP = 70


def figure_bytes(obj: hv.core.Dimensioned, format: str = "png", dpi: int = EXPORT_DPI,
                 metadata: dict[str, str] | None = None) -> bytes:
    """Render a HoloViews object with the matplotlib backend as PNG, SVG or PDF bytes.

    Thread-safe (a module lock serialises matplotlib, whose HoloViews backend goes through
    pyplot internally); the figure is closed after saving, so nothing accumulates in a server.
    Titles longer than :data:`TITLE_WRAP` characters are wrapped onto several lines.
    ``metadata`` goes into the file's metadata (PNG text chunks, SVG/PDF ``Title``…), so a
    downloaded file names the figure it shows (see :func:`figure_title`).
    """

    if format not in EXPORT_FORMATS:
        raise OSAInputError(f"figure format {format!r} is not supported; use one of {', '.join(EXPORT_FORMATS)}")
    meta = dict(metadata or {})
    if format == "svg":
        meta = {k: v for k, v in meta.items() if k in ("Title", "Description", "Creator", "Date")}
    elif format == "pdf":
        meta = {("Subject" if k == "Description" else "Creator" if k == "Software" else k): v
                for k, v in meta.items() if k in ("Title", "Description", "Software", "Author")}
    buf = io.BytesIO()
    with_rendered(obj, lambda fig: fig.savefig(buf, format=format, dpi=dpi, bbox_inches="tight", metadata=meta))
    return buf.getvalue()


def with_rendered(obj: hv.core.Dimensioned, use):
    """``use(fig)`` on the matplotlib figure of ``obj`` as the reports save it (titles longer than
    :data:`TITLE_WRAP` characters wrapped), under the module's matplotlib lock; the figure is
    closed afterwards. Returns what ``use`` returns."""
    import matplotlib.pyplot as plt

    with _mpl_lock:
        fig = _rendered(obj)
        try:
            return use(fig)
        finally:
            plt.close(fig)


def _rendered(obj: hv.core.Dimensioned):
    import textwrap

    fig = hv.render(obj, backend="matplotlib")
    for ax in fig.axes:
        title = ax.get_title()
        if len(title) > TITLE_WRAP:
            ax.set_title(textwrap.fill(title, TITLE_WRAP))
    suptitle = getattr(fig, "_suptitle", None)
    if suptitle is not None and len(suptitle.get_text()) > TITLE_WRAP:
        wrapped = textwrap.fill(suptitle.get_text(), TITLE_WRAP)
        suptitle.set_text(wrapped)
        x, y = suptitle.get_position()  # raise it by its extra lines, clear of the panel titles
        suptitle.set_position((x, y + 0.12 * wrapped.count("\n")))
    return fig


def png_bytes(obj: hv.core.Dimensioned, dpi: int = 110, metadata: dict[str, str] | None = None) -> bytes:
    """Render a HoloViews object with the matplotlib backend and return PNG bytes
    (:func:`figure_bytes` in PNG; ``metadata`` goes into the PNG's text chunks)."""
    return figure_bytes(obj, "png", dpi=dpi, metadata=metadata)


def figure_title(obj: hv.core.Dimensioned, backend: str = "bokeh") -> str:
    """The title option of a HoloViews figure ('' when it has none)."""
    try:
        return str(obj.opts.get("plot", backend).kwargs.get("title", "") or "")
    except Exception:  # noqa: BLE001 - objects without options
        return ""
