"""The benchmark harness: interleaved timing and the `osa-lab bench` table (no timing assertions)."""

from __future__ import annotations

import mmap

import pandas as pd
import pytest
import torch

from osa_lab.benchmarking import runner as bench
from osa_lab.benchmarking.timing import count_matmul_flops, interleaved_rounds, time_interleaved
from osa_lab.ops import cpu
from osa_lab.ops.cpu import gram_kernels
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


def test_interleaved_rounds_counts_the_page_faults_of_fresh_memory():
    """``faults=``: minor page faults per call, per round; a call that writes every 4 KiB page of
    8 MiB freshly mapped from the kernel faults at least once per page, one that maps nothing
    about never."""
    pages = 2048

    def fresh() -> None:
        with mmap.mmap(-1, pages * 4096) as block:
            if hasattr(mmap, "MADV_NOHUGEPAGE"):  # 4 KiB pages even where huge pages are always on
                block.madvise(mmap.MADV_NOHUGEPAGE)
            for page in range(pages):
                block[page * 4096] = 1

    faults: dict = {}
    wall, cpu_time = interleaved_rounds({"fresh": fresh, "idle": lambda: None}, 3, warmup=1, faults=faults)
    assert set(faults) == set(wall) == set(cpu_time) == {"fresh", "idle"}
    assert all(len(v) == 3 for v in faults.values())
    assert min(faults["fresh"]) >= pages
    assert max(faults["idle"]) < pages / 10


def test_bench_quick_writes_the_table(tmp_path, capsys):
    out = tmp_path / "core.csv"
    assert bench.main(["--quick", "--repeat", "1", "--memory-sizes", "--output", str(out)]) == 0
    table = pd.read_csv(out)
    expected = {"lowrank_fwd_s", "sdpa_fwd_s", "dense_fwd_s", "matmul_gflops", "matmul_fraction", "speedup_fwd_vs_sdpa"}
    assert expected <= set(table.columns)
    assert list(table["N"]) == [64, 256]
    assert (table["lowrank_fwd_s"] > 0).all() and (table["matmul_gflops"] > 0).all()
    printed = capsys.readouterr().out
    assert "OSA low-rank vs SDPA" in printed and "roofline per pass" in printed
    _check_roofline_table(pd.read_csv(tmp_path / "core_roofline.csv"), table)


def _check_roofline_table(roof: pd.DataFrame, main: pd.DataFrame) -> None:
    """The roofline CSV: its columns, positive limits, and numbers consistent with each other."""
    expected = {"N", "bh", "pass", "ms", "gflop_f32", "gflop_f64", "mbytes", "flop_ms", "byte_ms", "roofline_ms",
                "bound", "x_roofline", "f32_gflops", "f64_gflops", "copy_gbps", "target_x", "speedup_vs_sdpa"}
    assert expected <= set(roof.columns)
    assert list(roof["N"].unique()) == [256]
    passes = set(roof["pass"])
    assert {"Gram/projection", "core", "output", "whole forward", "whole forward+backward"} <= passes
    assert {"probe: copy (reused buffer)", "probe: f64 matmul 2r×2r (core)"} <= passes
    for col in ("ms", "roofline_ms", "x_roofline", "f32_gflops", "f64_gflops", "copy_gbps", "mbytes"):
        assert (roof[col] > 0).all(), col
    # roofline = max(flop time, byte time); time ÷ roofline is exactly that ratio
    assert roof["roofline_ms"].to_numpy() == pytest.approx(roof[["flop_ms", "byte_ms"]].max(axis=1).to_numpy())
    assert roof["x_roofline"].to_numpy() == pytest.approx((roof["ms"] / roof["roofline_ms"]).to_numpy())
    assert ((roof["bound"] == "flops") == (roof["flop_ms"] >= roof["byte_ms"])).all()
    # flop and byte times follow from the counts and the limits measured in the same row
    flop_ms = 1e3 * (roof["gflop_f32"] / roof["f32_gflops"] + roof["gflop_f64"] / roof["f64_gflops"])
    assert roof["flop_ms"].to_numpy() == pytest.approx(flop_ms.to_numpy())
    assert roof["byte_ms"].to_numpy() == pytest.approx((roof["mbytes"] / roof["copy_gbps"]).to_numpy())
    row = roof.set_index("pass")
    bh, n, r, d = 32, 256, 64, 64
    assert row.loc["output", "gflop_f32"] * 1e9 == pytest.approx(2 * bh * n * 2 * r * d)  # U C
    assert row.loc["Gram/projection", "gflop_f32"] * 1e9 == pytest.approx(2 * bh * n * (3 * r * r + 2 * r * d))
    assert row.loc["core", "gflop_f32"] == 0 and row.loc["core", "gflop_f64"] > 0
    assert row.loc["whole forward", "mbytes"] == pytest.approx(
        row.loc[["Gram/projection", "core", "output"], "mbytes"].sum())
    assert row.loc["whole forward+backward", "mbytes"] > row.loc["whole forward", "mbytes"]
    assert row.loc["whole forward+backward", "gflop_f32"] > row.loc["whole forward", "gflop_f32"]
    assert row.loc["whole forward", "target_x"] == 1.5 and row.loc["whole forward+backward", "target_x"] == 2.0
    # the kernels' status in every row, and the torch-path forward timed beside where they run the token passes
    used = gram_kernels.usable(torch.ones(1, 4, 64), torch.ones(1, 4, 64))
    assert set(roof["cpu_kernels"]) == {cpu.status()}
    assert set(roof["token_passes"]) == {"C kernels" if used else "torch"}
    assert ("whole forward (torch passes)" in passes) == used
    assert ("probe: f32 C kernel [q k]ᵀ[q k v]" in passes) == used  # the rate: the fastest product measured
    assert roof["f32_gflops"].iloc[0] * 1e9 == pytest.approx(max(
        row.loc[p, "gflop_f32"] * 1e9 / (row.loc[p, "ms"] / 1e3) for p in passes if p.startswith("probe: f32")))
    sdpa = main.set_index("N").loc[256]
    assert row.loc["whole forward", "speedup_vs_sdpa"] == pytest.approx(sdpa["speedup_fwd_vs_sdpa"])
    assert row.loc["whole forward+backward", "speedup_vs_sdpa"] == pytest.approx(sdpa["speedup_fwdbwd_vs_sdpa"])


def test_count_matmul_flops_splits_by_dtype_and_counts_backward():
    a = torch.randn(4, 10, 3, requires_grad=True)
    c = torch.randn(4, 10, 5, dtype=torch.float64)
    counts = count_matmul_flops(lambda: (a @ a.mT).double() @ c)
    assert counts == {torch.float32: 2 * 4 * 10 * 10 * 3, torch.float64: 2 * 4 * 10 * 10 * 5}
    fwd_bwd = count_matmul_flops(lambda: (a @ a.mT).sum().backward())
    assert fwd_bwd[torch.float32] == 3 * 2 * 4 * 10 * 10 * 3  # forward + two backward products
    y = torch.zeros(4, 10, 10)
    assert count_matmul_flops(lambda: y.baddbmm_(a.detach(), a.detach().mT)) == {torch.float32: 2 * 4 * 10 * 10 * 3}


def test_pass_bytes_counts_each_tensor_once():
    by = bench.pass_bytes(2, 100, 8, 4)
    assert by["Gram/projection"] == 2 * 100 * (16 + 4) * 4  # read q, k, v
    assert by["output"] == 2 * 100 * (16 + 8) * 4  # read q, k, v, write y
    assert by["whole forward"] == by["Gram/projection"] + by["core"] + by["output"]
    assert by["whole forward+backward"] == by["whole forward"] + 2 * 100 * (6 * 8 + 4 * 4) * 4 + 2 * by["core"]


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--sizes", "0"], "--sizes"),  # was: a traceback
        (["--sizes", "-5"], "--sizes"),
        (["--repeat", "0"], "--repeat"),
        (["--r", "0"], "--r"),
        (["--d", "0"], "--d"),
        (["--memory-sizes", "0"], "--memory-sizes"),
        (["--roofline-sizes", "0"], "--roofline-sizes"),
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


# size bounds: huge `--sizes` or `--r` are refused before anything is allocated
MEMORY_ROWS = [
    (["--sizes", "10000000"], r"--sizes 10000000 \(bh = 8\).*GiB.*--allow-large"),
    (["--sizes", "256", "--r", "100000"], r"--sizes 256 \(bh = 32\), r = 100000.*--allow-large"),
    (["--sizes", "64", "--memory-sizes", "100000000"], r"--memory-sizes 100000000 \(bh = 8\).*--allow-large"),
    (["--sizes", "64", "--roofline-sizes", "10000000"], r"--roofline-sizes 10000000.*--allow-large"),
]


@pytest.mark.parametrize(("extra", "match"), MEMORY_ROWS, ids=[" ".join(r[0]) for r in MEMORY_ROWS])
def test_bench_refuses_rows_over_the_memory_bound(tmp_path, monkeypatch, extra, match):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench, "available_memory_bytes", lambda device="cpu": 16 * 2**30)
    argv = ["bench", "--memory-sizes", "--roofline-sizes", *extra, "--output", str(tmp_path / "b.csv")]
    assert_cli_user_error(argv, match, watch=[tmp_path])


def test_memory_bound_uses_the_machine_and_allow_large_lifts_it(monkeypatch):
    import argparse

    args = argparse.Namespace(r=64, d=64, bh=8, device="cpu", allow_large=False)
    with pytest.raises(bench.ConfigurationError, match=r"available RAM"):
        bench.check_memory(args, [10_000_000], [], [])  # ≈ 300 GiB: over half of any machine here
    bench.check_memory(args, list(bench.DEFAULT_SIZES), [], [])  # the defaults fit (< 2 GiB a row)
    args.allow_large = True
    bench.check_memory(args, [10_000_000], [], [])
    assert bench.available_memory_bytes() > 0
    monkeypatch.setattr("builtins.__import__", _no_psutil(__import__))
    assert bench.available_memory_bytes() > 0  # /proc/meminfo


def _no_psutil(real_import):
    def fake(name, *args, **kwargs):
        if name == "psutil":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    return fake


def test_memory_estimate_covers_the_measured_peak():
    # one low-rank forward+backward in a fresh process (bench.memory_rows) against the estimate
    n, bh = 8192, 8
    row = bench.memory_rows([n], 64, 64, bh)[0]
    measured = row["extra_bytes"] + row["input_bytes"]
    estimate = bench.row_memory_bytes(n, 64, 64, bh)
    assert measured <= estimate <= 20 * measured, (measured, estimate)
