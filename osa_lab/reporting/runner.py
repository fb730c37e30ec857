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

The command is made of these rooms:

* :mod:`~osa_lab.reporting.sources`: the notebook sources and their parameters (discovery,
  selection, YAML files, declared types and bounds);
* :mod:`~osa_lab.reporting.execution`: the kernel and one notebook's execution
  (:class:`NotebookResult`);
* :mod:`~osa_lab.reporting.export`: the offline HTML page of an executed notebook;
* :mod:`~osa_lab.reporting.index`: ``index.html`` and ``summary.json``;
* this module: :func:`run_reports` and the command line (:func:`add_arguments`, :func:`run`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from osa_lab.errors import ReportError
from osa_lab.fileio import OutputLock
from osa_lab.reporting.execution import NotebookResult, ensure_kernel, execute_one
from osa_lab.reporting.export import export_html, external_references, read_finding, with_code_toggle
from osa_lab.reporting.index import write_index
from osa_lab.reporting.sources import (
    KERNEL_NAME,
    NOTEBOOK_DIR,
    QUICK_PARAMS,
    check_params,
    declared_bounds,
    declared_parameters,
    discover,
    expected_type,
    load_params,
    merge_params,
    select,
    to_ipynb,
)

#: Default per-cell execution timeout (seconds) for default and quick parameters.
CELL_TIMEOUT = 1200
#: lock file of a report folder while ``osa-lab report`` writes into it
REPORT_LOCK = "report.lock"
QUICK_CELL_TIMEOUT = 300


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
        raise ReportError(
            f"cell_timeout={cell_timeout!r}: give a positive number of seconds (--cell-timeout)"
        )
    check_output_dir(output, "--output")
    # Absolute paths: papermill changes the working directory to ``cwd`` while it executes.
    output = Path(output).resolve()
    names = {name: Path(path).resolve() for name, path in names.items()}
    cwd = Path(cwd).resolve() if cwd is not None else Path.cwd()
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise ReportError(
            f"parameters given for unknown notebook(s) {', '.join(unknown)}; notebooks: {', '.join(names)}"
        )
    for name, source in names.items():
        check_params(name, params.get(name, {}), declared_parameters(source))
    output.mkdir(parents=True, exist_ok=True)
    started = _dt.datetime.now(_dt.UTC)
    results: list[NotebookResult] = []
    kernel_ctx = ensure_kernel(kernel_name) if register_kernel else contextlib.nullcontext(kernel_name)
    # one report run at a time writes into ``output`` (a second one is refused, naming the first)
    lock = OutputLock.for_folder(output, f"--output {output}", name=REPORT_LOCK)
    with lock, kernel_ctx as kernel, tempfile.TemporaryDirectory(prefix="osa-lab-report-") as staging:
        bar = tqdm(
            list(names.items()), desc="reports", unit="notebook", disable=not progress, file=sys.stderr
        )
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``osa-lab report``."""
    from osa_lab.arguments import positive_int

    parser.add_argument(
        "--quick", action="store_true", help=f"tiny parameters from notebooks/{QUICK_PARAMS} (CI)"
    )
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
    parser.add_argument(
        "--list", action="store_true", help="list the notebooks and their parameters, run nothing"
    )
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


__all__ = [
    "CELL_TIMEOUT", "KERNEL_NAME", "NOTEBOOK_DIR", "QUICK_CELL_TIMEOUT", "QUICK_PARAMS", "REPORT_LOCK",
    "NotebookResult", "ReportError", "add_arguments", "check_params", "declared_bounds", "declared_parameters",
    "discover", "ensure_kernel", "execute_one", "expected_type", "export_html", "external_references",
    "load_params", "merge_params", "read_finding", "run", "run_reports", "select", "to_ipynb",
    "with_code_toggle", "write_index",
]  # fmt: skip


if __name__ == "__main__":  # python -m osa_lab.reporting.runner
    from osa_lab.arguments import run_command

    sys.exit(run_command(sys.modules[__name__], "osa-lab report", __doc__.splitlines()[0], sys.argv[1:]))
