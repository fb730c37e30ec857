"""Helpers for the report notebooks: static figures that render offline, and the opening cell.

The exported HTML reports must open without network access, so the notebooks do not call
``hv.extension`` (its loader pulls bokeh and panel JavaScript from a CDN). Instead
:func:`show` renders a HoloViews object with the matplotlib backend and displays the figure
as an embedded PNG. In JupyterLab the same call works; for interactive plots use the Panel
dashboard, which draws with the same builders.
"""

from __future__ import annotations

import base64
import warnings
from collections.abc import Mapping
from typing import Any

#: Resolution of the PNGs embedded in the reports.
DPI = 90


def setup() -> None:
    """Configure a report kernel: inline matplotlib, both HoloViews backends, pandas display."""
    import matplotlib
    import pandas as pd

    from osa_lab.plots.style import ensure_backends

    try:
        from IPython import get_ipython

        ip = get_ipython()
        if ip is not None and hasattr(ip, "kernel"):
            ip.run_line_magic("matplotlib", "inline")
    except ImportError:  # pragma: no cover - IPython ships with the lab extra
        pass
    matplotlib.rcParams["figure.dpi"] = DPI
    try:  # tqdm.auto warns in a kernel without ipywidgets; the reports need no widgets
        from tqdm import TqdmWarning

        warnings.filterwarnings("ignore", category=TqdmWarning)
    except ImportError:  # pragma: no cover
        pass
    ensure_backends()
    pd.set_option("display.precision", 4)
    pd.set_option("display.max_rows", 60)
    pd.set_option("display.width", 160)


def show(obj: Any, *, dpi: int = DPI) -> None:
    """Render a HoloViews object with matplotlib and display it as an embedded PNG.

    Uses :func:`osa_lab.plots.depth.png_bytes` (the figure is closed after saving, so it is
    not displayed twice). Returns nothing, so a trailing call adds no second output.
    """
    from osa_lab.plots.depth import png_bytes

    png = png_bytes(obj, dpi=dpi)
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            label = getattr(obj, "label", "") or type(obj).__name__
            bundle = {"image/png": base64.b64encode(png).decode("ascii"), "text/plain": f"<figure: {label}>"}
            display(bundle, raw=True)
    except ImportError:  # pragma: no cover - IPython ships with the lab extra
        pass


def show_table(df: Any, columns: Any = None) -> None:
    """Display ``df`` through the reports' one table formatter
    (:func:`osa_lab.reporting.tables.format_table`): human headers, units, no index column,
    κ beyond float64 as ``> 4.5e15``. ``columns`` as there (default: every column, by its name)."""
    from osa_lab.reporting.tables import format_table, table_html

    table = format_table(df, columns)
    _display({"text/html": table_html(table), "text/plain": table.to_string(index=False)})


#: Metadata key of the display that :func:`finding` writes (read back by ``osa-lab report``'s index).
FINDING_KEY = "osa_lab_finding"


def say(markdown: str) -> None:
    """Display ``markdown`` (a sentence of :mod:`osa_lab.reporting.texts`) as formatted text.

    A report's numbers and conclusions are written by code from the run's tables, so they
    cannot drift from what the run measured; this shows them as prose, not as a code output.
    """
    _display({"text/markdown": markdown, "text/plain": markdown})


def finding(text: str) -> None:
    """Display the report's one-line finding (generated from its tables) and mark it, so that
    ``index.html`` shows it beside the report's run time."""
    line = " ".join(str(text).split())
    _display({"text/markdown": f"**Finding of this run:** {line}", "text/plain": line}, {FINDING_KEY: line})


def _display(bundle: dict[str, str], metadata: dict[str, str] | None = None) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython ships with the reports extra
        print(bundle["text/plain"])
        return
    if get_ipython() is None:
        print(bundle["text/plain"])
        return
    display(bundle, raw=True, metadata=metadata or {})


_IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython", "open"})


def parameters(namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The notebook's parameters: the public, plain-data globals of ``namespace``.

    Call it right after the ``parameters`` cell (and the cell papermill injects), before any
    other assignment, so that only parameters are defined: modules, callables, IPython's own
    names and names starting with ``_`` are skipped.
    """
    import types

    plain = (bool, int, float, str, list, tuple, dict, type(None))
    return {
        k: v
        for k, v in namespace.items()
        if not k.startswith("_")
        and k not in _IPYTHON_NAMES
        and not isinstance(v, types.ModuleType)
        and isinstance(v, plain)
    }


def opening(title: str, namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The first output of every report: set up the kernel and show a one-line provenance summary.

    ``namespace`` is the notebook's ``globals()`` right after its parameters cell; the
    parameters found there (see :func:`parameters`) are summarised with git revision, torch
    and device in one line, and returned as a dict. :func:`closing` shows the full table,
    collapsed, at the end of the report.
    """
    from osa_lab.reporting import provenance

    setup()
    params = parameters(namespace)
    global _PROVENANCE
    _PROVENANCE = provenance.show({"notebook": title, **params}, full=False)
    return params


_PROVENANCE: dict[str, Any] | None = None


def closing() -> None:
    """The last output of every report: the full provenance table of :func:`opening`, collapsed."""
    from osa_lab.reporting import provenance

    provenance.show_details(_PROVENANCE if _PROVENANCE is not None else provenance.collect())
