"""HoloViews builders for the accuracy and cost of the OSA methods (report notebook 1).

Inputs are the tidy tables of :mod:`osa_lab.studies.expm_accuracy`:

* :func:`error_vs_n`, :func:`error_vs_alpha`, :func:`error_vs_norm` — relative error against
  the float64 reference, per method and dtype (log axes);
* :func:`orthogonality_vs_n` — ``max |AᵀA − I|`` of the applied matrix against N;
* :func:`time_vs_n` — wall time against N on log–log axes with the fitted power laws of
  :func:`osa_lab.studies.expm_accuracy.fit_slopes` drawn dashed and their slopes in the legend.

Every builder sets its options for both the bokeh backend (interactive, dashboard) and the
matplotlib backend (static PNG in the exported reports); render with
``holoviews.render(obj, backend=...)``, :func:`osa_lab.plots.depth.png_bytes` or
:func:`osa_lab.reporting.kernel_setup.show`.
"""

from __future__ import annotations

import math
from typing import Any

import holoviews as hv
import numpy as np
import pandas as pd

from osa_lab.errors import OSAInputError
from osa_lab.plots.style import ensure_backends

#: Colour per dtype and per timed method (Okabe–Ito, colour-blind safe; the accuracy plots
#: also separate methods by dash, :data:`METHOD_DASH`).
DTYPE_COLORS = {"float64": "#0072B2", "float32": "#D55E00", "bfloat16": "#009E73"}
METHOD_COLORS = {
    "dense": "#D55E00",
    "lowrank": "#0072B2",
    "sdpa": "#999999",
    "gram": "#CC79A7",
    "qr": "#E69F00",
}
#: Line style per OSA method in the accuracy plots (matplotlib name, bokeh name).
METHOD_DASH = {"dense": ("--", "dashed"), "lowrank": ("-", "solid"), "gram": (":", "dotted"), "qr": ("-.", "dashdot")}

_FALLBACK = "#000000"
#: Exact zeros (e.g. every error at α = 0) are drawn at this value on the log axes.
ZERO_FLOOR = 1e-18


def styled(obj: Any, *, bokeh: dict | None = None, mpl: dict | None = None, **common: Any) -> Any:
    """Apply ``common`` options to both backends, plus backend-specific ones."""
    ensure_backends()
    obj = obj.opts(backend="bokeh", **common, **(bokeh or {}))
    return obj.opts(backend="matplotlib", **common, **(mpl or {}))


def _require(df: pd.DataFrame, columns: list[str], builder: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise OSAInputError(
            f"{builder}: the table lacks columns {missing}; it has {list(df.columns)} "
            "(pass the DataFrame returned by osa_lab.studies.expm_accuracy)"
        )


def _curve(df: pd.DataFrame, x: str, y: str, label: str, color: str, dash: tuple[str, str]) -> hv.Overlay:
    curve = hv.Curve(df, x, y, label=label)
    points = hv.Scatter(df, x, y, label=label)
    curve = styled(curve, color=color, bokeh={"line_dash": dash[1], "line_width": 2}, mpl={"linestyle": dash[0]})
    points = styled(points, color=color, bokeh={"size": 6}, mpl={"s": 20})
    return curve * points


def _error_curves(acc: pd.DataFrame, x: str, y: str, builder: str) -> hv.Overlay:
    _require(acc, ["method", "dtype", x, y], builder)
    # Mean over seeds (and any other parameter not on the x axis).
    agg = acc.groupby(["method", "dtype", x], as_index=False)[y].mean()
    overlays = []
    for (method, dtype), g in agg.groupby(["method", "dtype"], sort=False):
        g = g.sort_values(x).dropna(subset=[y])
        g = g.assign(**{y: g[y].clip(lower=ZERO_FLOOR)})  # exact zeros drawn at the floor
        if g.empty:
            continue
        color = DTYPE_COLORS.get(str(dtype), _FALLBACK)
        dash = METHOD_DASH.get(str(method), ("-", "solid"))
        overlays.append(_curve(g, x, y, f"{method} {dtype}", color, dash))
    if not overlays:
        raise OSAInputError(f"{builder}: no values of {y!r} to draw")
    return hv.Overlay(overlays)


def _no_minor_labels(plot: Any, element: Any) -> None:
    """matplotlib hook: keep only the explicit major ticks on a log x axis."""
    from matplotlib.ticker import NullFormatter

    plot.handles["axis"].xaxis.set_minor_formatter(NullFormatter())


def _tick(x: float) -> str:
    """A short tick label: ``16k`` for 16384, ``0.5`` for 0.5, ``512`` for 512."""
    x = float(x)
    if x >= 4096 and x == int(x) and int(x) % 1024 == 0:
        return f"{int(x) // 1024}k"
    return f"{x:g}"


def _layout_opts(
    obj: Any, title: str, xlabel: str, ylabel: str, logx: bool = True, xticks: list | None = None
) -> Any:
    extra: dict[str, Any] = {"xticks": [(float(x), _tick(x)) for x in xticks]} if xticks else {}
    if xticks and len(xticks) > 6:  # dense log ticks (N = …, 16384, 32768) would overlap
        extra["xrotation"] = 45
    return styled(
        obj,
        title=title,
        xlabel=xlabel,
        ylabel=ylabel,
        logx=logx,
        logy=True,
        legend_position="right",
        show_grid=True,
        **extra,
        bokeh={"width": 560, "height": 330},
        mpl={"fig_inches": (6.5, 3.6), "aspect": 1.6, "hooks": [_no_minor_labels] if xticks else []},
    )


def _panels(acc: pd.DataFrame, panel: str, make, cols: int = 2) -> hv.Layout:
    """One plot per value of ``panel``; the legend is drawn once, beside the top-right panel."""
    values = sorted(acc[panel].unique())
    plots = [make(acc[acc[panel] == value], value) for value in values]
    legend_at = min(cols, len(plots)) - 1
    plots = [p if i == legend_at else styled(p, show_legend=False) for i, p in enumerate(plots)]
    layout = hv.Layout(plots).cols(cols)
    return layout.opts(backend="matplotlib", sublabel_format="", hspace=0.25, vspace=0.45, fig_inches=4.2)


def error_vs_n(acc: pd.DataFrame, *, metric: str = "rel_error", panel: str = "alpha") -> hv.Layout:
    """Error (mean over seeds) against N, one curve per method × dtype, one panel per α.

    Colour encodes the dtype, the line style the method (dashed: dense reference).
    """
    _require(acc, [panel], "error_vs_n")
    return _panels(
        acc,
        panel,
        lambda df, value: _layout_opts(
            _error_curves(df, "n", metric, "error_vs_n"),
            f"{_SYMBOLS.get(panel, panel)} = {value:g}",
            "N (tokens)",
            _LABELS.get(metric, metric),
            xticks=sorted(acc["n"].unique()),
        ),
    )


def error_vs_alpha(acc: pd.DataFrame, *, metric: str = "rel_error", n: int | None = None) -> hv.Overlay:
    """Error (mean over seeds) against α at one N (default: the largest), per method × dtype."""
    _require(acc, ["n", "alpha"], "error_vs_alpha")
    n = int(acc["n"].max()) if n is None else n
    df = acc[acc["n"] == n]
    if df.empty:
        raise OSAInputError(f"error_vs_alpha: no rows with n={n}; the table has n in {sorted(acc['n'].unique())}")
    return _layout_opts(
        _error_curves(df, "alpha", metric, "error_vs_alpha"),
        f"N = {n}",
        "α",
        _LABELS.get(metric, metric),
        xticks=sorted(df["alpha"].unique()),
    )


def error_vs_norm(acc: pd.DataFrame, *, metric: str = "rel_error") -> hv.Overlay:
    """Error against ‖S‖₂ for every (N, α, seed): one scatter per method × dtype, log–log.

    The error of a floating-point method grows with the norm of the skew matrix; this is the
    plot that shows by how much.
    """
    _require(acc, ["method", "dtype", "norm_s", metric], "error_vs_norm")
    layers = []
    for (method, dtype), g in acc.groupby(["method", "dtype"], sort=False):
        g = g[g["norm_s"] > 0].dropna(subset=[metric])
        g = g.assign(**{metric: g[metric].clip(lower=ZERO_FLOOR)})
        if g.empty:
            continue
        marker = ("o", "circle") if method == "lowrank" else ("s", "square")
        pts = hv.Scatter(g, "norm_s", [metric, "n", "alpha"], label=f"{method} {dtype}")
        layers.append(
            styled(
                pts,
                color=DTYPE_COLORS.get(str(dtype), _FALLBACK),
                bokeh={"size": 7, "marker": marker[1], "tools": ["hover"]},
                mpl={"s": 28, "marker": marker[0]},
            )
        )
    if not layers:
        raise OSAInputError(f"error_vs_norm: no values of {metric!r} with ‖S‖₂ > 0 to draw")
    return _layout_opts(hv.Overlay(layers), "error against ‖S‖₂", "‖S‖₂", _LABELS.get(metric, metric))


def orthogonality_vs_n(acc: pd.DataFrame, *, alpha: float | None = None) -> hv.Overlay:
    """``max |AᵀA − I|`` against N per method × dtype (at one α; default the largest)."""
    _require(acc, ["alpha", "orth_error"], "orthogonality_vs_n")
    alpha = float(acc["alpha"].max()) if alpha is None else alpha
    df = acc[np.isclose(acc["alpha"], alpha) & acc["orth_error"].notna()]
    if df.empty:
        raise OSAInputError(f"orthogonality_vs_n: no orthogonality errors at alpha={alpha}")
    return _layout_opts(
        _error_curves(df, "n", "orth_error", "orthogonality_vs_n"),
        f"orthogonality, α = {alpha:g}",
        "N (tokens)",
        "max |AᵀA − I|",
        xticks=sorted(df["n"].unique()),
    )


def time_vs_n(timings: pd.DataFrame, slopes: pd.DataFrame | None = None) -> hv.Overlay:
    """Wall time against N on log–log axes, one curve per method, fitted power laws dashed.

    ``slopes`` is :func:`osa_lab.studies.expm_accuracy.fit_slopes` output; each fitted line spans the N
    range it was fitted on and its legend entry gives the slope.
    """
    _require(timings, ["method", "n", "seconds"], "time_vs_n")
    layers = []
    for method, g in timings.groupby("method", sort=False):
        g = g.sort_values("n")
        color = METHOD_COLORS.get(str(method), _FALLBACK)
        layers.append(_curve(g, "n", "seconds", str(method), color, ("-", "solid")))
    if slopes is not None:
        _require(slopes, ["method", "slope", "intercept", "n_min", "n_max"], "time_vs_n")
        for row in slopes.itertuples():
            if not math.isfinite(row.slope):
                continue
            xs = np.geomspace(row.n_min, row.n_max, 16)
            fit = pd.DataFrame({"n": xs, "seconds": np.exp(row.intercept) * xs**row.slope})
            line = hv.Curve(fit, "n", "seconds", label=f"{row.method} fit: slope {row.slope:.2f}")
            layers.append(
                styled(
                    line,
                    color=METHOD_COLORS.get(str(row.method), _FALLBACK),
                    bokeh={"line_dash": "dashed", "line_width": 1.5, "alpha": 0.7},
                    mpl={"linestyle": "--", "linewidth": 1.2, "alpha": 0.7},
                )
            )
    return _layout_opts(
        hv.Overlay(layers), "forward time against N", "N (tokens)", "seconds", xticks=sorted(timings["n"].unique())
    )


_SYMBOLS = {"alpha": "α", "n": "N"}
_LABELS = {
    "rel_error": "relative error vs float64",
    "norm_error": "relative norm error",
    "orth_error": "max |AᵀA − I|",
}
