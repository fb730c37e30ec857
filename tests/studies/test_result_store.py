"""Stored task results (osa_lab.studies.result_store and the grid's store): data, never code.

Every file a grid loads from its store is tried with crafted ``__reduce__`` payloads that would
create a marker file if anything unpickled them; the marker must never appear, the task must be
computed again, and a ``TaskStoreWarning`` must name the file.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import osa_lab.studies.depth as A
from osa_lab.errors import MalformedResultError, TaskStoreWarning, UnstorableResultError
from osa_lab.studies.grid import GridOptions, Task, run_grid
from osa_lab.studies.result_store import load_result, save_result

SERIAL = GridOptions(serial=True, progress=False)


class Payload:
    """Unpickling this object opens (creates) ``marker``: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def payload_bytes(marker: Path) -> bytes:
    blob = pickle.dumps(Payload(marker))
    # the payload is live: unpickling it does create the marker (then it is removed again)
    pickle.loads(blob).close()
    assert marker.exists()
    marker.unlink()
    return blob


def square(i: int, log: str | None = None) -> int:
    if log is not None:
        with open(log, "a") as fh:
            fh.write(f"{i}\n")
    return i * i


def calls(log: Path) -> list[int]:
    return [int(x) for x in log.read_text().split()] if log.exists() else []


# ----------------------------------------------------------------------------- the format


def test_results_round_trip_bit_for_bit(tmp_path):
    df = pd.DataFrame({
        "preset": ["pure-osa", "pure-ssa"], "value": [0.1 + 0.2, float("nan")], "layer": np.array([0, 7]),
        "flag": [True, False], "maybe": [None, "x"], "alpha": [np.inf, -0.0],
    })  # fmt: skip
    value = (df, df.iloc[1:], {"n": 2**70, "xs": [1.5, None, "a"], "arr": np.arange(6.0).reshape(2, 3)}, None)
    path = save_result(tmp_path / "k.npz", value, "k")
    back = load_result(path, "k")
    pd.testing.assert_frame_equal(back[0], df, check_exact=True)
    pd.testing.assert_frame_equal(back[1], df.iloc[1:], check_exact=True)
    assert back[2]["n"] == 2**70 and back[2]["xs"] == [1.5, None, "a"] and back[3] is None
    np.testing.assert_array_equal(back[2]["arr"], value[2]["arr"])
    assert [p.name for p in tmp_path.iterdir()] == ["k.npz"]  # no temporary left


def test_another_tasks_result_and_unstorable_values_are_refused(tmp_path):
    path = save_result(tmp_path / "a.npz", 3, "task-a")
    with pytest.raises(MalformedResultError, match="task 'task-a', not 'task-b'"):
        load_result(path, "task-b")
    with pytest.raises(UnstorableResultError, match="object"):
        save_result(tmp_path / "b.npz", {"x": object()}, "task-b")
    with pytest.raises(UnstorableResultError):
        save_result(tmp_path / "c.npz", np.array([Payload(tmp_path / "m")], dtype=object), "task-c")
    assert not (tmp_path / "b.npz").exists() and not (tmp_path / "c.npz").exists()


def _npz_with_object_array(path: Path, marker: Path) -> None:
    np.savez(path, structure=np.frombuffer(b"{}", np.uint8), a0=np.array([Payload(marker)], dtype=object))


def _npz_with_pickled_member(path: Path, marker: Path) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("structure.npy", payload_bytes(marker))


@pytest.mark.parametrize("make", ["raw pickle", "object array", "pickled member"])
def test_a_crafted_payload_in_the_format_itself_never_runs(tmp_path, make):
    marker = tmp_path / "marker"
    path = tmp_path / "k.npz"
    if make == "raw pickle":
        path.write_bytes(payload_bytes(marker))
    elif make == "object array":
        _npz_with_object_array(path, marker)
    else:
        _npz_with_pickled_member(path, marker)
    with pytest.raises(MalformedResultError, match=r"k\.npz"):
        load_result(path, "k")
    assert not marker.exists()


# ----------------------------------------------------------------------------- the grid's store


@pytest.mark.parametrize("make", ["legacy pickle", "raw pickle", "object array", "pickled member"])
def test_a_poisoned_store_file_is_recomputed_and_never_runs(tmp_path, make):
    marker, log, store = tmp_path / "marker", tmp_path / "log", tmp_path / "store"
    tasks = [Task(square, {"i": i, "log": str(log)}, {"i": i}) for i in range(3)]
    run_grid(tasks, SERIAL, store=store)
    assert calls(log) == [0, 1, 2]
    target = store / f"{tasks[1].key}.npz"
    if make == "legacy pickle":  # a pickle where earlier versions kept results: never opened
        target.unlink()
        target = target.with_suffix(".pkl")
        target.write_bytes(payload_bytes(marker))
        expected = r"pickles .*never loaded"
    elif make == "raw pickle":
        target.write_bytes(payload_bytes(marker))
        expected = rf"{target.name}: not a readable result archive"
    elif make == "object array":
        _npz_with_object_array(target, marker)
        expected = rf"{target.name}: not a readable result archive"
    else:
        _npz_with_pickled_member(target, marker)
        expected = rf"{target.name}: not a readable result archive"
    with pytest.warns(TaskStoreWarning, match=expected):
        result = run_grid(tasks, SERIAL, store=store)
    assert not marker.exists()
    assert calls(log) == [0, 1, 2, 1]  # only the poisoned task ran again
    assert result.values() == [0, 1, 4] and [o.cached for o in result.outcomes] == [True, False, True]


def test_a_file_of_the_wrong_kind_is_recomputed_with_a_warning(tmp_path):
    """A well-formed result file that is not a result of the task (Task.check refuses it)."""
    store = tmp_path / "store"
    kwargs = {"presets": ["pure-osa"], "depths": [2], "tokens": [4], "dims": [4], "seeds": 1, "progress": False}
    first = A.sweep(**kwargs, cache_dir=store)
    (path,) = store.glob("profile-*.npz")
    save_result(path, {"not": "a pair of tables"}, path.stem)
    with pytest.warns(TaskStoreWarning, match=rf"{path.name}: not a result of task .*pair of tables.*again"):
        again = A.sweep(**kwargs, cache_dir=store)
    pd.testing.assert_frame_equal(again.metrics, first.metrics, check_exact=True)
    assert not again.tasks["cached"].any()
    third = A.sweep(**kwargs, cache_dir=store)  # the recomputed result was stored and is used now
    assert third.tasks["cached"].all()
    pd.testing.assert_frame_equal(third.metrics, first.metrics, check_exact=True)
    pd.testing.assert_frame_equal(third.spectra, first.spectra, check_exact=True)


def test_unstorable_results_and_a_full_disk_only_warn(tmp_path, monkeypatch):
    tasks = [Task(square, {"i": i}, {"i": i}) for i in range(3)]
    real_write = os.write

    def full_disk(fd, data):
        if str(tmp_path) in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.warns(TaskStoreWarning, match="No space left on device.*no further results") as record:
        result = run_grid(tasks, SERIAL, store=tmp_path / "store")
    assert len(record) == 1 and result.values() == [0, 1, 4]
    assert not (tmp_path / "store").exists()  # no partial file, no temporary, no empty folder
    monkeypatch.setattr(os, "write", real_write)
    odd = [Task(io.StringIO, {}, {"i": 0})]
    with pytest.warns(TaskStoreWarning, match="not stored.*StringIO"):
        run_grid(odd, SERIAL, store=tmp_path / "store2")


def test_the_sweep_command_names_a_poisoned_store_file_and_recomputes_it(tmp_path, capsys):
    from osa_lab.cli import main

    marker, out = tmp_path / "marker", tmp_path / "r.csv"
    argv = ["sweep", "--presets", "pure-osa", "--depth", "2", "--tokens", "4", "--dim", "4", "--seeds", "1",
            "--no-progress", "--serial", "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    first = out.read_text()
    (path,) = (tmp_path / "r_tasks").glob("*.npz")
    path.write_bytes(payload_bytes(marker))
    capsys.readouterr()
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"osa-lab sweep: warning: {path}: not a readable result archive" in err and "again" in err
    assert not marker.exists() and out.read_text() == first
    assert not pd.read_csv(tmp_path / "r_tasks.csv")["cached"].any()
