"""Scaling of the Dask grid runner (osa_lab.studies.grid): a Jacobian or training grid at 1 and 2 workers,
and the scheduler's per-task overhead for tiny tasks (table + CSV; no asserts).

Cases (each run once; the tables are checked to be identical across placements):

1. ``serial``: every task in this process (``--workers 1``);
2. ``local, cold``: ``--workers 2`` as a user runs it — LocalCluster start, worker imports
   and the grid;
3. ``local, warm``: the same grid on an already started 2-worker cluster (started with the
   runner's own settings; every worker has run one small task of the same kind, as the
   in-process case has before its timing), i.e. the steady-state speed-up of a long study;
4. tiny tasks (a function returning its argument) in-process and on the warm cluster: the
   per-task cost of the scheduler round trip, result transfer and bookkeeping.

Run: ``.venv/bin/python benchmarks/grid_scaling.py [--kind jacobian|train] [--seeds 4]
[--output benchmarks/results/grid_scaling.csv]``. The load average is printed before and after:
on a shared machine the 2-worker figures are pessimistic.
"""

from __future__ import annotations

import argparse
import os
import time

import pandas as pd

from osa_lab.benchmarking.timing import emit_table, machine_info
from osa_lab.studies.grid import GridOptions, Task, cluster_client, run_grid


def identity(i: int) -> int:
    """The tiny task."""
    return i


def jacobian_tasks(seeds: int, depth: int, tokens: int, dim: int) -> list[Task]:
    from osa_lab.studies.jacobian import jacobian_depth_profile

    return [
        Task(jacobian_depth_profile,
             {"preset": p, "depth": depth, "tokens": tokens, "dim": dim, "seed": s, "algorithm": "exact"},
             {"preset": p, "seed": s})  # fmt: skip
        for p in ("pure-osa", "pure-ssa")
        for s in range(seeds)
    ]


def warm_up(kind: str) -> None:
    """One small task of ``kind`` (first-call costs: lazy imports, allocator, autograd set-up).

    Measured here: the first exact-κ profile of a process takes ≈ 2 s longer than the next ones,
    which a short grid pays once in-process but once per worker on a cluster.
    """
    import torch

    torch.set_num_threads(1)
    if kind == "jacobian":
        from osa_lab.studies.jacobian import jacobian_depth_profile

        for preset in ("pure-osa", "pure-ssa"):
            jacobian_depth_profile(preset=preset, depth=2, tokens=8, dim=8, seed=0, algorithm="exact")
    else:
        import osa_lab.studies.training  # noqa: F401


def train_tasks(seeds: int, epochs: int) -> list[Task]:
    from osa_lab.studies.training.compare import _compare_task
    from osa_lab.studies.training.config import TrainConfig

    base = TrainConfig(data="digits", epochs=epochs, diag_every=0, diag_samples=16,
                       model={"depth": 2, "dim": 32, "heads": 2})  # fmt: skip
    return [
        Task(_compare_task, {"config": TrainConfig(**{**base.to_dict(), "preset": p, "seed": s}), "run_dir": None,
                             "resume": False, "device": "cpu", "data_dir": None}, {"preset": p, "seed": s})  # fmt: skip
        for p in ("skipless-osa", "skipless-ssa")
        for s in range(seeds)
    ]


def _tables(result, kind: str) -> list[pd.DataFrame]:
    if kind == "jacobian":
        return list(result.values())
    return [v["metrics"].query("kind != 'time'").reset_index(drop=True) for v in result.values()]


def _same(a, b, kind: str) -> bool:
    ta, tb = _tables(a, kind), _tables(b, kind)
    return len(ta) == len(tb) and all(x.equals(y) for x, y in zip(ta, tb, strict=True))


def _busy(result, wall: float) -> dict:
    """Seconds spent inside the tasks (summed) and their ratio to the wall time (≈ workers if no overhead)."""
    inside = sum(o.seconds for o in result.outcomes)
    return {"task_s_sum": inside, "busy_workers": inside / wall}


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=["jacobian", "train"], default="jacobian")
    parser.add_argument("--seeds", type=int, default=4, help="seeds per preset (2 presets)")
    parser.add_argument("--depth", type=int, default=6, help="jacobian: layers")
    parser.add_argument("--size", type=int, default=32, help="jacobian: N = d (exact Jacobian of N·d inputs)")
    parser.add_argument("--epochs", type=int, default=2, help="train: epochs on digits")
    parser.add_argument("--tiny", type=int, default=400, help="number of tiny tasks")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--output", default="benchmarks/results/grid_scaling.csv")
    args = parser.parse_args()
    info = machine_info()
    print(info)
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")

    if args.kind == "jacobian":
        tasks = jacobian_tasks(args.seeds, args.depth, args.size, args.size)
        what = f"exact κ profile, depth {args.depth}, N = d = {args.size}"
    else:
        tasks = train_tasks(args.seeds, args.epochs)
        what = f"training on digits, {args.epochs} epochs, depth 2, d = 32"
    n = len(tasks)
    quiet = {"progress": False}
    rows = []

    warm_up(args.kind)  # steady state in-process, as the warm cluster below
    serial_s, serial = _timed(lambda: run_grid(tasks, GridOptions(serial=True, **quiet)))
    rows.append({"case": f"{what}: serial", "workers": 1, "tasks": n, "wall_s": serial_s, "speedup": 1.0,
                 "per_task_s": serial_s / n, "identical": True, **_busy(serial, serial_s)})  # fmt: skip

    cold_s, cold = _timed(lambda: run_grid(tasks, GridOptions(workers=args.workers, dashboard_address=None, **quiet)))
    rows.append({"case": f"{what}: local cluster, cold (start included)", "workers": args.workers, "tasks": n,
                 "wall_s": cold_s, "speedup": serial_s / cold_s, "per_task_s": cold_s / n,
                 "identical": _same(serial, cold, args.kind), **_busy(cold, cold_s)})  # fmt: skip

    tiny = [Task(identity, {"i": i}, {"i": i}) for i in range(args.tiny)]
    tiny_serial_s, _ = _timed(lambda: run_grid(tiny, GridOptions(serial=True, **quiet)))
    opts = GridOptions(workers=args.workers, dashboard_address=None, **quiet)
    t0 = time.perf_counter()
    with cluster_client(opts, "local", args.workers) as (client, _):
        start_s = time.perf_counter() - t0
        warm_imports = "osa_lab.studies.jacobian" if args.kind == "jacobian" else "osa_lab.studies.training"
        import_s, _ = _timed(lambda: client.run(warm_up, args.kind))
        address = client.scheduler.address
        warm_s, warm = _timed(lambda: run_grid(tasks, GridOptions(scheduler=address, **quiet)))
        rows.append({"case": f"{what}: local cluster, warm", "workers": args.workers, "tasks": n, "wall_s": warm_s,
                     "speedup": serial_s / warm_s, "per_task_s": warm_s / n,
                     "identical": _same(serial, warm, args.kind), **_busy(warm, warm_s)})  # fmt: skip
        tiny_s, tiny_res = _timed(lambda: run_grid(tiny, GridOptions(scheduler=address, **quiet)))
    rows.append({"case": "cluster start (LocalCluster + clients)", "workers": args.workers, "tasks": 0,
                 "wall_s": start_s, "speedup": float("nan"), "per_task_s": float("nan"), "identical": True})  # fmt: skip
    rows.append({"case": f"worker warm-up (imports of {warm_imports} + one small task)", "workers": args.workers, "tasks": 0,
                 "wall_s": import_s, "speedup": float("nan"), "per_task_s": float("nan"), "identical": True})  # fmt: skip
    rows.append({"case": "tiny tasks: serial (runner bookkeeping only)", "workers": 1, "tasks": args.tiny,
                 "wall_s": tiny_serial_s, "speedup": float("nan"), "per_task_s": tiny_serial_s / args.tiny,
                 "identical": True})  # fmt: skip
    rows.append({"case": "tiny tasks: warm local cluster (scheduler overhead)", "workers": args.workers,
                 "tasks": args.tiny, "wall_s": tiny_s, "speedup": float("nan"), "per_task_s": tiny_s / args.tiny,
                 "identical": tiny_res.values() == list(range(args.tiny))})  # fmt: skip
    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    df = pd.DataFrame(rows)
    df["cpu_count"] = info["cpu_count"]
    df["load_before"] = load_before[0]
    df["load_after"] = load_after[0]
    emit_table(df, args.output, title=f"grid scaling ({args.kind}, {args.workers} workers, 1 torch thread per task)")


if __name__ == "__main__":
    main()
