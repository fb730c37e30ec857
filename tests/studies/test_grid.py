"""The Dask grid runner (osa_lab.studies.grid): placement-independent results, resume, failures, lost workers.

The first tests run in-process (fast). The cluster tests start a 2-worker LocalCluster or
`dask scheduler` + `dask worker` subprocesses on 127.0.0.1 with tiny settings; each is bounded
by a SIGALRM deadline so a hung cluster fails the test instead of stalling CI.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import cloudpickle
import pandas as pd
import pytest
import torch

import osa_lab.studies.depth as A
import osa_lab.studies.depth.sweeps as sweeps
from osa_lab.cli import main as cli_main
from osa_lab.errors import (
    ConfigurationError,
    GridTaskFailedWarning,
    SchedulerConnectionError,
    TaskStoreWarning,
)
from osa_lab.studies.grid import ENV_SCHEDULER, GridOptions, Task, run_grid, task_key

# Workers receive this module's task functions by value (they need not import tests/).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@contextmanager
def deadline(seconds: int):
    """Fail with TimeoutError if the block runs longer than ``seconds`` (main thread only)."""

    def expired(signum, frame):
        raise TimeoutError(f"cluster test exceeded its {seconds} s bound")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ----------------------------------------------------------------------------- task functions


def square(i: int, log: str | None = None, fail_on: int | None = None, interrupt: str | None = None) -> dict:
    """i² (and the torch thread count it ran with); appends ``i`` to ``log``; raises for ``fail_on``."""
    if log is not None:
        with open(log, "a") as fh:
            fh.write(f"{i}\n")
    if interrupt is not None and os.path.exists(interrupt) and i == 2:
        raise KeyboardInterrupt
    if i == fail_on:
        raise FloatingPointError(f"task {i} diverged: loss is nan")
    return {"i": i, "square": i * i, "threads": torch.get_num_threads()}


def sleepy(i: int, delay: float, marker_dir: str) -> int:
    """Marks its start (task index and worker PID), sleeps, returns i²."""
    Path(marker_dir, f"start-{i}-{os.getpid()}").touch()
    time.sleep(delay)
    return i * i


def worker_environment(names: tuple[str, ...]) -> dict:
    """The values of environment variables ``names`` where the task runs."""
    return {n: os.environ.get(n) for n in names}


def calls(log: Path) -> list[int]:
    return [int(x) for x in log.read_text().split()] if log.exists() else []


# ----------------------------------------------------------------------------- in-process


def test_serial_grid_keeps_task_order_and_sets_threads(tmp_path, torch_threads_for_test):
    tasks = [Task(square, {"i": i}, {"i": i}) for i in (3, 1, 2)]
    torch_threads_for_test(2)  # not the tasks' 1, so restoring it is seen
    before = torch.get_num_threads()
    assert before == 2
    result = run_grid(tasks, GridOptions(serial=True, threads_per_worker=1, progress=False))
    assert [v["square"] for v in result.values()] == [9, 1, 4]
    assert {v["threads"] for v in result.values()} == {1}
    assert torch.get_num_threads() == before
    table = result.table()
    assert table["i"].tolist() == [3, 1, 2] and set(table["status"]) == {"ok"}
    assert result.mode == "serial"


def test_a_raising_task_is_recorded_and_the_others_finish(tmp_path):
    tasks = [Task(square, {"i": i, "fail_on": 2}, {"preset": "p", "i": i}) for i in range(4)]
    result = run_grid(tasks, GridOptions(serial=True, progress=False), store=tmp_path)
    assert [o.status for o in result.outcomes] == ["ok", "ok", "failed", "ok"]
    bad = result.failed[0]
    assert bad.error_type == "FloatingPointError" and "task 2 diverged" in bad.error
    assert "Traceback" in bad.traceback
    row = result.table().set_index("i").loc[2]
    assert row["status"] == "failed" and row["error_type"] == "FloatingPointError"
    assert result.failure_lines() == ["preset=p i=2: FloatingPointError: task 2 diverged: loss is nan"]
    with pytest.warns(GridTaskFailedWarning, match="1 of 4 tasks failed.*i=2"):
        result.warn_failures()
    # the failure is not stored: a rerun retries only it
    assert len(list(tmp_path.glob("*.npz"))) == 3


def test_rerun_skips_finished_tasks_and_an_interrupted_grid_resumes(tmp_path):
    log, flag = tmp_path / "calls.txt", tmp_path / "interrupt"
    flag.touch()
    tasks = [Task(square, {"i": i, "log": str(log), "interrupt": str(flag)}, {"i": i}) for i in range(5)]
    store = tmp_path / "store"
    with pytest.raises(KeyboardInterrupt):
        run_grid(tasks, GridOptions(serial=True, progress=False), store=store)
    assert calls(log) == [0, 1, 2]
    flag.unlink()
    result = run_grid(tasks, GridOptions(serial=True, progress=False), store=store)
    assert calls(log) == [0, 1, 2, 2, 3, 4]  # 0 and 1 were loaded, not rerun
    assert [o.cached for o in result.outcomes] == [True, True, False, False, False]
    assert [v["square"] for v in result.values()] == [0, 1, 4, 9, 16]
    run_grid(tasks, GridOptions(serial=True, progress=False), store=store)
    assert len(calls(log)) == 6
    # a truncated result file is recomputed, not trusted
    (store / f"{tasks[4].key}.npz").write_bytes(b"\x80")
    with pytest.warns(TaskStoreWarning, match=rf"{tasks[4].key}\.npz: not a readable result archive.*again"):
        again = run_grid(tasks, GridOptions(serial=True, progress=False), store=store)
    assert calls(log)[-1] == 4 and again.values()[4]["square"] == 16


def test_task_keys_are_stable_and_duplicates_refused():
    assert task_key("x", {"a": 1, "b": 2}) == task_key("x", {"b": 2, "a": 1})
    assert task_key("x", {"a": 1}) != task_key("x", {"a": 2})
    t = Task(square, {"i": 1}, {"i": 1})
    with pytest.raises(ConfigurationError, match="same key"):
        run_grid([t, Task(square, {"i": 1}, {"i": 1})], GridOptions(serial=True, progress=False))


def test_options_validate_and_plan(monkeypatch):
    monkeypatch.delenv(ENV_SCHEDULER, raising=False)
    with pytest.raises(ConfigurationError, match="workers"):
        GridOptions(workers=0)
    with pytest.raises(ConfigurationError, match="not both"):
        GridOptions(workers=2, scheduler="tcp://127.0.0.1:8786")
    with pytest.raises(ConfigurationError, match="not both"):
        GridOptions(serial=True, scheduler="tcp://127.0.0.1:8786")
    assert GridOptions(workers=1).plan(10) == ("serial", 1)
    assert GridOptions(workers=4).plan(10) == ("local", 4)
    assert GridOptions(workers=4).plan(1) == ("serial", 1)  # one task: no cluster
    assert GridOptions(workers=4).plan(3) == ("local", 3)
    assert GridOptions(scheduler="tcp://h:1").plan(3) == ("remote", "tcp://h:1")
    monkeypatch.setenv(ENV_SCHEDULER, "tcp://env:8786")
    assert GridOptions().plan(3) == ("remote", "tcp://env:8786")
    assert GridOptions(workers=2).plan(3) == ("local", 2)  # an explicit size wins over the variable
    assert GridOptions(serial=True).plan(3) == ("serial", 1)


def test_cli_grid_arguments_are_checked(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(ENV_SCHEDULER, raising=False)
    base = ["sweep", "--presets", "pure-osa", "--depth", "2", "--tokens", "4", "--dim", "4", "--seeds", "1",
            "--output", str(tmp_path / "r.csv"), "--no-progress"]  # fmt: skip
    assert cli_main([*base, "--workers", "2", "--scheduler", "tcp://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "not both" in err and err.count("\n") == 1
    assert cli_main([*base, "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err


def test_sweep_records_a_failing_model_and_exits_non_zero(tmp_path, capsys, monkeypatch):
    real = A.depth_profile

    def flaky(point, **kw):
        if point.preset == "pure-ssa" and point.seed == 1:
            raise FloatingPointError("hidden state at layer 2 is NaN")
        return real(point, **kw)

    monkeypatch.setattr(sweeps, "depth_profile", flaky)
    out = tmp_path / "r.csv"
    args = ["sweep", "--presets", "pure-osa", "pure-ssa", "--depth", "2", "--tokens", "4", "--dim", "4",
            "--seeds", "2", "--output", str(out), "--no-progress", "--serial"]  # fmt: skip
    assert cli_main(args) == 1
    err = capsys.readouterr().err
    assert "1 of 4 tasks failed" in err
    assert "preset=pure-ssa" in err and "seed=1" in err and "FloatingPointError" in err
    tasks = pd.read_csv(tmp_path / "r_tasks.csv")
    assert (tasks["status"] == "failed").sum() == 1
    metrics = pd.read_csv(out)
    assert set(zip(metrics["preset"], metrics["seed"], strict=True)) == {("pure-osa", 0), ("pure-osa", 1),
                                                                          ("pure-ssa", 0)}  # fmt: skip
    # a rerun loads the three finished models from <stem>_tasks/ and retries the failed one
    monkeypatch.setattr(sweeps, "depth_profile", real)
    assert cli_main(args) == 0
    tasks = pd.read_csv(tmp_path / "r_tasks.csv")
    assert tasks["cached"].tolist().count(True) == 3 and set(tasks["status"]) == {"ok"}


def test_sweep_api_failure_warns_and_lists_failures(monkeypatch):
    real = A.depth_profile
    monkeypatch.setattr(sweeps, "depth_profile", lambda point, **kw: (_ for _ in ()).throw(
        ValueError("boom")) if point.seed == 0 else real(point, **kw))  # fmt: skip
    with pytest.warns(GridTaskFailedWarning, match="boom"):
        res = A.sweep(["pure-osa"], 2, 4, 4, seeds=2, progress=False)
    assert res.failures["seed"].tolist() == [0] and set(res.metrics["seed"]) == {1}


# ----------------------------------------------------------------------------- clusters

SWEEP = ["sweep", "--presets", "pure-osa", "pure-ssa", "--depth", "3", "--tokens", "8", "--dim", "8",
         "--seeds", "2", "--jacobian", "exact", "--no-progress"]  # fmt: skip


def _same_csvs(a: Path, b: Path, names: list[str]) -> None:
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.slow
def test_sweep_on_two_local_workers_equals_in_process(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(ENV_SCHEDULER, raising=False)
    with deadline(300):
        assert cli_main([*SWEEP, "--workers", "1", "--output", str(tmp_path / "one" / "r.csv")]) == 0
        assert cli_main([*SWEEP, "--workers", "2", "--output", str(tmp_path / "two" / "r.csv")]) == 0
    err = capsys.readouterr().err
    assert "8 tasks on 2 local workers; Dask dashboard: http://" in err
    _same_csvs(tmp_path / "one", tmp_path / "two", ["r.csv", "r_spectra.csv", "r_jacobian.csv"])
    tasks = pd.read_csv(tmp_path / "two" / "r_tasks.csv")
    assert tasks["worker"].str.startswith("tcp://").all() and tasks["worker"].nunique() == 2
    assert set(tasks["status"]) == {"ok"}


@pytest.mark.slow
def test_killing_a_worker_mid_grid_still_completes_every_task(tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    tasks = [Task(sleepy, {"i": i, "delay": 2.0, "marker_dir": str(markers)}, {"i": i}) for i in range(6)]
    killed: list[tuple[int, int]] = []

    def kill_first_started_worker() -> None:
        stop = time.monotonic() + 200
        while time.monotonic() < stop:
            started = sorted(markers.glob("start-*"))
            if started:
                _, i, pid = started[0].name.split("-")
                os.kill(int(pid), signal.SIGKILL)  # the worker process this test's cluster started
                killed.append((int(i), int(pid)))
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_first_started_worker, daemon=True)
    killer.start()
    with deadline(300):
        result = run_grid(tasks, GridOptions(workers=2, progress=False, dashboard_address=None))
    killer.join(5)
    assert killed, "no task started"
    assert [o.status for o in result.outcomes] == ["ok"] * 6
    assert result.values() == [i * i for i in range(6)]
    (i, pid), = killed
    starts = list(markers.glob(f"start-{i}-*"))
    assert len(starts) == 2 and f"start-{i}-{pid}" in {p.name for p in starts}  # ran again elsewhere


@pytest.mark.slow
def test_one_raising_task_on_a_cluster_is_reported_and_the_others_finish(tmp_path):
    tasks = [Task(square, {"i": i, "fail_on": 3}, {"i": i}) for i in range(5)]
    with deadline(240):
        result = run_grid(tasks, GridOptions(workers=2, progress=False, dashboard_address=None),
                          store=tmp_path)  # fmt: skip
    assert result.mode == "local"
    assert [o.status for o in result.outcomes] == ["ok", "ok", "ok", "failed", "ok"]
    assert result.failed[0].error_type == "FloatingPointError" and "task 3 diverged" in result.failed[0].error
    assert result.failed[0].worker.startswith("tcp://")
    assert [v["square"] for v in result.values()] == [0, 1, 4, 16]
    assert {v["threads"] for v in result.values()} == {1}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_scheduler_is_a_one_line_error(tmp_path):
    address = f"tcp://127.0.0.1:{_free_port()}"
    tasks = [Task(square, {"i": i}, {"i": i}) for i in range(2)]
    with deadline(60), pytest.raises(SchedulerConnectionError, match="dask scheduler"):
        run_grid(tasks, GridOptions(scheduler=address, connect_timeout=2, progress=False))


@pytest.mark.parametrize("address", ["notanaddress", "foo://bar:1", "tcp://127.0.0.1:port"])
def test_malformed_scheduler_address_is_a_connection_error_and_creates_no_store(tmp_path, address):
    # a malformed address is a typed error before any store folder is made
    tasks = [Task(square, {"i": i}, {"i": i}) for i in range(2)]
    with pytest.raises(SchedulerConnectionError, match=r"invalid Dask scheduler address .*tcp://host:8786"):
        run_grid(tasks, GridOptions(scheduler=address, progress=False), store=tmp_path / "store")
    assert not (tmp_path / "store").exists()


@pytest.mark.slow
def test_sweep_through_a_separately_started_scheduler_and_worker(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(ENV_SCHEDULER, raising=False)
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    dask_cli = [sys.executable, "-m", "dask"]
    procs = [
        subprocess.Popen([*dask_cli, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),  # fmt: skip
    ]
    try:
        procs.append(
            subprocess.Popen([*dask_cli, "worker", address, "--nworkers", "2", "--nthreads", "1", "--no-dashboard",
                              "--memory-limit", "0"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # fmt: skip
        )
        with deadline(300):
            assert cli_main([*SWEEP, "--scheduler", address, "--output", str(tmp_path / "remote" / "r.csv")]) == 0
            assert cli_main([*SWEEP, "--serial", "--output", str(tmp_path / "local" / "r.csv")]) == 0
    finally:
        for p in reversed(procs):  # only the two processes this test started
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
    assert f"the cluster at {address}" in capsys.readouterr().err
    _same_csvs(tmp_path / "remote", tmp_path / "local", ["r.csv", "r_spectra.csv", "r_jacobian.csv"])
    tasks = pd.read_csv(tmp_path / "remote" / "r_tasks.csv")
    assert tasks["worker"].str.startswith("tcp://127.0.0.1:").all()


@pytest.mark.slow
def test_train_compare_on_two_local_workers_equals_in_process(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(ENV_SCHEDULER, raising=False)
    args = ["train", "--compare", "--data", "digits", "--epochs", "1", "--depth", "2", "--dim", "16", "--heads", "2",
            "--diag-every", "0", "--diag-samples", "16", "--seeds", "0", "--quiet"]  # fmt: skip
    with deadline(480):
        assert cli_main([*args, "--workers", "1", "--output", str(tmp_path / "one")]) == 0
        assert cli_main([*args, "--workers", "2", "--output", str(tmp_path / "two")]) == 0
    assert "tasks on 2 local workers" in capsys.readouterr().err
    one, two = tmp_path / "one", tmp_path / "two"
    assert (one / "runs.csv").read_bytes() == (two / "runs.csv").read_bytes()
    a, b = (pd.read_csv(d / "metrics.csv") for d in (one, two))
    wall = a["kind"] == "time"  # epoch_time_s: the only rows that differ between identical runs
    assert wall.sum() > 0
    pd.testing.assert_frame_equal(a[~wall].reset_index(drop=True), b[b["kind"] != "time"].reset_index(drop=True),
                                  check_exact=True)  # fmt: skip
    sa, sb = (pd.read_csv(d / "summary.csv") for d in (one, two))
    cols = [c for c in sa.columns if not c.startswith("epoch_time")]
    pd.testing.assert_frame_equal(sa[cols], sb[cols], check_exact=True)
    for d in (one, two):  # checkpoints of every run under the output folder
        assert len(list(d.glob("*/seed0/checkpoint.pt"))) == len(sa)


@pytest.mark.slow
def test_shared_cluster_serves_several_grids_with_one_start(tmp_path):
    from osa_lab.studies.grid import shared_cluster

    with deadline(240), shared_cluster(GridOptions(workers=2, progress=False, dashboard_address=None)) as opts:
        assert opts.scheduler and opts.scheduler.startswith("tcp://")
        first = run_grid([Task(square, {"i": i}, {"i": i}) for i in range(3)], opts)
        second = run_grid([Task(square, {"i": i}, {"i": i}) for i in range(3, 6)], opts)
        env = run_grid([Task(worker_environment, {"names": ("MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS")}, {})],
                       opts).values()[0]  # fmt: skip
    assert [v["square"] for v in first.values() + second.values()] == [i * i for i in range(6)]
    # Dask's default MALLOC_TRIM_THRESHOLD_ freezes glibc's mmap threshold (every large tensor
    # faulted in afresh: tasks 1.2-1.4x slower); the local workers start without it, one BLAS thread.
    assert env == {"MALLOC_TRIM_THRESHOLD_": None, "OMP_NUM_THREADS": "1"}
    workers = {o.worker for o in first.outcomes + second.outcomes}
    assert len(workers) <= 2 and all(w.startswith("tcp://") for w in workers)  # the same two workers
    with shared_cluster(GridOptions(serial=True)) as same:
        assert same == GridOptions(serial=True)


def _listening(process) -> list:
    connections = getattr(process, "net_connections", None) or process.connections
    return [c.laddr for c in connections("tcp") if c.status == "LISTEN"]


@pytest.mark.slow
def test_the_local_cluster_listens_on_the_loopback_address_only(capsys):
    import psutil

    from osa_lab.studies.grid import dashboard_address, shared_cluster

    assert dashboard_address(GridOptions(host="0.0.0.0")) == "0.0.0.0:8787"  # asked for: every interface
    assert dashboard_address(GridOptions(host="::1", dashboard_address=":0")) == "[::1]:0"
    with pytest.raises(ConfigurationError, match="host"):
        GridOptions(host="tcp://0.0.0.0")
    with deadline(240), shared_cluster(GridOptions(workers=2, progress=False)) as opts:
        me = psutil.Process()
        sockets = {p.pid: _listening(p) for p in [me, *me.children(recursive=True)]}
    assert opts.scheduler.startswith("tcp://127.0.0.1:")
    assert "dashboard: http://127.0.0.1:" in capsys.readouterr().err
    assert len(sockets[me.pid]) >= 2  # the scheduler and its dashboard
    assert {addr.ip for found in sockets.values() for addr in found} == {"127.0.0.1"}, sockets


def done_after(i: int, delay: float, marker_dir: str) -> int:
    """Sleeps, marks its end, returns i²."""
    time.sleep(delay)
    Path(marker_dir, f"done-{i}").touch()
    return i * i


@pytest.mark.slow
def test_a_scheduler_lost_mid_grid_is_recorded_as_such(tmp_path):
    from distributed import Client

    from osa_lab.studies.grid import SCHEDULER_LOST

    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    dask_cli = [sys.executable, "-m", "dask"]
    scheduler = subprocess.Popen([*dask_cli, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                                  "--no-dashboard"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    worker = subprocess.Popen([*dask_cli, "worker", address, "--nworkers", "1", "--nthreads", "1", "--no-dashboard",
                               "--memory-limit", "0"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    markers, store = tmp_path / "markers", tmp_path / "store"
    markers.mkdir()
    tasks = [Task(done_after, {"i": i, "delay": 1.5, "marker_dir": str(markers)}, {"i": i}) for i in range(6)]

    def kill_scheduler_after_the_first_task() -> None:
        stop = time.monotonic() + 200
        while time.monotonic() < stop and not list(markers.glob("done-*")):
            time.sleep(0.05)
        time.sleep(0.5)
        scheduler.kill()  # the scheduler process this test started

    try:
        with deadline(300):
            with Client(address, timeout=120) as probe:
                probe.wait_for_workers(1, timeout=120)
            killer = threading.Thread(target=kill_scheduler_after_the_first_task, daemon=True)
            killer.start()
            result = run_grid(tasks, GridOptions(scheduler=address, progress=False, connect_timeout=5), store=store)
            killer.join(5)
    finally:
        for p in (worker, scheduler):  # only the two processes this test started
            p.kill()
            p.wait(30)
    lost = [o for o in result.outcomes if not o.ok]
    assert lost, "the grid finished before the scheduler was killed"
    assert {o.error_type for o in lost} == {SCHEDULER_LOST}
    assert all(f"the Dask scheduler at {address} was lost" in o.error for o in lost)
    assert "NoneType" not in " ".join(result.failure_lines())
    finished = [o for o in result.outcomes if o.ok]
    assert len(list(store.glob("*.npz"))) == len(finished)  # what finished is kept for the rerun
