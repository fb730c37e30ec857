"""Layer-by-layer profiles of a study run's model at initialisation and after training.

:func:`run_layer_profiles` rebuilds a final run (:func:`~osa_lab.studies.depth_study.weights.run_models`),
passes a fixed batch of the run's test inputs through both models and scores every block's output
with the metrics of :mod:`osa_lab.studies.metrics` (effective and stable rank, relative residual,
token cosine, κ(X) = σ_max/σ_min) and its singular-value spectrum, through the same
:func:`~osa_lab.studies.depth.profiles.profile_tables` as the initialisation-only depth profiles.
The two tidy tables carry a ``state`` column (``"initialisation"`` / ``"trained"``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from osa_lab.errors import MalformedResultError
from osa_lab.studies.depth.profiles import profile_tables
from osa_lab.studies.depth_study.weights import run_models
from osa_lab.studies.metrics import METRICS
from osa_lab.studies.settings import alpha_of

#: the two states of a run's model, in the order they are shown
STATES = ("initialisation", "trained")
#: test inputs per profile (the metrics are means over these samples)
PROFILE_SAMPLES = 32


@dataclass
class RunLayerProfiles:
    """Tidy per-layer tables of one run, both states (``metrics``: layer, metric, value; ``spectra``: layer,
    index, sigma, sigma_normalized), each row tagged with the run's preset, depth, seed and ``state``."""

    metrics: pd.DataFrame
    spectra: pd.DataFrame


def run_layer_profiles(
    result_json: str | os.PathLike, data=None, samples: int = PROFILE_SAMPLES
) -> RunLayerProfiles:
    """Metrics and spectra of every block output of the run ``result_json``, at initialisation and trained.

    Raises :class:`MalformedResultError` when the run has no saved weights, its JSON cannot rebuild the
    model, or the model has no transformer blocks (the MLP and CNN baselines have no hidden tokens).
    """
    from osa_lab.nn.models import ViTClassifier
    from osa_lab.studies.data import load_data

    path = Path(result_json)
    if data is None:
        import json

        from osa_lab.studies.training.config import TrainConfig

        data = load_data(TrainConfig(**json.loads(path.read_text(encoding="utf-8"))["train_config"]).data)
    models = run_models(path, data=data)
    if models.trained is None:
        raise MalformedResultError(f"{path}: no weights were saved for this run, so only its JSON can be shown")
    if not isinstance(models.initial, ViTClassifier):
        raise MalformedResultError(
            f"{path}: a {type(models.initial).__name__} has no transformer blocks to profile layer by layer"
        )
    inputs = data.x_test[:samples]
    config = models.config
    metric_parts, spectra_parts = [], []
    for state, model in zip(STATES, (models.initial, models.trained), strict=True):
        dtype = next(model.parameters()).dtype
        with torch.no_grad():
            _, hidden = model(inputs.to(dtype), return_hidden=True)
        hidden.blocks = [h.detach().to(torch.float64) for h in hidden.blocks]
        n_tokens, width = hidden.blocks[0].shape[-2:]
        keys = {"preset": config.preset, "depth": hidden.depth, "tokens": int(n_tokens), "dim": int(width),
                "heads": int(model.config.heads), "alpha": alpha_of(model, model.config), "seed": int(config.seed)}
        metrics, spectra = profile_tables(hidden, keys, ["block"], list(METRICS), spectra=True)
        metric_parts.append(metrics.assign(state=state))
        spectra_parts.append(spectra.assign(state=state))
    return RunLayerProfiles(pd.concat(metric_parts, ignore_index=True), pd.concat(spectra_parts, ignore_index=True))
