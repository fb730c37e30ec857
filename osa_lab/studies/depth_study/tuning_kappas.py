"""κ of tuning runs recorded before tuning runs kept it, from the rebuilt models and the runs' checkpoints.

Every study run records κ of the encoder end to end (:func:`~osa_lab.studies.depth_study.run.encoder_kappa`)
and per sub-block (:func:`~osa_lab.studies.jacobian.sub_blocks.sub_block_record`) at initialisation
and after training (:mod:`.run`). Tuning runs of an earlier version recorded neither.
:func:`add_tuning_kappas` adds them: at initialisation from the model rebuilt under the run's seed;
after training from the run's last checkpoint (tuning runs keep no weights file), only where that
checkpoint is the run's end, the same configuration and epoch count, and its model reproduces the
recorded validation accuracy exactly. A run whose checkpoint is gone gets κ at initialisation only,
and is named in the result; a checkpoint that disagrees with its run is refused, and the run left
as it was.
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
from osa_lab.studies.jacobian.sub_blocks import sub_block_record
from osa_lab.studies.training.checkpoints import CHECKPOINT_NAME, read_checkpoint
from osa_lab.studies.training.config import comparable_json
from osa_lab.studies.training.loop import evaluate


@dataclass
class TuningKappas:
    """What :func:`add_tuning_kappas` did: the files it changed, and those among them whose trained κ
    could not be measured because the run's checkpoint is gone (κ at initialisation only)."""

    changed: list[Path] = field(default_factory=list)
    without_checkpoint: list[Path] = field(default_factory=list)


def _checked_trained_model(path: Path, payload: dict[str, Any], initial: torch.nn.Module, checkpoint: Path, data):
    """The run's trained model from its last checkpoint, after checking that the checkpoint is the
    run's end: its configuration, its epoch count and the validation accuracy its model gives."""
    state = read_checkpoint(checkpoint, torch.device("cpu"))
    if comparable_json(state["train_config"]) != comparable_json(payload["train_config"]):
        raise MalformedResultError(f"{path}: the checkpoint {checkpoint} is another configuration's; no κ was added")
    if int(state["epoch"]) != int(payload["epochs"]):
        raise MalformedResultError(
            f"{path}: the checkpoint {checkpoint} holds epoch {state['epoch']} of the run's {payload['epochs']}, "
            "not its end; no κ was added"
        )
    trained = copy.deepcopy(initial)
    trained.load_state_dict(state["model"], strict=True)
    _, accuracy = evaluate(trained, data.x_val, data.y_val)
    recorded = float(payload.get("val_accuracy", math.nan))
    if round(accuracy * len(data.y_val)) != round(recorded * len(data.y_val)):
        raise MalformedResultError(
            f"{path}: the model in {checkpoint} gives validation accuracy {accuracy:.4f}, the run recorded "
            f"{recorded:.4f}; no κ was added"
        )
    return trained.eval()


def add_tuning_kappas(results: str | Path, spec: Any, checkpoints: str | Path, *, progress: bool = False) -> TuningKappas:
    """Add ``kappa_init``, ``sub_block_kappa_init``, ``sub_block_kappa_layers_init`` and, where the run's
    checkpoint under ``checkpoints`` (the study's ``--checkpoints`` folder) is its end, the same three
    after training to every tuning run under ``results`` that records none of them.

    ``spec`` is the study's :class:`~osa_lab.studies.depth_study.spec.StudySpec` (its data, validation
    split and number of κ inputs). A run that did not end ``ok`` gets ``kappa_trained`` NaN, as the study
    records it. Raises :class:`~osa_lab.errors.MalformedResultError` naming the run whose checkpoint is
    another configuration's, stops before the run's end, or does not reproduce the recorded validation
    accuracy (that run is left as it was; the runs before it keep what was added).
    """
    from tqdm.auto import tqdm

    done = TuningKappas()
    pending = [p for p in sorted(Path(results).glob("tune/*.json"))
               if "kappa_init" not in json.loads(p.read_text(encoding="utf-8"))]  # fmt: skip
    if not pending:
        return done
    data = study_data(spec.data, spec.val_fraction)
    x_k = data.x_val[: int(spec.kappa_samples)]
    for path in tqdm(pending, desc="κ of tuning runs", unit="run", disable=not progress):
        payload = json.loads(path.read_text(encoding="utf-8"))
        models = run_models(path, data)
        trained = None
        if payload.get("status") == "ok":
            checkpoint = run_checkpoint_dir(checkpoints, results, path, models.config) / CHECKPOINT_NAME
            if checkpoint.exists():
                trained = _checked_trained_model(path, payload, models.initial, checkpoint, data)
            else:
                done.without_checkpoint.append(path)
        payload["kappa_init"] = encoder_kappa(models.initial, x_k)
        payload["sub_block_kappa_init"], payload["sub_block_kappa_layers_init"] = sub_block_record(models.initial, x_k)
        if trained is not None:
            payload["kappa_trained"] = encoder_kappa(trained, x_k)
            payload["sub_block_kappa_trained"], payload["sub_block_kappa_layers_trained"] = sub_block_record(trained, x_k)
        elif payload.get("status") != "ok":
            payload["kappa_trained"] = math.nan
        atomic_write_text(path, json.dumps(payload, indent=1, allow_nan=True))
        done.changed.append(path)
    return done
