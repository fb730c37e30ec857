"""GPU check of the Triton OSA kernels (issue 6): one prepared script, < 5 minutes on an H200.

    python benchmarks/gpu_check.py                 # on the GPU machine; results in $OUT or bench_results/
    python benchmarks/gpu_check.py --dry-run       # CPU, Triton interpreter, toy sizes: checks the logic

Measures, in order (each measurement guarded: a failure becomes a row with its error):
1. the card's copy bandwidth (``y.copy_(x)``, 2 × bytes / time) and bf16 matmul rate;
2. correctness of the Triton path against float64 (outputs and all gradients), bf16 and float32;
3. per-pass time of the memory-bound Triton passes and their achieved bandwidth as a fraction of
   the measured copy bandwidth (target ≥ 60 %; bytes per pass in docs/triton.md);
4. forward and forward+backward time of the Triton path, the torch low-rank path
   (``osa(method="lowrank")``) and ``F.scaled_dot_product_attention`` (flash backend) for
   N ∈ {1k, 4k, 16k, 64k}, d ∈ {64, 128}, batch·heads = 32, bf16 (target at N = 16k, d = 64:
   Triton forward ≥ 5× faster than flash).
The table is printed last and saved as CSV. Imports only torch, triton, numpy, pandas and osa_lab.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="GPU check of the Triton OSA kernels")
    ap.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter at toy sizes")
    ap.add_argument("--out", default=None, help="output directory (default $OUT or bench_results/)")
    ap.add_argument("--budget", type=float, default=270.0, help="seconds; later timings are skipped past it")
    ap.add_argument("--bh", type=int, default=32, help="batch·heads")
    return ap.parse_args(argv)


ARGS = parse_args()
if ARGS.dry_run:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from osa_lab import expm  # noqa: E402
from osa_lab.benchtools import emit_table, machine_info, time_call  # noqa: E402
from osa_lab.functional import osa  # noqa: E402
from osa_lab.kernels import triton_osa as T  # noqa: E402

START = time.perf_counter()
ROWS: list[dict] = []
DRY = ARGS.dry_run
DEV = "cpu" if DRY else "cuda"
REPEAT = 2 if DRY else 5


def elapsed() -> float:
    return time.perf_counter() - START


def record(section: str, **row) -> dict:
    row = {"section": section, **row}
    ROWS.append(row)
    shown = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()}
    print(" ".join(f"{k}={v}" for k, v in shown.items()), flush=True)
    return row


def guarded(section: str, fn, **keys) -> dict | None:
    """Run ``fn() -> dict`` and record its fields; record the error instead if it raises."""
    if elapsed() > ARGS.budget:
        return record(section, **keys, status="skipped (time budget)")
    try:
        out = fn()
        return record(section, **keys, **out, status="ok")
    except Exception as exc:  # keep going: one failure must not lose the table
        traceback.print_exc(limit=2)
        return record(section, **keys, status=f"error: {type(exc).__name__}: {str(exc)[:120]}")
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


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
# 1. Machine facts
# --------------------------------------------------------------------------------------


def copy_bandwidth() -> dict:
    nbytes = (8 << 20) if DRY else (1 << 30)
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=DEV).fill_(1.0)
    y = torch.empty_like(x)
    t = time_call(lambda: y.copy_(x), repeat=REPEAT * 2, warmup=2)
    return {"seconds": t, "GB_s": 2 * nbytes / t / 1e9, "bytes": 2 * nbytes}


def matmul_rate() -> dict:
    n = 256 if DRY else 8192
    dtype = torch.float32 if DRY else torch.bfloat16
    a = torch.randn(n, n, device=DEV, dtype=dtype)
    b = torch.randn(n, n, device=DEV, dtype=dtype)
    t = time_call(lambda: a @ b, repeat=REPEAT, warmup=2)
    return {"seconds": t, "TFLOP_s": 2 * n**3 / t / 1e12, "dtype": str(dtype)[6:]}


# --------------------------------------------------------------------------------------
# 2. Correctness against float64
# --------------------------------------------------------------------------------------


def correctness(n: int, r: int, d: int, dtype: torch.dtype, bh: int = 4) -> dict:
    q, k, v, scale = inputs(bh, n, r, d, dtype, grad=True)
    y = T.osa_triton(q, k, v, scale)
    gy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (q, k, v, scale), gy)
    q64, k64, v64, s64 = (x.detach().double().requires_grad_() for x in (q, k, v, scale))
    y64 = expm.lowrank_action(torch.cat([q64, k64], -1), expm.osa_skew_core(r, s64), v64)
    want = (y64, *torch.autograd.grad(y64, (q64, k64, v64, s64), gy.double()))
    out = {}
    for name, got, ref in zip(("y", "dq", "dk", "dv", "dscale"), (y, *grads), want, strict=True):
        out[f"err_{name}"] = rel_err(got, ref)
        out[f"round_{name}"] = rel_err(ref.to(dtype), ref)  # the error of rounding the exact result
    out["orth_check"] = rel_err(
        torch.linalg.vector_norm(y.double(), dim=1), torch.linalg.vector_norm(v64, dim=1)
    )
    return out


# --------------------------------------------------------------------------------------
# 3. The memory-bound passes alone
# --------------------------------------------------------------------------------------


def pass_bandwidth(n: int, r: int, d: int, copy_gbs: float, bh: int) -> list[tuple[str, dict]]:
    dtype = torch.float32 if DRY else torch.bfloat16
    q, k, v, scale = inputs(bh, n, r, d, dtype)
    es = q.element_size()
    plan = T._plan(q, v, T.DEFAULT_CONFIG)
    plan1 = T._plan(q, v, T.TritonConfig(hi_lo=False))
    c = torch.randn(bh, 2 * r, d, dtype=torch.float64, device=DEV) * 1e-2
    gp = torch.randn_like(c) * 1e-2
    h = torch.randn(bh, 2 * r, 2 * r, dtype=torch.float64, device=DEV) * 1e-3
    gy = torch.randn_like(v)
    passes = {
        # name: (callable, minimal bytes moved)
        "fwd_reduce  Uᵀ[U V]": (lambda: T._reduce(q, k, v, plan, gram=True), bh * n * (2 * r + d) * es),
        "fwd_apply   V+UC": (lambda: T._fwd_apply(q, k, v, c, plan), bh * n * (2 * r + 2 * d) * es),
        "bwd_reduce  UᵀgY": (lambda: T._reduce(q, k, gy, plan, gram=False), bh * n * (2 * r + d) * es),
        "bwd_apply   gq,gk,gv": (
            lambda: T._bwd_apply(q, k, v, gy, c, gp, h, plan),
            bh * n * (4 * r + 3 * d) * es,
        ),
        "fwd_apply   (hi_lo off)": (lambda: T._fwd_apply(q, k, v, c, plan1), bh * n * (2 * r + 2 * d) * es),
        "bwd_apply   (hi_lo off)": (
            lambda: T._bwd_apply(q, k, v, gy, c, gp, h, plan1),
            bh * n * (4 * r + 3 * d) * es,
        ),
    }
    out = []
    for name, (fn, nbytes) in passes.items():

        def one(fn=fn, nbytes=nbytes):
            t = time_call(fn, repeat=REPEAT, warmup=1)
            gbs = nbytes / t / 1e9
            return {"ms": 1e3 * t, "GB_s": gbs, "frac_copy": gbs / copy_gbs if copy_gbs else float("nan")}

        out.append((name, one))
    return out


# --------------------------------------------------------------------------------------
# 4. Timings: Triton vs torch low-rank vs SDPA flash
# --------------------------------------------------------------------------------------


def timing(method: str, n: int, d: int, bh: int, backward: bool) -> dict:
    dtype = torch.bfloat16 if not DRY else torch.float32
    q, k, v, scale = inputs(bh, n, d, d, dtype, grad=backward, alpha=1.0)
    if method == "triton":

        def fwd():
            return T.osa_triton(q, k, v, scale)
    elif method == "torch_lowrank":

        def fwd():
            return osa(q, k, v, 1.0, method="lowrank")
    elif method == "sdpa_flash":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q4, k4, v4 = (x.detach().unsqueeze(0).requires_grad_(backward) for x in (q, k, v))

        def fwd():
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

    t = time_call(call, repeat=REPEAT, warmup=1)
    return {"ms": 1e3 * t, "tokens_per_s": bh * n / t}


def main() -> int:
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

    info = machine_info()
    header = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "git": rev,
        "triton": triton.__version__,
        "dry_run": DRY,
        **info,
    }
    print("# gpu_check", " ".join(f"{k}={v}" for k, v in header.items()), flush=True)
    if not DRY and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run on the CPU")
        return 2

    bh = 2 if DRY else ARGS.bh
    cp = guarded("machine", copy_bandwidth, what="copy_bandwidth")
    copy_gbs = cp.get("GB_s", 0.0) if cp else 0.0
    guarded("machine", matmul_rate, what="matmul_rate")

    shapes = [(100, 16, 16), (70, 8, 12)] if DRY else [(4096, 64, 64), (2048, 128, 128), (3000, 48, 96)]
    dtypes = [torch.float32, torch.bfloat16] if DRY else [torch.bfloat16, torch.float32, torch.float16]
    for n, r, d in shapes:
        for dtype in dtypes:
            guarded("correctness", lambda n=n, r=r, d=d, dtype=dtype: correctness(n, r, d, dtype),
                    N=n, r=r, d=d, dtype=str(dtype)[6:])  # fmt: skip

    pass_shapes = [(100, 16, 16)] if DRY else [(16384, 64, 64), (16384, 128, 128), (65536, 64, 64)]
    for n, r, d in pass_shapes:
        try:
            jobs = pass_bandwidth(n, r, d, copy_gbs, bh)
        except Exception as exc:
            record("pass", N=n, d=d, status=f"error: {exc!r}"[:160])
            continue
        for name, fn in jobs:
            guarded("pass", fn, method=name, N=n, d=d, bh=bh)

    ns = [64] if DRY else [1024, 4096, 16384, 65536]
    ds = [16] if DRY else [64, 128]
    for d in ds:
        for n in ns:
            for backward in (False, True):
                for method in ("triton", "torch_lowrank", "sdpa_flash"):
                    guarded("timing", lambda m=method, n=n, d=d, b=backward: timing(m, n, d, bh, b),
                            method=method, mode="fwd+bwd" if backward else "fwd", N=n, d=d, bh=bh)  # fmt: skip

    import pandas as pd

    df = pd.DataFrame(ROWS)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    csv = out_dir / f"gpu_check_{stamp}.csv"
    df.assign(**{k: str(v) for k, v in header.items()}).to_csv(csv, index=False)
    title = f"{header['date']}, {info.get('gpu', 'cpu')}, git {rev}"
    for section in ("machine", "correctness", "pass"):
        part = df[df.section == section].dropna(axis=1, how="all")
        if len(part):
            emit_table(part, None, title=f"{section} ({title})")
    tim = df[df.section == "timing"]
    if "ms" in tim and tim["ms"].notna().any():
        piv = tim.pivot_table(index=["d", "N", "mode"], columns="method", values="ms")
        if {"triton", "sdpa_flash"} <= set(piv.columns):
            piv["flash/triton"] = piv["sdpa_flash"] / piv["triton"]
        if {"triton", "torch_lowrank"} <= set(piv.columns):
            piv["lowrank/triton"] = piv["torch_lowrank"] / piv["triton"]
        emit_table(
            piv.reset_index(),
            out_dir / f"gpu_check_speedups_{stamp}.csv",
            title=f"timings in ms, {'float32 (dry run)' if DRY else 'bf16'}, batch·heads={bh}; ratios > 1 favour Triton ({title})",
        )
    failed = df[~df.status.astype(str).str.startswith("ok")]
    if len(failed):
        emit_table(failed.dropna(axis=1, how="all"), None, title="not ok")
    print(f"wrote {csv}")
    print(f"total {elapsed():.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
