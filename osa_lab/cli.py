"""The ``osa-lab`` command line (also ``python -m osa_lab``).

Each module listed in ``SUBCOMMANDS`` provides ``add_arguments(parser)`` and
``run(args) -> int``; modules are imported only when their sub-command runs, so
``osa-lab bench`` does not import Panel or papermill. ``osa-lab --version`` prints the version.

Errors: a user error never shows a Python traceback. Bad arguments (argparse) print a one-line
usage and one ``osa-lab <cmd>: error: <message>`` line; a user error raised by a sub-command
(:class:`~osa_lab.errors.UserError`: e.g. :class:`~osa_lab.errors.ConfigurationError`,
:class:`~osa_lab.errors.OutputPathError`, ``ReportError``, ``MissingDataError``) prints the same
one line. Both exit with status 2. Anything else is a bug and keeps its traceback; set
``OSA_LAB_TRACEBACK=1`` to see the traceback of a user error too.

The helpers :func:`positive_int`, :func:`nonnegative_int`, :func:`finite_float`,
:func:`positive_float`, :func:`check_output_file` and :func:`check_output_dir` are shared by the
sub-commands so that every bad value is refused before any work starts; they live in
:mod:`osa_lab.arguments` (the bottom floor, so sub-commands need not import this module) and
are re-exported here.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from osa_lab.arguments import (
    USAGE_ERROR,
    ArgumentParser,
    check_output_dir,
    check_output_file,
    finite_float,
    is_user_error,
    nonnegative_int,
    one_line,
    positive_float,
    positive_int,
    run_command,
)
from osa_lab.errors import UserError
from osa_lab.version import __version__

__all__ = [
    "SUBCOMMANDS",
    "build_parser",
    "main",
    "USAGE_ERROR",
    "ArgumentParser",
    "one_line",
    "positive_int",
    "nonnegative_int",
    "finite_float",
    "positive_float",
    "check_output_file",
    "check_output_dir",
    "is_user_error",
    "run_command",
]

#: sub-command → (module, one-line help: what the command does for its user)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("osa_lab.benchmarking.runner",
              "time OSA against softmax attention (SDPA) and dense OSA, CPU or GPU: speed and memory "
              "(table + CSV)"),
    "sweep": ("osa_lab.studies.depth",
              "rank collapse, spectra and Jacobian conditioning of model presets across depth (tidy CSV)"),
    "report": ("osa_lab.reporting.runner",
               "regenerate the report notebooks as offline HTML pages (reports/index.html)"),
    "dashboard": ("osa_lab.dashboard.cli",
                  "serve the interactive dashboard: OSA against softmax across depth"),
    "train": ("osa_lab.studies.training",
              "train presets on digits, MNIST or MNIST-1D: one run, a comparison, a tuned comparison "
              "or a named study"),
}  # fmt: skip

#: what ``osa-lab --help`` says the tool is for
DESCRIPTION = """\
Orthogonal Self-Attention (OSA, Zhang & Martens, arXiv 2602.05996) against softmax attention
in skipless, normless transformers. OSA mixes tokens with exp(S) v, where S = alpha (q k^T - k q^T)
is skew-symmetric, so the mixing matrix is orthogonal and keeps the tokens' rank through depth.
These commands time the layer, measure rank collapse and conditioning across depth, train small
ViTs, build the report notebooks and serve an interactive dashboard."""

#: what ``osa-lab --help`` shows below the command list
EPILOG = """\
examples:
  osa-lab report --quick                            the report notebooks, small sizes (reports/)
  osa-lab bench --quick                             time OSA against softmax attention (SDPA)
  osa-lab sweep --presets pure-osa pure-ssa --depth 24 --output sweep.csv
  osa-lab train --compare --data digits --output runs/digits
  osa-lab dashboard --show                          open the dashboard in a browser
  osa-lab COMMAND --help                            the options of one command

The Python API: from osa_lab import osa, OrthogonalSelfAttention (docs/osa.md has the details).
Every user error prints one line and exits with status 2."""


# --------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------


def build_parser() -> ArgumentParser:
    """The top-level parser; sub-command arguments are added lazily in :func:`main`."""
    parser = ArgumentParser(
        prog="osa-lab",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"osa-lab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``osa-lab`` console script; returns the exit status.

    0: success; 1: the sub-command ran but part of it failed (e.g. a notebook); 2: a user error
    (one line on stderr, no traceback); 130: interrupted.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:
        print(f"osa-lab {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        parser = build_parser()
        if argv and argv[0] not in ("-h", "--help"):
            try:
                parser.error(f"unknown command {argv[0]!r}; choose from {', '.join(SUBCOMMANDS)}")
            except SystemExit as stop:
                return int(stop.code or 0)
        parser.print_help()
        return 0 if argv else USAGE_ERROR
    name = argv[0]
    try:
        module = importlib.import_module(SUBCOMMANDS[name][0])
    except UserError as exc:  # e.g. a laboratory command without the ``lab`` extra
        print(f"osa-lab {name}: error: {one_line(exc)}", file=sys.stderr)
        return USAGE_ERROR
    return run_command(module, f"osa-lab {name}", SUBCOMMANDS[name][1], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
