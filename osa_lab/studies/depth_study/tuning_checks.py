"""Two checks on a cell's tuned setting, read from its tuning runs (``tuning.csv``).

* :func:`grid_edges`: the axes on which the **chosen** setting sits at an edge of the values tried.
  The search extends the grid until the *top* point is bracketed; under the tie rule the chosen
  point may still sit at an edge (say the smallest learning rate tried), and a value beyond it, not
  tried, might have tied too.
* :func:`best_by_train_loss`: the setting the tuning runs would pick if scored by the primary
  endpoint of trainability, the mean ``log10`` final training loss over the tuning seeds, instead
  of by validation accuracy. Where the two differ, the study's tuning favoured generalisation over
  ease of training, and the reader should know.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from osa_lab.studies.depth_study.spec import AXES
from osa_lab.studies.summaries import number

#: each tuned axis in words, with a slot for its value
AXIS_LABELS = {"lr": "lr {}", "alpha_lr_mult": "α-lr ×{}", "warmup_fraction": "warm-up {}"}


def setting_words(setting: tuple[float, ...]) -> str:
    """A setting ``(lr, α-lr multiplier, warm-up)`` in words: ``"lr 0.003, α-lr ×1, warm-up 0.05"``."""
    return ", ".join(AXIS_LABELS[a].format(number(v)) for a, v in zip(AXES, setting, strict=True))


def grid_edges(tuning: pd.DataFrame, setting: tuple[float, ...]) -> list[str]:
    """The edges (``"lr low"``, ``"warmup_fraction high"``, …) of the values tried on which ``setting``
    sits, named like the search record's ``edge_after_limit``.

    Along each axis the line is the tuning runs with the other two axes at ``setting``; an axis
    with one value on that line has no edge (nothing was tried beside it). Values tried only at
    other values of the other axes do not count: unlike
    :meth:`~osa_lab.studies.depth_study.bracket.BracketState.edges`, which asks whether the
    search's top point is bracketed anywhere on the axis, this asks whether the chosen setting
    itself was compared with its neighbours.
    """
    out = []
    for i, axis in enumerate(AXES):
        others = [np.isclose(tuning[a], v) for j, (a, v) in enumerate(zip(AXES, setting, strict=True)) if j != i]
        values = np.unique(tuning.loc[np.logical_and.reduce(others), axis].to_numpy(dtype=float))
        if len(values) < 2:
            continue
        if math.isclose(setting[i], values[0], rel_tol=1e-9):
            out.append(f"{axis} low")
        if math.isclose(setting[i], values[-1], rel_tol=1e-9):
            out.append(f"{axis} high")
    return out


def train_loss_scores(tuning: pd.DataFrame) -> pd.Series:
    """Mean ``log10`` final training loss per setting over its tuning seeds; a setting with a run
    that has no finite training loss (it diverged) or that failed (``status``, where the table has
    it) scores NaN, as the search would not choose it either."""
    loss = pd.to_numeric(tuning["train_loss"], errors="coerce").to_numpy(dtype=float)
    finite = np.isfinite(loss) & (loss > 0)
    if "status" in tuning:
        finite &= (tuning["status"] == "ok").to_numpy()
    logs = pd.Series(np.where(finite, np.log10(np.where(finite, loss, 1.0)), np.nan), index=tuning.index)
    grouped = logs.groupby([tuning[a] for a in AXES])
    return grouped.mean().where(grouped.count() == grouped.size())


def best_by_train_loss(tuning: pd.DataFrame) -> tuple[float, ...] | None:
    """The setting with the lowest mean ``log10`` final training loss (:func:`train_loss_scores`),
    or ``None`` when no setting has one."""
    scores = train_loss_scores(tuning).dropna()
    if scores.empty:
        return None
    return tuple(float(v) for v in scores.idxmin())
