"""The benchmark harness: interleaved timing and the `osa-lab bench` table (no timing assertions)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from osa_lab import bench
from osa_lab.benchtools import time_interleaved
from tests.helpers import assert_cli_user_error


def test_time_interleaved_alternates_calls_and_honours_fewer_rounds():
    calls: list[str] = []
    medians = time_interleaved(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeat={"a": 3, "b": 1}, warmup=1
    )
    assert calls == ["a", "b", "a", "b", "a", "a"]  # warm-up a, b; then rounds: a b | a | a
    assert set(medians) == {"a", "b"} and all(t >= 0 for t in medians.values())
    calls.clear()
    time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeat={"a": 2}, warmup=0)
    assert calls == ["a", "b", "a", "b"]  # a name left out of the dict runs every round


def test_bench_quick_writes_the_table(tmp_path, capsys):
    out = tmp_path / "core.csv"
    assert bench.main(["--quick", "--repeat", "1", "--memory-sizes", "--output", str(out)]) == 0
    table = pd.read_csv(out)
    expected = {"lowrank_fwd_s", "sdpa_fwd_s", "dense_fwd_s", "matmul_gflops", "matmul_fraction", "speedup_fwd_vs_sdpa"}
    assert expected <= set(table.columns)
    assert list(table["N"]) == [64, 256]
    assert (table["lowrank_fwd_s"] > 0).all() and (table["matmul_gflops"] > 0).all()
    assert "OSA low-rank vs SDPA" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--sizes", "0"], "--sizes"),  # was: a traceback
        (["--sizes", "-5"], "--sizes"),
        (["--repeat", "0"], "--repeat"),
        (["--r", "0"], "--r"),
        (["--d", "0"], "--d"),
        (["--memory-sizes", "0"], "--memory-sizes"),
        (["--bh", "0"], "--bh"),  # was: exit 0 with a meaningless row
    ],
)
def test_bench_refuses_non_positive_sizes(tmp_path, argv, match):
    assert_cli_user_error(["bench", "--quick", "--output", str(tmp_path / "c.csv"), *argv], match, watch=[tmp_path])


def test_bench_unwritable_output_is_refused_before_timing(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "time_row", lambda *a, **k: pytest.fail("timed before checking --output"))
    (tmp_path / "afile").write_text("x")
    assert_cli_user_error(["bench", "--quick", "--output", str(tmp_path)], "is a directory", watch=[tmp_path])
    assert_cli_user_error(["bench", "--quick", "--output", str(tmp_path / "afile" / "c.csv")], "is a file",
                          watch=[tmp_path])  # fmt: skip
    if not torch.cuda.is_available():
        assert_cli_user_error(["bench", "--device", "cuda", "--output", str(tmp_path / "c.csv")], "CUDA",
                              watch=[tmp_path])  # fmt: skip
