"""Seed groups: the per-seed CPU time of a training step in a group of G against a solo run.

For each preset (``vit``, ``skipless-osa``, ``skipless-ssa``), depth and group size G (default
1, 2, 4, 10), a group of G members of one configuration (seeds 0…G−1) takes training steps
through :mod:`osa_lab.studies.training.group` — the stacked forward and backward under
``vmap``, then each member's clipping, AdamW step and schedule — on MNIST-1D batches in each
member's own data order. G = 1 is the solo loop (:meth:`TrainingRun.train_step`). A "step" of a
group is one step of every member; the per-seed time is the group step's time divided by G.

All configurations are timed side by side in one process, interleaved in rounds (one group
step of every configuration per round, order reversed every other round), median of
``--repeat`` rounds of wall time and of process CPU time (the steadier one on a shared
machine). The members' AdamW steps take the multi-tensor path (``adamw`` column); ``--adamw-ab``
also times every group with them on the single-tensor path a solo run takes, side by side. ``cpu_per_seed_ratio`` is the per-seed CPU time over the solo run's of the same
preset and depth; the targets are ≤ 0.2 for skipless-osa and ≤ 0.25 for vit at G = 10, depth 4.

Memory: each configuration also runs three steps in a fresh process of its own (data loaded,
group built), which reports its peak resident set during those steps (``peak_rss_mib``: Linux
``VmHWM`` reset after building, so the data's loading and the parent process do not count) and
that peak above the resident set before the steps (``step_rss_mib``: activations kept for the
backward, gradients, AdamW's moments; ``step_rss_mib_per_seed`` = ÷ G). ``--no-memory`` leaves
it out.

    .venv/bin/python benchmarks/seed_groups.py                                  # the issue's table
    .venv/bin/python benchmarks/seed_groups.py --depths 4 --groups 1 10 --repeat 3

Writes the table to stdout and ``bench_results/seed_groups.csv`` (with provenance columns).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch

from osa_lab.arguments import ArgumentParser, positive_int
from osa_lab.benchmarking.timing import (
    current_rss_bytes,
    emit_table,
    fresh_memory,
    interleaved_rounds,
    machine_info,
    peak_rss_bytes,
    reset_peak_rss,
)
from osa_lab.ops import cpu as cpu_kernels
from osa_lab.studies.data import load_data
from osa_lab.studies.training import TrainConfig
from osa_lab.studies.training.group import GroupMember, SeedGroup
from osa_lab.studies.training.loop import TrainingRun, batch_order

PRESETS = ("vit", "skipless-osa", "skipless-ssa")
#: per-seed CPU time at G = 10, depth 4, over the solo run's
TARGETS = {"skipless-osa": 0.2, "vit": 0.25}


def group_step(preset: str, depth: int, size: int, *, dim: int, heads: int, batch: int, data,
               member_foreach: bool = True):  # fmt: skip
    """A closure taking one training step of every member of a group of ``size`` (seeds 0…size−1);
    ``member_foreach=False``: the members' AdamW steps by the single-tensor path (``--adamw-ab``)."""
    base = TrainConfig(preset=preset, data="mnist1d", epochs=1000, batch_size=batch, diag_every=0,
                       model={"depth": depth, "dim": dim, "heads": heads})  # fmt: skip
    members = []
    for seed in range(size):
        members.append(GroupMember(TrainingRun(dataclasses.replace(base, seed=seed), None, data, torch.device("cpu")), None))
    group = SeedGroup(members, torch.device("cpu"), member_foreach=member_foreach)
    orders = [batch_order(m.run.n_train, m.run.config.seed, 0) for m in members]
    per_epoch = members[0].run.steps_per_epoch
    calls = [0]

    def step() -> None:
        i = calls[0] % per_epoch
        calls[0] += 1
        failed = group.step(members, [o[i * batch : (i + 1) * batch] for o in orders], 0)
        if failed:
            raise RuntimeError(f"{preset} depth {depth} G={size}: a member diverged ({failed[0].error})")

    return step, sum(p.numel() for p in members[0].run.model.parameters())


def memory_probe(preset: str, depth: int, size: int, args) -> dict:
    """Peak RSS of this configuration in a fresh process (``--memory-probe``)."""
    cmd = [sys.executable, __file__, "--memory-probe", preset, str(depth), str(size), "--dim", str(args.dim),
           "--heads", str(args.heads), "--batch", str(args.batch), "--threads", str(args.threads)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:  # a row without memory figures, and the reason on stderr
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"memory probe {preset} depth {depth} G={size} failed: {why}", file=sys.stderr, flush=True)
        return dict.fromkeys(("peak_rss_mib", "step_rss_mib", "step_rss_mib_per_seed"), float("nan"))
    return json.loads(done.stdout.strip().splitlines()[-1])


def _probe(preset: str, depth: int, size: int, args) -> int:
    data = load_data("mnist1d")
    step, _ = group_step(preset, depth, size, dim=args.dim, heads=args.heads, batch=args.batch, data=data)
    fresh_memory()
    built = current_rss_bytes()
    reset_peak_rss()  # the mark from here (Linux VmHWM; ru_maxrss would count the parent's and the data's)
    for _ in range(3):
        step()
    peak = peak_rss_bytes()
    print(json.dumps({"peak_rss_mib": peak / 2**20, "step_rss_mib": max(0, peak - built) / 2**20,
                      "step_rss_mib_per_seed": max(0, peak - built) / 2**20 / size}))  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--depths", type=positive_int, nargs="+", default=[4, 16])
    parser.add_argument("--groups", type=positive_int, nargs="+", default=[1, 2, 4, 10], help="group sizes G")
    parser.add_argument("--dim", type=positive_int, default=32)
    parser.add_argument("--heads", type=positive_int, default=4)
    parser.add_argument("--batch", type=positive_int, default=100)
    parser.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--repeat", type=positive_int, default=5, help="interleaved rounds")
    parser.add_argument("--no-memory", action="store_true", help="leave out the per-configuration memory probes")
    parser.add_argument("--adamw-ab", action="store_true",
                        help="also time each group of G > 1 with its members' AdamW steps by the single-tensor path "
                             "(rows with adamw = single; implies --no-memory)")  # fmt: skip
    parser.add_argument("--out", default="bench_results/seed_groups.csv")
    parser.add_argument("--memory-probe", nargs=3, metavar=("PRESET", "DEPTH", "G"), help=argparse_hidden())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.memory_probe:
        preset, depth, size = args.memory_probe
        return _probe(preset, int(depth), int(size), args)
    if 1 not in args.groups:
        parser.error("--groups needs 1 (the solo run every ratio is taken against)")
    data = load_data("mnist1d")
    built, params = {}, {}
    for preset in args.presets:
        for depth in args.depths:
            for size in args.groups:
                for adamw in ("foreach", "single") if args.adamw_ab and size > 1 else ("foreach",):
                    step, n = group_step(preset, depth, size, dim=args.dim, heads=args.heads, batch=args.batch,
                                         data=data, member_foreach=adamw == "foreach")  # fmt: skip
                    built[(preset, depth, size, adamw)], params[(preset, depth)] = step, n
                    print(f"built {preset} depth {depth} G={size} adamw={adamw}", file=sys.stderr, flush=True)
    wall, cpu = interleaved_rounds(built, args.repeat, warmup=1)
    rows = []
    for (preset, depth, size, adamw), _ in built.items():
        w, c = statistics.median(wall[(preset, depth, size, adamw)]), statistics.median(cpu[(preset, depth, size, adamw)])
        w1, c1 = statistics.median(wall[(preset, depth, 1, "foreach")]), statistics.median(cpu[(preset, depth, 1, "foreach")])
        target = TARGETS.get(preset) if depth == 4 and size == 10 else None
        rows.append({"preset": preset, "depth": depth, "G": size, "adamw": adamw if size > 1 else "solo loop",
                     "params": params[(preset, depth)],
                     "ms_per_group_step": 1e3 * w, "ms_per_seed": 1e3 * w / size,
                     "cpu_ms_per_seed": 1e3 * c / size, "per_seed_ratio": (w / size) / w1,
                     "cpu_per_seed_ratio": (c / size) / c1, "target": f"≤ {target}" if target else ""})  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out, index=False)  # the timings at once; rewritten with memory below
    if not args.no_memory and not args.adamw_ab:
        for row in rows:
            row.update(memory_probe(row["preset"], row["depth"], row["G"], args))
            print(f"memory {row['preset']} depth {row['depth']} G={row['G']}", file=sys.stderr, flush=True)
    try:
        from osa_lab.reporting.provenance import csv_columns

        prov = csv_columns(vars(args))
    except ImportError:  # pragma: no cover
        prov = {k: str(v) for k, v in machine_info().items()}
    prov.update(cpu_kernels=cpu_kernels.status(), torch_cpu_isa=torch.backends.cpu.get_cpu_capability(),
                rounds=args.repeat)  # fmt: skip
    title = (f"seed groups: training step per seed, width {args.dim}, batch {args.batch}, MNIST-1D, "
             f"{args.threads} thread(s), median of {args.repeat} interleaved rounds")  # fmt: skip
    table = emit_table(rows, None, title=title)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    table.assign(**prov).to_csv(args.out, index=False)
    print(f"wrote {args.out}")
    return 0


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
