"""Sentences of the report notebooks, written from the tables of the run that shows them.

Every sentence of a report that states a number or a conclusion comes from one of these
functions, called on the run's own tables and parameters: change a parameter or a result and
the sentence changes with it (tests/reporting/test_texts.py). Each returns Markdown; the notebooks
display it with :func:`osa_lab.reporting.kernel_setup.say`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from osa_lab.reporting.tables import kappa_text as kappa
from osa_lab.reporting.tables import number
from osa_lab.studies.summaries import listing

#: κ of a float64 matrix is resolved only up to 1/ε ≈ 4.5e15 (the smallest singular value is
#: rounding noise beyond).
KAPPA_RESOLVED = 1.0 / float(np.finfo(np.float64).eps)

#: Two curves closer than this fraction of the y axis' range (in decades on a log axis) at every
#: layer are drawn on top of each other: the report says which one hides the other.
COINCIDE = 0.02


def plural(count: int, word: str) -> str:
    """``1 seed``, ``2 seeds``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def code(name: object) -> str:
    return f"`{name}`"


# ---------------------------------------------------------------------------------------------
# report 01: accuracy and cost of the matrix exponential
# ---------------------------------------------------------------------------------------------


def timing_text(slopes: pd.DataFrame, timings: pd.DataFrame) -> str:
    """The fitted power laws of the timing table as measured, each flagged when it cannot be trusted.

    ``slopes`` is :func:`osa_lab.studies.expm_accuracy.fit_slopes` output, ``timings`` the
    :func:`~osa_lab.studies.expm_accuracy.timing_table` it was fitted on.
    """
    repeats = sorted({int(r) for r in timings["repeats"]}) if "repeats" in timings else []
    how = (f"median of {listing(repeats)} timed run{'s' if max(repeats) > 1 else ''} per point after one "
           "warm-up run" if repeats else "one timed run per point")
    lines = [f"Times are the {how}, {timings['threads'].iloc[0]} torch thread(s)." if "threads" in timings
             else f"Times are the {how}."]
    trusted, doubtful = [], []
    for row in slopes.itertuples():
        if not math.isfinite(row.slope):
            doubtful.append(f"- {code(row.method)}: no slope (fewer than two timed sizes).")
            continue
        fit = (f"{code(row.method)}: slope **{row.slope:.2f}** (expected ≈ {row.expected:g}), "
               f"fitted on N = {row.n_min}…{row.n_max}")
        if row.trusted:
            trusted.append(f"- {fit}.")
        else:
            doubtful.append(f"- {fit} — **not a trustworthy fit**: {row.doubt}.")
    lines.append("\n".join(trusted + doubtful))
    if doubtful:
        lines.append("A flagged slope says nothing about the method's complexity: rerun with more `repeat`s "
                     "and larger `ns_timing` on a quiet machine.")
    noisy = timings[(timings.get("seconds_min", timings["seconds"]) > 0)]
    if {"seconds_min", "seconds_max"} <= set(noisy.columns) and len(noisy) and max(repeats, default=1) > 1:
        ratio = noisy["seconds_max"] / noisy["seconds_min"]
        worst = noisy.loc[ratio.idxmax()]
        lines.append(f"Noisiest point: {code(worst['method'])} at N = {int(worst['n'])}, whose repeats ranged "
                     f"{number(worst['seconds_min'])}–{number(worst['seconds_max'])} s ({ratio.max():.1f}×).")
    return "\n\n".join(lines)


def speedup_text(timings: pd.DataFrame, slopes: pd.DataFrame | None = None) -> str:
    """How the time of low-rank OSA compares with softmax attention and dense OSA at the largest shared N.

    With ``slopes`` (:func:`timing_text`'s), a comparison involving a method whose fit is flagged
    untrustworthy states the two times only, says why, and draws no "× faster" from them."""
    doubtful = set()
    if slopes is not None and len(slopes):
        doubtful = {str(r.method) for r in slopes.itertuples() if not (math.isfinite(r.slope) and r.trusted)}
    wide = timings.pivot_table(index="n", columns="method", values="seconds")
    parts = []
    for other in ("sdpa", "dense"):
        if {"lowrank", other} <= set(wide.columns):
            both = wide[["lowrank", other]].dropna()
            if len(both):
                n = int(both.index.max())
                ratio = both.loc[n, other] / both.loc[n, "lowrank"]
                verdict = "faster" if ratio > 1 else "slower"
                flagged = sorted({"lowrank", other} & doubtful)
                if flagged:
                    parts.append(f"at N = {n}, low-rank OSA took {number(both.loc[n, 'lowrank'])} s and {code(other)} "
                                 f"{number(both.loc[n, other])} s — no speed-up is claimed from these times: "
                                 + (f"the fits of {listing(map(code, flagged))} are" if len(flagged) > 1
                                    else f"the fit of {code(flagged[0])} is") + " flagged untrustworthy above")
                    continue
                parts.append(f"at N = {n}, low-rank OSA took {number(both.loc[n, 'lowrank'])} s against "
                             f"{number(both.loc[n, other])} s for {code(other)} ({number(max(ratio, 1 / ratio))}× "
                             f"{verdict})")
    return ("In this run " + "; ".join(parts) + ".") if parts else ""


def accuracy_text(acc: pd.DataFrame) -> str:
    """The largest relative error per dtype and method of the accuracy table, as measured."""
    worst = acc.groupby(["dtype", "method"])["rel_error"].max()
    parts = [f"{code(m)} {d}: {number(v, 2)}" for (d, m), v in worst.items()]
    largest_norm = float(acc["norm_s"].max())
    return (f"Largest relative error against the float64 reference over every N, α and seed of this run "
            f"(‖S‖₂ up to {number(largest_norm)}): " + "; ".join(parts) + ".")


# ---------------------------------------------------------------------------------------------
# report 02: rank collapse at initialisation
# ---------------------------------------------------------------------------------------------


def sweep_settings(presets: Sequence[str], depth: int, tokens: int, dim: int, seeds: int) -> str:
    return (f"{plural(len(presets), 'preset')} ({listing(map(code, presets))}) at depth {depth}, N = {tokens} "
            f"tokens, width d = {dim}, {plural(int(seeds), 'seed')}")


def metric_ends(metrics: pd.DataFrame, metric: str) -> pd.DataFrame:
    """``preset, input, last, last_layer``: ``metric`` after the input and after the last block
    (mean over seeds, whole-block site)."""
    df = metrics[metrics["metric"] == metric]
    if "site" in df and (df["site"] == "block").any():
        df = df[df["site"] == "block"]
    rows = []
    for preset, g in df.groupby("preset", sort=False):
        last = int(g["layer"].max())
        rows.append({"preset": preset, "input": g[g["layer"] == 0]["value"].mean(),
                     "last": g[g["layer"] == last]["value"].mean(), "last_layer": last})
    return pd.DataFrame(rows)


def hidden_curves(metrics: pd.DataFrame, metric: str, tolerance: float = COINCIDE, site: str = "block",
                  logy: bool | None = None) -> list[tuple[str, str]]:
    """``(hidden, on_top)`` preset pairs whose mean curves of ``metric`` (at ``site``, when the
    table has sites) are drawn on top of each other: at every layer closer than ``tolerance``
    of the y axis' range, on a log axis in decades (``logy=None``: log when the values span more
    than two decades, as the figures choose). The later-drawn preset hides the earlier one."""
    from osa_lab.plots.style import LOG_CEILING, LOG_FLOOR, spans_decades

    df = metrics[metrics["metric"] == metric]
    if "site" in df and (df["site"] == site).any():
        df = df[df["site"] == site]
    means = df.groupby(["preset", "layer"], sort=False)["value"].mean().unstack("layer")
    values = means.to_numpy(float)
    if logy is None:
        logy = spans_decades(values.ravel())
    if logy:
        values = np.log10(np.clip(np.where(np.isnan(values), np.nan, values), LOG_FLOOR, LOG_CEILING))
    finite = values[np.isfinite(values)]
    span = float(finite.max() - finite.min()) if finite.size else 0.0
    span = span if span > 0 else 1.0
    order = list(dict.fromkeys(df["preset"]))
    rows = {p: values[i] for i, p in enumerate(means.index)}
    pairs = []
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            x, y = rows[a], rows[b]
            ok = np.isfinite(x) & np.isfinite(y)
            if ok.any() and np.all(np.abs(x - y)[ok] <= tolerance * span):
                pairs.append((a, b))
    return pairs


def rank_collapse_text(metrics: pd.DataFrame, spectra_drift: pd.DataFrame | None = None) -> str:
    """What the sweep shows per preset: which collapse (relative residual, stable and effective
    rank at the last layer against the input) and which keep their rank, from this run's table."""
    rr, sr, er = (metric_ends(metrics, m).set_index("preset") for m in
                  ("relative_residual", "stable_rank", "effective_rank"))
    lines, collapsed, kept = [], [], []
    for preset in rr.index:
        last = int(rr.loc[preset, "last_layer"])
        ratio = rr.loc[preset, "last"] / rr.loc[preset, "input"] if rr.loc[preset, "input"] else float("nan")
        text = (f"- {code(preset)}: relative residual {number(rr.loc[preset, 'input'])} → "
                f"{number(rr.loc[preset, 'last'])} (×{number(ratio, 2)}), stable rank "
                f"{number(sr.loc[preset, 'input'])} → {number(sr.loc[preset, 'last'])}, effective rank "
                f"{number(er.loc[preset, 'input'])} → {number(er.loc[preset, 'last'])} at layer {last}")
        if spectra_drift is not None and preset in set(spectra_drift["preset"]):
            drift = float(spectra_drift.set_index("preset").loc[preset, "max_relative_change"])
            if drift < 1e-9:
                text += f"; every singular value kept (largest change {number(drift, 2)} of σ₁)"
        lines.append(text + ".")
        # (nearly) rank one: the tokens all but identical, or one direction left by both measures
        # (a stable rank below 1.5 with a high effective rank is one dominant direction, not collapse)
        if ratio < 1e-3 or (sr.loc[preset, "last"] < 1.5 and er.loc[preset, "last"] < 1.5):
            collapsed.append(preset)
        elif er.loc[preset, "last"] >= 0.5 * er.loc[preset, "input"]:
            kept.append(preset)
    summary = []
    if collapsed:
        summary.append(f"**Collapsed to (nearly) rank one by the last layer** (stable and effective rank below "
                       f"1.5, or the relative residual down by more than 1000×): {listing(map(code, collapsed))}.")
    if kept:
        summary.append(f"**Kept at least half of their effective rank:** {listing(map(code, kept))}.")
    between = [p for p in rr.index if p not in collapsed and p not in kept]
    if between:
        summary.append(f"**Lost rank without collapsing** (effective rank below half of the input's, above 1.5): "
                       f"{listing(map(code, between))}.")
    return "\n\n".join([*summary, "\n".join(lines)])


def hidden_curves_text(metrics: pd.DataFrame, metrics_shown: Iterable[str]) -> str:
    """One sentence per figure in which a preset's curve lies under another's."""
    parts = []
    for metric in metrics_shown:
        for hidden, top in hidden_curves(metrics, metric):
            parts.append(f"{metric.replace('_', ' ')}: {code(hidden)} lies under {code(top)} (within "
                         f"{COINCIDE:.0%} of the axis at every layer)")
    return ("Curves drawn on top of each other — " + "; ".join(parts) + ".") if parts else ""


# ---------------------------------------------------------------------------------------------
# report 03: Jacobian conditioning
# ---------------------------------------------------------------------------------------------


def osa_layer_text(by_alpha: pd.DataFrame) -> str:
    """κ of one OSA layer against α (geometric mean over seeds) and at the derived α₀, as measured."""
    tokens, dim = int(by_alpha["tokens"].iloc[0]), int(by_alpha["dim"].iloc[0])
    seeds = by_alpha["seed"].nunique() if "seed" in by_alpha else 1
    given = by_alpha[by_alpha["alpha_source"] != "derived"]
    means = given.groupby("alpha")["kappa"].apply(lambda v: float(np.exp(np.log(v).mean()))).sort_index()
    parts = [f"{kappa(k)} at α = {a:g}" for a, k in means.items()]
    text = (f"At N = {tokens}, d = {dim} ({plural(int(seeds), 'seed')}, geometric mean) κ of one OSA layer is "
            f"{listing(parts)}.")
    derived = by_alpha[by_alpha["alpha_source"] == "derived"]
    if len(derived):
        text += (f" At the derived α₀ = {number(derived['alpha'].iloc[0])} it is "
                 f"{kappa(float(np.exp(np.log(derived['kappa']).mean())))}.")
    if len(means) >= 2 and means.iloc[-1] > means.iloc[0]:
        text += (f" κ grows {number(means.iloc[-1] / means.iloc[0])}× from α = {means.index[0]:g} to "
                 f"α = {means.index[-1]:g}.")
    return text


def grid_text(grid: pd.DataFrame, contrast_alpha: float) -> str:
    """κ over the N × d grid at the derived α₀ and at α = ``contrast_alpha`` (largest over seeds)."""
    parts = []
    for source, label in (("derived", "the derived α₀"), ("given", f"α = {contrast_alpha:g}")):
        g = grid[grid["alpha_source"] == source]
        if not len(g):
            continue
        worst = g.groupby(["tokens", "dim"])["kappa"].max()
        (n_lo, d_lo), (n_hi, d_hi) = worst.idxmin(), worst.idxmax()
        parts.append(f"at {label} κ ranges from {kappa(worst.min())} (N = {n_lo}, d = {d_lo}) to "
                     f"{kappa(worst.max())} (N = {n_hi}, d = {d_hi})")
    ns, ds = sorted(grid["tokens"].unique()), sorted(grid["dim"].unique())
    text = (f"Over N ∈ {{{', '.join(map(str, ns))}}} and d ∈ {{{', '.join(map(str, ds))}}} (largest κ over "
            f"seeds): " + "; ".join(parts) + ".")
    derived = grid[grid["alpha_source"] == "derived"]["kappa"]
    fixed = grid[grid["alpha_source"] == "given"]["kappa"]
    if len(derived) and len(fixed):
        if derived.max() < fixed.max():
            text += (f" The derived α₀ keeps the worst κ {number(fixed.max() / derived.max())}× below the fixed "
                     f"α = {contrast_alpha:g}.")
        else:
            text += f" The derived α₀ does not keep κ below the fixed α = {contrast_alpha:g} on this grid."
    return text


def depth_settings_text(presets: Sequence[str], depth: int, tokens: int, dim: int, seeds: int) -> str:
    return (f"Exact Jacobians of {listing(map(code, presets))} at depth {depth} (N = {tokens}, d = {dim}), "
            f"{plural(int(seeds), 'seed')}, float64.")


def kappa_depth_text(table: pd.DataFrame) -> str:
    """κ of the end-to-end Jacobian at the first and last layer per preset (the rows of
    :func:`osa_lab.studies.summaries.kappa_table`), with values beyond float64 named as such,
    and the run's answer to "which grows fastest with depth"."""
    lines, growth = [], {}
    for row in table.itertuples():
        last = float(row.kappa_last_layer)
        beyond = int(getattr(row, "beyond_float64", 0) or 0)
        if beyond or last >= KAPPA_RESOLVED:
            value = (f"beyond what float64 resolves (≥ {number(KAPPA_RESOLVED, 2)}: numerically singular"
                     + (f", {plural(beyond, 'seed')}" if beyond else "") + ")")
        else:
            value = number(last)
            growth[row.preset] = last / float(row.kappa_first_layer)
        lines.append(f"- {code(row.preset)}: κ(∂X₁/∂X₀) = {kappa(row.kappa_first_layer)}, "
                     f"κ(∂X_{row.last_layer}/∂X₀) = {value}.")
        if getattr(row, "unresolved", 0):
            lines[-1] = lines[-1][:-1] + f" ({plural(int(row.unresolved), 'value')} unresolved, left out)."
    singular = [r.preset for r in table.itertuples()
                if getattr(r, "beyond_float64", 0) or float(r.kappa_last_layer) >= KAPPA_RESOLVED]
    ranked = sorted(growth, key=growth.get, reverse=True)
    summary = []
    if singular:
        summary.append(f"**Numerically singular by the last layer:** {listing(map(code, singular))}.")
    if ranked:
        summary.append("**Growth of κ from the first to the last layer, largest first:** "
                       + listing(f"{code(p)} ×{number(growth[p])}" for p in ranked) + ".")
    return "\n\n".join([*summary, "\n".join(lines)])


# ---------------------------------------------------------------------------------------------
# report 04: skipless training
# ---------------------------------------------------------------------------------------------


def paired_verdict_text(paired: pd.DataFrame, reference: str = "skipless-osa") -> str:
    """One line per preset of a paired-differences table (``reference`` − preset, fractions): the
    difference in points with its 95 % interval, and which of the two it shows better, by name."""
    lines = []
    for r in paired.itertuples():
        if not (math.isfinite(r.ci_low) and math.isfinite(r.ci_high)):
            word = "no interval (too few seeds)"
        elif r.ci_low > 0:
            word = f"{code(reference)} is better"
        elif r.ci_high < 0:
            word = f"{code(r.preset)} is better"
        else:
            word = "no difference shown (the interval contains 0)"
        lines.append(f"- {code(reference)} − {code(r.preset)}: {100 * r.diff_mean:+.1f} points, 95 % CI "
                     f"[{100 * r.ci_low:+.1f}, {100 * r.ci_high:+.1f}], {plural(int(r.n), 'seed')}: {word}.")
    return "\n".join(lines)


def ablation_text(ablation: pd.DataFrame, summary: pd.DataFrame, preset: str = "skipless-osa",
                  control: str = "skipless-osa-alpha0") -> str:
    """What "α := 0 after training" measures, from this run: the drop of ``preset`` against the gap
    to ``control``, the same network trained with α ≡ 0 from the start.

    ``ablation`` is :func:`osa_lab.plots.training.ablation_data` (fractions), ``summary`` the
    run's per-preset summary (``preset``, ``test_accuracy_mean``)."""
    row = ablation[ablation["preset"] == preset]
    if row.empty:
        return ""
    drop = 100 * float(row["drop_mean"].iloc[0])
    split = str(row["split"].iloc[0])
    text = (f"Setting α := 0 in the trained {code(preset)} costs {drop:.1f} points of {split} accuracy: how much this "
            "trained network relies on the mixing it learned, not what mixing contributes to accuracy")
    acc = summary.set_index("preset")["test_accuracy_mean"] if "test_accuracy_mean" in summary else pd.Series(dtype=float)
    if preset in acc and control in acc and pd.notna(acc[preset]) and pd.notna(acc[control]):
        gap = 100 * float(acc[preset] - acc[control])
        text += (f". Trained with α ≡ 0 from the start, {code(control)} is {abs(gap):.1f} points "
                 f"{'behind' if gap >= 0 else 'ahead of'} {code(preset)} in test accuracy: that gap, not the "
                 "drop, is what learned mixing adds in this run")
    return text + "."


# ---------------------------------------------------------------------------------------------
# one-line findings (shown at the end of each report and in index.html)
# ---------------------------------------------------------------------------------------------


def kappa_finding(by_alpha: pd.DataFrame, table: pd.DataFrame) -> str:
    """Report 03 in one line: κ of one OSA layer at α₀ and the largest α; κ at the last layer per preset."""
    derived = by_alpha[by_alpha["alpha_source"] == "derived"]["kappa"]
    given = by_alpha[by_alpha["alpha_source"] != "derived"]
    parts = []
    if len(derived) and len(given):
        top = float(given["alpha"].max())
        parts.append(f"one OSA layer: κ {kappa(float(np.exp(np.log(derived).mean())))} at the derived α₀, "
                     f"{kappa(float(np.exp(np.log(given[given['alpha'] == top]['kappa']).mean())))} at α = {top:g}")
    ends = []
    for row in table.itertuples():
        singular = getattr(row, "beyond_float64", 0) or float(row.kappa_last_layer) >= KAPPA_RESOLVED
        ends.append(f"{row.preset} {'numerically singular' if singular else number(row.kappa_last_layer)}")
    if ends:
        parts.append(f"end-to-end κ at layer {int(table['last_layer'].max())}: " + ", ".join(ends))
    return "; ".join(parts) + "."


def collapse_finding(metrics: pd.DataFrame) -> str:
    """Report 02 in one line: stable rank after the last block per preset, input value first."""
    sr = metric_ends(metrics, "stable_rank")
    if not len(sr):
        return ""
    head = f"stable rank {number(sr['input'].mean())} at the input → after layer {int(sr['last_layer'].max())}: "
    return head + ", ".join(f"{r.preset} {number(r.last)}" for r in sr.itertuples()) + "."


def timing_finding(slopes: pd.DataFrame) -> str:
    """Report 01 in one line: each fitted slope, flagged when it cannot be trusted."""
    parts = []
    for row in slopes.itertuples():
        if math.isfinite(row.slope):
            parts.append(f"{row.method} {row.slope:.2f} (expected {row.expected:g}"
                         + ("" if row.trusted else ", untrustworthy fit") + ")")
    return ("time ∝ N^slope, fitted: " + ", ".join(parts) + ".") if parts else "no timing fit."


__all__ = [
    "COINCIDE", "KAPPA_RESOLVED", "accuracy_text", "kappa", "collapse_finding", "depth_settings_text", "grid_text", "hidden_curves",
    "hidden_curves_text", "kappa_depth_text", "kappa_finding", "listing", "metric_ends", "number", "osa_layer_text", "plural",
    "rank_collapse_text", "speedup_text", "paired_verdict_text", "ablation_text", "sweep_settings", "timing_finding", "timing_text",
]
