"""osa_lab.fileio: output files are whole or absent, temporaries are unique, one writer per output."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys

import pandas as pd
import pytest

from osa_lab.errors import OutputWriteError, RunLockedError
from osa_lab.fileio import (
    OutputLock,
    atomic_to_csv,
    atomic_write_bytes,
    atomic_write_text,
    atomic_writer,
    output_locks,
    write_all_or_nothing,
)


def fail_writes(monkeypatch, after: int = 0, where: str = "") -> list[int]:
    """Make ``os.write`` raise ENOSPC on temporaries (``*.tmp`` whose path contains ``where``)
    once ``after`` writes to such files succeeded; returns the list counting those writes."""
    real_write = os.write
    count: list[int] = []

    def write(fd, data):
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.endswith(".tmp") and where in target:
            if len(count) >= after:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            count.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    return count


def test_atomic_writes_replace_the_file_whole(tmp_path):
    path = tmp_path / "sub" / "a.txt"
    atomic_write_text(path, "first\n")
    atomic_write_bytes(path, b"second\n")
    assert path.read_bytes() == b"second\n"
    atomic_to_csv(pd.DataFrame({"x": [1.5, 2.0]}), tmp_path / "t.csv")
    assert (tmp_path / "t.csv").read_text() == "x\n1.5\n2.0\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.txt", "sub", "t.csv"]


@pytest.mark.parametrize("after", [0, 1])
def test_a_full_disk_keeps_the_earlier_file_and_leaves_no_temporary(tmp_path, monkeypatch, after):
    path = tmp_path / "a.bin"
    path.write_bytes(b"earlier")
    fail_writes(monkeypatch, after=after)
    with pytest.raises(OutputWriteError, match=rf"cannot write {path} \(No space left on device\)"):
        with atomic_writer(path, "wb") as fh:
            for _ in range(4):
                fh.write(b"x" * 300_000)  # larger than the buffer: several os.write calls
    assert path.read_bytes() == b"earlier"
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]


def test_a_failed_write_removes_the_folders_it_made(tmp_path, monkeypatch):
    fail_writes(monkeypatch)
    with pytest.raises(OutputWriteError):
        atomic_write_text(tmp_path / "new" / "deeper" / "a.txt", "x")
    assert list(tmp_path.iterdir()) == []


def test_several_files_are_all_replaced_or_none(tmp_path, monkeypatch):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("old a")
    b.write_text("old b")
    fail_writes(monkeypatch, where="b.csv")
    with pytest.raises(OutputWriteError, match="b.csv"):
        write_all_or_nothing([(a, lambda fh: fh.write("new a"), "w"), (b, lambda fh: fh.write("new b"), "w")])
    assert (a.read_text(), b.read_text()) == ("old a", "old b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "b.csv"]
    monkeypatch.undo()
    write_all_or_nothing([(a, lambda fh: fh.write("new a"), "w"), (b, lambda fh: fh.write("new b"), "w")])
    assert (a.read_text(), b.read_text()) == ("new a", "new b")


def test_two_writers_of_one_file_never_share_a_temporary(tmp_path):
    path = tmp_path / "shared.txt"
    with atomic_writer(path) as first:
        first.write("a" * 1000)
        with atomic_writer(path) as second:
            second.write("b" * 1000)
            names = {os.readlink(f"/proc/self/fd/{fh.fileno()}") for fh in (first, second)}
            assert len(names) == 2 and all(name.endswith(".tmp") for name in names)
        assert path.read_text() == "b" * 1000  # the second one finished first: whole
    assert path.read_text() == "a" * 1000  # then the first one replaced it, whole
    assert [p.name for p in tmp_path.iterdir()] == ["shared.txt"]


# ----------------------------------------------------------------------------- locks


def test_a_second_owner_is_refused_and_the_lock_is_released(tmp_path):
    out = tmp_path / "r.csv"
    with OutputLock.for_file(out, "--output r.csv") as lock:
        assert lock.path == tmp_path / "r.csv.lock"
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
        with pytest.raises(RunLockedError, match=rf"--output r.csv is in use by process {os.getpid()} on host"):
            OutputLock.for_file(out, "--output r.csv").acquire()
    assert not (tmp_path / "r.csv.lock").exists()
    with output_locks([OutputLock.for_file(out), OutputLock.for_folder(tmp_path / "rep")]):
        assert (tmp_path / "rep" / "run.lock").exists()
        with pytest.raises(RunLockedError):  # all or none: the free lock is given back too
            with output_locks([OutputLock.for_file(tmp_path / "s.csv"), OutputLock.for_file(out)]):
                pass
        assert not (tmp_path / "s.csv.lock").exists()


def test_a_stale_lock_is_taken_over_and_another_hosts_is_not(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock_path = tmp_path / "r.csv.lock"
    lock_path.write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    with pytest.warns(RuntimeWarning, match="stale lock"):
        with OutputLock.for_file(tmp_path / "r.csv"):
            pass
    lock_path.write_text(json.dumps({"pid": 1, "host": "elsewhere"}))
    with pytest.raises(RunLockedError, match="host elsewhere.*delete"):
        OutputLock.for_file(tmp_path / "r.csv").acquire()
