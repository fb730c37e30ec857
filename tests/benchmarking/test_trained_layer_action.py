"""``benchmarks/trained_layer_action.py``: the small-N action on a training step's layer inputs."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.helpers import run_benchmark


@pytest.mark.usefixtures("cpu_kernels_in_use")
def test_every_layer_is_timed_against_the_baseline_with_the_same_output(tmp_path):
    out = tmp_path / "tla.csv"
    done = run_benchmark("trained_layer_action", "--sizes", "mnist1d", "--repeat", "3", "--baseline", "HEAD", "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = pd.read_csv(out)
    assert list(rows["layer"]) == list(range(6)) and set(rows["N"]) == {20} and set(rows["matrices"]) == {256}
    # the kernels square at least the matrix with the largest ‖S‖_F, at most every one
    assert ((rows["squared"] >= 1) & (rows["squared"] <= rows["matrices"])).all()
    assert (rows["degree"] >= 1).all() and (rows["rho"] > 0).all()
    assert (rows["output_rel_diff"] == 0).all()  # HEAD's code (a tree whose package matches HEAD): the same bits
    paired = rows[["paired_ratio_q1", "paired_ratio", "paired_ratio_q3", "ms_fwd_bwd_baseline"]]
    assert paired.notna().all().all() and (paired > 0).all().all()  # every layer timed against HEAD
    assert rows["cpu_kernels"].str.startswith("built with").all()


def test_a_bad_argument_is_one_line_and_exit_2():
    for args, message in ((["--sizes", "cifar"], "invalid choice"), (["--repeat", "1", "--baseline", "HEAD"], "--repeat 2")):
        done = run_benchmark("trained_layer_action", *args)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 2 and message in lines[-1], (args, lines)
