"""A/B of the costs the forward no longer pays, measured side by side in one process (CPU).

* ``osa()`` forward (lowrank, float32) with the output check from the Gram engine's own sums
  (``expm.output_norm_change``, the default) against the same call with the check's two norm
  passes over y and v forced (the registry's method wrapped so that it gives no sums).
* The fixed Triton core's float64 spectral-norm squarings (``expm.spectral_norm_bound``,
  ``sync=False``), which the fixed core no longer runs when its plan's reach is below
  ``FLOAT64_NORM``, timed beside the fixed core itself (torch, float64).

Rounds are interleaved (``osa_lab.benchmarking.timing.time_interleaved``); the table gives medians
and the ratio, with the machine's float32 matmul rate, copy bandwidth and load average beside.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/output_check_ab.py --sizes 4096 16384 --repeat 5
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from pathlib import Path

import torch

from osa_lab import osa
from osa_lab.benchmarking.runner import heads_for
from osa_lab.benchmarking.timing import time_interleaved
from osa_lab.ops import expm, functional


def _machine() -> dict:
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    src, dst = torch.randn(8 * 2**20), torch.empty(8 * 2**20)
    t = time_interleaved({"mm": lambda: a @ b, "copy": lambda: dst.copy_(src)}, repeat=5)
    return {"f32_gflops": 2 * 2048**3 / t["mm"] / 1e9, "copy_gbps": 2 * src.numel() * 4 / t["copy"] / 1e9,
            "load_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else math.nan}  # fmt: skip


def rows_for(n: int, r: int, d: int, repeat: int) -> list[dict]:
    bh = heads_for(n)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(bh, n, c, generator=g) for c in (r, r, d))
    engine = functional.OSA_METHODS["lowrank"]

    def two_passes():  # the same engine without its sums: osa() then takes two norm passes
        functional.OSA_METHODS["lowrank"] = lambda *args: engine(*args)
        try:
            return osa(q, k, v, 0.5, method="lowrank")
        finally:
            functional.OSA_METHODS["lowrank"] = engine

    j = expm.osa_skew_core(r, torch.full((bh,), 0.5 / math.sqrt(r), dtype=torch.float64))
    gram = expm.block_gram(q, k)
    from osa_lab.ops.triton.kernels import fixed_gram_core

    chol, _, _ = expm.cholesky_with_inverse(gram)
    m = expm.core_matrix(chol, j, True)
    fro = torch.linalg.matrix_norm(m)
    fns = {
        "osa fwd, check from the engine's sums": lambda: osa(q, k, v, 0.5, method="lowrank"),
        "osa fwd, check by two norm passes": two_passes,
        "fixed core (torch float64)": lambda: fixed_gram_core(gram, j),
        "spectral squarings no longer run": lambda: expm.spectral_norm_bound(m, fro, expm.FLOAT64_NORM, sync=False),
    }
    with torch.no_grad():
        t = time_interleaved(fns, repeat=repeat)
    names = list(fns)
    base = {names[0]: names[1], names[1]: names[1], names[2]: names[2], names[3]: names[2]}
    return [{"N": n, "bh": bh, "r": r, "d_v": d, "what": name, "ms": 1e3 * t[name],
             "ratio_to": base[name], "ratio": t[name] / t[base[name]]} for name in names]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--r", type=int, default=64)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--output", type=Path, default=Path("bench_results/output_check_ab.csv"))
    args = parser.parse_args(argv)
    start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    machine = _machine()
    rows = [{**row, **machine, "started": start} for n in args.sizes for row in rows_for(n, args.r, args.d, args.repeat)]
    machine_end = _machine()
    print(f"started {start}; before: {machine}; after: {machine_end}")
    for row in rows:
        print(f"N={row['N']:6d} bh={row['bh']:3d}  {row['what']:40s} {row['ms']:9.2f} ms  "
              f"÷ {row['ratio_to']}: {row['ratio']:.3f}")  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_name(f".{args.output.name}.{os.getpid()}.tmp")
    with tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
