"""Command-line building blocks shared by ``osa-lab`` and its sub-commands.

Argument types (:func:`positive_int`, :func:`nonnegative_int`, :func:`finite_float`,
:func:`positive_float`), output checks that run before any work starts
(:func:`check_output_file`, :func:`check_output_dir`), the two-line-error
:class:`ArgumentParser` and :func:`run_command`, which runs one sub-command module with the
one-line-error rule of :mod:`osa_lab.cli` (``is_user_error`` is re-exported from
:mod:`osa_lab.errors`). This module sits on the bottom floor beside
:mod:`osa_lab.errors`, so a study or runner can check its arguments without importing the
command line that dispatches to it (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import NoReturn

from osa_lab.errors import OutputPathError, is_user_error

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


def run_command(module: ModuleType, prog: str, description: str, argv: list[str]) -> int:
    """Parse ``argv`` with ``module.add_arguments`` and call ``module.run(args)``; the exit status.

    One sub-command of ``osa-lab`` (``module`` provides ``add_arguments(parser)`` and
    ``run(args) -> int``). A user error (:class:`~osa_lab.errors.UserError`, see
    :func:`~osa_lab.errors.is_user_error`) prints one ``PROG: error: …`` line and returns 2;
    anything else keeps its traceback.
    """
    parser = ArgumentParser(prog=prog, description=description)
    module.add_arguments(parser)
    try:
        args = parser.parse_args(argv)
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
