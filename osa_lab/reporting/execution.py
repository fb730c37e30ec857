"""Executing one report notebook with papermill on a kernel that runs this interpreter.

:func:`ensure_kernel` points the kernel name at ``sys.executable`` while it is open;
:func:`execute_one` executes a notebook with its parameters and a per-cell timeout, exports it
to HTML and returns a :class:`NotebookResult` (a failing cell, a timeout or a dead kernel is
recorded there, with the cell that failed, and never raised).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osa_lab.errors import ReportError
from osa_lab.reporting.export import export_html, external_references, read_finding
from osa_lab.reporting.sources import KERNEL_NAME, to_ipynb


@dataclass
class NotebookResult:
    """Outcome of one notebook: where its outputs are, how long it ran, where it failed."""

    name: str
    source: str
    params: dict[str, Any]
    ok: bool = False
    seconds: float = 0.0
    ipynb: str | None = None
    html: str | None = None
    failed_cell: int | None = None
    failed_exec_count: int | None = None
    failed_source: str | None = None
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    finding: str | None = None

    def failure_line(self) -> str:
        """One line naming the notebook, the cell and the error (for the terminal)."""
        where = "before any cell ran"
        if self.failed_exec_count is not None or self.failed_cell is not None:
            count = f"In [{self.failed_exec_count}]" if self.failed_exec_count is not None else "a cell"
            where = f"cell {count} (cell #{self.failed_cell} of the executed notebook)"
            if self.failed_source:
                where += f": `{self.failed_source}`"
        return f"FAILED {self.name}: {where}\n    {self.error}"


@contextlib.contextmanager
def ensure_kernel(name: str = KERNEL_NAME) -> Iterator[str]:
    """Make kernel ``name`` run this interpreter (``sys.executable``) while the context is open.

    A kernel spec ``{sys.executable} -m ipykernel_launcher`` is written into a temporary
    folder that is put first on ``JUPYTER_PATH``, so it shadows any other spec of that name
    (a user-wide ``python3`` pointing at another Python, say). The resolution is checked
    before use. Yields the kernel name.
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        import ipykernel  # noqa: F401
    except ImportError as exc:  # pragma: no cover - part of the lab extra
        raise ReportError(
            f'ipykernel is not installed in {sys.executable}; install it with pip install "osa_lab[lab]"'
        ) from exc
    old = os.environ.get("JUPYTER_PATH")
    with tempfile.TemporaryDirectory(prefix="osa-lab-kernel-") as tmp:
        spec_dir = Path(tmp) / "kernels" / name
        spec_dir.mkdir(parents=True)
        spec = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"Python 3 (osa_lab, {sys.executable})",
            "language": "python",
            "metadata": {"debugger": True},
        }
        (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
        os.environ["JUPYTER_PATH"] = os.pathsep.join([tmp, *([old] if old else [])])
        try:
            try:
                found = KernelSpecManager().get_kernel_spec(name)
            except NoSuchKernel as exc:  # pragma: no cover - we just wrote it
                raise ReportError(f"kernel spec {name!r} could not be registered in {tmp}") from exc
            if Path(found.argv[0]) != Path(sys.executable):
                raise ReportError(
                    f"kernel {name!r} resolves to {found.argv[0]}, not this interpreter {sys.executable}"
                )
            yield name
        finally:
            if old is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = old


def _first_line(source: str) -> str:
    for line in source.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return line.strip()[:100]
    return source.strip().splitlines()[0][:100] if source.strip() else ""


def _locate_running_cell(ipynb: Path) -> tuple[int | None, int | None, str | None]:
    """The last cell papermill started in an executed notebook (for timeouts, dead kernels)."""
    import nbformat

    try:
        nb = nbformat.read(str(ipynb), as_version=4)
    except Exception:  # noqa: BLE001 - nothing written; no cell to name
        return None, None, None
    last = None
    for index, cell in enumerate(nb.cells):
        if cell.get("metadata", {}).get("papermill", {}).get("start_time"):
            last = (index, cell.get("execution_count"), _first_line(cell.get("source", "")))
    return last or (None, None, None)


def execute_one(
    name: str,
    source: Path,
    params: Mapping[str, Any],
    output: Path,
    staging: Path,
    *,
    kernel_name: str,
    cell_timeout: int,
    cwd: Path,
) -> NotebookResult:
    """Execute one notebook and export it; never raises for a failing cell (see the result)."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    result = NotebookResult(name=name, source=str(source), params=dict(params))
    staged = to_ipynb(source, staging / f"{name}.ipynb")
    out_ipynb = output / f"{name}.ipynb"
    start = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(staged),
            str(out_ipynb),
            parameters=dict(params),
            kernel_name=kernel_name,
            execution_timeout=cell_timeout,
            progress_bar=False,
            cwd=str(cwd),
        )
        result.ok = True
    except PapermillExecutionError as exc:
        result.failed_cell = exc.cell_index
        result.failed_exec_count = exc.exec_count
        result.failed_source = _first_line(exc.source or "")
        result.error = f"{exc.ename}: {exc.evalue}"
    except Exception as exc:  # noqa: BLE001 - timeouts, dead kernels: report and go on
        result.failed_cell, result.failed_exec_count, result.failed_source = _locate_running_cell(out_ipynb)
        kind = "timed out" if "Timeout" in type(exc).__name__ else "stopped"
        result.error = (
            f"{kind}: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        )
        if kind == "timed out":
            result.error += f" (per-cell timeout {cell_timeout} s; raise it with --cell-timeout)"
    result.seconds = time.perf_counter() - start
    if out_ipynb.exists():
        result.ipynb = out_ipynb.name
        result.finding = read_finding(out_ipynb)
        try:
            html_path = export_html(out_ipynb, output / f"{name}.html")
            result.html = html_path.name
            remote = external_references(html_path.read_text(encoding="utf-8"))
            if remote:
                result.warnings.append(
                    f"{html_path.name} loads {len(remote)} network resource(s), e.g. {remote[0]}"
                )
        except Exception as exc:  # noqa: BLE001 - keep the executed notebook even if export fails
            result.warnings.append(f"HTML export failed: {type(exc).__name__}: {exc}")
            if result.ok:
                result.ok = False
                result.error = f"HTML export failed: {type(exc).__name__}: {exc}"
    return result
