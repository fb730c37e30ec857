"""One run of the study as a grid task: train, measure signal propagation, write a small JSON result.

The JSON (no checkpoint, a few kB) holds the run's settings, its final validation and test
accuracy (of the **final** checkpoint), the per-epoch training curve, steps to 90 % training
accuracy, the end-to-end Jacobian condition number κ of the encoder (embedded tokens → last
block, exact, float64), κ per sub-block and the split of the OSA layers at initialisation and
after training (every run, tuning runs too), the last
layer's effective rank and relative residual, OSA's per-layer mixing ratio and the whole training
configuration (``train_config``). A final run also keeps its trained weights beside its JSON
(:mod:`.weights`, tensor-only). A run whose JSON exists (and passes the checks of
:func:`osa_lab.studies.depth_study.records.read_run`) is not run again: the results folder alone
resumes and regenerates the study. A damaged record is trained again and replaced.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import torch

from osa_lab.errors import ConfigurationError
from osa_lab.fileio import atomic_write_text
from osa_lab.studies.data import load_data, split_validation
from osa_lab.studies.depth_study.weights import save_weights
from osa_lab.studies.jacobian.mixing_split import osa_split_record
from osa_lab.studies.jacobian.sub_blocks import sub_block_record
from osa_lab.studies.training.config import (
    DEFAULT_WARMUP_FRACTION,
    TrainConfig,
    comparable_json,
    model_config_for,
)
from osa_lab.studies.training.loop import build_training_model
from osa_lab.studies.training.tables import load_metrics

#: runs at or above this training accuracy count as having fitted the training set
TRAIN_ACCURACY_THRESHOLD = 0.9

_DATA: dict[tuple, Any] = {}


def result_name(stage: str, preset: str, depth: int, seed: int, lr: float, alpha_lr_mult: float,
                warmup_fraction: float = DEFAULT_WARMUP_FRACTION) -> str:  # fmt: skip
    """The file of one run under the results folder: ``<stage>/<preset>-d<depth>-lr<lr>-am<mult>[-wu<warm-up>]-s<seed>.json``
    (the warm-up only where it is not the default, so a study that does not tune it keeps its names)."""
    warmup = "" if math.isclose(warmup_fraction, DEFAULT_WARMUP_FRACTION) else f"-wu{warmup_fraction:g}"
    return f"{stage}/{preset}-d{depth}-lr{lr:g}-am{alpha_lr_mult:g}{warmup}-s{seed}.json"


def study_data(name: str, val_fraction: float):
    """The data set with its fixed validation split, loaded once per process."""
    key = (name, val_fraction)
    if key not in _DATA:
        _DATA.clear()
        _DATA[key] = split_validation(load_data(name), val_fraction)
    return _DATA[key]


def steps_to_threshold(curve: list[dict], threshold: float = TRAIN_ACCURACY_THRESHOLD) -> float:
    """The first step at whose epoch end the epoch's running training accuracy reached ``threshold`` (NaN: never)."""
    for row in curve:
        if row["train_accuracy"] >= threshold:
            return float(row["step"])
    return math.nan


def encoder_kappa(model: torch.nn.Module, x: torch.Tensor) -> float:
    """Median over the inputs ``x`` of κ(∂X_L/∂X_0) of the encoder, exact in float64 (docs/analysis.md).

    ``X_0`` are the embedded tokens of one input and ``X_L`` the last block's output; the
    Jacobian is the full (N·d)×(N·d) matrix (:func:`osa_lab.studies.jacobian.exact_jacobian`). NaN
    for models without a token encoder (``mlp``, ``cnn1d``).
    """
    from osa_lab.nn.models import ViTClassifier, functional_mode
    from osa_lab.studies.jacobian import exact_jacobian

    if not isinstance(model, ViTClassifier):
        return math.nan
    m = copy.deepcopy(model).double().eval()
    kappas = []
    with torch.no_grad():
        tokens = m.embed(x.double())
    with functional_mode(m):
        for x0 in tokens:
            J = exact_jacobian(lambda z: m.encoder(z[None])[0], x0)
            s = torch.linalg.svdvals(J)
            kappas.append(float(s[0] / s[-1]) if float(s[-1]) > 0 else math.inf)
    return float(torch.tensor(kappas, dtype=torch.float64).median())


def _hidden(metrics, epoch: int, metric: str) -> float:
    sel = metrics[(metrics["kind"] == "hidden") & (metrics["metric"] == metric) & (metrics["epoch"] == epoch)]
    return float(sel.sort_values("layer")["value"].iloc[-1]) if len(sel) else math.nan


def _mixing(metrics, epoch: int) -> list[float]:
    sel = metrics[(metrics["kind"] == "mixing") & (metrics["metric"] == "mixing_ratio") & (metrics["epoch"] == epoch)]
    return [float(v) for v in sel.groupby("layer")["value"].median().sort_index()]


def _write_json(path: Path, payload: dict) -> None:
    atomic_write_text(path, json.dumps(payload, indent=1, allow_nan=True))


def run_checkpoint_dir(scratch_dir: str | Path, results_dir: str | Path, result_json: Path,
                       train_config: dict[str, Any]) -> Path:
    """The folder of a study run's checkpoints under ``scratch_dir``: the result's path below ``results_dir``
    (``tune/<run>``) and a digest of its whole training configuration (``TrainConfig.to_dict()``, as the
    run JSON records it in ``train_config``), so that another model or budget never meets them."""
    digest = hashlib.sha1(comparable_json(train_config).encode()).hexdigest()[:10]
    return Path(scratch_dir) / f"{Path(result_json).with_suffix('').relative_to(results_dir)}-{digest}"


def study_run(
    *,
    spec: dict,
    stage: str,
    preset: str,
    depth: int,
    seed: int,
    lr: float,
    alpha_lr_mult: float,
    steps: int,
    results_dir: str,
    scratch_dir: str,
    kappa: bool,
    progress: bool = False,
    warmup_fraction: float = DEFAULT_WARMUP_FRACTION,
) -> dict:
    """Train one configuration (resuming its checkpoint in ``scratch_dir``) and write its JSON result."""
    return study_group_run(spec=spec, stage=stage, preset=preset, depth=depth, seeds=[seed], lr=lr,
                           alpha_lr_mult=alpha_lr_mult, steps=steps, results_dir=results_dir,
                           scratch_dir=scratch_dir, kappa=kappa, progress=progress,
                           warmup_fraction=warmup_fraction)[0]  # fmt: skip


def _finished_record(out: Path, stage: str, preset: str, depth: int, seed: int) -> dict | None:
    """The record of a finished run at ``out``, or None where there is none, it is damaged, or it is
    another run's (then the run is trained again and the file replaced)."""
    from osa_lab.studies.depth_study.records import RecordProblem, read_run

    if not out.exists():
        return None
    try:
        record = read_run(out, stage)
    except RecordProblem:
        return None
    return record if (record["preset"], record["depth"], record["seed"]) == (preset, depth, seed) else None


def budget_error(path: Path, differs: str) -> ConfigurationError:
    """The one-line refusal of a run at ``path`` trained on another budget (``differs``: :func:`budget_mismatch`)."""
    return ConfigurationError(
        f"{path} was trained with {differs}: the results folder holds another study's runs; give this study its "
        "own `results` folder (--output), or remove the runs it must not reuse")  # fmt: skip


def budget_mismatch(record: dict, spec: dict, depth: int, steps: int) -> str:
    """How a finished run's record differs from the run the study asks for now ("" where it does not):
    its data, batch size, validation fraction, model or number of epochs. A study whose file changed
    under a results folder must not reuse runs trained on another budget. Records written before
    ``train_config`` was recorded are checked on their epochs alone, and those without ``steps`` and
    ``epochs`` (hand-made ones) on nothing."""
    wanted: dict[str, Any] = {}
    recorded: dict[str, Any] = {}
    config = record.get("train_config")
    if isinstance(config, dict):
        wanted |= {"data": spec.get("data"), "batch_size": spec.get("batch_size"),
                   "val_fraction": spec.get("val_fraction"), "model": {**spec.get("model", {}), "depth": int(depth)}}  # fmt: skip
        recorded |= {k: config.get(k) for k in ("data", "batch_size", "val_fraction", "model")}
    if isinstance(record.get("steps"), int) and isinstance(record.get("epochs"), int) and record["epochs"] > 0:
        per_epoch = max(1, record["steps"] // record["epochs"])
        wanted["epochs"], recorded["epochs"] = max(1, math.ceil(steps / per_epoch)), record["epochs"]
    for key, value in wanted.items():
        if comparable_json(recorded[key]) != comparable_json(value):
            return f"`{key}` {recorded[key]!r} (the study asks for {value!r})"
    return ""


def study_group_run(
    *,
    spec: dict,
    stage: str,
    preset: str,
    depth: int,
    seeds: list[int],
    lr: float,
    alpha_lr_mult: float,
    steps: int,
    results_dir: str,
    scratch_dir: str,
    kappa: bool,
    progress: bool = False,
    warmup_fraction: float = DEFAULT_WARMUP_FRACTION,
) -> list[dict]:
    """Train the ``seeds`` of one configuration as one seed group
    (:func:`osa_lab.studies.training.group.train_group`; each seed resuming its own checkpoint in
    ``scratch_dir``) and write each seed's JSON result; returns them in ``seeds`` order. Seeds
    whose record exists are not trained again; a seed that diverges is a result of its own."""
    from osa_lab.studies.training.group import train_group

    outs = [Path(results_dir) / result_name(stage, preset, depth, seed, lr, alpha_lr_mult, warmup_fraction)
            for seed in seeds]  # fmt: skip
    done = {}
    for seed, out in zip(seeds, outs, strict=True):
        record = _finished_record(out, stage, preset, depth, seed)
        if record is not None:
            differs = budget_mismatch(record, spec, depth, steps)
            if differs:
                raise budget_error(out, differs)
            done[seed] = record
    pending = [(seed, out) for seed, out in zip(seeds, outs, strict=True) if seed not in done]
    if not pending:
        return [done[seed] for seed in seeds]
    data = study_data(spec["data"], spec["val_fraction"])
    n_train = len(data.y_train)
    per_epoch = math.ceil(n_train / spec["batch_size"])
    epochs = max(1, math.ceil(steps / per_epoch))
    configs, run_dirs, payloads = [], [], []
    x_k = data.x_val[: int(spec["kappa_samples"])]
    for seed, out in pending:
        config = TrainConfig(
            preset=preset, data=spec["data"], epochs=epochs, batch_size=spec["batch_size"], lr=float(lr),
            alpha_lr_mult=float(alpha_lr_mult), warmup_fraction=float(warmup_fraction),
            val_fraction=spec["val_fraction"], seed=int(seed), diag_every=0,
            model={**spec["model"], "depth": int(depth)},
        )  # fmt: skip
        run_dirs.append(run_checkpoint_dir(scratch_dir, results_dir, out, config.to_dict()))
        configs.append(config)
        payload: dict[str, Any] = {"stage": stage, "preset": preset, "depth": depth, "seed": seed, "lr": lr,
                                   "alpha_lr_mult": alpha_lr_mult, "warmup_fraction": float(warmup_fraction),
                                   "steps": epochs * per_epoch, "epochs": epochs,
                                   "checkpoint": "final", "train_config": config.to_dict(),
                                   "num_classes": data.num_classes}  # fmt: skip
        if kappa:
            torch.manual_seed(config.seed)
            initial = build_training_model(model_config_for(config, data))
            payload["kappa_init"] = encoder_kappa(initial, x_k)
            payload["sub_block_kappa_init"], payload["sub_block_kappa_layers_init"] = sub_block_record(initial, x_k)
            payload["osa_split_init"] = osa_split_record(initial, x_k)
        payloads.append(payload)
    outcomes = train_group(configs, run_dirs, data=data, progress=progress)
    for (seed, out), run_dir, payload, outcome in zip(pending, run_dirs, payloads, outcomes, strict=True):
        if outcome.ok:
            result, metrics, status, error = outcome.result, outcome.result.metrics, "ok", ""
        else:
            partial = run_dir / "metrics.csv"
            metrics = load_metrics(partial) if partial.exists() else None
            status, error, result = "diverged", " ".join(str(outcome.error).split()), None
        _finish_payload(payload, metrics, status, error, result, x_k, kappa)
        if result is not None and stage == "final":
            # the weights first: a run whose JSON exists is done, so its weights must already be there
            payload["weights"] = save_weights(result.model, out).name
        _write_json(out, payload)
        done[seed] = payload
    return [done[seed] for seed in seeds]


def _finish_payload(payload: dict, metrics, status: str, error: str, result, x_k: torch.Tensor, kappa: bool) -> None:
    """The result JSON's measured part, from a run's metrics (and, for ``kappa``, its trained model)."""
    payload.update(status=status, error=error)
    curve = []
    if metrics is not None and len(metrics):
        wide = metrics[metrics["kind"].isin(["train", "eval"])].pivot_table(
            index=["epoch", "step"], columns="metric", values="value"
        ).reset_index()
        for _, r in wide.iterrows():
            curve.append({"epoch": int(r["epoch"]), "step": int(r["step"]),
                          **{k: float(r[k]) for k in ("train_loss", "train_accuracy", "val_accuracy", "test_accuracy")
                             if k in r and not math.isnan(r[k])}})  # fmt: skip
        last = int(metrics["epoch"].max())
        payload["rank_init"] = {"effective_rank": _hidden(metrics, 0, "effective_rank"),
                                "relative_residual": _hidden(metrics, 0, "relative_residual")}  # fmt: skip
        payload["mixing_ratio_init"] = _mixing(metrics, 0)
        if status == "ok":
            payload["rank_trained"] = {"effective_rank": _hidden(metrics, last, "effective_rank"),
                                       "relative_residual": _hidden(metrics, last, "relative_residual")}  # fmt: skip
            payload["mixing_ratio_trained"] = _mixing(metrics, last)
    payload["curve"] = curve
    final = curve[-1] if curve and status == "ok" else {}
    payload.update(
        train_loss=final.get("train_loss", math.nan), train_accuracy=final.get("train_accuracy", math.nan),
        val_accuracy=final.get("val_accuracy", math.nan), test_accuracy=final.get("test_accuracy", math.nan),
        steps_to_90=steps_to_threshold(curve),
        epoch_time_s=float(metrics.loc[metrics["metric"] == "epoch_time_s", "value"].mean())
        if metrics is not None and len(metrics) else math.nan,
    )  # fmt: skip
    if kappa:
        payload["kappa_trained"] = encoder_kappa(result.model, x_k) if result is not None else math.nan
        if result is not None:
            medians, layers = sub_block_record(result.model, x_k)
            payload["sub_block_kappa_trained"], payload["sub_block_kappa_layers_trained"] = medians, layers
            payload["osa_split_trained"] = osa_split_record(result.model, x_k)
