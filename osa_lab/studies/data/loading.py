"""One entry point for every data set: :func:`load_data` by name (:data:`DATASETS`)."""

from __future__ import annotations

import os

from osa_lab.errors import ConfigurationError, unknown_name
from osa_lab.studies.data.dataset import ImageDataset
from osa_lab.studies.data.mnist import load_mnist
from osa_lab.studies.data.mnist1d import MNIST1D_VARIANTS, load_mnist1d
from osa_lab.studies.data.small import load_digits, load_synthetic

#: data-set names accepted by :func:`load_data`
DATASETS: tuple[str, ...] = ("digits", "mnist", "synthetic", "mnist1d", "mnist1d-large", "mnist1d-shuffle")

#: the data sets that read ``data_dir`` / ``--data-dir`` (MNIST's files, MNIST-1D's cache folder);
#: the others are built in or generated and refuse a directory rather than ignore it
DATA_DIR_DATASETS: tuple[str, ...] = ("mnist", *MNIST1D_VARIANTS)


def load_data(name: str = "digits", *, data_dir: str | os.PathLike | None = None, **kwargs) -> ImageDataset:
    """Load a data set by name (one of :data:`DATASETS`); ``kwargs`` go to its loader.

    ``data_dir`` is used by ``"mnist"`` (the folder of its files) and the MNIST-1D variants
    (the cache folder of generated arrays, default :func:`default_cache_dir`); for the other sets
    it raises :class:`~osa_lab.errors.ConfigurationError` rather than being ignored. An
    unknown name raises :class:`~osa_lab.errors.UnknownNameError` listing the valid names.
    """
    if data_dir is not None and name in DATASETS and name not in DATA_DIR_DATASETS:
        raise ConfigurationError(
            f"data_dir={str(data_dir)!r} is used only by the {', '.join(DATA_DIR_DATASETS)} data sets; "
            f"{name!r} needs no directory: drop data_dir"
        )
    if name in MNIST1D_VARIANTS:
        return load_mnist1d(name, cache_dir=data_dir, **kwargs)
    if name == "digits":
        return load_digits(**kwargs)
    if name == "mnist":
        return load_mnist(data_dir, **kwargs)
    if name == "synthetic":
        return load_synthetic(**kwargs)
    raise unknown_name("data set", name, DATASETS)
