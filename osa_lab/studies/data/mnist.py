"""MNIST (LeCun et al. 1998) from local files only: the IDX format and the loader.

:func:`read_idx` / :func:`write_idx` read and write IDX files (raw or gzip-compressed);
:func:`load_mnist` reads the four IDX files or a Keras-style ``mnist.npz`` from a folder
(:func:`default_data_dir`, ``$OSA_LAB_DATA_DIR``). Nothing is downloaded: a missing file raises
:class:`~osa_lab.errors.MissingDataError` saying where to get the files and where to put them.
"""

from __future__ import annotations

import gzip
import os
import pickle
import zipfile
import zlib
from pathlib import Path

import numpy as np

from osa_lab.errors import MissingDataError, OSAInputError
from osa_lab.studies.data.dataset import (
    SPLIT_SEED,
    ImageDataset,
    check_finite_inputs,
    check_labels,
    limit_samples,
)

#: number of MNIST classes: every label must lie in 0–9
MNIST_CLASSES = 10

#: environment variable that names the directory holding the MNIST files
DATA_DIR_ENV = "OSA_LAB_DATA_DIR"

#: (images, labels) file stems of the MNIST IDX files
MNIST_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

MNIST_SOURCES = (
    "https://storage.googleapis.com/cvdf-datasets/mnist/ (the four *-ubyte.gz IDX files), "
    "https://ossci-datasets.s3.amazonaws.com/mnist/ (same files), or "
    "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz (one .npz file)"
)

# IDX type codes (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT"); multi-byte
# values are big-endian.
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (raw or gzip-compressed) into a NumPy array.

    Format (LeCun et al., the MNIST page): two zero bytes, a type code (0x08 ubyte, 0x09
    byte, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64), the number of dimensions,
    then each dimension as a big-endian uint32, then the data in C order, big-endian.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise OSAInputError(
            f"{path} is truncated or not a valid gzip file ({type(err).__name__}: {err}); download it again"
        ) from err
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise OSAInputError(
            f"{path} is not an IDX file: it must start with two zero bytes, a type code and a "
            f"dimension count (got {raw[:4]!r}). Is it an HTML error page from a failed download?"
        )
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise OSAInputError(f"{path}: unknown IDX type code 0x{code:02X}; valid: {sorted(_IDX_DTYPES)}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise OSAInputError(f"{path}: truncated IDX header ({len(raw)} bytes for {ndim} dimensions)")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise OSAInputError(
            f"{path}: IDX header says shape {shape} of {dtype} ({expected} bytes) but the file holds "
            f"{len(raw) - header} data bytes; the file is truncated or corrupt — download it again."
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="), copy=True)


def write_idx(path: str | os.PathLike, array: np.ndarray) -> Path:
    """Write ``array`` as an IDX file (gzip-compressed when ``path`` ends in ``.gz``); the inverse of :func:`read_idx`."""
    path = Path(path)
    array = np.asarray(array)
    codes = {np.dtype(v).newbyteorder("="): k for k, v in _IDX_DTYPES.items()}
    native = array.dtype.newbyteorder("=")
    if native not in codes:
        raise OSAInputError(f"IDX cannot store dtype {array.dtype}; use one of {sorted(map(str, codes))}")
    code = codes[native]
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    body = array.astype(_IDX_DTYPES[code], copy=False).tobytes(order="C")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as fh:
        fh.write(header + body)
    return path


def default_data_dir() -> Path:
    """``$OSA_LAB_DATA_DIR`` if set, else ``./data/mnist``."""
    return Path(os.environ.get(DATA_DIR_ENV, "data/mnist"))


def _find(root: Path, stem: str) -> Path | None:
    for name in (stem + ".gz", stem, stem.replace("-idx", ".idx") + ".gz", stem.replace("-idx", ".idx")):
        if (root / name).is_file():
            return root / name
    return None


def _missing_mnist(root: Path, missing: list[str]) -> MissingDataError:
    return MissingDataError(
        f"MNIST files not found in {root.resolve()}: missing {', '.join(missing)}. osa_lab never "
        f"downloads data. Get the four IDX files or one mnist.npz from {MNIST_SOURCES}, put them "
        f"(gzipped or not) in {root.resolve()} — or in a directory you pass as `--data-dir DIR` / "
        f"`root=` or set ${DATA_DIR_ENV} to — and run again. Or use `--data digits`, which is bundled."
    )


def load_mnist(
    root: str | os.PathLike | None = None,
    *,
    train_limit: int | None = None,
    test_limit: int | None = None,
    limit_seed: int = SPLIT_SEED,
) -> ImageDataset:
    """MNIST (28×28, 60,000 train / 10,000 test) from local IDX files or a Keras ``mnist.npz``.

    ``root`` is a directory holding ``train-images-idx3-ubyte[.gz]``,
    ``train-labels-idx1-ubyte[.gz]``, ``t10k-images-idx3-ubyte[.gz]`` and
    ``t10k-labels-idx1-ubyte[.gz]``, or ``mnist.npz`` (keys ``x_train, y_train, x_test,
    y_test``), or the path of an ``.npz`` file itself. Default: :func:`default_data_dir`.
    ``train_limit`` / ``test_limit`` take a fixed stratified subset (for quick runs).
    """
    root = Path(root) if root is not None else default_data_dir()
    if root.is_file() and root.suffix == ".npz":
        npz_path: Path | None = root
        root = root.parent
    else:
        npz_path = root / "mnist.npz" if (root / "mnist.npz").is_file() else None
    if npz_path is not None:
        keys = ("x_train", "y_train", "x_test", "y_test")
        try:
            with np.load(npz_path, allow_pickle=False) as z:
                absent = [k for k in keys if k not in z.files]
                if absent:
                    raise OSAInputError(
                        f"{npz_path} lacks arrays {absent}; it needs {list(keys)} (Keras layout)"
                    )
                x_tr, y_tr, x_te, y_te = (np.asarray(z[k]) for k in keys)
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError) as err:
            if isinstance(err, OSAInputError):
                raise
            raise OSAInputError(
                f"{npz_path} is not a readable .npz archive ({type(err).__name__}: {err}); it is truncated, "
                "corrupt or another kind of file — download mnist.npz again"
            ) from err
        source = str(npz_path)
    else:
        if not root.is_dir():
            raise _missing_mnist(root, ["the directory itself"])
        found = {stem: _find(root, stem) for pair in MNIST_FILES.values() for stem in pair}
        missing = [stem + "[.gz]" for stem, p in found.items() if p is None]
        if missing:
            raise _missing_mnist(root, missing)
        x_tr, y_tr = (read_idx(found[s]) for s in MNIST_FILES["train"])  # type: ignore[arg-type]
        x_te, y_te = (read_idx(found[s]) for s in MNIST_FILES["test"])  # type: ignore[arg-type]
        source = str(root)
    checked = {}
    for split, x, y in (("train", x_tr, y_tr), ("test", x_te, y_te)):
        if x.ndim != 3 or x.shape[1] != x.shape[2] or len(x) != len(y):
            raise OSAInputError(
                f"MNIST {split} images have shape {x.shape} and labels {y.shape}; expected "
                "(n, size, size) images and n labels"
            )
        if len(x) == 0:  # before standardising: the mean/std of no images is NaN
            raise OSAInputError(
                f"MNIST {split} split has 0 images in {source}; the file is empty or truncated — "
                "download MNIST again"
            )
        check_finite_inputs(x, f"MNIST {split} images in {source}")
        checked[split] = check_labels(y, MNIST_CLASSES, f"MNIST {split} labels in {source}")
    y_tr, y_te = checked["train"], checked["test"]
    x_tr, y_tr = limit_samples(x_tr, y_tr, train_limit, limit_seed)
    x_te, y_te = limit_samples(x_te, y_te, test_limit, limit_seed)
    return ImageDataset.standardised(
        "mnist",
        x_tr[:, None],
        y_tr,
        x_te[:, None],
        y_te,
        MNIST_CLASSES,
        {"source": source, "train_limit": train_limit, "test_limit": test_limit},
    )
