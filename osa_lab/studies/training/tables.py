"""The tidy metrics table of training runs (one row per observation; docs/training.md)."""

from __future__ import annotations

import os

import pandas as pd

#: columns of the tidy metrics table, in order
COLUMNS: tuple[str, ...] = (
    "preset",
    "data",
    "seed",
    "epoch",
    "step",
    "kind",
    "metric",
    "layer",
    "head",
    "value",
)


def final_value(metrics: pd.DataFrame, metric: str = "test_accuracy") -> float:
    """Value of ``metric`` at the last recorded epoch of one run's metrics."""
    sel = metrics[metrics["metric"] == metric]
    if sel.empty:
        raise KeyError(f"metric {metric!r} not in the table; it has {sorted(metrics['metric'].unique())}")
    return float(sel.sort_values(["epoch", "step"])["value"].iloc[-1])


def metrics_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows → the tidy table with :data:`COLUMNS` (``layer``/``head`` nullable integers)."""
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    for col in ("layer", "head"):
        df[col] = df[col].astype("Int64")
    for col in ("seed", "epoch", "step"):
        df[col] = df[col].astype("int64")
    df["value"] = df["value"].astype("float64")
    return df


def load_metrics(path: str | os.PathLike) -> pd.DataFrame:
    """Read a ``metrics.csv`` written by :func:`train` or :func:`compare` back with its dtypes."""
    df = pd.read_csv(path)
    for col in ("layer", "head"):
        df[col] = df[col].astype("Int64")
    return df
