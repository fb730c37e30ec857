"""The chosen setting's grid edges and the choice a training-loss score would make (tuning_checks)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from osa_lab.studies.depth_study import report, run, tuning_checks
from osa_lab.studies.depth_study.records import read_records
from osa_lab.studies.depth_study.spec import StudySpec, TuningSpec


def _tuning(rows) -> pd.DataFrame:
    return pd.DataFrame([{"lr": lr, "alpha_lr_mult": am, "warmup_fraction": wu, "train_loss": loss}
                         for lr, am, wu, loss in rows])  # fmt: skip


def test_the_chosen_setting_is_at_the_edges_of_the_values_tried_along_each_axis():
    t = _tuning([(1e-3, 1.0, 0.05, 0.1), (3e-3, 1.0, 0.05, 0.1), (1e-2, 1.0, 0.05, 0.1), (1e-3, 10.0, 0.05, 0.1),
                 (3e-3, 1.0, 0.15, 0.1), (1e-4, 10.0, 0.05, 0.1)])  # fmt: skip
    # at ×1 and warm-up 0.05 the learning rates tried are 1e-3, 3e-3, 1e-2: 1e-3 is the low edge (1e-4 was
    # tried at ×10 only); the multipliers tried at 1e-3 are 1 and 10: ×1 is the low edge; one warm-up at 1e-3
    assert tuning_checks.grid_edges(t, (1e-3, 1.0, 0.05)) == ["lr low", "alpha_lr_mult low"]
    # 3e-3 sits between two learning rates, has one multiplier, and the shorter of two warm-ups
    assert tuning_checks.grid_edges(t, (3e-3, 1.0, 0.05)) == ["warmup_fraction low"]
    assert tuning_checks.grid_edges(t, (1e-2, 1.0, 0.05)) == ["lr high"]
    assert tuning_checks.grid_edges(t, (1e-3, 10.0, 0.05)) == ["lr high", "alpha_lr_mult high"]


def test_the_training_loss_score_is_a_mean_of_decades_and_skips_settings_that_diverged():
    # by the arithmetic mean 3e-3 would win (0.0505 against 0.055); by decades 1e-3 does
    # (log10 0.01 · 0.1 → −1.5 against log10 0.001 · 0.1 → −2)
    t = _tuning([(1e-3, 1.0, 0.05, 0.1), (1e-3, 1.0, 0.05, 0.01),
                 (3e-3, 1.0, 0.05, 0.1), (3e-3, 1.0, 0.05, 0.001),
                 (1e-2, 1.0, 0.05, 1e-6), (1e-2, 1.0, 0.05, math.nan)])  # fmt: skip
    scores = tuning_checks.train_loss_scores(t)
    assert np.isclose(scores[(1e-3, 1.0, 0.05)], -1.5) and np.isclose(scores[(3e-3, 1.0, 0.05)], -2.0)
    assert math.isnan(scores[(1e-2, 1.0, 0.05)])  # one seed diverged: not a candidate, however low the other
    assert tuning_checks.best_by_train_loss(t) == (3e-3, 1.0, 0.05)
    assert tuning_checks.best_by_train_loss(t.assign(train_loss=math.nan)) is None
    # a run that failed (collapsed, however low its loss) rules its setting out like a divergence
    failed = t.assign(status=["ok", "ok", "ok", "failed", "ok", "ok"])
    assert math.isnan(tuning_checks.train_loss_scores(failed)[(3e-3, 1.0, 0.05)])
    assert tuning_checks.best_by_train_loss(failed) == (1e-3, 1.0, 0.05)
    assert tuning_checks.setting_words((3e-3, 1.0, 0.05)) == "lr 0.003, α-lr ×1, warm-up 0.05"


def test_the_verdict_names_a_chosen_setting_at_an_edge_and_a_training_loss_choice_that_differs(tmp_path, monkeypatch):
    """End to end through the driver: the tie rule chooses the smallest learning rate, which the search
    never had to bracket (the top point, 3e-3, is bracketed), and the training loss prefers 3e-3."""
    from osa_lab.studies.depth_study import runner

    accuracy = {1e-3: 0.900, 3e-3: 0.903, 1e-2: 0.880}
    loss = {1e-3: 0.05, 3e-3: 0.01, 1e-2: 0.02}

    def fake(**kw):  # writes each run's JSON where the real task would
        runs = [{"stage": kw["stage"], "preset": kw["preset"], "depth": kw["depth"], "seed": seed, "lr": kw["lr"],
                 "alpha_lr_mult": kw["alpha_lr_mult"], "warmup_fraction": kw["warmup_fraction"], "status": "ok",
                 "val_accuracy": accuracy[kw["lr"]], "train_loss": loss[kw["lr"]] * (1 + (seed - 1000) / 10)}
                for seed in kw["seeds"]]  # fmt: skip
        for r in runs:
            path = tmp_path / run.result_name(r["stage"], r["preset"], r["depth"], r["seed"], r["lr"], 1.0, 0.05)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(r))
        return runs

    monkeypatch.setattr(runner, "study_group_run", fake)
    spec = StudySpec(name="t", cells=((("vit",), (2,)),), seeds={2: 2},
                     tuning=TuningSpec(lr=(1e-3, 3e-3, 1e-2), tie_margin=0.005))  # fmt: skip
    chosen = runner.StudyRunner(spec, tmp_path, tmp_path / "ck", runner.GridOptions.in_process(progress=False)).tune("vit", 2)
    assert chosen == (1e-3, 1.0, 0.05)
    records = read_records(tmp_path)
    tuning = report.tuning_table(records)
    assert np.allclose(tuning.sort_values(["lr", "tune_seed"])["train_loss"], [0.05, 0.055, 0.01, 0.011, 0.02, 0.022])
    summary = report.summary_table(report.run_table(records), tuning, spec)
    row = summary.iloc[0]
    assert row["chosen_grid_edge"] == "lr low" and row["edge_after_limit"] == ""
    assert row["train_loss_choice"] == "lr 0.003, α-lr ×1, warm-up 0.05" and not row["train_loss_choice_agrees"]
    verdict = report.verdict_text(summary, pd.DataFrame(), spec)
    assert "Chosen setting at an edge of the values tried" in verdict and "`vit` depth 2 (lr low)" in verdict
    assert ("tuning picks the same setting in 0 of 1 tuned cells; it would pick another in `vit` depth 2 "
            "(lr 0.003, α-lr ×1, warm-up 0.05)") in verdict


def test_the_study_file_sets_how_many_seeds_train_together(tmp_path, monkeypatch):
    """``group_size`` 0 keeps the default rule (eight final seeds in one task); 1 gives a task per seed,
    so a cell's final seeds spread over the workers."""
    from osa_lab.studies.depth_study import runner

    spec = StudySpec(name="t", cells=((("vit",), (2,)),), seeds={2: 8})
    default = runner.StudyRunner(spec, tmp_path, tmp_path / "ck", runner.GridOptions.in_process(progress=False))
    tasks = default._tasks("final", "vit", 2, [(1e-3, 1.0, 0.05)], spec.final_seeds(2), 10)
    assert [t.kwargs["seeds"] for t in tasks] == [list(range(8))]
    alone = StudySpec(name="t", cells=((("vit",), (2,)),), seeds={2: 8}, group_size=1)
    study = runner.StudyRunner(alone, tmp_path, tmp_path / "ck", runner.GridOptions.in_process(progress=False))
    tasks = study._tasks("final", "vit", 2, [(1e-3, 1.0, 0.05)], alone.final_seeds(2), 10)
    assert [t.kwargs["seeds"] for t in tasks] == [[s] for s in range(8)]
    pairs = StudySpec(name="t", cells=((("vit",), (2,)),), seeds={2: 5}, group_size=2)
    tasks = runner.StudyRunner(pairs, tmp_path, tmp_path / "ck", runner.GridOptions.in_process(progress=False))._tasks(
        "final", "vit", 2, [(1e-3, 1.0, 0.05)], pairs.final_seeds(2), 10)
    assert [t.kwargs["seeds"] for t in tasks] == [[0, 1], [2, 3], [4]]
