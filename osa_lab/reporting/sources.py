"""The report notebooks' sources and their parameters, checked before anything runs.

The sources in ``notebooks/`` are jupytext ``py:percent`` scripts (:func:`discover`,
:func:`select`, converted by :func:`to_ipynb`) with one cell tagged ``parameters``. Parameter
files are YAML mappings ``notebook stem → {parameter: value}`` (:func:`load_params`,
:func:`merge_params`); :func:`check_params` refuses a parameter the notebook does not declare,
a value of another type than the declared one (:func:`expected_type`) and a number outside the
bounds its comment declares (:func:`declared_bounds`).
"""

from __future__ import annotations

import ast
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from osa_lab.errors import ReportError

#: Folder of the notebook sources (the repository's ``notebooks/``).
NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
#: Tiny parameters used by ``--quick``.
QUICK_PARAMS = "ci_params.yaml"
#: Kernel name the notebooks run on; :func:`ensure_kernel` points it at ``sys.executable``.
KERNEL_NAME = "python3"


def discover(notebook_dir: str | Path = NOTEBOOK_DIR) -> dict[str, Path]:
    """The report notebooks in ``notebook_dir``: ``{stem: path}`` of ``NN_*.py`` sources, sorted."""
    folder = Path(notebook_dir)
    if not folder.is_dir():
        raise ReportError(f"notebook folder {folder} does not exist")
    found = {p.stem: p for p in sorted(folder.glob("[0-9][0-9]_*.py"))}
    if not found:
        raise ReportError(f"no report notebooks (NN_name.py) in {folder}")
    return found


def select(notebooks: Mapping[str, Path], only: Sequence[str] | None) -> dict[str, Path]:
    """Notebooks named by ``only`` (exact stem, or a unique prefix such as ``"02"``); all if
    ``only`` is ``None`` or ``[]``. Names that are all blank (``--only ""``) are refused: they
    would select nothing and still rewrite the index."""
    if not only:
        return dict(notebooks)
    items = [part.strip() for entry in only for part in entry.split(",")]
    if not any(items):
        raise ReportError(
            f"--only {only[0]!r} names no notebook; give a stem or a unique prefix such as 02 "
            f"(notebooks are: {', '.join(notebooks)}), or drop --only to run them all"
        )
    chosen: dict[str, Path] = {}
    for item in items:
        if not item:
            continue
        matches = [s for s in notebooks if s == item] or [s for s in notebooks if s.startswith(item)]
        if len(matches) != 1:
            what = "matches none" if not matches else f"is ambiguous ({', '.join(matches)})"
            raise ReportError(f"--only {item!r} {what}; notebooks are: {', '.join(notebooks)}")
        chosen[matches[0]] = notebooks[matches[0]]
    return {s: notebooks[s] for s in notebooks if s in chosen}


def load_params(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a YAML parameter file: a mapping ``notebook stem → {parameter: value}``."""
    path = Path(path)
    if path.is_dir():
        raise ReportError(
            f"parameter file {path} is a directory; give the YAML file (e.g. {path / 'params.yaml'})"
        )
    if not path.is_file():
        raise ReportError(f"parameter file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ReportError(f"parameter file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict | type(None)) for v in data.values()):
        raise ReportError(
            f"parameter file {path} must map notebook names to parameter mappings, e.g.\n"
            "  01_osa_matrix_exponential:\n    ns_accuracy: [8, 32]"
        )
    return {str(k): dict(v or {}) for k, v in data.items()}


def merge_params(*layers: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Merge parameter mappings notebook by notebook; later layers override earlier ones."""
    merged: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for name, params in layer.items():
            merged.setdefault(name, {}).update(params)
    return merged


def to_ipynb(source: str | Path, dest: str | Path) -> Path:
    """Convert a jupytext ``py:percent`` source to an ``.ipynb`` file (no outputs)."""
    import jupytext
    import nbformat

    nb = jupytext.read(Path(source))
    # papermill needs a kernel name in the metadata even to inspect the parameters.
    nb.metadata.setdefault(
        "kernelspec", {"name": KERNEL_NAME, "display_name": "Python 3", "language": "python"}
    )
    nb.metadata.setdefault("language_info", {"name": "python"})
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)
    return dest


def declared_parameters(notebook: str | Path) -> dict[str, dict[str, Any]]:
    """Parameters declared in the notebook's ``parameters`` cell (``papermill.inspect_notebook``).

    Accepts a jupytext ``.py`` source or an ``.ipynb``. Raises :class:`ReportError` when the
    notebook has no cell tagged ``parameters``.
    """
    import papermill

    notebook = Path(notebook)
    with tempfile.TemporaryDirectory() as tmp:
        path = (
            to_ipynb(notebook, Path(tmp) / f"{notebook.stem}.ipynb") if notebook.suffix == ".py" else notebook
        )
        declared = papermill.inspect_notebook(str(path))
    if not declared:
        raise ReportError(f"{notebook.name} has no cell tagged 'parameters' (or it declares nothing)")
    return declared


def _element_type(values: Sequence[Any]) -> str | None:
    """The common element type name of a default list (``float`` for mixed ints and floats)."""
    if not values:
        return None
    if all(isinstance(v, bool) for v in values):
        return "bool"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "int"
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return "float"
    if all(isinstance(v, str) for v in values):
        return "str"
    return None


def expected_type(declaration: Mapping[str, Any]) -> tuple[str, bool] | None:
    """``(type, optional)`` a parameter's value must have, from ``papermill.inspect_notebook``.

    The type is the annotation (``int``, ``float``, ``str``, ``bool``, ``list``, ``list[int]``,
    ``dict``; ``Optional[X]`` / ``X | None`` set ``optional``), or, for an unannotated parameter,
    the type of its literal default; a plain ``list`` gets the common element type of its default
    (``[0.1, 1]`` → ``list[float]``). ``None`` when nothing can be inferred (no check).
    """
    name = str(declaration.get("inferred_type_name") or "None").replace(" ", "")
    optional = False
    if name.startswith("Optional[") and name.endswith("]"):
        name, optional = name[len("Optional[") : -1], True
    parts = name.split("|")
    if len(parts) > 1 and "None" in parts:
        parts.remove("None")
        optional = True
    if len(parts) != 1:
        return None
    name = parts[0]
    try:
        default = ast.literal_eval(str(declaration.get("default", "")))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        default = ...
    if name == "None":  # no annotation: the default's type
        if default is None or default is ...:
            return None
        name = type(default).__name__
    if name == "list" and isinstance(default, list):
        element = _element_type(default)
        name = f"list[{element}]" if element else name
    return name, optional


def _has_type(value: Any, name: str) -> bool:
    base, _, inner = name.partition("[")
    inner = inner.removesuffix("]")
    if base == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if base == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if base == "bool":
        return isinstance(value, bool)
    if base == "str":
        return isinstance(value, str)
    if base in ("list", "List", "tuple", "Sequence"):
        return isinstance(value, list | tuple) and (not inner or all(_has_type(v, inner) for v in value))
    if base in ("dict", "Dict", "Mapping"):
        return isinstance(value, dict)
    return True  # a type we cannot check (e.g. a class): papermill passes the value as is


_BOUND = re.compile(r"\s*(≥|≤|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(?:,|and)?")
_COMPARE = {"≥": float.__ge__, ">": float.__gt__, "≤": float.__le__, "<": float.__lt__}


def declared_bounds(declaration: Mapping[str, Any]) -> list[tuple[str, float]]:
    """Bounds a notebook declares for a number (or each number of a list) at the start of the
    parameter's trailing comment: ``depth: int = 24  # ≥ 1``, ``frac: float = 0.1  # > 0, ≤ 1: …``
    (``≥ > ≤ <``; not ``>=``/``<=``: papermill skips a line with a second ``=``). ``[]`` when the
    comment starts with anything else."""
    text, bounds = str(declaration.get("help") or ""), []
    while m := _BOUND.match(text):
        bounds.append((m.group(1), float(m.group(2))))
        text = text[m.end() :]
    return bounds


def _out_of_bounds(value: Any, bounds: list[tuple[str, float]]) -> str | None:
    """The first bound a number (or an element of a list of numbers) breaks, as ``"≥ 1"``."""
    values = value if isinstance(value, list | tuple) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        for op, limit in bounds:
            if not _COMPARE[op](float(v), limit):
                return f"{op} {limit:g}"
    return None


def check_params(name: str, params: Mapping[str, Any], declared: Mapping[str, Any], origin: str = "") -> None:
    """Refuse parameters the notebook does not declare (papermill would only warn), values whose
    type differs from the declared one (``depth: 2.5`` for ``depth: int = 24`` would run depth 2)
    and numbers outside the bounds the notebook declares (:func:`declared_bounds`)."""
    where = f" (from {origin})" if origin else ""
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise ReportError(
            f"notebook {name} does not declare parameter(s) {', '.join(unknown)}{where}; "
            f"it declares: {', '.join(declared)}"
        )
    for key, value in params.items():
        expected = expected_type(declared[key])
        if expected is None:
            continue
        type_name, optional = expected
        if (value is None and optional) or _has_type(value, type_name):
            continue
        raise ReportError(
            f"notebook {name}: parameter {key} must be {type_name}{' or null' if optional else ''} "
            f"(default {declared[key].get('default')}), got {value!r} ({type(value).__name__}){where}"
        )
    for key, value in params.items():
        broken = _out_of_bounds(value, declared_bounds(declared[key]))
        if broken is not None:
            raise ReportError(
                f"notebook {name}: parameter {key} must be {broken} (declared by the notebook; default "
                f"{declared[key].get('default')}), got {value!r}{where}"
            )
