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
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
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
    jobs: int = 1,
) -> list[NotebookResult]:
    """Execute ``names`` (stem → source) with their ``params`` into ``output``; write the index.

    All parameters (names and types) and the output folder are validated before anything runs
    or is created. With ``jobs`` > 1, that many notebooks execute at once, each in a process of its
    own (papermill changes the process' working directory while it executes, so threads cannot
    share one); with 1 they execute here, one after the other.
    Returns one :class:`NotebookResult` per notebook, in the order of ``names``.

    Raises:
        ReportError: unknown notebook or parameter, a parameter of the wrong type, a
            ``cell_timeout`` that is not a positive number of seconds, or ``jobs`` < 1.
        OutputPathError: ``output`` is a file or cannot be written.
        RunLockedError: another live report run writes into ``output`` (its ``report.lock``).
    """
    from tqdm.auto import tqdm

    from osa_lab.arguments import check_output_dir

    if isinstance(cell_timeout, bool) or not isinstance(cell_timeout, int | float) or not cell_timeout > 0:
        raise ReportError(
            f"cell_timeout={cell_timeout!r}: give a positive number of seconds (--cell-timeout)"
        )
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ReportError(f"jobs={jobs!r}: give the number of notebooks to execute at once, 1 or more (--jobs)")
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
        bar = tqdm(total=len(names), desc="reports", unit="notebook", disable=not progress, file=sys.stderr)
        calls = {
            name: (name, source, params.get(name, {}), output, Path(staging))
            for name, source in names.items()
        }
        options = {"kernel_name": kernel, "cell_timeout": cell_timeout, "cwd": cwd}
        if jobs == 1:
            for name, call in calls.items():
                bar.set_postfix_str(name)
                results.append(_reported(execute_one(*call, **options), bar))
        else:
            done = execute_in_processes(calls, options, jobs, report=lambda r: _reported(r, bar))
            results = [done[name] for name in names]
        bar.close()
        write_index(results, output, started=started, label=label)
    return results


def _reported(result: NotebookResult, bar: Any) -> NotebookResult:
    """One notebook's outcome on the terminal (above the progress bar); returns ``result``."""
    status = "ok" if result.ok else "FAILED"
    bar.write(f"{result.name}: {status} in {result.seconds:.1f} s", file=sys.stderr)
    for warning in result.warnings:
        bar.write(f"{result.name}: warning: {warning}", file=sys.stderr)
    bar.update(1)
    return result


def execute_in_processes(
    calls: Mapping[str, tuple[Any, ...]],
    options: Mapping[str, Any],
    jobs: int,
    *,
    report: Callable[[NotebookResult], object] = lambda result: None,
    run: Callable[..., NotebookResult] = execute_one,
) -> dict[str, NotebookResult]:
    """``run(*calls[name], **options)`` for every name, each in a spawned process of its own, at
    most ``jobs`` at a time; ``report`` sees each result as it arrives. A notebook whose process
    died, or whose ``run`` raised, is recorded as failed with the reason and never raised: the
    other notebooks run and keep their results. With ``jobs`` > 1 and no ``OMP_NUM_THREADS`` set,
    each process (and the kernel it starts) gets an equal share of the cores for torch's threads."""
    import multiprocessing
    from multiprocessing.connection import wait

    context = multiprocessing.get_context("spawn")  # no fork of a process with threads
    threads = None
    if jobs > 1 and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, (os.cpu_count() or 1) // jobs)
    waiting, running, done = list(calls), {}, {}
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                name = waiting.pop(0)
                receiver, sender = context.Pipe(duplex=False)
                arguments = (sender, run, calls[name], options, threads)
                process = context.Process(target=_run_and_send, args=arguments)
                process.start()
                sender.close()
                running[name] = (process, receiver)
            wait([r for _, r in running.values()] + [p.sentinel for p, _ in running.values()])
            for name, (process, receiver) in list(running.items()):
                result = _received(name, calls[name], process, receiver)
                if result is not None:
                    process.join()
                    del running[name]
                    done[name] = result
                    report(result)
    finally:
        for process, _ in running.values():  # interrupted: stop the notebooks still executing
            process.terminate()
            process.join()
    return done


def _run_and_send(
    sender: Any,
    run: Callable[..., NotebookResult],
    call: tuple[Any, ...],
    options: Mapping[str, Any],
    threads: int | None,
) -> None:
    """In the spawned process: run one notebook and send ``("result", r)`` or ``("error", text)``."""
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)  # before torch loads here or in the kernel
    try:
        sender.send(("result", run(*call, **options)))
    except Exception as exc:  # noqa: BLE001 - the parent records it as the notebook's failure
        sender.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        sender.close()


def _received(name: str, call: tuple[Any, ...], process: Any, receiver: Any) -> NotebookResult | None:
    """The result a notebook's process sent, a failed result where it raised or died, or None
    while it still runs."""
    why = None
    if receiver.poll():
        try:
            kind, value = receiver.recv()
        except (EOFError, OSError):
            kind, value = "died", None
        if kind == "result":
            return value
        why = f"stopped: {value}" if kind == "error" else None
    elif process.is_alive():
        return None
    if why is None:
        process.join()
        why = (
            f"stopped: the process that executed it died (exit code {process.exitcode}); "
            "run it again with --jobs 1"
        )
    result = NotebookResult(name=name, source=str(call[1]), params=dict(call[2]))
    result.error = why
    return result


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
    parser.add_argument(
        "--jobs",
        metavar="N",
        type=positive_int,
        default=1,
        help="notebooks to execute at once, each in its own process and kernel (default 1)",
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
        began = time.perf_counter()
        results = run_reports(
            chosen,
            params,
            args.output,
            cell_timeout=timeout,
            cwd=Path(args.notebooks).resolve().parent,
            progress=not args.no_progress,
            label=label,
            jobs=args.jobs,
        )
    except (ReportError, OutputPathError) as exc:
        print(f"osa-lab report: error: {one_line(exc)}", file=sys.stderr)
        return 2
    index = Path(args.output).resolve() / "index.html"
    failed = [r for r in results if not r.ok]
    wall = time.perf_counter() - began
    at_once = min(args.jobs, len(results))
    summed = f" ({sum(r.seconds for r in results):.1f} s of notebook time, {at_once} at once)" if at_once > 1 else ""
    print(f"{len(results) - len(failed)}/{len(results)} notebooks ran in {wall:.1f} s{summed}; index: {index}")
    for r in failed:
        print(r.failure_line(), file=sys.stderr)
    return 1 if failed else 0


__all__ = [
    "CELL_TIMEOUT", "KERNEL_NAME", "NOTEBOOK_DIR", "QUICK_CELL_TIMEOUT", "QUICK_PARAMS", "REPORT_LOCK",
    "NotebookResult", "ReportError", "add_arguments", "check_params", "declared_bounds", "declared_parameters",
    "discover", "ensure_kernel", "execute_in_processes", "execute_one", "expected_type", "export_html", "external_references",
    "load_params", "merge_params", "read_finding", "run", "run_reports", "select", "to_ipynb",
    "with_code_toggle", "write_index",
]  # fmt: skip


if __name__ == "__main__":  # python -m osa_lab.reporting.runner
    from osa_lab.arguments import run_command

    sys.exit(run_command(sys.modules[__name__], "osa-lab report", __doc__.splitlines()[0], sys.argv[1:]))
