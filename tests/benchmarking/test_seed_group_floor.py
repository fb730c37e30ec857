"""``benchmarks/seed_group_floor.py``: the solo step's products, profile shares and the floors."""

from __future__ import annotations

import math

import pandas as pd

from tests.helpers import run_benchmark

TINY = ["--presets", "skipless-osa", "vit", "--depth", "1", "--dim", "8", "--heads", "2", "--batch", "4",
        "--group", "2", "--repeat", "2", "--profile-steps", "1"]  # fmt: skip


def test_the_floor_table_is_consistent_with_its_products_table(tmp_path):
    out = tmp_path / "floor.csv"
    done = run_benchmark("seed_group_floor", *TINY, "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = pd.read_csv(out).set_index("preset")
    products = pd.read_csv(tmp_path / "floor_matmuls.csv")
    assert list(rows.index) == ["skipless-osa", "vit"] and set(products["preset"]) == {"skipless-osa", "vit"}
    assert set(products["op"]) <= {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"}
    for preset, row in rows.iterrows():
        mine = products[products["preset"] == preset]
        assert row["gflop_per_step"] > 0 and row["step_cpu_ms"] > 0 and row["ops_per_step"] > 0
        # the replayed products are the step's products: their FLOPs make up what FlopCounterMode counted
        flop = (mine["isolated_gflops"] * mine["isolated_us"] * 1e3 * mine["calls_per_step"]).sum()
        assert 0.9 < flop / (row["gflop_per_step"] * 1e9) <= 1 + 1e-9
        assert math.isclose(row["replayed_flop_share"], flop / (row["gflop_per_step"] * 1e9), rel_tol=1e-6)
        assert math.isclose(row["matmul_isolated_ms"], (mine["isolated_us"] * mine["calls_per_step"]).sum() / 1e3,
                            rel_tol=1e-9)  # fmt: skip
        per_member = (mine["g2_us_per_member"] * mine["calls_per_step"]).sum() / 1e3
        assert math.isclose(row["matmul_g2_ms_per_seed"], per_member, rel_tol=1e-9)
        assert math.isclose(row["floor_ratio_matmul_only"], per_member / row["step_cpu_ms"], rel_tol=1e-9)
        assert math.isclose(row["floor_ratio_isolated_products"], row["matmul_isolated_ms"] / row["step_cpu_ms"],
                            rel_tol=1e-9)  # fmt: skip
        parts = row["matmul_ms"] + row["osa_kernel_ms"] + row["other_aten_ms"] + row["unattributed_ms"]
        assert math.isclose(parts, row["profiled_step_cpu_ms"], rel_tol=1e-9)
    assert (rows["adamw_single_ms"] > 0).all() and (rows["adamw_foreach_ms"] > 0).all()
    assert rows.loc["vit", "osa_kernel_ms"] == 0  # no OSA layer, no OSA kernel time
    assert "measuring vit depth 1" in done.stderr  # progress
