"""The configuration of a training run: :class:`TrainConfig`, the presets of a comparison and the model a
configuration builds for a data set."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from osa_lab.errors import (
    ConfigurationError,
    unknown_name,
)
from osa_lab.studies.data import (
    DATASETS,
    ImageDataset,
)

#: the presets of the paper's comparison (docs/design.md §5)
DEFAULT_COMPARISON: tuple[str, ...] = ("vit", "skipless-ssa", "skipless-osa", "ssa-cutting-skip")


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


#: controls and baselines added to every ``--compare``: mixing switched off in the
#: same networks, and the MLP row of the MNIST-1D table; ``cnn1d`` joins on 1-D data
CONTROLS: tuple[str, ...] = ("skipless-osa-alpha0", "vit-no-attn", "mlp")


#: the preset the paired differences of :func:`tune` are taken against
REFERENCE_PRESET = "skipless-osa"


#: model overrides that only make sense for transformer presets (not applied to ``mlp``/``cnn1d``)
_TRANSFORMER_ONLY = ("depth", "dim", "heads", "head_dim", "mlp_ratio", "osa_method", "alpha_init",
                     "learn_alpha", "attention", "norm", "skip", "init")  # fmt: skip


#: the warm-up fraction of a run that does not set one (a study's file names leave it out)
DEFAULT_WARMUP_FRACTION = 0.05


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a training run (and nothing that does not, such as the device).

    Attributes:
        preset: model preset name (``osa_lab.nn.presets.preset_names()``).
        data: data-set name (:data:`osa_lab.studies.data.DATASETS`).
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
    warmup_fraction: float = DEFAULT_WARMUP_FRACTION
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


def presets_module():
    from osa_lab.nn import presets

    return presets


def check_names(presets: Sequence[str], data: str) -> None:
    """Raise :class:`UnknownNameError` (listing the valid names) before any work starts."""
    valid = list(presets_module().preset_names(training=True))
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
    presets = presets_module()
    model = dict(config.model)
    if presets.get_preset(config.preset).backbone != "transformer":
        model = {k: v for k, v in model.items() if k not in _TRANSFORMER_ONLY}
    overrides.update(model)
    return presets.get_preset(config.preset, **overrides)


def build_training_model(model_config) -> nn.Module:
    """``osa_lab.nn.models.build_classifier`` (indirected so tests can substitute a model)."""
    from osa_lab.nn.models import build_classifier

    return build_classifier(model_config)


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


def comparable_json(d: dict) -> str:
    return json.dumps(d, sort_keys=True, default=str)


def config_tag(config: TrainConfig) -> str:
    """A short directory name for a budget: data, epochs, batch, lr and a hash of everything else.

    Preset and seed are left out (:func:`compare` puts them below), so runs of one budget share
    a folder and a changed budget never meets a checkpoint of another one.
    """
    import hashlib

    d = config.to_dict()
    d.pop("preset"), d.pop("seed")
    digest = hashlib.sha1(comparable_json(d).encode()).hexdigest()[:8]
    return f"{config.data}-e{config.epochs}-b{config.batch_size}-lr{config.lr:g}-{digest}"


def learns_alpha(preset: str) -> bool:
    """True for presets whose OSA α is learned (their tuning also searches the α-lr multiplier)."""
    cfg = presets_module().get_preset(preset)
    return cfg.attention == "osa" and cfg.learn_alpha
