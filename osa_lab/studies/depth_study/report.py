"""The study's tables and verdict, regenerated from the results folder alone.

:func:`summarise` reads every run's JSON under ``results/tune`` and ``results/final`` and writes
``runs.csv`` (one row per final run), ``curves.csv`` (training curves of the final runs),
``tuning.csv`` (one row per tuning run, with the grid extensions), ``summary.csv`` (per preset ×
depth), ``claims.csv`` and ``verdict.md``. A study that is not finished says so in every table
(``complete`` column) and in the verdict.

The folder's JSON files are untrusted input (:mod:`.records`): each is checked, and a damaged,
truncated, oversized or out-of-range one is left out and named in the ``notices`` that
:func:`summarise` returns and the verdict lists; it is never used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from osa_lab.fileio import atomic_to_csv, atomic_write_text
from osa_lab.studies.depth_study import stats, tuning_checks
from osa_lab.studies.depth_study.claims import claims_table, difference_words, testable_claims
from osa_lab.studies.depth_study.cost import Pace, remaining_lines, training_pace
from osa_lab.studies.depth_study.records import (
    FEWEST_FAILURES,
    TIE_RULE,
    RecordCache,
    Records,
    read_records,
    run_setting,
    setting_of,
)
from osa_lab.studies.depth_study.spec import AXES, StudySpec
from osa_lab.studies.depth_study.wording import (
    LOSS_STEPS,
    TRAIN_LOSS_THRESHOLD,
    claims_lines,
    failure_words,
    trainability_lines,
    unstable_neighbours,
    untuned_words,
)
from osa_lab.studies.jacobian.mixing_split import SPLIT_RECORD
from osa_lab.studies.jacobian.sub_blocks import PARTS as SUB_BLOCK_PARTS
from osa_lab.studies.summaries import KAPPA_RESOLVED, number
from osa_lab.studies.training.failures import (
    CHANCE_MARGIN,
    LOSS_JUMP_FACTOR,
    classify_run,
    loss_at_step,
    steps_to_loss,
)

#: classes of a run whose JSON does not record them (every data set of the study has ten)
DEFAULT_CLASSES = 10

#: κ end to end, per sub-block and of the OSA split at initialisation and after training, as runs.csv and
#: tuning.csv name them
KAPPA_COLUMNS = ["kappa_init", "kappa_trained",
                 *(f"kappa_{part}_{when}" for when in ("init", "trained") for part in SUB_BLOCK_PARTS),
                 *(f"{column}_{when}" for when in ("init", "trained") for column in SPLIT_RECORD.values())]  # fmt: skip

RUN_COLUMNS = ["preset", "depth", "seed", "lr", "alpha_lr_mult", "warmup_fraction", "steps", "status", "failure", "train_loss",
               *(f"train_loss_at_{s}" for s in LOSS_STEPS), "steps_to_threshold",
               "train_accuracy", "steps_to_90", "val_accuracy", "test_accuracy", *KAPPA_COLUMNS,
               "effective_rank_init", "effective_rank_trained", "relative_residual_init",
               "relative_residual_trained", "mixing_ratio_init", "mixing_ratio_trained", "epoch_time_s"]  # fmt: skip


def _records(results: Path | Records) -> Records:
    """The checked records of a results folder (read once by :func:`summarise` and passed on)."""
    return results if isinstance(results, Records) else read_records(results)


def _mean(values) -> float:
    values = [v for v in values or [] if v is not None and math.isfinite(v)]
    return float(np.mean(values)) if values else math.nan


def _chosen(results: Path | Records) -> dict[tuple[str, int], tuple[float, float, float] | None]:
    """(preset, depth) → the setting (lr, α-lr multiplier, warm-up) its search chose (from ``search/``)."""
    return {(r["preset"], int(r["depth"])): setting_of(r["chosen"]) if r.get("chosen") else None
            for r in _records(results).search}  # fmt: skip


def _final_runs(results: Path | Records) -> list[dict]:
    """Final runs at the setting their cell's search chose (runs of a superseded choice are left out)."""
    records = _records(results)
    chosen = _chosen(records)
    keep = []
    for r in records.runs["final"]:
        setting = chosen.get((r["preset"], int(r["depth"])))
        if setting is not None and np.allclose(run_setting(r), setting):
            keep.append(r)
    return keep


def run_outcome(r: dict) -> tuple[str, str]:
    """A run record's outcome (``ok``, ``diverged`` or ``failed``) and the failure rule it broke
    (:func:`classify_run` on its curve and accuracies)."""
    return classify_run(
        r.get("curve") or [], num_classes=int(r.get("num_classes", DEFAULT_CLASSES)), status=r.get("status", "ok"),
        train_accuracy=float(r.get("train_accuracy", math.nan)), test_accuracy=float(r.get("test_accuracy", math.nan)),
    )  # fmt: skip


def _kappa_columns(r: dict) -> dict[str, float]:
    """A run record's :data:`KAPPA_COLUMNS` (NaN where it records none)."""

    def as_float(value) -> float:
        return math.nan if value is None else float(value)

    return {"kappa_init": as_float(r.get("kappa_init")), "kappa_trained": as_float(r.get("kappa_trained")),
            **{f"kappa_{part}_{when}": as_float((r.get(f"sub_block_kappa_{when}") or {}).get(part))
               for when in ("init", "trained") for part in SUB_BLOCK_PARTS},
            **{f"{column}_{when}": as_float((r.get(f"osa_split_{when}") or {}).get(name))
               for when in ("init", "trained") for name, column in SPLIT_RECORD.items()}}  # fmt: skip


def run_table(results: Path | Records) -> pd.DataFrame:
    """One row per finished final run (:data:`RUN_COLUMNS`).

    ``status`` is the run's outcome by :func:`~osa_lab.studies.training.failures.classify_run`: ``ok``,
    ``diverged``, or ``failed`` (collapsed to chance, or a loss jump it did not recover from; the rule
    it broke is in ``failure``), whatever the run's own JSON said.
    """
    rows = []
    for r in _final_runs(results):
        rank_i, rank_t = r.get("rank_init") or {}, r.get("rank_trained") or {}
        curve = r.get("curve") or []
        outcome, failure = run_outcome(r)
        rows.append({**{k: r.get(k, math.nan) for k in RUN_COLUMNS}, "warmup_fraction": run_setting(r)[2],
                     "status": outcome, "failure": failure,
                     **{f"train_loss_at_{s}": loss_at_step(curve, s) for s in LOSS_STEPS},
                     "steps_to_threshold": steps_to_loss(curve, TRAIN_LOSS_THRESHOLD),
                     "effective_rank_init": rank_i.get("effective_rank", math.nan),
                     "effective_rank_trained": rank_t.get("effective_rank", math.nan),
                     "relative_residual_init": rank_i.get("relative_residual", math.nan),
                     "relative_residual_trained": rank_t.get("relative_residual", math.nan),
                     **_kappa_columns(r), "mixing_ratio_init": _mean(r.get("mixing_ratio_init")),
                     "mixing_ratio_trained": _mean(r.get("mixing_ratio_trained"))})  # fmt: skip
    df = pd.DataFrame(rows, columns=RUN_COLUMNS)
    return df.sort_values(["depth", "preset", "seed"], ignore_index=True)


def curve_table(results: Path | Records) -> pd.DataFrame:
    """Per-epoch training curves of the final runs (preset, depth, seed, step, train_loss, …)."""
    rows = []
    for r in _final_runs(results):
        for c in r.get("curve") or []:
            rows.append({"preset": r["preset"], "depth": r["depth"], "seed": r["seed"], **c})
    return pd.DataFrame(rows)


#: the columns of :func:`sub_block_layer_table`
SUB_BLOCK_LAYER_COLUMNS = ["preset", "depth", "seed", "when", "part", "layer", "kappa"]


def sub_block_layer_table(results: Path | Records) -> pd.DataFrame:
    """κ of each sub-block at each layer of the final runs (the median over the run's κ inputs), at
    initialisation and after training: one row per run, moment, part and layer (``layer`` 0 for the
    embedding, depth + 1 for the readout; columns :data:`SUB_BLOCK_LAYER_COLUMNS`). Runs recorded
    before the study kept κ per layer have no rows."""
    rows = []
    for r in _final_runs(results):
        for when in ("init", "trained"):
            for part, values in (r.get(f"sub_block_kappa_layers_{when}") or {}).items():
                first = {"embedding": 0, "readout": int(r["depth"]) + 1}.get(part, 1)
                rows += [{"preset": r["preset"], "depth": r["depth"], "seed": r["seed"], "when": when, "part": part,
                          "layer": first + i, "kappa": v} for i, v in enumerate(values)]  # fmt: skip
    return pd.DataFrame(rows, columns=SUB_BLOCK_LAYER_COLUMNS)


def tuning_table(results: Path | Records) -> pd.DataFrame:
    """One row per tuning run (its validation accuracy, the score, its final training loss, and κ end to
    end and per sub-block at initialisation and after training: NaN where the run did not record it),
    with the cell's search record (extended, chosen, edge after the limit)."""
    records = _records(results)
    rows = []
    for r in records.runs["tune"]:
        outcome, _ = run_outcome(r)
        rows.append({**{k: r.get(k) for k in ("preset", "depth", "lr", "alpha_lr_mult", "seed", "val_accuracy", "train_loss")},
                     "warmup_fraction": run_setting(r)[2], "status": outcome, **_kappa_columns(r)})  # fmt: skip
    df = pd.DataFrame(rows, columns=["preset", "depth", *AXES, "seed", "status", "val_accuracy", "train_loss",
                                     *KAPPA_COLUMNS])  # fmt: skip
    df = df.rename(columns={"seed": "tune_seed"})
    df["extended"], df["chosen"], df["edge_after_limit"] = False, False, ""
    df["chosen_by"], df["chosen_failures"] = "", 0

    def at(cell: pd.Series, setting: tuple[float, float, float]) -> pd.Series:
        return cell & np.logical_and.reduce([np.isclose(df[a], v) for a, v in zip(AXES, setting, strict=True)])

    for rec in records.search:
        cell = (df["preset"] == rec["preset"]) & (df["depth"] == rec["depth"])
        for point in rec.get("extension_points", []):
            df.loc[at(cell, setting_of(point)), "extended"] = True
        if rec.get("chosen"):
            df.loc[at(cell, setting_of(rec["chosen"])), "chosen"] = True
        df.loc[cell, "edge_after_limit"] = ", ".join(rec.get("edge_after_limit", []))
        df.loc[cell, "chosen_by"] = rec.get("chosen_by", TIE_RULE) if rec.get("chosen") else ""
        df.loc[cell, "chosen_failures"] = int(rec.get("chosen_failures", 0))
    return df.sort_values(["depth", "preset", *AXES, "tune_seed"], ignore_index=True)


def summary_table(runs: pd.DataFrame, tuning: pd.DataFrame, spec: StudySpec) -> pd.DataFrame:
    """Per preset × depth: runs planned and finished, test accuracy with a 95 % interval, trainability and κ."""
    rows = []
    for preset, depth in spec.run_order():
        r = runs[(runs["preset"] == preset) & (runs["depth"] == depth)]
        # failed runs keep the accuracy and loss they reached (leaving them out would flatter the preset that
        # failed); diverged runs have none
        ok = r[r["status"] != "diverged"]
        acc = ok["test_accuracy"].to_numpy(dtype=float)
        lo, hi = stats.mean_interval(acc, 0.95)
        t = tuning[(tuning["preset"] == preset) & (tuning["depth"] == depth)]
        planned = len(spec.final_seeds(depth))
        chosen = t[t["chosen"]]  # the tuner's choice, for a cell whose final runs have not started
        # diverged and failed runs both count as failures of training (exact binomial interval)
        failure_ci = stats.clopper_pearson(int((r["status"] != "ok").sum()), len(r))
        setting = r if len(r) else chosen
        rows.append({
            "preset": preset, "depth": depth, "planned": planned, "finished": len(r), "diverged": int((r["status"] == "diverged").sum()),
            "failed": int((r["status"] == "failed").sum()),
            "failure_rate_low": failure_ci[0], "failure_rate_high": failure_ci[1],
            "complete": len(r) >= planned,
            "lr": float(setting["lr"].iloc[0]) if len(setting) else math.nan,
            "alpha_lr_mult": float(setting["alpha_lr_mult"].iloc[0]) if len(setting) else math.nan,
            "warmup_fraction": float(setting["warmup_fraction"].iloc[0]) if len(setting) else math.nan,
            "tuning_runs": len(t),
            "stability_edge": "; ".join(unstable_neighbours(t, *(float(setting[a].iloc[0]) for a in AXES)))
            if len(setting) and len(t) else "",
            "grid_extended": bool(t["extended"].any()) if len(t) else False,
            "edge_after_limit": t["edge_after_limit"].iloc[0] if len(t) else "",
            "chosen_by": t["chosen_by"].iloc[0] if len(t) else "",
            "chosen_failures": int(t["chosen_failures"].iloc[0]) if len(t) else 0,
            **_choice_checks(t, chosen),
            "test_accuracy_mean": float(acc.mean()) if len(acc) else math.nan,
            "test_accuracy_std": float(acc.std(ddof=1)) if len(acc) > 1 else math.nan,
            "ci_low": lo, "ci_high": hi,
            "test_accuracy_by_seed": " / ".join(f"{a * 100:.1f}" for a in ok.sort_values("seed")["test_accuracy"].dropna()),
            "train_accuracy_mean": float(ok["train_accuracy"].mean()) if len(ok) else math.nan,
            "steps_to_90_median": float(ok["steps_to_90"].median()) if len(ok) else math.nan,
            **{f"train_loss_at_{s}_median": float(ok[f"train_loss_at_{s}"].median()) if len(ok) else math.nan
               for s in LOSS_STEPS},
            "train_loss_final_median": float(ok["train_loss"].median()) if len(ok) else math.nan,
            "steps_to_threshold_median": float(ok["steps_to_threshold"].median()) if len(ok) else math.nan,
            "reached_threshold": int(ok["steps_to_threshold"].notna().sum()),
            "reached_90": int(ok["steps_to_90"].notna().sum()),
            "kappa_init_median": float(r["kappa_init"].median()) if len(r) else math.nan,
            "kappa_trained_median": float(ok["kappa_trained"].median()) if len(ok) else math.nan,
        })  # fmt: skip
    return pd.DataFrame(rows)


def _choice_checks(tuning: pd.DataFrame, chosen: pd.DataFrame) -> dict[str, object]:
    """The chosen setting's edges among the values tried, and the setting a score on the final training
    loss would pick instead of validation accuracy (:mod:`.tuning_checks`); blank before tuning ends."""
    if chosen.empty:
        return {"chosen_grid_edge": "", "train_loss_choice": "", "train_loss_choice_agrees": pd.NA}
    setting = tuple(float(chosen[a].iloc[0]) for a in AXES)
    by_loss = tuning_checks.best_by_train_loss(tuning)
    return {"chosen_grid_edge": ", ".join(tuning_checks.grid_edges(tuning, setting)),
            "train_loss_choice": tuning_checks.setting_words(by_loss) if by_loss else "",
            "train_loss_choice_agrees": pd.NA if by_loss is None else bool(np.allclose(by_loss, setting))}  # fmt: skip


def gate_status(summary: pd.DataFrame, spec: StudySpec) -> tuple[str, list[str]]:
    """(``"passed"`` / ``"failed"`` / ``"not measured"``, one line per baseline)."""
    lines, states = [], []
    for preset, floor in spec.gate.items():
        rows = summary[summary["preset"] == preset]
        mean = float(rows["test_accuracy_mean"].iloc[0]) if len(rows) else math.nan
        done = bool(rows["complete"].iloc[0]) if len(rows) else False
        if math.isnan(mean) or not done:
            states.append("not measured")
            lines.append(f"`{preset}`: not finished ({int(rows['finished'].iloc[0]) if len(rows) else 0} runs)")
        else:
            states.append("passed" if mean >= floor else "failed")
            lines.append(f"`{preset}`: {mean * 100:.1f} % mean test accuracy (floor {floor * 100:.0f} %): {states[-1]}")
    state = "failed" if "failed" in states else "not measured" if "not measured" in states else "passed"
    return state, lines


def _pct(v: float) -> str:
    return "—" if not math.isfinite(v) else f"{v * 100:.1f}"


#: cells with this many finished seeds or fewer list each seed's test accuracy in the verdict
SEEDS_LISTED = 5


def _not_final_words(r) -> str:
    """What a cell without a final run has done: nothing, part of its tuning, or all of it."""
    if r.tuning_runs == 0:
        return "not run yet"
    if math.isfinite(r.lr):
        extended = ", grid extended" if r.grid_extended else ""
        return (f"tuned at {tuning_checks.setting_words((r.lr, r.alpha_lr_mult, r.warmup_fraction))} "
                f"({r.tuning_runs} tuning runs{extended}); "
                "no final run yet")  # fmt: skip
    return f"tuning ({r.tuning_runs} tuning runs so far); no final run yet"


def training_hours(results: Path | Records) -> dict[str, tuple[int, float]]:
    """Per stage (``"tune"``, ``"final"``): the runs recorded and their training time in hours,
    ``Σ epoch_time_s × epochs trained`` from each run's JSON (training steps only: the loop's epoch
    time leaves out evaluation and diagnostics, κ included). A run that diverged counts the epochs of
    its curve, not its planned ones (its ``epoch_time_s`` is the mean over those). Runs of a
    superseded choice count: they ran."""
    out = {}
    records = _records(results)
    for stage in ("tune", "final"):
        recs = records.runs[stage]
        seconds = [r.get("epoch_time_s", math.nan) * _epochs_trained(r) for r in recs]
        out[stage] = (len(recs), float(np.nansum(seconds)) / 3600)
    return out


def _epochs_trained(record: dict) -> float:
    """The epochs a run trained: its curve's rows (one per finished epoch), or ``epochs`` for a record
    without a curve."""
    curve = record.get("curve")
    return float(len(curve)) if isinstance(curve, list) else float(record.get("epochs", math.nan))


def _tuning_edge_lines(summary: pd.DataFrame, tuning_seeds: int) -> list[str]:
    """The cells whose chosen setting sits at the stability edge, or whose optimum is still at a grid edge.
    A cell where no setting trained on every tuning seed has no optimum: it gets its own line instead."""
    lines = []
    least = summary[summary["chosen_by"] == FEWEST_FAILURES]
    if len(least):
        def failed(n: int) -> str:
            return (f"every setting failed on all {n} tuning seeds: none trained" if n >= tuning_seeds
                    else f"failed on {n} of {tuning_seeds} tuning seeds")  # fmt: skip

        lines += ["No tuning setting trained on every tuning seed; the final seeds run at the one that failed on the "
                  "fewest, to measure the failure rate (it is not a tuned optimum, and the claims on it say so): "
                  + "; ".join(f"`{r.preset}` depth {r.depth} ({failed(r.chosen_failures)})" for r in least.itertuples()),
                  ""]  # fmt: skip
    summary = summary[summary["chosen_by"] != FEWEST_FAILURES]
    unstable = summary[summary["stability_edge"].astype(str) != ""]
    if len(unstable):
        lines += ["At the stability edge (a grid neighbour of the chosen setting failed or diverged in tuning): "
                  + "; ".join(f"`{r.preset}` depth {r.depth} (beside {r.stability_edge})" for r in unstable.itertuples()),
                  ""]  # fmt: skip
    edges = summary[summary["edge_after_limit"].astype(str) != ""]
    if len(edges):
        lines += ["Tuning optimum still at a grid edge (extended as often as allowed, or the next step lies past "
                  "the axis' bounds): "
                  + "; ".join(f"`{r.preset}` depth {r.depth} ({r.edge_after_limit})" for r in edges.itertuples()), ""]
    chosen_edges = summary[summary["chosen_grid_edge"].astype(str) != ""]
    if len(chosen_edges):
        lines += ["Chosen setting at an edge of the values tried (the tie rule can choose a point the search did not "
                  "bracket; along its own line, the other axes at the chosen values, no value beyond it was tried, or it "
                  "lies past the axis' bounds): "
                  + "; ".join(f"`{r.preset}` depth {r.depth} ({r.chosen_grid_edge})" for r in chosen_edges.itertuples()),
                  ""]  # fmt: skip
    return lines + _train_loss_choice_lines(summary)


def _train_loss_choice_lines(summary: pd.DataFrame) -> list[str]:
    """Whether scoring the tuning runs on their final training loss would have chosen the same setting."""
    scored = summary[summary["train_loss_choice"].astype(str) != ""]
    if scored.empty:
        return []
    agree = scored["train_loss_choice_agrees"].astype(bool)
    differ = scored[~agree]
    line = (f"Scored on the mean log10 final training loss of its tuning runs instead of validation accuracy, "
            f"tuning picks the same setting in {int(agree.sum())} of {len(scored)} tuned cells")
    if len(differ):
        line += "; it would pick another in " + "; ".join(
            f"`{r.preset}` depth {r.depth} ({r.train_loss_choice})" for r in differ.itertuples())
    return [line + ".", ""]


def _warmup_words(spec: StudySpec) -> str:
    w = spec.tuning.warmup_fraction
    return ", and the warm-up length" if len(w) > 1 else f"; warm-up {w[0]:g} of the steps"


def _tie_words(spec: StudySpec) -> str:
    if spec.tuning.tie_margin <= 0:
        return ""
    return (f"; settings within {spec.tuning.tie_margin * 100:g} points of the best mean tie, and the tie goes to the "
            "smallest learning rate, then the smallest α-lr multiplier, then the longest warm-up")


def verdict_text(summary: pd.DataFrame, claims: pd.DataFrame, spec: StudySpec,
                 hours: dict[str, tuple[int, float]] | None = None, notices: Sequence[object] = (),
                 pace: Pace | None = None) -> str:  # fmt: skip
    """The verdict in Markdown, from the tables (and :func:`training_hours` and
    :func:`~osa_lab.studies.depth_study.cost.training_pace`, when given) only; ``notices`` name the
    result files that were left out."""
    planned, finished = int(summary["planned"].sum()), int(summary["finished"].clip(upper=summary["planned"]).sum())
    complete = finished >= planned
    lines = [f"# Verdict: {spec.name} ({spec.profile} profile)", ""]
    lines.append(("**Complete**" if complete else "**PARTIAL**")
                 + f": {finished} of {planned} planned final runs finished"
                 + ("" if complete else "; every number below is provisional and the study resumes from this folder")
                 + ".")  # fmt: skip
    lines += ["", f"Budget: {spec.steps} steps (rounded up to whole epochs) at batch {spec.batch_size}, AdamW with warm-up "
              f"and cosine decay, for every preset; test accuracy of the final checkpoint; learning rate (and OSA's "
              f"α-lr multiplier{_warmup_words(spec)}) chosen per preset and depth on validation accuracy "
              f"({spec.val_fraction:g} of the training data) at {spec.tuning.steps} steps over tuning seeds "
              f"{list(spec.tuning.seeds)}{_tie_words(spec)}.", ""]  # fmt: skip
    if hours:
        (n_final, h_final), (n_tune, h_tune) = hours["final"], hours["tune"]
        lines += [f"Compute: {h_final + h_tune:.1f} hours of training steps, {h_final:.1f} in {n_final} final runs and "
                  f"{h_tune:.1f} in {n_tune} tuning runs (each run's recorded time per epoch × the epochs it trained; "
                  f"evaluation and diagnostics, κ included, are not counted).", ""]  # fmt: skip
    if pace and not complete:
        lines += remaining_lines(summary, spec, pace)
    gate, gate_lines = gate_status(summary, spec)
    if spec.gate:
        lines += ["## Baselines on the published scale (gate)", ""] + [f"* {x}" for x in gate_lines] + [""]
    lines += _tuning_edge_lines(summary, len(spec.tuning.seeds))
    lines += [f"## Test accuracy (%), mean ± std over seeds [95 % t-interval], and each seed's where there are "
              f"{SEEDS_LISTED} or fewer", ""]  # fmt: skip
    for r in summary.itertuples():
        if r.finished == 0:
            lines.append(f"* `{r.preset}` depth {r.depth}: " + _not_final_words(r))
            continue
        std = "" if not math.isfinite(r.test_accuracy_std) else f" ± {r.test_accuracy_std * 100:.1f}"
        ok = r.finished - r.diverged
        past = round(r.ci_low * 100, 1) < 0 or round(r.ci_high * 100, 1) > 100  # as printed
        beyond = " (past 0–100 %: the seeds spread too widely for a t-interval)" if past else ""
        by_seed = f", seeds {r.test_accuracy_by_seed}" if 0 < ok <= SEEDS_LISTED else ""
        lines.append(f"* `{r.preset}` depth {r.depth}: {_pct(r.test_accuracy_mean)}{std} [{_pct(r.ci_low)}, "
                     f"{_pct(r.ci_high)}]{beyond}{by_seed} ({ok} of {r.planned} seeds, {failure_words(r)}; "
                     f"{tuning_checks.setting_words((r.lr, r.alpha_lr_mult, r.warmup_fraction))}; "
                     "steps to 90 % train acc. "
                     + (f"{r.steps_to_90_median:.0f}" if math.isfinite(r.steps_to_90_median) else "not reached")
                     + (f" (median of the {r.reached_90} of {ok} seeds that reached it)" if 0 < r.reached_90 < ok else "")
                     + "; κ at init " + _kappa_words(r.kappa_init_median) + ")")  # fmt: skip
    lines += ["", "Failed and diverged runs are counted per cell: a run that ends within "
              f"{CHANCE_MARGIN * 100:.0f} points of chance, or whose training loss rose {LOSS_JUMP_FACTOR:g}× above its "
              "best and did not recover, failed whatever its loss says. Failed runs stay in the means and the paired "
              "tests at the accuracy they reached (leaving them out would flatter the preset that failed); diverged "
              "runs have no accuracy and are left out. The failure rate (failed or diverged) has an exact "
              "Clopper–Pearson 95 % interval.", ""]  # fmt: skip
    lines += trainability_lines(summary)
    testable = testable_claims(spec)
    untuned = {(r.preset, r.depth) for r in summary.itertuples() if r.chosen_by == FEWEST_FAILURES}
    lines += claims_lines(claims, spec, testable, untuned)
    lines += ["", "## Conclusion", ""]
    if not testable:
        lines.append("The study tests no claim of the paper, so it draws no conclusion about them.")
    elif gate != "passed":
        lines.append(f"The baselines' gate is {gate}: this study is not (yet) shown to be on the published MNIST-1D "
                     "scale, so it draws no conclusion about the paper's claim.")  # fmt: skip
    elif not complete:
        lines.append("The study is partial: the claims above are provisional and no conclusion is drawn yet.")
    else:
        for word in ("shown", "refuted", "inconclusive", "untestable"):
            rows = claims[claims["verdict"] == word]
            if len(rows):
                lines.append(f"* {word.capitalize()}: " + "; ".join(f"{r.claim} (depth {r.depth}{untuned_words(r, untuned)})"
                                                                   for r in rows.itertuples()))  # fmt: skip
        worse = claims[claims["direction"] == "worse"]
        if len(worse):
            lines.append("* Worse (two-sided): " + "; ".join(
                f"`{r.preset}` below `{r.other}` at depth {r.depth} ({difference_words(r.endpoint, r.diff_mean)})"
                for r in worse.itertuples()))  # fmt: skip
    if notices:
        lines += ["", f"## Result files left out ({len(notices)})", "",
                  "Damaged or out-of-range files of the results folder; none of their numbers is used above, and "
                  "rerunning the study trains these runs again.", ""] + [f"* {n}" for n in notices]  # fmt: skip
    lines += ["", "Not shown by this study: the paper's 2-D MNIST numbers (a different task); widths, budgets and "
              "optimisers other than the ones above; depths other than " + ", ".join(
                  str(d) for d in sorted({d for _, ds in spec.cells for d in ds})) + "."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _kappa_words(kappa: float) -> str:
    """A median κ in words: its value, "above ≈ 4.5e15" where float64 no longer resolves it
    (:data:`~osa_lab.studies.summaries.KAPPA_RESOLVED`: σ_min is rounding noise there), or a dash
    for a model without a token encoder (no Jacobian is taken)."""
    if math.isnan(kappa):
        return "— (no token encoder)"
    if kappa >= KAPPA_RESOLVED:
        return f"above {number(KAPPA_RESOLVED, 2)}, beyond what float64 resolves (numerically singular)"
    return number(kappa)


def finding_line(summary: pd.DataFrame, claims: pd.DataFrame, spec: StudySpec) -> str:
    """The study in one line (for the report index): how far it got, the gate, and the claims' verdicts."""
    planned, finished = int(summary["planned"].sum()), int(summary["finished"].clip(upper=summary["planned"]).sum())
    state = "complete" if finished >= planned else f"partial, {finished} of {planned} final runs"
    gate, _ = gate_status(summary, spec)
    verdicts = ", ".join(f"{r.other} at depth {r.depth}: {r.verdict}" for r in claims.itertuples()) if len(claims) else ""
    testable = bool(testable_claims(spec))
    tail = f"; claims — {verdicts}" if verdicts else "; no claim tested yet" if testable else "; it tests no claim"
    conclusion = "" if gate == "passed" and finished >= planned and testable else "; no conclusion drawn"
    return f"Depth study ({state}); baselines' gate {gate}{tail}{conclusion}."


def kappa_correlation_sentence(kappa: Sequence[float], value: Sequence[float], what: str = "test accuracy") -> str:
    """Spearman's rank correlation of κ at initialisation with ``what`` across preset × depth points, in words.

    κ at or above :data:`~osa_lab.studies.summaries.KAPPA_RESOLVED` counts as tied at that ceiling.
    Where some points sit there, a second sentence gives the correlation over the points below it
    alone, so a reader sees how much of ρ only separates "resolved" from "beyond float64".
    """
    from scipy.stats import spearmanr

    k, v = np.asarray(kappa, dtype=float), np.asarray(value, dtype=float)
    keep = np.isfinite(k) & np.isfinite(v)
    n = int(keep.sum())
    if n < 4:
        return f"Only {n} preset × depth point(s) with κ and {what}: too few for a rank correlation."
    k = np.minimum(k, KAPPA_RESOLVED)
    rho, p = spearmanr(k[keep], v[keep])
    head = f"Spearman rank correlation of κ at initialisation with {what} over {n} preset × depth points: ρ = {rho:+.2f} (p = {p:.2g}); "
    if not p < 0.05:
        text = head + f"not significant at 5 %: these points do not show that κ predicts {what}."
    else:
        direction = "higher" if rho > 0 else "lower"
        text = head + f"networks worse conditioned at initialisation had {direction} {what} (an association across presets and depths, not a cause)."
    resolved = keep & (k < KAPPA_RESOLVED)
    m = int(resolved.sum())
    at_ceiling = n - m
    if at_ceiling == 0:
        return text
    if m < 4:
        return text + f" {at_ceiling} of the {n} points have κ beyond what float64 resolves (tied); the {m} below it are too few for a correlation of their own."
    rho_r, p_r = spearmanr(k[resolved], v[resolved])
    return text + (f" {at_ceiling} of the {n} points have κ beyond what float64 resolves (tied); over the {m} below it "
                   f"alone, ρ = {rho_r:+.2f} (p = {p_r:.2g}).")


def summarise(results: str | Path, spec: StudySpec, *, write: bool = True,
              cache: RecordCache | None = None) -> dict[str, pd.DataFrame | str]:  # fmt: skip
    """Regenerate every table and the verdict from the run results under ``results``.

    Returns ``{"runs", "curves", "sub_block_layers", "tuning", "summary", "claims": DataFrame, "verdict", "finding": str,
    "notices": list}``; with
    ``write`` the tables go to ``results/<name>.csv`` and the verdict to ``results/verdict.md``
    (each written atomically: a full disk keeps the earlier file and raises
    :class:`~osa_lab.errors.OutputWriteError`). ``"notices"`` lists the result files left out
    (:class:`~osa_lab.studies.depth_study.records.Notice`). A study that summarises after every cell
    passes one ``cache`` (:class:`~osa_lab.studies.depth_study.records.RecordCache`) so that the
    records already read are not parsed again.
    """
    results = Path(results)
    records = read_records(results, cache)
    runs, tuning = run_table(records), tuning_table(records)
    summary = summary_table(runs, tuning, spec)
    claims = claims_table(runs, spec)
    complete = bool(summary["complete"].all())
    text = verdict_text(summary, claims, spec, training_hours(records), records.notices, training_pace(records))
    tables = {"runs": runs, "curves": curve_table(records), "sub_block_layers": sub_block_layer_table(records),
              "tuning": tuning, "summary": summary, "claims": claims}  # fmt: skip
    if write:
        for name, df in tables.items():
            df = df.copy()
            if name != "summary":  # the summary has its per-row column; every other table says it for the study
                df["complete"] = complete
            atomic_to_csv(df, results / f"{name}.csv", index=False)
        atomic_write_text(results / "verdict.md", text)
    return {**tables, "verdict": text, "finding": finding_line(summary, claims, spec), "notices": records.notices}
