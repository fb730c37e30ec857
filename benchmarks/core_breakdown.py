"""Where the time of a low-rank OSA forward goes, stage by stage (table + CSV; no asserts).

The Gram engine (``osa_lab.ops.expm.gram._GramAction``) at the core benchmark's shapes: r = d_v = 64,
float32, α = 0.5. Stages: the Gram products ``UᵀU`` (3 products), ``UᵀV`` (2), the float64
2r × 2r core (Cholesky and inverse, ``M``, ``exp(M)``), ``C = L⁻ᵀ(e^M − I)L⁻¹P`` and the output
``V + q C_q + k C_k``. Also the core exponential alone against ``torch.linalg.matrix_exp`` and
one 2r × 2r product, and the counted flops of the token passes at the machine's matmul rate
(the floor for this algorithm). Every quantity is timed interleaved, round by round
(``osa_lab.benchmarking.timing.time_interleaved``), medians reported.

Run: ``.venv/bin/python benchmarks/core_breakdown.py [--rounds 9] [--output benchmarks/results/core_breakdown.csv]``.
``--variants`` times alternative designs against the current code instead (blocked one-pass
``Uᵀ[U V]``, the output into a reused ``out=`` buffer, the page faults of a fresh result,
``osa`` against ``gram_action``) → ``…_variants.csv``.
"""

from __future__ import annotations

import argparse

import torch

from osa_lab.benchmarking.runner import ALPHA, heads_for, lowrank_flops
from osa_lab.benchmarking.timing import emit_table, machine_info, time_interleaved
from osa_lab.ops import expm
from osa_lab.ops.functional import osa


def stages(n: int, rounds: int) -> list[dict]:
    bh, r = heads_for(n), 64
    gen = torch.Generator().manual_seed(0)
    a, b, v = (torch.randn(bh, n, r, generator=gen) for _ in range(3))
    j = expm.osa_skew_core(r, torch.full((bh,), ALPHA / r**0.5))
    g = expm.block_gram(a, b)
    p = torch.cat([a.mT @ v, b.mT @ v], -2).double()
    tol = expm.CORE_TOLERANCE[torch.float32]
    chol, chol_inv, _ = expm.cholesky_with_inverse(g)
    m = expm.core_matrix(chol, j, osa_core=True)
    e_minus_i = expm.core_skew_exp(m, tol=tol, minus_identity=True)
    c = (chol_inv.mT @ (e_minus_i @ (chol_inv @ p))).float()
    mm_a, mm_b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    with torch.no_grad():
        t = time_interleaved(
            {
                "Gram products UᵀU (3)": lambda: expm.block_gram(a, b),
                "projection UᵀV (2)": lambda: torch.cat([a.mT @ v, b.mT @ v], -2),
                "core: blocked Cholesky + inverse": lambda: expm.cholesky_with_inverse(g),
                "core: exp(M) − I (core_skew_exp)": lambda: expm.core_skew_exp(m, tol=tol, minus_identity=True),
                "core: all (gram_core_parts)": lambda: expm.gram_core_parts(g, j, tol, True),
                "C = L⁻ᵀ(e^M − I)L⁻¹P": lambda: chol_inv.mT @ (e_minus_i @ (chol_inv @ p)),
                "output V + q C_q + k C_k (gram_output)": lambda: expm.gram_output(a, b, c, v),
                "whole forward (gram_action)": lambda: expm.gram_action(a, b, j, v, replaced=True, osa_core=True),
                "reference: torch.linalg.matrix_exp(M)": lambda: torch.linalg.matrix_exp(m),
                "reference: one 2r×2r float64 product": lambda: m @ m,
                "reference: 2048² float32 matmul": lambda: mm_a @ mm_b,
            },
            repeat=rounds,
        )
    rate = 2 * 2048**3 / t["reference: 2048² float32 matmul"]
    floor = lowrank_flops(bh, n, r, r) / rate
    rows = [{"N": n, "bh": bh, "stage": name, "ms": 1e3 * sec} for name, sec in t.items()]
    rows.append({"N": n, "bh": bh, "stage": "floor: counted flops at the matmul rate", "ms": 1e3 * floor})
    product = t["reference: one 2r×2r float64 product"]
    for row in rows:
        row["products_2r"] = row["ms"] / (1e3 * product)
    return rows


def _blocked_gram_projection(a, b, v, block: int):
    """``Uᵀ[U V]`` in one pass over the tokens: per block of ``block`` tokens the five products
    ``aᵀa, aᵀb, bᵀb, aᵀv, bᵀv`` of slices still hot in the cache (idea 1)."""
    bh, n, r = a.shape
    d = v.shape[-1]
    acc = [torch.zeros(bh, r, w) for w in (r, r, r, d, d)]
    for s in range(0, n, block):
        xa, xb, xv = a[:, s : s + block], b[:, s : s + block], v[:, s : s + block]
        at, bt = xa.mT, xb.mT
        for out, (x, y) in zip(acc, ((at, xa), (at, xb), (bt, xb), (at, xv), (bt, xv)), strict=True):
            out.baddbmm_(x, y)
    return acc


def variants(n: int, rounds: int) -> list[dict]:
    """Alternative designs timed interleaved against the current code (ms, and minor page faults per call)."""
    bh, r = heads_for(n), 64
    gen = torch.Generator().manual_seed(0)
    a, b, v = (torch.randn(bh, n, r, generator=gen) for _ in range(3))
    c = torch.randn(bh, 2 * r, r, generator=gen) * 0.01
    out = torch.empty_like(v)
    j = expm.osa_skew_core(r, torch.full((bh,), ALPHA / r**0.5))

    def cat_single():
        w = torch.cat([a, b, v], -1)
        return w[..., : 2 * r].mT @ w

    fns = {
        "Gram/projection: 5 products (current)": lambda: (expm.block_gram(a, b), torch.cat([a.mT @ v, b.mT @ v], -2)),
        "Gram/projection: cat [q k v] + one product": cat_single,
        "Gram/projection: blocked 256 tokens": lambda: _blocked_gram_projection(a, b, v, 256),
        "Gram/projection: blocked 1024 tokens": lambda: _blocked_gram_projection(a, b, v, 1024),
        "output: gram_output, huge-page fresh result (current)": lambda: expm.gram_output(a, b, c, v),
        "output: plain fresh result": lambda: torch.baddbmm(v, a, c[:, :r]).baddbmm_(b, c[:, r:]),
        "output: out= reused buffer": lambda: torch.baddbmm(v, a, c[:, :r], out=out).baddbmm_(b, c[:, r:]),
        "fresh zeroed tensor like v (page faults)": lambda: torch.zeros_like(v),
        "fresh_output like v, zeroed (huge pages)": lambda: expm.fresh_output(v).zero_(),
        "whole forward: gram_action": lambda: expm.gram_action(a, b, j, v, replaced=True, osa_core=True),
        "whole forward: osa(method=auto)": lambda: osa(a, b, v, ALPHA),
    }
    with torch.no_grad():
        t = time_interleaved(fns, repeat=rounds)
        faults = {name: minor_faults_per_call(fn) for name, fn in fns.items()}
    return [{"N": n, "bh": bh, "variant": name, "ms": 1e3 * sec, "page_faults": faults[name]} for name, sec in t.items()]


def minor_faults_per_call(fn, calls: int = 3) -> float:
    """Minor page faults per call of ``fn`` (after one warm-up call), NaN where ``resource`` is missing."""
    try:
        import resource
    except ImportError:  # not on Windows
        return float("nan")
    fn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--output", default="benchmarks/results/core_breakdown.csv")
    parser.add_argument("--variants", action="store_true",
                        help="time alternative designs (blocked Gram pass, output memory) instead of the stages")
    args = parser.parse_args()
    print(machine_info())
    if args.variants:
        rows = [row for n in args.sizes for row in variants(n, args.rounds)]
        emit_table(rows, args.output.replace(".csv", "_variants.csv"), title="alternative designs (ms, interleaved; page faults per call)")
        return
    rows = [row for n in args.sizes for row in stages(n, args.rounds)]
    emit_table(rows, args.output, title="low-rank OSA forward by stage (ms; products_2r = multiples of one 2r×2r float64 product)")


if __name__ == "__main__":
    main()
