"""``benchmarks/pool_growth.py``: the CPU pool's buffers over a run of training steps."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.helpers import run_benchmark


@pytest.mark.usefixtures("cpu_kernels_in_use")
def test_each_package_runs_the_steps_and_counts_its_buffers(tmp_path):
    out = tmp_path / "pg.csv"
    done = run_benchmark("pool_growth", "--sizes", "mnist1d", "--steps", "2", "--baseline", "HEAD", "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = pd.read_csv(out)
    assert list(rows["package"]) == ["osa_lab", "osa_lab_baseline"] and set(rows["steps"]) == {2}
    for _, row in rows.iterrows():
        degrees = [int(d) for d in row["degrees_last_step"].split()]
        assert len(degrees) == 6 and min(degrees) >= 1  # one per OSA layer
        # at least st, the output and the iterates per layer; all held (far below the pool's limit)
        assert row["buffers_made"] >= 3 * 6 and row["mib_held"] == pytest.approx(row["mib_made"])
        assert 1 <= row["last_new_buffer_at_step"] <= 2


def test_a_bad_step_count_is_one_line_and_exit_2():
    done = run_benchmark("pool_growth", "--steps", "0")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1].endswith("must be an int ≥ 1, got '0'")
