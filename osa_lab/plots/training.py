"""Plot builders for training runs: learning curves, α over training, hidden-state diagnostics, summary.

They draw from the tidy metrics table of :func:`osa_lab.studies.training.train` / :func:`osa_lab.studies.training.compare`
(columns ``preset, data, seed, epoch, step, kind, metric, layer, head, value``) and the summary
table of :func:`osa_lab.studies.training.summarize_runs` (docs/design.md §6, "tidy tables first, plots second").
Every builder returns a HoloViews object with options for both backends (bokeh for the
dashboard, matplotlib for the report notebooks) and reduces over seeds itself (mean line,
min–max band); the ``*_data`` helpers return exactly the reduced table a plot draws.

The question these figures answer (Zhang & Martens 2026, docs/design.md §5): does a skipless,
normless transformer with OSA train like a skip-connected ViT, and does the rank of its hidden
states stay put during training while skipless softmax attention's collapses (Dong et al. 2021)?
"""

from __future__ import annotations

from collections.abc import Sequence

import holoviews as hv
import pandas as pd

from osa_lab.errors import OSAInputError
from osa_lab.plots.depth import png_bytes
from osa_lab.plots.style import (
    band_over_seeds,
    bars_by_preset,
    curves_with_bands,
    dual_options,
    preset_colour,
    require_columns,
    spans_decades,
    stacked,
    wide_figure,
)

__all__ = [
    "ablation_bars",
    "ablation_data",
    "ablation_percent",
    "alpha_curves",
    "alpha_data",
    "depth_profiles",
    "depth_profiles_data",
    "diagnostics_over_training",
    "diagnostics_over_training_data",
    "learning_curve_data",
    "learning_curves",
    "learning_panel",
    "mixing_profiles",
    "mixing_profiles_data",
    "mixing_summary",
    "paired_differences_plot",
    "paired_percent",
    "png_bytes",
    "summary_bars",
]

_METRICS_COLUMNS = ("preset", "seed", "epoch", "step", "kind", "metric", "layer", "head", "value")

_LABELS = {
    "train_loss": "train loss",
    "test_loss": "test loss",
    "train_accuracy": "train accuracy",
    "test_accuracy": "test accuracy",
    "lr": "learning rate",
    "epoch_time_s": "seconds per epoch",
}


def _label(metric: str) -> str:
    return _LABELS.get(metric, metric.replace("_", " "))


def _select(metrics: pd.DataFrame, metric: str, kind: str | None = None) -> pd.DataFrame:
    require_columns(metrics, list(_METRICS_COLUMNS), "training metrics table")
    df = metrics if kind is None else metrics[metrics["kind"] == kind]
    known = list(dict.fromkeys(df["metric"].tolist()))
    if metric not in known:
        raise OSAInputError(f"metric {metric!r} is not in the training metrics table; it has {known}")
    return df[df["metric"] == metric]


def _logy(data: pd.DataFrame, logy: bool | None) -> bool:
    return spans_decades(data[["mean", "lo", "hi"]].to_numpy().ravel()) if logy is None else logy


# ----------------------------------------------------------------------------- learning curves


def learning_curve_data(metrics: pd.DataFrame, metric: str = "test_accuracy") -> pd.DataFrame:
    """``preset, epoch, mean, lo, hi, std, n`` of a per-epoch metric (mean and min–max over seeds)."""
    df = _select(metrics, metric)
    df = df[df["kind"].isin(["train", "eval", "time"])]
    return band_over_seeds(df, "epoch", "value")


def learning_curves(
    metrics: pd.DataFrame,
    metric: str = "test_accuracy",
    *,
    logy: bool | None = None,
    title: str | None = None,
) -> hv.Overlay:
    """A per-epoch metric (``train_loss``, ``test_accuracy`` …) against epoch, one curve per preset.

    Accuracies are drawn in percent (the unit of every accuracy in the reports; the table of
    :func:`learning_curve_data` keeps fractions, as logged). ``logy=None`` uses a log axis when
    the values span more than two decades (losses often do).
    """
    data = learning_curve_data(metrics, metric)
    label = _label(metric)
    if metric.endswith("accuracy"):
        data = data.assign(**{c: 100 * data[c] for c in ("mean", "lo", "hi", "std")})
        label = f"{label} %"
    return curves_with_bands(data, "epoch", label, title or f"{label} during training", _logy(data, logy))


def learning_panel(
    metrics: pd.DataFrame, metric_names: Sequence[str] = ("train_loss", "test_accuracy")
) -> hv.Layout:
    """Learning curves of several metrics (default: train loss and test accuracy), one wide panel
    each, in one column (side by side, each panel's legend would lie over its neighbour)."""
    return stacked([learning_curves(metrics, m) for m in metric_names])


# ----------------------------------------------------------------------------- alpha


def alpha_data(metrics: pd.DataFrame, preset: str | None = None) -> pd.DataFrame:
    """``layer, epoch, mean, lo, hi, std, n`` of OSA's α (averaged over heads, band over seeds).

    ``preset`` picks one preset (default: the first with α rows).
    """
    df = _select(metrics, "alpha", kind="alpha")
    presets = list(dict.fromkeys(df["preset"].tolist()))
    preset = preset if preset is not None else presets[0]
    if preset not in presets:
        raise OSAInputError(f"preset {preset!r} has no α rows; presets with OSA layers: {presets}")
    df = df[df["preset"] == preset]
    per_seed = df.groupby(["layer", "seed", "epoch"], as_index=False)["value"].mean()
    per_seed["layer"] = "layer " + (per_seed["layer"].astype(int) + 1).astype(str)
    return band_over_seeds(per_seed, "epoch", "value", by=("layer",))


def alpha_curves(metrics: pd.DataFrame, preset: str | None = None, *, title: str | None = None) -> hv.Overlay:
    """OSA's α per layer (mean over heads) against epoch: does training move it from α₀?"""
    data = alpha_data(metrics, preset)
    name = preset or list(dict.fromkeys(metrics.loc[metrics["kind"] == "alpha", "preset"]))[0]
    return curves_with_bands(data, "epoch", "α (mean over heads)", title or f"α during training ({name})",
                              False, group="layer")  # fmt: skip


# ----------------------------------------------------------------------------- hidden-state diagnostics


def _hidden(metrics: pd.DataFrame, metric: str) -> pd.DataFrame:
    return _select(metrics, metric, kind="hidden")


def diagnostics_over_training_data(
    metrics: pd.DataFrame, metric: str = "stable_rank", layer: int | None = None
) -> pd.DataFrame:
    """``preset, step, mean, lo, hi, std, n`` of a hidden-state metric at one layer (default: the last)."""
    df = _hidden(metrics, metric)
    if layer is None:
        df = df[df["layer"] == df.groupby("preset")["layer"].transform("max")]
    else:
        if layer not in set(df["layer"]):
            raise OSAInputError(f"layer {layer} is not in the table; it has {sorted(set(df['layer']))}")
        df = df[df["layer"] == layer]
    return band_over_seeds(df, "step", "value")


def diagnostics_over_training(
    metrics: pd.DataFrame,
    metric: str = "stable_rank",
    layer: int | None = None,
    *,
    logy: bool | None = None,
    title: str | None = None,
) -> hv.Overlay:
    """A rank-collapse/conditioning metric (docs/design.md §4) of the last (or ``layer``-th) hidden state vs step."""
    data = diagnostics_over_training_data(metrics, metric, layer)
    where = "last layer" if layer is None else f"layer {layer}"
    label = _label(metric)
    return curves_with_bands(data, "step", label, title or f"{label} at the {where} during training",
                              _logy(data, logy))  # fmt: skip


def depth_profiles_data(metrics: pd.DataFrame, metric: str = "stable_rank") -> pd.DataFrame:
    """``profile, layer, mean, lo, hi, std, n``: the metric across depth at init and after training.

    ``profile`` is ``"<preset> · init"`` (step 0) or ``"<preset> · trained"`` (last step).
    """
    df = _hidden(metrics, metric)
    last = df.groupby(["preset", "seed"])["step"].transform("max")
    first = df.groupby(["preset", "seed"])["step"].transform("min")
    init = df[df["step"] == first].assign(profile=lambda d: d["preset"] + " · init")
    trained = df[(df["step"] == last) & (last > first)].assign(profile=lambda d: d["preset"] + " · trained")
    both = pd.concat([init, trained], ignore_index=True)
    order = [f"{p} · {s}" for p in dict.fromkeys(df["preset"]) for s in ("init", "trained")]
    both["profile"] = pd.Categorical(both["profile"], [o for o in order if o in set(both["profile"])])
    both = both.sort_values("profile")
    both["profile"] = both["profile"].astype(str)
    return band_over_seeds(both, "layer", "value", by=("profile",))


def depth_profiles(
    metrics: pd.DataFrame, metric: str = "stable_rank", *, logy: bool | None = None, title: str | None = None
) -> hv.Overlay:
    """The metric against layer at initialisation (dashed) and after training (solid), per preset."""
    data = depth_profiles_data(metrics, metric)
    label = _label(metric)
    return curves_with_bands(data, "layer", label, title or f"{label} across depth: init vs trained",
                             _logy(data, logy), group="profile", **_profile_styles(data))  # fmt: skip


def _profile_styles(data: pd.DataFrame) -> dict[str, dict[str, str]]:
    """Colours (the preset's fixed colour, bands included) and dashes (init dashed, trained solid)
    of the ``"<preset> · init|trained"`` profiles."""
    profiles = list(dict.fromkeys(data["profile"]))
    colours = {p: preset_colour(p.split(" · ")[0]) for p in profiles}
    dashes = {p: "dashed" if p.partition(" · ")[2] == "init" else "solid" for p in profiles}
    return dict(colours=colours, dashes=dashes)


# ----------------------------------------------------------------------------- summary


def summary_bars(
    summary: pd.DataFrame, *, title: str = "final test accuracy (mean ± std over seeds)"
) -> hv.Overlay:
    """Bars of mean final test accuracy (%) per preset with ± std error bars (from :func:`osa_lab.studies.training.summarize_runs`).

    The axis starts at 0 (a truncated axis would exaggerate the gaps between presets); each
    bar has its preset's fixed colour (:func:`~osa_lab.plots.style.preset_colour`).
    """
    require_columns(summary, ["preset", "test_accuracy_mean", "test_accuracy_std"], "summary table")
    d = summary.assign(
        accuracy=100 * summary["test_accuracy_mean"], err=100 * summary["test_accuracy_std"].fillna(0.0)
    )
    lo = 0.0
    bars = dual_options(
        bars_by_preset(hv.Bars(d, "preset", ["accuracy", "err"]).redim.label(accuracy="test accuracy %")),
        dict(tools=["hover"], ylim=(lo, 100), xrotation=20),
        dict(ylim=(lo, 100), xrotation=20),
    )
    errors = hv.ErrorBars(d, "preset", ["accuracy", "err"])
    return wide_figure(dual_options(
        bars * errors,
        dict(title=title, width=520, height=340, show_grid=True),
        dict(title=title, show_grid=True),
    ), inches=(9.5, 4.4))  # no legend beside it: taller, so that the axes alone are wide enough


# ----------------------------------------------------------------------------- token mixing


def mixing_profiles_data(metrics: pd.DataFrame, metric: str = "mixing_ratio") -> pd.DataFrame:
    """``profile, layer, mean, lo, hi, std, n``: a mixing metric per OSA layer at init and after training.

    ``metric`` is ``"mixing_ratio"`` (‖exp(S)V − V‖/‖V‖ on held-out inputs) or ``"s_norm"``
    (‖S‖₂), logged per OSA layer and head by :func:`osa_lab.studies.training.train`; heads are averaged
    per seed, the band is min–max over seeds. ``layer`` is 1-based (the OSA layer in block
    order). ``profile`` is ``"<preset> · init"`` or ``"<preset> · trained"``.
    """
    df = _select(metrics, metric, kind="mixing")
    per_seed = df.groupby(["preset", "seed", "step", "layer"], as_index=False)["value"].mean()
    last = per_seed.groupby(["preset", "seed"])["step"].transform("max")
    first = per_seed.groupby(["preset", "seed"])["step"].transform("min")
    init = per_seed[per_seed["step"] == first].assign(stage="init")
    trained = per_seed[(per_seed["step"] == last) & (last > first)].assign(stage="trained")
    both = pd.concat([init, trained], ignore_index=True)
    both["profile"] = both["preset"] + " · " + both["stage"]
    both["layer"] = both["layer"].astype(int) + 1
    order = [f"{p} · {s}" for p in dict.fromkeys(df["preset"]) for s in ("init", "trained")]
    both["profile"] = pd.Categorical(both["profile"], [o for o in order if o in set(both["profile"])])
    both = both.sort_values(["profile", "layer"])
    both["profile"] = both["profile"].astype(str)
    return band_over_seeds(both, "layer", "value", by=("profile",))


def mixing_profiles(
    metrics: pd.DataFrame, metric: str = "mixing_ratio", *, logy: bool | None = None, title: str | None = None
) -> hv.Overlay:
    """How much each OSA layer mixes tokens, at init (dashed) and after training (solid)."""
    data = mixing_profiles_data(metrics, metric)
    label = {"mixing_ratio": "‖exp(S)V − V‖ / ‖V‖", "s_norm": "‖S‖₂"}.get(metric, _label(metric))
    return curves_with_bands(data, "layer", label, title or f"{label} per OSA layer: init vs trained",
                             _logy(data, logy), group="profile", **_profile_styles(data))  # fmt: skip


def mixing_summary(metrics: pd.DataFrame) -> pd.DataFrame:
    """Tidy per preset × OSA layer × head at the last step: ``alpha``, ``abs_alpha`` (mean of |α|),
    ``s_norm``, ``mixing_ratio`` (means over seeds).

    The table behind the statement "α is small, but S is not": α alone does not say how much
    OSA mixes, because ``S = α/√r (QKᵀ − KQᵀ)`` also scales with the hidden-state norms.
    """
    require_columns(metrics, list(_METRICS_COLUMNS), "training metrics table")
    df = metrics[metrics["kind"].isin(["mixing", "alpha"]) & metrics["metric"].isin(["alpha", "s_norm", "mixing_ratio"])]
    if df.empty:
        raise OSAInputError("the metrics table has no mixing rows (no OSA preset, or a run that did not log token mixing)")
    last = df.groupby(["preset", "seed", "metric"])["step"].transform("max")
    df = df[df["step"] == last]
    # |α| too: heads (and seeds) take both signs, so a mean of the signed α understates its size
    df = pd.concat([df, df[df["metric"] == "alpha"].assign(metric="abs_alpha", value=lambda d: d["value"].abs())])
    out = df.groupby(["preset", "layer", "head", "metric"], as_index=False)["value"].mean()
    wide = out.pivot_table(index=["preset", "layer", "head"], columns="metric", values="value").reset_index()
    wide.columns.name = None
    wide["layer"] = wide["layer"].astype(int) + 1
    return wide


def ablation_data(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per preset with OSA layers: held-out accuracy with the learned α and with α := 0 after training.

    Columns ``preset, split, seeds, accuracy_mean, accuracy_std, alpha0_mean, alpha0_std,
    drop_mean, drop_std`` (``split``: ``val`` when the runs held out a validation split, else ``test``).
    """
    require_columns(metrics, list(_METRICS_COLUMNS), "training metrics table")
    m = metrics[metrics["kind"] == "mixing"]
    sel = m[m["metric"].str.endswith("_accuracy_alpha0")]
    if sel.empty:
        raise OSAInputError("the metrics table has no 'α := 0 after training' rows (no OSA preset finished)")
    rows = []
    for (preset, metric), g in sel.groupby(["preset", "metric"], sort=False):
        split = metric.split("_")[0]
        drop = m[(m["preset"] == preset) & (m["metric"] == f"{metric}_drop")]
        zero = g.groupby("seed")["value"].last()
        d = drop.groupby("seed")["value"].last().reindex(zero.index)
        full = zero + d
        rows.append({"preset": preset, "split": split, "seeds": len(zero),
                     "accuracy_mean": full.mean(), "accuracy_std": full.std(ddof=1),
                     "alpha0_mean": zero.mean(), "alpha0_std": zero.std(ddof=1),
                     "drop_mean": d.mean(), "drop_std": d.std(ddof=1)})  # fmt: skip
    return pd.DataFrame(rows)


#: The two settings of :func:`ablation_bars`, in drawing order.
ABLATION_SETTINGS = ("as trained", "α := 0")


def _mpl_preset_groups(plot, element) -> None:
    """Matplotlib hook of :func:`ablation_bars`: one label per preset, under the centre of its
    group of bars, and a legend for the settings (solid: as trained; lighter, hatched: α := 0).

    HoloViews labels every bar of grouped bars with its setting and, on the same row, its preset,
    so long preset names ran into the setting labels beside them."""
    import matplotlib.patches as mpatches

    ax = plot.handles["axis"]
    presets = [str(p) for p in dict.fromkeys(element.dimension_values(0))]
    bars = sorted(ax.patches, key=lambda p: p.get_x())
    per_group = len(bars) // max(len(presets), 1)
    if per_group < 1 or per_group * len(presets) != len(bars):
        return  # not the layout this hook knows: keep HoloViews' labels
    centres = [sum(b.get_x() + b.get_width() / 2 for b in bars[i * per_group:(i + 1) * per_group]) / per_group
               for i in range(len(presets))]
    ax.set_xticks([], minor=True)
    ax.set_xticks(centres, presets, rotation=0, ha="center")
    for label in ax.get_xticklabels():
        label.set_y(0)  # HoloViews lowers every other group label: one row is enough now
    ax.set_xlabel("preset")
    handles = [mpatches.Patch(facecolor="#555555", label=ABLATION_SETTINGS[0]),
               mpatches.Patch(facecolor="#555555", alpha=0.45, hatch="//", edgecolor="white",
                              label=ABLATION_SETTINGS[1])]
    # beside the axes, never over a bar
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize="small")


def ablation_bars(metrics: pd.DataFrame, *, title: str = "accuracy with learned α vs α := 0 after training") -> hv.Overlay:
    """Grouped bars per OSA preset: held-out accuracy as trained and with every α set to 0.

    Bars take the preset's fixed colour; the α := 0 bar of each preset is lighter (and hatched in
    the matplotlib backend, which labels each group once with its preset and explains the two
    settings in a legend; bokeh draws the setting above the preset on its nested axis).
    """
    d = ablation_data(metrics)
    long = pd.concat([
        d.assign(setting=ABLATION_SETTINGS[0], accuracy=100 * d["accuracy_mean"]),
        d.assign(setting=ABLATION_SETTINGS[1], accuracy=100 * d["alpha0_mean"]),
    ])[["preset", "setting", "accuracy"]]  # fmt: skip
    bars = bars_by_preset(hv.Bars(long, ["preset", "setting"], "accuracy").redim.label(accuracy="held-out accuracy %"))
    hooks = list(hv.Store.lookup_options("matplotlib", bars, "plot").kwargs.get("hooks", []) or [])
    return wide_figure(dual_options(
        bars,
        dict(title=title, width=520, height=340, show_grid=True, tools=["hover"], ylim=(0, 100)),
        dict(title=title, show_grid=True, ylim=(0, 100), hooks=[*hooks, _mpl_preset_groups]),
    ))


def ablation_percent(metrics: pd.DataFrame) -> pd.DataFrame:
    """:func:`ablation_data` with the accuracies and drops in percent (points), for display."""
    d = ablation_data(metrics)
    cols = [c for c in d.columns if c.endswith(("_mean", "_std"))]
    return d.assign(**{c: 100 * d[c] for c in cols}).rename(columns={c: c + " %" for c in cols})


def paired_percent(paired: pd.DataFrame) -> pd.DataFrame:
    """The paired-differences table of :func:`osa_lab.studies.training.paired_differences` in points (percent)."""
    cols = [c for c in ("diff_mean", "diff_std", "ci_low", "ci_high", "osa_mean", "other_mean") if c in paired]
    return paired.assign(**{c: 100 * paired[c] for c in cols}).rename(columns={c: c + " (points)" for c in cols})


def paired_differences_plot(paired: pd.DataFrame, *, title: str | None = None) -> hv.Overlay:
    """Paired per-seed differences (skipless OSA − preset, points) with their 95 % intervals (bars)."""
    require_columns(paired, ["preset", "diff_mean", "ci_low", "ci_high"], "paired-differences table")
    d = paired.assign(
        diff=100 * paired["diff_mean"],
        neg=100 * (paired["diff_mean"] - paired["ci_low"]).fillna(0.0),
        pos=100 * (paired["ci_high"] - paired["diff_mean"]).fillna(0.0),
    )
    title = title or "skipless-osa − preset, test accuracy points (95 % CI)"
    colours = {p: preset_colour(str(p)) for p in dict.fromkeys(d["preset"])}
    pts = dual_options(
        hv.Scatter(d, "preset", "diff").redim.label(diff="difference (points)"),
        dict(color=hv.dim("preset").categorize(colours), size=10),
        dict(color=hv.dim("preset").categorize(colours), s=60),
    )
    err = hv.ErrorBars(d, "preset", ["diff", "neg", "pos"])
    zero = hv.HLine(0.0)
    return wide_figure(dual_options(
        pts * err * zero,
        dict(title=title, width=520, height=340, show_grid=True, xrotation=20),
        dict(title=title, show_grid=True, xrotation=20),
    ), inches=(9.5, 4.4))  # no legend beside it: taller, so that the axes alone are wide enough
