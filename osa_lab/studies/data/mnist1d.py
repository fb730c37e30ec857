"""MNIST-1D (Greydanus & Kobak, ICML 2024): offline generation and its checked cache.

:data:`MNIST1D_VARIANTS` names the variants, :func:`mnist1d_args` their generator arguments;
:func:`load_mnist1d` generates the arrays with the ``mnist1d`` package's ``make_dataset`` (never
its download path) and caches them as ``.npz`` under :func:`default_cache_dir`, with a record of
the arguments and a content hash (:func:`mnist1d_content_hash`) that is checked on every read.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
import zipfile
from pathlib import Path

import numpy as np

from osa_lab.errors import DataCacheWarning, MissingDataError, OSAInputError, unknown_name
from osa_lab.fileio import atomic_writer
from osa_lab.studies.data.dataset import SPLIT_SEED, ImageDataset, limit_samples

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

#: environment variable naming the cache folder of generated data (default ``~/.cache/osa_lab``)
CACHE_DIR_ENV = "OSA_LAB_CACHE_DIR"


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
        record = (
            json.loads(raw.tobytes().decode("utf-8")) if raw.dtype == np.uint8 and raw.ndim == 1 else None
        )
    except (UnicodeDecodeError, ValueError):
        record = None
    if not isinstance(record, dict) or record.get("format") != MNIST1D_CACHE_FORMAT:
        return None, "has no readable record of its generator arguments and content hash"
    if record.get("version") != MNIST1D_CACHE_VERSION or record.get("mnist1d") != version:
        return (
            None,
            f"was written by another version (record {record.get('version')!r}, mnist1d {record.get('mnist1d')!r})",
        )
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
    key = hashlib.sha256(json.dumps({"args": args, "version": version}, sort_keys=True).encode()).hexdigest()[
        :16
    ]
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
    x_tr, y_tr = limit_samples(x_tr, y_tr, train_limit, SPLIT_SEED)
    return ImageDataset.standardised(
        variant,
        x_tr[:, None, :],
        y_tr,
        x_te[:, None, :],
        y_te,
        10,
        {
            "source": f"mnist1d {version} make_dataset (generated offline)",
            "generator_args": args,
            "cache": str(path),
            "train_limit": train_limit,
        },
    )
