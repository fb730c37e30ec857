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
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def emit_table(rows: list[dict] | pd.DataFrame, csv_path: str | Path | None, title: str = "") -> pd.DataFrame:
    """Print ``rows`` as an aligned table and write them to ``csv_path`` (directories created)."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    if title:
        print(f"\n== {title} ==")
    with pd.option_context("display.max_rows", 500, "display.max_columns", 50, "display.width", 200):
        print(df.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    if csv_path is not None:
        path = Path(csv_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(path, index=False)
        print(f"wrote {path}")
    return df
