"""The CPU kernels of the low-rank engine's passes against their torch references, side by side.

Each row times one pass with the compiled kernels and the same pass on the torch path in
interleaved rounds (medians; the per-round ratios' median and interquartile range beside them):

- ``Gram/projection``: ``qᵀ[q k v]`` and ``kᵀ[k v]`` (``expm.gram_and_projection``);
- ``output``: ``V + q C_q + k C_k`` (``expm.gram_output``);
- ``core product``: one batched float64 2r × 2r product (``expm.core.product_into``);
- ``threads: core product after torch.bmm``: the same product right after a torch ``bmm``, with
  the library built with OpenMP (the build in use) and, built here into a private directory,
  with its own pthreads (``-fopenmp`` left out): the threads question of ``threads.h``;
- ``osa forward`` and ``osa forward+backward``: the whole low-rank ``osa()`` with the kernels on
  and off (``OSA_LAB_CPU_KERNELS``).

    python benchmarks/cpu_kernel_passes.py --n 4096 --heads 32 --repeat 15 --out bench_results/cpu_kernel_passes.csv

Nothing here asserts on time. The machine, the build status and the thread count are printed
and written beside the figures.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

import osa_lab
from osa_lab.arguments import check_output_file, positive_int
from osa_lab.errors import ConfigurationError, MethodUnavailableError
from osa_lab.ops import cpu, expm
from osa_lab.ops.cpu import build
from osa_lab.ops.expm.core import product_into


def _paired(fast, slow, repeat: int) -> dict:
    """Medians of ``fast()`` and ``slow()`` over interleaved rounds (order alternating) and the
    median and interquartile range of the per-round ratio fast ÷ slow."""
    for fn in (fast, slow, fast, slow):
        fn()
    times: dict = {"fast": [], "slow": []}
    for i in range(repeat):
        for key, fn in (("fast", fast), ("slow", slow)) if i % 2 else (("slow", slow), ("fast", fast)):
            t = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t)
    ratios = sorted(a / b for a, b in zip(times["fast"], times["slow"], strict=True))
    quarter = len(ratios) // 4
    return {"kernels_ms": 1e3 * statistics.median(times["fast"]), "torch_ms": 1e3 * statistics.median(times["slow"]),
            "ratio_median": statistics.median(ratios), "ratio_q1": ratios[quarter], "ratio_q3": ratios[-1 - quarter]}


def _pthread_build() -> ctypes.CDLL | None:
    """The kernels built without OpenMP (their own pthreads), a separate copy beside the build in
    use (``build.compile_library``); None where it cannot be built."""
    try:
        return build.compile_library(openmp=False)
    except (ConfigurationError, MethodUnavailableError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=positive_int, default=4096, help="sequence length N (default 4096)")
    ap.add_argument("--heads", type=positive_int, default=32, help="matrices in the batch (default 32)")
    ap.add_argument("--r", type=positive_int, default=64, help="width of q and k (default 64)")
    ap.add_argument("--d", type=positive_int, default=64, help="width of v (default 64)")
    ap.add_argument("--repeat", type=positive_int, default=15, help="interleaved rounds (default 15)")
    ap.add_argument("--out", default="bench_results/cpu_kernel_passes.csv", help="CSV to write")
    args = ap.parse_args(argv)
    out = Path(args.out)
    check_output_file(out, "--out")
    if not cpu.enabled() or build.library() is None:
        print(f"error: the CPU kernels are not in use here ({cpu.status()})", file=sys.stderr)
        return 2
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(args.heads, args.n, args.r, generator=g) for _ in range(2))
    v = torch.randn(args.heads, args.n, args.d, generator=g)
    c = torch.randn(args.heads, 2 * args.r, args.d, generator=g) / args.n
    m = torch.randn(args.heads, 2 * args.r, 2 * args.r, generator=g, dtype=torch.float64)
    m_out = torch.empty_like(m)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]

    def off(fn):
        def run():
            with cpu.turned_off():
                return fn()

        return run

    def fwd_bwd():
        for t in leaves:
            t.grad = None
        y = osa_lab.osa(*leaves, 0.5)
        y.backward(torch.ones_like(y))

    with torch.no_grad():
        passes = {
            "Gram/projection": lambda: expm.gram_and_projection(q, k, v),
            "output": lambda: expm.gram_output(q, k, c, v),
            "core product (float64)": lambda: product_into(m, m, m_out),
            "osa forward": lambda: osa_lab.osa(q, k, v, 0.5),
        }
        rows = [{"pass": name, **_paired(fn, off(fn), args.repeat)} for name, fn in passes.items()]
    rows.append({"pass": "osa forward+backward", **_paired(fwd_bwd, off(fwd_bwd), args.repeat)})
    pthreads = _pthread_build()
    if pthreads is not None:
        def after_bmm(call):
            def run():
                torch.bmm(m, m, out=m_out)  # a torch parallel region just before
                t = time.perf_counter()
                call()
                return time.perf_counter() - t

            return run

        omp = after_bmm(lambda: product_into(m, m, m_out))
        own = after_bmm(lambda: pthreads.osa_core_bmm(m.shape[0], m.shape[1], m.data_ptr(), m.data_ptr(), None,
                                                      m_out.data_ptr(), 1.0, torch.get_num_threads()))
        t_omp, t_own = [], []
        for i in range(args.repeat):
            for fn, dest in ((omp, t_omp), (own, t_own)) if i % 2 else ((own, t_own), (omp, t_omp)):
                dest.append(fn())
        flops = 2 * m.shape[0] * m.shape[1] ** 3
        rows.append({"pass": "threads: core product after torch.bmm, OpenMP (kernels_ms) vs own pthreads (torch_ms)",
                     "kernels_ms": 1e3 * statistics.median(t_omp), "torch_ms": 1e3 * statistics.median(t_own),
                     "ratio_median": statistics.median(t_omp) / statistics.median(t_own),
                     "gflops_openmp": flops / statistics.median(t_omp) / 1e9,
                     "gflops_pthreads": flops / statistics.median(t_own) / 1e9})
    meta = {"N": args.n, "heads": args.heads, "r": args.r, "d": args.d, "threads": torch.get_num_threads(),
            "cpu_kernels": cpu.status(), "torch_cpu_isa": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
            "load_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else float("nan")}
    table = pd.DataFrame([{**meta, **row} for row in rows])
    print(json.dumps(meta))
    print(table.drop(columns=list(meta)).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out, index=False)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
