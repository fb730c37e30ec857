"""Builds of the CPU kernels timed against each other in one process: ``osa()`` forward and
backward with each build in turn, in interleaved rounds.

Comparing builds in separate processes mixes the builds' difference with the processes' (memory
placement, the machine's load at the time); here every build runs on the same tensors in the
same process, round after round, the order reversed every other round. Each build is a
``--variant NAME=MARCH[:DEFINE=INT,…]``: the ``-march`` target and the register blocks set by
``-D`` (the ``#ifndef`` blocks of ``osa_lab/ops/cpu/*.c``: ``MR`` for the small-N action;
``TN_ROWS``, ``TN_VECS``, ``NN_ROWS``, ``NN_VECS``, ``CORE_ROWS``, ``CORE_VECS`` for the Gram
engine's passes and the core; ``PREFETCH_AHEAD``, the small-N action's prefetch distance).
``--heads H`` hands ``osa()`` a layer's head-split views of H heads, as the training step does. The first variant is the baseline of the ratios. Before timing,
every build's output (and gradients) is compared with the first build's: a build that computes
something else is not timed. ``NAME=pytorch`` times the PyTorch path (``build.turned_off()``)
beside the builds, and ``NAME=generic`` the default build's last resort (no ``-march``, no OpenMP);
the ``path`` column says whether ``osa()`` took the build's kernels or stepped aside to the
PyTorch path (builds without hardware vectors do).

    python benchmarks/cpu_build_ab.py --n 20 --heads 4 --variant pytorch=pytorch --variant native=native \
        --variant avx2=x86-64-v3 --variant x86-64=x86-64 --variant generic=generic

    python benchmarks/cpu_build_ab.py --n 20 49 --variant native=native --variant avx2=x86-64-v3 \\
        --variant avx2_mr3=x86-64-v3:MR=3 --out bench_results/cpu_build_ab.csv

``osa()`` takes the small-N action for N ≤ 4·width and the low-rank engine above it, so one
command can time either. Nothing here asserts on time; the machine, torch's CPU instruction set
and the load are written beside the figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

import pandas as pd
import torch

import osa_lab
from osa_lab.arguments import check_output_file, positive_int
from osa_lab.benchmarking.timing import emit_table, interleaved_rounds
from osa_lab.errors import ConfigurationError, MethodUnavailableError, is_user_error
from osa_lab.fileio import atomic_to_csv
from osa_lab.ops.cpu import build

#: Largest relative difference of a build's output and gradients from the first build's; the
#: builds sum in the same order, so correct builds agree far below this.
SAME_RESULT = 1e-4

#: the ``--variant`` target that times the PyTorch path instead of a build
PYTORCH = "pytorch"


def _using(lib):
    """The block in which ``osa()`` takes ``lib``'s kernels (None: the PyTorch path)."""
    return build.turned_off() if lib is None else build.using_library(lib)


def _path_taken(lib, q, k, v) -> str:
    """Whether ``osa()`` runs ``lib``'s kernels on these tensors or the PyTorch path."""
    from osa_lab.ops.cpu import gram_kernels, kernels

    with _using(lib):
        small_n = q.shape[-2] <= 4 * q.shape[-1]
        used = kernels.usable(q, k, v) if small_n else gram_kernels.usable(q.detach())
    return "C kernels" if used else "PyTorch"


def _variant(text: str) -> tuple[str, str, dict[str, int]]:
    """``NAME=MARCH[:DEFINE=INT,…]`` → (name, march, defines)."""
    name, sep, spec = text.partition("=")
    if not sep or not name or not spec:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=MARCH[:DEFINE=INT,...], e.g. avx2=x86-64-v3:MR=3")
    march, _, rest = spec.partition(":")
    if march == PYTORCH and rest:
        raise argparse.ArgumentTypeError(f"{text!r}: the PyTorch path takes no defines")
    defines = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        try:
            defines[key] = int(value)
        except ValueError:
            eq = ""
        if not eq:
            raise argparse.ArgumentTypeError(f"{item!r} in {text!r}: a define is NAME=INT, e.g. MR=3")
    return name, march, defines


def _inputs(batch: int, n: int, width: int, heads: int, g: torch.Generator, grad: bool):
    """``(leaves, q, k, v)``: with one head, (batch, N, width) leaves used as they are; with more, a
    layer's head-split views ``(batch/heads, heads, N, width)`` of (batch/heads, N, heads·width) leaves."""
    shape = (batch, n, width) if heads == 1 else (batch // heads, n, heads * width)
    leaves = [torch.randn(*shape, generator=g).requires_grad_(grad) for _ in range(3)]
    if heads == 1:
        return leaves, *leaves
    return leaves, *(t.view(batch // heads, n, heads, width).transpose(1, 2) for t in leaves)


def _step(lib, leaves, q, k, v, alpha: float, backward: bool):
    """One timed call with ``lib``: ``osa()``, and its backward where asked; returns the output."""
    def run() -> torch.Tensor:
        with _using(lib):
            if not backward:
                with torch.no_grad():
                    return osa_lab.osa(q, k, v, alpha)
            for t in leaves:
                t.grad = None
            y = osa_lab.osa(q, k, v, alpha)
            y.backward(torch.ones_like(y))
            return y.detach()

    return run


def _result(lib, leaves, q, k, v, alpha: float, backward: bool) -> list[torch.Tensor]:
    """The output (and the gradients of the leaves behind q, k, v) of one call with ``lib``."""
    y = _step(lib, leaves, q, k, v, alpha, backward)()
    return [y, *([t.grad.clone() for t in leaves] if backward else [])]


def _largest_difference(first: list[torch.Tensor], other: list[torch.Tensor]) -> float:
    """The largest relative difference ‖a − b‖ / ‖b‖ over the results (float64 norms)."""
    return max(
        float(torch.linalg.vector_norm((a - b).double()) / torch.linalg.vector_norm(b.double()).clamp_min(1e-300))
        for a, b in zip(other, first, strict=True)
    )


def _measure(args: argparse.Namespace, libs: dict) -> list[dict]:
    """One row per build and N: the per-call time and the per-round ratios to the first build."""
    names = list(libs)
    g = torch.Generator().manual_seed(0)
    meta = {"threads": args.threads, "batch": args.batch, "heads": args.heads, "width": args.width, "alpha": args.alpha,
            "backward": not args.forward_only, "rounds": args.rounds, "calls": args.calls,
            "torch_cpu_isa": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "machine": platform.processor() or platform.machine()}  # fmt: skip
    rows = []
    for n in args.n:
        tensors = _inputs(args.batch, n, args.width, args.heads, g, not args.forward_only)
        # a build that computes something else (a register block the code does not handle) is not timed
        first = _result(libs[names[0]], *tensors, args.alpha, not args.forward_only)
        for name in names[1:]:
            difference = _largest_difference(first, _result(libs[name], *tensors, args.alpha, not args.forward_only))
            if not difference <= SAME_RESULT:
                raise ConfigurationError(f"build {name!r} differs from {names[0]!r} at N = {n} (relative difference "
                                         f"{difference:.2e} > {SAME_RESULT:g}): not timed")  # fmt: skip
        steps = {name: _step(libs[name], *tensors, args.alpha, not args.forward_only) for name in names}
        load = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else float("nan")
        print(f"N = {n}: {args.rounds} rounds × {len(names)} builds …", flush=True)
        times, _ = interleaved_rounds(steps, args.rounds, warmup=3, calls=args.calls)  # wall seconds
        base = times[names[0]]
        for name, march, defines in args.variant:
            ratios = sorted(a / b for a, b in zip(times[name], base, strict=True))
            quarter = len(ratios) // 4
            with _using(libs[name]):
                status = build.status()
            rows.append({"variant": name, "march": march, "defines": " ".join(f"{k}={v}" for k, v in defines.items()),
                         "cpu_kernels": status, "path": _path_taken(libs[name], *tensors[1:]),
                         "N": n, "ms_median": 1e3 * statistics.median(times[name]),
                         "ratio_to_first": statistics.median(ratios), "ratio_q1": ratios[quarter],
                         "ratio_q3": ratios[-1 - quarter], "load_1m": load, **meta})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", type=_variant, action="append", required=True,
                    help="NAME=MARCH[:DEFINE=INT,...]; at least two, the first is the baseline")  # fmt: skip
    ap.add_argument("--n", type=positive_int, nargs="+", default=[20, 49], help="sequence lengths N (default 20 49)")
    ap.add_argument("--batch", type=positive_int, default=256, help="matrices per call (default 256)")
    ap.add_argument("--width", type=positive_int, default=16, help="width of q, k and v (default 16)")
    ap.add_argument("--heads", type=positive_int, default=1,
                    help="read q, k, v as a layer's head-split views of this many heads (default 1: plain tensors)")
    ap.add_argument("--alpha", type=float, default=0.1, help="α of osa() (default 0.1)")
    ap.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1, as in the training step)")
    ap.add_argument("--rounds", type=positive_int, default=40, help="interleaved rounds (default 40)")
    ap.add_argument("--calls", type=positive_int, default=5, help="calls per round and build (default 5)")
    ap.add_argument("--forward-only", action="store_true", help="time the forward alone, without autograd")
    ap.add_argument("--out", default="bench_results/cpu_build_ab.csv", help="CSV to write")
    args = ap.parse_args(argv)
    names = [name for name, _, _ in args.variant]
    if len(names) < 2 or len(set(names)) != len(names):
        ap.error("--variant: give at least two, with different names")
    if args.batch % args.heads:
        ap.error(f"--batch {args.batch} is not a multiple of --heads {args.heads}: choose a batch of whole layers")
    out = Path(args.out)
    try:
        check_output_file(out, "--out")
        if not build.enabled():
            raise MethodUnavailableError("the CPU kernels are turned off (OSA_LAB_CPU_KERNELS=0)")
        libs = {}
        for name, march, defines in args.variant:
            print(f"building {name}: -march={march} {' '.join(f'-D{k}={v}' for k, v in defines.items())}", flush=True)
            libs[name] = None if march == PYTORCH else build.compile_library(march, defines)
    except Exception as err:
        if not is_user_error(err):
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    try:
        rows = _measure(args, libs)
    except Exception as err:
        if not is_user_error(err):
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    from osa_lab.reporting.provenance import csv_columns

    table = pd.DataFrame(rows)
    shown = ["variant", "march", "defines", "path", "N", "ms_median", "ratio_to_first", "ratio_q1", "ratio_q3"]
    emit_table(table[shown], None, title=f"osa() per call, ratios to {names[0]!r} (median, IQR)")
    # every column, the builds' status among them, and the commit, time and machine
    print(f"wrote {atomic_to_csv(table.assign(**csv_columns(vars(args))), out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
