"""Failure classification of training runs on synthetic curves, and on the committed study's collapsed run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from osa_lab.studies.training.failures import classify_run, loss_at_step, steps_to_loss


def _curve(losses, train_acc=None, test_acc=0.8):
    train_acc = train_acc or [0.9] * len(losses)
    return [{"epoch": e + 1, "step": 100 * (e + 1), "train_loss": v, "train_accuracy": a, "test_accuracy": test_acc}
            for e, (v, a) in enumerate(zip(losses, train_acc, strict=True))]  # fmt: skip


@pytest.mark.parametrize(
    ("losses", "train_acc", "test_acc", "status", "outcome", "rule"),
    [
        pytest.param([2.0, 1.0, 0.5, 0.2, 0.1], None, 0.85, "ok", "ok", "", id="steady-descent"),
        pytest.param([2.0, 0.5, 0.2, 30.0, 0.4, 0.15], None, 0.85, "ok", "ok", "", id="jump-then-recovers"),
        pytest.param([2.0, 0.5, 0.2, 35.8, 2.4, 2.3], None, 0.85, "ok", "failed", "loss jump", id="jump-no-recovery"),
        pytest.param([2.3, 1.4, 1.37, 2.43, 2.30], [0.2, 0.45, 0.49, 0.12, 0.10], 0.10, "ok", "failed", "chance",
                     id="collapse-to-chance"),
        pytest.param([2.3, 2.3, 2.3], [0.1, 0.1, 0.14], 0.5, "ok", "failed", "chance", id="training-at-chance"),
        pytest.param([2.0, 1.0, 0.01], None, 0.14, "ok", "failed", "chance", id="test-at-chance"),
        pytest.param([2.0, 1.0, 0.5], None, 0.16, "ok", "ok", "", id="just-above-chance-margin"),
        pytest.param([2.0, math.nan], None, 0.5, "ok", "diverged", "non-finite", id="nan-loss"),
        pytest.param([2.0, 1.0], None, 0.5, "diverged", "diverged", "non-finite", id="loop-said-diverged"),
        pytest.param([1.0, 0.0001, 0.0009], None, 0.85, "ok", "ok", "", id="tiny-losses-below-10x"),
        pytest.param([1.0, 0.0001, 0.0011], None, 0.85, "ok", "failed", "loss jump", id="tiny-losses-above-10x"),
    ],
)
def test_classify_run_on_synthetic_curves(losses, train_acc, test_acc, status, outcome, rule):
    got, reason = classify_run(_curve(losses, train_acc, test_acc), num_classes=10, status=status)
    assert got == outcome
    assert (reason == "") if not rule else (rule in reason)


def test_final_accuracies_given_override_the_curve():
    curve = _curve([2.0, 1.0, 0.5])
    assert classify_run(curve, num_classes=10, train_accuracy=0.11)[0] == "failed"
    assert classify_run(curve, num_classes=10, test_accuracy=0.9, train_accuracy=0.9)[0] == "ok"
    # chance depends on the classes: 50 % for two
    assert classify_run(curve, num_classes=2, test_accuracy=0.54, train_accuracy=0.9)[0] == "failed"
    with pytest.raises(ValueError, match="num_classes"):
        classify_run(curve, num_classes=1)


def test_loss_at_step_and_steps_to_loss_read_epoch_ends():
    curve = _curve([2.0, 1.0, 0.5, 0.05])
    assert loss_at_step(curve, 100) == 2.0 and loss_at_step(curve, 101) == 1.0 and loss_at_step(curve, 400) == 0.05
    assert math.isnan(loss_at_step(curve, 401))
    assert steps_to_loss(curve, 0.1) == 400.0 and steps_to_loss(curve, 1.0) == 200.0
    assert math.isnan(steps_to_loss(curve, 0.01))


def test_the_committed_depth_study_run_that_collapsed_is_a_failure():
    import json

    path = Path(__file__).parents[2] / "docs/results/mnist1d-depth/final/skipless-osa-d8-lr0.003-am1-s3.json"
    run = json.loads(path.read_text())
    assert run["status"] == "ok"  # what the loop recorded: its loss never became non-finite
    outcome, reason = classify_run(run["curve"], num_classes=10, train_accuracy=run["train_accuracy"],
                                   test_accuracy=run["test_accuracy"])  # fmt: skip
    assert outcome == "failed" and reason.startswith("chance")
