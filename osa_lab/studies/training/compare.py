"""Several presets × seeds with one budget, run as a grid, and their summary table."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from osa_lab.errors import (
    ConfigurationError,
    UserError,
)
from osa_lab.fileio import atomic_to_csv
from osa_lab.studies.data import (
    ImageDataset,
    check_val_fraction,
    load_data,
)
from osa_lab.studies.grid import (
    GridOptions,
    Task,
    run_grid,
)
from osa_lab.studies.training.config import (
    DEFAULT_COMPARISON,
    TrainConfig,
    check_names,
    comparable_json,
    model_config_for,
    resolve_device,
)
from osa_lab.studies.training.lock import RunLock, check_output_dir
from osa_lab.studies.training.loop import check_dataset
from osa_lab.studies.training.tables import final_value, load_metrics, metrics_frame


def user_error_from_name(name: str, message: str) -> UserError:
    """The user error called ``name`` with ``message`` (a grid task returns names, not objects);
    a :class:`~osa_lab.errors.ConfigurationError` when that type cannot be rebuilt from a message."""
    import osa_lab.errors as errors_module

    cls = getattr(errors_module, name, None)
    if isinstance(cls, type) and issubclass(cls, UserError):
        try:
            return cls(message)
        except TypeError:  # a type with more constructor arguments than a message
            pass
    return ConfigurationError(message)


#: data sets loaded in this process, by (name, data_dir, options): one entry, reused by the runs of a grid
_DATA_CACHE: dict[tuple, ImageDataset] = {}


def _data_key(name: str, data_dir: str | os.PathLike | None, options: dict) -> tuple:
    return name, None if data_dir is None else str(data_dir), comparable_json(options)


def _cached_data(config: TrainConfig, data_dir: str | None) -> ImageDataset:
    key = _data_key(config.data, data_dir, config.data_options)
    data = _DATA_CACHE.get(key)
    if data is None:
        data = load_data(config.data, data_dir=data_dir, **config.data_options)
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = data
    return data


def _compare_task(
    configs: list[TrainConfig],
    run_dirs: list[str | None],
    resume: bool,
    device: str,
    data_dir: str | None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """One seed group of :func:`compare` as a grid task (in-process or on a Dask worker): the runs
    ``configs`` (one preset, several seeds) trained together by
    :func:`~osa_lab.studies.training.group.train_group`.

    Returns per run ``{"status": "ok" | "diverged" | "user_error", "metrics", "params", "error"}``;
    a divergence is a result of its own run (with the metrics recorded up to it), any other
    exception fails the task.
    """
    from osa_lab.studies.training.group import train_group

    data = _cached_data(configs[0], data_dir)
    try:
        outcomes = train_group(configs, run_dirs, data=data, resume=resume, device=device, progress=progress)
    except UserError as err:
        # bad input or environment (a refused method, a busy folder, a damaged checkpoint …): not a
        # result of the comparison; compare() raises it again as the same typed error
        return [{"status": "user_error", "metrics": None, "params": None, "error": str(err),
                 "error_type": type(err).__name__}] * len(configs)  # fmt: skip
    values = []
    for outcome, run_dir in zip(outcomes, run_dirs, strict=True):
        if outcome.ok:
            n_params = sum(p.numel() for p in outcome.result.model.parameters())
            values.append({"status": "ok", "metrics": outcome.result.metrics, "params": n_params, "error": ""})
        else:
            partial = Path(run_dir) / "metrics.csv" if run_dir else None
            frame = load_metrics(partial) if partial is not None and partial.exists() else None
            values.append({"status": "diverged", "metrics": frame, "params": None, "error": str(outcome.error)})
    return values


#: the default rule: all seeds in one group from this many seeds up, each seed alone below it
#: (measured on a 2-core EPYC with ``benchmarks/seed_groups.py``: groups of 2 to 4 cost more
#: per seed than a solo run, see docs/training.md)
MIN_DEFAULT_GROUP = 6


def seed_groups(seeds: Sequence[int], group_size: int | None) -> list[list[int]]:
    """``seeds`` in groups of ``group_size``, in order. ``None`` (the default) is the rule that never
    costs more than solo runs: one group of all seeds when there are at least
    :data:`MIN_DEFAULT_GROUP` of them, otherwise each seed alone."""
    seeds = [int(s) for s in seeds]
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1):
        raise ConfigurationError(f"the seed-group size must be a positive int (or None: all seeds), got {group_size!r}")
    if group_size is None:
        size = len(seeds) if len(seeds) >= MIN_DEFAULT_GROUP else 1
    else:
        size = group_size
    return [seeds[i : i + size] for i in range(0, len(seeds), max(size, 1))]


def compare(
    presets: Sequence[str] = DEFAULT_COMPARISON,
    seeds: Sequence[int] = (0, 1, 2),
    base: TrainConfig | None = None,
    output_dir: str | os.PathLike | None = None,
    *,
    resume: bool = True,
    device: str | torch.device = "cpu",
    progress: bool = True,
    data_dir: str | os.PathLike | None = None,
    grid_options: GridOptions | None = None,
    group_size: int | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train every preset × seed with the same budget (``base`` with ``preset``/``seed`` replaced).

    Runs go to ``output_dir/<preset>/seed<k>/``; the combined ``metrics.csv`` and
    ``summary.csv`` to ``output_dir``. A run that diverges is recorded (``diverged`` column
    of the summary, the error in ``runs.csv``) and the others continue: a diverging skipless
    network is a result, not a crash. A run that fails otherwise (an exception, a lost
    worker) is recorded the same way with status ``failed`` (``failed`` column). Returns
    ``(metrics, summary)``.

    The seeds of a preset train together as seed groups of ``group_size`` (default
    :func:`seed_groups`' rule: all of them in one group from six seeds up, each alone below;
    :mod:`osa_lab.studies.training.group`), each member exactly as its solo run. Every
    group is one task of an :mod:`osa_lab.studies.grid` grid: ``grid_options`` runs them on a
    local Dask cluster or an existing one (default: in-process, one after the other, with the
    current torch thread count). Each run resumes from its own checkpoint, so a rerun skips
    finished runs and an interrupted comparison resumes; the tables do not depend on where
    the runs went.
    """
    base = base or TrainConfig()
    check_names(presets, base.data)
    resolve_device(device)
    out = check_output_dir(output_dir) if output_dir is not None else None
    data = load_data(base.data, data_dir=data_dir, **base.data_options)
    check_dataset(data)
    if data.x_val is None:  # before any run starts: a bad fraction must not leave runs.csv behind
        check_val_fraction(len(data.y_train), data.num_classes, base.val_fraction)
    _DATA_CACHE.clear()  # in-process runs use this copy; worker processes load their own
    _DATA_CACHE[_data_key(base.data, data_dir, base.data_options)] = data
    with RunLock(out) if out is not None else contextlib.nullcontext():
        frames, runs = [], []
        tasks = []
        groups = seed_groups(seeds, group_size)
        for preset in presets:
            for group in groups:
                cfgs = [dataclasses.replace(base, preset=preset, seed=seed) for seed in group]
                dirs = [str(out / preset / f"seed{seed}") if out is not None else None for seed in group]
                kwargs = {"configs": cfgs, "run_dirs": dirs, "resume": resume, "device": str(device),
                          "data_dir": None if data_dir is None else str(data_dir), "progress": False}  # fmt: skip
                label = ",".join(str(seed) for seed in group)
                tasks.append(Task(_compare_task, kwargs, {"preset": preset, "seeds": label},
                                  progress_kwarg="progress"))  # fmt: skip
        options = grid_options or GridOptions.in_process(threads=None, progress=progress)
        for preset in presets:  # impossible model settings fail here, before any run starts
            model_config_for(dataclasses.replace(base, preset=preset), data)
        done = run_grid(tasks, options, desc="runs")
        for o in done.outcomes:
            if o.ok and o.value[0]["status"] == "user_error":
                raise user_error_from_name(o.value[0]["error_type"], o.value[0]["error"])
        for o in done.outcomes:
            preset = o.task.settings["preset"]
            for i, cfg in enumerate(o.task.kwargs["configs"]):
                if o.ok:
                    value = o.value[i]
                    status, message, n_params, frame = value["status"], value["error"], value["params"], value["metrics"]
                else:
                    status, message, n_params = "failed", f"{o.error_type}: {o.error}", None
                    run_dir = o.task.kwargs["run_dirs"][i]
                    partial = Path(run_dir) / "metrics.csv" if run_dir else None
                    frame = load_metrics(partial) if partial is not None and partial.exists() else None
                if frame is not None:
                    frames.append(frame)
                runs.append({"preset": preset, "seed": int(cfg.seed), "status": status, "params": n_params,
                             "error": message})  # fmt: skip
        metrics = pd.concat(frames, ignore_index=True) if frames else metrics_frame([])
        summary = summarize_runs(metrics, pd.DataFrame(runs), order=list(presets))
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            atomic_to_csv(metrics, out / "metrics.csv")
            atomic_to_csv(summary, out / "summary.csv")
            atomic_to_csv(pd.DataFrame(runs), out / "runs.csv")
        return metrics, summary


def summarize_runs(
    metrics: pd.DataFrame, runs: pd.DataFrame | None = None, order: Sequence[str] | None = None
) -> pd.DataFrame:
    """One row per preset: final test accuracy mean ± std over seeds, train loss, time per epoch.

    ``std`` is the sample standard deviation (ddof = 1; NaN for a single seed). Diverged and
    failed runs (from ``runs``, as returned by :func:`compare`) are counted (``diverged``,
    ``failed``) and left out of the means.
    """
    rows = []
    presets = list(order) if order is not None else list(dict.fromkeys(metrics["preset"]))
    for preset in presets:
        m = metrics[metrics["preset"] == preset]
        bad, n_diverged, n_failed = set(), 0, 0
        if runs is not None and len(runs):
            r = runs[runs["preset"] == preset]
            bad = set(r.loc[r["status"] != "ok", "seed"])
            n_diverged, n_failed = int((r["status"] == "diverged").sum()), int((r["status"] == "failed").sum())
        finals = []
        for seed, g in m.groupby("seed"):
            if seed in bad or g[g["metric"] == "test_accuracy"].empty:
                continue
            finals.append(
                {
                    "test_accuracy": final_value(g, "test_accuracy"),
                    "train_accuracy": final_value(g, "train_accuracy"),
                    "train_loss": final_value(g, "train_loss"),
                    "epoch_time_s": float(g.loc[g["metric"] == "epoch_time_s", "value"].mean()),
                    "epochs": int(g["epoch"].max()),
                }
            )
        f = pd.DataFrame(finals)
        params = None
        if runs is not None and len(runs):
            p = runs.loc[(runs["preset"] == preset) & runs["params"].notna(), "params"]
            params = int(p.iloc[0]) if len(p) else None
        row = {"preset": preset, "seeds": len(f), "diverged": n_diverged, "params": params}
        for col in ("test_accuracy", "train_accuracy", "train_loss", "epoch_time_s"):
            row[f"{col}_mean"] = float(f[col].mean()) if len(f) else float("nan")
            row[f"{col}_std"] = float(f[col].std(ddof=1)) if len(f) > 1 else float("nan")
        row["epochs"] = int(f["epochs"].max()) if len(f) else 0
        row["failed"] = n_failed
        rows.append(row)
    return pd.DataFrame(rows)


def format_summary(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary as strings for printing: ``97.2 ± 0.3`` % accuracy, seconds per epoch."""

    def pm(mean: float, std: float, scale: float = 1.0, digits: int = 1) -> str:
        if math.isnan(mean):
            return "—"
        s = f"{mean * scale:.{digits}f}"
        return s + (f" ± {std * scale:.{digits}f}" if not math.isnan(std) else "")

    return pd.DataFrame(
        {
            "preset": summary["preset"],
            "seeds": summary["seeds"],
            "diverged": summary["diverged"],
            "failed": summary["failed"] if "failed" in summary else 0,
            "params": summary["params"],
            "test acc %": [pm(m, s, 100) for m, s in zip(summary.test_accuracy_mean, summary.test_accuracy_std, strict=True)],
            "train acc %": [pm(m, s, 100) for m, s in zip(summary.train_accuracy_mean, summary.train_accuracy_std, strict=True)],
            "train loss": [pm(m, s, 1, 3) for m, s in zip(summary.train_loss_mean, summary.train_loss_std, strict=True)],
            "s / epoch": [pm(m, s, 1, 2) for m, s in zip(summary.epoch_time_s_mean, summary.epoch_time_s_std, strict=True)],
        }
    )  # fmt: skip
