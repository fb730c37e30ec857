"""Plot builders for the depth study (:mod:`osa_lab.studies.depth_study`): accuracy against depth,
training-loss curves per depth, the tuning curves, and Jacobian κ at initialisation against
trainability.

They draw the tables that :func:`osa_lab.studies.depth_study.summarise` writes (``summary.csv``,
``curves.csv``, ``tuning.csv``, ``runs.csv``); each ``*_data`` helper returns exactly what its
figure draws. The question (Zhang & Martens 2026): does skipless, normless OSA train as easily
as a skip-connected ViT as depth grows, and does signal propagation at initialisation predict it?
"""

from __future__ import annotations

import holoviews as hv
import numpy as np
import pandas as pd

from osa_lab.errors import OSAInputError
from osa_lab.plots.style import (
    LOG_CEILING,
    band_over_seeds,
    curves_with_bands,
    dual_options,
    preset_colour,
    require_columns,
)

__all__ = [
    "accuracy_vs_depth",
    "accuracy_vs_depth_data",
    "kappa_vs_trainability",
    "kappa_vs_trainability_data",
    "loss_curves_by_depth",
    "loss_curves_data",
    "tuning_curves",
    "tuning_curves_data",
]


def accuracy_vs_depth_data(summary: pd.DataFrame) -> pd.DataFrame:
    """``preset, depth, mean, lo, hi, n`` in percent: mean test accuracy and its 95 % interval per depth.

    The interval is cut to 0–100 %: a t-interval over few, widely spread seeds can run past
    either end (the verdict prints it uncut and says so), and an accuracy axis past 100 % misleads.
    """
    require_columns(summary, ["preset", "depth", "test_accuracy_mean", "ci_low", "ci_high", "finished"], "summary")
    s = summary[summary["finished"] > 0]
    out = pd.DataFrame({"preset": s["preset"], "depth": s["depth"], "mean": 100 * s["test_accuracy_mean"],
                        "lo": (100 * s["ci_low"].fillna(s["test_accuracy_mean"])).clip(0.0, 100.0),
                        "hi": (100 * s["ci_high"].fillna(s["test_accuracy_mean"])).clip(0.0, 100.0),
                        "n": s["finished"] - s["diverged"]})  # fmt: skip
    return out.reset_index(drop=True)


def accuracy_vs_depth(summary: pd.DataFrame, *, title: str = "test accuracy against depth (95 % interval)") -> hv.Overlay:
    """Mean test accuracy (%) against depth per preset, with its 95 % interval (cut to 0–100 %) as a band."""
    data = accuracy_vs_depth_data(summary)
    overlay = curves_with_bands(data, "depth", "test accuracy %", title, logy=False, logx=False)
    # the whole accuracy scale, and axes wider than tall beside the legend
    overlay.opts(ylim=(0, 100), backend="bokeh")
    return overlay.opts(ylim=(0, 100), aspect=1.6, fig_inches=(7, 3.6), backend="matplotlib")


def loss_curves_data(curves: pd.DataFrame, depth: int, metric: str = "train_loss") -> pd.DataFrame:
    """``preset, step, mean, lo, hi, std, n`` of ``metric`` over the final seeds at ``depth``."""
    require_columns(curves, ["preset", "depth", "seed", "step", metric], "curves")
    return band_over_seeds(curves[curves["depth"] == depth], "step", metric)


def loss_curves_by_depth(curves: pd.DataFrame, metric: str = "train_loss") -> hv.Layout:
    """One panel per depth: ``metric`` against step, mean and min–max band over seeds per preset."""
    panels = [curves_with_bands(loss_curves_data(curves, d, metric), "step", metric.replace("_", " "),
                                f"depth {d}", logy=metric.endswith("loss"))
              for d in sorted(curves["depth"].unique())]  # fmt: skip
    layout = hv.Layout(panels).cols(1)
    return dual_options(layout, dict(shared_axes=False), dict(shared_axes=False, sublabel_format=""))


def tuning_curves_data(tuning: pd.DataFrame, depth: int) -> pd.DataFrame:
    """``setting, lr, mean, lo, hi, n``: validation accuracy (%) over tuning seeds per preset (× α-lr multiplier)."""
    require_columns(tuning, ["preset", "depth", "lr", "alpha_lr_mult", "tune_seed", "val_accuracy"], "tuning")
    t = tuning[tuning["depth"] == depth].copy()
    multi = t.groupby("preset")["alpha_lr_mult"].nunique()
    t["setting"] = [p if multi.get(p, 1) == 1 else f"{p} α-lr ×{m:g}" for p, m in zip(t["preset"], t["alpha_lr_mult"], strict=True)]
    t["val_accuracy"] = 100 * t["val_accuracy"]
    return band_over_seeds(t, "lr", "val_accuracy", by=("setting",)).rename(columns={"setting": "preset"})


def tuning_curves(tuning: pd.DataFrame, depth: int) -> hv.Overlay:
    """Validation accuracy (%) against learning rate (log axis) per preset at ``depth``; diverged points are gaps."""
    data = tuning_curves_data(tuning, depth)
    colours = {g: preset_colour(str(g).split(" ")[0]) for g in data["preset"].unique()}
    # a preset searched over several α-lr multipliers: solid, dashed, dotted … in the order they appear
    seen: dict[str, int] = {}
    dashes = {}
    for g in data["preset"].unique():
        preset = str(g).split(" ")[0]
        dashes[g] = ("solid", "dashed", "dotted", "dashdot")[min(seen.get(preset, 0), 3)]
        seen[preset] = seen.get(preset, 0) + 1
    return curves_with_bands(data, "lr", "validation accuracy %", f"tuning at depth {depth}", logy=False, logx=True,
                             colours=colours, dashes=dashes)  # fmt: skip


#: x ticks of the κ figures (matplotlib): every fourth decade up to the float64 ceiling (≈ 4.5e15)
KAPPA_DECADES = [1.0, 1e4, 1e8, 1e12, 1e16]


def kappa_vs_trainability_data(runs: pd.DataFrame, y: str = "steps_to_90") -> pd.DataFrame:
    """``preset, depth, kappa_init, y`` per preset × depth (medians over seeds; κ at the float64 ceiling if larger)."""
    require_columns(runs, ["preset", "depth", "kappa_init", y, "status"], "runs")
    r = runs[(runs["status"] == "ok") & np.isfinite(runs["kappa_init"].astype(float))]
    out = r.groupby(["preset", "depth"], sort=False).agg(kappa_init=("kappa_init", "median"), value=(y, "median"),
                                                        n=("seed", "count")).reset_index()  # fmt: skip
    out["kappa_init"] = out["kappa_init"].clip(upper=LOG_CEILING)
    out = out.dropna(subset=["value"]).reset_index(drop=True)  # e.g. never reached 90 % training accuracy
    if y.endswith("accuracy"):
        out["value"] = 100 * out["value"]
    return out


def kappa_vs_trainability(runs: pd.DataFrame, y: str = "steps_to_90") -> hv.Overlay:
    """Median Jacobian κ at initialisation (log x) against median ``y`` (steps to 90 % training accuracy, or test
    accuracy), one point per preset × depth: colour by preset, marker by depth."""
    data = kappa_vs_trainability_data(runs, y)
    if data.empty:
        raise OSAInputError(f"no finished run has both κ at initialisation and {y}; nothing to draw")
    label = {"steps_to_90": "steps to 90 % training accuracy", "test_accuracy": "test accuracy %"}.get(y, y)
    markers = dict(zip(sorted(data["depth"].unique()), ["o", "s", "^", "D", "v", "P"], strict=False))
    bokeh_markers = {"o": "circle", "s": "square", "^": "triangle", "D": "diamond", "v": "inverted_triangle", "P": "plus"}
    elements = []
    for (preset, depth), d in data.groupby(["preset", "depth"], sort=False):
        colour, marker = preset_colour(str(preset)), markers.get(depth, "o")
        pts = hv.Scatter(d, "kappa_init", ["value", "n"], label=f"{preset} · depth {depth}")
        elements.append(dual_options(pts, dict(color=colour, size=10, marker=bokeh_markers[marker], tools=["hover"]),
                                     dict(color=colour, s=60, marker=marker)))  # fmt: skip
    overlay = hv.Overlay(elements)
    return dual_options(overlay, dict(logx=True, xlabel="Jacobian κ at initialisation", ylabel=label, width=620,
                                      height=380, legend_position="right", title=f"κ at init against {label}",
                                      show_grid=True),
                        dict(logx=True, xlabel="Jacobian κ at initialisation", ylabel=label, fig_inches=(9, 4.2),
                             hooks=[_wide_axes], xticks=KAPPA_DECADES, legend_position="right",
                             title=f"κ at init against {label}", show_grid=True))  # fmt: skip


def _wide_axes(plot, element) -> None:
    """matplotlib hook: axes 1.6× as wide as tall. HoloViews' numeric ``aspect`` is a data ratio,
    which on a log axis spanning 16 decades squeezed the axes to a narrow column beside the legend."""
    ax = plot.handles["axis"]
    ax.set_aspect("auto")
    ax.set_box_aspect(1 / 1.6)
