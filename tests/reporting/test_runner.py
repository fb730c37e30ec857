"""The ``osa-lab report`` runner on tiny throw-away notebooks (a few kernel starts, ~30 s).

Checks: the kernel runs this interpreter; YAML list parameters reach the notebook; a failing
notebook does not stop the others and the exit status and message name the notebook and the
cell; a cell timeout is reported as such; index.html links every notebook with parameters
and run time; the HTML exports render offline (no network resources, images embedded).
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
import yaml

from osa_lab import cli
from osa_lab.reporting import runner as report

OK_NOTEBOOK = '''
# %% [markdown]
# # tiny report

# %% tags=["parameters"]
sizes: list = [1, 2]
label: str = "default"

# %%
from osa_lab.reporting import kernel_setup as nb

params = nb.opening("01_ok", globals())

# %%
import sys

print("EXECUTABLE", sys.executable)
print("PARAMS", sizes, label, type(sizes).__name__)

# %%
import holoviews as hv

nb.show(hv.Curve([(1, 1.0), (2, 4.0), (3, 9.0)]).opts(backend="matplotlib", logy=True))

# %%
nb.say(f"SAID {len(sizes)} sizes")
nb.finding(f"the largest size is {max(sizes)} <b>")

# %%
nb.closing()
'''

FAILING_NOTEBOOK = '''
# %% [markdown]
# # fails on purpose

# %% tags=["parameters"]
n: int = 3

# %%
x = n + 1

# %%
raise ValueError("deliberate failure " + str(x))

# %%
print("never reached")
'''

LAST_NOTEBOOK = '''
# %% [markdown]
# # runs after the failure

# %% tags=["parameters"]
n: int = 1

# %%
print("LAST RAN", n)
'''


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def _outputs(ipynb: Path) -> str:
    nb = nbformat.read(str(ipynb), as_version=4)
    chunks = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            chunks.append(out.get("text", "") or json.dumps(out.get("data", {}).get("text/plain", "")))
    return "\n".join(chunks)


@pytest.fixture(scope="module", params=[1, 2], ids=["one-at-a-time", "two-at-once"])
def run_three(request, tmp_path_factory):
    """Run ok / failing / ok notebooks once through the CLI, one at a time and two at once
    (``--jobs 2``: each in its own process); share the outputs across tests."""
    src = tmp_path_factory.mktemp("notebooks")
    out = tmp_path_factory.mktemp("reports")
    _write(src, "01_ok", OK_NOTEBOOK)
    _write(src, "02_fails", FAILING_NOTEBOOK)
    _write(src, "03_last", LAST_NOTEBOOK)
    params = src / "params.yaml"
    params.write_text(yaml.safe_dump({"01_ok": {"sizes": [4, 5, 6], "label": "from-yaml"}}))
    # A relative --output from a working directory other than the one the kernel runs in
    # (papermill changes directory to the notebooks' parent while it executes).
    argv = ["report", "--notebooks", str(src), "--output", out.name, "--params", str(params), "--no-progress",
            "--jobs", str(request.param)]  # fmt: skip
    return out, argv


@pytest.fixture(scope="module")
def three_result(run_three):
    out, argv = run_three
    import contextlib
    import io

    err = io.StringIO()
    std = io.StringIO()
    with contextlib.chdir(out.parent), contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        rc = cli.main(argv)
        assert Path.cwd() == out.parent  # papermill's change of directory is undone
    return out, rc, std.getvalue(), err.getvalue()


def _dies_for_01_raises_for_02(name: str, *args, **options) -> report.NotebookResult:
    """A stand-in for ``execute_one``: its process dies on notebook ``01``, it raises on ``02``."""
    if name.startswith("01"):
        os._exit(3)
    if name.startswith("02"):
        raise ValueError("no such cell")
    threads = os.environ.get("OMP_NUM_THREADS")
    return report.NotebookResult(name=name, source=str(args[0]), params={"threads": threads}, ok=True)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_process_that_dies_or_raises_fails_its_notebook_only(tmp_path, monkeypatch, jobs):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    names = ("01_a", "02_b", "03_c")
    calls = {name: (name, tmp_path / f"{name}.py", {"n": 1}, tmp_path, tmp_path) for name in names}
    seen = []
    done = report.execute_in_processes(calls, {"cwd": tmp_path}, jobs, report=seen.append, run=_dies_for_01_raises_for_02)
    assert sorted(r.name for r in seen) == list(names) and set(done) == set(names)
    dead, raised = done["01_a"], done["02_b"]
    assert not dead.ok and dead.params == {"n": 1} and dead.source == str(tmp_path / "01_a.py")
    assert "died (exit code 3)" in dead.error and "--jobs 1" in dead.error, dead.error
    assert not raised.ok and raised.error == "stopped: ValueError: no such cell"
    assert done["03_c"].ok  # queued behind both, it still ran
    # with two at once each process gets its share of the cores for torch's threads
    expected = None if jobs == 1 else str(max(1, (os.cpu_count() or 1) // 2))
    assert done["03_c"].params["threads"] == expected


def test_no_notebooks_in_processes_is_an_empty_result(tmp_path):
    assert report.execute_in_processes({}, {}, 2) == {}


def test_jobs_below_one_is_refused_before_anything_runs(tmp_path, capsys):
    src = tmp_path / "nb"
    src.mkdir()
    _write(src, "01_typed", LAST_NOTEBOOK)
    with pytest.raises(report.ReportError, match="--jobs"):
        report.run_reports({"01_typed": src / "01_typed.py"}, {}, tmp_path / "o", jobs=0)
    assert not (tmp_path / "o").exists()
    assert cli.main(["report", "--notebooks", str(src), "--output", str(tmp_path / "o"), "--jobs", "0"]) == 2
    assert "--jobs" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_failure_is_named_and_others_still_run(run_three, three_result):
    out, rc, stdout, stderr = three_result
    jobs = int(run_three[1][run_three[1].index("--jobs") + 1])
    assert re.search(r"notebooks ran in \d+\.\d s", stdout), stdout  # the wall time
    assert ("s of notebook time, 2 at once" in stdout) == (jobs == 2), stdout
    assert rc == 1
    assert "FAILED 02_fails" in stderr
    assert "deliberate failure 4" in stderr
    assert re.search(r"In \[\d+\]", stderr), stderr  # the failing cell is named
    assert "raise ValueError" in stderr  # ... with its first line of code
    assert "03_last" not in stderr.split("FAILED", 1)[1].split("\n")[0]
    assert "LAST RAN 1" in _outputs(out / "03_last.ipynb")
    assert "2/3 notebooks ran" in stdout and str(out / "index.html") in stdout


def test_kernel_is_this_interpreter_and_yaml_lists_arrive(three_result):
    out = three_result[0]
    text = _outputs(out / "01_ok.ipynb")
    assert f"EXECUTABLE {sys.executable}" in text
    assert "PARAMS [4, 5, 6] from-yaml list" in text


def test_outputs_and_index(three_result):
    out = three_result[0]
    for name in ("01_ok", "02_fails", "03_last"):
        assert (out / f"{name}.ipynb").is_file()
        assert (out / f"{name}.html").is_file()  # the failing notebook is exported too
    index = (out / "index.html").read_text()
    for name in ("01_ok", "02_fails", "03_last"):
        assert f'href="{name}.html"' in index and f'href="{name}.ipynb"' in index
    assert "from-yaml" in index and "4, 5, 6" in index  # parameters shown
    assert re.search(r"\d+\.\d s", index)  # run time shown
    assert "deliberate failure" in index
    summary = json.loads((out / "summary.json").read_text())
    assert [n["ok"] for n in summary["notebooks"]] == [True, False, True]
    assert summary["provenance"]["git"]["commit"]


def test_html_renders_offline(three_result):
    out = three_result[0]
    page = (out / "01_ok.html").read_text()
    assert report.external_references(page) == []
    assert "data:image/png;base64," in page  # the figure is embedded, not linked
    # A one-line provenance summary opens the report; the full table closes it, collapsed.
    summary, table = page.find("· git "), page.find("<summary><b>Provenance</b>")
    figure = page.rfind("data:image/png;base64,")  # the plot (earlier ones belong to the page's theme)
    assert 0 <= summary < figure < table, (summary, figure, table)
    assert "git.commit" in page[table:]


def test_index_gives_each_report_its_finding_beside_its_run_time(three_result):
    out = three_result[0]
    index = (out / "index.html").read_text()
    row = next(r for r in index.split("<tr>") if 'href="01_ok.html"' in r)
    assert "the largest size is 6 &lt;b&gt;" in row  # from the run's own parameters, escaped
    assert re.search(r"the largest size is 6 &lt;b&gt;</td><td>\d+\.\d s", row), row
    assert "(no finding recorded)" in next(r for r in index.split("<tr>") if 'href="03_last.html"' in r)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["notebooks"][0]["finding"] == "the largest size is 6 <b>"


def test_report_html_hides_code_until_the_reader_asks_in_a_browser(three_result):
    """The HTML report shows text, tables and figures but no code cell by default; the box at the
    top shows the code. Driven in headless Chromium (skipped without it)."""
    import os

    chromium = os.environ.get("OSA_LAB_CHROMIUM", "/usr/bin/chromium")
    if not Path(chromium).exists():
        pytest.skip(f"headless Chromium not found at {chromium}")
    sync_api = pytest.importorskip("playwright.sync_api")
    out = three_result[0]
    page_text = (out / "01_ok.html").read_text()
    assert "SAID 3 sizes" in page_text and page_text.count("jp-CodeCell") >= 4
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto((out / "01_ok.html").as_uri())
            sources = page.locator(".jp-CodeCell .jp-Cell-inputWrapper")
            assert sources.count() >= 4
            assert not any(sources.nth(i).is_visible() for i in range(sources.count()))
            assert page.get_by_text("import holoviews as hv").first.is_visible() is False
            assert page.get_by_text("SAID 3 sizes").first.is_visible()  # generated text stays
            assert page.locator("img").first.is_visible()  # the figure stays
            page.get_by_text("show the code").click()
            assert all(sources.nth(i).is_visible() for i in range(sources.count()))
            assert page.get_by_text("import holoviews as hv").first.is_visible()
        finally:
            browser.close()


def test_external_references_detects_cdn_scripts():
    page = (
        '<script src="https://cdn.example.org/require.min.js"></script>'
        '<a href="https://example.org/paper">a link is fine</a>'
        '<script>var js_urls = ["https://cdn.bokeh.org/bokeh/release/bokeh-3.9.2.min.js"];</script>'
        '<style>@import "https://fonts.example/x.css"; .a{background:url(//img.example/p.png)}</style>'
    )
    found = report.external_references(page)
    assert len(found) == 4, found
    assert report.external_references('<img src="data:image/png;base64,AAAA">') == []


def test_cell_timeout_names_cell(tmp_path, capsys):
    src = tmp_path / "nbs"
    src.mkdir()
    _write(src, "01_slow", '# %% tags=["parameters"]\nseconds: float = 30.0\n\n# %%\nimport time\ntime.sleep(seconds)\n')
    rc = cli.main(["report", "--notebooks", str(src), "--output", str(tmp_path / "out"), "--cell-timeout", "2", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "FAILED 01_slow" in err and "timed out" in err and "`import time`" in err and "--cell-timeout" in err


def test_bad_requests_exit_2_before_running(tmp_path, capsys):
    src = tmp_path / "nbs"
    src.mkdir()
    _write(src, "01_only", '# %% tags=["parameters"]\nn: int = 1\n\n# %%\nprint(n)\n')
    out = tmp_path / "out"
    bad_key = tmp_path / "bad.yaml"
    bad_key.write_text("01_only:\n  n: 2\n  typo_param: 3\n")
    assert cli.main(["report", "--notebooks", str(src), "--output", str(out), "--params", str(bad_key)]) == 2
    assert "typo_param" in capsys.readouterr().err
    bad_nb = tmp_path / "bad_nb.yaml"
    bad_nb.write_text("99_missing:\n  n: 2\n")
    assert cli.main(["report", "--notebooks", str(src), "--output", str(out), "--params", str(bad_nb)]) == 2
    assert "99_missing" in capsys.readouterr().err
    assert cli.main(["report", "--notebooks", str(src), "--output", str(out), "--only", "07"]) == 2
    assert "01_only" in capsys.readouterr().err  # lists the valid names
    assert not (out / "index.html").exists()  # nothing ran


def test_select_by_prefix_and_comma():
    nbs = {"01_a": Path("a"), "02_b": Path("b"), "03_c": Path("c")}
    assert list(report.select(nbs, ["03", "01_a"])) == ["01_a", "03_c"]
    assert list(report.select(nbs, ["02,03"])) == ["02_b", "03_c"]
    assert report.select(nbs, None) == nbs


def test_kernel_spec_shadows_foreign_python3(tmp_path, monkeypatch):
    from jupyter_client.kernelspec import KernelSpecManager

    foreign = tmp_path / "kernels" / "python3"
    foreign.mkdir(parents=True)
    (foreign / "kernel.json").write_text(
        json.dumps({"argv": ["/nonexistent/python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                    "display_name": "other", "language": "python"})
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    assert KernelSpecManager().get_kernel_spec("python3").argv[0] == "/nonexistent/python"
    with report.ensure_kernel("python3") as name:
        assert KernelSpecManager().get_kernel_spec(name).argv[0] == sys.executable
    import os

    assert os.environ["JUPYTER_PATH"] == str(tmp_path)  # restored


def test_provenance_fields():
    from osa_lab.reporting import provenance

    info = provenance.collect({"ns": [1, 2], "obj": object()})
    assert len(info["git"]["commit"]) in (40, 7) or info["git"]["commit"] == "unknown"
    assert info["packages"]["torch"] != "not installed"
    assert info["params"]["ns"] == [1, 2] and info["params"]["obj"].startswith("<object")
    row = provenance.csv_columns({"n": 3})
    assert row["param.n"] == 3 and "git_commit" in row and "device" in row
    frame = provenance.as_frame(info)
    assert {"git.commit", "device.cpu_count", "params.ns"} <= set(frame["key"])


def test_index_keeps_notebooks_of_earlier_runs(tmp_path):
    """A run of a subset (`--only`) keeps the other notebooks listed, marked as from an earlier run."""
    out = tmp_path / "reports"
    out.mkdir()
    for name in ("01_a", "02_b"):
        (out / f"{name}.html").write_text("<html></html>")
    first = [
        report.NotebookResult("01_a", "01_a.py", {}, ok=True, seconds=1.0, html="01_a.html"),
        report.NotebookResult("02_b", "02_b.py", {"x": 1}, ok=True, seconds=2.0, html="02_b.html"),
    ]
    report.write_index(first, out)
    report.write_index([report.NotebookResult("02_b", "02_b.py", {}, ok=True, seconds=3.0, html="02_b.html")], out)
    index = (out / "index.html").read_text()
    assert 'href="01_a.html"' in index and 'href="02_b.html"' in index
    assert index.count("earlier run") == 1
    summary = json.loads((out / "summary.json").read_text())
    assert [n["name"] for n in summary["notebooks"]] == ["02_b"]
    assert [e["result"]["name"] for e in summary["earlier"]] == ["01_a"]
    # Gone from disk: no longer listed.
    (out / "01_a.html").unlink()
    report.write_index([report.NotebookResult("02_b", "02_b.py", {}, ok=True, seconds=3.0, html="02_b.html")], out)
    assert "01_a" not in (out / "index.html").read_text()


MALFORMED_SUMMARIES = [
    [],
    "text",
    {"notebooks": "01_a"},
    {"notebooks": [{"name": "01_a", "html": 5, "seconds": "1.0"}]},
    {"notebooks": [{"name": "01_a", "html": "01_a.html", "seconds": "slow", "params": [1, 2], "warnings": 3,
                    "ok": "yes", "failed_cell": "x", "error": {"a": 1}}]},
    {"notebooks": [{"name": "01_a", "html": "01_a.html", "seconds": True, "failed_cell": 1.5}]},
    {"notebooks": [{"name": "01_a", "html": "01_a.html", "seconds": 1e999}]},
    {"provenance": [1], "notebooks": [{"name": 3, "html": "01_a.html"}], "earlier": [{"result": {"name": None}}]},
    {"provenance": {"git": "abc"}, "earlier": [{"result": {"name": "01_a", "html": ["01_a.html"]}}, 7]},
    {"notebooks": [{"name": "01_a", "html": "../../etc/passwd"}, {"name": "01_a", "html": "01_a.html",
                                                                   "params": {"x": float("nan")}}]},
]


@pytest.mark.parametrize("stored", MALFORMED_SUMMARIES, ids=range(len(MALFORMED_SUMMARIES)))
def test_index_is_written_over_a_malformed_earlier_summary(tmp_path, stored):
    """A damaged or hand-edited summary.json of an earlier run never stops the index (it is written
    after every notebook has run): values of the wrong type are left out or take their defaults."""
    out = tmp_path / "reports"
    out.mkdir()
    (out / "01_a.html").write_text("<html></html>")
    (out / "summary.json").write_text(json.dumps(stored), encoding="utf-8")
    report.write_index([report.NotebookResult("02_b", "02_b.py", {}, ok=True, seconds=3.0, html="02_b.html")], out)
    index = (out / "index.html").read_text()
    assert 'href="02_b.html"' in index and "passwd" not in index
    summary = json.loads((out / "summary.json").read_text())
    for entry in summary["earlier"]:
        assert entry["result"]["name"] == "01_a" and entry["result"]["html"] == "01_a.html"
        assert isinstance(entry["result"].get("seconds", 0.0), float | int)


# ---------------------------------------------------------------------------------------------
# typed parameters, unwritable outputs, --params folder, --cell-timeout
# ---------------------------------------------------------------------------------------------

TYPED_NOTEBOOK = '''
# %% tags=["parameters"]
depth: int = 24
lr: float = 0.001
name: str = "x"
flag: bool = False
seeds: list = [0, 1]
alphas: list = [0.1, 1.0]
untyped = 3

# %%
print(depth)
'''


@pytest.mark.parametrize(
    ("params", "ok"),
    [
        ({"depth": 2.5}, False),  # was: ran depth 2 while the index said 2.5
        ({"depth": True}, False),
        ({"depth": "24"}, False),
        ({"depth": 2}, True),
        ({"lr": 1}, True),  # an int is a fine float
        ({"lr": "fast"}, False),
        ({"name": 3}, False),
        ({"flag": 1}, False),
        ({"seeds": [0, 1.5]}, False),
        ({"seeds": 3}, False),
        ({"seeds": [2, 3]}, True),
        ({"alphas": [1, 0.5]}, True),
        ({"alphas": ["a"]}, False),
        ({"untyped": 2.5}, False),  # unannotated: the default's type (int)
        ({"untyped": 7}, True),
    ],
)
def test_check_params_refuses_wrong_types(tmp_path, params, ok):
    src = _write(tmp_path, "01_typed", TYPED_NOTEBOOK)
    declared = report.declared_parameters(src)
    if ok:
        report.check_params("01_typed", params, declared)
    else:
        with pytest.raises(report.ReportError, match=f"parameter {next(iter(params))} must be"):
            report.check_params("01_typed", params, declared, origin="p.yaml")


def test_report_bad_type_from_yaml_exits_2_and_creates_nothing(tmp_path, capsys):
    src = tmp_path / "nbs"
    src.mkdir()
    _write(src, "01_typed", TYPED_NOTEBOOK)
    params = tmp_path / "p.yaml"
    params.write_text("01_typed:\n  depth: 2.5\n")
    out = tmp_path / "out"
    assert cli.main(["report", "--notebooks", str(src), "--output", str(out), "--params", str(params)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("osa-lab report: error: notebook 01_typed: parameter depth must be int")
    assert err.count("\n") == 1 and "2.5" in err
    assert not out.exists()  # was: an empty output folder created before the check


def test_report_params_directory_and_unwritable_output(tmp_path, capsys):
    src = tmp_path / "nbs"
    src.mkdir()
    _write(src, "01_typed", TYPED_NOTEBOOK)
    assert cli.main(["report", "--notebooks", str(src), "--output", str(tmp_path / "o"), "--params", str(src)]) == 2
    assert "is a directory" in capsys.readouterr().err  # was: "does not exist"
    afile = tmp_path / "afile"
    afile.write_text("x")
    for output in (afile, afile / "reports"):  # was: tracebacks (FileExistsError / NotADirectoryError)
        assert cli.main(["report", "--notebooks", str(src), "--output", str(output)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("osa-lab report: error: --output") and "Traceback" not in err
    for timeout in ("0", "-5"):  # was: 0 silently meant the default, -5 was passed on
        assert cli.main(["report", "--notebooks", str(src), "--output", str(tmp_path / "o"),
                         "--cell-timeout", timeout]) == 2  # fmt: skip
        assert "--cell-timeout" in capsys.readouterr().err
    with pytest.raises(report.ReportError, match="cell_timeout"):
        report.run_reports({"01_typed": src / "01_typed.py"}, {}, tmp_path / "o", cell_timeout=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "nbs"]


def test_blank_only_is_refused_and_keeps_an_existing_index(tmp_path):
    # `report --only ""` must be refused, leaving index.html / summary.json as they were
    from tests.helpers import assert_cli_user_error

    src = tmp_path / "nbs"
    src.mkdir()
    _write(src, "01_only", '# %% tags=["parameters"]\nn: int = 1\n\n# %%\nprint(n)\n')
    out = tmp_path / "out"
    out.mkdir()
    (out / "index.html").write_text("earlier index")
    for only in ["", "  ", ","]:
        assert_cli_user_error(["report", "--notebooks", str(src), "--output", str(out), "--only", only,
                               "--no-progress"], r"--only .* names no notebook", watch=[tmp_path])  # fmt: skip
    assert (out / "index.html").read_text() == "earlier index"
    assert sorted(p.name for p in out.iterdir()) == ["index.html"]
    assert list(report.select({"01_a": Path("a")}, ["01_a, "])) == ["01_a"]  # a blank part beside a name is fine


BOUNDED_NOTEBOOK = '''
# %% tags=["parameters"]
depth: int = 24  # ≥ 1
frac: float = 0.1  # > 0, ≤ 1: share held out
sizes: list = [8, 16]  # ≥ 2
alpha: float = -0.5  # any sign
note: str = "x"  # ≥ 1 is ignored for strings

# %%
print(depth)
'''


@pytest.mark.parametrize(
    ("params", "broken"),
    [
        ({"depth": -3}, "≥ 1"),  # was: passed the type check, then the notebook failed leaving html/ipynb
        ({"depth": 0}, "≥ 1"),
        ({"depth": 1}, None),
        ({"frac": 0}, "> 0"),
        ({"frac": 1.5}, "≤ 1"),
        ({"frac": 1}, None),
        ({"sizes": [8, 1]}, "≥ 2"),
        ({"sizes": [2]}, None),
        ({"alpha": -7.0}, None),  # no bound declared
        ({"note": "y"}, None),
    ],
)
def test_check_params_refuses_values_outside_declared_bounds(tmp_path, params, broken):
    src = _write(tmp_path, "01_bounded", BOUNDED_NOTEBOOK)
    declared = report.declared_parameters(src)
    if broken is None:
        report.check_params("01_bounded", params, declared)
    else:
        key = next(iter(params))
        with pytest.raises(report.ReportError, match=rf"parameter {key} must be {re.escape(broken)} "):
            report.check_params("01_bounded", params, declared, origin="p.yaml")


def test_report_out_of_bounds_param_exits_2_and_creates_nothing(tmp_path):
    from tests.helpers import assert_cli_user_error

    src = tmp_path / "nbs"
    src.mkdir()
    _write(src, "01_bounded", BOUNDED_NOTEBOOK)
    params = tmp_path / "p.yaml"
    params.write_text("01_bounded:\n  depth: -3\n")
    assert_cli_user_error(["report", "--notebooks", str(src), "--output", str(tmp_path / "out"), "--params",
                           str(params), "--no-progress"], r"parameter depth must be ≥ 1 .*got -3",
                          watch=[tmp_path])  # fmt: skip


def test_a_full_disk_while_writing_the_index_keeps_the_earlier_one(tmp_path, monkeypatch):
    import errno
    import os

    from osa_lab.errors import OutputWriteError

    out = tmp_path / "reports"
    out.mkdir()
    (out / "01_a.html").write_text("<html></html>")
    result = [report.NotebookResult("01_a", "01_a.py", {}, ok=True, seconds=1.0, html="01_a.html")]
    report.write_index(result, out)
    before = {name: (out / name).read_bytes() for name in ("index.html", "summary.json")}
    real_write = os.write

    def full(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OutputWriteError, match=r"index\.html .*No space left"):
        report.write_index(result, out)
    assert {name: (out / name).read_bytes() for name in before} == before
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
