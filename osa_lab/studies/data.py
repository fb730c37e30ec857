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
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import pickle
import warnings
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from osa_lab.errors import ConfigurationError, DataCacheWarning, MissingDataError, OSAInputError, unknown_name
from osa_lab.fileio import atomic_writer

#: data-set names accepted by :func:`load_data`
DATASETS: tuple[str, ...] = ("digits", "mnist", "synthetic", "mnist1d", "mnist1d-large", "mnist1d-shuffle")

#: MNIST-1D variants (Greydanus & Kobak, "Scaling down deep learning with MNIST-1D", ICML 2024):
#: overrides of the package's ``get_dataset_args()``. ``mnist1d`` is the standard 4,000 / 1,000
#: split (5,000 samples, 80 % train, generator seed 42); ``mnist1d-large`` the same generator
#: with another seed and 60,000 samples split 50,000 / 10,000 (to separate trainability from
#: overfitting); ``mnist1d-shuffle`` their control with the 40 time steps permuted by one fixed
#: permutation (local structure destroyed, the information kept).
MNIST1D_VARIANTS: dict[str, dict] = {
    "mnist1d": {},
    "mnist1d-large": {"num_samples": 60_000, "train_split": 5 / 6, "seed": 1},
    "mnist1d-shuffle": {"shuffle_seq": True},
}

#: the data sets that read ``data_dir`` / ``--data-dir`` (MNIST's files, MNIST-1D's cache folder);
#: the others are built in or generated and refuse a directory rather than ignore it
DATA_DIR_DATASETS: tuple[str, ...] = ("mnist", *MNIST1D_VARIANTS)

#: environment variable naming the cache folder of generated data (default ``~/.cache/osa_lab``)
CACHE_DIR_ENV = "OSA_LAB_CACHE_DIR"

#: number of MNIST classes: every label must lie in 0–9
MNIST_CLASSES = 10

#: environment variable that names the directory holding the MNIST files
DATA_DIR_ENV = "OSA_LAB_DATA_DIR"

#: the fixed seed of the digits train/test split (independent of the training seed)
SPLIT_SEED = 0

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


def _standardise(x_train: np.ndarray, x_test: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale by the training set's global mean and std (one scalar each), as float32 tensors."""
    x_train = x_train.astype(np.float64)
    x_test = x_test.astype(np.float64)
    mean, std = float(x_train.mean()), float(x_train.std())
    std = std if std > 0 else 1.0
    to = lambda a: torch.from_numpy(((a - mean) / std).astype(np.float32))  # noqa: E731
    return to(x_train), to(x_test)


def _limit(x: np.ndarray, y: np.ndarray, limit: int | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
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
        raise ConfigurationError(f"`val_fraction` must lie in [0, 1) (0: no validation split), got {fraction!r}")
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
    x_tr_t, x_te_t = _standardise(x_tr, x_te)
    return ImageDataset(
        "digits",
        x_tr_t,
        torch.from_numpy(y_tr),
        x_te_t,
        torch.from_numpy(y_te),
        10,
        {"source": "sklearn.datasets.load_digits", "test_fraction": test_fraction, "split_seed": split_seed},
    )


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
    x_tr, y_tr = _limit(x_tr, y_tr, train_limit, limit_seed)
    x_te, y_te = _limit(x_te, y_te, test_limit, limit_seed)
    x_tr_t, x_te_t = _standardise(x_tr[:, None], x_te[:, None])
    return ImageDataset(
        "mnist",
        x_tr_t,
        torch.from_numpy(y_tr),
        x_te_t,
        torch.from_numpy(y_te),
        MNIST_CLASSES,
        {"source": source, "train_limit": train_limit, "test_limit": test_limit},
    )


def default_cache_dir() -> Path:
    """``$OSA_LAB_CACHE_DIR`` if set, else ``~/.cache/osa_lab``."""
    return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "osa_lab")


def mnist1d_args(variant: str = "mnist1d", **overrides: object) -> dict:
    """The generator arguments of an MNIST-1D variant: ``get_dataset_args()`` + the variant + ``overrides``.

    The package's ``url`` entry is dropped: osa_lab never downloads MNIST-1D.
    """
    if variant not in MNIST1D_VARIANTS:
        raise unknown_name("MNIST-1D variant", variant, list(MNIST1D_VARIANTS))
    try:
        from mnist1d.data import get_dataset_args
    except ImportError as err:  # pragma: no cover - a declared dependency
        raise MissingDataError(
            "the `mnist1d` package is not installed; `pip install mnist1d` (a dependency of osa_lab)"
        ) from err
    args = get_dataset_args(as_dict=True)
    args.pop("url", None)
    bad = sorted(set(overrides) - set(args))
    if bad:
        raise OSAInputError(f"unknown MNIST-1D generator argument(s) {bad}; valid: {sorted(args)}")
    args.update(MNIST1D_VARIANTS[variant])
    args.update(overrides)
    return args


def _generate_mnist1d(args: dict) -> dict[str, np.ndarray]:
    """Run the package's offline generator (``make_dataset``), keeping the global RNG states intact.

    ``make_dataset`` seeds Python's and NumPy's *global* generators; we restore them afterwards
    so loading data does not change other random streams of the process.
    """
    import random

    from mnist1d.data import make_dataset
    from mnist1d.utils import ObjectView

    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        d = make_dataset(ObjectView(dict(args)))
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    return {
        "x": np.asarray(d["x"], np.float64),
        "y": np.asarray(d["y"], np.int64),
        "x_test": np.asarray(d["x_test"], np.float64),
        "y_test": np.asarray(d["y_test"], np.int64),
    }


#: names of the arrays of an MNIST-1D cache file, in the order of its content hash
MNIST1D_ARRAYS: tuple[str, ...] = ("x", "y", "x_test", "y_test")
#: format tag of the record stored with every MNIST-1D cache file
MNIST1D_CACHE_FORMAT = "osa_lab.mnist1d-cache"
MNIST1D_CACHE_VERSION = 1


def mnist1d_content_hash(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 (hex) of the MNIST-1D arrays: names, dtypes, shapes and bytes, in a fixed order."""
    h = hashlib.sha256()
    for name in MNIST1D_ARRAYS:
        arr = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def _mnist1d_problem(arrays: dict[str, np.ndarray], args: dict) -> str | None:
    """What is wrong with MNIST-1D arrays made with ``args`` (shapes, dtypes, labels, NaN), or None."""
    length = int(args["final_seq_length"])
    for split, xn, yn in (("train", "x", "y"), ("test", "x_test", "y_test")):
        x, y = arrays[xn], arrays[yn]
        if x.ndim != 2 or x.shape[1] != length:
            return f"holds {split} sequences of shape {x.shape}; expected (n, {length})"
        if y.ndim != 1 or len(x) != len(y):
            return f"holds {len(x)} {split} sequences but {y.shape} labels; the rows of x and y must match"
        if not np.issubdtype(x.dtype, np.floating):
            return f"holds {split} sequences of dtype {x.dtype}; expected floats"
        if not np.issubdtype(y.dtype, np.integer):
            return f"holds {split} labels of dtype {y.dtype}; class labels are integers 0–9"
        bad = (y < 0) | (y > 9)
        if bad.any():
            return f"holds {int(bad.sum())} {split} label(s) outside 0–9"
        n_bad = int((~np.isfinite(x)).sum())
        if n_bad:
            return f"holds {n_bad} NaN/Inf value(s) in its {split} sequences"
    return None


def _mnist1d_record(args: dict, version: str, digest: str) -> np.ndarray:
    record = {"format": MNIST1D_CACHE_FORMAT, "version": MNIST1D_CACHE_VERSION, "generator_args": args,
              "mnist1d": version, "sha256": digest}  # fmt: skip
    return np.frombuffer(json.dumps(record, sort_keys=True).encode("utf-8"), dtype=np.uint8)


def _read_mnist1d_cache(path: Path, args: dict, version: str) -> tuple[dict[str, np.ndarray] | None, str]:
    """The arrays of the cache file ``path`` if it is whole and was made by ``args``; else ``(None, why)``.

    The file is opened with ``allow_pickle=False``: a cache file never runs code.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                return None, "is not an .npz archive"
            absent = [k for k in (*MNIST1D_ARRAYS, "record") if k not in z.files]
            if absent:
                return None, f"lacks the arrays {absent}"
            members = {k: z[k] for k in (*MNIST1D_ARRAYS, "record")}
            if not all(isinstance(m, np.ndarray) for m in members.values()):
                return None, "holds a member that is not a NumPy array"
            arrays = {k: members[k] for k in MNIST1D_ARRAYS}
            raw = members["record"]
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile, NotImplementedError) as err:
        return None, f"is not a readable .npz archive ({type(err).__name__}: {_first_line(err)})"
    try:
        record = json.loads(raw.tobytes().decode("utf-8")) if raw.dtype == np.uint8 and raw.ndim == 1 else None
    except (UnicodeDecodeError, ValueError):
        record = None
    if not isinstance(record, dict) or record.get("format") != MNIST1D_CACHE_FORMAT:
        return None, "has no readable record of its generator arguments and content hash"
    if record.get("version") != MNIST1D_CACHE_VERSION or record.get("mnist1d") != version:
        return None, f"was written by another version (record {record.get('version')!r}, mnist1d {record.get('mnist1d')!r})"
    if json.dumps(record.get("generator_args"), sort_keys=True) != json.dumps(args, sort_keys=True):
        return None, "was generated with other arguments than its name says"
    problem = _mnist1d_problem(arrays, args)
    if problem is not None:
        return None, problem
    if record.get("sha256") != mnist1d_content_hash(arrays):
        return None, "does not match its recorded content hash (it was changed after it was written)"
    return arrays, ""


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def load_mnist1d(
    variant: str = "mnist1d",
    *,
    cache_dir: str | os.PathLike | None = None,
    train_limit: int | None = None,
    **generator_overrides: object,
) -> ImageDataset:
    """MNIST-1D (Greydanus & Kobak 2024), generated offline and cached; sequences ``(n, 1, 40)``.

    The ``mnist1d`` package builds every sample from one of ten 12-point templates by padding,
    shear, scaling, translation and correlated + i.i.d. noise, resampled to 40 time steps;
    :func:`mnist1d_args` gives the arguments (:data:`MNIST1D_VARIANTS`). The package's
    download path (``get_dataset``) is never called: arrays come from ``make_dataset`` and are
    cached as ``.npz`` under ``cache_dir`` (default :func:`default_cache_dir`) ``/mnist1d/``,
    keyed by a hash of the generator arguments and the package version, so a changed argument
    never meets a stale cache. Inputs are standardised with the training mean and std.

    The cache file also records the generator arguments and a SHA-256 of its arrays
    (:func:`mnist1d_content_hash`); it is read without pickle. A file that does not match its
    record (changed labels or sequences), has the wrong shapes or dtypes, NaN values or labels
    outside 0–9, or cannot be read, is generated again and rewritten, with a
    :class:`~osa_lab.errors.DataCacheWarning` naming the file and what was wrong.

    Published accuracies on the standard split (their Table): logistic regression 32 %, MLP
    68 %, CNN 94 %, GRU 91 %, human 96 %.
    """
    import importlib.metadata

    args = mnist1d_args(variant, **generator_overrides)
    try:
        version = importlib.metadata.version("mnist1d")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        version = "unknown"
    key = hashlib.sha256(json.dumps({"args": args, "version": version}, sort_keys=True).encode()).hexdigest()[:16]
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = folder / "mnist1d" / f"{variant}-{key}.npz"
    arrays = None
    if path.exists():
        arrays, why = _read_mnist1d_cache(path, args, version)
        if arrays is None:
            warnings.warn(f"MNIST-1D cache {path} {why}; generating it again", DataCacheWarning, stacklevel=2)
    if arrays is None:
        arrays = _generate_mnist1d(args)
        problem = _mnist1d_problem(arrays, args)
        if problem is not None:
            raise OSAInputError(
                f"the mnist1d {version} generator returned data that {problem}; this mnist1d version is not one "
                "osa_lab works with"
            )
        digest = mnist1d_content_hash(arrays)
        try:
            with atomic_writer(path, "wb") as fh:
                np.savez(fh, **arrays, record=_mnist1d_record(args, version, digest))
        except OSError:
            pass  # an unwritable cache only costs the regeneration next time; nothing partial is left
    x_tr, y_tr, x_te, y_te = arrays["x"], arrays["y"], arrays["x_test"], arrays["y_test"]
    y_tr, y_te = y_tr.astype(np.int64), y_te.astype(np.int64)
    x_tr, y_tr = _limit(x_tr, y_tr, train_limit, SPLIT_SEED)
    x_tr_t, x_te_t = _standardise(x_tr[:, None, :], x_te[:, None, :])
    return ImageDataset(
        variant,
        x_tr_t,
        torch.from_numpy(y_tr),
        x_te_t,
        torch.from_numpy(y_te),
        10,
        {
            "source": f"mnist1d {version} make_dataset (generated offline)",
            "generator_args": args,
            "cache": str(path),
            "train_limit": train_limit,
        },
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
    x_tr_t, x_te_t = _standardise(x_tr, x_te)
    return ImageDataset(
        "synthetic",
        x_tr_t,
        torch.from_numpy(y_tr),
        x_te_t,
        torch.from_numpy(y_te),
        num_classes,
        {"source": "synthetic prototypes", "noise": noise, "seed": seed},
    )


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
