"""Fair tuning: each preset's learning rate (and OSA's α multiplier) chosen on validation accuracy."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from osa_lab.errors import (
    ConfigurationError,
)
from osa_lab.fileio import atomic_to_csv, atomic_write_text
from osa_lab.studies.grid import (
    GridOptions,
)
from osa_lab.studies.training.compare import compare, summarize_runs
from osa_lab.studies.training.config import TrainConfig, check_names, learns_alpha
from osa_lab.studies.training.lock import RunLock, check_output_dir
from osa_lab.studies.training.statistics import final_metric, finished_run_metrics, paired_differences
from osa_lab.studies.training.verdict import verdict


@dataclass(frozen=True)
class TuneGrid:
    """The shared search grid of :func:`tune`.

    Attributes:
        lrs: peak learning rates tried for every preset.
        alpha_lr_mults: α learning-rate multipliers tried for presets with a learned OSA α
            (others use 1).
        seeds: seeds of the tuning runs; by default disjoint from the final seeds, so the
            final numbers are not the runs the choice was made on.
    """

    lrs: tuple[float, ...] = (3e-4, 1e-3, 3e-3)
    alpha_lr_mults: tuple[float, ...] = (1.0, 10.0, 100.0)
    seeds: tuple[int, ...] = (1000,)

    def __post_init__(self) -> None:
        for name in ("lrs", "alpha_lr_mults"):
            vals = getattr(self, name)
            if not vals or any(not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0) for v in vals):
                raise ConfigurationError(f"`{name}` must be a non-empty list of positive numbers, got {vals!r}")
        if not self.seeds or any(not isinstance(s, int) or s < 0 for s in self.seeds):
            raise ConfigurationError(f"tuning `seeds` must be ints ≥ 0, got {self.seeds!r}")


@dataclass
class TuneResult:
    """What :func:`tune` returns (and writes as CSV / Markdown / PNG under its output folder)."""

    tuning: pd.DataFrame  #: one row per preset × grid point: validation accuracy (mean over tuning seeds)
    chosen: pd.DataFrame  #: one row per preset: the chosen lr and α multiplier
    metrics: pd.DataFrame  #: tidy metrics of the final runs
    summary: pd.DataFrame  #: :func:`summarize_runs` of the final runs + chosen settings
    paired: pd.DataFrame  #: paired per-seed differences against :data:`REFERENCE_PRESET`
    verdict: str  #: the generated verdict text
    wall_time_s: float


def tune(
    presets: Sequence[str],
    seeds: Sequence[int],
    base: TrainConfig,
    output_dir: str | os.PathLike | None = None,
    *,
    grid: TuneGrid | None = None,
    resume: bool = True,
    device: str | torch.device = "cpu",
    progress: bool = True,
    data_dir: str | os.PathLike | None = None,
    grid_options: GridOptions | None = None,
    group_size: int | None = None,
) -> TuneResult:
    """Fair comparison: per-preset learning rate (and α multiplier) chosen on validation accuracy, then final seeds.

    1. A validation split is held out from the training data (``base.val_fraction``; 0.1 if
       it is 0). The test split is never used for a choice.
    2. Every preset is trained with every learning rate of ``grid.lrs`` (presets with a learned
       OSA α also with every ``grid.alpha_lr_mults``), same budget otherwise, on ``grid.seeds``;
       the setting with the highest final validation accuracy (mean over tuning seeds; ties:
       lower validation loss, then smaller lr) is chosen.
    3. Each preset is trained with its chosen setting on ``seeds``; the summary reports the
       test accuracy of these runs only, :func:`paired_differences` against
       :data:`REFERENCE_PRESET`, and :func:`verdict` writes the text.

    Runs go to ``output_dir/tune/lr<lr>-am<mult>/`` and ``output_dir/final/lr<lr>-am<mult>/``
    (resumable like :func:`compare`); the tuning seeds of a grid point and the final seeds of a
    preset train as seed groups of ``group_size`` (default: all in one group from six seeds up, see
    :func:`compare`); ``tuning.csv``, ``chosen.csv``, ``metrics.csv``,
    ``summary.csv``, ``paired.csv``, ``verdict.md`` and ``summary.png`` go to ``output_dir``.
    """
    grid = grid or TuneGrid()
    overlap = sorted(set(grid.seeds) & {int(s) for s in seeds})
    if overlap:
        raise ConfigurationError(
            f"tuning seeds {overlap} are also final seeds {sorted(int(s) for s in seeds)}: the reported runs "
            "would include the ones the choice was made on; give --tune-seeds outside --seeds"
        )
    t0 = time.perf_counter()
    if base.val_fraction == 0:
        base = dataclasses.replace(base, val_fraction=0.1)
    check_names(presets, base.data)
    out = check_output_dir(output_dir) if output_dir is not None else None

    def folder(stage: str, lr: float, mult: float) -> Path | None:
        return out / stage / f"lr{lr:g}-am{mult:g}" if out is not None else None

    with RunLock(out) if out is not None else contextlib.nullcontext():
        rows = []
        # presets without a learned α run once per lr (at the first multiplier, which they ignore)
        points = [(lr, i, m) for lr in grid.lrs for i, m in enumerate(grid.alpha_lr_mults)]
        for lr, i, mult in points:
            group = [p for p in presets if i == 0 or learns_alpha(p)]
            if not group:
                continue
            cfg = dataclasses.replace(base, lr=lr, alpha_lr_mult=mult)
            metrics, summary = compare(group, grid.seeds, cfg, folder("tune", lr, mult), resume=resume,
                                       device=device, progress=progress, data_dir=data_dir,
                                       grid_options=grid_options, group_size=group_size)  # fmt: skip
            val_acc = final_metric(metrics, "val_accuracy").groupby("preset")["value"].mean()
            val_loss = final_metric(metrics, "val_loss").groupby("preset")["value"].mean()
            for p in group:
                row = summary.set_index("preset").loc[p]
                eff_mult = mult if learns_alpha(p) else 1.0
                # a setting that diverges (or fails) on any tuning seed is not eligible
                bad = int(row["diverged"]) + int(row.get("failed", 0)) > 0
                rows.append({"preset": p, "lr": lr, "alpha_lr_mult": eff_mult, "tune_seeds": len(grid.seeds),
                             "diverged": int(row["diverged"]),
                             "val_accuracy": math.nan if bad else float(val_acc.get(p, math.nan)),
                             "val_loss": math.nan if bad else float(val_loss.get(p, math.nan))})  # fmt: skip
        tuning = pd.DataFrame(rows).drop_duplicates(["preset", "lr", "alpha_lr_mult"], ignore_index=True)
        chosen_rows = []
        for p in presets:
            cand = tuning[(tuning["preset"] == p) & tuning["val_accuracy"].notna()]
            if cand.empty:
                raise ConfigurationError(
                    f"every tuning run of preset {p!r} diverged on the grid lrs={list(grid.lrs)}; add smaller "
                    "learning rates to --lr-grid"
                )
            best = cand.sort_values(["val_accuracy", "val_loss", "lr"], ascending=[False, True, True]).iloc[0]
            chosen_rows.append({"preset": p, "lr": float(best["lr"]), "alpha_lr_mult": float(best["alpha_lr_mult"]),
                                "val_accuracy": float(best["val_accuracy"])})  # fmt: skip
        chosen = pd.DataFrame(chosen_rows)
        metrics, runs, summary, paired = _final_runs(chosen, presets, seeds, base, folder, dict(
            resume=resume, device=device, progress=progress, data_dir=data_dir, grid_options=grid_options,
            group_size=group_size))  # fmt: skip
        budget = (f"{base.epochs} epochs, batch {base.batch_size}, {len(list(seeds))} final seed(s), "
                  f"lr grid {list(grid.lrs)}, α-lr grid {list(grid.alpha_lr_mults)}, "
                  f"validation {base.val_fraction:g} of the training data")  # fmt: skip
        text = verdict(summary, paired, base.data, budget)
        wall = time.perf_counter() - t0
        if out is not None:
            atomic_to_csv(tuning, out / "tuning.csv")
            atomic_to_csv(chosen, out / "chosen.csv")
            atomic_to_csv(metrics, out / "metrics.csv")
            atomic_to_csv(summary, out / "summary.csv")
            atomic_to_csv(paired, out / "paired.csv")
            if runs is not None:
                atomic_to_csv(runs, out / "runs.csv")
            atomic_write_text(out / "verdict.md", text + f"\nWall time of this command: {wall:.0f} s.\n")
            _write_summary_figure(summary, paired, out / "summary.png")
    return TuneResult(tuning, chosen, metrics, summary, paired, text, wall)


def _final_runs(chosen: pd.DataFrame, presets: Sequence[str], seeds: Sequence[int], base: TrainConfig,
                folder, options: dict) -> tuple[pd.DataFrame, pd.DataFrame | None, pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """Train the final seeds at each preset's chosen setting; returns (metrics, runs or None in memory,
    summary with the chosen setting, paired differences of the runs that finished)."""
    frames, run_tables, summaries = [], [], []
    for (lr, mult), sel in chosen.groupby(["lr", "alpha_lr_mult"], sort=False):
        cfg = dataclasses.replace(base, lr=float(lr), alpha_lr_mult=float(mult))
        where = folder("final", float(lr), float(mult))
        metrics, final_summary = compare(sel["preset"].tolist(), seeds, cfg, where, **options)
        frames.append(metrics)
        summaries.append(final_summary)
        if where is not None and (where / "runs.csv").exists():
            run_tables.append(pd.read_csv(where / "runs.csv"))
    metrics = pd.concat(frames, ignore_index=True)
    runs = pd.concat(run_tables, ignore_index=True) if run_tables else None
    finished = finished_run_metrics(metrics, runs, base.epochs)  # a run that broke is never paired
    summary = summarize_runs(metrics if runs is not None else finished, runs, order=list(presets))
    if runs is None:  # in memory: the counts of broken runs come from each comparison's own summary
        counts = pd.concat(summaries).groupby("preset")[["diverged", "failed"]].sum()
        summary[["diverged", "failed"]] = counts.reindex(summary["preset"]).to_numpy()
    summary = summary.merge(chosen[["preset", "lr", "alpha_lr_mult"]], on="preset", how="left")
    return metrics, runs, summary, paired_differences(finished)


def _write_summary_figure(summary: pd.DataFrame, paired: pd.DataFrame, path: Path) -> Path | None:
    """The summary bars and paired differences as one PNG (skipped when the plotting extras are missing)."""
    try:
        from osa_lab.plots import training as plots
    except ImportError:
        return None
    fig = plots.summary_bars(summary)
    if len(paired):
        fig = (fig + plots.paired_differences_plot(paired)).cols(2)
    path.write_bytes(plots.png_bytes(fig))
    return path
