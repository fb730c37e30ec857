"""Small utilities shared by the benchmarks: timing, peak memory, machine facts, table + CSV output.

Benchmarks report medians of repeated runs measured side by side in one process; they never
assert on time (the machines are shared and noisy).
"""

from __future__ import annotations

import gc
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch

from osa_lab.fileio import atomic_to_csv


def time_call(fn: Callable[[], object], *, repeat: int = 5, warmup: int = 1, min_time: float = 0.0) -> float:
    """Median wall time in seconds of ``fn()`` over ``repeat`` runs after ``warmup`` runs.

    CUDA work is synchronised around each call. ``min_time`` keeps repeating until the
    total measured time reaches it (for very short calls).
    """
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times: list[float] = []
    total = 0.0
    while len(times) < repeat or total < min_time:
        start = time.perf_counter()
        fn()
        sync()
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        total += elapsed
        if len(times) >= 1000:
            break
    return statistics.median(times)


def time_interleaved(
    fns: dict[str, Callable[[], object]], *, repeat: int | dict[str, int] = 5, warmup: int = 1
) -> dict[str, float]:
    """Median wall time in seconds of each ``fns[name]()``, the calls alternating in rounds.

    Ratios of the medians compare the functions under the same machine conditions: on a
    shared machine, load that comes and goes then hits every function alike instead of
    whichever happened to run during it. ``repeat`` may be a dict giving a name fewer rounds
    (a slow baseline; it then runs in the first rounds only); names it leaves out run every round.
    """
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    if isinstance(repeat, dict):  # names not given run every round
        most = max(repeat.values(), default=5)
        reps = {name: repeat.get(name, most) for name in fns}
    else:
        reps = dict.fromkeys(fns, repeat)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(max(reps.values())):
        for name, fn in fns.items():
            if round_ >= reps.get(name, 0):
                continue
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def interleaved_rounds(
    fns: dict, rounds: int, *, warmup: int = 1, calls: int = 1, faults: dict | None = None
) -> tuple[dict[object, list[float]], dict[object, list[float]]]:
    """Wall and process-CPU seconds per call of each ``fns[key]()``, one list entry per round:
    every function runs ``calls`` times per round, in the order of ``fns`` and reversed every
    other round (no function always runs first or after the same one), after ``warmup`` calls each.
    A dict given as ``faults`` is filled the same way with the process's minor page faults per
    call (``getrusage``'s ``ru_minflt``: first touches of memory freshly mapped from the kernel).

    Per-round lists let a benchmark pair two functions within each round (the ratio of their
    times under the same load) as well as take medians. The CPU time (``time.process_time``)
    leaves out the time the scheduler gives other processes, so on a shared machine its ratios
    are the steadier ones.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    wall: dict = {key: [] for key in fns}
    cpu: dict = {key: [] for key in fns}
    if faults is not None:
        faults.update({key: [] for key in fns})
    order = list(fns.items())
    for _ in range(rounds):
        for key, fn in order:
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(calls):
                fn()
            cpu[key].append((time.process_time() - c0) / calls)
            wall[key].append((time.perf_counter() - w0) / calls)
            if faults is not None:
                faults[key].append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / calls)
        order.reverse()
    return wall, cpu


def _proc_status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (bytes).

    Reads ``VmHWM`` on Linux, which :func:`reset_peak_rss` can reset; ``ru_maxrss`` elsewhere
    (which a child process inherits from its parent across fork/exec, so it is only an upper bound).
    """
    hwm = _proc_status_bytes("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    """Current resident set size (``VmRSS`` on Linux; the peak elsewhere)."""
    rss = _proc_status_bytes("VmRSS")
    return rss if rss is not None else peak_rss_bytes()


def reset_peak_rss() -> None:
    """Reset the peak-RSS mark to the current RSS (Linux ``/proc/self/clear_refs``); no-op elsewhere."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def fresh_memory() -> None:
    """Collect garbage (and empty the CUDA cache) before a memory measurement."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def machine_info() -> dict[str, object]:
    """Machine facts recorded beside every benchmark."""
    info: dict[str, object] = {
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "torch_cpu_isa": torch.backends.cpu.get_cpu_capability(),  # ATEN_CPU_CAPABILITY can lower it
        "python": platform.python_version(),
    }
    if hasattr(os, "getloadavg"):  # the load of a shared machine distorts every timing: record it
        info["loadavg_1m_5m_15m"] = [round(x, 2) for x in os.getloadavg()]
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def emit_table(rows: list[dict] | pd.DataFrame, csv_path: str | Path | None, title: str = "") -> pd.DataFrame:
    """Print ``rows`` as an aligned table and write them to ``csv_path`` (directories created).

    The CSV is written to a unique temporary beside ``csv_path`` and renamed over it
    (:func:`osa_lab.fileio.atomic_to_csv`): a failed write keeps the earlier file and raises
    :class:`~osa_lab.errors.OutputWriteError` naming the path.
    """
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    if title:
        print(f"\n== {title} ==")
    with pd.option_context("display.max_rows", 500, "display.max_columns", 50, "display.width", 200):
        print(df.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    if csv_path is not None:
        path = atomic_to_csv(df, csv_path)
        print(f"wrote {path}")
    return df


# ------------------------------------------------------------------------------------------------
# Roofline: the machine's own limits, measured in the same run
# ------------------------------------------------------------------------------------------------


class _DtypeFlopCounter:
    """Counts the matmul flops of every ``mm/bmm/addmm/baddbmm`` by the dtype of its first operand.

    Uses PyTorch's flop formulas (:data:`torch.utils.flop_counter.flop_registry`), inside a
    dispatch mode, so autograd's backward products are counted too. Factorisations
    (Cholesky, triangular solves) are not counted: they are a few percent of the small core.
    """

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.flop_counter import flop_registry

        counts: dict[torch.dtype, float] = {}

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                packet = func._overloadpacket
                if packet not in flop_registry and packet.__name__.endswith("_"):  # in-place: baddbmm_
                    packet = getattr(torch.ops.aten, packet.__name__.rstrip("_"), packet)
                if packet in flop_registry:
                    dtype = next((a.dtype for a in args if isinstance(a, torch.Tensor)), torch.float32)
                    counts[dtype] = counts.get(dtype, 0.0) + float(flop_registry[packet](*args, **kwargs, out_val=out))
                return out

        self.counts = counts
        self.mode = _Mode()


def count_matmul_flops(fn: Callable[[], object]) -> dict[torch.dtype, float]:
    """Matmul flops of one call of ``fn()`` per operand dtype (``{torch.float32: …, torch.float64: …}``)."""
    counter = _DtypeFlopCounter()
    with counter.mode:
        fn()
    return dict(counter.counts)


def copy_probe(nbytes: int, *, device: str = "cpu") -> tuple[Callable[[], object], Callable[[], object], int]:
    """``(copy into a reused buffer, copy into fresh memory, bytes moved per call)`` for a float32
    tensor of about ``nbytes``. Bytes moved = read + write (2 × size), the convention of the pass
    byte counts; "fresh memory" allocates the destination every call (page faults included)."""
    numel = max(nbytes // 4, 1)
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault it in once
    return (lambda: dst.copy_(src)), (lambda: src.clone()), 2 * numel * 4


def roofline_seconds(flop_seconds: float, nbytes: float, bandwidth: float) -> float:
    """The roofline time ``max(flop time, bytes ÷ bandwidth)`` (bandwidth in bytes per second)."""
    return max(flop_seconds, nbytes / bandwidth)
