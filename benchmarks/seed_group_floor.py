"""Seed groups: the floor — how low can the per-seed cost of a group of G go on this CPU?

A group shares the dispatch of each operation among its G members; the arithmetic stays per
seed. This script measures, for the solo training step (``TrainingRun.train_step``: forward,
backward, clipping, AdamW step) of each preset at one depth (default ``vit`` and
``skipless-osa``, depth 4, width 32, 4 heads, batch 100, MNIST-1D, 1 thread):

* ``gflop_per_step``: the step's matrix-product FLOPs (:class:`torch.utils.flop_counter.FlopCounterMode`:
  ``mm``/``bmm``/``addmm``/``baddbmm``/convolution/SDPA, forward and backward; the OSA CPU
  kernels' own arithmetic — the small r×r matrix functions — is not counted, it is
  listed by time below);
* ``step_cpu_ms``: the step's process CPU time without the profiler (median of ``--repeat``);
* from :mod:`torch.profiler` (``--profile-steps`` steps; the profiler adds its own cost to every
  operation, so these are shares of ``profiled_step_cpu_ms``, the profiled step's CPU time):
  ``ops_per_step`` (operations recorded), ``matmul_ms`` (self time of the matrix-product
  kernels), ``osa_kernel_ms`` (operations of the ``osa_lab`` CPU kernels), ``other_aten_ms``
  (every other ``aten::`` operation: element-wise, softmax, reductions, copies, the optimiser's),
  ``unattributed_ms`` (the rest: Python, autograd engine, between operations) and ``matmul_share``;
* ``achieved_gflops``: ``gflop_per_step`` ÷ ``matmul_ms`` (inside the step);
* a microbenchmark of every distinct matrix product of the step at its own shapes, alone in a
  loop: ``matmul_isolated_ms`` (Σ calls × isolated time, the step's products at this CPU's
  single-thread throughput; ``isolated_gflops``; ``replayed_flop_share``: the replayed
  products' FLOPs over ``gflop_per_step``, which says how much of the step's products the
  replay covers) and ``matmul_g10_ms_per_seed`` (each product as one ``bmm`` over a
  leading member dimension of G = ``--group``, time ÷ G: what the products of a group cost per
  seed when batched);
* ``adamw_single_ms`` and ``adamw_foreach_ms``: the step's AdamW update alone (on the last
  step's gradients, 20 updates per round, the two paths alternating), by PyTorch's CPU default
  (the single-tensor path, a solo run's) and by the multi-tensor path a group's members use;
* the floors, the lowest per-seed ratio to a solo step a group could reach if everything but the
  matrix products' arithmetic vanished (element-wise work, the OSA kernels, the optimiser, all
  overhead): ``floor_ratio_matmul_only`` = ``matmul_g10_ms_per_seed`` ÷ ``step_cpu_ms`` (the
  products batched as ``bmm`` over the members, as ``vmap`` runs them) and
  ``floor_ratio_isolated_products`` = ``matmul_isolated_ms`` ÷ ``step_cpu_ms`` (each member's
  products at their solo throughput).

    .venv/bin/python benchmarks/seed_group_floor.py
    .venv/bin/python benchmarks/seed_group_floor.py --presets vit skipless-osa skipless-ssa --depth 16

Writes the table to stdout and ``bench_results/seed_group_floor.csv`` (with provenance columns),
and the microbenchmark's rows to ``…_matmuls.csv`` beside it.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from osa_lab.arguments import ArgumentParser, positive_int
from osa_lab.benchmarking.timing import emit_table, machine_info, time_call
from osa_lab.ops import cpu as cpu_kernels
from osa_lab.studies.data import load_data
from osa_lab.studies.training import TrainConfig
from osa_lab.studies.training.loop import TrainingRun, batch_order

#: the profiler names of the matrix-product kernels (their self time is arithmetic)
MATMUL_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm",
              "aten::mkldnn_convolution", "aten::convolution_backward")  # fmt: skip
#: the products the microbenchmark replays at their shapes
REPLAYED = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm")


def solo_step(preset: str, depth: int, *, dim: int, heads: int, batch: int, data):
    """A closure taking one solo training step (seed 0, its own data order)."""
    cfg = TrainConfig(preset=preset, data="mnist1d", epochs=1000, batch_size=batch, diag_every=0, seed=0,
                      model={"depth": depth, "dim": dim, "heads": heads})  # fmt: skip
    run = TrainingRun(cfg, None, data, torch.device("cpu"))
    order = batch_order(run.n_train, cfg.seed, 0)
    calls = [0]

    def step() -> None:
        i = calls[0] % run.steps_per_epoch
        calls[0] += 1
        run.train_step(order[i * batch : (i + 1) * batch], 0)

    return step, run


def adamw_step_ms(run: TrainingRun, rounds: int) -> tuple[float, float]:
    """Median CPU ms of the run's AdamW step on its current gradients, ``(single-tensor, foreach)``,
    the two paths alternating; the optimiser's setting is restored afterwards."""
    saved = [g.get("foreach") for g in run.optimizer.param_groups]
    times: dict[bool, list[float]] = {False: [], True: []}
    for r in range(rounds):
        for foreach in (False, True) if r % 2 == 0 else (True, False):
            for g in run.optimizer.param_groups:
                g["foreach"] = foreach
            c0 = time.process_time()
            for _ in range(20):
                run.optimizer.step()
            times[foreach].append((time.process_time() - c0) / 20)
    for g, value in zip(run.optimizer.param_groups, saved, strict=True):
        g["foreach"] = value
    return 1e3 * statistics.median(times[False]), 1e3 * statistics.median(times[True])


def _operands(name: str, shapes: list) -> tuple[list[int], list[int]] | None:
    """The two matrix operands' shapes of a recorded product (None if not a plain product)."""
    args = shapes[1:] if name in ("aten::addmm", "aten::baddbmm") else shapes  # (self, mat1, mat2, …, out?)
    mats = [s for s in args[:2] if isinstance(s, list) and len(s) >= 2]
    return (mats[0], mats[1]) if len(mats) == 2 else None


def replay(a_shape: list[int], b_shape: list[int], group: int) -> tuple[float, float, float]:
    """``(isolated seconds, seconds per member as a bmm over a member dimension of group, flops)``."""
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    mult = torch.bmm if a.dim() == 3 else torch.mm
    alone = time_call(lambda: mult(a, b), repeat=20, warmup=3, min_time=0.05)
    lead = a_shape[0] if a.dim() == 3 else 1
    ga = torch.randn(group * lead, *a_shape[-2:])
    gb = torch.randn(group * lead, *b_shape[-2:])
    batched = time_call(lambda: torch.bmm(ga, gb), repeat=20, warmup=3, min_time=0.05)
    m, k = a_shape[-2:]
    n = b_shape[-1]
    return alone, batched / group, 2.0 * lead * m * k * n


def measure(preset: str, depth: int, args, data) -> tuple[dict, list[dict]]:
    step, run = solo_step(preset, depth, dim=args.dim, heads=args.heads, batch=args.batch, data=data)
    for _ in range(3):
        step()
    with FlopCounterMode(display=False) as flops:
        step()
    gflop = flops.get_total_flops() / 1e9
    cpu = []
    for _ in range(args.repeat):
        c0 = time.process_time()
        step()
        cpu.append(time.process_time() - c0)
    step_ms = 1e3 * statistics.median(cpu)
    c0 = time.process_time()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(args.profile_steps):
            step()
    profiled_ms = 1e3 * (time.process_time() - c0) / args.profile_steps
    per_step = 1.0 / args.profile_steps / 1e3  # profiler µs in total → ms per step
    matmul = osa = other = 0.0
    n_ops = 0
    products: dict[tuple, int] = defaultdict(int)
    for ev in prof.key_averages(group_by_input_shape=True):
        self_ms = ev.self_cpu_time_total * per_step
        n_ops += ev.count
        if ev.key in MATMUL_OPS:
            matmul += self_ms
            if ev.key in REPLAYED and (ops := _operands(ev.key, ev.input_shapes)) is not None:
                products[(ev.key, tuple(ops[0]), tuple(ops[1]))] += ev.count // args.profile_steps
        elif "osa" in ev.key.lower():
            osa += self_ms
        elif ev.key.startswith("aten::"):
            other += self_ms
        # annotations (autograd nodes, ``Optimizer.step``…) wrap operations: their self time is the
        # Python and engine work around them, left to ``unattributed_ms``
    alone_ms = batched_ms = replayed_flop = 0.0
    replay_rows = []
    for (name, a_shape, b_shape), count in sorted(products.items()):
        alone, per_member, fl = replay(list(a_shape), list(b_shape), args.group)
        alone_ms += 1e3 * alone * count
        batched_ms += 1e3 * per_member * count
        replayed_flop += fl * count
        replay_rows.append({"preset": preset, "depth": depth, "op": name, "a": "x".join(map(str, a_shape)),
                            "b": "x".join(map(str, b_shape)), "calls_per_step": count,
                            "isolated_us": 1e6 * alone, "isolated_gflops": fl / alone / 1e9,
                            f"g{args.group}_us_per_member": 1e6 * per_member,
                            f"g{args.group}_gflops": fl / per_member / 1e9})  # fmt: skip
    adamw_single, adamw_foreach = adamw_step_ms(run, max(args.repeat, 2))
    row = {"preset": preset, "depth": depth, "gflop_per_step": gflop, "step_cpu_ms": step_ms,
           "ops_per_step": n_ops / args.profile_steps, "profiled_step_cpu_ms": profiled_ms,
           "matmul_ms": matmul, "osa_kernel_ms": osa, "other_aten_ms": other,
           "unattributed_ms": profiled_ms - matmul - osa - other, "matmul_share": matmul / profiled_ms,
           "achieved_gflops": gflop / (matmul / 1e3), "replayed_flop_share": replayed_flop / (gflop * 1e9),
           "matmul_isolated_ms": alone_ms,
           "isolated_gflops": gflop / (alone_ms / 1e3), f"matmul_g{args.group}_ms_per_seed": batched_ms,
           "floor_ratio_matmul_only": batched_ms / step_ms,
           "floor_ratio_isolated_products": alone_ms / step_ms, "adamw_single_ms": adamw_single,
           "adamw_foreach_ms": adamw_foreach}  # fmt: skip
    return row, replay_rows


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["vit", "skipless-osa"])
    parser.add_argument("--depth", type=positive_int, default=4)
    parser.add_argument("--dim", type=positive_int, default=32)
    parser.add_argument("--heads", type=positive_int, default=4)
    parser.add_argument("--batch", type=positive_int, default=100)
    parser.add_argument("--group", type=positive_int, default=10, help="G of the batched-product floor")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--repeat", type=positive_int, default=15, help="timed steps without the profiler")
    parser.add_argument("--profile-steps", type=positive_int, default=10)
    parser.add_argument("--out", default="bench_results/seed_group_floor.csv")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = load_data("mnist1d")
    rows, replays = [], []
    for preset in args.presets:
        print(f"measuring {preset} depth {args.depth}", file=sys.stderr, flush=True)
        row, rep = measure(preset, args.depth, args, data)
        rows.append(row)
        replays.extend(rep)
    try:
        from osa_lab.reporting.provenance import csv_columns

        prov = csv_columns(vars(args))
    except ImportError:  # pragma: no cover
        prov = {k: str(v) for k, v in machine_info().items()}
    prov.update(cpu_kernels=cpu_kernels.status(), torch_cpu_isa=torch.backends.cpu.get_cpu_capability())
    title = (f"seed-group floor: solo step, width {args.dim}, batch {args.batch}, MNIST-1D, "
             f"{args.threads} thread(s), depth {args.depth}")  # fmt: skip
    table = emit_table(rows, None, title=title)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.assign(**prov).to_csv(out, index=False)
    products = pd.DataFrame(replays)
    emit_table(products, None, title="the step's matrix products, alone and batched over members")
    products.to_csv(out.with_name(out.stem + "_matmuls.csv"), index=False)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
