"""The answer of the large-depth study (report 06): trainability first, in one table and one line.

Drawn from the tables of :func:`osa_lab.studies.depth_study.summarise` (``summary``, ``claims``):
per preset × depth the median final training loss of the final runs that did not diverge, the
runs that failed (diverged, ended at chance, or jumped in loss and never recovered: counted,
never "ok") and how many of the planned seeds finished. A study that is not finished says
PARTIAL in the line and in every cell (``n of planned``), so no number reads as the answer before
its sample is in. A cell where no tuning setting trained on every tuning seed ran its final seeds
at the setting that failed least (``chosen_by`` "fewest failures"); its cell says it is untuned.
"""

from __future__ import annotations

import math

import pandas as pd

from osa_lab.reporting.depth_answer import require_study_columns
from osa_lab.reporting.texts import plural
from osa_lab.studies.depth_study.records import FEWEST_FAILURES

__all__ = ["partial_note", "progress_line", "trainability_data", "trainability_table"]

_SUMMARY_COLUMNS = ["preset", "depth", "planned", "finished", "failed", "diverged", "train_loss_final_median",
                    "steps_to_threshold_median", "reached_threshold", "tuning_runs"]  # fmt: skip


def trainability_data(summary: pd.DataFrame) -> pd.DataFrame:
    """``preset, depth, planned, finished, failed, loss, steps_to_threshold, reached, tuning_runs, untuned``
    per preset × depth (every cell of the study, run or not; ``failed`` counts diverged runs too;
    ``untuned``: the final seeds ran at the setting that failed on the fewest tuning seeds, because
    none trained on all of them; False for a summary written before the study recorded ``chosen_by``)."""
    require_study_columns(summary, _SUMMARY_COLUMNS, "summary")
    out = summary[["preset", "depth", "planned", "finished", "tuning_runs"]].copy()
    out["failed"] = summary["failed"] + summary["diverged"]
    out["loss"] = summary["train_loss_final_median"]
    out["steps_to_threshold"] = summary["steps_to_threshold_median"]
    out["reached"] = summary["reached_threshold"]
    out["untuned"] = summary["chosen_by"].eq(FEWEST_FAILURES) if "chosen_by" in summary else False
    return out.reset_index(drop=True)


def _cell(row: pd.Series) -> str:
    if row["finished"] == 0:
        return f"tuning ({plural(int(row['tuning_runs']), 'run')})" if row["tuning_runs"] else "not run yet"
    loss = f"{row['loss']:.3g}" if math.isfinite(row["loss"]) else "—"
    text = f"{loss} ({int(row['finished'])} of {int(row['planned'])} seeds"
    text += f", {int(row['failed'])} failed" if row["failed"] else ""
    # no setting trained on every tuning seed: the final seeds ran where it failed least
    return text + ("; untuned: setting with fewest tuning failures)" if row.get("untuned", False) else ")")


def trainability_table(data: pd.DataFrame) -> pd.DataFrame:
    """One row per preset (in study order), one column per depth: the median final training loss with
    the seeds finished of those planned and the failed runs; a cell without final runs says how far
    its tuning got, and one whose final seeds ran at an untuned setting says so. A depth where some
    cell has not finished all its planned seeds says PARTIAL in its header."""
    require_study_columns(data, ["preset", "depth", "planned", "finished", "failed", "loss", "tuning_runs"], "trainability")
    presets = list(dict.fromkeys(data["preset"]))
    cells = {(r["preset"], r["depth"]): _cell(r) for _, r in data.iterrows()}
    out: dict[str, list[str]] = {"preset": presets}
    for d in sorted(data["depth"].unique()):
        at_depth = data[data["depth"] == d]
        partial = " (PARTIAL)" if bool((at_depth["finished"] < at_depth["planned"]).any()) else ""
        out[f"depth {d}: final training loss, median{partial}"] = [cells.get((p, d), "—") for p in presets]
    return pd.DataFrame(out)


def _final_runs(summary: pd.DataFrame) -> tuple[int, int]:
    """(finished, planned) final runs of the study (a cell's extra runs beyond its plan not counted)."""
    require_study_columns(summary, ["planned", "finished"], "summary")
    return int(summary["finished"].clip(upper=summary["planned"]).sum()), int(summary["planned"].sum())


def partial_note(summary: pd.DataFrame) -> str:
    """For the figures of an unfinished study: "**PARTIAL**: …" with the final runs finished of those
    planned, saying that the figures show only those; empty once every planned run has finished."""
    finished, planned = _final_runs(summary)
    if finished >= planned:
        return ""
    return (f"**PARTIAL**: {finished} of {planned} final runs have finished; the figures below show the runs "
            "so far, not the study's answer.")


def progress_line(summary: pd.DataFrame, claims: pd.DataFrame) -> str:
    """The study in one line: complete or PARTIAL (final and tuning runs so far), and the claims' verdicts."""
    require_study_columns(summary, ["planned", "finished", "tuning_runs"], "summary")
    finished, planned = _final_runs(summary)
    tuning = int(summary["tuning_runs"].sum())
    state = ("Complete" if finished >= planned else "PARTIAL") + f": {finished} of {planned} final runs, {tuning} tuning runs"
    if finished < planned:
        state += "; every number is provisional"
    tested = claims[claims["verdict"] != "waiting"] if len(claims) else claims
    if not len(tested):
        return state + "; no claim tested yet."
    verdicts = "; ".join(f"{r.claim} at depth {r.depth}: {r.verdict}" for r in tested.itertuples())
    return f"{state}; {verdicts}."
