"""The ``osa-lab`` command line: one sub-command per capability, each in its own module.

Each module listed in ``SUBCOMMANDS`` provides ``add_arguments(parser)`` and
``run(args) -> int``; modules are imported only when their sub-command runs, so
``osa-lab bench`` does not import Panel or papermill.

Errors: a user error never shows a Python traceback. Bad arguments (argparse) print a one-line
usage and one ``osa-lab <cmd>: error: <message>`` line; a typed osa_lab error raised by a
sub-command (any exception class defined in ``osa_lab``, e.g. :class:`~osa_lab.errors.ConfigurationError`,
:class:`~osa_lab.errors.OutputPathError`, ``ReportError``, ``MissingDataError``) prints the same
one line. Both exit with status 2. Anything else is a bug and keeps its traceback; set
``OSA_LAB_TRACEBACK=1`` to see the traceback of a user error too.

The helpers :func:`positive_int`, :func:`nonnegative_int`, :func:`finite_float`,
:func:`positive_float`, :func:`check_output_file` and :func:`check_output_dir` are shared by the
sub-commands so that every bad value is refused before any work starts.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

from osa_lab.errors import OutputPathError

#: sub-command → (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("osa_lab.benchmarking.runner", "CPU/GPU speed and memory benchmark of OSA vs SDPA (table + CSV)"),
    "sweep": ("osa_lab.studies.depth", "rank-collapse / spectrum sweep across depth (tidy CSV)"),
    "report": ("osa_lab.reporting.runner", "execute the report notebooks with papermill into reports/"),
    "dashboard": ("osa_lab.dashboard_cli", "serve the Panel dashboard"),
    "train": ("osa_lab.studies.training", "train a (skipless) ViT preset on digits / MNIST / synthetic data"),
}

#: Exit status of a user error (bad arguments, impossible configuration, unwritable output).
USAGE_ERROR = 2


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose errors are two short lines: usage hint and message.

    argparse's own usage line of a sub-command with many options wraps over many lines; on an
    error this prints ``usage: PROG [options] (PROG --help lists them)`` and
    ``PROG: error: MESSAGE`` (newlines in the message folded), then exits with status 2.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(
            USAGE_ERROR,
            f"usage: {self.prog} [options]  ({self.prog} --help lists them)\n"
            f"{self.prog}: error: {one_line(message)}\n",
        )


def one_line(message: object) -> str:
    """``message`` with its lines joined by single spaces (the CLI prints one line per error)."""
    return " ".join(str(message).split())


# --------------------------------------------------------------------------------------------
# argument types (argparse ``type=``): the flag name is added by argparse
# --------------------------------------------------------------------------------------------


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None


def positive_int(text: str) -> int:
    """argparse type: an int ≥ 1."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int ≥ 1, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    """argparse type: an int ≥ 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an int ≥ 0, got {text!r}")
    return value


def finite_float(text: str) -> float:
    """argparse type: a finite float (refuses ``nan``, ``inf``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


# --------------------------------------------------------------------------------------------
# output paths: checked before any computation, nothing is created
# --------------------------------------------------------------------------------------------


def _existing_ancestor(path: Path) -> Path:
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            return parent
    return Path(path.anchor or ".")


def _check_can_create_in(folder: Path, path: Path, flag: str) -> None:
    """Raise unless a file can be created in the existing directory ``folder``."""
    if not folder.is_dir():
        raise OutputPathError(
            f"{flag} {path}: {folder} is a file, not a directory; choose another path or remove that file"
        )
    try:  # a real probe: os.access is wrong for root, read-only file systems and ACLs
        fd, probe = tempfile.mkstemp(prefix=".osa-lab-write-probe-", dir=folder)
    except OSError as exc:
        raise OutputPathError(
            f"{flag} {path}: cannot write in {folder} ({exc.strerror or exc}); choose a writable location"
        ) from None
    os.close(fd)
    os.unlink(probe)


def check_output_file(path: str | os.PathLike[str], flag: str = "--output") -> Path:
    """Check that the file ``path`` can be written (created, or overwritten), creating nothing.

    Missing parent folders are fine (the writer creates them) as long as the nearest existing
    ancestor is a writable directory. Raises :class:`~osa_lab.errors.OutputPathError` naming
    ``flag`` for a directory at ``path``, a file where a parent folder should be, or a read-only
    location. Returns ``Path(path)``.
    """
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(f"{flag} {path} is a directory; give a file name, e.g. {path / 'results.csv'}")
    if path.exists():
        if not path.is_file():
            raise OutputPathError(f"{flag} {path} exists and is not a regular file; choose another path")
        if not os.access(path, os.W_OK):
            raise OutputPathError(f"{flag} {path} is read-only; choose another path or make it writable")
    _check_can_create_in(_existing_ancestor(path), path, flag)
    return path


def check_output_dir(path: str | os.PathLike[str], flag: str = "--output") -> Path:
    """Check that files can be written in the folder ``path`` (existing or to be created).

    Raises :class:`~osa_lab.errors.OutputPathError` naming ``flag`` when ``path`` is a file,
    sits below a file, or is (or would be created in) a read-only location. Creates nothing.
    Returns ``Path(path)``.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{flag} {path} is a file, not a directory; give a folder path")
    folder = path if path.is_dir() else _existing_ancestor(path)
    _check_can_create_in(folder, path, flag)
    return path


# --------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------


def build_parser() -> ArgumentParser:
    """The top-level parser; sub-command arguments are added lazily in :func:`main`."""
    parser = ArgumentParser(prog="osa-lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def is_user_error(exc: BaseException) -> bool:
    """True for the typed errors of osa_lab: any exception whose class (or a base) osa_lab defines."""
    return any(cls.__module__.split(".")[0] == "osa_lab" for cls in type(exc).__mro__)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``osa-lab`` console script; returns the exit status.

    0: success; 1: the sub-command ran but part of it failed (e.g. a notebook); 2: a user error
    (one line on stderr, no traceback); 130: interrupted.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
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
    prog = f"osa-lab {name}"
    module = importlib.import_module(SUBCOMMANDS[name][0])
    parser = ArgumentParser(prog=prog, description=SUBCOMMANDS[name][1])
    module.add_arguments(parser)
    try:
        args = parser.parse_args(argv[1:])
    except SystemExit as stop:  # --help (0) or a bad argument (2, message already printed)
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else USAGE_ERROR)
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if not is_user_error(exc) or os.environ.get("OSA_LAB_TRACEBACK"):
            raise
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
