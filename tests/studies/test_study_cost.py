"""The verdict's price of what a partial study still has to run (osa_lab.studies.depth_study.cost)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from osa_lab.studies.depth_study import report
from osa_lab.studies.depth_study.cost import training_pace
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


def _tune_run(root: Path, preset: str, lr: float, seed: int, **timing: float) -> None:
    """A finished depth-4 tuning run of ``preset`` (with ``timing``: steps, epochs, epoch_time_s)."""
    (root / "tune").mkdir(exist_ok=True)
    (root / "tune" / f"{preset}-d4-lr{lr:g}-am1-s{seed}.json").write_text(json.dumps(
        {"stage": "tune", "preset": preset, "depth": 4, "seed": seed, "lr": lr, "alpha_lr_mult": 1.0,
         "status": "ok", "val_accuracy": 0.8, **timing}))  # fmt: skip


def test_the_pace_is_each_presets_median_time_per_block_and_step_of_its_timed_runs():
    """`vit`: 300 s × 6 epochs ÷ (216 steps × depth 4) = 2.083 s, 150 s × 6 ÷ (216 × 8) = 0.521 s and
    600 s × 6 ÷ (216 × 4) = 4.167 s, median 2.083 s; `skipless-osa`: 1.0 s × 10 ÷ (20 × 2) = 0.25 s. Pooled:
    the median of the four, (0.521 + 2.083) / 2 = 1.302 s; an epoch is 36 steps (median of 36, 36, 36 and 2).
    Runs without steps or a finite time are left out."""
    runs = [{"preset": "vit", "epoch_time_s": 300.0, "epochs": 6, "steps": 216, "depth": 4},
            {"preset": "vit", "epoch_time_s": 150.0, "epochs": 6, "steps": 216, "depth": 8},
            {"preset": "vit", "epoch_time_s": 600.0, "epochs": 6, "steps": 216, "depth": 4},
            {"preset": "skipless-osa", "epoch_time_s": 1.0, "epochs": 10, "steps": 20, "depth": 2},
            {"preset": "vit", "epoch_time_s": 36.0, "epochs": 50, "depth": 4},
            {"preset": "vit", "epochs": 6, "steps": 216, "depth": 4},
            {"preset": "vit", "epoch_time_s": float("nan"), "epochs": 6, "steps": 216, "depth": 4}]  # fmt: skip
    pace = training_pace(Records(runs={"final": runs[:3], "tune": runs[3:]}))
    assert pace is not None and pace.timed_runs == 4 and pace.epoch_steps == 36
    assert math.isclose(pace.seconds("vit"), 300 * 6 / (216 * 4)) and math.isclose(pace.seconds("skipless-osa"), 0.25)
    assert math.isclose(pace.seconds("mlp"), (150 * 6 / (216 * 8) + 300 * 6 / (216 * 4)) / 2)
    assert pace.run_steps(6000) == 6012 and pace.run_steps(216) == 216
    assert training_pace(Records(runs={"final": runs[4:], "tune": []})) is None


def test_a_partial_verdict_prices_the_final_runs_and_first_tuning_rounds_left(tmp_path):
    """Two `vit` depth-4 final runs at 2.083 s per block and step, 8 `vit` tuning runs (its first round is 6),
    and 6 of `skipless-osa`'s 12 first-round runs at depth 4, one timed at 4.167 s. A run of 6,000 steps is
    6,012 in whole epochs of 36, one of 2,000 is 2,016. Left, in hours per run (steps × depth × pace): final
    runs 2 × 13.92 (`vit` d4) + 4 × 27.83 (`skipless-osa` d4) + 2 × 4 × 13.92 (the others, at the pooled
    2.083 s) + 2 × 27.83 + 2 × 55.67 + 2 × 27.83 (depth 8) = 473.2; first-round runs 6 × 9.33 + 2 × 6 × 4.67
    (depth 4) + 6 × 9.33 + 12 × 18.67 + 6 × 9.33 (depth 8) = 448.0."""
    for seed in (0, 1):
        _final_run(tmp_path, seed, 300.0)
    for i in range(8):
        _tune_run(tmp_path, "vit", 0.001 * (i + 1), 1000)
    for i in range(5):
        _tune_run(tmp_path, "skipless-osa", 0.001 * (i + 1), 1000)
    _tune_run(tmp_path, "skipless-osa", 0.1, 1000, steps=216, epochs=6, epoch_time_s=600.0)
    verdict = report.summarise(tmp_path, _spec(), write=False)["verdict"]
    line = next(x for x in verdict.splitlines() if x.startswith("Still to run"))
    assert line == ("Still to run, each preset at the median pace its timed runs trained per block and step (`vit` "
                    "2083.3 ms; `skipless-osa` 4166.7 ms; `mlp` and `skipless-ssa`, with no timed run, at the median "
                    "of all 3 timed runs, 2083.3 ms), each run rounded up to whole epochs as the recorded ones were, "
                    "and a run's time taken as proportional to its depth (no run at depth 8 has trained yet): 20 "
                    "final runs, ≈ 473 hours, and the first tuning rounds still to run in 6 cells (42 runs), ≈ 448 "
                    "hours; about 921 hours in all before grid extensions (the cell tuned so far ran 2 runs beyond "
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
