"""``benchmarks/cpu_kernel_passes.py``: every pass timed against its reference, a CSV written."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest
import torch

from osa_lab.ops import cpu
from osa_lab.ops.cpu import gram_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "cpu_kernel_passes.py")


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=ROOT, **env))  # fmt: skip


@pytest.mark.skipif(not gram_kernels.usable(torch.ones(1, 4, 16)), reason="needs the kernels (an AVX-512 or AVX2 build)")
def test_every_pass_is_timed_against_its_reference(tmp_path):
    out = tmp_path / "passes.csv"
    done = _run("--n", "96", "--heads", "2", "--r", "16", "--d", "16", "--repeat", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(out)
    passes = list(table["pass"])
    assert passes[:5] == ["Gram/projection", "output", "core product (float64)", "osa forward", "osa forward+backward"]
    assert any(p.startswith("threads:") for p in passes)
    assert (table["kernels_ms"] > 0).all() and (table["torch_ms"] > 0).all()
    assert set(table["cpu_kernels"]) == {cpu.status()}


def test_a_bad_argument_or_no_kernels_is_one_line_and_exit_2(tmp_path):
    done = _run("--n", "0", "--out", str(tmp_path / "x.csv"))
    assert done.returncode == 2 and "--n" in done.stderr and "Traceback" not in done.stderr
    done = _run("--out", str(tmp_path / "x.csv"), OSA_LAB_CPU_KERNELS="0")
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "not in use" in done.stderr
    assert not (tmp_path / "x.csv").exists()
