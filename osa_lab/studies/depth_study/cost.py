"""What a partial study still costs, at the speed its own runs trained.

A run's training time is about proportional to depth × steps (every block runs once a step), so
the recorded runs give one pace, seconds per block and step, that prices the runs still to come:
the final seeds not yet trained and the first tuning round of every cell not yet tuned. Grid
extensions are not priced (how many a cell needs is only known once its first round has run).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from osa_lab.studies.depth_study.records import Records
from osa_lab.studies.depth_study.spec import StudySpec


def block_step_seconds(records: Records) -> tuple[int, float]:
    """``(runs, median seconds of training per block and step)`` over the recorded runs that carry a
    time: ``epoch_time_s × epochs ÷ (steps × depth)`` for each (the loop's epoch time, so evaluation and
    diagnostics are left out, as in the verdict's compute line). ``(0, nan)`` when no run has one."""
    paces = []
    for stage_runs in records.runs.values():
        for r in stage_runs:
            try:
                pace = float(r["epoch_time_s"]) * float(r["epochs"]) / (float(r["steps"]) * float(r["depth"]))
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                continue
            if math.isfinite(pace) and pace > 0:
                paces.append(pace)
    return len(paces), float(np.median(paces)) if paces else math.nan


def _listed(items: list[int], word: str) -> str:
    """``1``, ``1 and 2``, ``1, 2 and 3`` (``word`` in place of "and")."""
    text = [str(i) for i in items]
    return text[0] if len(text) == 1 else f"{', '.join(text[:-1])} {word} {text[-1]}"


def remaining_lines(summary: pd.DataFrame, spec: StudySpec, pace: tuple[int, float]) -> list[str]:
    """The verdict's lines on what the study still costs: the final runs left and the first tuning
    rounds of the cells not yet tuned, in hours of training at ``pace`` (:func:`block_step_seconds`),
    each run of ``spec.steps`` steps (``spec.tuning.steps`` in tuning). Empty when nothing is left or no
    run has a recorded time."""
    n_paced, seconds = pace
    if not n_paced or not math.isfinite(seconds):
        return []
    final_runs = tune_runs = 0
    final_h = tune_h = 0.0
    untuned, beyond_first = 0, []
    for r in summary.itertuples():
        left = int(r.planned) - min(int(r.finished), int(r.planned))
        final_runs += left
        final_h += left * spec.steps * int(r.depth) * seconds / 3600
        first = spec.first_round_runs(str(r.preset))
        if math.isfinite(float(r.lr)):  # tuned: its search chose a setting
            beyond_first.append(int(r.tuning_runs) - first)
            continue
        todo = max(0, first - int(r.tuning_runs))
        if todo:
            untuned += 1
            tune_runs += todo
            tune_h += todo * spec.tuning.steps * int(r.depth) * seconds / 3600
    if not final_runs and not tune_runs:
        return []
    recorded = {int(r.depth) for r in summary.itertuples() if int(r.tuning_runs) or int(r.finished)}
    unpaced = sorted({int(d) for d in summary["depth"]} - recorded)
    line = (f"Still to run, at the median recorded pace of {seconds * 1000:.1f} ms of training per block and step "
            f"({n_paced} runs, one thread each)")
    if unpaced:
        line += (f", taking a run's time as proportional to its depth (no run at depth "
                 f"{_listed(unpaced, 'or')} has trained yet)")
    line += (f": {final_runs} final runs, ≈ {final_h:.0f} hours, and the first tuning rounds of {untuned} cells "
             f"({tune_runs} runs), ≈ {tune_h:.0f} hours; about {final_h + tune_h:.0f} hours in all before grid "
             "extensions")
    if beyond_first:
        cells = "the cell" if len(beyond_first) == 1 else f"the {len(beyond_first)} cells"
        line += (f" ({cells} tuned so far ran {_listed([max(0, b) for b in beyond_first], 'and')} runs beyond "
                 f"{'its' if len(beyond_first) == 1 else 'their'} first round)")
    return [line + ".", ""]
