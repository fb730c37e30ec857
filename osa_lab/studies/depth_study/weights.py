"""Trained weights of a study's runs: a tensor-only file beside each run JSON, and the models rebuilt from it.

A final run writes ``<stage>/<run>.weights.pt`` next to ``<stage>/<run>.json``: the trained model's
state dict, tensors only, read back with ``torch.load(weights_only=True)`` so that a results folder
from elsewhere never runs code. The run JSON records its whole training configuration
(``train_config``), from which :func:`run_models` rebuilds the model at initialisation (the seed fixes
it) and loads the trained weights into a second copy. At width 32 a file holds kilobytes.
"""

from __future__ import annotations

import copy
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from osa_lab.errors import MalformedResultError
from osa_lab.fileio import atomic_write_bytes

#: suffix of a run's weights file, replacing the run JSON's ``.json``
WEIGHTS_SUFFIX = ".weights.pt"
#: the largest weights file read (a width-32 model at depth 32 is well under 1 MiB)
MAX_WEIGHTS_BYTES = 256 * 2**20


def weights_path(result_json: str | os.PathLike) -> Path:
    """The weights file of the run whose JSON is ``result_json`` (``x.json`` → ``x.weights.pt``)."""
    path = Path(result_json)
    if path.suffix != ".json":
        raise MalformedResultError(f"{path}: a run result is a .json file; got {path.suffix or 'no suffix'!r}")
    return path.with_name(path.name[: -len(".json")] + WEIGHTS_SUFFIX)


def save_weights(model: nn.Module, result_json: str | os.PathLike) -> Path:
    """Write ``model``'s state dict (detached CPU tensors) atomically beside ``result_json``; returns the path."""
    state = {name: t.detach().to("cpu").clone() for name, t in model.state_dict().items()}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return atomic_write_bytes(weights_path(result_json), buffer.getvalue())


def load_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A weights file's state dict, read with ``weights_only=True``; a file that is not a mapping of names
    to tensors, or is larger than :data:`MAX_WEIGHTS_BYTES`, raises :class:`MalformedResultError`."""
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_WEIGHTS_BYTES:
        raise MalformedResultError(
            f"{path}: {size / 2**20:.0f} MiB is larger than a study's weights file can be "
            f"({MAX_WEIGHTS_BYTES // 2**20} MiB); it is not a run's weights"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for damaged or unsafe files
        raise MalformedResultError(
            f"{path}: not a tensor-only weights file ({type(err).__name__}: {str(err).splitlines()[0][:200]})"
        ) from err
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise MalformedResultError(f"{path}: a weights file holds a mapping of parameter names to tensors")
    return state


@dataclass
class RunModels:
    """A run's model at initialisation and after training (``None`` where no weights were saved)."""

    config: object  # osa_lab.studies.training.TrainConfig
    initial: nn.Module
    trained: nn.Module | None


def run_models(result_json: str | os.PathLike, data=None) -> RunModels:
    """Rebuild the run of ``result_json``: its model at initialisation (from the recorded seed) and, where
    its weights file exists, the trained model. ``data`` (the run's data set) is loaded when not given.

    Raises :class:`MalformedResultError` for a JSON without ``train_config`` (written before runs recorded
    their configuration) or weights that do not fit the rebuilt model.
    """
    from osa_lab.studies.data import load_data
    from osa_lab.studies.training.config import TrainConfig, build_training_model, model_config_for

    path = Path(result_json)
    payload = json.loads(path.read_text(encoding="utf-8"))
    recorded = payload.get("train_config") if isinstance(payload, dict) else None
    if not isinstance(recorded, dict):
        raise MalformedResultError(
            f"{path}: no `train_config` in the run result, so its model cannot be rebuilt (results written "
            "before runs recorded their configuration); rerun the study to save configurations and weights"
        )
    try:
        config = TrainConfig(**recorded)
    except TypeError as err:
        raise MalformedResultError(f"{path}: `train_config` does not describe a training run ({err})") from err
    data = data if data is not None else load_data(config.data)
    model_config = model_config_for(config, data)
    torch.manual_seed(config.seed)
    initial = build_training_model(model_config).eval()
    trained = None
    wpath = weights_path(path)
    if wpath.exists():
        trained = copy.deepcopy(initial)
        try:
            trained.load_state_dict(load_weights(wpath), strict=True)
        except RuntimeError as err:
            raise MalformedResultError(
                f"{wpath}: the weights do not fit the model its run JSON describes ({str(err).splitlines()[0]})"
            ) from err
    return RunModels(config=config, initial=initial, trained=trained)
