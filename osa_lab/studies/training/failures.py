"""Which training runs failed: diverged, collapsed to chance, or lost an order of magnitude of training loss.

A run that ends at chance is a failure whatever its loss says: a skipless network can collapse
(every input mapped to one class) without a NaN, and its loss then sits at ln(classes) for the rest
of training. :func:`classify_run` reads a run's per-epoch training curve and its final accuracies
and names the first rule it breaks:

* ``diverged``: the loop stopped on a non-finite loss (status ``"diverged"``) or the curve holds
  a non-finite training loss;
* ``loss jump``: the training loss rose above :data:`LOSS_JUMP_FACTOR` times the lowest value it
  had reached and ended above that level (it did not recover);
* ``chance``: the final training accuracy, or the final test accuracy, is within
  :data:`CHANCE_MARGIN` of chance (1 / classes).

Every other finished run is ``ok``. The curve's losses are epoch means, so a spike shorter than an
epoch is diluted; a collapse that lasts shows in the final accuracies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

#: a run whose training loss ends above this many times its best value so far did not recover
LOSS_JUMP_FACTOR = 10.0
#: a run whose final training or test accuracy is within this of chance (1/classes) collapsed
CHANCE_MARGIN = 0.05

Outcome = Literal["ok", "failed", "diverged"]


def classify_run(
    curve: Sequence[Mapping[str, float]],
    *,
    num_classes: int,
    status: str = "ok",
    train_accuracy: float = math.nan,
    test_accuracy: float = math.nan,
) -> tuple[Outcome, str]:
    """``(outcome, reason)`` of one training run: ``("ok", "")``, ``("diverged", why)`` or ``("failed", why)``.

    ``curve`` is the run's per-epoch rows (``train_loss``, ``train_accuracy``, …, as in a study's
    run JSON); ``train_accuracy`` and ``test_accuracy`` are its final values (taken from the last
    row of ``curve`` when not given).
    """
    if num_classes < 2:
        raise ValueError(f"num_classes must be at least 2, got {num_classes}")
    losses = [float(row["train_loss"]) for row in curve if "train_loss" in row]
    if status == "diverged" or any(not math.isfinite(v) for v in losses):
        return "diverged", "the training loss became non-finite"
    if losses:
        best = min(losses[:-1]) if len(losses) > 1 else losses[-1]
        if best > 0 and losses[-1] > LOSS_JUMP_FACTOR * best:
            return "failed", (
                f"loss jump: the training loss ended at {losses[-1]:.3g}, more than {LOSS_JUMP_FACTOR:g}× its "
                f"best {best:.3g}, and did not recover"
            )
    last = curve[-1] if curve else {}
    if math.isnan(train_accuracy):
        train_accuracy = float(last.get("train_accuracy", math.nan))
    if math.isnan(test_accuracy):
        test_accuracy = float(last.get("test_accuracy", math.nan))
    chance = 1.0 / num_classes
    for name, value in (("training", train_accuracy), ("test", test_accuracy)):
        if math.isfinite(value) and value <= chance + CHANCE_MARGIN:
            return "failed", (
                f"chance: final {name} accuracy {value * 100:.1f} % is within {CHANCE_MARGIN * 100:.0f} points of "
                f"chance ({chance * 100:.0f} %)"
            )
    return "ok", ""


def loss_at_step(curve: Sequence[Mapping[str, float]], step: int) -> float:
    """The training loss of the first epoch whose end reaches ``step`` (NaN if the run stopped before it)."""
    for row in curve:
        if row["step"] >= step and "train_loss" in row:
            return float(row["train_loss"])
    return math.nan


def steps_to_loss(curve: Sequence[Mapping[str, float]], threshold: float) -> float:
    """The step at the end of the first epoch whose mean training loss is at or below ``threshold`` (NaN: never)."""
    for row in curve:
        if float(row.get("train_loss", math.inf)) <= threshold:
            return float(row["step"])
    return math.nan
