"""Speed of the analysis engine against its targets (table + CSV; no asserts).

1. depth sweep: 4 presets × depth 24 × N = 64 × d = 64 × 3 seeds (target < 30 s);
2. exact Jacobian of a 4-layer, N = 32, d = 32 skipless-OSA network, 1024 × 1024, and its SVD
   (target < 10 s);
3. matrix-free κ of a 12-layer, N = 256, d = 64 network, 16384 inputs (target < 60 s).

Run: ``.venv/bin/python benchmarks/analysis_speed.py [--quick] [--output benchmarks/results/analysis_speed.csv]``.
Each case runs once (they are seconds long); timings on a shared machine are pessimistic.
"""

from __future__ import annotations

import argparse
import time

import torch

from osa_lab.benchmarking.timing import emit_table, machine_info
from osa_lab.nn.models import functional_mode
from osa_lab.studies.depth import sweep
from osa_lab.studies.jacobian import build_point, exact_jacobian, matrix_free_extremes, prefix_function
from osa_lab.studies.settings import StudyPoint


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller matrix-free case (N = 64)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mf-preset", default="pure-osa", help="preset of the matrix-free case")
    parser.add_argument("--output", default="benchmarks/results/analysis_speed.csv")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_info())
    rows = []

    presets = ["pure-osa", "pure-ssa", "skipless-osa", "skipless-ssa"]
    secs, res = _timed(
        lambda: sweep(presets, 24, 64, 64, None, None, 3, progress=False, threads=args.threads)
    )
    rows.append({"case": "sweep 4 presets x depth 24 x N64 d64 x 3 seeds", "seconds": secs, "target_s": 30,
                 "detail": f"{len(res.metrics)} metric rows, {len(res.spectra)} spectra rows"})  # fmt: skip

    model, x0, _ = build_point(StudyPoint("skipless-osa", 4, 32, 32), torch.float64)

    def exact():
        with functional_mode(model):
            jac = exact_jacobian(lambda z: model(z[None])[0], x0)
            return torch.linalg.svdvals(jac)

    secs, sv = _timed(exact)
    rows.append({"case": "exact Jacobian 4 layers N32 d32 (1024x1024) + SVD", "seconds": secs, "target_s": 10,
                 "detail": f"kappa={float(sv[0] / sv[-1]):.4g}"})  # fmt: skip

    n_tokens = 64 if args.quick else 256
    model, x0, _ = build_point(StudyPoint(args.mf_preset, 12, n_tokens, 64), torch.float64)

    def free():
        with functional_mode(model):
            return matrix_free_extremes(prefix_function(model, 12), x0)

    secs, (smax, smin) = _timed(free)
    rows.append({"case": f"matrix-free kappa 12 layers N{n_tokens} d64 ({args.mf_preset}, {x0.numel()} inputs)",
                 "seconds": secs, "target_s": 60, "detail": f"kappa={smax / smin:.4g}"})  # fmt: skip
    emit_table(rows, args.output, title="analysis speed (single run each)")


if __name__ == "__main__":
    main()
