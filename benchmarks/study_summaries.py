"""Time the large-depth study's whole plan, dry run, with and without the record cache, in one run.

    python benchmarks/study_summaries.py [--output bench_results/study_summaries.csv]

Runs the full profile of experiments/mnist1d_large_depth.yaml (18 cells, 774 tuning and 144 final
runs) through the real driver, search, tables and verdict with the synthetic stand-in for training
of tests/studies/test_full_plan.py, once with the study's :class:`RecordCache` and once with every
summary reading every record again, and prints seconds per dry run and their ratio (table and CSV).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from osa_lab.studies.depth_study.records import RecordCache, read_run  # noqa: E402
from osa_lab.studies.depth_study.spec import load_spec  # noqa: E402
from tests.studies.test_full_plan import EXPERIMENT, run_plan  # noqa: E402


def dry_run_seconds(cached: bool) -> float:
    """Wall seconds of one dry run of the whole plan; ``cached=False`` reads every record at every summary."""
    spec = load_spec(EXPERIMENT)
    original = RecordCache.read_run
    if not cached:
        RecordCache.read_run = lambda self, path, stage: read_run(path, stage)  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as root:
            t0 = time.perf_counter()
            run_plan(spec, Path(root) / "results", Path(root) / "checkpoints")
            return time.perf_counter() - t0
    finally:
        RecordCache.read_run = original  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="bench_results/study_summaries.csv")
    args = parser.parse_args()
    without, with_cache = dry_run_seconds(False), dry_run_seconds(True)
    table = pd.DataFrame([{"dry run": "whole plan, 18 cells", "records re-read (s)": round(without, 1),
                           "record cache (s)": round(with_cache, 1), "ratio": round(with_cache / without, 2)}])
    print(table.to_string(index=False))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.output, index=False)


if __name__ == "__main__":
    main()
