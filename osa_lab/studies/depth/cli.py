"""``osa-lab sweep``: the depth sweep's command line (arguments, output checks, the tables it writes)."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import pandas as pd

from osa_lab.arguments import finite_float, positive_int
from osa_lab.errors import ConfigurationError, GridTaskFailedWarning, TaskStoreWarning
from osa_lab.fileio import OutputLock, output_locks
from osa_lab.nn.presets import preset_names
from osa_lab.studies.depth.profiles import DTYPES, token_count
from osa_lab.studies.depth.sweeps import MAX_DEPTH, MAX_WIDTH, sweep, write_tables
from osa_lab.studies.grid import add_grid_arguments, options_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``osa-lab sweep``."""
    parser.add_argument("--presets", nargs="+", default=["pure-osa", "pure-ssa"], metavar="NAME",
                        help=f"presets to compare (from: {', '.join(preset_names())})")  # fmt: skip
    parser.add_argument("--depth", nargs="+", type=positive_int, default=[24], help="model depth(s)")
    parser.add_argument(
        "--tokens", nargs="+", type=token_count, default=[64], help="sequence length(s) N (≥ 2)"
    )
    parser.add_argument("--dim", nargs="+", type=positive_int, default=[64], help="width(s) d")
    parser.add_argument(
        "--heads", nargs="+", type=positive_int, default=None, help="head count(s) (default: each preset's)"
    )
    parser.add_argument("--alpha", nargs="+", type=finite_float, default=None,
                        help="OSA α value(s) (default: the derived init); ignored for SSA presets")  # fmt: skip
    parser.add_argument("--seeds", type=positive_int, default=3, help="number of seeds (0..n-1)")
    parser.add_argument("--site", choices=["block", "attention", "both"], default="block")
    parser.add_argument(
        "--batch", type=positive_int, default=1, help="random inputs per model (metrics averaged)"
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float64")
    parser.add_argument(
        "--output", default="results.csv", help="metrics CSV (spectra go to <stem>_spectra.csv)"
    )
    parser.add_argument("--spectra-output", default=None, help="spectra CSV path")
    parser.add_argument("--no-spectra", action="store_true", help="skip the spectra table")
    parser.add_argument("--jacobian", choices=["none", "auto", "exact", "matrix-free"], default="none",
                        help="also write Jacobian κ across depth to <stem>_jacobian.csv, computed by this algorithm")  # fmt: skip
    parser.add_argument("--cache-dir", default=None,
                        help="folder of finished task results, reused on a rerun (default: <stem>_tasks/ "
                        "beside --output)")  # fmt: skip
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--allow-large",
        action="store_true",
        help=f"run sweeps beyond the sanity bounds (depth > {MAX_DEPTH}, N or d > {MAX_WIDTH}, matrix-free "
        f"Jacobians of more than {MAX_MATRIX_FREE_INPUTS} inputs, …)",
    )
    add_grid_arguments(parser)


#: Largest N·d of a matrix-free Jacobian the CLI runs without ``--allow-large`` (4× the 16 384
#: inputs of the BENCHMARKS.md case, which takes ≈ 25 s for 12 layers).
MAX_MATRIX_FREE_INPUTS = 65_536


def _check_jacobian_request(args: argparse.Namespace) -> None:
    """Refuse a ``--jacobian`` run that cannot fit or would run for a very long time, before sweeping."""
    if args.jacobian == "none":
        return
    from osa_lab.studies.jacobian import MAX_EXACT_DIM, JacobianTooLargeError, default_max_bytes

    n_inputs = max(args.tokens) * max(args.dim)
    exact = args.jacobian == "exact" or (args.jacobian == "auto" and n_inputs <= MAX_EXACT_DIM)
    if exact:
        need, limit = n_inputs * n_inputs * 8, default_max_bytes()
        if need > limit:
            raise JacobianTooLargeError(
                f"--jacobian exact: the Jacobian at N = {max(args.tokens)}, d = {max(args.dim)} is {n_inputs} × "
                f"{n_inputs} float64 = {need / 2**30:.2f} GiB, over the limit of {limit / 2**30:.2f} GiB; use "
                "--jacobian matrix-free (or auto)"
            )
    elif n_inputs > MAX_MATRIX_FREE_INPUTS and not args.allow_large:
        raise ConfigurationError(
            f"--jacobian {args.jacobian}: a matrix-free Jacobian of N·d = {n_inputs} inputs takes very long "
            f"(limit {MAX_MATRIX_FREE_INPUTS}); use smaller --tokens/--dim or pass --allow-large"
        )


def run(args: argparse.Namespace) -> int:
    """Run ``osa-lab sweep``: writes the tidy CSV(s) and prints a short summary."""
    from osa_lab.arguments import check_output_dir, check_output_file
    from osa_lab.errors import OutputPathError

    # Every output path is checked before anything is computed.
    out = check_output_file(args.output, "--output")
    outputs: dict[str, Path] = {"--output": out}
    if not args.no_spectra:
        default_spectra = out.with_name(f"{out.stem}_spectra.csv")
        outputs["--spectra-output"] = check_output_file(
            args.spectra_output or default_spectra, "--spectra-output"
        )
    if args.jacobian != "none":
        outputs["the Jacobian table"] = check_output_file(out.with_name(f"{out.stem}_jacobian.csv"),
                                                          "--output (its <stem>_jacobian.csv)")  # fmt: skip
    outputs["the task table"] = check_output_file(out.with_name(f"{out.stem}_tasks.csv"),
                                                  "--output (its <stem>_tasks.csv)")  # fmt: skip
    resolved = [p.resolve() for p in outputs.values()]
    if len(set(resolved)) < len(resolved):
        raise OutputPathError(
            f"output paths collide ({', '.join(f'{k} {v}' for k, v in outputs.items())}); give distinct files"
        )
    store = args.cache_dir if args.cache_dir is not None else out.with_name(f"{out.stem}_tasks")
    check_output_dir(store, "--cache-dir")
    _check_jacobian_request(args)
    # One sweep at a time writes the files named after an --output (and an explicit
    # --spectra-output): a second sweep on the same output is refused, naming the first.
    locks = [OutputLock.for_file(out, f"--output {out}")]
    if args.spectra_output is not None and not args.no_spectra:
        locks.append(
            OutputLock.for_file(
                outputs["--spectra-output"], f"--spectra-output {outputs['--spectra-output']}"
            )
        )
    with output_locks(locks):
        return _run_locked(args, out, outputs, store)


def _run_locked(args: argparse.Namespace, out: Path, outputs: dict[str, Path], store: str | Path) -> int:
    """The part of :func:`run` that computes and writes, while the outputs are locked."""
    from osa_lab.arguments import one_line
    from osa_lab.errors import UnknownNameError

    try:
        # failed tasks are listed below, once; notes on the task store come after the tables
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("ignore", GridTaskFailedWarning)
            warnings.simplefilter("always", TaskStoreWarning)
            result = sweep(
                args.presets,
                args.depth,
                args.tokens,
                args.dim,
                args.heads,
                args.alpha,
                args.seeds,
                site=args.site,
                spectra=not args.no_spectra,
                batch=args.batch,
                dtype=DTYPES[args.dtype],
                cache_dir=store,
                allow_large=args.allow_large,
                jacobian=args.jacobian,
                grid=options_from_args(args, progress=not args.no_progress),
            )
    except (UnknownNameError, ConfigurationError) as exc:
        print(f"osa-lab sweep: error: {one_line(exc)}", file=sys.stderr)
        return 2
    if len(result.tasks) and len(result.failures) == len(result.tasks):  # said first: the tables below are empty
        first = result.failures.iloc[0]
        print(f"osa-lab sweep: every one of the {len(result.tasks)} tasks failed, nothing was measured; first: "
              f"{first['error_type']}: {one_line(first['error'])}", file=sys.stderr)  # fmt: skip
    tables = [(out, result.metrics)]
    if not args.no_spectra:
        tables.append((outputs["--spectra-output"], result.spectra))
    if args.jacobian != "none":
        tables.append((outputs["the Jacobian table"], result.jacobian))
    tables.append((outputs["the task table"], result.tasks))
    write_tables(tables)
    for path, df in tables:
        print(f"wrote {path} ({len(df)} rows)")
    for note in caught:
        if issubclass(note.category, TaskStoreWarning):
            print(f"osa-lab sweep: warning: {one_line(note.message)}", file=sys.stderr)
        else:
            warnings.warn_explicit(note.message, note.category, note.filename, note.lineno)
    final = result.metrics[
        (result.metrics["layer"] == result.metrics["depth"]) & (result.metrics["site"] == "block")
    ]
    if len(final):
        table = final.groupby(["preset", "depth", "metric"])["value"].mean().unstack("metric")
        with pd.option_context("display.width", 160, "display.float_format", "{:.4g}".format):
            print("mean over seeds at the last layer:")
            print(table.to_string())
    failed = result.failures
    if len(failed):
        print(f"osa-lab sweep: {len(failed)} of {len(result.tasks)} tasks failed (the others finished; "
              f"see {outputs['the task table']}):", file=sys.stderr)  # fmt: skip
        for _, row in failed.iterrows():
            settings = " ".join(f"{k}={row[k]}" for k in ("kind", "preset", "depth", "tokens", "dim", "heads",
                                                            "alpha", "seed"))  # fmt: skip
            print(f"  {settings}: {row['error_type']}: {one_line(row['error'])}", file=sys.stderr)
        return 1
    return 0
