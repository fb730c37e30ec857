"""Paired per-seed differences of final metrics and their classification against a margin."""

from __future__ import annotations

import math

import pandas as pd

from osa_lab.studies.training.config import REFERENCE_PRESET


def final_metric(metrics: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per preset × seed: ``metric`` at the last epoch (columns preset, seed, value)."""
    sel = metrics[metrics["metric"] == metric].sort_values(["epoch", "step"])
    return sel.groupby(["preset", "seed"], as_index=False).last()[["preset", "seed", "value"]]


def finished_run_metrics(metrics: pd.DataFrame, runs: pd.DataFrame | None, epochs: int) -> pd.DataFrame:
    """The rows of ``metrics`` from runs that finished: those ``runs`` (as :func:`compare` writes them)
    marks ``ok``, or without ``runs`` those that reached epoch ``epochs`` (a run that diverged or
    failed stops before it). Paired differences must not pair a run at the value it reached before
    it broke."""
    if runs is not None and len(runs):
        good = runs[runs["status"] == "ok"]
        ok = set(zip(good["preset"], good["seed"].astype(int), strict=True))
    else:
        last = metrics.groupby(["preset", "seed"])["epoch"].max()
        ok = {(p, int(s)) for (p, s), e in last.items() if e >= epochs}
    keep = [(p, int(s)) in ok for p, s in zip(metrics["preset"], metrics["seed"], strict=True)]
    return metrics[keep]


def paired_differences(
    metrics: pd.DataFrame, reference: str = REFERENCE_PRESET, metric: str = "test_accuracy", level: float = 0.95
) -> pd.DataFrame:
    """Per preset: mean paired difference ``reference − preset`` of the final ``metric`` over common seeds.

    Runs of the same seed share the batch order and data split, so the per-seed difference
    removes that part of the noise. Columns: ``preset, n, diff_mean, diff_std, ci_low, ci_high,
    per_seed`` (Student-t interval at ``level``; NaN with fewer than 2 seeds). Positive values
    mean the reference (skipless OSA) is better.
    """
    from scipy import stats

    final = final_metric(metrics, metric).pivot(index="seed", columns="preset", values="value")
    rows = []
    if reference not in final:
        return pd.DataFrame(columns=["preset", "n", "diff_mean", "diff_std", "ci_low", "ci_high", "per_seed"])
    for preset in final.columns:
        if preset == reference:
            continue
        d = (final[reference] - final[preset]).dropna()
        n = len(d)
        mean = float(d.mean()) if n else math.nan
        std = float(d.std(ddof=1)) if n > 1 else math.nan
        half = float(stats.t.ppf(0.5 + level / 2, n - 1) * std / math.sqrt(n)) if n > 1 else math.nan
        rows.append({"preset": preset, "n": n, "diff_mean": mean, "diff_std": std, "ci_low": mean - half,
                     "ci_high": mean + half,
                     "per_seed": " ".join(f"{int(s)}:{v * 100:+.1f}" for s, v in d.items())})  # fmt: skip
    return pd.DataFrame(rows)


def judge(row: pd.Series | None, margin: float = 0.0) -> str:
    """Classify a paired difference (reference − other) against ±margin using its confidence interval."""
    if row is None:
        return "not measured (preset not in this comparison)"
    if math.isnan(row["ci_low"]):
        return f"inconclusive ({int(row['n'])} seed: no interval; ≥ 5 seeds are needed)"
    lo, hi = row["ci_low"] * 100, row["ci_high"] * 100
    ci = f"{row['diff_mean'] * 100:+.1f} points, 95 % CI [{lo:+.1f}, {hi:+.1f}], {int(row['n'])} seeds"
    if margin > 0:
        if -margin * 100 <= lo and hi <= margin * 100:
            return f"shown: within ±{margin * 100:.0f} point(s) ({ci})"
        if hi < -margin * 100:
            return f"refuted here: the reference is more than {margin * 100:.0f} point(s) worse ({ci})"
        if lo > margin * 100:
            return f"the reference is more than {margin * 100:.0f} point(s) better ({ci})"
        return f"inconclusive ({ci})"
    if lo > 0:
        return f"shown: the reference is better ({ci})"
    if hi < 0:
        return f"refuted here: the reference is worse ({ci})"
    return f"inconclusive: the interval contains 0 ({ci})"
