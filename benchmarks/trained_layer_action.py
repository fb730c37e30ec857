"""The small-N action on the inputs a training step's OSA layers see (CPU, float32).

Builds the network of ``benchmarks/train_throughput.py`` (``skipless-osa``, depth 6, width 64,
4 heads, batch 64, every α times ``--alpha-scale``), runs one training step and keeps each
layer's inputs of ``expm.osa_chebyshev_action`` (``q, k, v`` as the layer's head-split views, and
``c``). Then, for each layer, it times forward and backward of ``expm.osa_chebyshev_action`` on
those inputs (median process time of ``--repeat`` rounds) and reports the CPU kernels' bound
``rho`` of ``‖S‖₂`` (the batch's largest, with the rounding allowance) that the degree is planned
from, the degree, and how many of the batch's matrices the kernels squared for that bound
(``squared``, of ``matrices``; ``osa_lab.ops.cpu.prepare``).

Random ``q, k`` (``benchmarks/osa_call_overhead.py``) give every matrix nearly the same norm; a
network's heads do not, which is what the bound's selection (docs/cpu_kernels.md) uses.

Before/after in one process: ``--baseline REV`` also times the action of the package as it was at
git revision ``REV`` (:mod:`osa_lab.benchmarking.baseline`), in the same rounds (the order
reversed every other round), on the same inputs, and reports ``paired_ratio`` (median, with
``paired_ratio_q1``/``_q3``, of the per-round ratios current ÷ baseline) and ``output_rel_diff``,
the relative difference of the two outputs.

    .venv/bin/python benchmarks/trained_layer_action.py --sizes mnist1d mnist --alpha-scale 30 --baseline HEAD~1

Prints a table and writes ``bench_results/trained_layer_action.csv``.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_throughput import SIZES, scale_alpha, step_fn  # noqa: E402

from osa_lab.arguments import ArgumentParser, positive_float, positive_int  # noqa: E402
from osa_lab.benchmarking.baseline import baseline_package, baseline_problem, paired_quartiles  # noqa: E402
from osa_lab.benchmarking.timing import emit_table, interleaved_rounds  # noqa: E402
from osa_lab.ops import cpu, expm  # noqa: E402


def layer_inputs(size: str, alpha_scale: float) -> list[tuple[torch.Tensor, ...]]:
    """``(q, k, c, v)`` of every OSA layer's call of the fused action in one training step."""
    name, image_size, patch, sequence = next(s for s in SIZES if s[0].split()[0] == size)
    step, _, _ = step_fn("skipless-osa", image_size, patch, 64, {"depth": 6, "dim": 64, "heads": 4}, sequence)
    scale_alpha(step, alpha_scale)
    kept: list = []
    action = expm.osa_chebyshev_action

    def keep(q, k, c, v, **kwargs):
        kept.append(tuple(t.detach().clone() for t in (q, k, c, v)))  # clone keeps a view's strides
        return action(q, k, c, v, **kwargs)

    expm.osa_chebyshev_action = keep
    try:
        step()
    finally:
        expm.osa_chebyshev_action = action
    return kept


class DeclinedError(Exception):
    """The fused action declined a layer's inputs (their ‖S‖ needs more terms than it takes)."""


def _fwd_bwd(action, inputs):
    def run() -> torch.Tensor:
        leaves = [t.clone().requires_grad_(True) for t in inputs]
        y = action(*leaves)
        if y is None:
            raise DeclinedError("the fused action declined a layer's inputs (‖S‖ too large): lower --alpha-scale")
        y.backward(torch.ones_like(y))
        return y.detach()

    return run


def _kernel_bound(inputs) -> tuple[float, int, int]:
    """(the batch's largest bound with the allowance, matrices squared for it, matrices): one call
    of the current kernels' ``prepare``."""
    q, k, c, _ = inputs
    n = q.shape[-2]
    _, bound, squared = cpu.prepare(q, k, c.reshape(-1), expm.small_skew_bound(n, q.dtype))
    return float(expm.skew_bound_with_allowance(bound, n, q.dtype).max()), squared, q.shape[:-2].numel()


def measure(args, baseline) -> list[dict]:
    rows = []
    for size in args.sizes:
        for layer, inputs in enumerate(layer_inputs(size, args.alpha_scale)):
            q = inputs[0]
            rho, squared, matrices = _kernel_bound(inputs)
            fns = {"current": _fwd_bwd(expm.osa_chebyshev_action, inputs)}
            if baseline is not None:
                fns["baseline"] = _fwd_bwd(baseline.ops.expm.osa_chebyshev_action, inputs)
            outputs = {key: fn() for key, fn in fns.items()}  # warm-up, and the outputs compared
            _, times = interleaved_rounds(fns, args.repeat, warmup=0)  # process time; warmed up above
            row = {"size": size, "N": q.shape[-2], "layer": layer, "matrices": matrices, "squared": squared,
                   "rho": rho, "degree": expm.chebyshev_degree(rho, q.dtype),
                   "ms_fwd_bwd": 1e3 * statistics.median(times["current"])}  # fmt: skip
            if baseline is not None:
                diff = (outputs["current"] - outputs["baseline"]).norm() / outputs["baseline"].norm()
                row.update(ms_fwd_bwd_baseline=1e3 * statistics.median(times["baseline"]),
                           **paired_quartiles(times["current"], times["baseline"]), output_rel_diff=float(diff))  # fmt: skip
            rows.append(row)
        print(f"{size} done", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    names = [s[0].split()[0] for s in SIZES]
    parser.add_argument("--sizes", nargs="+", choices=names, default=["mnist1d", "mnist"])
    parser.add_argument("--alpha-scale", type=positive_float, default=30.0, help="multiply OSA's initial α by this")
    parser.add_argument("--repeat", type=positive_int, default=30)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--baseline", metavar="REV", help="also time the action as of this git revision, interleaved")
    parser.add_argument("--out", default="bench_results/trained_layer_action.csv")
    args = parser.parse_args(argv)
    if problem := baseline_problem(args.baseline, args.repeat):
        parser.error(problem)
    if not cpu.usable(torch.ones(1, 2, 2), torch.ones(1, 2, 2), torch.ones(1, 2, 2)):
        parser.error(f"the CPU kernels are not in use here ({cpu.status()})")
    torch.set_num_threads(args.threads)
    with baseline_package(args.baseline, parser.error) as baseline:
        try:
            rows = measure(args, baseline)
        except DeclinedError as exc:
            parser.error(str(exc))
    from osa_lab.fileio import atomic_to_csv
    from osa_lab.reporting.provenance import csv_columns

    table = emit_table(rows, None, title=f"the small-N action on a training step's layer inputs, α × {args.alpha_scale:g}")
    provenance = csv_columns(vars(args))
    provenance.update(cpu_kernels=cpu.status(), torch_cpu_isa=torch.backends.cpu.get_cpu_capability())
    atomic_to_csv(table.assign(**provenance), args.out)  # provenance to the CSV only
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
