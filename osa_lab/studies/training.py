"""Training of (skipless) ViT presets: the experiment of Zhang & Martens (arXiv 2602.05996, docs/design.md §5).

The paper trains a ViT on MNIST with softmax attention replaced by OSA and the skip
connections and LayerNorm removed, and reports (third-party summaries) 97.2 % test accuracy
for the skip-connected ViT, 94.6 % for skipless softmax attention, and skipless OSA
comparable to the former. This module reruns that comparison on our presets:

* :func:`train` — one run: AdamW (Loshchilov & Hutter 2019) with linear warm-up and a cosine
  schedule (Loshchilov & Hutter 2017), a fixed seed and deterministic batch order, a tqdm
  progress bar, checkpoints at every epoch end (an interrupted run loses at most one epoch
  and resumes to exactly the uninterrupted result), and a tidy metrics table.
* :func:`compare` — several presets × seeds with the same budget, summarised by
  :func:`summarize_runs` (mean ± std of final test accuracy, time per epoch).
* ``osa-lab train`` — the command line (:func:`add_arguments`, :func:`run`).

The metrics table is long-format (docs/design.md §6): one row per observation with columns
``preset, data, seed, epoch, step, kind, metric, layer, head, value``. ``kind`` is

* ``"train"``: ``train_loss`` and ``train_accuracy`` (running means over the epoch's
  batches, with the weights as they were at each step) and ``lr`` (at the epoch end);
* ``"eval"``: ``test_loss`` and ``test_accuracy`` after the epoch;
* ``"alpha"``: every OSA layer's α per head (``layer`` = index of the OSA layer in block
  order, ``head``);
* ``"hidden"``: the rank-collapse and conditioning metrics of ``osa_lab.metrics.METRICS``
  (docs/design.md §4: relative residual of Dong et al. 2021, token cosine of Noci et al. 2022,
  stable rank, effective rank of Roy & Vetterli 2007, condition number of Ji et al. 2025) of
  each layer's hidden states (``layer`` 0 = the embedded input) on a fixed batch of test
  images, every ``diag_every`` steps (and at step 0 and the last step);
* ``"time"``: ``epoch_time_s`` (training steps only, without evaluation and diagnostics) —
  the only kind that differs between identical runs.

``epoch`` is the number of completed epochs when the row was recorded (0 = at initialisation)
and ``step`` the number of optimiser steps taken.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import socket
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from osa_lab.deprecation import renamed
from osa_lab.errors import (
    CausalMaskError,
    ConfigurationError,
    MethodUnavailableError,
    OSADtypeError,
    OSAInputError,
    OutputPathError,
    RunLockedError,
    TrainingDivergedError,
    UnknownNameError,
    unknown_name,
)
from osa_lab.nn.models import alpha_zeroed, mixing_table, osa_layers
from osa_lab.studies.data import (
    DATA_DIR_DATASETS,
    DATASETS,
    ImageDataset,
    MissingDataError,
    check_val_fraction,
    data_fingerprint,
    load_data,
    split_validation,
)
from osa_lab.studies.grid import (
    GridOptions,
    Task,
    add_grid_arguments,
    options_from_args,
    run_grid,
    shared_cluster,
)

#: the presets of the paper's comparison (docs/design.md §5; issue 7)
DEFAULT_COMPARISON: tuple[str, ...] = ("vit", "skipless-ssa", "skipless-osa", "ssa-cutting-skip")

#: columns of the tidy metrics table, in order
COLUMNS: tuple[str, ...] = (
    "preset",
    "data",
    "seed",
    "epoch",
    "step",
    "kind",
    "metric",
    "layer",
    "head",
    "value",
)

#: patch size per image size when none is given: 8×8 digits → 2 (16 tokens), 28×28 MNIST → 4 (49 tokens)
DEFAULT_PATCH = {8: 2, 28: 4}

#: samples per token for 1-D sequences when none is given: MNIST-1D's 40 steps → 2 (20 tokens).
#: Its digits are 12-point templates padded, sheared and resampled to 40 steps, so a stroke
#: feature spans a few steps; 2 steps per token keeps that resolution in the token order (what
#: position-aware mixing must exploit), gives N = 20 (inside the N = 20–49 range of the MNIST
#: comparison) and N ≤ 4r at the default 4 heads of width 16. One step per token would embed a
#: scalar per token (rank-1 token matrix); 4 steps leave 10 tokens with most local shape
#: already inside a token.
DEFAULT_SEQUENCE_PATCH = {40: 2}

#: controls and baselines added to every ``--compare`` (issue 13): mixing switched off in the
#: same networks, and the MLP row of the MNIST-1D table; ``cnn1d`` joins on 1-D data
CONTROLS: tuple[str, ...] = ("skipless-osa-alpha0", "vit-no-attn", "mlp")

#: the preset the paired differences of :func:`tune` are taken against
REFERENCE_PRESET = "skipless-osa"

#: model overrides that only make sense for transformer presets (not applied to ``mlp``/``cnn1d``)
_TRANSFORMER_ONLY = ("depth", "dim", "heads", "head_dim", "mlp_ratio", "osa_method", "alpha_init",
                     "learn_alpha", "attention", "norm", "skip", "init")  # fmt: skip

CHECKPOINT_NAME = "checkpoint.pt"
#: 2: checkpoints record the data source and a content fingerprint (resuming on other data is refused)
_CHECKPOINT_FORMAT = 2
#: the lock file that makes a run folder owned by one process (JSON: pid, host, started, command)
LOCK_NAME = "run.lock"


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a training run (and nothing that does not, such as the device).

    Attributes:
        preset: model preset name (``osa_lab.presets.preset_names()``).
        data: data-set name (:data:`osa_lab.data.DATASETS`).
        epochs: number of passes over the training set.
        batch_size: images per step.
        lr: peak learning rate of AdamW.
        weight_decay: AdamW's decoupled weight decay (not applied to α, biases and norms).
        warmup_fraction: fraction of all steps with a linear warm-up before the cosine decay.
        grad_clip: global gradient-norm clip (``None``: off).
        seed: seeds the model initialisation and the batch order.
        diag_every: hidden-state diagnostics every this many steps (0: only at start and end).
        diag_samples: number of test images in the fixed diagnostic batch.
        patch_size: ViT patch size (``None``: :data:`DEFAULT_PATCH` for the image size).
        model: overrides of the preset's ``ModelConfig`` fields (depth, dim, heads …).
        data_options: keyword arguments of the data loader (e.g. ``train_limit`` for MNIST).
        alpha_lr_mult: OSA's α parameters form their own AdamW group (no weight decay) whose
            learning rate is ``lr · alpha_lr_mult``.
        val_fraction: fraction of the training data held out as a fixed stratified validation
            split (0: none). Validation loss/accuracy are then logged every epoch; the test
            split is never used for choices (see :func:`tune`).
    """

    preset: str = "skipless-osa"
    data: str = "digits"
    epochs: int = 30
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_fraction: float = 0.05
    grad_clip: float | None = 1.0
    seed: int = 0
    diag_every: int = 100
    diag_samples: int = 64
    patch_size: int | None = None
    model: dict[str, Any] = field(default_factory=dict)
    data_options: dict[str, Any] = field(default_factory=dict)
    alpha_lr_mult: float = 1.0
    val_fraction: float = 0.0

    def __post_init__(self) -> None:
        def is_int(val: object) -> bool:
            return isinstance(val, int) and not isinstance(val, bool)

        def is_num(val: object) -> bool:
            return isinstance(val, (int, float)) and not isinstance(val, bool) and math.isfinite(val)

        for name in ("epochs", "batch_size", "diag_samples"):
            val = getattr(self, name)
            if not is_int(val) or val < 1:
                raise ConfigurationError(f"`{name}` must be a positive int, got {val!r}")
        if not is_int(self.diag_every) or self.diag_every < 0:
            raise ConfigurationError(f"`diag_every` must be an int ≥ 0 (0: only at start and end), got {self.diag_every!r}")
        if not (is_num(self.lr) and self.lr > 0):
            raise ConfigurationError(f"`lr` must be a positive finite number, got {self.lr!r}")
        if not (is_num(self.warmup_fraction) and 0.0 <= self.warmup_fraction < 1.0):
            raise ConfigurationError(f"`warmup_fraction` must lie in [0, 1), got {self.warmup_fraction!r}")
        if not (is_num(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigurationError(
                f"`weight_decay` must be a finite number ≥ 0 (0: off), got {self.weight_decay!r}; a negative "
                "decay would grow the weights every step"
            )
        if self.grad_clip is not None and not (is_num(self.grad_clip) and self.grad_clip > 0):
            raise ConfigurationError(
                f"`grad_clip` must be a positive finite norm, or None / 0 on the command line to turn clipping "
                f"off; got {self.grad_clip!r} (a negative clip flips the gradient into gradient ascent)"
            )
        if not is_int(self.seed) or self.seed < 0:
            raise ConfigurationError(f"`seed` must be an int ≥ 0, got {self.seed!r}")
        if self.patch_size is not None and (not is_int(self.patch_size) or self.patch_size < 1):
            raise ConfigurationError(f"`patch_size` must be a positive int or None (default), got {self.patch_size!r}")
        if not (is_num(self.alpha_lr_mult) and self.alpha_lr_mult > 0):
            raise ConfigurationError(f"`alpha_lr_mult` must be a positive finite number, got {self.alpha_lr_mult!r}")
        if not (is_num(self.val_fraction) and 0.0 <= self.val_fraction < 1.0):
            raise ConfigurationError(
                f"`val_fraction` must lie in [0, 1) (0: no validation split), got {self.val_fraction!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class TrainResult:
    """What :func:`train` returns: the tidy metrics, the trained model and where things were written."""

    config: TrainConfig
    model_config: Any
    model: nn.Module
    metrics: pd.DataFrame
    run_dir: Path | None
    checkpoint: Path | None
    resumed_from_epoch: int = 0

    def final(self, metric: str = "test_accuracy") -> float:
        """Value of ``metric`` at the last epoch."""
        return final_value(self.metrics, metric)


# --------------------------------------------------------------------------- helpers


def final_value(metrics: pd.DataFrame, metric: str = "test_accuracy") -> float:
    """Value of ``metric`` at the last recorded epoch of one run's metrics."""
    sel = metrics[metrics["metric"] == metric]
    if sel.empty:
        raise KeyError(f"metric {metric!r} not in the table; it has {sorted(metrics['metric'].unique())}")
    return float(sel.sort_values(["epoch", "step"])["value"].iloc[-1])


def _presets():
    from osa_lab.nn import presets

    return presets


def check_names(presets: Sequence[str], data: str) -> None:
    """Raise :class:`UnknownNameError` (listing the valid names) before any work starts."""
    valid = list(_presets().preset_names(training=True))
    for name in presets:
        if name not in valid:
            raise unknown_name("preset", name, valid)
    if data not in DATASETS:
        raise unknown_name("data set", data, DATASETS)


def comparison_presets(data: str) -> list[str]:
    """The presets of ``--compare``: the paper's four, the mixing controls, and ``cnn1d`` on 1-D data."""
    from osa_lab.studies.data import MNIST1D_VARIANTS

    extra = ["cnn1d"] if data in MNIST1D_VARIANTS else []
    return [*DEFAULT_COMPARISON, *CONTROLS, *extra]


def model_config_for(config: TrainConfig, data: ImageDataset):
    """The preset's ``ModelConfig`` adapted to the data: patch input, image size, channels, classes.

    Images become ``(size/patch)²`` patch tokens, 1-D sequences ``length/patch`` tokens
    (:data:`DEFAULT_PATCH`, :data:`DEFAULT_SEQUENCE_PATCH`). ``config.model`` overrides apply
    to transformer presets; the ``mlp``/``cnn1d`` baselines keep their published sizes.
    """
    size = data.image_size
    seq = data.sequence
    default = (DEFAULT_SEQUENCE_PATCH if seq else DEFAULT_PATCH).get(size)
    patch = config.patch_size or default or next(p for p in (4, 2, 1) if size % p == 0)
    if size % patch:
        raise ConfigurationError(
            f"patch_size={patch} does not divide the {'sequence length' if seq else 'image size'} {size}; choose "
            f"--patch-size from {[p for p in range(1, size + 1) if size % p == 0]}"
        )
    overrides = {
        "input": "sequence" if seq else "patches",
        "image_size": size,
        "patch_size": patch,
        "channels": data.channels,
        "num_classes": data.num_classes,
        "tokens": size // patch if seq else (size // patch) ** 2,
        "seed": config.seed,
    }
    presets = _presets()
    model = dict(config.model)
    if presets.get_preset(config.preset).backbone != "transformer":
        model = {k: v for k, v in model.items() if k not in _TRANSFORMER_ONLY}
    overrides.update(model)
    return presets.get_preset(config.preset, **overrides)


def build_training_model(model_config) -> nn.Module:
    """``osa_lab.models.build_classifier`` (indirected so tests can substitute a model)."""
    from osa_lab.nn.models import build_classifier

    return build_classifier(model_config)


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 0 at ``total`` (Loshchilov & Hutter 2017)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def _param_groups(
    model: nn.Module, weight_decay: float, lr: float | None = None, alpha_lr_mult: float = 1.0
) -> list[dict]:
    """AdamW groups: decay on matrices; none on biases, norm gains and other vectors; OSA's α alone.

    α (every parameter named ``…alpha``) gets its own group without weight decay and with the
    learning rate ``lr · alpha_lr_mult`` (issue 13: α's step size decides how much the skipless
    OSA network learns to mix tokens). Groups are named (``"decay"``, ``"no_decay"``, ``"alpha"``);
    empty groups are left out.
    """
    decay, no_decay, alpha = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name.endswith("alpha"):
            alpha.append(p)
        elif p.ndim < 2:
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]
    if alpha:
        group = {"params": alpha, "weight_decay": 0.0, "name": "alpha"}
        if lr is not None:
            group["lr"] = lr * alpha_lr_mult
        groups.append(group)
    return [g for g in groups if g["params"]]


def alpha_values(model: nn.Module) -> list[tuple[int, int, float]]:
    """``(osa_layer_index, head, α)`` for every OSA layer of ``model``, in module order."""
    from osa_lab.nn.attention import OrthogonalSelfAttention

    out = []
    layers = [m for m in model.modules() if isinstance(m, OrthogonalSelfAttention)]
    for i, m in enumerate(layers):
        for h, a in enumerate(m.alpha.detach().flatten().tolist()):
            out.append((i, h, float(a)))
    return out


def hidden_diagnostics(model: nn.Module, x: torch.Tensor) -> list[tuple[int, str, float]]:
    """``(layer, metric, value)`` for each hidden state of ``model`` on ``x`` and each metric of ``METRICS``.

    The metrics (docs/design.md §4, :mod:`osa_lab.metrics`) are computed per image in float64 and
    summarised by the **median** over the batch (a single rank-deficient image would make the
    mean condition number infinite). Non-finite hidden states raise the encoder's
    ``NonFiniteHiddenStateError`` naming the first bad layer.
    """
    from osa_lab.studies.metrics import all_metrics

    was_training = model.training
    model.eval()
    with torch.no_grad():
        _, hidden = model(x, return_hidden=True)
    model.train(was_training)
    rows = []
    for layer, h in enumerate(hidden.blocks):
        for name, val in all_metrics(h.detach().cpu()).items():
            rows.append((layer, name, float(val.median())))
    return rows


def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` on ``(x, y)`` in eval mode."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(y), batch_size):
            xb, yb = x[i : i + batch_size].to(device), y[i : i + batch_size].to(device)
            logits = model(xb)
            loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(-1) == yb).sum())
    model.train(was_training)
    return loss_sum / len(y), correct / len(y)


def _batch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The permutation of epoch ``epoch``: a function of (seed, epoch) only, so resuming replays it."""
    g = torch.Generator().manual_seed(1_000_003 * int(seed) + int(epoch))
    return torch.randperm(n, generator=g)


_NON_FINITE = re.compile(r"\d+ NaN and \d+ Inf entries|non-finite values|contains NaN or Inf")


def _is_non_finite(err: Exception) -> bool:
    """True for the typed errors osa_lab raises on NaN/Inf activations (not for other bad input).

    The encoder raises ``NonFiniteHiddenStateError`` (a ``FloatingPointError``); the layers
    raise :class:`OSAInputError` whose message counts the NaN and Inf entries, or says OSA
    produced non-finite values. Any other ``OSAInputError`` (e.g. a method refusing its input)
    is a user error and is passed on unchanged.
    """
    return isinstance(err, FloatingPointError) or bool(_NON_FINITE.search(str(err)))


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device`` after checking this machine has it (:class:`ConfigurationError` if not)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as err:
        raise ConfigurationError(
            f"unknown device {str(device)!r}; use 'cpu', 'cuda', 'cuda:<index>' or 'mps'"
        ) from err
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigurationError(
                f"device {str(device)!r} requested but PyTorch sees no CUDA GPU on this machine; use --device cpu"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigurationError(
                f"device {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                f"use an index below {torch.cuda.device_count()}"
            )
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigurationError(f"device {str(device)!r} requested but MPS is not available; use --device cpu")
    elif dev.type != "cpu":
        raise ConfigurationError(f"device {str(device)!r} is not supported for training; use 'cpu', 'cuda' or 'mps'")
    return dev


def check_output_dir(path: str | os.PathLike) -> Path:
    """``path`` as a ``Path`` after checking a run folder can be made there, before any work starts.

    Raises :class:`~osa_lab.errors.OutputPathError` when ``path`` is a file, when an existing
    parent is a file, or when no file can be created in the nearest existing parent. Uses the
    CLI's real write probe (:func:`osa_lab.arguments.check_output_dir`): ``os.access`` is wrong for
    root, read-only or special file systems (``/proc``) and ACLs. Creates nothing.
    """
    from osa_lab.arguments import check_output_dir as _check_dir

    return _check_dir(path, "--output")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


class RunLock:
    """Exclusive ownership of a run folder through ``folder/run.lock`` (a context manager).

    The lock file is created atomically (``O_CREAT | O_EXCL``) and names the owner (PID, host,
    start time, command). A second writer gets :class:`~osa_lab.errors.RunLockedError` naming
    the owner. A lock left by a dead process on this host is stale: it is taken over with a
    ``RuntimeWarning``. A lock from another host cannot be checked and is never taken over.
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": " ".join(sys.argv),
        }
        self.held = False

    def _read(self) -> dict | None:
        try:
            info = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) else None

    def acquire(self) -> RunLock:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputPathError(
                f"cannot create output folder {self.folder} ({exc.strerror or exc}); choose another --output"
            ) from None
        for _ in range(50):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                info = self._read()
                if info is None:  # being written right now, or garbage: look again shortly
                    time.sleep(0.05)
                    info = self._read()
                    if info is None:
                        info = {"pid": None, "host": self.owner["host"]}
                pid, host = info.get("pid"), info.get("host")
                same_host = host == self.owner["host"]
                if same_host and (not isinstance(pid, int) or not _pid_alive(pid)):
                    warnings.warn(
                        f"taking over the stale lock {self.path} of process {pid} on {host} (no longer running)",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                    with contextlib.suppress(FileNotFoundError):
                        self.path.unlink()
                    continue
                raise RunLockedError(
                    f"output folder {self.folder} is in use by process {pid} on host {host} "
                    f"(started {info.get('started', '?')}: {info.get('command', '?')}); wait for it to finish "
                    f"or choose another --output" + ("" if same_host else f" (if that process is gone, delete {self.path})")
                ) from None
            except OSError as exc:  # read-only or special file system: a user error, not a crash
                raise OutputPathError(
                    f"cannot create {self.path} ({exc.strerror or exc}); choose a writable --output"
                ) from None
            with os.fdopen(fd, "w") as fh:
                json.dump(self.owner, fh)
            self.held = True
            return self
        raise RunLockedError(f"could not take the lock {self.path}; another process keeps replacing it")

    def release(self) -> None:
        if self.held:
            info = self._read()
            if info is not None and info.get("pid") == self.owner["pid"] and info.get("host") == self.owner["host"]:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
            self.held = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def check_dataset(data: ImageDataset) -> None:
    """Refuse data that would train wrongly: NaN/Inf inputs, non-integer labels or labels outside the classes."""
    splits = [("train", data.x_train, data.y_train), ("test", data.x_test, data.y_test)]
    if data.x_val is not None:
        splits.append(("validation", data.x_val, data.y_val))
    for split, x, y in splits:
        if not bool(torch.isfinite(x).all()):
            n_bad = int((~torch.isfinite(x)).sum())
            raise OSAInputError(
                f"data set {data.name!r} ({data.info.get('source', '?')}): {n_bad} NaN/Inf input value(s) in the "
                f"{split} split; the data are corrupt — fix or replace them (this is not a training divergence)"
            )
        if y is None or y.dtype != torch.int64:
            raise OSAInputError(
                f"data set {data.name!r}: {split} labels must be an int64 tensor, got "
                f"{None if y is None else y.dtype}"
            )
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= data.num_classes):
            raise OSAInputError(
                f"data set {data.name!r} ({data.info.get('source', '?')}): {split} labels span "
                f"{int(y.min())}–{int(y.max())} but the data set has {data.num_classes} classes "
                f"(0–{data.num_classes - 1}); the labels are corrupt"
            )


def _atomic_save(obj: dict, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _comparable(d: dict) -> str:
    return json.dumps(d, sort_keys=True, default=str)


# --------------------------------------------------------------------------- one run


def train(
    config: TrainConfig,
    run_dir: str | os.PathLike | None = None,
    *,
    data: ImageDataset | None = None,
    resume: bool = True,
    device: str | torch.device = "cpu",
    progress: bool = True,
    data_dir: str | os.PathLike | None = None,
    on_epoch_end: Callable[[int, pd.DataFrame], None] | None = None,
) -> TrainResult:
    """Train one preset on one data set with one seed.

    Args:
        config: the run (:class:`TrainConfig`).
        run_dir: where ``metrics.csv``, ``config.json`` and ``checkpoint.pt`` go; ``None``
            keeps everything in memory (no checkpoints).
        data: a loaded data set (default: ``load_data(config.data, **config.data_options)``).
        resume: continue from ``run_dir/checkpoint.pt`` when it exists (a finished run is
            returned without training). The checkpoint must come from the same config.
        device: torch device for the model and batches.
        progress: show a tqdm bar over steps.
        data_dir: directory of the MNIST files (see :func:`osa_lab.data.load_mnist`).
        on_epoch_end: called as ``on_epoch_end(epoch, metrics_so_far)`` after the epoch's
            checkpoint is written (tests use it to simulate an interruption).

    Determinism: the model is initialised under ``torch.manual_seed(seed)`` and the batch
    order of epoch ``e`` depends on ``(seed, e)`` only, so two runs of the same config on the
    same machine and thread count give identical metrics, and a resumed run gives the same
    result as an uninterrupted one.

    Raises:
        TrainingDivergedError: the loss, the weights or a hidden state became NaN/Inf; the
            message names the step, the preset and the last good checkpoint.
        RunLockedError: another live process owns ``run_dir`` (its ``run.lock``).
        ConfigurationError: the checkpoint comes from another config or other data, or is
            unreadable (the message suggests ``--no-resume``); the device is not available.
        OSAInputError: the data contain NaN/Inf inputs or labels outside the classes.
    """
    check_names([config.preset], config.data)
    device = resolve_device(device)
    if data is None:
        data = load_data(config.data, data_dir=data_dir, **config.data_options)
    if config.val_fraction > 0 and data.x_val is None:
        data = split_validation(data, config.val_fraction)
    check_dataset(data)
    if run_dir is None:
        return _train(config, None, data, resume, device, progress, on_epoch_end)
    run_path = check_output_dir(run_dir)
    with RunLock(run_path):
        return _train(config, run_path, data, resume, device, progress, on_epoch_end)


def _read_checkpoint(path: Path, device: torch.device) -> dict:
    """The checkpoint dict, or a :class:`ConfigurationError` that suggests ``--no-resume``."""
    try:
        state = torch.load(path, map_location=device, weights_only=False)
    except Exception as err:  # noqa: BLE001 — torch.load raises many types on a damaged file
        raise ConfigurationError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {err}); it is truncated or corrupt. "
            "Pass --no-resume (resume=False) to start this run over, or delete the file"
        ) from err
    needed = {"format", "train_config", "epoch", "step", "model", "optimizer", "scheduler", "rng", "rows"}
    if not isinstance(state, dict) or not needed <= set(state):
        raise ConfigurationError(
            f"checkpoint {path} is not an osa_lab training checkpoint (missing fields); pass --no-resume "
            "(resume=False) to start over, or choose another output folder"
        )
    return state


class _TrainingRun:
    """One run of :func:`train` in progress: the model, its optimiser and learning-rate schedule,
    the metric rows so far and the last good checkpoint. Each step of a run is one method."""

    def __init__(self, config: TrainConfig, run_path: Path | None, data: ImageDataset, device: torch.device) -> None:
        self.config, self.run_path, self.data, self.device = config, run_path, data, device
        self.model_config = model_config_for(config, data)
        self.fingerprint = data_fingerprint(data)
        self.data_source = {"name": data.name, "source": str(data.info.get("source", "")), "fingerprint": self.fingerprint}
        torch.manual_seed(config.seed)
        self.model = build_training_model(self.model_config).to(device)
        self.optimizer = torch.optim.AdamW(
            _param_groups(self.model, config.weight_decay, config.lr, config.alpha_lr_mult), lr=config.lr
        )
        self.n_train = len(data.y_train)
        self.steps_per_epoch = math.ceil(self.n_train / config.batch_size)
        self.total_steps = self.steps_per_epoch * config.epochs
        warmup = int(round(config.warmup_fraction * self.total_steps))
        total = self.total_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, total, warmup))
        # held-out inputs for the diagnostics: the validation split when there is one, else test
        self.heldout = "val" if data.x_val is not None else "test"
        self.heldout_x = data.x_val if data.x_val is not None else data.x_test
        self.heldout_y = data.y_val if data.y_val is not None else data.y_test
        self.diag_x = self.heldout_x[: config.diag_samples].to(device)
        self.keys = {"preset": config.preset, "data": config.data, "seed": config.seed}
        self.rows: list[dict] = []
        self.start_epoch, self.step = 0, 0
        self.ckpt_path = run_path / CHECKPOINT_NAME if run_path is not None else None
        self.last_good: Path | None = None
        self.good_epoch = 0

    # ------------------------------------------------------------------ run folder

    def open_run_folder(self, resume: bool) -> None:
        """Create the run folder, resume from its checkpoint if asked, record the configuration."""
        assert self.run_path is not None and self.ckpt_path is not None
        self.run_path.mkdir(parents=True, exist_ok=True)
        if resume and self.ckpt_path.exists():
            self.resume(_read_checkpoint(self.ckpt_path, self.device))
        self.good_epoch = self.start_epoch
        (self.run_path / "config.json").write_text(
            json.dumps(
                {"train": self.config.to_dict(), "model": dataclasses.asdict(self.model_config),
                 "data": self.data.info, "data_fingerprint": self.fingerprint},  # fmt: skip
                indent=2,
                default=str,
            )
        )

    def resume(self, state: dict) -> None:
        """Continue from a checkpoint of the same configuration and data (else a ConfigurationError)."""
        config, ckpt_path, fingerprint = self.config, self.ckpt_path, self.fingerprint
        if state.get("format") != _CHECKPOINT_FORMAT or _comparable(state["train_config"]) != _comparable(
            config.to_dict()
        ):
            raise ConfigurationError(
                f"checkpoint {ckpt_path} was written by a different run configuration or checkpoint format "
                f"({state.get('train_config')}); resuming it with {config.to_dict()} would not "
                "reproduce either run. Use another output directory, or pass resume=False "
                "(`--no-resume`) to start over and overwrite it."
            )
        old = state.get("data") or {}
        if old.get("fingerprint") != fingerprint:
            raise ConfigurationError(
                f"checkpoint {ckpt_path} was trained on other data ({old.get('name')!r} from "
                f"{old.get('source')!r}, fingerprint {old.get('fingerprint')}) than this run loads "
                f"({self.data.name!r} from {self.data_source['source']!r}, fingerprint {fingerprint}); resuming "
                "would train the remaining epochs on other data. Pass the original --data-dir, choose another "
                "--output, or --no-resume to start over"
            )
        if old.get("source") != self.data_source["source"]:
            warnings.warn(
                f"resuming {ckpt_path}: the data now come from {self.data_source['source']!r} instead of "
                f"{old.get('source')!r}, with identical contents (fingerprint {fingerprint})",
                RuntimeWarning,
                stacklevel=5,
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        self.rows = list(state["rows"])
        self.start_epoch, self.step = int(state["epoch"]), int(state["step"])
        self.last_good = ckpt_path

    def save_checkpoint(self, epoch: int) -> None:
        """Write the checkpoint after ``epoch`` (atomically) and ``metrics.csv``."""
        assert self.run_path is not None and self.ckpt_path is not None
        _atomic_save(
            {
                "format": _CHECKPOINT_FORMAT,
                "train_config": self.config.to_dict(),
                "model_config": dataclasses.asdict(self.model_config),
                "epoch": epoch,
                "step": self.step,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "rng": torch.get_rng_state(),
                "rows": self.rows,
                "data": self.data_source,
            },
            self.ckpt_path,
        )
        self.last_good, self.good_epoch = self.ckpt_path, epoch
        metrics_frame(self.rows).to_csv(self.run_path / "metrics.csv", index=False)

    # ------------------------------------------------------------------ metrics

    def add(self, epoch: int, kind: str, metric: str, value: float, layer=None, head=None) -> None:
        """Append one row of the tidy metrics table."""
        self.rows.append({**self.keys, "epoch": epoch, "step": self.step, "kind": kind, "metric": metric,
                          "layer": layer, "head": head, "value": float(value)})  # fmt: skip

    def diverged(self, what: str, epoch: int) -> TrainingDivergedError:
        """The error for a divergence at the current step, naming the last good checkpoint."""
        config = self.config
        where = (
            f"the last good checkpoint is {self.last_good} (epoch {self.good_epoch}); resume from it "
            "with a lower --lr or a --grad-clip"
            if self.last_good is not None
            else "there is no good checkpoint (none was written yet"
            + (")" if self.run_path else "; no run_dir given)")
        )
        return TrainingDivergedError(
            f"training of preset {config.preset!r} (seed {config.seed}, data {config.data!r}) diverged "
            f"at step {self.step} (epoch {epoch + 1} of {config.epochs}): {what}. {where}. "
            f"Peak lr was {config.lr:g}; a lower learning rate usually avoids this.",
            step=self.step,
            epoch=epoch + 1,
            preset=config.preset,
            checkpoint=self.last_good,
        )

    def diagnostics(self, epoch: int) -> float:
        """Record the hidden-state metrics; returns the seconds spent (left out of epoch times)."""
        t = time.perf_counter()
        try:
            for layer, metric, value in hidden_diagnostics(self.model, self.diag_x):
                self.add(epoch, "hidden", metric, value, layer=layer)
            for layer, head, metric, value in mixing_table(self.model, self.diag_x):
                self.add(epoch, "mixing", metric, value, layer=layer, head=head)
        except (OSAInputError, FloatingPointError) as err:
            if not _is_non_finite(err):
                raise
            raise self.diverged(f"non-finite hidden states ({err})", epoch) from err
        return time.perf_counter() - t

    def record_initial_state(self) -> None:
        """Epoch 0: the diagnostics and α of the freshly initialised model."""
        self.diagnostics(0)
        for layer, head, a in alpha_values(self.model):
            self.add(0, "alpha", "alpha", a, layer=layer, head=head)

    # ------------------------------------------------------------------ training

    def train_step(self, idx: torch.Tensor, epoch: int) -> tuple[float, int]:
        """One optimiser step on the batch ``idx``; returns (loss · batch size, correct predictions)."""
        config = self.config
        xb, yb = self.data.x_train[idx].to(self.device), self.data.y_train[idx].to(self.device)
        try:
            logits = self.model(xb)
            loss = F.cross_entropy(logits, yb)
        except (OSAInputError, FloatingPointError) as err:
            if not _is_non_finite(err):
                raise
            raise self.diverged(f"non-finite activations ({err})", epoch) from err
        if not torch.isfinite(loss):
            raise self.diverged(f"the loss is {float(loss.detach())}", epoch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), config.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return float(loss.detach()) * len(idx), int((logits.detach().argmax(-1) == yb).sum())

    def run_epoch(self, epoch: int, bar) -> None:
        """Train one epoch, then evaluate, record the epoch's rows and write the checkpoint."""
        config = self.config
        t0 = time.perf_counter()
        order = _batch_order(self.n_train, config.seed, epoch)
        loss_sum, correct, diag_seconds = 0.0, 0, 0.0
        for i in range(self.steps_per_epoch):
            idx = order[i * config.batch_size : (i + 1) * config.batch_size]
            batch_loss, batch_correct = self.train_step(idx, epoch)
            loss_sum += batch_loss
            correct += batch_correct
            bar.update(1)
            if config.diag_every and self.step % config.diag_every == 0 and self.step != self.total_steps:
                diag_seconds += self.diagnostics(epoch)
        epoch_time = time.perf_counter() - t0 - diag_seconds
        if not all(torch.isfinite(p).all() for p in self.model.parameters()):
            raise self.diverged("the weights contain NaN/Inf after the epoch's last update", epoch)
        test_acc = self.record_epoch(epoch + 1, loss_sum, correct)
        self.add(epoch + 1, "time", "epoch_time_s", epoch_time)
        bar.set_postfix(loss=f"{loss_sum / self.n_train:.3f}", test_acc=f"{test_acc:.3f}")
        if self.ckpt_path is not None:
            self.save_checkpoint(epoch + 1)

    def record_epoch(self, e: int, loss_sum: float, correct: int) -> float:
        """The rows of epoch ``e``: training and held-out metrics, α, and after the last step the
        diagnostics and the α := 0 ablation. Returns the test accuracy."""
        model, data = self.model, self.data
        test_loss, test_acc = evaluate(model, data.x_test, data.y_test)
        self.add(e, "train", "train_loss", loss_sum / self.n_train)
        self.add(e, "train", "train_accuracy", correct / self.n_train)
        self.add(e, "train", "lr", self.scheduler.get_last_lr()[0])
        self.add(e, "eval", "test_loss", test_loss)
        self.add(e, "eval", "test_accuracy", test_acc)
        if data.x_val is not None:
            val_loss, val_acc = evaluate(model, data.x_val, data.y_val)
            self.add(e, "eval", "val_loss", val_loss)
            self.add(e, "eval", "val_accuracy", val_acc)
        for layer, head, a in alpha_values(model):
            self.add(e, "alpha", "alpha", a, layer=layer, head=head)
        if self.step == self.total_steps:
            self.diagnostics(e)
            if osa_layers(model):
                _, acc_full = evaluate(model, self.heldout_x, self.heldout_y)
                with alpha_zeroed(model):
                    _, acc_zero = evaluate(model, self.heldout_x, self.heldout_y)
                self.add(e, "mixing", f"{self.heldout}_accuracy_alpha0", acc_zero)
                self.add(e, "mixing", f"{self.heldout}_accuracy_alpha0_drop", acc_full - acc_zero)
        return test_acc

    def result(self) -> TrainResult:
        """The finished run."""
        return TrainResult(
            self.config, self.model_config, self.model, metrics_frame(self.rows), self.run_path, self.ckpt_path,
            self.start_epoch,
        )  # fmt: skip


def _train(
    config: TrainConfig,
    run_path: Path | None,
    data: ImageDataset,
    resume: bool,
    device: torch.device,
    progress: bool,
    on_epoch_end: Callable[[int, pd.DataFrame], None] | None,
) -> TrainResult:
    """The body of :func:`train` (with the run folder, if any, locked by the caller)."""
    from tqdm.auto import tqdm

    run = _TrainingRun(config, run_path, data, device)
    if run_path is not None:
        run.open_run_folder(resume)
    if run.start_epoch == 0 and run.step == 0:
        run.record_initial_state()
    bar = tqdm(total=run.total_steps, initial=run.step, desc=f"{config.preset} s{config.seed}",
               disable=not progress, leave=False, dynamic_ncols=True)  # fmt: skip
    run.model.train()
    try:
        for epoch in range(run.start_epoch, config.epochs):
            run.run_epoch(epoch, bar)
            if on_epoch_end is not None:
                on_epoch_end(epoch + 1, metrics_frame(run.rows))
    finally:
        bar.close()
    return run.result()


def config_tag(config: TrainConfig) -> str:
    """A short directory name for a budget: data, epochs, batch, lr and a hash of everything else.

    Preset and seed are left out (:func:`compare` puts them below), so runs of one budget share
    a folder and a changed budget never meets a checkpoint of another one.
    """
    import hashlib

    d = config.to_dict()
    d.pop("preset"), d.pop("seed")
    digest = hashlib.sha1(_comparable(d).encode()).hexdigest()[:8]
    return f"{config.data}-e{config.epochs}-b{config.batch_size}-lr{config.lr:g}-{digest}"


def metrics_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows → the tidy table with :data:`COLUMNS` (``layer``/``head`` nullable integers)."""
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    for col in ("layer", "head"):
        df[col] = df[col].astype("Int64")
    for col in ("seed", "epoch", "step"):
        df[col] = df[col].astype("int64")
    df["value"] = df["value"].astype("float64")
    return df


def load_metrics(path: str | os.PathLike) -> pd.DataFrame:
    """Read a ``metrics.csv`` written by :func:`train` or :func:`compare` back with its dtypes."""
    df = pd.read_csv(path)
    for col in ("layer", "head"):
        df[col] = df[col].astype("Int64")
    return df


# --------------------------------------------------------------------------- several runs

#: data sets loaded in this process, by (name, data_dir, options): one entry, reused by the runs of a grid
_DATA_CACHE: dict[tuple, ImageDataset] = {}


def _data_key(name: str, data_dir: str | os.PathLike | None, options: dict) -> tuple:
    return name, None if data_dir is None else str(data_dir), _comparable(options)


def _compare_task(
    config: TrainConfig,
    run_dir: str | None,
    resume: bool,
    device: str,
    data_dir: str | None,
    progress: bool = False,
) -> dict[str, Any]:
    """One run of :func:`compare` as a grid task (in-process or on a Dask worker).

    Returns ``{"status": "ok" | "diverged", "metrics", "params", "error"}``; a divergence is a
    result (with the metrics recorded up to it), any other exception fails the task.
    """
    key = _data_key(config.data, data_dir, config.data_options)
    data = _DATA_CACHE.get(key)
    if data is None:
        data = load_data(config.data, data_dir=data_dir, **config.data_options)
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = data
    try:
        result = train(config, run_dir, data=data, resume=resume, device=device, progress=progress)
    except TrainingDivergedError as err:
        partial = Path(run_dir) / "metrics.csv" if run_dir else None
        frame = load_metrics(partial) if partial is not None and partial.exists() else None
        return {"status": "diverged", "metrics": frame, "params": None, "error": str(err)}
    except USER_ERRORS as err:
        # bad input or environment (a refused method, a busy folder, a damaged checkpoint …): not a
        # result of the comparison; compare() raises it again as the same typed error
        return {"status": "user_error", "metrics": None, "params": None, "error": str(err),
                "error_type": type(err).__name__}  # fmt: skip
    n_params = sum(p.numel() for p in result.model.parameters())
    return {"status": "ok", "metrics": result.metrics, "params": n_params, "error": ""}


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
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train every preset × seed with the same budget (``base`` with ``preset``/``seed`` replaced).

    Runs go to ``output_dir/<preset>/seed<k>/``; the combined ``metrics.csv`` and
    ``summary.csv`` to ``output_dir``. A run that diverges is recorded (``diverged`` column
    of the summary, the error in ``runs.csv``) and the others continue: a diverging skipless
    network is a result, not a crash. A run that fails otherwise (an exception, a lost
    worker) is recorded the same way with status ``failed`` (``failed`` column). Returns
    ``(metrics, summary)``.

    Every run is one task of an :mod:`osa_lab.grid` grid: ``grid_options`` runs them on a
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
        for preset in presets:
            for seed in seeds:
                cfg = dataclasses.replace(base, preset=preset, seed=int(seed))
                run_dir = out / preset / f"seed{seed}" if out is not None else None
                kwargs = {"config": cfg, "run_dir": None if run_dir is None else str(run_dir), "resume": resume,
                          "device": str(device), "data_dir": None if data_dir is None else str(data_dir),
                          "progress": False}  # fmt: skip
                tasks.append(Task(_compare_task, kwargs, {"preset": preset, "seed": int(seed)},
                                  progress_kwarg="progress"))  # fmt: skip
        options = grid_options or GridOptions.in_process(threads=None, progress=progress)
        for preset in presets:  # impossible model settings fail here, before any run starts
            model_config_for(dataclasses.replace(base, preset=preset), data)
        done = run_grid(tasks, options, desc="runs")
        for o in done.outcomes:
            if o.ok and o.value["status"] == "user_error":
                raise _user_error(o.value["error_type"], o.value["error"])
        for o in done.outcomes:
            preset, seed = o.task.settings["preset"], o.task.settings["seed"]
            if o.ok:
                status, message, n_params, frame = o.value["status"], o.value["error"], o.value["params"], o.value["metrics"]  # fmt: skip
            else:
                status, message, n_params = "failed", f"{o.error_type}: {o.error}", None
                run_dir = o.task.kwargs["run_dir"]
                partial = Path(run_dir) / "metrics.csv" if run_dir else None
                frame = load_metrics(partial) if partial is not None and partial.exists() else None
            if frame is not None:
                frames.append(frame)
            runs.append(
                {"preset": preset, "seed": int(seed), "status": status, "params": n_params, "error": message}
            )
        metrics = pd.concat(frames, ignore_index=True) if frames else metrics_frame([])
        summary = summarize_runs(metrics, pd.DataFrame(runs), order=list(presets))
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            metrics.to_csv(out / "metrics.csv", index=False)
            summary.to_csv(out / "summary.csv", index=False)
            pd.DataFrame(runs).to_csv(out / "runs.csv", index=False)
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


# --------------------------------------------------------------------------- fair tuning (issue 13)

#: the paper's MNIST figures as reported by third-party summaries (docs/design.md §5;
#: Zhang & Martens 2026 do not give their architecture or budget), quoted by :func:`verdict`
PAPER_MNIST = {"vit": 0.972, "skipless-ssa": 0.946}

#: published MNIST-1D accuracies on the standard 4,000 / 1,000 split (Greydanus & Kobak 2024, their table)
MNIST1D_PUBLISHED = {"logistic regression": 0.32, "mlp": 0.68, "cnn1d": 0.94, "gru": 0.91, "human": 0.96}


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


def _learns_alpha(preset: str) -> bool:
    cfg = _presets().get_preset(preset)
    return cfg.attention == "osa" and cfg.learn_alpha


def _final_metric(metrics: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per preset × seed: ``metric`` at the last epoch (columns preset, seed, value)."""
    sel = metrics[metrics["metric"] == metric].sort_values(["epoch", "step"])
    return sel.groupby(["preset", "seed"], as_index=False).last()[["preset", "seed", "value"]]


def paired_differences(
    metrics: pd.DataFrame, reference: str = REFERENCE_PRESET, metric: str = "test_accuracy", level: float = 0.95
) -> pd.DataFrame:
    """Per preset: mean paired difference ``reference − preset`` of the final ``metric`` over common seeds.

    Runs of the same seed share the batch order and data split, so the per-seed difference
    removes that part of the noise. Columns: ``preset, n, diff_mean, diff_std, ci_low, ci_high,
    per_seed`` (Student-t interval at ``level``; NaN with fewer than 2 seeds). Positive values
    mean the reference (skipless OSA) is better.
    """
    from scipy import stats

    final = _final_metric(metrics, metric).pivot(index="seed", columns="preset", values="value")
    rows = []
    if reference not in final:
        return pd.DataFrame(columns=["preset", "n", "diff_mean", "diff_std", "ci_low", "ci_high", "per_seed"])
    for preset in final.columns:
        if preset == reference:
            continue
        d = (final[reference] - final[preset]).dropna()
        n = len(d)
        mean = float(d.mean()) if n else math.nan
        std = float(d.std(ddof=1)) if n > 1 else math.nan
        half = float(stats.t.ppf(0.5 + level / 2, n - 1) * std / math.sqrt(n)) if n > 1 else math.nan
        rows.append({"preset": preset, "n": n, "diff_mean": mean, "diff_std": std, "ci_low": mean - half,
                     "ci_high": mean + half,
                     "per_seed": " ".join(f"{int(s)}:{v * 100:+.1f}" for s, v in d.items())})  # fmt: skip
    return pd.DataFrame(rows)


def _judge(row: pd.Series | None, margin: float = 0.0) -> str:
    """Classify a paired difference (reference − other) against ±margin using its confidence interval."""
    if row is None:
        return "not measured (preset not in this comparison)"
    if math.isnan(row["ci_low"]):
        return f"inconclusive ({int(row['n'])} seed: no interval; ≥ 5 seeds are needed)"
    lo, hi = row["ci_low"] * 100, row["ci_high"] * 100
    ci = f"{row['diff_mean'] * 100:+.1f} points, 95 % CI [{lo:+.1f}, {hi:+.1f}], {int(row['n'])} seeds"
    if margin > 0:
        if -margin * 100 <= lo and hi <= margin * 100:
            return f"shown: within ±{margin * 100:.0f} point(s) ({ci})"
        if hi < -margin * 100:
            return f"refuted here: the reference is more than {margin * 100:.0f} point(s) worse ({ci})"
        if lo > margin * 100:
            return f"the reference is more than {margin * 100:.0f} point(s) better ({ci})"
        return f"inconclusive ({ci})"
    if lo > 0:
        return f"shown: the reference is better ({ci})"
    if hi < 0:
        return f"refuted here: the reference is worse ({ci})"
    return f"inconclusive: the interval contains 0 ({ci})"


def verdict(
    summary: pd.DataFrame, paired: pd.DataFrame, data: str, budget: str, margin: float = 0.01
) -> str:
    """A short Markdown verdict on the paper's claim from the measured numbers only.

    The claim (Zhang & Martens 2026, third-party summaries): on MNIST the skip-connected ViT
    reaches 97.2 %, skipless softmax attention 94.6 %, and skipless OSA is "comparable" to the
    former. "Comparable" is operationalised as: the 95 % interval of the paired difference lies
    within ±``margin`` (default 1 point). The text says what this run did and did not show; it
    never adjusts anything toward the paper's numbers.
    """
    from osa_lab.studies.data import MNIST1D_VARIANTS

    by = paired.set_index("preset") if len(paired) else pd.DataFrame()

    def get(p: str) -> pd.Series | None:
        return by.loc[p] if p in by.index else None

    acc = summary.set_index("preset")
    lines = [f"## Verdict ({data}, {budget})", ""]
    lines.append("Test accuracy of the setting chosen on validation data (mean ± std over seeds):")
    lines.append("")
    for p, r in acc.iterrows():
        std = "" if math.isnan(r["test_accuracy_std"]) else f" ± {r['test_accuracy_std'] * 100:.1f}"
        lines.append(f"* `{p}`: {r['test_accuracy_mean'] * 100:.1f}{std} % ({int(r['seeds'])} seeds, "
                     f"lr {r.get('lr', float('nan')):g}, α-lr ×{r.get('alpha_lr_mult', 1.0):g})")  # fmt: skip
    lines += ["", "Against the claim (paired per-seed differences, skipless OSA minus the other preset):", ""]
    lines.append(f"* skipless OSA comparable to the skip-connected ViT (±{margin * 100:.0f} point): "
                 + _judge(get("vit"), margin))  # fmt: skip
    lines.append("* skipless OSA better than skipless softmax attention: " + _judge(get("skipless-ssa")))
    lines.append("* skipless OSA better than Cutting-the-Skip SSA: " + _judge(get("ssa-cutting-skip")))
    lines.append("* learned token mixing helps skipless OSA (vs the same network with α ≡ 0): "
                 + _judge(get("skipless-osa-alpha0")))  # fmt: skip
    if "vit" in acc.index and "vit-no-attn" in acc.index:
        d = (acc.loc["vit", "test_accuracy_mean"] - acc.loc["vit-no-attn", "test_accuracy_mean"]) * 100
        lines.append(f"* attention helps the ViT: vit − vit-no-attn = {d:+.1f} points (means, not paired)")
    lines += ["", "Not shown by this run:", ""]
    lines.append(
        f"* the paper's absolute numbers (ViT {PAPER_MNIST['vit'] * 100:.1f} %, skipless SSA "
        f"{PAPER_MNIST['skipless-ssa'] * 100:.1f} % on 2-D MNIST, architecture and budget unknown to us): "
        + ("this run is on MNIST-1D, a different task, so absolute accuracies are not comparable"
           if data in MNIST1D_VARIANTS else "our architecture and budget differ, so compare rankings, not values")
    )  # fmt: skip
    n_min = int(acc["seeds"].min()) if len(acc) else 0
    if n_min < 5:
        lines.append(f"* a final answer: only {n_min} seed(s) per preset here; the final comparison needs ≥ 5")
    if data in MNIST1D_VARIANTS:
        pub = ", ".join(f"{k} {v * 100:.0f} %" for k, v in MNIST1D_PUBLISHED.items())
        lines.append(f"* published MNIST-1D scale for reference (standard split): {pub}")
    lines.append("* anything about settings outside the searched grid, depths, widths or budgets")
    return "\n".join(lines) + "\n"


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
    (resumable like :func:`compare`); ``tuning.csv``, ``chosen.csv``, ``metrics.csv``,
    ``summary.csv``, ``paired.csv``, ``verdict.md`` and ``summary.png`` go to ``output_dir``.
    """
    grid = grid or TuneGrid()
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
            group = [p for p in presets if i == 0 or _learns_alpha(p)]
            if not group:
                continue
            cfg = dataclasses.replace(base, lr=lr, alpha_lr_mult=mult)
            metrics, summary = compare(group, grid.seeds, cfg, folder("tune", lr, mult), resume=resume,
                                       device=device, progress=progress, data_dir=data_dir,
                                       grid_options=grid_options)  # fmt: skip
            val_acc = _final_metric(metrics, "val_accuracy").groupby("preset")["value"].mean()
            val_loss = _final_metric(metrics, "val_loss").groupby("preset")["value"].mean()
            for p in group:
                row = summary.set_index("preset").loc[p]
                eff_mult = mult if _learns_alpha(p) else 1.0
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
        frames, run_tables = [], []
        for (lr, mult), sel in chosen.groupby(["lr", "alpha_lr_mult"], sort=False):
            group = sel["preset"].tolist()
            cfg = dataclasses.replace(base, lr=float(lr), alpha_lr_mult=float(mult))
            where = folder("final", float(lr), float(mult))
            metrics, _ = compare(group, seeds, cfg, where, resume=resume, device=device, progress=progress,
                                 data_dir=data_dir, grid_options=grid_options)  # fmt: skip
            frames.append(metrics)
            if where is not None and (where / "runs.csv").exists():
                run_tables.append(pd.read_csv(where / "runs.csv"))
        metrics = pd.concat(frames, ignore_index=True)
        runs = pd.concat(run_tables, ignore_index=True) if run_tables else None
        summary = summarize_runs(metrics, runs, order=list(presets)).merge(
            chosen[["preset", "lr", "alpha_lr_mult"]], on="preset", how="left"
        )
        paired = paired_differences(metrics)
        budget = (f"{base.epochs} epochs, batch {base.batch_size}, {len(list(seeds))} final seed(s), "
                  f"lr grid {list(grid.lrs)}, α-lr grid {list(grid.alpha_lr_mults)}, "
                  f"validation {base.val_fraction:g} of the training data")  # fmt: skip
        text = verdict(summary, paired, base.data, budget)
        wall = time.perf_counter() - t0
        if out is not None:
            tuning.to_csv(out / "tuning.csv", index=False)
            chosen.to_csv(out / "chosen.csv", index=False)
            metrics.to_csv(out / "metrics.csv", index=False)
            summary.to_csv(out / "summary.csv", index=False)
            paired.to_csv(out / "paired.csv", index=False)
            if runs is not None:
                runs.to_csv(out / "runs.csv", index=False)
            (out / "verdict.md").write_text(text + f"\nWall time of this command: {wall:.0f} s.\n")
            _write_summary_figure(summary, paired, out / "summary.png")
    return TuneResult(tuning, chosen, metrics, summary, paired, text, wall)


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


# --------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``osa-lab train``."""
    d = TrainConfig()
    parser.add_argument(
        "--preset",
        nargs="+",
        default=[d.preset],
        metavar="NAME",
        help=f"model preset(s) (default {d.preset}); several presets are compared",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help=f"compare the presets {', '.join(DEFAULT_COMPARISON)} and the controls {', '.join(CONTROLS)} "
        "(+ cnn1d on MNIST-1D) (overrides --preset)",
    )
    parser.add_argument(
        "--tune",
        action="store_true",
        help="choose each preset's lr (and OSA's α-lr multiplier) on validation accuracy from the grids "
        "below, then train --seeds with the chosen setting and report test accuracy, paired differences "
        "against skipless-osa and a verdict (osa_lab.train.tune)",
    )
    g = TuneGrid()
    parser.add_argument("--lr-grid", type=float, nargs="+", default=list(g.lrs), metavar="LR",
                        help=f"--tune: learning rates tried for every preset (default {list(g.lrs)})")  # fmt: skip
    parser.add_argument("--alpha-lr-mult-grid", type=float, nargs="+", default=list(g.alpha_lr_mults), metavar="M",
                        help=f"--tune: α-lr multipliers for learned-α OSA presets (default {list(g.alpha_lr_mults)})")  # fmt: skip
    parser.add_argument("--tune-seeds", type=int, nargs="+", default=list(g.seeds), metavar="SEED",
                        help=f"--tune: seeds of the tuning runs (default {list(g.seeds)}, disjoint from --seeds)")  # fmt: skip
    parser.add_argument("--data", default=d.data, help=f"data set: {', '.join(DATASETS)} (default {d.data})")
    parser.add_argument("--data-dir", default=None,
                        help="--data mnist: directory with the MNIST IDX files or mnist.npz; MNIST-1D: its cache folder")  # fmt: skip
    parser.add_argument("--train-limit", type=int, default=None, help="MNIST: use a fixed stratified subset")
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--lr", type=float, default=d.lr, help="peak AdamW learning rate")
    parser.add_argument("--weight-decay", type=float, default=d.weight_decay)
    parser.add_argument("--warmup-fraction", type=float, default=d.warmup_fraction)
    parser.add_argument("--grad-clip", type=float, default=d.grad_clip, help="global norm clip (0: off)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds (default 0)")
    parser.add_argument(
        "--diag-every", type=int, default=d.diag_every, help="hidden-state diagnostics every K steps"
    )
    parser.add_argument("--diag-samples", type=int, default=d.diag_samples)
    parser.add_argument("--patch-size", type=int, default=None, help="default: 2 for 8×8, 4 for 28×28")
    for name in ("depth", "dim", "heads"):
        parser.add_argument(f"--{name}", type=int, default=None, help=f"override the preset's {name}")
    parser.add_argument(
        "--osa-method",
        default=None,
        help="OSA computation method of the model (osa_lab.ops.functional.OSA_METHODS; default: the preset's 'auto')",
    )
    parser.add_argument("--output", default="runs/train", help="output directory (default runs/train)")
    parser.add_argument("--no-resume", action="store_true", help="start over even if checkpoints exist")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")  # fmt: skip
    parser.add_argument(
        "--alpha-lr-mult",
        type=float,
        default=d.alpha_lr_mult,
        help="learning-rate multiplier of OSA's α (its own AdamW group, no weight decay; default 1)",
    )
    parser.add_argument(
        "--val-fraction",
        type=float,
        default=d.val_fraction,
        help="hold out this fraction of the training data as a validation split (default 0: none)",
    )
    add_grid_arguments(parser)  # runs of --compare/--tune/several presets go to a Dask grid


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The :class:`TrainConfig` (preset and seed filled in later) that the CLI arguments describe."""
    model = {k: getattr(args, k) for k in ("depth", "dim", "heads") if getattr(args, k) is not None}
    if args.osa_method:
        from osa_lab.ops.functional import OSA_METHODS

        if args.osa_method not in (*OSA_METHODS, "auto"):
            raise unknown_name("OSA method", args.osa_method, [*OSA_METHODS, "auto"])
        model["osa_method"] = args.osa_method
    data_options = {}
    if args.data_dir is not None and args.data not in DATA_DIR_DATASETS:
        raise ConfigurationError(
            f"--data-dir is used only by --data {', '.join(DATA_DIR_DATASETS)}; --data {args.data} needs no "
            "directory: drop --data-dir"
        )
    if args.train_limit is not None:
        if args.data != "mnist":
            raise ConfigurationError(f"--train-limit applies to --data mnist only, not {args.data!r}")
        if args.train_limit < 1:
            raise ConfigurationError(f"--train-limit must be a positive number of images, got {args.train_limit}")
        data_options["train_limit"] = args.train_limit
    if args.grad_clip is not None and args.grad_clip < 0:
        raise ConfigurationError(
            f"--grad-clip must be ≥ 0 (0: off), got {args.grad_clip:g}; a negative clip flips the gradient "
            "into gradient ascent"
        )
    if args.diag_samples is not None and args.diag_samples < 1:
        raise ConfigurationError(f"--diag-samples must be a positive number of images, got {args.diag_samples}")
    bad_seeds = [s for s in args.seeds if s < 0]
    if bad_seeds:
        raise ConfigurationError(f"--seeds must be ints ≥ 0, got {bad_seeds}")
    if len(set(args.seeds)) != len(args.seeds):
        raise ConfigurationError(f"--seeds has repeated values {args.seeds}; give each seed once")
    for name in ("depth", "dim", "heads"):
        val = getattr(args, name)
        if val is not None and val < 1:
            raise ConfigurationError(f"--{name} must be a positive int, got {val}")
    return TrainConfig(
        data=args.data,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        weight_decay=args.weight_decay,
        warmup_fraction=args.warmup_fraction,
        grad_clip=args.grad_clip or None,
        alpha_lr_mult=args.alpha_lr_mult,
        val_fraction=args.val_fraction,
        diag_every=args.diag_every,
        diag_samples=args.diag_samples,
        patch_size=args.patch_size,
        model=model,
        data_options=data_options,
    )


#: errors that mean "bad input or environment": one line on stderr and exit 2, never a traceback
USER_ERRORS: tuple[type[BaseException], ...] = (
    UnknownNameError,
    MissingDataError,
    ConfigurationError,
    OSAInputError,
    OSADtypeError,
    MethodUnavailableError,
    CausalMaskError,
)


def _user_error(name: str, message: str) -> Exception:
    """The typed osa_lab error called ``name`` with ``message`` (a grid task returns names, not objects)."""
    import osa_lab.errors as errors_module

    cls = getattr(errors_module, name, None) or {"MissingDataError": MissingDataError}.get(name)
    if isinstance(cls, type) and issubclass(cls, USER_ERRORS):
        return cls(message)
    return ConfigurationError(message)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def run(args: argparse.Namespace) -> int:
    """``osa-lab train``: train presets × seeds, write CSVs to ``--output``, print the summary.

    A user error (bad argument, missing or corrupt data, unusable device or output folder, a
    folder owned by another run) prints one line naming the problem and the fix and returns 2;
    an output folder this call created is removed again so no partial output is left.
    """
    presets = comparison_presets(args.data) if args.compare else list(args.preset)
    out = Path(args.output)
    existed = out.exists()
    try:
        if args.threads is not None:
            if args.threads < 1:
                raise ConfigurationError(f"--threads must be a positive int, got {args.threads}")
            torch.set_num_threads(args.threads)
        resolve_device(args.device)
        base = config_from_args(args)
        check_output_dir(out)
        grid_options = options_from_args(args, progress=not args.quiet)
        if args.threads is not None:  # --threads: torch threads of each run (also on grid workers)
            grid_options = dataclasses.replace(grid_options, threads_per_worker=args.threads)
        if args.tune:
            grid = TuneGrid(tuple(args.lr_grid), tuple(args.alpha_lr_mult_grid), tuple(args.tune_seeds))
            with shared_cluster(grid_options) as shared:  # one cluster start for all of tune's grids
                result = tune(presets, args.seeds, base, args.output, grid=grid, resume=not args.no_resume,
                              device=args.device, progress=not args.quiet, data_dir=args.data_dir,
                              grid_options=shared)  # fmt: skip
            with pd.option_context("display.width", 200, "display.max_columns", 20):
                print(result.chosen.to_string(index=False))
                print(format_summary(result.summary).to_string(index=False))
            print(result.verdict)
            print(f"wrote tuning.csv, chosen.csv, metrics.csv, summary.csv, paired.csv, verdict.md, summary.png "
                  f"under {out}/ in {result.wall_time_s:.0f} s")  # fmt: skip
            return 0
        metrics, summary = compare(
            presets,
            args.seeds,
            base,
            args.output,
            resume=not args.no_resume,
            device=args.device,
            progress=not args.quiet,
            data_dir=args.data_dir,
            grid_options=grid_options,
        )
    except USER_ERRORS as err:
        if not existed and out.is_dir() and not isinstance(err, RunLockedError):
            shutil.rmtree(out, ignore_errors=True)
        print(f"osa-lab train: error: {_one_line(err)}", file=sys.stderr)
        return 2
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(format_summary(summary).to_string(index=False))
    out = Path(args.output)
    print(f"wrote {out / 'metrics.csv'}, {out / 'summary.csv'} and per-run checkpoints under {out}/")
    runs = pd.read_csv(out / "runs.csv")
    failed = runs[runs["status"] != "ok"]
    for _, r in failed.iterrows():
        print(f"osa-lab train: {r['preset']} seed {r['seed']} {r['status']}: {r['error']}", file=sys.stderr)
    return 1 if len(failed) else 0


#: renamed public names, kept for one release (osa_lab.deprecation)
__getattr__ = renamed(__name__, {"summarise": "summarize_runs", "build_model": "build_training_model"})
