"""The data-set type every loader returns (:class:`ImageDataset`), its checks and its splits.

:func:`check_labels` and :func:`check_finite_inputs` refuse corrupt labels and non-finite inputs
before any training; :func:`standardise` scales by the training set's mean and std;
:func:`limit_samples` takes a fixed stratified subset; :func:`split_validation` holds out a
validation split of the training data (:func:`check_val_fraction`); :func:`data_fingerprint`
identifies the contents.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

import numpy as np
import torch

from osa_lab.errors import ConfigurationError, OSAInputError

#: the fixed seed of the digits train/test split (independent of the training seed)
SPLIT_SEED = 0


@dataclass(frozen=True)
class ImageDataset:
    """Train and test tensors of an image-classification task.

    Attributes:
        name: data-set name (one of :data:`DATASETS`).
        x_train, x_test: float32 images ``(n, channels, size, size)``, standardised with the
            training mean and standard deviation.
        y_train, y_test: int64 labels in ``[0, num_classes)``.
        num_classes: number of classes.
        info: where the data came from and how it was split (recorded in run configs).
        x_val, y_val: a validation split held out from the training data (``None`` when there
            is none; :func:`split_validation` makes one). Never overlaps the test split.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    info: dict = field(default_factory=dict)
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None

    @classmethod
    def standardised(
        cls, name: str, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
        num_classes: int, info: dict,
    ) -> ImageDataset:
        """The data set of these arrays: images scaled by the training set's mean and std
        (:func:`standardise`), labels as int64 tensors."""  # fmt: skip
        x_tr, x_te = standardise(x_train, x_test)
        return cls(name, x_tr, torch.from_numpy(y_train), x_te, torch.from_numpy(y_test), num_classes, info)

    @property
    def channels(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.x_train.shape[-1])

    @property
    def sequence(self) -> bool:
        """True for 1-D inputs ``(n, channels, length)`` (MNIST-1D), False for images."""
        return self.x_train.dim() == 3

    def __repr__(self) -> str:
        val = f", val={tuple(self.x_val.shape)}" if self.x_val is not None else ""
        return (
            f"ImageDataset({self.name!r}, train={tuple(self.x_train.shape)}{val}, "
            f"test={tuple(self.x_test.shape)}, classes={self.num_classes})"
        )


def data_fingerprint(data: ImageDataset) -> str:
    """SHA-256 (first 16 hex digits) of every array of ``data``: equal iff the contents are equal.

    Cached in ``data.info["fingerprint"]``. Training records it in its checkpoints so that a
    resumed run refuses to continue on other data (another ``--data-dir``, changed files).
    """
    cached = data.info.get("fingerprint")
    if isinstance(cached, str):
        return cached
    h = hashlib.sha256()
    for t in (data.x_train, data.y_train, data.x_val, data.y_val, data.x_test, data.y_test):
        if t is None:
            h.update(b"none")
            continue
        arr = t.detach().cpu().contiguous().numpy()
        h.update(f"{arr.dtype}{arr.shape}".encode())
        h.update(arr.tobytes())
    digest = h.hexdigest()[:16]
    data.info["fingerprint"] = digest
    return digest


def check_labels(y: np.ndarray, num_classes: int, where: str) -> np.ndarray:
    """``y`` as int64 after checking it is integer-typed with every value in ``[0, num_classes)``.

    Raises :class:`OSAInputError` naming ``where`` (the file or split), the bad values and
    how many there are: a corrupt label byte would otherwise build a model with too many
    classes, and float labels would be silently truncated.
    """
    y = np.asarray(y)
    if not np.issubdtype(y.dtype, np.integer):
        raise OSAInputError(
            f"{where}: labels have dtype {y.dtype}; class labels must be integers 0–{num_classes - 1}. "
            "The file is corrupt or not a label file — download it again."
        )
    bad = (y < 0) | (y >= num_classes)
    if bad.any():
        values = sorted({int(v) for v in y[bad][:1000]})[:5]
        raise OSAInputError(
            f"{where}: {int(bad.sum())} label(s) outside 0–{num_classes - 1} (e.g. {values}); "
            "the file is corrupt — download it again."
        )
    return y.astype(np.int64)


def check_finite_inputs(x: np.ndarray, where: str) -> None:
    """Raise :class:`OSAInputError` when float inputs hold NaN/Inf (reported before any training)."""
    x = np.asarray(x)
    if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
        n_bad = int((~np.isfinite(x)).sum())
        raise OSAInputError(
            f"{where}: {n_bad} NaN/Inf pixel value(s); the data are corrupt — replace the file "
            "(this is a data error, not a training divergence)."
        )


def standardise(x_train: np.ndarray, x_test: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale by the training set's global mean and std (one scalar each), as float32 tensors."""
    x_train = x_train.astype(np.float64)
    x_test = x_test.astype(np.float64)
    mean, std = float(x_train.mean()), float(x_train.std())
    std = std if std > 0 else 1.0
    to = lambda a: torch.from_numpy(((a - mean) / std).astype(np.float32))  # noqa: E731
    return to(x_train), to(x_test)


def limit_samples(
    x: np.ndarray, y: np.ndarray, limit: int | None, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """A fixed, stratified subset of ``limit`` samples (all of them when ``limit`` is None)."""
    if limit is None or limit >= len(y):
        return x, y
    if limit < 1:
        raise OSAInputError(f"sample limit must be a positive int or None, got {limit!r}")
    from sklearn.model_selection import train_test_split

    n_classes = len(np.unique(y))
    stratify = y if limit >= n_classes else None
    idx, _ = train_test_split(np.arange(len(y)), train_size=limit, random_state=seed, stratify=stratify)
    idx = np.sort(idx)
    return x[idx], y[idx]


def check_val_fraction(n_train: int, num_classes: int, fraction: float) -> int:
    """The number of validation samples ``fraction`` of ``n_train`` training samples gives.

    Refuses (:class:`~osa_lab.errors.ConfigurationError`) a ``fraction`` outside [0, 1) and one
    that leaves the training or the validation part with fewer than ``num_classes`` samples
    (a stratified split needs one sample of each class on both sides). 0 means no validation
    split and returns 0. Called before any run starts, so nothing is written for a bad fraction.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction < 1.0:
        raise ConfigurationError(
            f"`val_fraction` must lie in [0, 1) (0: no validation split), got {fraction!r}"
        )
    if fraction == 0:
        return 0
    n_val = int(round(fraction * n_train))
    if min(n_val, n_train - n_val) < num_classes:
        lo = num_classes / n_train
        hint = (
            f"choose a value in [{lo:.3g}, {1 - lo:.3g}]"
            if 2 * num_classes <= n_train
            else "use more training data or --val-fraction 0"
        )
        raise ConfigurationError(
            f"`val_fraction` {fraction:g} of {n_train} training samples leaves {n_train - n_val} for training and "
            f"{n_val} for validation; each needs at least {num_classes} (one per class): {hint}"
        )
    return n_val


def split_validation(data: ImageDataset, fraction: float = 0.1, seed: int = SPLIT_SEED) -> ImageDataset:
    """Hold out a fixed stratified ``fraction`` of the *training* data as a validation split.

    The test split is untouched, so validation and test never overlap; validation and the
    remaining training data partition the original training data. The split depends on
    ``seed`` (default :data:`SPLIT_SEED`), not on the training seed, so every preset and seed
    of a comparison sees the same split. Inputs keep the standardisation of the full training
    set (one scalar mean and std). A fraction that leaves either part with fewer samples than
    classes is refused (:func:`check_val_fraction`).
    """
    if not isinstance(fraction, (int, float)) or not 0.0 < fraction < 1.0:
        raise OSAInputError(f"validation `fraction` must lie in (0, 1), got {fraction!r}")
    from sklearn.model_selection import train_test_split

    y = data.y_train.numpy()
    n = len(y)
    n_val = check_val_fraction(n, data.num_classes, fraction)
    counts = np.bincount(y, minlength=data.num_classes)
    stratify = y if counts[counts > 0].min() >= 2 and n_val >= (counts > 0).sum() else None
    tr, va = train_test_split(np.arange(n), test_size=n_val, random_state=seed, stratify=stratify)
    tr, va = torch.from_numpy(np.sort(tr)), torch.from_numpy(np.sort(va))
    info = {k: v for k, v in data.info.items() if k != "fingerprint"}
    info.update({"val_fraction": fraction, "val_split_seed": seed, "n_val": n_val})
    return dataclasses.replace(
        data,
        x_train=data.x_train[tr],
        y_train=data.y_train[tr],
        x_val=data.x_train[va],
        y_val=data.y_train[va],
        info=info,
    )
