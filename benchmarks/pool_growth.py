"""The CPU kernels' memory pool over a run of training steps: buffers made and bytes held.

The small-N action keeps ``Sᵀ``, the output and the Chebyshev iterates of every OSA layer from
the forward to the backward in memory from a per-thread pool (``osa_lab/ops/cpu/pool.py``), so
that a step does not page-fault them in afresh. The iterates' size follows the degree, which
rises as ``‖S‖`` grows through training; a buffer the pool makes is memory faulted in from the
kernel and then held (up to ``POOL_LIMIT_BYTES``).

This runs ``--steps`` training steps of the network of ``benchmarks/train_throughput.py``
(``skipless-osa``, depth 6, width 64, 4 heads, batch 64, every α times ``--alpha-scale``, one
fixed batch, AdamW at 1e-3) from an empty pool and reports, per size: the buffers the pool made
(``buffers_made``; three per layer is the least, ``st``, the output and the iterates; counted
among the buffers it holds after each step, so one made and evicted within a step is missed,
which cannot happen below its limit), the MiB it made them of, the last step at which it made
one, the degrees of the layers' actions in the last step and the minor page faults of the steps. ``--baseline REV`` runs the same steps with the package as
it was at git revision ``REV`` (:mod:`osa_lab.benchmarking.baseline`; its own pool), after the
current one. The pool is read through its module state (``_POOL``), which both have.

    .venv/bin/python benchmarks/pool_growth.py --steps 30 --baseline HEAD~1

Prints a table and writes ``bench_results/pool_growth.csv``.
"""

from __future__ import annotations

import contextlib
import resource
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_throughput import SIZES, scale_alpha, step_fn  # noqa: E402

from osa_lab.arguments import ArgumentParser, positive_float, positive_int  # noqa: E402
from osa_lab.benchmarking.baseline import baseline_package  # noqa: E402
from osa_lab.benchmarking.timing import emit_table  # noqa: E402
from osa_lab.ops import cpu  # noqa: E402


@contextlib.contextmanager
def _degrees_recorded(lab: ModuleType) -> Iterator[list[int]]:
    """A list that the degrees of the OSA layers' actions go into inside the block (``lab``'s
    ``chebyshev_degree`` wrapped, restored after it)."""
    seen: list[int] = []
    chebyshev = lab.ops.expm.chebyshev
    degree = chebyshev.chebyshev_degree

    def record(rho, dtype):
        seen.append(degree(rho, dtype))
        return seen[-1]

    chebyshev.chebyshev_degree = record
    try:
        yield seen
    finally:
        chebyshev.chebyshev_degree = degree


def _note_new_buffers(pool: ModuleType, made: dict) -> bool:
    """Add the buffers ``pool`` holds that ``made`` does not know (id → weak reference, size);
    True if there were any. A function of its own: a reference left in a caller's variable would
    keep a buffer in use for the pool's next request, and the pool would make another."""
    new = False
    for arrays in pool._POOL.arrays.values():
        for array in arrays:
            known = made.get(id(array))
            if known is None or known[0]() is not array:  # (an id can come back once a buffer is freed)
                made[id(array)] = (weakref.ref(array), array.nbytes)
                new = True
    return new


def run(lab: ModuleType, size: str, steps: int, alpha_scale: float) -> dict:
    """One run of ``steps`` steps with package ``lab`` from an empty pool."""
    name, image_size, patch, sequence = next(s for s in SIZES if s[0].split()[0] == size)
    step, _, _ = step_fn("skipless-osa", image_size, patch, 64, {"depth": 6, "dim": 64, "heads": 4}, sequence, lab)
    scale_alpha(step, alpha_scale)
    pool = lab.ops.cpu.pool
    pool.release()
    made: dict[int, tuple[weakref.ref, int]] = {}  # every buffer the pool has held: a weak reference, its size
    last_new = 0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt  # the steps only, not the model's building
    for i in range(1, steps + 1):
        with _degrees_recorded(lab) if i == steps else contextlib.nullcontext([]) as degrees:
            step()  # the degrees kept are the last step's
        if _note_new_buffers(pool, made):
            last_new = i
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return {"size": size, "package": lab.__name__, "steps": steps, "buffers_made": len(made),
            "mib_made": sum(nbytes for _, nbytes in made.values()) / 2**20, "mib_held": pool._POOL.bytes / 2**20,
            "last_new_buffer_at_step": last_new, "degrees_last_step": " ".join(map(str, degrees)),
            "minor_faults": faults}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    names = [s[0].split()[0] for s in SIZES]
    parser.add_argument("--sizes", nargs="+", choices=names, default=["mnist1d", "mnist"])
    parser.add_argument("--steps", type=positive_int, default=30)
    parser.add_argument("--alpha-scale", type=positive_float, default=30.0, help="multiply OSA's initial α by this")
    parser.add_argument("--baseline", metavar="REV", help="also run the package as of this git revision")
    parser.add_argument("--out", default="bench_results/pool_growth.csv")
    args = parser.parse_args(argv)
    if not cpu.usable(torch.ones(1, 2, 2), torch.ones(1, 2, 2), torch.ones(1, 2, 2)):
        parser.error(f"the CPU kernels are not in use here ({cpu.status()})")
    torch.set_num_threads(1)
    import osa_lab

    with baseline_package(args.baseline, parser.error) as baseline:
        rows = []
        for size in args.sizes:
            for lab in (osa_lab, baseline):
                if lab is not None:
                    rows.append(run(lab, size, args.steps, args.alpha_scale))
                    print(f"{size} ({lab.__name__}) done", file=sys.stderr, flush=True)
    from osa_lab.fileio import atomic_to_csv
    from osa_lab.reporting.provenance import csv_columns

    table = emit_table(rows, None, title=f"the CPU pool over {args.steps} training steps, α × {args.alpha_scale:g}")
    atomic_to_csv(table.assign(**csv_columns(vars(args))), args.out)  # provenance to the CSV only
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
