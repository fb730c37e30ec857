"""Image-classification data for the skipless-training experiment (docs/design.md §5).

Zhang & Martens (arXiv 2602.05996) train a ViT on MNIST with softmax attention replaced by
OSA and skips/LayerNorm removed. We offer these data sets, selected by name:

* ``"digits"`` (default, offline): scikit-learn's bundled 8×8 handwritten digits
  (1,797 images, 10 classes; Alpaydin & Kaynak 1998, UCI "Optical Recognition of
  Handwritten Digits"), with a fixed stratified train/test split that does not depend on
  the training seed.
* ``"mnist"``: LeCun et al. 1998, read from local files only — the four IDX files
  (``train-images-idx3-ubyte[.gz]`` …) or a Keras-style ``mnist.npz``. Nothing is
  downloaded; a missing file raises :class:`MissingDataError` saying where to get the files
  and where to put them.
* ``"synthetic"``: class prototypes plus Gaussian noise, tiny and fast, for tests.
* ``"mnist1d"``, ``"mnist1d-large"``, ``"mnist1d-shuffle"``: Greydanus & Kobak's MNIST-1D
  (ICML 2024), 40-step 1-D sequences generated offline by the ``mnist1d`` package and cached
  (:func:`load_mnist1d`); inputs ``(n, 1, 40)``. A benchmark on which position-aware token
  mixing matters (MLP 68 %, CNN 94 % in their table).

Every loader returns an :class:`ImageDataset`: float32 images ``(n, C, H, W)`` (or sequences ``(n, C, L)``) standardised
with the *training* mean and standard deviation, int64 labels, and a description.

The package's rooms:

* :mod:`~osa_lab.studies.data.dataset`: :class:`ImageDataset`, its checks, standardisation and
  the validation split;
* :mod:`~osa_lab.studies.data.small`: the digits and synthetic sets (no files);
* :mod:`~osa_lab.studies.data.mnist`: the IDX format and MNIST from local files;
* :mod:`~osa_lab.studies.data.mnist1d`: MNIST-1D generation and its checked cache;
* :mod:`~osa_lab.studies.data.loading`: :func:`load_data` by name.
"""

from osa_lab.errors import MissingDataError
from osa_lab.studies.data.dataset import (
    SPLIT_SEED,
    ImageDataset,
    check_finite_inputs,
    check_labels,
    check_val_fraction,
    data_fingerprint,
    limit_samples,
    split_validation,
    standardise,
)
from osa_lab.studies.data.loading import DATA_DIR_DATASETS, DATASETS, load_data
from osa_lab.studies.data.mnist import (
    DATA_DIR_ENV,
    MNIST_CLASSES,
    MNIST_FILES,
    MNIST_SOURCES,
    default_data_dir,
    load_mnist,
    read_idx,
    write_idx,
)
from osa_lab.studies.data.mnist1d import (
    CACHE_DIR_ENV,
    MNIST1D_ARRAYS,
    MNIST1D_CACHE_FORMAT,
    MNIST1D_CACHE_VERSION,
    MNIST1D_VARIANTS,
    default_cache_dir,
    load_mnist1d,
    mnist1d_args,
    mnist1d_content_hash,
)
from osa_lab.studies.data.small import load_digits, load_synthetic

__all__ = [
    "CACHE_DIR_ENV", "DATASETS", "DATA_DIR_DATASETS", "DATA_DIR_ENV", "MNIST1D_ARRAYS", "MNIST1D_CACHE_FORMAT",
    "MNIST1D_CACHE_VERSION", "MNIST1D_VARIANTS", "MNIST_CLASSES", "MNIST_FILES", "MNIST_SOURCES", "SPLIT_SEED",
    "ImageDataset", "MissingDataError", "check_finite_inputs", "check_labels", "check_val_fraction",
    "data_fingerprint", "default_cache_dir", "default_data_dir", "limit_samples", "load_data", "load_digits",
    "load_mnist", "load_mnist1d", "load_synthetic", "mnist1d_args", "mnist1d_content_hash", "read_idx",
    "split_validation", "standardise", "write_idx",
]  # fmt: skip
