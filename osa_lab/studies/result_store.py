"""Task results on disk in a format that cannot run code: NumPy ``.npz`` without pickles.

A grid (:mod:`osa_lab.studies.grid`) stores each finished task's return value so that a rerun
skips it. Results are written with :func:`save_result` and read with :func:`load_result`,
which opens the archive with ``allow_pickle=False``: a file from elsewhere (a shared
``--cache-dir``, a downloaded results folder) is data, never code.

What can be stored: ``None``, ``bool``, ``int``, ``float`` (NaN and ±inf included), ``str``,
NumPy scalars, lists, tuples and string-keyed dicts of these, NumPy arrays of numbers, booleans,
strings or dates, and pandas ``DataFrame`` s whose column names are strings and whose columns
are such arrays (object columns of strings, or of JSON scalars, are kept as object columns).
Floats are kept bit for bit. Anything else raises :class:`UnstorableResultError` at save time.

The archive holds one JSON document (``structure``) that describes the value and refers to the
arrays by name, plus the task key it belongs to; :func:`load_result` refuses a file whose key
is not the expected one or whose structure is not one it wrote.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from osa_lab.errors import MalformedResultError, UnstorableResultError
from osa_lab.fileio import atomic_writer

#: format tag written into every stored result
FORMAT = "osa_lab.task-result"
FORMAT_VERSION = 1

_STRUCTURE = "structure"
_SCALARS = (type(None), bool, int, float, str)
#: dtypes a text column may be restored as ("str": pandas 3's default string dtype)
_STRING_DTYPES = ("object", "str", "string")


class _Encoder:
    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def array(self, arr: np.ndarray, where: str) -> str:
        if arr.dtype.hasobject or arr.dtype.kind not in "biufcUSMm":
            raise UnstorableResultError(f"{where}: arrays of dtype {arr.dtype} cannot be stored without pickle")
        name = f"a{len(self.arrays)}"
        self.arrays[name] = arr
        return name

    def column(self, values: pd.Series | pd.Index, where: str) -> dict:
        dtype = values.dtype
        if isinstance(dtype, pd.StringDtype):  # pandas' string dtypes ("str" in pandas 3, "string")
            missing = np.asarray(values.isna())
            texts = ["" if m else str(v) for v, m in zip(values.tolist(), missing, strict=True)]
            return {"strings": self.array(np.array(texts, dtype=str), where), "dtype": str(dtype),
                    "missing": self.array(missing, where) if missing.any() else None}  # fmt: skip
        if not isinstance(dtype, np.dtype):
            raise UnstorableResultError(f"{where}: columns of dtype {dtype} cannot be stored")
        arr = values.to_numpy()
        if arr.dtype != object:
            return {"array": self.array(arr, where)}
        items = arr.tolist()
        if all(isinstance(v, str) for v in items):
            return {"strings": self.array(np.array(items, dtype=str), where), "dtype": "object", "missing": None}
        if all(isinstance(v, _SCALARS) for v in items):
            return {"objects": [self.value(v, where) for v in items]}
        kinds = sorted({type(v).__name__ for v in items if not isinstance(v, _SCALARS)})
        raise UnstorableResultError(f"{where}: an object column holding {', '.join(kinds)} cannot be stored")

    def frame(self, df: pd.DataFrame, where: str) -> dict:
        names = list(df.columns)
        if not all(isinstance(c, str) for c in names) or len(set(names)) != len(names):
            raise UnstorableResultError(f"{where}: only DataFrames with distinct string column names are stored")
        index = df.index
        if isinstance(index, pd.RangeIndex):
            encoded_index: dict = {"range": [index.start, index.stop, index.step]}
        else:
            encoded_index = self.column(index, f"{where} (index)")
        return {
            "dataframe": {
                "columns": names,
                "data": [self.column(df[c], f"{where}[{c!r}]") for c in names],
                "index": encoded_index,
            }
        }

    def value(self, v: Any, where: str = "result") -> Any:
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return v
        if isinstance(v, int):
            return {"int": str(v)} if abs(v) >= 2**53 else v
        if isinstance(v, float):
            return v if math.isfinite(v) else {"float": repr(v)}
        if isinstance(v, np.generic):
            if v.dtype.kind in "biuf" and v.dtype.itemsize <= 8:
                return self.value(v.item(), where)
            return {"scalar": self.array(np.asarray(v), where)}
        if isinstance(v, np.ndarray):
            return {"ndarray": self.array(v, where)}
        if isinstance(v, pd.DataFrame):
            return self.frame(v, where)
        if isinstance(v, tuple):
            return {"tuple": [self.value(x, f"{where}[{i}]") for i, x in enumerate(v)]}
        if isinstance(v, list):
            return {"list": [self.value(x, f"{where}[{i}]") for i, x in enumerate(v)]}
        if isinstance(v, Mapping):
            if not all(isinstance(k, str) for k in v):
                raise UnstorableResultError(f"{where}: only dicts with string keys are stored")
            return {"dict": {k: self.value(x, f"{where}[{k!r}]") for k, x in v.items()}}
        raise UnstorableResultError(f"{where}: values of type {type(v).__name__} cannot be stored without pickle")


def save_result(path: str | os.PathLike, value: Any, key: str) -> Path:
    """Write ``value`` (the result of the task ``key``) to ``path`` atomically.

    Raises :class:`UnstorableResultError` (before anything is written) for a value that is not
    storable (module docstring) and :class:`~osa_lab.errors.OutputWriteError` for a failed write.
    """
    encoder = _Encoder()
    structure = {"format": FORMAT, "version": FORMAT_VERSION, "key": key, "value": encoder.value(value)}
    document = json.dumps(structure, allow_nan=False)
    arrays = {_STRUCTURE: np.frombuffer(document.encode("utf-8"), dtype=np.uint8), **encoder.arrays}
    with atomic_writer(path, "wb") as fh:
        np.savez(fh, **arrays)
    return Path(path)


class _Decoder:
    def __init__(self, arrays: Mapping[str, np.ndarray], path: Path) -> None:
        self.arrays = arrays
        self.path = path

    def bad(self, what: str) -> MalformedResultError:
        return MalformedResultError(f"{self.path}: {what}")

    def array(self, name: Any) -> np.ndarray:
        if not isinstance(name, str) or name == _STRUCTURE or name not in self.arrays:
            raise self.bad(f"refers to a missing array {name!r}")
        return self.arrays[name]

    def column(self, spec: Any) -> pd.Series:
        if not isinstance(spec, dict) or not spec:
            raise self.bad("has a malformed column")
        if set(spec) == {"array"}:
            arr = self.array(spec["array"])
            if arr.ndim != 1:
                raise self.bad("has a column that is not 1-dimensional")
            return pd.Series(arr, dtype=arr.dtype)
        if set(spec) == {"strings", "dtype", "missing"} and spec["dtype"] in _STRING_DTYPES:
            texts = self.array(spec["strings"])
            if texts.ndim != 1 or texts.dtype.kind != "U":
                raise self.bad("has a malformed text column")
            values = texts.astype(object)
            if spec["missing"] is not None:
                missing = self.array(spec["missing"])
                if missing.dtype != bool or missing.shape != values.shape:
                    raise self.bad("has a malformed text column")
                values[missing] = None
            return pd.Series(values, dtype=spec["dtype"])
        if set(spec) == {"objects"} and isinstance(spec["objects"], list):
            out = [self.value(v) for v in spec["objects"]]
            if not all(isinstance(v, _SCALARS) for v in out):
                raise self.bad("has an object column that is not made of scalars")
            arr = np.empty(len(out), dtype=object)
            arr[:] = out
            return pd.Series(arr, dtype=object)
        raise self.bad("has a column of an unknown kind")

    def frame(self, spec: Any) -> pd.DataFrame:
        if not isinstance(spec, dict) or set(spec) != {"columns", "data", "index"}:
            raise self.bad("has a malformed table")
        names, data, index = spec["columns"], spec["data"], spec["index"]
        if not isinstance(names, list) or not isinstance(data, list) or len(names) != len(data):
            raise self.bad("has a table whose columns and data do not match")
        if not all(isinstance(c, str) for c in names):
            raise self.bad("has a table with non-string column names")
        columns = [self.column(d) for d in data]
        if isinstance(index, dict) and set(index) == {"range"}:
            r = index["range"]
            if not (isinstance(r, list) and len(r) == 3 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                  for x in r)):  # fmt: skip
                raise self.bad("has a malformed table index")
            idx: pd.Index = pd.RangeIndex(*r)
        else:
            idx = pd.Index(self.column(index))
        if any(len(c) != len(idx) for c in columns):
            raise self.bad("has a table whose columns differ in length")
        for c in columns:
            c.index = idx
        return pd.DataFrame(dict(zip(names, columns, strict=True)), index=idx, columns=names)

    def value(self, v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, dict) and len(v) == 1:
            (kind, body), = v.items()
            if kind == "int" and isinstance(body, str):
                try:
                    return int(body)
                except ValueError:
                    raise self.bad(f"has a malformed int {body!r}") from None
            if kind == "float" and body in ("nan", "inf", "-inf"):
                return float(body)
            if kind == "ndarray":
                return self.array(body)
            if kind == "scalar":
                arr = self.array(body)
                if arr.ndim != 0:
                    raise self.bad("has a scalar that is not 0-dimensional")
                return arr[()]
            if kind == "dataframe":
                return self.frame(body)
            if kind in ("tuple", "list") and isinstance(body, list):
                items = [self.value(x) for x in body]
                return tuple(items) if kind == "tuple" else items
            if kind == "dict" and isinstance(body, dict):
                return {k: self.value(x) for k, x in body.items()}
        raise self.bad("holds a value it does not describe")


def load_result(path: str | os.PathLike, key: str) -> Any:
    """Read the result of task ``key`` written by :func:`save_result`; never runs code.

    Raises :class:`MalformedResultError` (with the path) for anything else: a damaged or
    truncated file, a pickle or an archive with object arrays, another task's result, an
    unknown format or version.
    """
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise MalformedResultError(f"{path}: not an .npz archive")
            arrays = {name: archive[name] for name in archive.files}
        if not all(isinstance(a, np.ndarray) for a in arrays.values()):  # a member that is no .npy
            raise MalformedResultError(f"{path}: not a readable result archive (a member is not a NumPy array)")
    except MalformedResultError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, NotImplementedError) as err:
        raise MalformedResultError(f"{path}: not a readable result archive ({type(err).__name__}: {err})") from None
    raw = arrays.get(_STRUCTURE)
    if raw is None or raw.dtype != np.uint8 or raw.ndim != 1:
        raise MalformedResultError(f"{path}: not a task result written by osa_lab (no structure record)")
    try:
        structure = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise MalformedResultError(f"{path}: its structure record is not JSON") from None
    if not isinstance(structure, dict) or structure.get("format") != FORMAT:
        raise MalformedResultError(f"{path}: not a task result written by osa_lab")
    if structure.get("version") != FORMAT_VERSION:
        raise MalformedResultError(f"{path}: format version {structure.get('version')!r}, expected {FORMAT_VERSION}")
    if structure.get("key") != key:
        raise MalformedResultError(f"{path}: holds the result of task {structure.get('key')!r}, not {key!r}")
    return _Decoder(arrays, path).value(structure.get("value"))


__all__ = ["load_result", "save_result"]
