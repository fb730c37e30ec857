"""``benchmarks/osa_call_overhead.py``: osa() against the fused action alone, timed and op-counted."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "osa_call_overhead.py")


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env, timeout=600)


def test_the_benchmark_times_and_counts_both_calls(tmp_path):
    out = tmp_path / "overhead.csv"
    done = _run("--sizes", "6", "12", "--batch", "2", "--heads", "2", "--head-dim", "4", "--repeat", "2",
                "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = pd.read_csv(out)
    assert list(rows["N"]) == [6] * 3 + [12] * 3
    assert list(rows["call"]) == ["osa()", "osa() on (b, N, r)", "fused action alone"] * 2
    assert (rows["ms_fwd_bwd"] > 0).all()
    fused = rows[rows["call"] == "fused action alone"]
    assert (fused["overhead_ms"] == 0).all()
    # osa() dispatches the fused action's operations and more (checks, α's chain), and from the
    # head-split views the copies to and from (b, N, r) besides
    for n in (6, 12):
        ops = rows[rows["N"] == n].set_index("call")["aten_ops"]
        assert ops["osa()"] > ops["osa() on (b, N, r)"] > ops["fused action alone"] > 0
    assert "git_commit" in rows.columns  # provenance in the CSV


def test_a_size_outside_the_fused_path_is_one_line_and_exit_2():
    done = _run("--sizes", "80", "--head-dim", "16")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and "N = 80 is above 4r = 64" in lines[-1]


def _git_knows_head() -> bool:
    try:
        return subprocess.run(["git", "rev-parse", "--verify", "HEAD"], cwd=ROOT, capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not _git_knows_head(), reason="needs a git checkout with git on PATH")
def test_a_baseline_revision_is_timed_in_the_same_rounds(tmp_path):
    """``--baseline HEAD`` exports the committed package, imports it beside the working tree's and
    reports the per-round ratio on the ``osa()`` row."""
    out = tmp_path / "overhead.csv"
    done = _run("--sizes", "6", "--batch", "2", "--heads", "2", "--head-dim", "4", "--repeat", "4",
                "--baseline", "HEAD", "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = pd.read_csv(out).set_index("call")
    assert list(rows.index) == ["osa()", "osa() on (b, N, r)", "fused action alone", "osa() at HEAD"]
    assert rows.loc["osa() at HEAD", "ms_fwd_bwd"] > 0
    mine = rows.loc["osa()"]
    assert 0 < mine["paired_ratio_q1"] <= mine["paired_ratio"] <= mine["paired_ratio_q3"]
    assert rows.loc[["osa() on (b, N, r)", "osa() at HEAD"], "paired_ratio"].isna().all()


def test_an_unknown_baseline_is_one_line_and_exit_2():
    done = _run("--sizes", "6", "--baseline", "no-such-revision")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and "is not a commit of this repository" in lines[-1]


def test_a_baseline_with_one_round_is_one_line_and_exit_2():
    done = _run("--sizes", "6", "--repeat", "1", "--baseline", "HEAD")
    assert done.returncode == 2
    assert "--baseline needs --repeat 2 or more" in done.stderr.strip().splitlines()[-1]


def test_a_baseline_outside_a_git_checkout_is_one_line_and_exit_2(tmp_path):
    """The script and the package copied outside any checkout (as from an exported tree): the
    revision is looked up in the package's own checkout, and there is none."""
    copy = tmp_path / "benchmarks" / "osa_call_overhead.py"
    copy.parent.mkdir()
    copy.write_text(open(SCRIPT, encoding="utf-8").read(), encoding="utf-8")
    shutil.copytree(os.path.join(ROOT, "osa_lab"), tmp_path / "osa_lab", ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(tmp_path), GIT_CEILING_DIRECTORIES=str(tmp_path))
    done = subprocess.run([sys.executable, str(copy), "--sizes", "6", "--baseline", "HEAD"],
                          capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and "git rev-parse failed" in lines[-1], lines
