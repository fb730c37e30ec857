"""What ``osa()`` costs around the small-N fused action, per multi-head layer call (CPU).

A skipless-OSA layer calls ``osa(q, k, v, α)`` on head-split views of shape (batch, heads, N, r)
(``OrthogonalSelfAttention._split``); for N ≤ 4r ``osa()`` runs the fused Chebyshev action
``expm.osa_chebyshev_action`` on (batch·heads, N, r) tensors. This benchmark times, side by side
in interleaved rounds (median process time of ``--repeat`` rounds):

- ``osa()``: forward and backward of ``osa()`` from the head-split views, the output merged back
  to (batch, N, heads·r) as the layer does;
- ``osa() on (b, N, r)``: the same on contiguous (batch·heads, N, r) inputs with one α per
  matrix (no head split, no merge);
- ``fused action alone``: forward and backward of ``expm.osa_chebyshev_action`` on contiguous
  (batch·heads, N, r) inputs and the per-matrix scale ``α/√r``;

with N(0, 1) token entries and one α for every head (``--alpha``; the default puts ``‖S‖₂`` near 1
at N = 49, the size trained networks reach, docs/training.md). It reports the bound ``rho`` of
``‖S‖₂`` and the degree the action plans from it, and counts the ATen operations each call
dispatches (``TorchDispatchMode``, forward and backward).
The first row minus the second is what the layer's head-split layout costs (the action's
packing passes read strided memory, the views' autograd nodes); the second minus the third what
``osa()`` itself adds (validation, α's chain, the output check's drift).

    .venv/bin/python benchmarks/osa_call_overhead.py --sizes 20 49 --repeat 40

Before/after in one process: ``--baseline REV`` also times ``osa()`` from the package as it was
at git revision ``REV`` (exported with ``git archive`` into a temporary folder and imported as
``osa_lab_baseline``), interleaved in the same rounds as the working tree's ``osa()``. The row
``osa() at REV`` and the ``osa()`` row's ``paired_ratio`` (median, with the interquartile range, of
the per-round ratios current ÷ baseline) are the change's measurement: between processes this
machine's speed drifts by more than most changes move a layer. The calls run in the opposite
order every other round. ``--baseline HEAD`` on a clean tree times the same code twice (an A/A
run): its paired ratio shows how far from 1 noise alone takes this measurement.

Prints a table and writes ``bench_results/osa_call_overhead.csv``.
"""

from __future__ import annotations

import importlib
import math
import statistics
import sys
import time

import torch

from osa_lab.arguments import ArgumentParser, positive_float, positive_int
from osa_lab.benchmarking.baseline import baseline_package, baseline_problem, paired_quartiles
from osa_lab.benchmarking.timing import emit_table
from osa_lab.ops import expm
from osa_lab.ops.functional import osa


def _calls(n: int, batch: int, heads: int, r: int, alpha: float, baseline=None, label: str = ""):
    """The closures (``osa()`` from head-split views, on (b, N, r), the fused action alone, and
    ``baseline``'s ``osa()`` from head-split views when given), same data."""
    g = torch.Generator().manual_seed(0)
    tokens = [torch.randn(batch, n, heads * r, generator=g) for _ in range(3)]
    alpha_t = torch.full((heads,), alpha, requires_grad=True)
    grad = torch.ones(batch, n, heads * r)

    def through(fn):
        def run() -> None:
            q, k, v = (t.detach().requires_grad_(True).view(batch, n, heads, r).transpose(1, 2) for t in tokens)
            y = fn(q, k, v, alpha_t)
            y.transpose(1, 2).reshape(batch, n, heads * r).backward(grad)

        return run

    through_osa = through(osa)

    flat = [t.view(batch, n, heads, r).transpose(1, 2).reshape(-1, n, r).contiguous() for t in tokens]
    flat_grad = grad.view(batch, n, heads, r).transpose(1, 2).reshape(-1, n, r).contiguous()
    alpha_flat = alpha_t.detach().repeat(batch)

    def osa_flat() -> None:
        q, k, v = (t.detach().requires_grad_(True) for t in flat)
        osa(q, k, v, alpha_flat.requires_grad_(True)).backward(flat_grad)

    def fused_alone() -> None:
        q, k, v = (t.detach().requires_grad_(True) for t in flat)
        c = (alpha_t.detach() / math.sqrt(r)).repeat(batch).requires_grad_(True)
        y = expm.osa_chebyshev_action(q, k, c, v)
        if y is None:
            raise RuntimeError("the fused action declined these inputs (‖S‖ too large): lower --alpha")
        y.backward(flat_grad)

    with torch.no_grad():  # the bound of ‖S‖₂ the action plans its degree from (the batch's largest)
        c = (alpha_t / math.sqrt(r)).repeat(batch)
        s = expm.skew_from_scale(flat[0], flat[1], c)
        rho = float(expm.skew_spectral_bound(s).max())
    calls = {"osa()": through_osa, "osa() on (b, N, r)": osa_flat, "fused action alone": fused_alone}
    if baseline is not None:
        calls[f"osa() at {label}"] = through(baseline)
    return calls, rho, expm.chebyshev_degree(rho, torch.float32)


def _count_ops(fn) -> int:
    """The ATen operations one call of ``fn`` dispatches (forward and backward)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls += 1
            return func(*args, **(kwargs or {}))

    with Count() as counter:
        fn()
    return counter.calls


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=positive_int, nargs="+", default=[20, 49], help="token counts N")
    parser.add_argument("--batch", type=positive_int, default=64)
    parser.add_argument("--heads", type=positive_int, default=4)
    parser.add_argument("--head-dim", type=positive_int, default=16)
    parser.add_argument(
        "--alpha", type=positive_float, default=0.025, help="α of every head (default: ‖S‖₂ ≈ 1 at N = 49, as in trained networks)"
    )
    parser.add_argument("--repeat", type=positive_int, default=40)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--baseline", metavar="REV", help="also time osa() as of this git revision, interleaved (see above)")
    parser.add_argument("--out", default="bench_results/osa_call_overhead.csv")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    for n in args.sizes:
        if n > 4 * args.head_dim:
            parser.error(f"N = {n} is above 4r = {4 * args.head_dim}: osa() does not take the fused action there")
    if problem := baseline_problem(args.baseline, args.repeat):
        parser.error(problem)
    with baseline_package(args.baseline, parser.error) as package:
        baseline = importlib.import_module(f"{package.__name__}.ops.functional").osa if package else None
        rows = _measure(args, baseline)
    from osa_lab.fileio import atomic_to_csv
    from osa_lab.reporting.provenance import csv_columns

    title = f"osa() around the fused action, batch {args.batch} × {args.heads} heads, r = {args.head_dim}"
    table = emit_table(rows, None, title=title)
    # provenance goes to the CSV only; stdout keeps the readable table
    atomic_to_csv(table.assign(**csv_columns(vars(args))), args.out)
    print(f"wrote {args.out}")
    return 0


def _measure(args, baseline) -> list[dict]:
    """One row per size and call: median process time of ``args.repeat`` interleaved rounds."""
    rows = []
    for n in args.sizes:
        fns, rho, degree = _calls(n, args.batch, args.heads, args.head_dim, args.alpha, baseline, args.baseline)
        for fn in [*fns.values()] * 2:  # warm-up (and the fused action's scratch buffers)
            fn()
        times: dict = {key: [] for key in fns}
        order = list(fns.items())
        for _ in range(args.repeat):
            order.reverse()  # A B C D, D C B A, …: no call always runs first or after the same one
            for key, fn in order:
                t0 = time.process_time()
                fn()
                times[key].append(time.process_time() - t0)
        med = {key: statistics.median(v) for key, v in times.items()}
        ops = {key: _count_ops(fn) for key, fn in fns.items()}
        paired = {}
        if baseline is not None:  # per-round ratio: both calls ran in the same round, under the same load
            paired = paired_quartiles(times["osa()"], times[f"osa() at {args.baseline}"])
        for key in fns:
            rows.append({"N": n, "rho": rho, "degree": degree, "call": key, "ms_fwd_bwd": 1e3 * med[key],
                         "aten_ops": ops[key], "overhead_ms": 1e3 * (med[key] - med["fused action alone"]),
                         **(paired if key == "osa()" else dict.fromkeys(paired, math.nan))})  # fmt: skip
        print(f"N = {n} done", file=sys.stderr, flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
