"""``benchmarks/seed_groups.py``: per-seed times of groups against the solo run, with memory."""

from __future__ import annotations

import pandas as pd

from tests.helpers import run_benchmark

TINY = ["--presets", "skipless-osa", "vit", "--depths", "1", "--groups", "1", "2", "--dim", "8", "--heads", "2",
        "--batch", "4", "--repeat", "1"]  # fmt: skip


def test_the_table_has_a_row_per_configuration_with_ratios_to_the_solo_run_and_memory(tmp_path):
    out = tmp_path / "sg.csv"
    done = run_benchmark("seed_groups", *TINY, "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = pd.read_csv(out, keep_default_na=False)
    assert list(zip(rows["preset"], rows["G"], strict=True)) == [("skipless-osa", 1), ("skipless-osa", 2), ("vit", 1), ("vit", 2)]
    for preset in ("skipless-osa", "vit"):
        solo, pair = (rows[(rows["preset"] == preset) & (rows["G"] == g)].iloc[0] for g in (1, 2))
        assert solo["cpu_per_seed_ratio"] == 1.0 and solo["per_seed_ratio"] == 1.0
        assert pair["ms_per_seed"] * 2 == pair["ms_per_group_step"]
        expected = pair["cpu_ms_per_seed"] / solo["cpu_ms_per_seed"]
        assert abs(pair["cpu_per_seed_ratio"] - expected) < 1e-9 * expected
        assert pair["peak_rss_mib"] > 0 and pair["step_rss_mib"] >= 0
        assert abs(pair["step_rss_mib_per_seed"] * 2 - pair["step_rss_mib"]) < 1e-6
    assert rows["cpu_kernels"].ne("").all() and set(rows["rounds"]) == {1}
    assert "built skipless-osa depth 1 G=2" in done.stderr  # progress


def test_groups_without_the_solo_run_are_refused_in_one_line():
    done = run_benchmark("seed_groups", "--groups", "2", "4")
    assert done.returncode == 2 and done.stdout == ""
    assert "--groups needs 1" in done.stderr.strip().splitlines()[-1]


def test_adamw_ab_times_each_group_with_both_optimiser_paths_against_one_solo_run(tmp_path):
    out = tmp_path / "ab.csv"
    done = run_benchmark("seed_groups", "--presets", "skipless-osa", "--depths", "1", "--groups", "1", "2", "--dim", "8",
                         "--heads", "2", "--batch", "4", "--repeat", "1", "--adamw-ab", "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = pd.read_csv(out, keep_default_na=False)
    assert list(zip(rows["G"], rows["adamw"], strict=True)) == [(1, "solo loop"), (2, "foreach"), (2, "single")]
    solo = rows.iloc[0]
    for _, pair in rows.iloc[1:].iterrows():
        expected = pair["cpu_ms_per_seed"] / solo["cpu_ms_per_seed"]
        assert abs(pair["cpu_per_seed_ratio"] - expected) < 1e-9 * expected
    assert "peak_rss_mib" not in rows.columns  # no memory probes in an A/B run
