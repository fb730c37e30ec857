"""The answer of the depth study (report 05) in one table, one line and a few sentences.

Drawn from the tables of :func:`osa_lab.studies.depth_study.summarise` (``summary``, ``runs``,
``claims``): test accuracy of the final checkpoint in percent per preset × depth with its 95 %
t-interval, and the runs that failed as the study classified them
(:func:`osa_lab.studies.training.failures.classify_run`): a run that diverged, ended at chance or
jumped in loss and never recovered failed, whatever its loss says. The table is tidy (:func:`answer_data`, one row per preset × depth) and pivoted
for display by :func:`answer_table`; a new column of the study (a statistic, a failure class)
is one more entry in :data:`DETAIL_COLUMNS` or one more column of :func:`answer_data`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from osa_lab.errors import OSAInputError
from osa_lab.reporting.tables import Column, interval_text, kappa_text, percent_text, value_text
from osa_lab.reporting.texts import code, listing, plural
from osa_lab.studies.depth_study.claims import difference_words, interval_words
from osa_lab.studies.training.failures import CHANCE_MARGIN

__all__ = [
    "DETAIL_COLUMNS",
    "answer_data",
    "answer_finding",
    "answer_table",
    "claims_text",
    "failed_runs",
    "failures_text",
    "in_repository",
    "load_study",
    "require_study_columns",
]

def in_repository(path: str | Path) -> Path:
    """``path`` as given, or relative to the repository when papermill runs the notebook elsewhere."""
    p = Path(path)
    return p if p.is_absolute() or p.exists() else Path(__file__).resolve().parents[2] / p


def load_study(experiment: str, profile: str, results_dir: str) -> dict[str, Any] | None:
    """The tables of a study's results folder (:func:`osa_lab.studies.depth_study.summarise`, nothing
    written), or None where the folder holds no study yet; the experiment file gives its plan."""
    from osa_lab.studies.depth_study import load_spec, summarise

    spec = load_spec(in_repository(experiment), profile)
    results = in_repository(results_dir)
    return summarise(results, spec, write=False) if (results / "experiment.yaml").exists() else None


def require_study_columns(df: pd.DataFrame, columns: list[str], what: str) -> None:
    """Raise :class:`~osa_lab.errors.OSAInputError` naming the columns a study table lacks (and the fix)."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise OSAInputError(f"the study's {what} table lacks column(s) {missing}; regenerate the tables with `osa-lab train --experiment FILE --summary-only`")


def failed_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """``preset, depth, seed, test_accuracy, why`` of the final runs that did not finish ``ok``, as the
    study classified them (:func:`osa_lab.studies.training.failures.classify_run`: diverged, ended at
    chance, or a loss jump that never recovered); ``why`` is the study's own reason."""
    require_study_columns(runs, ["preset", "depth", "seed", "status", "test_accuracy"], "runs")
    bad = runs["status"] != "ok"
    out = runs.loc[bad, ["preset", "depth", "seed", "test_accuracy"]].copy()
    reasons = runs.loc[bad, "failure"] if "failure" in runs.columns else runs.loc[bad, "status"]
    out["why"] = [str(w) if isinstance(w, str) and w else str(st)
                  for w, st in zip(reasons, runs.loc[bad, "status"], strict=True)]  # fmt: skip
    return out.reset_index(drop=True)


def answer_data(summary: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """``preset, depth, mean, ci_low, ci_high, seeds, failed`` per preset × depth with finished runs
    (fractions; ``failed``: runs that did not finish ``ok``, see :func:`failed_runs`)."""
    require_study_columns(summary, ["preset", "depth", "finished", "test_accuracy_mean", "ci_low", "ci_high"], "summary")
    s = summary[summary["finished"] > 0]
    fails = failed_runs(runs).groupby(["preset", "depth"]).size()
    rows = []
    for r in s.itertuples():
        rows.append({"preset": r.preset, "depth": int(r.depth), "mean": r.test_accuracy_mean, "ci_low": r.ci_low,
                     "ci_high": r.ci_high, "seeds": int(r.finished), "failed": int(fails.get((r.preset, r.depth), 0))})
    return pd.DataFrame(rows, columns=["preset", "depth", "mean", "ci_low", "ci_high", "seeds", "failed"])


def _cell(row: pd.Series) -> str:
    lo, hi = row["ci_low"], row["ci_high"]
    clipped = (pd.notna(lo) and lo < 0) or (pd.notna(hi) and hi > 1)
    text = interval_text(row["mean"], None if pd.isna(lo) else max(lo, 0.0), None if pd.isna(hi) else min(hi, 1.0))
    text += "‡" if clipped else ""
    text += f" · {row['failed']} of {row['seeds']} failed" if row["failed"] else ""
    return text


def answer_table(data: pd.DataFrame) -> pd.DataFrame:
    """The answer as shown: one row per preset (in study order), one column per depth, each cell
    ``mean [95 % interval]`` in % and the failed runs; ``—`` where the preset was not run at that
    depth. An interval cut at 0 or 100 % is marked ``‡``."""
    require_study_columns(data, ["preset", "depth", "mean", "ci_low", "ci_high", "seeds", "failed"], "answer")
    presets = list(dict.fromkeys(data["preset"]))
    depths = sorted(data["depth"].unique())
    cells = {(r["preset"], r["depth"]): _cell(r) for _, r in data.iterrows()}
    seeds = data.groupby("depth")["seeds"].max()
    out = {"preset": presets}
    for d in depths:
        out[f"depth {d}: test accuracy % [95 % CI] ({plural(int(seeds[d]), 'seed')})"] = [
            cells.get((p, d), "—") for p in presets]
    return pd.DataFrame(out)


def answer_finding(data: pd.DataFrame) -> str:
    """Report 05 in one line: test accuracy (%) per preset across depth, with its failed runs."""
    parts = []
    for preset, g in data.groupby("preset", sort=False):
        if g["depth"].nunique() < 2:
            continue
        vals = " / ".join(percent_text(m) + (f" ({f} failed)" if f else "") for m, f in zip(g["mean"], g["failed"], strict=True))
        parts.append(f"{preset} {vals}")
    depths = " / ".join(str(d) for d in sorted(data["depth"].unique()))
    return f"test accuracy % at depth {depths}: " + "; ".join(parts) + "." if parts else "no preset at several depths."


def failures_text(runs: pd.DataFrame) -> str:
    """The failed runs by name with the study's reason, or that there were none."""
    f = failed_runs(runs)
    if f.empty:
        return "No final run failed (diverged, ended at chance, or jumped in loss and never recovered)."
    items = [f"{code(r.preset)} depth {int(r.depth)} seed {int(r.seed)} ({r.why}; test accuracy "
             f"{percent_text(r.test_accuracy)} %)" for r in f.itertuples()]  # fmt: skip
    return (f"**Failed runs** (counted in the means above; a run fails when it diverged, ended within "
            f"{100 * CHANCE_MARGIN:.0f} points of chance, or its training loss jumped ×10 and never recovered): {listing(items)}.")


def claims_text(claims: pd.DataFrame) -> str:
    """One line per claim of the study, depth first: its verdict and the paired difference in points."""
    require_study_columns(claims, ["claim", "depth", "n", "diff_mean", "ci_low", "ci_high", "ci_level", "verdict"], "claims")
    lines = []
    for r in claims.sort_values(["depth"], kind="stable").itertuples():
        if pd.isna(r.diff_mean):
            lines.append(f"- depth {int(r.depth)}: {r.claim}: **{r.verdict}**.")
            continue
        level = f"{100 * float(r.ci_level):.0f} %"
        endpoint = getattr(r, "endpoint", "test_accuracy")
        line = (f"- depth {int(r.depth)}: {r.claim}: **{r.verdict}** ({difference_words(endpoint, r.diff_mean)}, {level} CI "
                f"[{interval_words(endpoint, r.ci_low, r.ci_high)}], {plural(int(r.n), 'seed')})")  # fmt: skip
        direction = getattr(r, "direction", None)
        if direction in ("worse", "better") and r.verdict != "shown":
            # the two-sided test (its own Holm family) says where the one-sided claim could not
            holm = getattr(r, "p_two_sided_holm", float("nan"))
            line += f"; two-sided: {code(getattr(r, 'preset', 'skipless-osa'))} is **{direction}** (Holm p = {holm:.2g})"
        lines.append(line)
    return "\n".join(lines)


#: The columns of the study's detail table (``summary.csv``) as shown: header with unit, format.
DETAIL_COLUMNS: dict[str, Column] = {
    "preset": Column("preset", "text"),
    "depth": Column("depth"),
    "finished": Column("runs finished"),
    "planned": Column("runs planned"),
    "diverged": Column("diverged"),
    "test_accuracy_mean": Column("test accuracy %", "percent"),
    "test_accuracy_std": Column("std (points)", "percent"),
    "steps_to_90_median": Column("steps to 90 % train acc. (median)"),
    "lr": Column("learning rate"),
    "alpha_lr_mult": Column("α-lr ×"),
    "chosen_by": Column("setting chosen by", "text"),  # the tie rule, or fewest failures where none trained
    "kappa_init_median": Column("κ at init (median)", kappa_text),
    "kappa_trained_median": Column("κ trained (median)", kappa_text),
    "grid_extended": Column("grid extended", value_text),
}
