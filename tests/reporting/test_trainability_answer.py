"""The large-depth study's answer (report 06): trainability per preset × depth, PARTIAL until complete."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from osa_lab.errors import OSAInputError
from osa_lab.reporting import trainability_answer as ta


def _summary(finished: tuple[int, int, int] = (8, 3, 0)) -> pd.DataFrame:
    rows = []
    for (preset, depth, loss, failed, diverged, tuning), done in zip(
        [("vit", 8, 0.0123, 0, 0, 18), ("skipless-osa-shaped", 8, 0.456, 1, 1, 36), ("skipless-osa-shaped", 16, math.nan, 0, 0, 5)],
        finished, strict=True,
    ):  # fmt: skip
        rows.append({"preset": preset, "depth": depth, "planned": 8, "finished": done, "failed": failed,
                     "diverged": diverged, "train_loss_final_median": loss, "steps_to_threshold_median": 900.0,
                     "reached_threshold": done, "tuning_runs": tuning})  # fmt: skip
    return pd.DataFrame(rows)


def test_each_cell_gives_the_median_loss_with_its_seeds_and_failures():
    table = ta.trainability_table(ta.trainability_data(_summary())).set_index("preset")
    assert table.loc["vit", "depth 8: final training loss, median (PARTIAL)"] == "0.0123 (8 of 8 seeds)"
    # failed and diverged runs are both failures of training
    assert table.loc["skipless-osa-shaped", "depth 8: final training loss, median (PARTIAL)"] == "0.456 (3 of 8 seeds, 2 failed)"
    assert table.loc["skipless-osa-shaped", "depth 16: final training loss, median (PARTIAL)"] == "tuning (5 runs)"
    assert table.loc["vit", "depth 16: final training loss, median (PARTIAL)"] == "—"  # not a cell of the study


def test_a_depth_says_partial_until_each_of_its_cells_has_its_planned_seeds():
    headers = list(ta.trainability_table(ta.trainability_data(_summary((8, 8, 3)))).columns)
    assert headers == ["preset", "depth 8: final training loss, median", "depth 16: final training loss, median (PARTIAL)"]
    assert ta.partial_note(_summary((8, 8, 3))) == ("**PARTIAL**: 19 of 24 final runs have finished; the figures below "
                                                    "show the runs so far, not the study's answer.")
    done = _summary((8, 8, 8))
    assert ta.partial_note(done) == ""
    assert not any("PARTIAL" in h for h in ta.trainability_table(ta.trainability_data(done)).columns)


def test_a_cell_run_at_the_setting_that_failed_least_says_it_is_untuned():
    summary = _summary().assign(chosen_by=["tie rule", "fewest failures", ""])
    table = ta.trainability_table(ta.trainability_data(summary)).set_index("preset")
    assert table.loc["skipless-osa-shaped", "depth 8: final training loss, median (PARTIAL)"] == (
        "0.456 (3 of 8 seeds, 2 failed; untuned: setting with fewest tuning failures)")
    assert table.loc["vit", "depth 8: final training loss, median (PARTIAL)"] == "0.0123 (8 of 8 seeds)"
    # a summary written before the study recorded how its setting was chosen reads as before
    assert ta.trainability_table(ta.trainability_data(_summary())).equals(
        ta.trainability_table(ta.trainability_data(_summary().assign(chosen_by="tie rule"))))


def test_the_line_says_partial_until_every_planned_run_finished():
    claims = pd.DataFrame(columns=["claim", "depth", "verdict"])
    line = ta.progress_line(_summary(), claims)
    assert line.startswith("PARTIAL: 11 of 24 final runs, 59 tuning runs; every number is provisional")
    assert line.endswith("no claim tested yet.")
    done = _summary((8, 8, 8))
    claims = pd.DataFrame([{"claim": "`a` is better than `b`", "depth": 8, "verdict": "shown"},
                           {"claim": "`a` is comparable to `c`", "depth": 16, "verdict": "waiting"}])  # fmt: skip
    assert ta.progress_line(done, claims) == ("Complete: 24 of 24 final runs, 59 tuning runs; "
                                              "`a` is better than `b` at depth 8: shown.")  # fmt: skip


def test_a_table_without_the_study_columns_is_refused_with_the_fix():
    with pytest.raises(OSAInputError, match=r"lacks column\(s\) \['tuning_runs'\].*--summary-only"):
        ta.trainability_data(_summary().drop(columns="tuning_runs"))
