"""Rerun one committed run of a study on this machine and compare it with the committed result.

    python benchmarks/rerun_study_run.py experiments/mnist1d_depth.yaml \
        docs/results/mnist1d-depth/final/skipless-osa-d4-lr0.003-am10-s0.json

Trains the run again from its recorded settings (one torch thread, into a temporary folder) and
prints, as JSON: κ at initialisation, the final test accuracy and training loss, committed against
rerun, and the first epoch whose mean training loss differs by more than 1e-6 (relative). A study is
reproducible in distribution when reruns land within the seeds' spread; bit-for-bit agreement needs
the same machine, build and thread count.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from osa_lab.studies.depth_study.run import study_run
from osa_lab.studies.depth_study.spec import load_spec


def compare(experiment: str, result: str) -> dict:
    """The committed run ``result`` of ``experiment`` against a rerun here."""
    spec = load_spec(experiment)
    committed = json.loads(Path(result).read_text(encoding="utf-8"))
    spec_dict = {"data": spec.data, "val_fraction": spec.val_fraction, "batch_size": spec.batch_size,
                 "model": dict(spec.model), "kappa_samples": spec.kappa_samples}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        rerun = study_run(spec=spec_dict, stage=committed["stage"], preset=committed["preset"],
                          depth=int(committed["depth"]), seed=int(committed["seed"]), lr=float(committed["lr"]),
                          alpha_lr_mult=float(committed["alpha_lr_mult"]), steps=int(committed["steps"]),
                          results_dir=f"{tmp}/results", scratch_dir=f"{tmp}/scratch",
                          kappa="kappa_init" in committed, progress=False)  # fmt: skip
    pairs = list(zip(committed["curve"], rerun["curve"], strict=False))
    first = next((a["epoch"] for a, b in pairs
                  if abs(a["train_loss"] - b["train_loss"]) > 1e-6 * abs(a["train_loss"])), None)  # fmt: skip
    keys = ("kappa_init", "test_accuracy", "train_loss", "train_accuracy")
    return {"result": result, "torch": torch.__version__, "threads": torch.get_num_threads(),
            **{f"{k}_committed": committed.get(k) for k in keys}, **{f"{k}_rerun": rerun.get(k) for k in keys},
            "epochs_compared": len(pairs), "first_epoch_train_loss_differs_1e-6": first}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", help="the study's experiment file")
    parser.add_argument("result", help="a run JSON of that study's results folder")
    args = parser.parse_args(argv)
    for path in (args.experiment, args.result):
        if not Path(path).is_file():
            print(f"error: no such file: {path}", file=sys.stderr)
            return 2
    torch.set_num_threads(1)
    print(json.dumps(compare(args.experiment, args.result), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
