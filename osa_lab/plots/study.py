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
    mpl_wide_axes,
    named_xticks,
    preset_colour,
    preset_style,
    require_columns,
    stacked,
    wide_figure,
)

__all__ = [
    "accuracy_vs_depth",
    "accuracy_vs_depth_data",
    "kappa_vs_trainability",
    "kappa_vs_trainability_data",
    "sub_block_kappa",
    "sub_block_kappa_by_layer",
    "sub_block_kappa_data",
    "sub_block_layer_data",
    "seed_accuracy_data",
    "loss_curves",
    "loss_curves_by_depth",
    "loss_curves_data",
    "tuning_curves",
    "tuning_curves_data",
    "tuning_kappa",
    "tuning_kappa_data",
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


def seed_accuracy_data(runs: pd.DataFrame) -> pd.DataFrame:
    """``preset, depth, seed, accuracy, x``: each finished final run's test accuracy (%), with ``x`` its
    depth moved slightly per preset (so that the seeds of presets at one depth stand apart)."""
    require_columns(runs, ["preset", "depth", "seed", "status", "test_accuracy"], "runs")
    r = runs[(runs["status"] == "ok") & runs["test_accuracy"].notna()]
    presets = list(dict.fromkeys(r["preset"]))
    offset = {p: (i - (len(presets) - 1) / 2) * 0.035 for i, p in enumerate(presets)}
    out = pd.DataFrame({"preset": r["preset"], "depth": r["depth"].astype(int), "seed": r["seed"],
                        "accuracy": 100 * r["test_accuracy"].astype(float)})  # fmt: skip
    out["x"] = out["depth"] * 2 ** out["preset"].map(offset)  # a log-2 depth axis: the same offset at each depth
    return out.reset_index(drop=True)


def accuracy_vs_depth(summary: pd.DataFrame, runs: pd.DataFrame | None = None, *, chance: float | None = None,
                      title: str | None = None) -> hv.Overlay:
    """Mean test accuracy (%) against depth per preset (line), with every seed as a point when ``runs``
    is given (else the 95 % interval, cut to 0–100 %, as a band); ``chance`` (%) draws a dotted line.

    Depth on a log-2 axis (4, 8, 16 equally apart); the legend lies right of the axes."""
    if runs is None:
        data = accuracy_vs_depth_data(summary)
        overlay = curves_with_bands(data, "depth", "test accuracy %",
                                    title or "test accuracy against depth (95 % interval)", logy=False, logx=False)
        overlay.opts(ylim=(0, 100), backend="bokeh")
        return overlay.opts(ylim=(0, 100), aspect=1.6, fig_inches=(7, 3.6), backend="matplotlib")
    data = accuracy_vs_depth_data(summary)
    seeds = seed_accuracy_data(runs)
    elements = []
    for preset in dict.fromkeys(data["preset"]):
        style = preset_style(str(preset))
        d = data[data["preset"] == preset].sort_values("depth")
        s = seeds[seeds["preset"] == preset]
        label = str(preset)
        if len(s):
            pts = hv.Scatter(s, "x", ["accuracy", "depth", "seed", "preset"])
            elements.append(dual_options(pts, dict(color=style.colour, size=6, alpha=0.6, marker="circle",
                                                   tools=["hover"]),
                                         dict(color=style.colour, s=30, alpha=0.6, marker=style.marker)))  # fmt: skip
        d = d.assign(x=d["depth"] * 2 ** seeds_offset(seeds, preset))
        line = hv.Curve(d, "x", ["mean", "n", "depth"], label=label)
        elements.append(dual_options(line, dict(color=style.colour, line_width=2, line_dash=style.dash),
                                     dict(color=style.colour, linewidth=2, linestyle=style.dash, marker=style.marker)))  # fmt: skip
    if chance is not None:
        elements.append(dual_options(hv.HLine(chance), dict(color="#666666", line_dash="dotted", line_width=1),
                                     dict(color="#666666", linestyle="dotted", linewidth=1)))  # fmt: skip
    depths = sorted(data["depth"].unique())
    title = title or "test accuracy against depth: mean (line) and every seed (points)"
    overlay = hv.Overlay(elements).redim.label(x="depth", depth="depth", mean="test accuracy %",
                                               accuracy="test accuracy %")  # fmt: skip
    lims = dict(ylim=(0, 100), xlim=(min(depths) / 1.25, max(depths) * 1.25), logx=True)
    return dual_options(overlay,
                        dict(**lims, title=title, width=760, height=400, legend_position="right", show_grid=True,
                             xticks=[(d, str(d)) for d in depths], xlabel="depth", ylabel="test accuracy %"),
                        dict(**lims, title=title, fig_inches=(9.5, 3.5), legend_position="right", show_grid=True,
                             xticks=[(d, str(d)) for d in depths], xlabel="depth", ylabel="test accuracy %",
                             hooks=[_depth_axis]))  # fmt: skip


def seeds_offset(seeds: pd.DataFrame, preset: str) -> float:
    """The log-2 offset of ``preset``'s points in :func:`seed_accuracy_data` (0 when it has none)."""
    s = seeds[seeds["preset"] == preset]
    return float(np.log2(s["x"].iloc[0] / s["depth"].iloc[0])) if len(s) else 0.0


def _depth_axis(plot, element) -> None:
    """matplotlib hook: axes 2.2× as wide as tall, and only the depths as ticks on the log-2 axis."""
    from matplotlib.ticker import NullLocator

    mpl_wide_axes(plot, element)
    plot.handles["axis"].xaxis.set_minor_locator(NullLocator())


def loss_curves_data(curves: pd.DataFrame, depth: int, metric: str = "train_loss") -> pd.DataFrame:
    """``preset, step, mean, lo, hi, std, n`` of ``metric`` over the final seeds at ``depth``."""
    require_columns(curves, ["preset", "depth", "seed", "step", metric], "curves")
    return band_over_seeds(curves[curves["depth"] == depth], "step", metric)


def loss_curves(curves: pd.DataFrame, depth: int, metric: str = "train_loss") -> hv.Overlay:
    """``metric`` against step at ``depth``: mean and min–max band over the final seeds per preset,
    one wide figure with its legend on the right."""
    label = metric.replace("_", " ")
    overlay = curves_with_bands(loss_curves_data(curves, depth, metric), "step", label,
                                f"{label} at depth {depth}: mean and min–max over seeds",
                                logy=metric.endswith("loss"), width=760, height=360)  # fmt: skip
    return _wide(overlay)


def loss_curves_by_depth(curves: pd.DataFrame, metric: str = "train_loss") -> hv.Layout:
    """One panel per depth (:func:`loss_curves`), in one column."""
    return stacked([loss_curves(curves, d, metric) for d in sorted(curves["depth"].unique())])


def _wide(overlay: hv.Overlay) -> hv.Overlay:
    """A static figure 9.5 inches wide beside its legend (:func:`~osa_lab.plots.style.wide_figure`)."""
    return wide_figure(overlay)


def _tuning_at_depth(tuning: pd.DataFrame, depth: int, columns: list[str]) -> pd.DataFrame:
    """The tuning runs at ``depth`` with a ``setting`` label: the preset, and its α-lr multiplier and
    warm-up where its search tried several (a table without ``warmup_fraction`` had one)."""
    require_columns(tuning, ["preset", "depth", "lr", "alpha_lr_mult", "tune_seed", *columns], "tuning")
    t = tuning[tuning["depth"] == depth].copy()
    if "warmup_fraction" not in t:
        t["warmup_fraction"] = float("nan")
    multi = t.groupby("preset")["alpha_lr_mult"].nunique()
    warmups = t.groupby("preset")["warmup_fraction"].nunique()
    t["setting"] = [p + (f" α-lr ×{m:.3g}" if multi.get(p, 1) > 1 else "") + (f" warm-up {w:.3g}" if warmups.get(p, 1) > 1 else "")
                    for p, m, w in zip(t["preset"], t["alpha_lr_mult"], t["warmup_fraction"], strict=True)]  # fmt: skip
    return t


def tuning_curves_data(tuning: pd.DataFrame, depth: int) -> pd.DataFrame:
    """``setting, lr, mean, lo, hi, n``: validation accuracy (%) over tuning seeds per preset (× α-lr
    multiplier × warm-up, where the search tried several; a table without ``warmup_fraction`` had one)."""
    t = _tuning_at_depth(tuning, depth, ["val_accuracy"])
    t["val_accuracy"] = 100 * t["val_accuracy"]
    return band_over_seeds(t, "lr", "val_accuracy", by=("setting",)).rename(columns={"setting": "preset"})


def tuning_kappa_data(tuning: pd.DataFrame, depth: int, part: str = "attention") -> pd.DataFrame:
    """``preset, lr, mean, lo, hi, n``: κ of sub-block ``part`` after training (each tuning run's median
    over layers and inputs, ``kappa_<part>_trained`` of ``tuning.csv``), the median over tuning seeds
    (``mean``) and their range, per setting as :func:`tuning_curves_data` labels it, at ``depth``. Only
    runs whose ``status`` is ``ok`` count: a run that failed (collapsed to chance, or a loss jump it did
    not recover from) or diverged is left out, as are runs without a trained κ (recorded before tuning
    runs kept κ, and without a checkpoint); κ beyond what float64 resolves is kept at the float64 ceiling."""
    if part not in SUB_BLOCKS:
        raise OSAInputError(f"part must be one of {', '.join(SUB_BLOCKS)}; got {part!r}")
    column = f"kappa_{part}_trained"
    t = _tuning_at_depth(tuning, depth, [column, "status"])
    t = t[t["status"] == "ok"]
    t = t[np.isfinite(t[column].astype(float)) | np.isposinf(t[column].astype(float))]
    t[column] = t[column].astype(float).clip(upper=LOG_CEILING)
    out = (t.groupby(["setting", "lr"], sort=False)[column].agg(mean="median", lo="min", hi="max", n="count")
           .reset_index().rename(columns={"setting": "preset"}))  # fmt: skip
    return out.sort_values(["preset", "lr"], kind="stable", ignore_index=True)[["preset", "lr", "mean", "lo", "hi", "n"]]


def _setting_styles(data: pd.DataFrame) -> tuple[dict[object, str], dict[object, str]]:
    """Colours by preset, and for a preset searched over several α-lr multipliers or warm-ups: solid,
    dashed, dotted … in the order its settings appear."""
    colours = {g: preset_colour(str(g).split(" ")[0]) for g in data["preset"].unique()}
    seen: dict[str, int] = {}
    dashes = {}
    for g in data["preset"].unique():
        preset = str(g).split(" ")[0]
        dashes[g] = ("solid", "dashed", "dotted", "dashdot")[min(seen.get(preset, 0), 3)]
        seen[preset] = seen.get(preset, 0) + 1
    return colours, dashes


def _learning_rate_axis(overlay: hv.Overlay, data: pd.DataFrame) -> hv.Overlay:
    lrs = data["lr"].dropna()
    if lrs.nunique() == 1:  # one learning rate so far: a log axis needs a range around it, not one point
        overlay = overlay.opts(xlim=(float(lrs.iloc[0]) / 3, float(lrs.iloc[0]) * 3))
    return _wide(overlay.redim.label(lr="learning rate"))


def tuning_curves(tuning: pd.DataFrame, depth: int) -> hv.Overlay:
    """Validation accuracy (%) against learning rate (log axis) per preset at ``depth``; diverged points are gaps."""
    data = tuning_curves_data(tuning, depth)
    colours, dashes = _setting_styles(data)
    overlay = curves_with_bands(data, "lr", "validation accuracy %",
                                f"tuning at depth {depth}: validation accuracy against learning rate", logy=False,
                                logx=True, colours=colours, dashes=dashes, width=760, height=360)  # fmt: skip
    return _learning_rate_axis(overlay, data)


def tuning_kappa(tuning: pd.DataFrame, depth: int, part: str = "attention") -> hv.Overlay:
    """κ of sub-block ``part`` after training against learning rate (both axes log) over the tuning runs at
    ``depth`` that did not fail: a line per setting through the medians over tuning seeds, their range shaded."""
    data = tuning_kappa_data(tuning, depth, part)
    if data.empty:
        raise OSAInputError(f"no tuning run at depth {depth} records κ of the {part} after training; nothing to draw")
    colours, dashes = _setting_styles(data)
    overlay = curves_with_bands(data, "lr", f"κ of the {part} (median over layers and inputs)",
                                f"tuning at depth {depth}: κ of the {part} after training against learning rate",
                                logy=True, logx=True, colours=colours, dashes=dashes, width=760, height=360)  # fmt: skip
    return _learning_rate_axis(overlay, data)


#: how the κ figures name the float64 ceiling (1/ε of float64)
KAPPA_CEILING_TEXT = f"{LOG_CEILING:.1e}".replace("e+", "e")

#: x ticks of the κ figures (matplotlib): every fourth decade up to the float64 ceiling (≈ 4.5e15)
KAPPA_DECADES = [1.0, 1e4, 1e8, 1e12, 1e16]


def kappa_vs_trainability_data(runs: pd.DataFrame, y: str = "steps_to_90") -> pd.DataFrame:
    """``preset, depth, kappa_init, value, n, beyond`` per preset × depth (medians over seeds; a κ beyond what
    float64 resolves, ``beyond``, is placed at the float64 ceiling)."""
    require_columns(runs, ["preset", "depth", "kappa_init", y, "status"], "runs")
    r = runs[(runs["status"] == "ok") & np.isfinite(runs["kappa_init"].astype(float))]
    out = r.groupby(["preset", "depth"], sort=False).agg(kappa_init=("kappa_init", "median"), value=(y, "median"),
                                                        n=("seed", "count")).reset_index()  # fmt: skip
    out["beyond"] = out["kappa_init"] >= LOG_CEILING  # unresolved by float64: drawn as ✕ at the ceiling
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
    bokeh_markers = {"X": "x", "o": "circle", "s": "square", "^": "triangle", "D": "diamond", "v": "inverted_triangle", "P": "plus"}
    elements = []
    for (preset, depth), d in data.groupby(["preset", "depth"], sort=False):
        colour, marker = preset_colour(str(preset)), markers.get(depth, "o")
        name = f"{preset} · depth {depth}"
        if bool(d["beyond"].iloc[0]):  # not a measured value: ✕ at the ceiling, said in the legend
            marker, name = "X", f"{name} (κ > {KAPPA_CEILING_TEXT})"  # matplotlib's filled ✕
        pts = hv.Scatter(d, "kappa_init", ["value", "n"], label=name)
        elements.append(dual_options(pts, dict(color=colour, size=10, marker=bokeh_markers[marker], tools=["hover"]),
                                     dict(color=colour, s=110 if marker == "X" else 60, marker=marker)))  # fmt: skip
    overlay = hv.Overlay(elements)
    return dual_options(overlay, dict(logx=True, xlabel="Jacobian κ at initialisation", ylabel=label, width=620,
                                      height=380, legend_position="right", title=f"κ at init against {label}",
                                      show_grid=True),
                        dict(logx=True, xlabel="Jacobian κ at initialisation", ylabel=label, fig_inches=(9, 4.2),
                             hooks=[_wide_axes], xticks=KAPPA_DECADES, legend_position="right",
                             title=f"κ at init against {label}", show_grid=True))  # fmt: skip


#: the sub-blocks in the order a token meets them (the columns ``kappa_<part>_<when>`` of runs.csv)
SUB_BLOCKS = ("embedding", "attention", "mlp", "readout")


def sub_block_kappa_data(runs: pd.DataFrame, depth: int, when: str = "init") -> pd.DataFrame:
    """``preset, position, part, mean, lo, hi, n`` at ``depth``: per preset and sub-block the median
    over seeds (``mean``) and the seeds' range of the runs' κ (each run's median over layers and
    inputs), at initialisation (``when="init"``) or after training (``"trained"``). κ beyond what
    float64 resolves is kept at the float64 ceiling."""
    columns = [f"kappa_{part}_{when}" for part in SUB_BLOCKS]
    require_columns(runs, ["preset", "depth", "seed", *columns], "runs")
    r = runs[runs["depth"] == depth]
    rows = []
    for preset, d in r.groupby("preset", sort=False):
        for position, (part, column) in enumerate(zip(SUB_BLOCKS, columns, strict=True), start=1):
            values = d[column].astype(float).dropna().clip(upper=LOG_CEILING)
            if len(values):
                rows.append(dict(preset=preset, position=position, part=part, mean=float(values.median()),
                                 lo=float(values.min()), hi=float(values.max()), n=len(values)))  # fmt: skip
    return pd.DataFrame(rows, columns=["preset", "position", "part", "mean", "lo", "hi", "n"])


def sub_block_kappa(runs: pd.DataFrame, depth: int, when: str = "init") -> hv.Overlay:
    """Where each preset loses its conditioning: κ of the embedding, attention, MLP and readout
    (log y; a line per preset through the sub-blocks, the seeds' range shaded) at ``depth``."""
    data = sub_block_kappa_data(runs, depth, when)
    if data.empty:
        raise OSAInputError(f"no run at depth {depth} records κ per sub-block ({when}); nothing to draw")
    moment = "at initialisation" if when == "init" else "after training"
    overlay = curves_with_bands(data, "position", "κ (median over layers)", f"κ per sub-block {moment}, depth {depth}",
                                logy=True)  # fmt: skip
    ticks = [(i, part) for i, part in enumerate(SUB_BLOCKS, start=1)]
    return overlay.opts(xticks=ticks, xlabel="sub-block", backend="bokeh").opts(
        xticks=ticks, xlabel="sub-block", backend="matplotlib"
    )


def sub_block_layer_data(layers: pd.DataFrame, depth: int, when: str = "init") -> pd.DataFrame:
    """``preset, position, part, layer, mean, lo, hi, n`` at ``depth`` from the study's
    ``sub_block_layers`` table: per preset, each sub-block in the order a token meets it (position 0
    the embedding, 2l − 1 and 2l layer l's attention and MLP, 2L + 1 the readout), the median over
    seeds (``mean``) and the seeds' range of κ, at initialisation or after training. κ beyond what
    float64 resolves is kept at the float64 ceiling."""
    require_columns(layers, ["preset", "depth", "seed", "when", "part", "layer", "kappa"], "sub_block_layers")
    r = layers[(layers["depth"] == depth) & (layers["when"] == when)].copy()
    columns = ["preset", "position", "part", "layer", "mean", "lo", "hi", "n"]
    if r.empty:
        return pd.DataFrame(columns=columns)

    def position(part: str, layer: int) -> int:
        return {"embedding": 0, "attention": 2 * layer - 1, "mlp": 2 * layer}.get(part, 2 * depth + 1)

    r["position"] = [position(part, int(layer)) for part, layer in zip(r["part"], r["layer"], strict=True)]
    r["kappa"] = r["kappa"].astype(float).clip(upper=LOG_CEILING)
    out = (r.groupby(["preset", "position", "part", "layer"], sort=False)["kappa"]
           .agg(mean="median", lo="min", hi="max", n="count").reset_index())  # fmt: skip
    return out.sort_values(["preset", "position"], kind="stable", ignore_index=True)[columns]


def sub_block_kappa_by_layer(layers: pd.DataFrame, depth: int, when: str = "init") -> hv.Overlay:
    """Where along the network each preset loses its conditioning: κ of every sub-block in the order a
    token meets it (embedding, attention 1, MLP 1, …, readout; log y), a line per preset through the
    medians over seeds, the seeds' range shaded, at ``depth``."""
    data = sub_block_layer_data(layers, depth, when)
    if data.empty:
        raise OSAInputError(f"no run at depth {depth} records κ per sub-block and layer ({when}); nothing to draw")
    moment = "at initialisation" if when == "init" else "after training"
    overlay = curves_with_bands(data.drop(columns=["part", "layer"]), "position", "κ",
                                f"κ of each sub-block along the network {moment}, depth {depth}", logy=True)  # fmt: skip
    step = max(1, depth // 4)  # about four named layers; "attn 1" would crowd "embed" beside it
    ticks = [(0, "embed")] + [(2 * l - 1, f"attn {l}") for l in range(step, depth + 1, step)] + [(2 * depth + 1, "readout")]
    return named_xticks(overlay, ticks, "sub-block (attention l, then MLP l)")


def _wide_axes(plot, element) -> None:
    """matplotlib hook: axes 1.6× as wide as tall. HoloViews' numeric ``aspect`` is a data ratio,
    which on a log axis spanning 16 decades squeezed the axes to a narrow column beside the legend."""
    ax = plot.handles["axis"]
    ax.set_aspect("auto")
    ax.set_box_aspect(1 / 1.6)
