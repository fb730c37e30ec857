"""Every sub-command refuses bad arguments cleanly: exit status 2, one line naming the problem,
no traceback, no partial output files.

The rows run ``osa_lab.cli.main`` in-process through :func:`tests.helpers.assert_cli_user_error`
(the ``train`` rows live in ``tests/studies/test_training.py`` and use the same helper); a few run the
console entry point in a subprocess to show what reaches a terminal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from osa_lab import cli
from osa_lab.errors import OSAInputError
from tests.helpers import assert_cli_user_error, assert_cli_user_error_subprocess

#: A tiny sweep: if a check regressed, the row still finishes quickly.
SWEEP = ["sweep", "--presets", "pure-osa", "--depth", "2", "--tokens", "8", "--dim", "8", "--seeds", "1",
         "--no-progress", "--serial"]  # fmt: skip

SWEEP_ROWS = [
    # (extra arguments, regex the error line must match); {tmp} is the test's folder, {file} a file in it
    (["--batch", "0"], r"--batch: must be an int ≥ 1"),  # was: CSV of empty values, exit 0
    (["--batch", "-1"], r"--batch"),  # was: traceback
    (["--alpha", "nan"], r"--alpha: must be a finite number"),  # was: the derived α, silently
    (["--alpha", "inf"], r"--alpha"),
    (["--depth", "100000"], r"depth 100000 .*--allow-large"),  # was: accepted, bar stuck at 0/1
    (["--depth", "0"], r"--depth"),
    (["--depth", "2.5"], r"--depth: invalid int"),
    (["--tokens", "0"], r"--tokens"),
    (["--dim", "-8"], r"--dim"),
    (["--seeds", "0"], r"--seeds"),
    (["--heads", "0"], r"--heads"),
    (["--dim", "18", "--heads", "4"], r"not divisible"),
    (["--presets", "nope"], r"valid presets"),
    (["--site", "mlp"], r"--site: invalid choice"),
    (["--tokens", "512", "--dim", "512", "--jacobian", "exact"], r"GiB.*matrix-free"),
    (["--tokens", "512", "--dim", "512", "--jacobian", "matrix-free"], r"--allow-large"),
    (["--output", "{tmp}"], r"--output .* is a directory"),  # was: traceback after the work
    (["--output", "{file}/r.csv"], r"--output .*is a file, not a directory"),
    (["--output", "{tmp}/r.csv", "--spectra-output", "{file}/s.csv"], r"--spectra-output"),
    (["--output", "{tmp}/r.csv", "--spectra-output", "{tmp}"], r"--spectra-output .* is a directory"),
    (["--output", "{tmp}/r.csv", "--cache-dir", "{file}"], r"--cache-dir .* is a file"),
    (["--output", "{tmp}/r.csv", "--spectra-output", "{tmp}/r.csv"], r"output paths collide"),
    (["--output", "/proc/osa-lab-test/r.csv"], r"--output .*cannot write in /proc"),  # read-only location
    (["--bogus-flag"], r"unrecognized arguments: --bogus-flag"),
    # more bounds and grid options, all refused before any work
    (["--workers", "0"], r"--workers: expected a positive integer"),
    (["--threads-per-worker", "0"], r"--threads-per-worker"),
    (["--seeds", "100000"], r"100000 models.*--allow-large"),
    (["--batch", "100000000"], r"batch 100000000 .*--allow-large"),
    (["--tokens", "5000"], r"N = 5000.*--allow-large"),
    (["--presets"], r"--presets: expected at least one argument"),
    (["--heads", "3"], r"not divisible"),
    (["--tokens", "1"], r"--tokens: must be an int ≥ 2 .*compare tokens"),  # was: failed tasks, empty CSVs, exit 1
    (["--tokens", "8", "1"], r"--tokens: must be an int ≥ 2"),
]

REPORT_ROWS = [
    (["--cell-timeout", "0"], r"--cell-timeout: must be an int ≥ 1"),  # was: silently the default
    (["--cell-timeout", "-5"], r"--cell-timeout"),  # was: passed on to papermill
    (["--params", "{tmp}"], r"is a directory"),  # was: "does not exist"
    (["--params", "{tmp}/missing.yaml"], r"does not exist"),
    (["--params", "{yaml_depth}", "--only", "02"], r"parameter depth must be int .*2\.5"),  # was: ran depth 2
    (["--params", "{yaml_unknown}", "--only", "02"], r"does not declare parameter\(s\) typo"),
    (["--output", "{file}"], r"--output .* is a file"),  # was: traceback
    (["--output", "{file}/reports"], r"--output .*is a file, not a directory"),
    (["--output", "/proc/osa-lab-test-reports"], r"--output .*cannot write in /proc"),
    (["--only", "99"], r"--only '99' matches none"),
    (["--notebooks", "{tmp}/none"], r"notebook folder .* does not exist"),
    (["--params", "{yaml_list}"], r"must map notebook names to parameter mappings"),
    (["--params", "{yaml_bool}", "--only", "02"], r"parameter depth must be int .*True \(bool\)"),
    (["--only", "0"], r"--only '0' is ambiguous"),
    (["--only", ""], r"--only '' names no notebook"),  # was: ran nothing, exit 0, rewrote index.html
    (["--only", " , "], r"names no notebook"),
]

BENCH_ROWS = [
    (["--sizes", "0"], r"--sizes"),  # was: traceback
    (["--sizes", "-5"], r"--sizes"),
    (["--repeat", "0"], r"--repeat"),
    (["--r", "0"], r"--r"),
    (["--memory-sizes", "0"], r"--memory-sizes"),
    (["--bh", "0"], r"--bh"),  # was: exit 0 with a meaningless row
    (["--output", "{tmp}"], r"--output .* is a directory"),
    (["--device", "tpu"], r"--device: invalid choice"),
    (["--d", "0"], r"--d: must be an int ≥ 1"),
    (["--sizes", "8.5"], r"--sizes: invalid int"),
    (["--output", "{file}/b.csv"], r"--output .*is a file, not a directory"),
    (["--output", "/proc/osa-lab-test/b.csv"], r"--output .*cannot write in /proc"),
]

DASHBOARD_ROWS = [
    (["--port", "-1"], r"--port: invalid port"),
    (["--port", "70000"], r"--port: invalid port"),
    (["--port", "http"], r"--port: invalid port"),
    (["--num-threads", "0"], r"--num-threads"),
    (["--address", ""], r"--address: invalid address"),
    (["--address", "bad host name"], r"--address: invalid address"),
    (["--num-threads", "-3"], r"--num-threads"),
]


@pytest.fixture
def places(tmp_path):
    """Fill the ``{tmp}``, ``{file}`` and parameter-file placeholders of a row."""
    (tmp_path / "afile").write_text("not a folder")
    (tmp_path / "depth.yaml").write_text("02_rank_collapse:\n  depth: 2.5\n")
    (tmp_path / "unknown.yaml").write_text("02_rank_collapse:\n  typo: 1\n")
    (tmp_path / "list.yaml").write_text("02_rank_collapse: [1, 2]\n")
    (tmp_path / "bool.yaml").write_text("02_rank_collapse:\n  depth: true\n")

    def fill(args: list[str]) -> list[str]:
        return [
            a.format(tmp=tmp_path, file=tmp_path / "afile", yaml_depth=tmp_path / "depth.yaml",
                     yaml_unknown=tmp_path / "unknown.yaml", yaml_list=tmp_path / "list.yaml",
                     yaml_bool=tmp_path / "bool.yaml")  # fmt: skip
            for a in args
        ]

    return fill


@pytest.mark.parametrize(("extra", "match"), SWEEP_ROWS, ids=[" ".join(r[0]) for r in SWEEP_ROWS])
def test_sweep_bad_arguments(tmp_path, places, monkeypatch, extra, match):
    monkeypatch.chdir(tmp_path)  # the default --output results.csv lands in tmp_path
    assert_cli_user_error([*SWEEP, *places(extra)], match, watch=[tmp_path])


#: A tiny sweep for an external scheduler (no --serial: that and --scheduler exclude each other).
SWEEP_REMOTE = [a for a in SWEEP if a != "--serial"]


@pytest.mark.parametrize(
    ("address", "match"),
    [
        ("notanaddress", r"invalid Dask scheduler address 'notanaddress'.*tcp://host:8786"),  # was: traceback
        ("foo://bar:1", r"invalid Dask scheduler address"),
        ("tcp://127.0.0.1:1", r"cannot reach the Dask scheduler"),  # was: exit 2 but r_tasks/ left behind
    ],
)
def test_sweep_bad_scheduler_is_one_line_and_leaves_no_task_store(tmp_path, monkeypatch, address, match):
    import dataclasses

    from osa_lab.studies.depth import cli as analysis
    from osa_lab.studies.grid import ENV_SCHEDULER

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ENV_SCHEDULER, raising=False)
    # a short connection timeout keeps the unreachable row quick (the default waits 30 s)
    options = analysis.options_from_args
    monkeypatch.setattr(analysis, "options_from_args",
                        lambda args, **kw: dataclasses.replace(options(args, **kw), connect_timeout=1))  # fmt: skip
    assert_cli_user_error([*SWEEP_REMOTE, "--scheduler", address, "--output", "r.csv"], match, watch=[tmp_path])


def test_sweep_bad_scheduler_keeps_an_existing_task_store(tmp_path, monkeypatch):
    from osa_lab.studies.grid import ENV_SCHEDULER

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ENV_SCHEDULER, raising=False)
    store = tmp_path / "r_tasks"
    store.mkdir()
    (store / "earlier.pkl").write_bytes(b"x")
    assert_cli_user_error([*SWEEP_REMOTE, "--scheduler", "notanaddress", "--output", "r.csv"],
                          r"invalid Dask scheduler address", watch=[tmp_path])  # fmt: skip
    assert (store / "earlier.pkl").read_bytes() == b"x"


def test_sweep_bad_scheduler_with_progress_bar_is_still_one_line(tmp_path, monkeypatch):
    # the progress bar used to be drawn (0/N) before the connection failed: two lines on stderr
    from osa_lab.studies.grid import ENV_SCHEDULER

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ENV_SCHEDULER, raising=False)
    argv = [a for a in SWEEP_REMOTE if a != "--no-progress"]
    assert_cli_user_error([*argv, "--scheduler", "notanaddress"], r"invalid Dask scheduler address", watch=[tmp_path])


@pytest.mark.parametrize(("extra", "match"), REPORT_ROWS, ids=[" ".join(r[0]) for r in REPORT_ROWS])
def test_report_bad_arguments(tmp_path, places, monkeypatch, extra, match):
    monkeypatch.chdir(tmp_path)  # the default --output reports/ would land in tmp_path
    assert_cli_user_error(["report", "--no-progress", *places(extra)], match, watch=[tmp_path])


@pytest.mark.parametrize(("extra", "match"), BENCH_ROWS, ids=[" ".join(r[0]) for r in BENCH_ROWS])
def test_bench_bad_arguments(tmp_path, places, monkeypatch, extra, match):
    monkeypatch.chdir(tmp_path)
    assert_cli_user_error(["bench", "--quick", "--memory-sizes", *places(extra)], match, watch=[tmp_path])


@pytest.mark.parametrize(("extra", "match"), DASHBOARD_ROWS, ids=[" ".join(r[0]) for r in DASHBOARD_ROWS])
def test_dashboard_dry_run_bad_arguments(tmp_path, places, extra, match):
    assert_cli_user_error(["dashboard", "--dry-run", *places(extra)], match, watch=[tmp_path])


def test_dashboard_missing_app_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("OSA_LAB_DASHBOARD", str(tmp_path / "nope.py"))
    assert_cli_user_error(["dashboard", "--dry-run"], r"dashboard script not found", watch=[tmp_path])


@pytest.mark.parametrize("argv", [["bogus"], ["swep", "--depth", "2"], ["--depth"]])
def test_unknown_command(argv):
    assert_cli_user_error(argv, r"unknown command")


def test_help_returns_0_and_does_not_exit(capsys):
    assert cli.main(["sweep", "--help"]) == 0
    assert "--allow-large" in capsys.readouterr().out
    assert cli.main(["--help"]) == 0


@pytest.mark.parametrize("command", sorted(cli.SUBCOMMANDS))
def test_every_subcommand_prints_its_help(command, capsys):
    # argparse %-formats help strings: a bare "%" (e.g. "80% of") crashed `osa-lab bench --help`
    assert cli.main([command, "--help"]) == 0
    assert "usage: osa-lab" in capsys.readouterr().out


def test_typed_error_from_any_subcommand_is_one_line_but_bugs_keep_tracebacks(monkeypatch):
    import osa_lab.dashboard.cli as dashboard_cli

    def typed(args):
        raise OSAInputError("`x` is bad;\n  give a good one")

    monkeypatch.setattr(dashboard_cli, "run", typed)
    line = assert_cli_user_error(["dashboard", "--dry-run"], r"`x` is bad; give a good one")
    assert line == "osa-lab dashboard: error: `x` is bad; give a good one"  # newlines folded

    def bug(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(dashboard_cli, "run", bug)
    with pytest.raises(ZeroDivisionError):  # a bug is not a user error: the traceback stays
        cli.main(["dashboard", "--dry-run"])
    monkeypatch.setattr(dashboard_cli, "run", typed)
    monkeypatch.setenv("OSA_LAB_TRACEBACK", "1")
    with pytest.raises(OSAInputError):
        cli.main(["dashboard", "--dry-run"])


def test_is_user_error_covers_the_typed_errors():
    from osa_lab.errors import ConfigurationError, MethodUnavailableError, OutputPathError, UnknownNameError
    from osa_lab.reporting.runner import ReportError
    from osa_lab.studies.data import MissingDataError

    for exc in (OSAInputError("x"), ConfigurationError("x"), UnknownNameError("x"), MethodUnavailableError("x"),
                OutputPathError("x"), ReportError("x"), MissingDataError("x")):  # fmt: skip
        assert cli.is_user_error(exc), type(exc)
    for exc in (ValueError("x"), RuntimeError("x"), KeyError("x"), FileNotFoundError("x")):
        assert not cli.is_user_error(exc), type(exc)
    # osa_lab's own outcomes that are not bad input: a bug-like traceback, not "fix your arguments"
    from osa_lab.errors import ComputationCancelledError, TrainingDivergedError

    for exc in (ComputationCancelledError("x"), TrainingDivergedError("x", step=1, epoch=1, preset="p", checkpoint=None)):
        assert not cli.is_user_error(exc), type(exc)


def test_the_top_level_help_describes_the_tool(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "Orthogonal Self-Attention" in out and "skew-symmetric" in out
    assert "each in its own module" not in out
    for name in cli.SUBCOMMANDS:
        assert f"osa-lab {name}" in out, f"the examples show no `osa-lab {name}`"


def test_the_help_line_of_each_command_says_what_it_does_for_its_user(capsys):
    assert cli.main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    wanted = {
        "bench": ["softmax attention (SDPA)", "memory"],
        "sweep": ["rank collapse", "Jacobian"],
        "report": ["HTML"],
        "dashboard": ["dashboard"],
        "train": ["digits", "MNIST-1D", "comparison", "tuned", "named study"],
    }
    assert set(wanted) == set(cli.SUBCOMMANDS)
    for name, words in wanted.items():
        line = cli.SUBCOMMANDS[name][1]
        assert line in out, f"`osa-lab --help` does not show the help line of {name}"
        assert all(word in line for word in words), (name, line)
        assert not any(inner in line for inner in ("module", "papermill", "Panel")), (name, line)


def test_version(capsys):
    from osa_lab.version import __version__

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"osa-lab {__version__}"
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "osa_lab.version.__version__"}
    assert "version" in pyproject["project"]["dynamic"] and "version" not in pyproject["project"]


def test_python_dash_m_osa_lab_is_the_command_line(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from osa_lab.version import __version__

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    version = subprocess.run([sys.executable, "-m", "osa_lab", "--version"], capture_output=True, text=True,
                             cwd=tmp_path, env=env, timeout=300)  # fmt: skip
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"osa-lab {__version__}"
    bad = subprocess.run([sys.executable, "-m", "osa_lab", "bogus"], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=300)  # fmt: skip
    assert bad.returncode == 2 and "usage: osa-lab" in bad.stderr and "unknown command 'bogus'" in bad.stderr


# ---- in a subprocess: what a terminal shows ---------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["sweep", "--batch", "0", "--no-progress"], r"--batch"),
        (["sweep", "--output", "{tmp}", "--depth", "2", "--tokens", "8", "--dim", "8", "--seeds", "1"],
         r"is a directory"),
        (["bench", "--sizes", "0"], r"--sizes"),
        (["bogus"], r"unknown command"),
    ],
)
def test_no_traceback_reaches_the_terminal(tmp_path, places, argv, match):
    assert_cli_user_error_subprocess(places(argv), match, watch=[tmp_path], cwd=tmp_path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_typed_error_raised_inside_run_reaches_the_terminal_as_one_line(tmp_path):
    # MethodUnavailableError is raised inside bench.run and formatted by cli.main
    assert_cli_user_error_subprocess(["bench", "--device", "cuda", "--output", str(tmp_path / "c.csv")],
                                     r"--device cuda: no CUDA device", watch=[tmp_path], cwd=tmp_path)  # fmt: skip


def test_dashboard_dry_run_accepts_good_values(capsys):
    assert cli.main(["dashboard", "--dry-run", "--port", "0", "--num-threads", "2", "--address", "0.0.0.0"]) == 0
    out = capsys.readouterr().out
    assert "panel serve" in out and "--port 0" in out and "--num-threads 2" in out


# ----------------------------------------------------------------------------- full disks, concurrent writers


def _fail_temporary_writes(monkeypatch, where: str) -> None:
    """``os.write`` raises ENOSPC for every temporary (``*.tmp``) whose path contains ``where``."""
    import errno
    import os

    real_write = os.write

    def write(fd, data):
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.endswith(".tmp") and where in target:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


def _earlier_outputs(folder, names) -> dict:
    for name in names:
        (folder / name).write_text(f"earlier {name}\n")
    return {name: f"earlier {name}\n" for name in names}


SWEEP_OUTPUTS = ["r.csv", "r_spectra.csv", "r_tasks.csv"]


def test_sweep_on_a_full_disk_is_one_line_and_keeps_the_earlier_outputs(tmp_path, monkeypatch):
    earlier = _earlier_outputs(tmp_path, SWEEP_OUTPUTS)
    _fail_temporary_writes(monkeypatch, str(tmp_path))
    out = tmp_path / "r.csv"
    assert_cli_user_error([*SWEEP, "--output", str(out)], rf"cannot write {out} \(No space left on device\)",
                          watch=[tmp_path])  # fmt: skip
    assert {name: (tmp_path / name).read_text() for name in SWEEP_OUTPUTS} == earlier


def test_sweep_tables_that_cannot_be_written_are_computed_once(tmp_path, monkeypatch, capsys):
    """The task store took the results: after the disk is freed, the rerun only writes the tables."""
    _fail_temporary_writes(monkeypatch, ".csv.")
    out = tmp_path / "r.csv"
    assert cli.main([*SWEEP, "--output", str(out)]) == 2
    assert "osa-lab sweep: error: cannot write" in capsys.readouterr().err
    assert not out.exists() and len(list((tmp_path / "r_tasks").glob("*.npz"))) == 1
    monkeypatch.undo()
    assert cli.main([*SWEEP, "--output", str(out)]) == 0
    assert pd.read_csv(tmp_path / "r_tasks.csv")["cached"].all()


def test_sweep_refuses_an_output_another_sweep_is_writing(tmp_path):
    from osa_lab.fileio import OutputLock

    out = tmp_path / "r.csv"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom osa_lab.fileio import OutputLock\n"
         f"with OutputLock.for_file({str(out)!r}):\n    print('held', flush=True)\n    sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        assert_cli_user_error([*SWEEP, "--output", str(out)], rf"--output {out} is in use by process {holder.pid}",
                              watch=[tmp_path])  # fmt: skip
    finally:
        holder.communicate("", timeout=60)
    assert not OutputLock.for_file(out).path.exists()


@pytest.mark.slow
def test_two_concurrent_sweeps_on_one_output_never_mix_their_tables(tmp_path):
    out = tmp_path / "r.csv"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    argv = [sys.executable, "-m", "osa_lab.cli", "sweep", "--presets", "pure-osa", "--depth", "6", "--tokens", "16",
            "--dim", "16", "--seeds", "2", "--no-progress", "--serial", "--output", str(out), "--alpha"]  # fmt: skip
    procs = [subprocess.Popen([*argv, alpha], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for alpha in ("0.5", "2.0")]  # fmt: skip
    results = [(p.wait(600), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    for rc, err in results:
        assert "Traceback" not in err, err
        assert rc == 0 or (rc == 2 and "is in use by process" in err), (rc, err)
    assert any(rc == 0 for rc, _ in results)
    alphas = {name: set(pd.read_csv(tmp_path / name)["alpha"]) for name in SWEEP_OUTPUTS}
    assert alphas["r.csv"] in ({0.5}, {2.0}) and len(set(map(frozenset, alphas.values()))) == 1, alphas
    assert not list(tmp_path.glob(".*.tmp")) and not list(tmp_path.glob("*.lock"))


BENCH_QUICK = ["--quick", "--repeat", "1", "--memory-sizes", "--roofline-sizes"]


def test_bench_on_a_full_disk_is_one_line_and_keeps_the_earlier_csv(tmp_path, monkeypatch, capsys):
    from osa_lab.benchmarking import runner as bench

    out = tmp_path / "core.csv"
    earlier = _earlier_outputs(tmp_path, ["core.csv"])
    _fail_temporary_writes(monkeypatch, str(tmp_path))
    assert bench.main([*BENCH_QUICK, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line]
    assert errors == [f"osa-lab bench: error: cannot write {out} (No space left on device); nothing was written "
                      "there (an earlier file is kept): free some space or choose another location"], err
    assert "Traceback" not in err and out.read_text() == earlier["core.csv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["core.csv"]


def test_report_refuses_a_folder_another_report_is_writing(tmp_path):
    from osa_lab.fileio import OutputLock
    from osa_lab.reporting.runner import REPORT_LOCK

    reports = tmp_path / "reports"
    with OutputLock.for_folder(reports, name=REPORT_LOCK):
        assert_cli_user_error(["report", "--output", str(reports), "--only", "02", "--no-progress"],
                              r"--output .*reports is in use by process")  # fmt: skip
    assert list(reports.iterdir()) == []


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs mounted at ``tmp_path / "disk"`` (root only; skipped where it cannot be mounted)."""
    import os

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def _fill_leaving_one_page(disk) -> None:
    """Fill ``disk`` to the last byte, then free one page (room for a lock file and nothing else)."""
    import errno
    import os

    fd = os.open(disk / "filler", os.O_CREAT | os.O_WRONLY)
    try:
        while True:
            try:
                os.write(fd, b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        os.ftruncate(fd, os.lseek(fd, 0, os.SEEK_CUR) - 4096)
    finally:
        os.close(fd)


def test_sweep_and_bench_on_a_full_tmpfs_keep_the_earlier_files(small_disk, capsys):
    from osa_lab.benchmarking import runner as bench

    earlier = _earlier_outputs(small_disk, [*SWEEP_OUTPUTS, "core.csv"])
    _fill_leaving_one_page(small_disk)
    before = sorted(p.name for p in small_disk.iterdir())
    out = small_disk / "r.csv"
    assert_cli_user_error([*SWEEP, "--output", str(out)], rf"cannot write {out} \(No space left on device\)")
    assert bench.main([*BENCH_QUICK, "--output", str(small_disk / "core.csv")]) == 2
    assert f"osa-lab bench: error: cannot write {small_disk / 'core.csv'} (No space" in capsys.readouterr().err
    assert sorted(p.name for p in small_disk.iterdir()) == before  # no temporary, no lock, no task store
    assert {name: (small_disk / name).read_text() for name in earlier} == earlier
