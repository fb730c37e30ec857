"""``benchmarks/cpu_build_ab.py``: builds of the CPU kernels timed against each other in one process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "cpu_build_ab.py")
HAVE_COMPILER = shutil.which(os.environ.get("CC", "cc")) is not None


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {key: value for key, value in os.environ.items() if not key.startswith("OSA_LAB_CPU_")}
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=600,
                          env=dict(base, PYTHONPATH=ROOT, **env))  # fmt: skip


@pytest.mark.skipif(not HAVE_COMPILER, reason="no C compiler: the kernels cannot be built here")
def test_every_build_is_timed_at_every_n_against_the_first(tmp_path):
    out = tmp_path / "ab.csv"
    done = _run("--variant", "base=native", "--variant", "mr2=native:MR=2", "--n", "12", "40", "--batch", "2",
                "--rounds", "2", "--calls", "1", "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(out)
    assert list(zip(table["variant"], table["N"], strict=True)) == [("base", 12), ("mr2", 12), ("base", 40), ("mr2", 40)]
    assert (table.loc[table["variant"] == "base", "ratio_to_first"] == 1.0).all()
    assert (table["ms_median"] > 0).all() and (table["ratio_to_first"] > 0).all()
    assert list(table.loc[table["variant"] == "mr2", "defines"]) == ["MR=2", "MR=2"]
    assert all("-DMR=2" in status for status in table.loc[table["variant"] == "mr2", "cpu_kernels"])
    assert table["torch_cpu_isa"].notna().all() and set(table["rounds"]) == {2} and set(table["calls"]) == {1}


@pytest.mark.skipif(not HAVE_COMPILER, reason="no C compiler: the kernels cannot be built here")
def test_head_split_views_and_the_prefetch_distance(tmp_path):
    """``--heads 2``: osa() on a layer's head-split views; a build without the prefetch is timed
    against the default (the same results, so it is timed at all)."""
    out = tmp_path / "ab.csv"
    done = _run("--variant", "base=native", "--variant", "noprefetch=native:PREFETCH_AHEAD=0", "--n", "20",
                "--batch", "4", "--heads", "2", "--rounds", "2", "--calls", "1", "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(out)
    assert list(table["variant"]) == ["base", "noprefetch"] and set(table["heads"]) == {2}
    assert "-DPREFETCH_AHEAD=0" in table.loc[1, "cpu_kernels"] and (table["ms_median"] > 0).all()


@pytest.mark.skipif(not HAVE_COMPILER, reason="no C compiler: the kernels cannot be built here")
def test_a_build_that_computes_something_else_is_not_timed(tmp_path, monkeypatch, capsys):
    """Before timing, every build's output and gradients are compared with the first build's."""
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        import cpu_build_ab
    finally:
        sys.path.remove(os.path.dirname(SCRIPT))
    monkeypatch.setattr(cpu_build_ab, "_largest_difference", lambda first, other: 0.5)
    out = tmp_path / "ab.csv"
    code = cpu_build_ab.main(["--variant", "a=native", "--variant", "b=native:MR=2", "--n", "12", "--batch", "2",
                              "--rounds", "1", "--calls", "1", "--out", str(out)])  # fmt: skip
    assert code == 2 and "differs from 'a'" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--variant", "a=native"], "at least two"),
        (["--variant", "a=native", "--variant", "a=native"], "different names"),
        (["--variant", "a", "--variant", "b=native"], "NAME=MARCH"),
        (["--variant", "a=native:MR=x", "--variant", "b=native"], "NAME=INT"),
        (["--variant", "a=native;ls", "--variant", "b=native"], "not a -march name"),
        (["--variant", "a=native:mr=3", "--variant", "b=native"], "not a register block"),
        (["--variant", "a=native:TN_ROWS=3", "--variant", "b=native"], "must divide 16"),
        (["--variant", "a=native", "--variant", "b=native", "--batch", "6", "--heads", "4"], "not a multiple of --heads"),
    ],
)
def test_a_bad_variant_is_one_line_and_exit_2(tmp_path, args, says):
    out = tmp_path / "x.csv"
    done = _run(*args, "--out", str(out))
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not out.exists()


def test_turned_off_kernels_are_one_line_and_exit_2(tmp_path):
    done = _run("--variant", "a=native", "--variant", "b=native", "--out", str(tmp_path / "x.csv"), OSA_LAB_CPU_KERNELS="0")
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "turned off" in done.stderr
