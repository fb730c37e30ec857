"""The data sets that need no files: scikit-learn's bundled 8×8 digits and synthetic class prototypes.

``"digits"`` (Alpaydin & Kaynak 1998, UCI "Optical Recognition of Handwritten Digits"; 1,797
images, 10 classes) with a fixed stratified train/test split that does not depend on the
training seed; ``"synthetic"``: class prototypes plus Gaussian noise, tiny and fast, for tests.
"""

from __future__ import annotations

import numpy as np

from osa_lab.errors import OSAInputError
from osa_lab.studies.data.dataset import SPLIT_SEED, ImageDataset


def load_digits(test_fraction: float = 0.2, split_seed: int = SPLIT_SEED) -> ImageDataset:
    """scikit-learn's bundled 8×8 digits with a fixed stratified train/test split.

    With the defaults: 1,437 training and 360 test images, every class in the same
    proportion in both. Pixel values 0–16 are standardised with the training mean/std.
    """
    if not 0.0 < test_fraction < 1.0:
        raise OSAInputError(f"`test_fraction` must lie in (0, 1), got {test_fraction!r}")
    from sklearn.datasets import load_digits as _sk_load_digits
    from sklearn.model_selection import train_test_split

    bunch = _sk_load_digits()
    images = bunch.images.astype(np.float32)[:, None]  # (1797, 1, 8, 8)
    labels = bunch.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        images, labels, test_size=test_fraction, random_state=split_seed, stratify=labels
    )
    return ImageDataset.standardised(
        "digits",
        x_tr,
        y_tr,
        x_te,
        y_te,
        10,
        {"source": "sklearn.datasets.load_digits", "test_fraction": test_fraction, "split_seed": split_seed},
    )


def load_synthetic(
    n_train: int = 256,
    n_test: int = 128,
    num_classes: int = 4,
    image_size: int = 8,
    channels: int = 1,
    noise: float = 1.0,
    seed: int = SPLIT_SEED,
) -> ImageDataset:
    """Prototype task for fast tests: image = class prototype + ``noise`` · N(0, 1).

    Prototypes are fixed N(0, 1) images drawn from ``seed``; with ``noise = 1`` the task is
    learnable in a few epochs but not trivially at initialisation.
    """
    rng = np.random.default_rng(seed)
    protos = rng.standard_normal((num_classes, channels, image_size, image_size))

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.arange(n) % num_classes
        rng.shuffle(y)
        x = protos[y] + noise * rng.standard_normal((n, channels, image_size, image_size))
        return x, y.astype(np.int64)

    x_tr, y_tr = draw(n_train)
    x_te, y_te = draw(n_test)
    return ImageDataset.standardised(
        "synthetic",
        x_tr,
        y_tr,
        x_te,
        y_te,
        num_classes,
        {"source": "synthetic prototypes", "noise": noise, "seed": seed},
    )
