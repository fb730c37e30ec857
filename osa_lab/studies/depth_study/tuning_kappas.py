"""κ of tuning runs recorded before tuning runs kept it, from the rebuilt models and the runs' checkpoints.

Every study run records κ of the encoder end to end (:func:`~osa_lab.studies.depth_study.run.encoder_kappa`),
per sub-block (:func:`~osa_lab.studies.jacobian.sub_blocks.sub_block_record`) and the split of its
OSA layers (:func:`~osa_lab.studies.jacobian.mixing_split.osa_split_record`) at initialisation and
after training (:mod:`.run`). Tuning runs of an earlier version recorded none of them, and runs of a
later one κ but not the split.
:func:`add_tuning_kappas` adds them: at initialisation from the model rebuilt under the run's seed;
after training from the run's last checkpoint (tuning runs keep no weights file), only where that
checkpoint is the run's end, the same configuration and epoch count, and its model reproduces the
recorded validation accuracy exactly. A run whose checkpoint is gone gets κ at initialisation only,
and is named in the result (and gets the rest on a later call where the checkpoint is back); a
checkpoint that disagrees with its run is refused, and the run left as it was.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from osa_lab.errors import MalformedResultError
from osa_lab.fileio import atomic_write_text
from osa_lab.studies.depth_study.run import encoder_kappa, run_checkpoint_dir, study_data
from osa_lab.studies.depth_study.weights import run_models
from osa_lab.studies.jacobian.mixing_split import osa_split_record
from osa_lab.studies.jacobian.sub_blocks import sub_block_record
from osa_lab.studies.training.checkpoints import CHECKPOINT_NAME, read_checkpoint
from osa_lab.studies.training.config import comparable_json
from osa_lab.studies.training.loop import evaluate


@dataclass
class TuningKappas:
    """What :func:`add_tuning_kappas` did: the files it changed, and the runs that lack values after
    training and whose checkpoint is gone (changed or not: they have, or got, the values at
    initialisation only)."""

    changed: list[Path] = field(default_factory=list)
    without_checkpoint: list[Path] = field(default_factory=list)


def _checked_trained_model(path: Path, payload: dict[str, Any], initial: torch.nn.Module, checkpoint: Path, data):
    """The run's trained model from its last checkpoint, after checking that the checkpoint is the
    run's end: its configuration, its epoch count and the validation accuracy its model gives."""
    state = read_checkpoint(checkpoint, torch.device("cpu"))
    if comparable_json(state["train_config"]) != comparable_json(payload["train_config"]):
        raise MalformedResultError(f"{path}: the checkpoint {checkpoint} is another configuration's; nothing was added")
    if int(state["epoch"]) != int(payload["epochs"]):
        raise MalformedResultError(
            f"{path}: the checkpoint {checkpoint} holds epoch {state['epoch']} of the run's {payload['epochs']}, "
            "not its end; nothing was added"
        )
    trained = copy.deepcopy(initial)
    trained.load_state_dict(state["model"], strict=True)
    _, accuracy = evaluate(trained, data.x_val, data.y_val)
    recorded = float(payload.get("val_accuracy", math.nan))
    if not math.isfinite(recorded) or round(accuracy * len(data.y_val)) != round(recorded * len(data.y_val)):
        raise MalformedResultError(
            f"{path}: the model in {checkpoint} gives validation accuracy {accuracy:.4f}, the run recorded "
            f"{recorded:.4f}; nothing was added"
        )
    return trained.eval()


def _missing(payload: dict[str, Any], when: str) -> list[str]:
    """What a run record lacks of what the study records at ``when`` (``init`` or ``trained``): ``kappa``
    (κ end to end and per sub-block) and ``split`` (the OSA split). After training, only a run that
    ended ``ok`` has anything to record."""
    if when == "trained" and payload.get("status") != "ok":
        return []
    return [name for name, field_name in (("kappa", f"sub_block_kappa_{when}"), ("split", f"osa_split_{when}"))
            if field_name not in payload]  # fmt: skip


def add_tuning_kappas(results: str | Path, spec: Any, checkpoints: str | Path, *, progress: bool = False) -> TuningKappas:
    """Add what a tuning run under ``results`` lacks of what the study records: ``kappa_<when>``,
    ``sub_block_kappa_<when>``, ``sub_block_kappa_layers_<when>`` and ``osa_split_<when>``, at
    initialisation (``init``) and, where the run's checkpoint under ``checkpoints`` (the study's
    ``--checkpoints`` folder) is its end, after training (``trained``). A run that did not end ``ok``
    gets ``kappa_trained`` NaN, as the study records it; a run whose checkpoint is gone gets the rest,
    is named in :attr:`TuningKappas.without_checkpoint`, and gets its trained values on a later call
    where the checkpoint is back. A run with nothing to add is not rebuilt.

    ``spec`` is the study's :class:`~osa_lab.studies.depth_study.spec.StudySpec` (its data, validation
    split and number of κ inputs). Raises :class:`~osa_lab.errors.MalformedResultError` naming the run
    whose checkpoint is another configuration's, stops before the run's end, or does not reproduce the
    recorded validation accuracy, and stops there: that run is left as it was, the runs before it keep
    what was added, and the runs after it are not looked at.
    """
    from tqdm.auto import tqdm

    done = TuningKappas()
    pending: list[tuple[Path, Path | None]] = []  # (run, its checkpoint where trained values are missing)
    for path in sorted(Path(results).glob("tune/*.json")):
        payload = json.loads(path.read_text(encoding="utf-8"))
        checkpoint = None
        if _missing(payload, "trained") and isinstance(payload.get("train_config"), dict):
            checkpoint = run_checkpoint_dir(checkpoints, results, path, payload["train_config"]) / CHECKPOINT_NAME
            if not checkpoint.exists():
                done.without_checkpoint.append(path)
                checkpoint = None
        if _missing(payload, "init") or checkpoint is not None:
            pending.append((path, checkpoint))
    if not pending:
        return done
    data = study_data(spec.data, spec.val_fraction)
    x_k = data.x_val[: int(spec.kappa_samples)]
    for path, checkpoint in tqdm(pending, desc="κ of tuning runs", unit="run", disable=not progress):
        payload = json.loads(path.read_text(encoding="utf-8"))
        missing = {when: _missing(payload, when) for when in ("init", "trained")}
        models = run_models(path, data)
        trained = None if checkpoint is None else _checked_trained_model(path, payload, models.initial, checkpoint, data)
        for when, model in (("init", models.initial), ("trained", trained)):
            if model is None:
                continue
            if "kappa" in missing[when]:
                payload[f"kappa_{when}"] = encoder_kappa(model, x_k)
                medians, layers = sub_block_record(model, x_k)
                payload[f"sub_block_kappa_{when}"], payload[f"sub_block_kappa_layers_{when}"] = medians, layers
            if "split" in missing[when]:
                payload[f"osa_split_{when}"] = osa_split_record(model, x_k)
        if payload.get("status") != "ok":
            payload["kappa_trained"] = math.nan
        atomic_write_text(path, json.dumps(payload, indent=1, allow_nan=True))
        done.changed.append(path)
    return done
