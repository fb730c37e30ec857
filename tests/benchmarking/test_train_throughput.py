"""``benchmarks/train_throughput.py``: the per-setting targets and the spread across processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "train_throughput.py")
#: the smallest model the script builds: a few milliseconds a step
TINY = ["--sizes", "digits", "--repeat", "1", "--depth", "1", "--dim", "8", "--heads", "2", "--batch", "4",
        "--osa-methods", "auto", "--no-previous", "--no-pytorch-path"]  # fmt: skip


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env, timeout=600)


def test_processes_repeat_the_measurement_and_report_the_spread(tmp_path):
    out = tmp_path / "tt.csv"
    done = _run(*TINY, "--processes", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "process 1/2" in done.stderr and "process 2/2" in done.stderr  # progress
    rows = pd.read_csv(out)
    assert sorted(set(rows["process"])) == [1, 2]
    assert len(rows) == 2 * 4  # vit, skipless-ssa, skipless-osa auto, exp(S) skipped; per process
    assert rows["cpu_kernels"].notna().all() and rows["torch_cpu_isa"].notna().all()  # what ran, beside the figures
    spread = pd.read_csv(tmp_path / "tt_spread.csv", keep_default_na=False)
    assert len(spread) == 4 and set(spread["processes"]) == {2}
    for _, row in spread.iterrows():
        ratios = rows.loc[(rows["preset"] == row["preset"]) & (rows["osa_method"] == row["osa_method"]), "cpu_ratio_to_vit"]
        assert row["cpu_ratio_min"] == ratios.min() and row["cpu_ratio_max"] == ratios.max()
        assert row["cpu_ratio_median"] == ratios.median()
    vit = spread[spread["preset"] == "vit"].iloc[0]
    assert vit["cpu_ratio_median"] == 1.0 and vit["target"] == ""
    osa = spread[(spread["preset"] == "skipless-osa") & (spread["osa_method"] == "auto")].iloc[0]
    assert osa["target"] == "≤ 1.5"  # the digits setting's target


def test_the_pytorch_path_row_runs_the_small_n_action_without_the_cpu_kernels(tmp_path):
    """``auto (PyTorch path)`` beside ``auto``: the same step with ``OSA_LAB_CPU_KERNELS=0`` inside
    its calls only, restored after them."""
    from osa_lab.ops import cpu

    before = os.environ.get("OSA_LAB_CPU_KERNELS")
    with cpu.turned_off():  # what the row's calls run inside
        assert not cpu.enabled()
    assert os.environ.get("OSA_LAB_CPU_KERNELS") == before
    out = tmp_path / "tt.csv"
    done = _run(*[a for a in TINY if a != "--no-pytorch-path"], "--out", str(out))
    assert done.returncode == 0, done.stderr
    methods = set(pd.read_csv(out)["osa_method"])
    assert {"auto", "auto (PyTorch path)"} <= methods


def test_each_setting_carries_its_own_target():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import train_throughput
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    assert train_throughput.TARGETS == {"digits": "≤ 1.5", "mnist1d": "≤ 1.2", "mnist": "≤ 1.35"}
    assert {name.split()[0] for name, *_ in train_throughput.SIZES} == set(train_throughput.TARGETS)


def test_a_bad_process_count_is_one_line_and_exit_2():
    done = _run("--processes", "0")
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr.strip().splitlines()[-1].endswith("must be an int ≥ 1, got '0'")
    assert len(done.stderr.strip().splitlines()) == 2  # the usage hint and the message


def test_a_baseline_revision_runs_in_the_same_rounds(tmp_path):
    """``--baseline HEAD``: the same network from the revision's package, a row of its own, and
    the paired ratio of the current ``auto`` row to it (quartiles in order)."""
    out = tmp_path / "tt.csv"
    done = _run(*TINY, "--repeat", "3", "--no-breakdown", "--baseline", "HEAD", "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = pd.read_csv(out).set_index("osa_method")
    assert list(rows.index) == ["—", "—", "auto", "auto at HEAD"]
    assert rows.loc["auto at HEAD", "cpu_ms_per_step"] > 0
    auto = rows.loc["auto"]
    assert all(auto[c] > 0 for c in ("paired_ratio_q1", "paired_ratio", "paired_ratio_q3"))  # present, not NaN
    assert rows.loc[["—", "auto at HEAD"], "paired_ratio"].isna().all()


def test_a_bad_baseline_is_one_line_and_exit_2():
    for args, message in (
        (["--baseline", "no-such-revision", "--repeat", "2"], "is not a commit of this repository"),
        (["--baseline", "HEAD", "--repeat", "1"], "--baseline needs --repeat 2 or more"),
        (["--baseline", "HEAD", "--repeat", "2", "--osa-methods", "qr"], "keep auto in --osa-methods"),
    ):
        done = _run(*TINY[:2], *args)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 2 and message in lines[-1], (args, lines)
