"""Shared test helpers: input generators and error measures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

_ROOT = Path(__file__).resolve().parent.parent

def run_benchmark(name: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``python benchmarks/<name>.py *args`` in a fresh process with this checkout on PYTHONPATH
    (captured text output)."""
    env = dict(os.environ, PYTHONPATH=str(_ROOT))
    script = _ROOT / "benchmarks" / f"{name}.py"
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=timeout)


def small_classifier(preset: str, depth: int, *, dim: int = 16, heads: int = 2, side: int = 4):
    """A preset built as a token classifier of ``side``² one-pixel patches (tokens) of a 1-channel image,
    seed 0: small enough for exact Jacobians."""
    from osa_lab import get_preset
    from osa_lab.nn.models import build_classifier

    cfg = get_preset(preset, depth=depth, dim=dim, heads=heads, tokens=side * side, seed=0, input="patches",
                     image_size=side, patch_size=1, channels=1)  # fmt: skip
    return build_classifier(cfg)


def small_images(count: int = 2, side: int = 4) -> torch.Tensor:
    """``count`` seeded Gaussian 1-channel images of ``side`` × ``side`` pixels (inputs of :func:`small_classifier`)."""
    return torch.randn(count, 1, side, side, generator=torch.Generator().manual_seed(1))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative Frobenius error ‖a − b‖ / ‖b‖ computed in float64 (0 when both are 0)."""
    a, b = a.detach().double(), b.detach().double()
    denom = torch.linalg.vector_norm(b)
    num = torch.linalg.vector_norm(a - b)
    return float(num / denom) if denom > 0 else float(num)


def autograd_node_names(y: torch.Tensor) -> set[str]:
    """The class names of every autograd node behind ``y`` (which path a computation took)."""
    seen, stack = set(), [y.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        stack.extend(f for f, _ in fn.next_functions)
    return {type(f).__name__ for f in seen}


def make_qk(kind: str, n: int, r: int, *, batch: tuple[int, ...] = (), dtype=torch.float64, seed: int = 0):
    """q, k of shape (*batch, n, r): ``random``, ``equal`` (k = q), ``zero`` or ``parallel`` (k ≈ q)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, n, r, generator=g, dtype=torch.float64)
    if kind == "random":
        k = torch.randn(*batch, n, r, generator=g, dtype=torch.float64)
    elif kind == "equal":
        k = q.clone()
    elif kind == "zero":
        q = torch.zeros_like(q)
        k = torch.zeros_like(q)
    elif kind == "parallel":
        k = q + 1e-4 * torch.randn(*batch, n, r, generator=g, dtype=torch.float64)
    else:
        raise ValueError(kind)
    return q.to(dtype), k.to(dtype)


#: the ``kind`` values of :func:`qkv_of_kind` that make ``[q k]`` rank-deficient by construction
DEGENERATE_KINDS = ("q=k", "k=2q", "q=0")


def qkv_of_kind(
    kind: str, batch: tuple[int, ...], n: int, r: int, d: int, *, seed: int, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k ``(*batch, n, r)`` and v ``(*batch, n, d)``, drawn in that order in float64 from ``seed``.

    ``kind``: ``"random"``, or one of :data:`DEGENERATE_KINDS` (``k = q``, ``k = 2q``, ``q = 0``),
    for which ``[q k]`` has rank below 2r; a short sequence (n < 2r) does the same
    for any kind. Cast to ``dtype`` last, so every dtype sees the same values.
    """
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, n, r, dtype=torch.float64, generator=g)
    k = torch.randn(*batch, n, r, dtype=torch.float64, generator=g)
    v = torch.randn(*batch, n, d, dtype=torch.float64, generator=g)
    if kind == "q=k":
        k = q.clone()
    elif kind == "k=2q":
        k = 2 * q
    elif kind == "q=0":
        q = torch.zeros_like(q)
    elif kind != "random":
        raise ValueError(kind)
    return q.to(dtype), k.to(dtype), v.to(dtype)


# ------------------------------------------------------------------------------------------------
# CLI error harness: a user error exits 2 with one line and leaves no files behind
# ------------------------------------------------------------------------------------------------


def _files_under(folders) -> set[str]:
    import os

    found: set[str] = set()
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            found.update(os.path.join(root, name) for name in [*dirs, *files])
    return found


def _check_error_output(argv: list[str], rc: int, err: str, match: str | None) -> str:
    import re

    command = argv[0] if argv and not argv[0].startswith("-") else ""
    assert rc == 2, f"osa-lab {' '.join(argv)}: exit status {rc}, expected 2; stderr:\n{err}"
    assert "Traceback" not in err, f"osa-lab {' '.join(argv)} printed a traceback:\n{err}"
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("usage:")]
    assert len(lines) == 1, f"osa-lab {' '.join(argv)}: expected one error line, got {len(lines)}:\n{err}"
    prefix = "osa-lab: error: " if command not in _subcommands() else f"osa-lab {command}: error: "
    assert lines[0].startswith(prefix), f"error line does not start with {prefix!r}: {lines[0]!r}"
    usage = [line for line in err.splitlines() if line.startswith("usage:")]
    assert len(usage) <= 1, f"usage printed over several lines:\n{err}"
    if match is not None:
        assert re.search(match, lines[0]), f"error line does not name the problem ({match!r}): {lines[0]!r}"
    return lines[0]


def _subcommands() -> set[str]:
    from osa_lab.cli import SUBCOMMANDS

    return set(SUBCOMMANDS)


def assert_cli_user_error(argv: list[str], match: str | None = None, *, watch=()) -> str:
    """Run ``osa_lab.cli.main(argv)`` in-process and assert a clean user error.

    Asserts: exit status 2; nothing on stderr but at most one ``usage:`` line and exactly one
    ``osa-lab <cmd>: error: …`` line that matches the regex ``match``; no ``Traceback``; and
    no file or folder created under any of the folders in ``watch`` (no partial outputs).
    Returns the error line. Argparse's ``SystemExit`` is caught (``main`` returns for it too).
    """
    import contextlib
    import io

    from osa_lab.cli import main

    before = _files_under(watch)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as stop:  # pragma: no cover - main returns; kept for direct parsers
            rc = stop.code if isinstance(stop.code, int) else 2
    line = _check_error_output(list(argv), rc, err.getvalue(), match)
    created = sorted(_files_under(watch) - before)
    assert not created, f"osa-lab {' '.join(argv)} left files behind: {created}"
    return line


def assert_cli_user_error_subprocess(argv: list[str], match: str | None = None, *, watch=(), cwd=None,
                                     timeout: float = 300) -> str:
    """Like :func:`assert_cli_user_error`, but runs ``python -m osa_lab.cli`` in a subprocess, so
    the terminal output is what a user sees (proves no traceback reaches it)."""
    import subprocess
    import sys

    before = _files_under(watch)
    proc = subprocess.run([sys.executable, "-m", "osa_lab.cli", *argv], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)
    line = _check_error_output(list(argv), proc.returncode, proc.stderr, match)
    created = sorted(_files_under(watch) - before)
    assert not created, f"osa-lab {' '.join(argv)} left files behind: {created}"
    return line


def skip_without_inductor_compiler() -> None:
    """Skip the calling test where torch.compile's default (inductor) backend has no C++ compiler."""
    import shutil

    import pytest
    from torch._inductor import cpp_builder

    try:
        compiler = cpp_builder.get_cpp_compiler()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"torch.compile's inductor backend needs a C++ compiler: {exc}")
    if shutil.which(compiler) is None:
        pytest.skip(f"torch.compile's inductor backend needs the C++ compiler {compiler!r}, not found")
