"""Speed and memory benchmark of low-rank OSA against SDPA and dense OSA (issue 2).

``osa-lab bench`` (or ``python -m osa_lab.bench``) times, side by side in one process and
for r = d_v = 64 in float32:

* low-rank OSA (``method="auto"``) forward and forward+backward,
* ``F.scaled_dot_product_attention`` forward and forward+backward,
* dense OSA (N×N ``matrix_exp``) forward where it fits (N ≤ 1024),

and reports the speed-up ratios, the achieved GFLOP/s of the low-rank path (counted flops
``2·bh·N·(2r·2r + 2·2r·d_v)``: the Gram ``UᵀU``, the projection ``UᵀV`` and the output
``U C``) next to the machine's matmul GFLOP/s measured in the same rounds, and the peak memory
of forward+backward measured in a fresh subprocess per N. It prints a table and writes CSVs.
Timings are medians; nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from osa_lab.benchtools import (
    current_rss_bytes,
    emit_table,
    fresh_memory,
    machine_info,
    peak_rss_bytes,
    reset_peak_rss,
    time_call,
    time_interleaved,
)
from osa_lab.cli import check_output_file, positive_int
from osa_lab.errors import MethodUnavailableError
from osa_lab.functional import osa

DEFAULT_SIZES = (256, 1024, 4096, 16384)
DEFAULT_MEMORY_SIZES = (16384, 32768, 65536)
ALPHA = 0.5


def heads_for(n: int) -> int:
    """batch·heads used at sequence length n (issue 2: 32, and 8 at N ≥ 16384)."""
    return 8 if n >= 16384 else 32


def lowrank_flops(bh: int, n: int, r: int, d_v: int) -> float:
    """Counted forward flops of the low-rank path: 2·bh·N·(2r·2r + 2·2r·d_v)."""
    return 2.0 * bh * n * (2 * r * 2 * r + 2 * 2 * r * d_v)


def _inputs(bh: int, n: int, r: int, d: int, device: str, dtype: torch.dtype, grad: bool = False):
    g = torch.Generator(device="cpu").manual_seed(n)
    out = [torch.randn(bh, n, w, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)
           for w in (r, r, d)]
    return [t.requires_grad_(grad) for t in out]


def _fwd_bwd(fn, inputs):
    def run():
        for t in inputs:
            t.grad = None
        y = fn(*inputs)
        y.backward(torch.ones_like(y))

    return run


def time_row(n: int, r: int, d: int, device: str, dtype: torch.dtype, repeat: int) -> dict:
    """Time every path at sequence length ``n``; returns one row of the table.

    Low-rank OSA, SDPA and a 2048 × 2048 matmul (the machine's rate) run interleaved, round by
    round (:func:`~osa_lab.benchtools.time_interleaved`), so each ratio compares medians taken
    under the same conditions. SDPA at N ≥ 16384 (seconds per call) runs fewer rounds.
    """
    bh = heads_for(n)
    row: dict = {"N": n, "bh": bh, "r": r, "d_v": d, "dtype": str(dtype).removeprefix("torch."), "device": device}
    q, k, v = _inputs(bh, n, r, d, device, dtype)
    slow = n >= 16384
    mm_n = 2048
    a, b = torch.randn(mm_n, mm_n, device=device), torch.randn(mm_n, mm_n, device=device)
    with torch.no_grad():
        fwd = time_interleaved(
            {
                "lowrank": lambda: osa(q, k, v, ALPHA),
                "matmul": lambda: a @ b,
                "sdpa": lambda: F.scaled_dot_product_attention(q[None], k[None], v[None]),
            },
            repeat={"lowrank": repeat, "matmul": repeat, "sdpa": min(repeat, 2) if slow else repeat},
        )
        row["lowrank_fwd_s"], row["sdpa_fwd_s"] = fwd["lowrank"], fwd["sdpa"]
        row["matmul_gflops"] = 2 * mm_n**3 / fwd["matmul"] / 1e9
        if n <= 1024:
            row["dense_fwd_s"] = time_call(lambda: osa(q, k, v, ALPHA, method="dense"), repeat=1)
    leaves = _inputs(bh, n, r, d, device, dtype, grad=True)
    both = time_interleaved(
        {
            "lowrank": _fwd_bwd(lambda x, y, z: osa(x, y, z, ALPHA), leaves),
            "sdpa": _fwd_bwd(lambda x, y, z: F.scaled_dot_product_attention(x[None], y[None], z[None]), leaves),
        },
        repeat={"lowrank": repeat, "sdpa": 1 if slow else repeat},
    )
    row["lowrank_fwdbwd_s"], row["sdpa_fwdbwd_s"] = both["lowrank"], both["sdpa"]
    row["speedup_fwd_vs_sdpa"] = row["sdpa_fwd_s"] / row["lowrank_fwd_s"]
    row["speedup_fwdbwd_vs_sdpa"] = row["sdpa_fwdbwd_s"] / row["lowrank_fwdbwd_s"]
    if "dense_fwd_s" in row:
        row["speedup_fwd_vs_dense"] = row["dense_fwd_s"] / row["lowrank_fwd_s"]
    row["lowrank_gflops"] = lowrank_flops(bh, n, r, d) / row["lowrank_fwd_s"] / 1e9
    row["matmul_fraction"] = row["lowrank_gflops"] / row["matmul_gflops"]
    return row


def memory_probe(n: int, r: int, d: int, bh: int) -> dict:
    """Peak memory of one low-rank forward+backward at sequence length n (run in a fresh process)."""
    leaves = _inputs(bh, n, r, d, "cpu", torch.float32, grad=True)
    fresh_memory()
    reset_peak_rss()
    base = current_rss_bytes()
    y = osa(*leaves, ALPHA)
    y.backward(torch.ones_like(y))
    peak = peak_rss_bytes()
    input_bytes = sum(t.numel() * t.element_size() for t in leaves)
    return {"N": n, "bh": bh, "peak_rss_bytes": peak, "extra_bytes": peak - base, "input_bytes": input_bytes}


def memory_rows(sizes, r: int, d: int, bh: int) -> list[dict]:
    """Run :func:`memory_probe` in a subprocess per N; adds the growth ratio between sizes."""
    rows = []
    for n in tqdm(sizes, desc="memory", leave=False):
        cmd = [sys.executable, "-m", "osa_lab.bench", "--memory-probe", str(n), "--r", str(r), "--d", str(d),
               "--bh", str(bh)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for prev, cur in zip(rows, rows[1:], strict=False):
        cur["extra_growth_vs_prev"] = cur["extra_bytes"] / max(prev["extra_bytes"], 1)
    for row in rows:
        row["peak_rss_gb"] = row["peak_rss_bytes"] / 1e9
        row["extra_gb"] = row["extra_bytes"] / 1e9
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``osa-lab bench``."""
    parser.add_argument("--sizes", type=positive_int, nargs="+", default=list(DEFAULT_SIZES),
                        help="sequence lengths N")
    parser.add_argument("--memory-sizes", type=positive_int, nargs="*", default=list(DEFAULT_MEMORY_SIZES),
                        help="N for the peak-memory measurement (bh = 8); empty to skip")
    parser.add_argument("--r", type=positive_int, default=64, help="query/key width per head")
    parser.add_argument("--d", type=positive_int, default=64, help="value width per head")
    parser.add_argument("--bh", type=positive_int, default=8, help="batch·heads for the memory measurement")
    parser.add_argument("--repeat", type=positive_int, default=5, help="timed rounds (median reported)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--output", default="bench_results/core.csv", help="CSV of the timing table")
    parser.add_argument("--quick", action="store_true", help="small sizes only (smoke test)")
    parser.add_argument("--memory-probe", type=positive_int, default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print/write the tables.

    Raises (before anything is timed): :class:`~osa_lab.errors.MethodUnavailableError` for
    ``--device cuda`` without a CUDA device, :class:`~osa_lab.errors.OutputPathError` for an
    output CSV that cannot be written. Sizes, rounds and widths are checked by argparse (ints ≥ 1).
    """
    if args.memory_probe is not None:
        print(json.dumps(memory_probe(args.memory_probe, args.r, args.d, args.bh)))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        raise MethodUnavailableError("--device cuda: no CUDA device is available here; use --device cpu")
    sizes = [64, 256] if args.quick else args.sizes
    mem_sizes = [4096, 8192] if args.quick else args.memory_sizes
    out = check_output_file(args.output, "--output")
    mem_out = out.with_name(out.stem + "_memory.csv")
    measure_memory = bool(mem_sizes) and args.device == "cpu"
    if measure_memory:
        check_output_file(mem_out, "--output (its <stem>_memory.csv)")
    info = machine_info()
    print("machine:", json.dumps(info))
    rows = [time_row(n, args.r, args.d, args.device, torch.float32, args.repeat) for n in tqdm(sizes, desc="bench")]
    emit_table(rows, out, title="OSA low-rank vs SDPA vs dense (times in seconds)")
    if measure_memory:
        emit_table(memory_rows(mem_sizes, args.r, args.d, args.bh), mem_out,
                   title=f"peak memory of low-rank forward+backward (bh={args.bh}, r={args.r}, d_v={args.d})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m osa_lab.bench``: the same as ``osa-lab bench`` (user errors: one line, exit 2)."""
    from osa_lab.cli import main as cli_main

    return cli_main(["bench", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
