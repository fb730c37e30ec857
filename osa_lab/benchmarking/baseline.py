"""Before/after in one process: the package as it was at a git revision, imported beside the
working tree's as ``osa_lab_baseline``, so that a benchmark times both in the same interleaved
rounds (between processes this machine's speed drifts by more than most changes move a step).

Used by ``benchmarks/osa_call_overhead.py``, ``benchmarks/train_throughput.py``,
``benchmarks/trained_layer_action.py`` and ``benchmarks/pool_growth.py`` (``--baseline REV``).
The revision is exported from this checkout's own history with ``git archive`` (regular files
only, no path outside the folder); every ``osa_lab`` name in its Python sources is renamed, and
its CPU kernels build from its own C sources.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

#: The name the revision's package is imported under.
BASELINE_PACKAGE = "osa_lab_baseline"


def _git(*args: str) -> subprocess.CompletedProcess:
    """``git args`` in the checkout holding this package; ValueError naming the problem when git
    is missing or fails."""
    root = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True)
    except FileNotFoundError as exc:
        raise ValueError("--baseline needs git on PATH") from exc
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()
        raise ValueError(f"git {args[0]} failed in {root}: {why[-1] if why else 'no message'}")
    return done


def import_revision(rev: str, folder: Path) -> ModuleType:
    """The package at git revision ``rev``, exported into ``folder`` and imported as
    :data:`BASELINE_PACKAGE`. Raises ValueError outside a git checkout, without git, or for a
    revision git does not know. One revision per process (the name is taken once)."""
    if BASELINE_PACKAGE in sys.modules:
        raise ValueError(f"a baseline is imported already ({sys.modules[BASELINE_PACKAGE].__file__})")
    _git("rev-parse", "--show-toplevel")  # a checkout at all (an exported tree has no history)
    try:
        commit = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").stdout.decode().strip()
    except ValueError:
        raise ValueError(f"--baseline {rev!r} is not a commit of this repository (try a hash from `git log`)") from None
    archive = _git("archive", "--format=tar", commit, "osa_lab").stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:  # our own history; regular files only
        for member in tar.getmembers():
            target = folder / member.name
            if member.isfile() and ".." not in Path(member.name).parts and not Path(member.name).is_absolute():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
    package = folder / BASELINE_PACKAGE
    (folder / "osa_lab").rename(package)
    for source in package.rglob("*.py"):
        text = source.read_text(encoding="utf-8")
        source.write_text(re.sub(r"\bosa_lab\b", BASELINE_PACKAGE, text), encoding="utf-8")
    sys.path.insert(0, str(folder))
    return importlib.import_module(BASELINE_PACKAGE)


def paired_quartiles(current: list[float], baseline: list[float]) -> dict[str, float]:
    """Quartiles of the per-round ratios ``current ÷ baseline`` (both timed in the same rounds):
    ``paired_ratio_q1``, ``paired_ratio`` (the median) and ``paired_ratio_q3``."""
    ratios = [a / b for a, b in zip(current, baseline, strict=True)]
    names = ("paired_ratio_q1", "paired_ratio", "paired_ratio_q3")
    return dict(zip(names, statistics.quantiles(ratios, n=4), strict=True))


def baseline_problem(rev: str | None, repeat: int) -> str | None:
    """What is wrong with ``--baseline rev`` for ``repeat`` rounds (the paired ratio's quartiles
    need two), or None."""
    return "--baseline needs --repeat 2 or more (the paired ratio's quartiles)" if rev and repeat < 2 else None


@contextlib.contextmanager
def baseline_package(rev: str | None, error: Callable[[str], object]) -> Iterator[ModuleType | None]:
    """The package at ``rev`` for the block, exported into a temporary folder removed after it
    (None without a revision); a revision that cannot be imported goes to ``error`` (a parser's
    ``error``: one line and exit 2)."""
    if not rev:
        yield None
        return
    with tempfile.TemporaryDirectory() as folder:
        try:
            package = import_revision(rev, Path(folder))
        except ValueError as exc:
            error(str(exc))
            raise  # error() exits; should it return, the ValueError stands
        yield package
