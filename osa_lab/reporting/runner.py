"""``osa-lab report``: execute the report notebooks with papermill and export them to HTML.

The notebook sources in ``notebooks/`` are jupytext ``py:percent`` scripts with one cell
tagged ``parameters`` (docs/design.md §6). For each selected notebook this module

1. converts the source to ``.ipynb`` (jupytext) and checks every parameter it is given against
   the ones the notebook declares (``papermill.inspect_notebook``; papermill itself only warns);
2. executes it with papermill, always with an explicit kernel name and a per-cell timeout,
   on a kernel spec that runs *this* interpreter (see :func:`ensure_kernel`);
3. writes the executed ``NAME.ipynb`` and a self-contained ``NAME.html`` (images embedded,
   no CDN scripts, so it renders offline) into the output folder (``reports/``, ignored by git);

and finally writes ``index.html`` (links, status, parameters, run time and provenance of each
notebook) and ``summary.json``. A failing notebook does not stop the others; the command
then exits with status 1 and names the notebook and the cell that failed.

Parameter files are YAML mappings ``notebook stem → {parameter: value}``; lists and nested
values go through YAML, never through ``-p`` strings. ``--quick`` uses
``notebooks/ci_params.yaml`` (tiny sizes for CI).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime as _dt
import html
import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from osa_lab.errors import ReportError
from osa_lab.fileio import OutputLock, atomic_write_text

#: Folder of the notebook sources (the repository's ``notebooks/``).
NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
#: Tiny parameters used by ``--quick``.
QUICK_PARAMS = "ci_params.yaml"
#: Kernel name the notebooks run on; :func:`ensure_kernel` points it at ``sys.executable``.
KERNEL_NAME = "python3"
#: Default per-cell execution timeout (seconds) for default and quick parameters.
CELL_TIMEOUT = 1200
#: lock file of a report folder while ``osa-lab report`` writes into it
REPORT_LOCK = "report.lock"
QUICK_CELL_TIMEOUT = 300

# An nbconvert template that drops every script loaded from the network (require.js,
# MathJax, mermaid, widget manager): the reports hold only static HTML and embedded PNGs.
_OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
"""


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


# --------------------------------------------------------------------------------------------
# notebooks and parameters
# --------------------------------------------------------------------------------------------


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
        raise ReportError(f"parameter file {path} is a directory; give the YAML file (e.g. {path / 'params.yaml'})")
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
    nb.metadata.setdefault("kernelspec", {"name": KERNEL_NAME, "display_name": "Python 3", "language": "python"})
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
        path = to_ipynb(notebook, Path(tmp) / f"{notebook.stem}.ipynb") if notebook.suffix == ".py" else notebook
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


# --------------------------------------------------------------------------------------------
# kernel
# --------------------------------------------------------------------------------------------


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
            f"ipykernel is not installed in {sys.executable}; install it with pip install \"osa_lab[lab]\""
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


# --------------------------------------------------------------------------------------------
# execution and export
# --------------------------------------------------------------------------------------------


def export_html(ipynb: str | Path, dest: str | Path) -> Path:
    """Export an executed notebook to self-contained HTML: embedded images, no network scripts."""
    import jinja2
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(
        extra_loaders=[jinja2.DictLoader({"osa_lab_offline.html.j2": _OFFLINE_TEMPLATE})],
        template_file="osa_lab_offline.html.j2",
        embed_images=True,
    )
    body, _ = exporter.from_notebook_node(nbformat.read(str(ipynb), as_version=4))
    return atomic_write_text(dest, with_code_toggle(body))


#: Hides the code of every code cell (and the In/Out prompts) unless the reader ticks the box
#: that :func:`with_code_toggle` puts at the top of the page: CSS only (``:has``), no script.
_CODE_TOGGLE_CSS = """<style id="osa-lab-code-toggle">
body:has(#osa-show-code:not(:checked)) .jp-CodeCell .jp-Cell-inputWrapper,
body:has(#osa-show-code:not(:checked)) .jp-CodeCell .jp-OutputPrompt,
body:has(#osa-show-code:not(:checked)) .jp-CodeCell .jp-InputPrompt { display: none; }
.osa-code-toggle { position: sticky; top: 0; z-index: 10; display: inline-block; margin: 6px 0 0 6px;
  padding: 4px 10px; border: 1px solid #bbb; border-radius: 6px; background: #f7f7f7; font: 13px system-ui,
  sans-serif; cursor: pointer; }
</style>
"""
_CODE_TOGGLE_BOX = ('<label class="osa-code-toggle"><input type="checkbox" id="osa-show-code"> show the code '
                    "(hidden: the executed .ipynb keeps every cell)</label>")


def with_code_toggle(page: str) -> str:
    """``page`` (an nbconvert HTML export) with every code cell's source hidden by default and a
    "show the code" box at the top that reveals it; outputs, text and figures stay visible."""
    page = page.replace("</head>", _CODE_TOGGLE_CSS + "</head>", 1)
    return re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + "\n" + _CODE_TOGGLE_BOX, page, count=1)


def read_finding(ipynb: str | Path) -> str | None:
    """The one-line finding a report displayed with
    :func:`osa_lab.reporting.kernel_setup.finding` (the last one), or ``None``."""
    import nbformat

    from osa_lab.reporting.kernel_setup import FINDING_KEY

    try:
        nb = nbformat.read(str(ipynb), as_version=4)
    except Exception:  # noqa: BLE001 - no notebook, no finding
        return None
    found = None
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            value = (output.get("metadata") or {}).get(FINDING_KEY)
            if isinstance(value, str) and value.strip():
                found = value.strip()
    return found


_EXTERNAL = re.compile(
    r"""(?:<script[^>]*\ssrc\s*=\s*["']?\s*(?:https?:)?//[^"'\s>]+)"""
    r"""|(?:<link[^>]*\shref\s*=\s*["']?\s*(?:https?:)?//[^"'\s>]+)"""
    r"""|(?:<(?:img|iframe|embed|source|video|audio)[^>]*\ssrc\s*=\s*["']?\s*(?:https?:)?//[^"'\s>]+)"""
    r"""|(?:url\(\s*["']?\s*(?:https?:)?//[^)"']+)"""
    r"""|(?:@import\s+["'](?:https?:)?//[^"']+)"""
    r"""|(?:\bimport\b[^;\n]*\bfrom\s*["'](?:https?:)?//[^"']+)"""
    # script or style URLs held in strings, as JavaScript loaders (bokeh, panel) build them
    r"""|(?:["'](?:https?:)?//[^"'\s]+\.(?:m?js|css)(?:\?[^"'\s]*)?["'])""",
    re.IGNORECASE,
)


def external_references(page: str) -> list[str]:
    """Resources an HTML page would fetch from the network (scripts, styles, images, imports).

    Plain hyperlinks (``<a href=…>``) are not resources and are not reported. An empty list
    means the page renders offline.
    """
    return [m.group(0)[:200] for m in _EXTERNAL.finditer(page)]


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
        result.error = f"{kind}: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
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
                result.warnings.append(f"{html_path.name} loads {len(remote)} network resource(s), e.g. {remote[0]}")
        except Exception as exc:  # noqa: BLE001 - keep the executed notebook even if export fails
            result.warnings.append(f"HTML export failed: {type(exc).__name__}: {exc}")
            if result.ok:
                result.ok = False
                result.error = f"HTML export failed: {type(exc).__name__}: {exc}"
    return result


def run_reports(
    names: Mapping[str, Path],
    params: Mapping[str, Mapping[str, Any]],
    output: str | Path,
    *,
    cell_timeout: int = CELL_TIMEOUT,
    kernel_name: str = KERNEL_NAME,
    register_kernel: bool = True,
    cwd: str | Path | None = None,
    progress: bool = True,
    label: str = "",
) -> list[NotebookResult]:
    """Execute ``names`` (stem → source) with their ``params`` into ``output``; write the index.

    All parameters (names and types) and the output folder are validated before anything runs
    or is created. Returns one :class:`NotebookResult` per notebook, in order.

    Raises:
        ReportError: unknown notebook or parameter, a parameter of the wrong type, or a
            ``cell_timeout`` that is not a positive number of seconds.
        OutputPathError: ``output`` is a file or cannot be written.
        RunLockedError: another live report run writes into ``output`` (its ``report.lock``).
    """
    from tqdm.auto import tqdm

    from osa_lab.arguments import check_output_dir

    if isinstance(cell_timeout, bool) or not isinstance(cell_timeout, int | float) or not cell_timeout > 0:
        raise ReportError(f"cell_timeout={cell_timeout!r}: give a positive number of seconds (--cell-timeout)")
    check_output_dir(output, "--output")
    # Absolute paths: papermill changes the working directory to ``cwd`` while it executes.
    output = Path(output).resolve()
    names = {name: Path(path).resolve() for name, path in names.items()}
    cwd = Path(cwd).resolve() if cwd is not None else Path.cwd()
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise ReportError(f"parameters given for unknown notebook(s) {', '.join(unknown)}; notebooks: {', '.join(names)}")
    for name, source in names.items():
        check_params(name, params.get(name, {}), declared_parameters(source))
    output.mkdir(parents=True, exist_ok=True)
    started = _dt.datetime.now(_dt.UTC)
    results: list[NotebookResult] = []
    kernel_ctx = ensure_kernel(kernel_name) if register_kernel else contextlib.nullcontext(kernel_name)
    # one report run at a time writes into ``output`` (a second one is refused, naming the first)
    lock = OutputLock.for_folder(output, f"--output {output}", name=REPORT_LOCK)
    with lock, kernel_ctx as kernel, tempfile.TemporaryDirectory(prefix="osa-lab-report-") as staging:
        bar = tqdm(list(names.items()), desc="reports", unit="notebook", disable=not progress, file=sys.stderr)
        for name, source in bar:
            bar.set_postfix_str(name)
            result = execute_one(
                name,
                source,
                params.get(name, {}),
                output,
                Path(staging),
                kernel_name=kernel,
                cell_timeout=cell_timeout,
                cwd=cwd,
            )
            results.append(result)
            status = "ok" if result.ok else "FAILED"
            bar.write(f"{name}: {status} in {result.seconds:.1f} s", file=sys.stderr)
            for warning in result.warnings:
                bar.write(f"{name}: warning: {warning}", file=sys.stderr)
        bar.close()
        write_index(results, output, started=started, label=label)
    return results


# --------------------------------------------------------------------------------------------
# index.html
# --------------------------------------------------------------------------------------------

_INDEX_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #ddd; padding: 6px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
.ok { color: #11722b; font-weight: 600; } .failed { color: #b00020; font-weight: 600; }
code, pre { font-size: 0.85em; } pre { margin: 0; white-space: pre-wrap; }
.prov { color: #555; font-size: 0.9em; }
"""


def write_index(
    results: Sequence[NotebookResult], output: str | Path, *, started: _dt.datetime | None = None, label: str = ""
) -> Path:
    """Write ``index.html`` (and ``summary.json``) linking every notebook's HTML and ``.ipynb``.

    Notebooks of earlier runs in ``output`` that this run did not execute (``--only``) stay
    listed, marked with the time and commit of the run that made them, as long as their files
    are still there (``summary.json`` keeps them under ``"earlier"``).
    """
    from osa_lab.reporting import provenance

    output = Path(output)
    info = provenance.collect({"mode": label} if label else None)
    started = started or _dt.datetime.now(_dt.UTC)
    earlier = _earlier_notebooks(output, {r.name for r in results})
    rows = []
    entries = [(r, None) for r in results] + [(NotebookResult(**e["result"]), e) for e in earlier]
    for r, origin in sorted(entries, key=lambda item: item[0].name):
        links = []
        if r.html:
            links.append(f'<a href="{html.escape(r.html)}">{html.escape(r.name)}</a>')
        else:
            links.append(html.escape(r.name))
        if r.ipynb:
            links.append(f'<a href="{html.escape(r.ipynb)}">.ipynb</a>')
        if r.ok:
            status = '<span class="ok">ok</span>'
        else:
            status = f'<span class="failed">failed</span><pre>{html.escape(r.failure_line())}</pre>'
        if origin is not None:
            status += (
                f'<br><span class="prov">earlier run {html.escape(str(origin["started_utc"]))}, '
                f'git <code>{html.escape(str(origin["commit"]))}</code></span>'
            )
        params = yaml.safe_dump(r.params, sort_keys=False, default_flow_style=None).strip() if r.params else "(defaults)"
        found = html.escape(r.finding) if r.finding else '<span class="prov">(no finding recorded)</span>'
        rows.append(
            f"<tr><td>{' · '.join(links)}</td><td>{status}</td><td>{found}</td><td>{r.seconds:.1f} s</td>"
            f"<td><pre>{html.escape(params)}</pre></td></tr>"
        )
    total = sum(r.seconds for r in results)
    git = info["git"]
    device = info["device"].get("gpu") or info["device"]["processor"]
    title = "osa_lab reports" + (f" ({label})" if label else "")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_INDEX_CSS}</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="prov">Run started {started.isoformat(timespec="seconds")} · total {total:.1f} s ·
git <code>{html.escape(str(git["commit"]))}</code>{" (uncommitted changes)" if git.get("dirty") else ""} ·
torch {html.escape(info["packages"].get("torch", "?"))} · {html.escape(str(device))},
{info["device"]["cpu_count"]} CPUs · Python {html.escape(info["python"]["version"])}</p>
<table><thead><tr><th>notebook</th><th>status</th><th>what it found</th><th>run time</th><th>parameters (overrides of the defaults)</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>
</body></html>
"""
    index = atomic_write_text(output / "index.html", page)
    summary = {
        "started_utc": started.isoformat(timespec="seconds"),
        "label": label,
        "provenance": info,
        "notebooks": [asdict(r) for r in results],
        "earlier": earlier,
    }
    atomic_write_text(output / "summary.json", json.dumps(summary, indent=1, default=str))
    return index


def _earlier_notebooks(output: Path, current: set[str]) -> list[dict[str, Any]]:
    """Entries of the previous ``summary.json`` in ``output`` for notebooks not in ``current``
    whose HTML or ``.ipynb`` still exists: ``{"result": …, "started_utc": …, "commit": …}``."""
    try:
        previous = json.loads((output / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(previous, dict):
        return []
    provenance = previous.get("provenance")
    git = provenance.get("git") if isinstance(provenance, dict) else None
    commit = git.get("commit") if isinstance(git, dict) else None
    notebooks, earlier = previous.get("notebooks"), previous.get("earlier")
    candidates = [
        {"result": nb, "started_utc": previous.get("started_utc"), "commit": commit}
        for nb in (notebooks if isinstance(notebooks, list) else [])
        if isinstance(nb, dict)
    ] + [e for e in (earlier if isinstance(earlier, list) else [])
         if isinstance(e, dict) and isinstance(e.get("result"), dict)]
    kept: list[dict[str, Any]] = []
    for entry in candidates:
        nb = _stored_result(entry["result"])
        if nb is None:
            continue
        name = nb["name"]
        if name in current or any(e["result"]["name"] == name for e in kept):
            continue
        if not any(nb.get(key) and _inside(output, nb[key]) for key in ("html", "ipynb")):
            continue
        kept.append({"result": nb, "started_utc": str(entry.get("started_utc")), "commit": str(entry.get("commit"))})
    return kept


def _stored_result(stored: Mapping[str, Any]) -> dict[str, Any] | None:
    """The fields of a stored :class:`NotebookResult` that have the declared types, or ``None``
    when its name is missing or not text. A hand-edited or damaged ``summary.json`` (a number
    where a file name belongs, a list of warnings that is not a list) never stops the index
    from being written: a field of the wrong type takes its default."""
    name = stored.get("name")
    if not isinstance(name, str) or not name:
        return None
    kinds: dict[str, tuple[type, ...]] = {
        "source": (str,), "params": (dict,), "ok": (bool,), "seconds": (int, float), "ipynb": (str,), "html": (str,),
        "failed_cell": (int,), "failed_exec_count": (int,), "failed_source": (str,), "error": (str,),
        "warnings": (list,), "finding": (str,),
    }
    out: dict[str, Any] = {"name": name, "source": "", "params": {}}
    for f in fields(NotebookResult):
        value = stored.get(f.name)
        if f.name not in kinds or not isinstance(value, kinds[f.name]):
            continue
        if isinstance(value, bool) and f.name != "ok":
            continue  # JSON true/false where a number belongs
        if f.name == "seconds" and not math.isfinite(value):
            continue
        out[f.name] = value
    out["warnings"] = [str(w) for w in out.get("warnings", [])]
    return out


def _inside(output: Path, name: str) -> bool:
    """``name`` is a file directly in ``output`` (not a path leading elsewhere)."""
    return Path(name).name == name and name not in (".", "..") and (output / name).is_file()


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``osa-lab report``."""
    from osa_lab.arguments import positive_int

    parser.add_argument("--quick", action="store_true", help=f"tiny parameters from notebooks/{QUICK_PARAMS} (CI)")
    parser.add_argument(
        "--params",
        metavar="FILE",
        help="YAML file: notebook stem → {parameter: value}; applied on top of --quick",
    )
    parser.add_argument(
        "--only",
        metavar="NAME",
        action="append",
        help="run only this notebook (stem or unique prefix such as 02; repeat or comma-separate)",
    )
    parser.add_argument("--output", metavar="DIR", default="reports", help="output folder (default: reports)")
    parser.add_argument(
        "--notebooks", metavar="DIR", default=str(NOTEBOOK_DIR), help="folder of the notebook sources"
    )
    parser.add_argument(
        "--cell-timeout",
        metavar="SECONDS",
        type=positive_int,
        default=None,
        help=f"per-cell execution timeout (default {CELL_TIMEOUT}, {QUICK_CELL_TIMEOUT} with --quick)",
    )
    parser.add_argument("--list", action="store_true", help="list the notebooks and their parameters, run nothing")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Run ``osa-lab report``; 0 when every notebook ran, 1 when one failed, 2 on a bad request."""
    from osa_lab.arguments import check_output_dir, one_line
    from osa_lab.errors import OutputPathError

    try:
        if not args.list:
            check_output_dir(args.output, "--output")  # before any notebook is converted or run
        notebooks = discover(args.notebooks)
        chosen = select(notebooks, args.only)
        if args.list:
            for name, path in chosen.items():
                declared = declared_parameters(path)
                print(f"{name}  ({path})")
                for p in declared.values():
                    note = f"  # {p['help']}" if declared_bounds(p) else ""
                    print(f"    {p['name']}: {p['inferred_type_name']} = {p['default']}{note}")
            return 0
        layers = []
        if args.quick:
            layers.append(load_params(Path(args.notebooks) / QUICK_PARAMS))
        if args.params:
            layers.append(load_params(args.params))
        params = merge_params(*layers)
        # Parameters for notebooks not selected with --only are ignored, but must still exist.
        unknown = sorted(set(params) - set(notebooks))
        if unknown:
            raise ReportError(
                f"parameters given for unknown notebook(s) {', '.join(unknown)}; notebooks: {', '.join(notebooks)}"
            )
        params = {k: v for k, v in params.items() if k in chosen}
        if args.cell_timeout is not None:
            timeout = args.cell_timeout
        else:
            timeout = QUICK_CELL_TIMEOUT if args.quick else CELL_TIMEOUT
        label = "quick" if args.quick else "default parameters"
        if args.params:
            label += f" + {args.params}"
        results = run_reports(
            chosen,
            params,
            args.output,
            cell_timeout=timeout,
            cwd=Path(args.notebooks).resolve().parent,
            progress=not args.no_progress,
            label=label,
        )
    except (ReportError, OutputPathError) as exc:
        print(f"osa-lab report: error: {one_line(exc)}", file=sys.stderr)
        return 2
    index = Path(args.output).resolve() / "index.html"
    failed = [r for r in results if not r.ok]
    total = sum(r.seconds for r in results)
    print(f"{len(results) - len(failed)}/{len(results)} notebooks ran in {total:.1f} s; index: {index}")
    for r in failed:
        print(r.failure_line(), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":  # python -m osa_lab.reporting.runner
    from osa_lab.arguments import run_command

    sys.exit(run_command(sys.modules[__name__], "osa-lab report", __doc__.splitlines()[0], sys.argv[1:]))
