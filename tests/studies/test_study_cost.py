"""The verdict's price of what a partial study still has to run (osa_lab.studies.depth_study.cost)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from osa_lab.studies.depth_study import report
from osa_lab.studies.depth_study.cost import block_step_seconds
from osa_lab.studies.depth_study.records import Records
from osa_lab.studies.depth_study.spec import StudySpec


def _spec() -> StudySpec:
    """Three presets at depths 4 and 8 and a gated `mlp` at depth 4; 4 final seeds at depth 4, 2 at 8;
    the default tuning grid (3 lr × 2 α-lr multipliers for OSA × 1 warm-up × 2 seeds, 2,000 steps) and
    6,000 final steps."""
    return StudySpec(name="t", cells=((("vit", "skipless-osa", "skipless-ssa"), (4, 8)), (("mlp",), (4,))),
                     seeds={4: 4, 8: 2}, gate={"mlp": 0.65})  # fmt: skip


def _final_run(root: Path, seed: int, epoch_time_s: float) -> None:
    """A finished `vit` depth-4 final run of 6 epochs and 216 steps, and `vit` depth 4's chosen setting."""
    (root / "search").mkdir(exist_ok=True)
    (root / "search" / "vit-d4.json").write_text(json.dumps(
        {"preset": "vit", "depth": 4, "chosen": [0.01, 1.0], "edge_after_limit": []}))  # fmt: skip
    (root / "final").mkdir(exist_ok=True)
    curve = [{"epoch": e, "step": 36 * e, "train_loss": 1.0 / e, "train_accuracy": 0.9, "val_accuracy": 0.9,
              "test_accuracy": 0.9} for e in range(1, 7)]  # fmt: skip
    (root / "final" / f"vit-d4-lr0.01-am1-s{seed}.json").write_text(json.dumps(
        {"stage": "final", "preset": "vit", "depth": 4, "seed": seed, "lr": 0.01, "alpha_lr_mult": 1.0,
         "steps": 216, "epochs": 6, "epoch_time_s": epoch_time_s, "status": "ok", "curve": curve,
         "test_accuracy": 0.9, "val_accuracy": 0.9, "train_accuracy": 0.9, "train_loss": 0.1,
         "steps_to_90": 180.0, "kappa_init": 3.0, "kappa_trained": 9.0}))  # fmt: skip


def test_the_pace_is_the_median_time_per_block_and_step_of_the_runs_that_carry_one():
    """300 s × 6 epochs ÷ (216 steps × depth 4) = 2.083 s and 150 s × 6 ÷ (216 × 8) = 0.521 s, median of
    three with 600 s at depth 4 (4.167 s) is 2.083 s; a run without steps or time is left out."""
    runs = [{"epoch_time_s": 300.0, "epochs": 6, "steps": 216, "depth": 4},
            {"epoch_time_s": 150.0, "epochs": 6, "steps": 216, "depth": 8},
            {"epoch_time_s": 600.0, "epochs": 6, "steps": 216, "depth": 4},
            {"epoch_time_s": 36.0, "epochs": 50, "depth": 4},
            {"epochs": 6, "steps": 216, "depth": 4},
            {"epoch_time_s": float("nan"), "epochs": 6, "steps": 216, "depth": 4}]  # fmt: skip
    n, seconds = block_step_seconds(Records(runs={"final": runs[:3], "tune": runs[3:]}))
    assert n == 3 and math.isclose(seconds, 300 * 6 / (216 * 4))
    assert block_step_seconds(Records(runs={"final": runs[3:], "tune": []}))[0] == 0


def test_a_partial_verdict_prices_the_final_runs_and_first_tuning_rounds_left(tmp_path):
    """Two `vit` depth-4 final runs at 2.083 s per block and step. Left: 14 final runs at depth 4 and 6 at
    depth 8 of 6,000 steps (14 × 13.89 h + 6 × 27.78 h = 361 h), and the first rounds of the 6 cells not yet
    tuned: 12 runs for `skipless-osa`, 6 for each other preset, 24 at each depth, of 2,000 steps (24 × 4.63 h
    + 24 × 9.26 h = 333 h)."""
    for seed in (0, 1):
        _final_run(tmp_path, seed, 300.0)
    verdict = report.summarise(tmp_path, _spec(), write=False)["verdict"]
    line = next(x for x in verdict.splitlines() if x.startswith("Still to run"))
    assert line == ("Still to run, at the median recorded pace of 2083.3 ms of training per block and step (2 runs, "
                    "one thread each), taking a run's time as proportional to its depth (no run at depth 8 has "
                    "trained yet): 20 final runs, ≈ 361 hours, and the first tuning rounds of 6 cells (48 runs), "
                    "≈ 333 hours; about 694 hours in all before grid extensions (the cell tuned so far ran 0 runs beyond "
                    "its first round).")  # fmt: skip


def test_a_verdict_without_recorded_times_or_with_nothing_left_prices_nothing(tmp_path):
    """No epoch time recorded: no pace, no line. A complete study has nothing left to price."""
    for seed in (0, 1):
        _final_run(tmp_path, seed, float("nan"))
    assert "Still to run" not in report.summarise(tmp_path, _spec(), write=False)["verdict"]
    done = StudySpec(name="t", cells=((("vit",), (4,)),), seeds={4: 2})
    for seed in (0, 1):
        _final_run(tmp_path, seed, 300.0)
    verdict = report.summarise(tmp_path, done, write=False)["verdict"]
    assert "**Complete**" in verdict and "Still to run" not in verdict
