"""κ of each sub-block at each layer for final runs recorded before runs kept it.

A final run records κ per sub-block at initialisation and after training (:mod:`.run`; tuning runs
too since later, and :mod:`.tuning_kappas` adds theirs to those recorded before): the median
over layers (``sub_block_kappa_<when>``) and, since later, each layer's value
(``sub_block_kappa_layers_<when>``). :func:`add_layer_kappas` adds the per-layer values to a run that
has only the medians, from the same models: the initial one rebuilt under the run's seed, the
trained one from its saved weights (:func:`~osa_lab.studies.depth_study.weights.run_models`), at the
study's own κ inputs. The medians it computes on the way must reproduce the recorded ones; a run
whose models do not is refused, not changed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from osa_lab.errors import MalformedResultError
from osa_lab.fileio import atomic_write_text
from osa_lab.studies.depth_study.run import study_data
from osa_lab.studies.depth_study.weights import run_models
from osa_lab.studies.jacobian.sub_blocks import sub_block_record

#: how closely a recomputed median must match the recorded one (float64 SVDs of the same model)
MEDIAN_TOLERANCE = 1e-6


def _agrees(recorded: dict[str, Any], medians: dict[str, float]) -> bool:
    def same(a: float, b: float) -> bool:
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=MEDIAN_TOLERANCE)

    return all(same(float(recorded.get(part, math.nan)), value) for part, value in medians.items())


def add_layer_kappas(results: str | Path, spec: Any) -> list[Path]:
    """Add ``sub_block_kappa_layers_init`` (and ``…_trained`` where the weights were saved) to every final
    run under ``results`` that records the medians but not the layers; returns the files changed.

    ``spec`` is the study's :class:`~osa_lab.studies.depth_study.spec.StudySpec` (its data, validation
    split and number of κ inputs). Raises :class:`~osa_lab.errors.MalformedResultError` naming the file
    whose rebuilt model does not reproduce its recorded medians (the run is left as it was).
    """
    changed = []
    data = None
    for path in sorted(Path(results).glob("final/*.json")):
        payload = json.loads(path.read_text(encoding="utf-8"))
        pending = [when for when in ("init", "trained") if isinstance(payload.get(f"sub_block_kappa_{when}"), dict)
                   and f"sub_block_kappa_layers_{when}" not in payload]  # fmt: skip
        if not pending:
            continue
        data = data if data is not None else study_data(spec.data, spec.val_fraction)
        models = run_models(path, data)
        x_k = data.x_val[: int(spec.kappa_samples)]
        for when in pending:
            model = models.initial if when == "init" else models.trained
            if model is None:
                continue
            medians, layers = sub_block_record(model, x_k)
            if not _agrees(payload[f"sub_block_kappa_{when}"], medians):
                raise MalformedResultError(
                    f"{path}: the rebuilt model's κ medians ({when}) {medians} do not reproduce the recorded "
                    f"{payload[f'sub_block_kappa_{when}']}; its per-layer κ was not added"
                )
            payload[f"sub_block_kappa_layers_{when}"] = layers
        atomic_write_text(path, json.dumps(payload, indent=1, allow_nan=True))
        changed.append(path)
    return changed
