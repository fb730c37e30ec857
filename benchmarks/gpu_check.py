"""GPU check of the Triton OSA kernels: one prepared script, < 4 minutes on an H200.

    python benchmarks/gpu_check.py                          # GPU; results in $OUT or bench_results/
    python benchmarks/gpu_check.py --cache-dir DIR          # GPU, starting from a prebuilt Triton cache
    python benchmarks/gpu_check.py --prebuild-cache DIR     # CPU: compile every variant for sm_90 into DIR
    python benchmarks/gpu_check.py --dry-run                # CPU, Triton interpreter, toy sizes

The workloads (shapes, dtypes, configurations) are ``osa_lab.ops.triton.compile_check.GPU_CHECK``,
so ``--prebuild-cache`` compiles exactly the variants the GPU run launches (with a stand-in
driver, no GPU; the cache is used by the same triton version, 3.6 on the GPU machine).

Measures, in order (each measurement guarded: a failure becomes a row with its error, and a
measurement that would start past ``--budget`` seconds is skipped):
1. the card's copy bandwidth (``y.copy_(x)``, 2 × bytes / time) and bf16 matmul rate;
2. forward and forward+backward time of the Triton path (adaptive and fixed core plans), the
   torch low-rank path and ``F.scaled_dot_product_attention`` (flash) for N ∈ {1k, 4k, 16k,
   64k}, d ∈ {64, 128}, batch·heads = 32, bf16 (target at N = 16k, d = 64: Triton forward
   ≥ 5× faster than flash); ``first_call_s`` includes compiling or loading the kernels;
3. per-pass time of the memory-bound Triton passes (CUDA events) and their bandwidth as a
   fraction of the measured copy bandwidth (target ≥ 60 %; bytes per pass in docs/triton.md);
4. that the fixed core plan runs forward and backward with no host synchronisation
   (``torch.cuda.set_sync_debug_mode("error")``), and its forward captured in a CUDA graph
   (replay time, difference to eager);
5. correctness against float64 (outputs and all gradients) with a verdict per row:
   ``err ≤ 1.25·round + 1e-4`` (``round`` = error of rounding the exact result to the dtype;
   the scale gradient ``≤ 1e-4``), as ``tests/ops/test_triton.py::test_gpu_realistic_sizes``.
Every row is printed and written to the CSV (and a JSON-lines file) as soon as it is measured,
so a run killed at its time limit keeps what it measured. Imports only torch, triton, numpy,
pandas and osa_lab. A user error prints one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit status 2, no usage dump
        print(f"gpu_check: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def parse_args(argv=None):
    ap = _Parser(description="GPU check of the Triton OSA kernels")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter at toy sizes")
    mode.add_argument("--prebuild-cache", metavar="DIR", help="CPU: compile every variant for sm_90 into DIR")
    ap.add_argument("--cache-dir", metavar="DIR", help="Triton cache to use (e.g. one made by --prebuild-cache)")
    ap.add_argument("--max-variants", type=int, default=None, help="--prebuild-cache: stop after K variants")
    ap.add_argument("--arch", type=int, default=90, help="--prebuild-cache: compute capability (90: H100/H200)")
    ap.add_argument("--out", default=None, help="output directory (default $OUT or bench_results/)")
    ap.add_argument("--budget", type=float, default=225.0, help="seconds; measurements past it are skipped")
    ap.add_argument("--bh", type=int, default=32, help="batch·heads of the timings")
    return ap.parse_args(argv)


ARGS = parse_args()
if ARGS.dry_run:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
elif ARGS.prebuild_cache:
    os.environ.pop("TRITON_INTERPRET", None)
if ARGS.cache_dir:
    os.environ["TRITON_CACHE_DIR"] = str(Path(ARGS.cache_dir).resolve())

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from osa_lab.ops import expm  # noqa: E402
from osa_lab.ops.functional import osa  # noqa: E402
from osa_lab.ops.triton import compile_check as CC  # noqa: E402
from osa_lab.ops.triton import kernels as T  # noqa: E402

START = time.perf_counter()
DRY = ARGS.dry_run
DEV = "cpu" if DRY else "cuda"
REPEAT = 1 if DRY else 5
WARMUP = 0 if DRY else 1


def elapsed() -> float:
    return time.perf_counter() - START


class Rows:
    """Rows printed and written (CSV rewritten, JSON lines appended) as soon as they come."""

    def __init__(self, out_dir: Path, stamp: str, header: dict) -> None:
        self.rows: list[dict] = []
        self.header = header
        self.csv = out_dir / f"gpu_check_{stamp}.csv"
        self.jsonl = out_dir / f"gpu_check_{stamp}.jsonl"

    def add(self, section: str, **row) -> dict:
        row = {"section": section, "t_s": round(elapsed(), 2), **row}
        self.rows.append(row)
        shown = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()}
        print(" ".join(f"{k}={v}" for k, v in shown.items()), flush=True)
        with open(self.jsonl, "a") as fh:
            fh.write(json.dumps(row, default=str) + "\n")
        import pandas as pd

        tmp = self.csv.with_suffix(".csv.tmp")
        pd.DataFrame(self.rows).assign(**{k: str(v) for k, v in self.header.items()}).to_csv(tmp, index=False)
        os.replace(tmp, self.csv)
        return row


ROWS: Rows | None = None


def guarded(section: str, fn, **keys) -> dict:
    """Run ``fn() -> dict`` and record its fields (its own ``status`` or "ok"); record the error
    instead if it raises; skip it past the time budget."""
    if elapsed() > ARGS.budget:
        return ROWS.add(section, **keys, status="skipped (time budget)")
    try:
        out = fn()
        out.setdefault("status", "ok")
        return ROWS.add(section, **keys, **out)
    except Exception as exc:  # keep going: one failure must not lose the table
        traceback.print_exc(limit=2)
        return ROWS.add(section, **keys, status=f"error: {type(exc).__name__}: {str(exc)[:160]}")
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def device_time(fn, repeat: int = REPEAT, warmup: int = WARMUP) -> tuple[float, float]:
    """``(median seconds per call, seconds of the first call)``; CUDA events on the GPU (device
    time of the work, no host bookkeeping around it), wall time on the CPU. Fewer repeats for
    calls over 0.2 s so that no single measurement eats the budget."""
    t0 = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for _ in range(max(0, warmup - 1)):
        fn()
    n = max(1, repeat if first < 0.2 else min(repeat, 2))
    times = []
    for _ in range(n):
        if torch.cuda.is_available():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            s = time.perf_counter()
            fn()
            times.append(time.perf_counter() - s)
    times.sort()
    return times[len(times) // 2], first


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-300))


def inputs(bh: int, n: int, r: int, d: int, dtype: torch.dtype, grad: bool = False, alpha: float = 1.0):
    g = torch.Generator(device=DEV).manual_seed(0)
    q, k = (torch.randn(bh, n, r, device=DEV, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(bh, n, d, device=DEV, generator=g, dtype=dtype)
    scale = torch.full((bh,), alpha / math.sqrt(r), dtype=torch.float64, device=DEV)
    if grad:
        q, k, v, scale = (x.requires_grad_() for x in (q, k, v, scale))
    return q, k, v, scale


# --------------------------------------------------------------------------------------
# Machine facts
# --------------------------------------------------------------------------------------


def copy_bandwidth() -> dict:
    nbytes = (8 << 20) if DRY else (1 << 30)
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=DEV).fill_(1.0)
    y = torch.empty_like(x)
    t, _ = device_time(lambda: y.copy_(x), repeat=REPEAT * 2)
    return {"seconds": t, "GB_s": 2 * nbytes / t / 1e9, "bytes": 2 * nbytes}


def matmul_rate() -> dict:
    n = 256 if DRY else 8192
    dtype = torch.float32 if DRY else torch.bfloat16
    a = torch.randn(n, n, device=DEV, dtype=dtype)
    b = torch.randn(n, n, device=DEV, dtype=dtype)
    t, _ = device_time(lambda: a @ b)
    return {"seconds": t, "TFLOP_s": 2 * n**3 / t / 1e12, "dtype": str(dtype)[6:]}


# --------------------------------------------------------------------------------------
# Timings: Triton vs torch low-rank vs SDPA flash
# --------------------------------------------------------------------------------------


def timing(method: str, n: int, d: int, bh: int, backward: bool, config: dict | None = None) -> dict:
    dtype = torch.float32 if DRY else torch.bfloat16
    q, k, v, scale = inputs(bh, n, d, d, dtype, grad=backward, alpha=1.0)
    cfg = T.TritonConfig(**(config or {}))
    if method == "triton":

        def fwd():
            return T.osa_triton(q, k, v, scale, config=cfg)
    elif method == "torch_lowrank":

        def fwd():
            return osa(q, k, v, 1.0, method="lowrank")
    elif method == "sdpa_flash":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q4, k4, v4 = (x.detach().unsqueeze(0).requires_grad_(backward) for x in (q, k, v))

        def fwd():
            if DRY:
                return F.scaled_dot_product_attention(q4, k4, v4)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q4, k4, v4)
    else:
        raise ValueError(method)
    if backward:
        leaves = [x for x in ((q4, k4, v4) if method == "sdpa_flash" else (q, k, v)) if x.requires_grad]

        def call():
            y = fwd()
            torch.autograd.grad(y, leaves, torch.ones_like(y))
    else:

        def call():
            with torch.no_grad():
                fwd()

    t, first = device_time(call)
    return {"ms": 1e3 * t, "tokens_per_s": bh * n / t, "first_call_s": first}


# --------------------------------------------------------------------------------------
# The memory-bound passes alone
# --------------------------------------------------------------------------------------


def pass_jobs(case: CC.Case, copy_gbs: float) -> list[tuple[str, object]]:
    n, r, d, bh = case.n, case.r, case.d, case.b
    dtype = torch.float32 if DRY else CC._torch_dtype(case.dtype)
    q, k, v, _ = inputs(bh, n, r, d, dtype)
    es = q.element_size()
    plan = T.launch_plan(q, v, T.TritonConfig(**case.config))
    c = torch.randn(bh, 2 * r, d, dtype=torch.float64, device=DEV) * 1e-2
    gp = torch.randn_like(c) * 1e-2
    h = torch.randn(bh, 2 * r, 2 * r, dtype=torch.float64, device=DEV) * 1e-3
    gy = torch.randn_like(v)
    passes = {
        # name: (callable, minimal bytes moved)
        "fwd_reduce  Uᵀ[U V]": (lambda: T.reduce_pass(q, k, v, plan, gram=True), bh * n * (2 * r + d) * es),
        "fwd_apply   V+UC": (lambda: T.forward_apply(q, k, v, c, plan), bh * n * (2 * r + 2 * d) * es),
        "bwd_reduce  UᵀgY": (lambda: T.reduce_pass(q, k, gy, plan, gram=False), bh * n * (2 * r + d) * es),
        "bwd_apply   gq,gk,gv": (lambda: T.backward_apply(q, k, v, gy, c, gp, h, plan), bh * n * (4 * r + 3 * d) * es),
    }
    out = []
    for name, (fn, nbytes) in passes.items():
        if case.config and "reduce" in name:
            continue  # the reduce pass does not depend on hi_lo

        def one(fn=fn, nbytes=nbytes):
            t, first = device_time(fn)
            gbs = nbytes / t / 1e9
            frac = gbs / copy_gbs if copy_gbs else float("nan")
            return {"ms": 1e3 * t, "GB_s": gbs, "frac_copy": frac, "first_call_s": first}

        out.append((name, one))
    return out


# --------------------------------------------------------------------------------------
# No host synchronisation in the fixed core plan
# --------------------------------------------------------------------------------------


def sync_free(n: int, d: int) -> dict:
    dtype = torch.float32 if DRY else torch.bfloat16
    q, k, v, scale = inputs(4, n, d, d, dtype, grad=True)
    cfg = T.TritonConfig(core="fixed")
    y = T.osa_triton(q, k, v, scale, config=cfg)  # compile outside the checked region
    torch.autograd.grad(y, (q, k, v, scale), torch.ones_like(y))
    if DRY:
        return {"status": "ok (not checked on the CPU)"}
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = T.osa_triton(q, k, v, scale, config=cfg)
        torch.autograd.grad(y, (q, k, v, scale), torch.ones_like(y))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return {"finite": bool(torch.isfinite(y).all())}


def cuda_graph(n: int, d: int) -> dict:
    """The fixed-plan forward captured in a CUDA graph and replayed: same output as eager, and
    the replay time (no host work at all)."""
    if DRY:
        return {"status": "ok (not checked on the CPU)"}
    q, k, v, scale = inputs(ARGS.bh, n, d, d, torch.bfloat16)
    cfg = T.TritonConfig(core="fixed")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            T.osa_triton(q, k, v, scale, config=cfg)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        y = T.osa_triton(q, k, v, scale, config=cfg)
    graph.replay()
    with torch.no_grad():
        eager = T.osa_triton(q, k, v, scale, config=cfg)
    t, _ = device_time(graph.replay)
    return {"ms": 1e3 * t, "max_abs_diff": float((y.float() - eager.float()).abs().max()), "N": n, "d": d}


# --------------------------------------------------------------------------------------
# Correctness against float64, with a verdict
# --------------------------------------------------------------------------------------


def correctness(n: int, r: int, d: int, dtype: torch.dtype, bh: int) -> dict:
    q, k, v, scale = inputs(bh, n, r, d, dtype, grad=True)
    y = T.osa_triton(q, k, v, scale)
    gy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (q, k, v, scale), gy)
    q64, k64, v64, s64 = (x.detach().double().requires_grad_() for x in (q, k, v, scale))
    y64 = expm.lowrank_action(torch.cat([q64, k64], -1), expm.osa_skew_core(r, s64), v64)
    want = (y64, *torch.autograd.grad(y64, (q64, k64, v64, s64), gy.double()))
    out: dict = {}
    failed = []
    for name, got, ref in zip(("y", "dq", "dk", "dv", "dscale"), (y, *grads), want, strict=True):
        err = rel_err(got, ref)
        rnd = rel_err(ref.to(dtype), ref)  # the error of rounding the exact result
        tol = 1e-4 if name == "dscale" else 1.25 * rnd + 1e-4
        out[f"err_{name}"], out[f"round_{name}"] = err, rnd
        if not err <= tol:
            failed.append(f"err_{name} {err:.3g} > {tol:.3g}")
    out["orth_check"] = rel_err(torch.linalg.vector_norm(y.double(), dim=1), torch.linalg.vector_norm(v64, dim=1))
    out["status"] = "ok" if not failed else "FAIL: " + "; ".join(failed)
    return out


# --------------------------------------------------------------------------------------
# Modes
# --------------------------------------------------------------------------------------


def prebuild(cache_dir: str) -> int:
    """Compile every variant of the GPU run for sm_{arch} into ``cache_dir`` on the CPU."""
    import triton

    if not triton.__version__.startswith("3.6"):
        print(
            f"note: triton {triton.__version__} here; the GPU machine runs 3.6 and only uses a cache "
            "built by the same version (`make gpu-compile-check` uses .venv-triton36)",
            flush=True,
        )
    cases = CC.all_cases()
    results = CC.compile_cases(cases, arch=ARGS.arch, cache_dir=cache_dir, max_variants=ARGS.max_variants)
    bad = CC.verdict(results)
    fresh = [c for c in results if not c.cached and not c.error]
    print(
        f"{len(results)} variant(s) of {len(cases)} case(s) in {elapsed():.1f} s; slowest compile "
        f"{max((c.seconds for c in fresh), default=0.0):.1f} s; {len(bad)} problem(s); cache {cache_dir}",
        flush=True,
    )
    for line in bad:
        print("PROBLEM", line)
    return 1 if bad else 0


def main() -> int:
    global ROWS
    if ARGS.prebuild_cache:
        return prebuild(str(Path(ARGS.prebuild_cache).resolve()))
    if not DRY and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; use --dry-run (interpreter) or --prebuild-cache DIR on the CPU")
        return 2
    out_dir = Path(ARGS.out or os.environ.get("OUT") or (ROOT / "bench_results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    rev = "unknown"
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except Exception:
        pass
    import triton

    # the laboratory's table helpers (pandas and the `lab` extra) only for the GPU run: the CPU
    # compile check (--prebuild-cache) runs in the core-only .venv-triton36 of `make gpu-compile-check`
    from osa_lab.benchmarking.timing import emit_table, machine_info

    info = machine_info()
    header = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "git": rev,
        "triton": triton.__version__,
        "dry_run": DRY,
        "triton_cache": os.environ.get("TRITON_CACHE_DIR", "default"),
        **info,
    }
    print("# gpu_check", " ".join(f"{k}={v}" for k, v in header.items()), flush=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    ROWS = Rows(out_dir, stamp, header)

    cp = guarded("machine", copy_bandwidth, what="copy_bandwidth")
    copy_gbs = cp.get("GB_s", 0.0) or 0.0
    guarded("machine", matmul_rate, what="matmul_rate")

    # 1. Timings first: the figures the GPU run is for.
    bh = 2 if DRY else ARGS.bh
    if DRY:
        timing_cases = [CC.Case("timing", bh, 64, 16, 16, "float32", True, cfg) for cfg in ({}, {"core": "fixed"})]
    else:
        timing_cases = CC.GPU_CHECK["timing"]
    torch_done: set = set()
    for case in timing_cases:
        for backward in (False, True):
            mode = "fwd+bwd" if backward else "fwd"
            core = case.config.get("core", "adaptive")
            guarded("timing", lambda c=case, b=backward: timing("triton", c.n, c.d, bh, b, c.config),
                    method=f"triton_{core}", mode=mode, N=case.n, d=case.d, bh=bh)  # fmt: skip
            if (case.n, case.d, backward) in torch_done:
                continue
            torch_done.add((case.n, case.d, backward))
            for method in ("torch_lowrank", "sdpa_flash"):
                guarded("timing", lambda m=method, c=case, b=backward: timing(m, c.n, c.d, bh, b),
                        method=method, mode=mode, N=case.n, d=case.d, bh=bh)  # fmt: skip

    # 2. The passes alone.
    pass_cases = [CC.Case("pass", 2, 100, 16, 16, "float32")] if DRY else CC.GPU_CHECK["pass"]
    for case in pass_cases:
        try:
            jobs = pass_jobs(case, copy_gbs)
        except Exception as exc:
            ROWS.add("pass", N=case.n, d=case.d, status=f"error: {exc!r}"[:160])
            continue
        label = " (hi_lo off)" if case.config.get("hi_lo") is False else ""
        for name, fn in jobs:
            guarded("pass", fn, method=name + label, N=case.n, r=case.r, d=case.d, bh=case.b)

    # 3. Sync-free fixed plan.
    guarded("sync_free", lambda: sync_free(64 if DRY else 4096, 16 if DRY else 64), what="fixed core plan")
    guarded("sync_free", lambda: cuda_graph(64 if DRY else 16384, 16 if DRY else 64), what="cuda graph (fwd)")

    # 4. Correctness with a verdict.
    if DRY:
        corr = [CC.Case("correctness", 2, n, r, d, dt) for (n, r, d) in ((70, 8, 12),) for dt in ("float32", "bfloat16")]
    else:
        corr = CC.GPU_CHECK["correctness"]
    for case in corr:
        dtype = CC._torch_dtype(case.dtype)
        guarded("correctness", lambda c=case, t=dtype: correctness(c.n, c.r, c.d, t, c.b),
                N=case.n, r=case.r, d=case.d, dtype=case.dtype)  # fmt: skip

    import pandas as pd

    df = pd.DataFrame(ROWS.rows)
    title = f"{header['date']}, {info.get('gpu', 'cpu')}, git {rev}"
    for section in ("machine", "pass", "sync_free", "correctness"):
        part = df[df.section == section].dropna(axis=1, how="all")
        if len(part):
            emit_table(part, None, title=f"{section} ({title})")
    tim = df[df.section == "timing"]
    if "ms" in tim and tim["ms"].notna().any():
        piv = tim.pivot_table(index=["d", "N", "mode"], columns="method", values="ms")
        for col in ("triton_adaptive", "triton_fixed"):
            if {col, "sdpa_flash"} <= set(piv.columns):
                piv[f"flash/{col}"] = piv["sdpa_flash"] / piv[col]
        emit_table(
            piv.reset_index(),
            out_dir / f"gpu_check_speedups_{stamp}.csv",
            title=f"timings in ms, {'float32 (dry run)' if DRY else 'bf16'}, batch·heads={bh}; ratios > 1 favour Triton ({title})",
        )
    failed = df[~df.status.astype(str).str.startswith("ok")]
    if len(failed):
        emit_table(failed.dropna(axis=1, how="all"), None, title="not ok")
    print(f"wrote {ROWS.csv}")
    print(f"total {elapsed():.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
