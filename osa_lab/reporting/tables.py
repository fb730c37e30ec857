"""The one table formatter of the reports: human headers, units, no index, one number format.

Every table a report shows goes through :func:`format_table` (the notebooks display it with
:func:`osa_lab.reporting.kernel_setup.show_table`), so a column of the same kind reads the same
in every report:

* accuracies and other fractions in percent with one decimal (``88.0``), the unit in the header;
* a condition number κ with three significant digits, and ``> 4.5e15`` where it lies beyond what
  float64 resolves (:data:`~osa_lab.studies.summaries.KAPPA_RESOLVED`, 1/ε: the smallest singular
  value is rounding noise there, so the value is never printed as a number);
* other numbers with three significant digits (``3.33e-4``, not ``0.000333333``);
* a missing value as ``—``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from osa_lab.errors import OSAInputError
from osa_lab.studies.summaries import KAPPA_RESOLVED, number

__all__ = [
    "KAPPA_BEYOND_TEXT",
    "MISSING",
    "Column",
    "format_table",
    "interval_text",
    "kappa_text",
    "number",
    "percent_text",
    "table_html",
    "value_text",
]

#: What a table or sentence shows for a κ that float64 does not resolve (κ ≥ 1/ε, or infinite).
KAPPA_BEYOND_TEXT = f"> {number(KAPPA_RESOLVED, 2)}"

#: What a table shows for a missing value.
MISSING = "—"


def _missing(x: object) -> bool:
    if x is None:
        return True
    try:
        return bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


def kappa_text(kappa: object, digits: int = 3) -> str:
    """A condition number as text: ``"> 4.5e15"`` at or beyond float64's ceiling (or infinite),
    ``"—"`` when missing, else ``digits`` significant digits (``2.25e7``, ``38.1``)."""
    if _missing(kappa):
        return MISSING
    k = float(kappa)  # type: ignore[arg-type]
    if k >= KAPPA_RESOLVED:  # +inf included
        return KAPPA_BEYOND_TEXT
    return number(k, digits)


def percent_text(fraction: object, digits: int = 1) -> str:
    """A fraction (0.88) as percent text with ``digits`` decimals (``"88.0"``); ``"—"`` when missing."""
    if _missing(fraction):
        return MISSING
    return f"{100 * float(fraction):.{digits}f}"  # type: ignore[arg-type]


def value_text(x: object, digits: int = 3) -> str:
    """A number with ``digits`` significant digits (:func:`~osa_lab.reporting.texts.number`);
    integers as integers, text as itself, ``"—"`` when missing."""
    if _missing(x):
        return MISSING
    if isinstance(x, bool | np.bool_):
        return "yes" if x else "no"
    if isinstance(x, numbers.Integral):
        return str(int(x))
    if isinstance(x, numbers.Real):
        f = float(x)
        if math.isfinite(f) and f == round(f) and abs(f) < 1e6:
            return str(int(f))
        return number(f, digits)
    return str(x)


def interval_text(mean: object, low: object, high: object, *, percent: bool = True, digits: int = 1) -> str:
    """``"88.0 [87.2, 88.8]"``: a mean and its interval (fractions shown in percent when ``percent``)."""
    fmt = (lambda v: percent_text(v, digits)) if percent else (lambda v: value_text(v))
    if _missing(mean):
        return MISSING
    if _missing(low) or _missing(high):
        return fmt(mean)
    return f"{fmt(mean)} [{fmt(low)}, {fmt(high)}]"


#: The formats a :class:`Column` can name.
FORMATS: dict[str, Callable[[object], str]] = {
    "percent": percent_text,
    "kappa": kappa_text,
    "number": value_text,
    "text": lambda x: MISSING if _missing(x) else str(x),
    "code": lambda x: MISSING if _missing(x) else str(x),
}


@dataclass(frozen=True)
class Column:
    """One column of a formatted table: its ``header`` (with its unit) and ``format`` (a name of
    :data:`FORMATS` or a function of the cell value)."""

    header: str
    format: str | Callable[[object], str] = "number"

    def formatter(self) -> Callable[[object], str]:
        if callable(self.format):
            return self.format
        if self.format not in FORMATS:
            raise OSAInputError(f"unknown column format {self.format!r}; use one of {sorted(FORMATS)} or a function")
        return FORMATS[self.format]


def _default_column(name: str) -> Column:
    """A column's format guessed from its name: κ columns as κ, the rest as numbers; the header
    is the name in words (``kappa_init`` → ``κ at init``)."""
    words = str(name).replace("kappa", "κ").replace("_", " ")
    kind = "kappa" if "kappa" in str(name) or str(name).startswith("κ") or "condition" in str(name) else "number"
    return Column(words, kind)


def format_table(df: pd.DataFrame, columns: Mapping[str, Column | str] | None = None) -> pd.DataFrame:
    """``df`` as a table of strings with human headers, ready to show (no index column).

    ``columns`` maps a column of ``df`` to its :class:`Column` (or just a header, formatted as a
    number), in the order to show; without it every column is shown, formatted by its name
    (κ columns as κ). A column that ``df`` lacks raises :class:`~osa_lab.errors.OSAInputError`.
    """
    if not isinstance(df, pd.DataFrame):
        raise OSAInputError(f"format_table needs a pandas DataFrame, got {type(df).__name__}")
    df = df.reset_index(drop=not any(n is not None for n in df.index.names) or isinstance(df.index, pd.RangeIndex))
    if columns is None:
        columns = {c: _default_column(str(c)) for c in df.columns}
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise OSAInputError(f"table lacks column(s) {missing}; it has {list(df.columns)}")
    out = {}
    for name, col in columns.items():
        col = col if isinstance(col, Column) else Column(str(col))
        fmt = col.formatter()
        out[col.header] = [fmt(v) for v in df[name].tolist()]
    return pd.DataFrame(out)


def table_html(table: pd.DataFrame) -> str:
    """A formatted table (:func:`format_table`) as an HTML table without index, cells escaped."""
    html = table.to_html(index=False, escape=True, border=0, na_rep=MISSING, classes="osa-table")
    return html.replace('<tr style="text-align: right;">', "<tr>")
