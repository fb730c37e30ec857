"""Training of (skipless) ViT presets: the experiment of Zhang & Martens (arXiv 2602.05996, docs/design.md §5).

The paper trains a ViT on MNIST with softmax attention replaced by OSA and the skip
connections and LayerNorm removed, and reports (third-party summaries) 97.2 % test accuracy
for the skip-connected ViT, 94.6 % for skipless softmax attention, and skipless OSA
comparable to the former. This package reruns that comparison on our presets, one room per
subject:

* :mod:`~osa_lab.studies.training.config` — :class:`TrainConfig`, the comparison's presets and
  the model a configuration builds for a data set;
* :mod:`~osa_lab.studies.training.loop` — :func:`train`, one run: AdamW (Loshchilov & Hutter
  2019) with linear warm-up and a cosine schedule (Loshchilov & Hutter 2017), a fixed seed and
  deterministic batch order, checkpoints at every epoch end (an interrupted run resumes to
  exactly the uninterrupted result);
* :mod:`~osa_lab.studies.training.group` — :func:`train_group`, several seeds of one
  configuration trained together in one batched forward and backward, each member exactly as
  its solo run (the default of ``osa-lab train --seeds``);
* :mod:`~osa_lab.studies.training.checkpoints` and :mod:`~osa_lab.studies.training.lock` — the
  run folder: checkpoints read without unpickling code, one owner per folder;
* :mod:`~osa_lab.studies.training.tables` — the tidy metrics table;
* :mod:`~osa_lab.studies.training.compare` — :func:`compare`, presets × seeds on one budget,
  and :func:`summarize_runs`;
* :mod:`~osa_lab.studies.training.tune`, :mod:`~osa_lab.studies.training.statistics` and
  :mod:`~osa_lab.studies.training.verdict` — fair tuning on validation data, paired
  differences and the generated verdict;
* :mod:`~osa_lab.studies.training.cli` — ``osa-lab train``.

The metrics table is long-format (docs/design.md §6): one row per observation with columns
``preset, data, seed, epoch, step, kind, metric, layer, head, value``. ``kind`` is

* ``"train"``: ``train_loss`` and ``train_accuracy`` (running means over the epoch's
  batches, with the weights as they were at each step) and ``lr`` (at the epoch end);
* ``"eval"``: ``test_loss`` and ``test_accuracy`` after the epoch (``val_loss`` and
  ``val_accuracy`` too when a validation split is held out);
* ``"alpha"``: every OSA layer's α per head (``layer`` = index of the OSA layer in block
  order, ``head``);
* ``"hidden"``: the rank-collapse and conditioning metrics of :mod:`osa_lab.studies.metrics`
  (docs/design.md §4) of each layer's hidden states (``layer`` 0 = the embedded input) on a
  fixed batch of held-out inputs, every ``diag_every`` steps (and at step 0 and the last step);
* ``"mixing"``: OSA's per-layer mixing (‖S‖₂ and ‖exp(S)V − V‖/‖V‖) on the same batch;
* ``"time"``: ``epoch_time_s`` (training steps only, without evaluation and diagnostics) —
  the only kind that differs between identical runs.

``epoch`` is the number of completed epochs when the row was recorded (0 = at initialisation)
and ``step`` the number of optimiser steps taken.
"""

from osa_lab.errors import TrainingDivergedError
from osa_lab.studies.training.checkpoints import CHECKPOINT_NAME, read_checkpoint
from osa_lab.studies.training.cli import add_arguments, config_from_args, run
from osa_lab.studies.training.compare import compare, format_summary, summarize_runs
from osa_lab.studies.training.config import (
    CONTROLS,
    DEFAULT_COMPARISON,
    DEFAULT_PATCH,
    DEFAULT_SEQUENCE_PATCH,
    REFERENCE_PRESET,
    TrainConfig,
    build_training_model,
    check_names,
    comparison_presets,
    config_tag,
    model_config_for,
    resolve_device,
)
from osa_lab.studies.training.group import MemberOutcome, train_group
from osa_lab.studies.training.lock import LOCK_NAME, RunLock, check_output_dir
from osa_lab.studies.training.loop import (
    TrainResult,
    alpha_values,
    check_dataset,
    evaluate,
    hidden_diagnostics,
    lr_factor,
    train,
)
from osa_lab.studies.training.statistics import paired_differences
from osa_lab.studies.training.tables import COLUMNS, final_value, load_metrics, metrics_frame
from osa_lab.studies.training.tune import TuneGrid, TuneResult, tune
from osa_lab.studies.training.verdict import MNIST1D_PUBLISHED, PAPER_MNIST, verdict

__all__ = [
    "CHECKPOINT_NAME", "COLUMNS", "CONTROLS", "DEFAULT_COMPARISON", "DEFAULT_PATCH", "DEFAULT_SEQUENCE_PATCH",
    "LOCK_NAME", "MNIST1D_PUBLISHED", "MemberOutcome", "PAPER_MNIST", "REFERENCE_PRESET", "RunLock", "TrainConfig",
    "TrainResult", "TrainingDivergedError", "TuneGrid", "TuneResult", "add_arguments", "alpha_values",
    "build_training_model", "check_dataset", "check_names", "check_output_dir", "comparison_presets", "compare",
    "config_from_args", "config_tag", "evaluate", "final_value", "format_summary", "hidden_diagnostics",
    "load_metrics", "lr_factor", "metrics_frame", "model_config_for", "paired_differences", "read_checkpoint",
    "resolve_device", "run", "summarize_runs", "train", "train_group", "tune", "verdict",
]  # fmt: skip
