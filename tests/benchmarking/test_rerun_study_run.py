"""benchmarks/rerun_study_run.py: a committed run trained again here and compared with its JSON."""

from __future__ import annotations

import json

from tests.helpers import run_benchmark
from tests.studies.test_depth_study import TINY_EXPERIMENT


def test_a_rerun_on_the_same_machine_and_threads_reproduces_the_run(tmp_path, monkeypatch, torch_threads_for_test):
    import torch

    from osa_lab.cli import main as cli_main

    monkeypatch.chdir(tmp_path)  # the study's checkpoints go under ./runs: none shared with another test
    torch_threads_for_test(2)  # not the study's one thread, so that the study must set it
    assert torch.get_num_threads() == 2

    exp = tmp_path / "tiny.yaml"
    exp.write_text(TINY_EXPERIMENT)
    out = tmp_path / "results"
    assert cli_main(["train", "--experiment", str(exp), "--output", str(out), "--serial", "--quiet"]) == 0
    result = sorted((out / "final").glob("vit-*.json"))[0]
    done = run_benchmark("rerun_study_run", str(exp), str(result), timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    committed = json.loads(result.read_text())
    assert report["test_accuracy_committed"] == committed["test_accuracy"]
    # the study's tasks train on one torch thread by default, as the rerun does: the same bits here
    assert report["first_epoch_train_loss_differs_1e-6"] is None
    assert report["test_accuracy_rerun"] == committed["test_accuracy"]
    assert report["kappa_init_rerun"] == committed["kappa_init"]


def test_missing_files_are_one_line_and_exit_2(tmp_path):
    done = run_benchmark("rerun_study_run", str(tmp_path / "none.yaml"), str(tmp_path / "none.json"))
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "no such file" in done.stderr
