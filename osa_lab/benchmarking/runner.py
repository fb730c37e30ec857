"""Speed and memory benchmark of low-rank OSA against SDPA and dense OSA.

``osa-lab bench`` (or ``python -m osa_lab.benchmarking.runner``) times, side by side in one process and
for r = d_v = 64 in float32:

* low-rank OSA (``method="auto"``) forward and forward+backward,
* ``F.scaled_dot_product_attention`` forward and forward+backward,
* dense OSA (N×N ``dense_exp``) forward where it fits (N ≤ 1024),

and reports the speed-up ratios, the achieved GFLOP/s of the low-rank path (counted flops
``2·bh·N·(2r·2r + 2·2r·d_v)``: the Gram ``UᵀU``, the projection ``UᵀV`` and the output
``U C``) next to the machine's matmul GFLOP/s measured in the same rounds, and the peak memory
of forward+backward measured in a fresh subprocess per N. It prints a table and writes CSVs.
Timings are medians; nothing here asserts on time.

The roofline table (``<stem>_roofline.csv``, at ``--roofline-sizes``) measures this
machine's limits in the same interleaved rounds: the float32 matmul rate (the largest of a
2048² product, a pass-shaped ``[q k]ᵀ[q k v]`` product, and where the CPU kernels run, the
same product by the token-pass kernel), the float64 rate of the core's 2r × 2r products (the
library's or, where they run, the core kernel's, whichever is faster) and the copy bandwidth (read + write of a buffer larger than the caches). For
each pass of the Gram engine (Gram/projection products, float64 core, output ``V + q C_q +
k C_k``), the whole low-rank forward and forward+backward it reports time, matmul flops
(counted by PyTorch's flop formulas, per dtype, on the torch path: the CPU kernels of the token
passes compute the same products), compulsory bytes, the roofline
``max(f32 flops ÷ f32 rate + f64 flops ÷ f64 rate, bytes ÷ copy bandwidth)`` and time ÷ roofline.
Where the CPU kernels run the token passes, "whole forward (torch passes)" times the same forward
with the kernels turned off (the token passes and the core's products on the torch path), in the
same rounds; every row says what :func:`osa_lab.ops.cpu.status` said and which path the token
passes took.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from osa_lab.arguments import check_output_file, positive_int
from osa_lab.benchmarking.timing import (
    copy_probe,
    count_matmul_flops,
    current_rss_bytes,
    emit_table,
    fresh_memory,
    machine_info,
    peak_rss_bytes,
    reset_peak_rss,
    roofline_seconds,
    time_call,
    time_interleaved,
)
from osa_lab.errors import ConfigurationError, MethodUnavailableError
from osa_lab.fileio import OutputLock, output_locks
from osa_lab.ops import cpu, expm
from osa_lab.ops.cpu import core_kernels, gram_kernels
from osa_lab.ops.functional import osa

DEFAULT_SIZES = (256, 1024, 4096, 16384)
DEFAULT_MEMORY_SIZES = (16384, 32768, 65536)
DEFAULT_ROOFLINE_SIZES = (4096, 16384)
#: Largest time ÷ roofline the benchmark targets (whole forward, forward+backward).
ROOFLINE_TARGETS = {"whole forward": 1.5, "whole forward+backward": 2.0}
ALPHA = 0.5


def heads_for(n: int) -> int:
    """batch·heads used at sequence length n: 32, and 8 at N ≥ 16384."""
    return 8 if n >= 16384 else 32


def lowrank_flops(bh: int, n: int, r: int, d_v: int) -> float:
    """Counted forward flops of the low-rank path: 2·bh·N·(2r·2r + 2·2r·d_v)."""
    return 2.0 * bh * n * (2 * r * 2 * r + 2 * 2 * r * d_v)


#: Largest share of the available memory (RAM, or free GPU memory for ``--device cuda``) one row
#: of the benchmark may need before ``osa-lab bench`` refuses it (``--allow-large`` overrides).
MEMORY_FRACTION = 0.5


def row_memory_bytes(n: int, r: int, d: int, bh: int, *, dense: bool = False, item: int = 4) -> int:
    """Estimated peak bytes of one benchmark row at sequence length ``n`` (an upper-side estimate,
    checked before anything is allocated).

    * token tensors: q, k, v, the leaves with their gradients, outputs and the low-rank path's
      intermediates: ``4·bh·N·(2r + d) + 4·bh·N·d`` items (the measured extra peak of the
      forward+backward is ≈ 2.3× its inputs, BENCHMARKS.md);
    * the float64 core: a few ``m × m`` matrices per head, ``m = N`` on the direct path
      (``auto`` picks it for N ≤ 4r) and ``2r`` on the low-rank path: ``8·bh·m²`` float64;
    * dense OSA (run at N ≤ 1024): ``dense_exp`` of ``bh`` N × N matrices, ≈ 8 of them;
    * SDPA runs the fused (flash) kernels, which keep O(N) memory (no N × N matrix), so it is
      covered by the token term; the 2048² matmul probe adds 3·2048² floats.
    """
    tokens = bh * n * item
    m = n if n <= 4 * r else 2 * r
    total = 4 * tokens * (2 * r + d) + 4 * tokens * d + 8 * bh * m * m * 8 + 3 * 2048 * 2048 * 4
    if dense:
        total += 8 * bh * n * n * item
    return int(total)


def available_memory_bytes(device: str = "cpu") -> int | None:
    """Memory a benchmark may use: free GPU memory for ``"cuda"``; else available RAM (psutil if
    installed, else ``MemAvailable`` of /proc/meminfo); ``None`` where it cannot be read."""
    if device == "cuda":
        return int(torch.cuda.mem_get_info()[0])
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(args: argparse.Namespace, sizes, mem_sizes, roof_sizes) -> None:
    """Refuse (before anything is allocated) a run whose largest row needs more than
    :data:`MEMORY_FRACTION` of the available memory, naming the row and ``--allow-large``."""
    if getattr(args, "allow_large", False):
        return
    need = []  # (bytes, what, device)
    for n in sizes:
        need.append((row_memory_bytes(n, args.r, args.d, heads_for(n), dense=n <= 1024),
                     f"--sizes {n} (bh = {heads_for(n)})", args.device))  # fmt: skip
    for n in roof_sizes:  # the roofline rows add the probes' [q k] / [q k v] operands and the copy buffers
        probes = 2 * heads_for(n) * n * (4 * args.r + 2 * args.d) * 4
        need.append((row_memory_bytes(n, args.r, args.d, heads_for(n)) + probes,
                     f"--roofline-sizes {n} (bh = {heads_for(n)})", "cpu"))  # fmt: skip
    for n in mem_sizes:
        need.append((row_memory_bytes(n, args.r, args.d, args.bh), f"--memory-sizes {n} (bh = {args.bh})", "cpu"))
    budgets: dict[str, int | None] = {}
    for nbytes, what, device in sorted(need, reverse=True):
        if device not in budgets:
            budgets[device] = available_memory_bytes(device)
        budget = budgets[device]
        if budget is not None and nbytes > MEMORY_FRACTION * budget:
            where = "free GPU memory" if device == "cuda" else "available RAM"
            raise ConfigurationError(
                f"{what}, r = {args.r}, d_v = {args.d} needs ≈ {nbytes / 2**30:.1f} GiB, over "
                f"{MEMORY_FRACTION:.0%} of the {budget / 2**30:.1f} GiB of {where}; use smaller sizes or widths, "
                "or pass --allow-large if you really mean it"
            )


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
    round (:func:`~osa_lab.benchmarking.timing.time_interleaved`), so each ratio compares medians taken
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


def _no_grad(fn):
    def run():
        with torch.no_grad():
            return fn()

    return run


def _torch_passes(fn, *args):
    with cpu.turned_off():
        return fn(*args)


def pass_bytes(bh: int, n: int, r: int, d: int, item: int = 4) -> dict[str, float]:
    """Compulsory bytes of each token pass (float32: ``item`` = 4), counted as for the copy probe
    (every tensor read or written once, as an ideal fused pass would):

    * Gram/projection ``Uᵀ[U V]``: read q, k, v: ``bh·N·(2r + d)``;
    * output ``V + q C_q + k C_k``: read q, k, v, write y: ``bh·N·(2r + 2d)``;
    * backward: ``Uᵀ gY`` reads q, k, gY; the gradients read q, k, v, gY and write gq, gk, gv:
      ``bh·N·(6r + 4d)``. The float64 core moves a few 2r × 2r matrices per head (counted too).
    """
    tok = bh * n * item
    core = bh * 8 * (2 * r) * (2 * r + 2 * d) * 2  # read G, P; write C (float64)
    fwd = {"Gram/projection": tok * (2 * r + d), "core": core, "output": tok * (2 * r + 2 * d)}
    fwd["whole forward"] = sum(fwd.values())
    fwd["whole forward+backward"] = fwd["whole forward"] + tok * (6 * r + 4 * d) + 2 * core
    return fwd


def _rate_probes(bh: int, n: int, r: int, d: int) -> tuple[dict, dict, dict, int]:
    """The machine's limits, probed beside the passes: ``(probes, flops of the kernels' probes,
    bytes of every probe, bytes a copy moves)``. The library's float32 products (a 2048² one and
    a pass-shaped ``[q k]ᵀ[q k v]``), its float64 2r × 2r product, the copies, and where the CPU
    kernels run, their own ``[q k]ᵀ[q k v]`` and 2r × 2r products (flops given here: PyTorch's
    formulas cannot see them)."""
    mm_n = 2048 if n >= 2048 else 256  # small N: the quick smoke test
    mm_a, mm_b = torch.randn(mm_n, mm_n), torch.randn(mm_n, mm_n)
    u_probe = torch.randn(bh, n, 2 * r)
    w_probe = torch.randn(bh, n, 2 * r + d)
    f64_a = torch.randn(bh, 2 * r, 2 * r, dtype=torch.float64)
    f64_out = torch.empty_like(f64_a)
    copy_reused, copy_fresh, copy_bytes = copy_probe(bh * n * d * 4)
    uw_bytes = (u_probe.numel() + w_probe.numel() + bh * 2 * r * (2 * r + d)) * 4
    probes = {
        f"probe: f32 matmul {mm_n}²": lambda: mm_a @ mm_b,
        "probe: f32 matmul [q k]ᵀ[q k v]": lambda: u_probe.mT @ w_probe,
        "probe: f64 matmul 2r×2r (core)": lambda: f64_a @ f64_a,
        "probe: copy (reused buffer)": copy_reused,
        "probe: copy (fresh memory)": copy_fresh,
    }
    nbytes = {f"probe: f32 matmul {mm_n}²": 3 * mm_n * mm_n * 4, "probe: f32 matmul [q k]ᵀ[q k v]": uw_bytes,
              "probe: f64 matmul 2r×2r (core)": 3 * f64_a.numel() * 8}  # fmt: skip
    kernel_flops = {}
    if gram_kernels.usable(u_probe, w_probe):
        name = "probe: f32 C kernel [q k]ᵀ[q k v]"
        probes[name] = lambda: gram_kernels.transposed_products((u_probe, w_probe), (1,))
        kernel_flops[name], nbytes[name] = {torch.float32: 2.0 * bh * n * (2 * r) * (2 * r + d)}, uw_bytes
    if core_kernels.usable(f64_a, f64_out):
        name = "probe: f64 C kernel 2r×2r (core)"
        probes[name] = lambda: core_kernels.matmul(f64_a, f64_a, f64_out)
        kernel_flops[name], nbytes[name] = {torch.float64: 2.0 * bh * (2 * r) ** 3}, 3 * f64_a.numel() * 8
    return probes, kernel_flops, nbytes, copy_bytes


def roofline_rows(n: int, r: int, d: int, repeat: int, sdpa: dict | None = None) -> list[dict]:
    """One roofline row per pass (and the probes) at sequence length ``n`` (bh from :func:`heads_for`).

    Everything, the probes included, runs interleaved round by round, so the limits and the
    passes are measured under the same conditions. ``sdpa``: the main table's row at this N
    (its ``speedup_*_vs_sdpa`` go beside the whole forward and forward+backward).
    """
    bh = heads_for(n)
    q, k, v = _inputs(bh, n, r, d, "cpu", torch.float32)
    leaves = _inputs(bh, n, r, d, "cpu", torch.float32, grad=True)
    j = expm.osa_skew_core(r, torch.full((bh,), ALPHA / r**0.5))
    tol = expm.CORE_TOLERANCE[torch.float32]

    def gram_projection():
        return expm.gram_and_projection(q, k, v)

    g, p = gram_projection()

    def core():
        chol_inv, e_minus_i, _, _ = expm.gram_core_parts(g, j, tol, True)
        return (chol_inv.mT @ (e_minus_i @ (chol_inv @ p.double()))).float()

    c = core()
    passes = {
        "Gram/projection": gram_projection,
        "core": core,
        "output": lambda: expm.gram_output(q, k, c, v),
        "whole forward": lambda: osa(q, k, v, ALPHA),
    }
    if gram_kernels.usable(q, k, v):  # the same forward on the torch path (kernels off), in the same rounds
        passes["whole forward (torch passes)"] = lambda: _torch_passes(osa, q, k, v, ALPHA)
    probes, kernel_flops, probe_bytes, copy_bytes = _rate_probes(bh, n, r, d)
    fns = {name: _no_grad(fn) for name, fn in {**probes, **passes}.items()}
    fns["whole forward+backward"] = _fwd_bwd(lambda x, y, z: osa(x, y, z, ALPHA), leaves)
    t = time_interleaved(fns, repeat=repeat)
    with cpu.turned_off():  # the kernels run the torch path's products, which PyTorch counts
        flops = {name: count_matmul_flops(fn) for name, fn in fns.items()
                 if not name.startswith("probe: copy") and name not in kernel_flops}  # fmt: skip
    flops.update(kernel_flops)
    # the machine's rates: the fastest product measured, the library's or the kernels'
    rate32 = max(flops[name][torch.float32] / t[name] for name in flops
                 if name.startswith("probe: f32"))  # fmt: skip
    rate64 = max(flops[name][torch.float64] / t[name] for name in flops if name.startswith("probe: f64"))
    bandwidth = copy_bytes / t["probe: copy (reused buffer)"]
    nbytes = pass_bytes(bh, n, r, d)
    nbytes["whole forward (torch passes)"] = nbytes["whole forward"]
    nbytes.update(probe_bytes)
    common = {"N": n, "bh": bh, "r": r, "d_v": d, "f32_gflops": rate32 / 1e9, "f64_gflops": rate64 / 1e9,
              "copy_gbps": bandwidth / 1e9, "cpu_kernels": cpu.status(), "torch_cpu_isa": torch.backends.cpu.get_cpu_capability(),
              "token_passes": "C kernels" if gram_kernels.usable(q, k, v) else "torch"}
    if hasattr(os, "getloadavg"):  # a loaded shared machine distorts the ratios: say so in every row
        common["load_1m"] = round(os.getloadavg()[0], 2)
    rows = []
    for name in fns:
        f32 = flops.get(name, {}).get(torch.float32, 0.0)
        f64 = flops.get(name, {}).get(torch.float64, 0.0)
        moved = copy_bytes if name.startswith("probe: copy") else nbytes.get(name, 0.0)
        flop_s = f32 / rate32 + f64 / rate64
        roof = roofline_seconds(flop_s, moved, bandwidth)
        row = {**common, "pass": name, "ms": 1e3 * t[name], "gflop_f32": f32 / 1e9, "gflop_f64": f64 / 1e9,
               "mbytes": moved / 1e6, "flop_ms": 1e3 * flop_s, "byte_ms": 1e3 * moved / bandwidth,
               "roofline_ms": 1e3 * roof, "bound": "flops" if flop_s >= moved / bandwidth else "bytes",
               "x_roofline": t[name] / roof, "target_x": ROOFLINE_TARGETS.get(name, float("nan")),
               "speedup_vs_sdpa": float("nan")}  # filled below where the main table has this N
        if sdpa is not None and name == "whole forward":
            row["speedup_vs_sdpa"] = sdpa["speedup_fwd_vs_sdpa"]
        if sdpa is not None and name == "whole forward+backward":
            row["speedup_vs_sdpa"] = sdpa["speedup_fwdbwd_vs_sdpa"]
        rows.append(row)
    return rows


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
        cmd = [sys.executable, "-m", "osa_lab.benchmarking.runner", "--memory-probe", str(n), "--r", str(r), "--d", str(d),
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
    parser.add_argument("--roofline-sizes", type=positive_int, nargs="*", default=list(DEFAULT_ROOFLINE_SIZES),
                        help="N for the per-pass roofline table (CPU only; empty to skip)")
    parser.add_argument("--r", type=positive_int, default=64, help="query/key width per head")
    parser.add_argument("--d", type=positive_int, default=64, help="value width per head")
    parser.add_argument("--bh", type=positive_int, default=8, help="batch·heads for the memory measurement")
    parser.add_argument("--repeat", type=positive_int, default=5, help="timed rounds (median reported)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--output", default="bench_results/core.csv", help="CSV of the timing table")
    parser.add_argument("--quick", action="store_true", help="small sizes only (smoke test)")
    parser.add_argument("--allow-large", action="store_true",
                        help=f"run rows that need more than {MEMORY_FRACTION * 100:.0f}%% of the available memory "
                        "(estimated before anything is allocated)")  # fmt: skip
    parser.add_argument("--memory-probe", type=positive_int, default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print/write the tables.

    Raises (before anything is timed): :class:`~osa_lab.errors.MethodUnavailableError` for
    ``--device cuda`` without a CUDA device, :class:`~osa_lab.errors.OutputPathError` for an
    output CSV that cannot be written, :class:`~osa_lab.errors.RunLockedError` for outputs another
    benchmark is writing, :class:`~osa_lab.errors.ConfigurationError` for a row
    that needs more than :data:`MEMORY_FRACTION` of the available memory (:func:`check_memory`;
    ``--allow-large`` overrides). Sizes, rounds and widths are checked by argparse (ints ≥ 1).
    Every CSV is written to a unique temporary and renamed; a failed write (a full disk) is an
    :class:`~osa_lab.errors.OutputWriteError` naming the path, and the earlier file is kept.
    """
    if args.memory_probe is not None:
        print(json.dumps(memory_probe(args.memory_probe, args.r, args.d, args.bh)))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        raise MethodUnavailableError("--device cuda: no CUDA device is available here; use --device cpu")
    sizes = [64, 256] if args.quick else args.sizes
    mem_sizes = ([4096, 8192] if args.memory_sizes else []) if args.quick else args.memory_sizes
    roof_sizes = ([256] if args.roofline_sizes else []) if args.quick else args.roofline_sizes
    out = check_output_file(args.output, "--output")
    mem_out = out.with_name(out.stem + "_memory.csv")
    roof_out = out.with_name(out.stem + "_roofline.csv")
    roofline = bool(roof_sizes) and args.device == "cpu"
    if roofline:
        check_output_file(roof_out, "--output (its <stem>_roofline.csv)")
    measure_memory = bool(mem_sizes) and args.device == "cpu"
    if measure_memory:
        check_output_file(mem_out, "--output (its <stem>_memory.csv)")
    check_memory(args, sizes, mem_sizes if measure_memory else [], roof_sizes if roofline else [])
    outputs = [out] + ([roof_out] if roofline else []) + ([mem_out] if measure_memory else [])
    # one benchmark at a time writes these files; each is replaced whole (emit_table) or kept
    with output_locks([OutputLock.for_file(path, f"--output {path}") for path in outputs]):
        _run_tables(args, sizes, mem_sizes, roof_sizes, out, roof_out, mem_out, roofline, measure_memory)
    return 0


def _run_tables(args, sizes, mem_sizes, roof_sizes, out, roof_out, mem_out, roofline, measure_memory) -> None:
    """Time, print and write the tables of :func:`run` (the outputs are locked)."""
    info = machine_info()
    print("machine:", json.dumps(info))
    rows = [time_row(n, args.r, args.d, args.device, torch.float32, args.repeat) for n in tqdm(sizes, desc="bench")]
    emit_table(rows, out, title="OSA low-rank vs SDPA vs dense (times in seconds)")
    if roofline:
        by_n = {row["N"]: row for row in rows}
        roof = [row for n in tqdm(roof_sizes, desc="roofline", leave=False)
                for row in roofline_rows(n, args.r, args.d, args.repeat, by_n.get(n))]
        emit_table(roof, roof_out, title="roofline per pass: time ÷ max(flops ÷ matmul rate, bytes ÷ copy "
                   "bandwidth), limits measured in the same rounds (ms, GFLOP/s, GB/s)")
    if measure_memory:
        emit_table(memory_rows(mem_sizes, args.r, args.d, args.bh), mem_out,
                   title=f"peak memory of low-rank forward+backward (bh={args.bh}, r={args.r}, d_v={args.d})")


def main(argv: list[str] | None = None) -> int:
    """``python -m osa_lab.benchmarking.runner``: the same as ``osa-lab bench`` (user errors: one line, exit 2)."""
    from osa_lab.arguments import run_command

    argv = sys.argv[1:] if argv is None else argv
    return run_command(sys.modules[__name__], "osa-lab bench", __doc__.splitlines()[0], list(argv))


if __name__ == "__main__":
    sys.exit(main())
