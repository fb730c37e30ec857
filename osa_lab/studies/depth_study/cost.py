"""What a partial study still costs, at the pace its own runs trained.

A run's training time is about proportional to depth × steps (every block runs once a step), so the
recorded runs give each preset a pace, seconds per block and step, that prices the runs still to
come: the final seeds not yet trained and what is left of the first tuning round of every cell not
yet tuned. Grid extensions are not priced (how many a cell needs is only known once its first
round has run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from osa_lab.studies.depth_study.records import Records
from osa_lab.studies.depth_study.spec import StudySpec
from osa_lab.studies.summaries import listing


@dataclass(frozen=True)
class Pace:
    """Seconds of training per block and step: each preset's median over its timed runs, and the
    median over all timed runs for a preset without one; and the steps of an epoch (median), to round
    a run up to whole epochs as the recorded runs were."""

    by_preset: dict[str, float]
    pooled: float
    timed_runs: int
    epoch_steps: float

    def seconds(self, preset: str) -> float:
        """Seconds per block and step for ``preset``: its own median, else the pooled one."""
        return self.by_preset.get(preset, self.pooled)

    def run_steps(self, steps: int) -> float:
        """``steps`` rounded up to whole epochs."""
        return math.ceil(steps / self.epoch_steps) * self.epoch_steps


def training_pace(records: Records) -> Pace | None:
    """The pace of the recorded runs that carry a time: ``epoch_time_s × epochs ÷ (steps × depth)`` for
    each (the loop's epoch time, so evaluation and diagnostics are left out, as in the verdict's compute
    line). ``None`` when no run has one."""
    paces: dict[str, list[float]] = {}
    epoch_steps = []
    for stage_runs in records.runs.values():
        for r in stage_runs:
            try:
                steps, epochs = float(r["steps"]), float(r["epochs"])
                pace = float(r["epoch_time_s"]) * epochs / (steps * float(r["depth"]))
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                continue
            if math.isfinite(pace) and pace > 0:
                paces.setdefault(str(r["preset"]), []).append(pace)
                epoch_steps.append(steps / epochs)
    if not epoch_steps:
        return None
    pooled = [p for preset_paces in paces.values() for p in preset_paces]
    return Pace(by_preset={preset: float(np.median(p)) for preset, p in paces.items()},
                pooled=float(np.median(pooled)), timed_runs=len(pooled),
                epoch_steps=float(np.median(epoch_steps)))  # fmt: skip


def _pace_words(pace: Pace, presets: list[str]) -> str:
    """The paces the line uses: each timed preset's, then the pooled one for the untimed presets."""
    timed = [p for p in presets if p in pace.by_preset]
    untimed = [p for p in presets if p not in pace.by_preset]
    words = [f"`{p}` {pace.by_preset[p] * 1000:.1f} ms" for p in timed]
    if untimed:
        words.append(f"{listing(f'`{p}`' for p in untimed)}, with no timed run, at the median of all "
                     f"{pace.timed_runs} timed runs, {pace.pooled * 1000:.1f} ms")  # fmt: skip
    return "; ".join(words)


def remaining_lines(summary: pd.DataFrame, spec: StudySpec, pace: Pace) -> list[str]:
    """The verdict's lines on what the study still costs: the final runs left and what is left of the
    first tuning rounds of the cells not yet tuned, in hours of training at each preset's ``pace``
    (:func:`training_pace`), a run of ``spec.steps`` (``spec.tuning.steps`` in tuning) rounded up to whole
    epochs. Empty when nothing is left."""
    final_runs = tune_runs = untuned = 0
    final_h = tune_h = 0.0
    beyond_first = []
    for r in summary.itertuples():
        preset, depth = str(r.preset), int(r.depth)
        hours_per_step = depth * pace.seconds(preset) / 3600
        left = int(r.planned) - min(int(r.finished), int(r.planned))
        final_runs += left
        final_h += left * pace.run_steps(spec.steps) * hours_per_step
        first = spec.first_round_runs(preset)
        if math.isfinite(float(r.lr)):  # tuned: its search chose a setting
            if int(r.tuning_runs) >= first:
                beyond_first.append(str(int(r.tuning_runs) - first))
            continue
        todo = max(0, first - int(r.tuning_runs))
        if todo:
            untuned += 1
            tune_runs += todo
            tune_h += todo * pace.run_steps(spec.tuning.steps) * hours_per_step
    if not final_runs and not tune_runs:
        return []
    presets = list(dict.fromkeys(str(p) for p in summary["preset"]))
    recorded = {int(r.depth) for r in summary.itertuples() if int(r.tuning_runs) or int(r.finished)}
    unpaced = sorted({int(d) for d in summary["depth"]} - recorded)
    line = (f"Still to run, each preset at the median pace its timed runs trained per block and step "
            f"({_pace_words(pace, presets)}), each run rounded up to whole epochs as the recorded ones were")
    if unpaced:
        line += (", and a run's time taken as proportional to its depth (no run at depth "
                 f"{listing(unpaced, 'or')} has trained yet)")
    line += (f": {final_runs} final runs, ≈ {final_h:.0f} hours, and the first tuning rounds still to run in "
             f"{untuned} cells ({tune_runs} runs), ≈ {tune_h:.0f} hours; about {final_h + tune_h:.0f} hours in all "
             "before grid extensions")  # fmt: skip
    if beyond_first:
        cells = "the cell" if len(beyond_first) == 1 else f"the {len(beyond_first)} cells"
        line += (f" ({cells} tuned so far ran {listing(beyond_first)} runs beyond "
                 f"{'its' if len(beyond_first) == 1 else 'their'} first round)")  # fmt: skip
    return [line + ".", ""]
