"""Static checks of the report notebook sources and their parameter files (no kernel started).

docs/design.md §6: py:percent sources with one cell tagged ``parameters``; every key of every
parameter file must be declared by its notebook (papermill only warns about unknown keys).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import jupytext
import pytest
import yaml

from osa_lab.reporting import runner as report

NOTEBOOKS = report.discover(report.NOTEBOOK_DIR)
PARAM_FILES = sorted(report.NOTEBOOK_DIR.glob("*.yaml"))
EXPECTED = ["01_osa_matrix_exponential", "02_rank_collapse", "03_jacobian_conditioning", "04_skipless_training"]


def test_expected_notebooks_exist():
    missing = [name for name in EXPECTED if name not in NOTEBOOKS]
    assert not missing, f"missing report notebooks {missing}; found {list(NOTEBOOKS)}"


@pytest.mark.parametrize("name", list(NOTEBOOKS))
def test_one_parameters_cell_with_typed_defaults(name):
    nb = jupytext.read(NOTEBOOKS[name])
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{name}: {len(tagged)} cells tagged 'parameters', need exactly one"
    declared = report.declared_parameters(NOTEBOOKS[name])
    untyped = [p["name"] for p in declared.values() if p["inferred_type_name"] in ("None", "")]
    assert not untyped, f"{name}: parameters without a type annotation: {untyped}"


@pytest.mark.parametrize("name", list(NOTEBOOKS))
def test_opens_with_statement_and_provenance(name):
    nb = jupytext.read(NOTEBOOKS[name])
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.lstrip().startswith("#"), (
        f"{name}: the first cell must be a markdown title and statement of what the report shows"
    )
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", []), f"{name}: first code cell must be the parameters"
    assert "opening(" in code[1].source, f"{name}: the cell after the parameters must show provenance"
    assert "hv.extension" not in "".join(c.source for c in code), (
        f"{name}: hv.extension loads JavaScript from a CDN; draw with osa_lab.reporting.kernel_setup.show"
    )


def test_quick_params_cover_every_notebook():
    quick = report.load_params(report.NOTEBOOK_DIR / report.QUICK_PARAMS)
    missing = sorted(set(NOTEBOOKS) - set(quick))
    assert not missing, f"{report.QUICK_PARAMS} has no tiny parameters for {missing}"


@pytest.mark.parametrize("path", PARAM_FILES, ids=lambda p: p.name)
def test_parameter_files_declare_only_known_keys(path):
    params = report.load_params(path)
    unknown_notebooks = sorted(set(params) - set(NOTEBOOKS))
    assert not unknown_notebooks, f"{path.name}: no notebook named {unknown_notebooks}"
    for name, values in params.items():
        declared = report.declared_parameters(NOTEBOOKS[name])
        report.check_params(name, values, declared, origin=path.name)
        for key, value in values.items():
            declared_type = declared[key]["inferred_type_name"]
            if declared_type in ("list", "int", "float", "str", "bool"):
                ok = {"list": list, "int": int, "float": (int, float), "str": str, "bool": bool}[declared_type]
                assert isinstance(value, ok), f"{path.name}: {name}.{key}={value!r} is not a {declared_type}"


def test_check_params_rejects_undeclared_key(tmp_path):
    name = EXPECTED[0]
    declared = report.declared_parameters(NOTEBOOKS[name])
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({name: {"ns_accuracy": [8], "no_such_param": 3}}))
    with pytest.raises(report.ReportError, match="no_such_param") as info:
        report.check_params(name, report.load_params(bad)[name], declared, origin=bad.name)
    assert "ns_accuracy" in str(info.value)  # the message lists what is declared


def test_no_notebook_outputs_or_reports_tracked():
    root = report.NOTEBOOK_DIR.parent
    try:
        tracked = subprocess.run(
            ["git", "ls-files", "--", "notebooks", "reports"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    bad = [p for p in tracked if p.endswith(".ipynb") or p.startswith("reports/")]
    assert not bad, f"executed notebooks or reports are tracked by git: {bad}"
    ignored = subprocess.run(["git", "check-ignore", "-q", "reports/index.html"], cwd=root).returncode
    assert ignored == 0, "reports/ must be ignored by git"


def test_jupytext_config_keeps_sources_as_percent_scripts():
    root = report.NOTEBOOK_DIR.parent
    config = (root / "jupytext.toml").read_text()
    assert 'formats = "py:percent"' in config
    for path in NOTEBOOKS.values():
        assert "# %%" in Path(path).read_text(), f"{path.name} is not in py:percent format"


def test_saving_from_jupyterlab_leaves_the_sources_byte_identical(tmp_path):
    """open each notebook source through jupytext's contents manager (what
    JupyterLab's Jupytext Notebook viewer uses), save it, and compare with the tracked file."""
    import shutil

    pytest.importorskip("jupyter_server")
    from jupyter_server.services.contents.largefilemanager import LargeFileManager
    from jupytext.sync_contentsmanager import build_sync_jupytext_contents_manager_class

    root = Path(report.NOTEBOOK_DIR).resolve().parent
    shutil.copy(root / "jupytext.toml", tmp_path / "jupytext.toml")
    manager = build_sync_jupytext_contents_manager_class(LargeFileManager)(root_dir=str(tmp_path))
    changed = []
    for name, path in NOTEBOOKS.items():
        shutil.copy(path, tmp_path / path.name)
        model = manager.get(path.name, content=True, type="notebook")
        manager.save(model, path.name)
        if (tmp_path / path.name).read_bytes() != Path(path).read_bytes():
            changed.append(name)
    assert not changed, f"saving through jupytext rewrote {changed} (see notebook_metadata_filter in jupytext.toml)"


def test_make_lab_runs_as_root():
    """``make lab`` passes --allow-root when run by root (JupyterLab refuses root otherwise)."""
    root = Path(report.NOTEBOOK_DIR).resolve().parent
    out = subprocess.run(["make", "-n", "lab"], cwd=root, capture_output=True, text=True, check=True).stdout
    import os

    assert "jupyter lab" in out
    assert ("--allow-root" in out) == (os.geteuid() == 0)


@pytest.mark.parametrize("name", list(NOTEBOOKS))
def test_provenance_is_one_line_at_the_top_and_a_collapsed_table_at_the_end(name):
    """the reports open with a one-line summary, the full table closes them."""
    from osa_lab.reporting import provenance

    nb = jupytext.read(NOTEBOOKS[name])
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[-1].source.strip() == "nb.closing()", f"{name}: the last cell must show the provenance table"
    info = provenance.collect({"notebook": name, "depth": 12})
    line = provenance.summary_line(info)
    assert "\n" not in line and "git " in line and "depth=12" in line and "notebook" not in line
    html = provenance.details_html(info)
    assert html.startswith("<details><summary>") and "<details open" not in html and "git.commit" in html


def test_run_line_writes_parameters_plainly_not_as_python_reprs():
    from osa_lab.reporting import provenance

    info = provenance.collect({"notebook": "x", "presets": ["vit", "skipless-osa"], "data_dir": "", "lr": 0.001,
                               "experiment": "experiments/mnist1d_depth.yaml"})
    line = provenance.summary_line(info)
    assert "presets=vit, skipless-osa; data_dir=(none); lr=0.001; experiment=experiments/mnist1d_depth.yaml" in line
    assert "'" not in line.split(" · ")[-1] and "[" not in line


@pytest.mark.parametrize("name", EXPECTED)
def test_prose_names_no_issue_numbers_and_no_parameter_names_as_values(name):
    """Report text is for readers: no tracker references, and no markdown sentence that puts a
    parameter's name where its value belongs ("N = `tokens`", "α = contrast_alpha"); such
    numbers are written by osa_lab.reporting.texts from the run's values."""
    import re

    path = NOTEBOOKS[name]
    text = path.read_text()
    assert not re.search(r"\bissues? \d+", text, re.IGNORECASE), name
    params = set(report.declared_parameters(path))
    nb = jupytext.read(path)
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for p in params:
            assert not re.search(rf"=\s*`?{re.escape(p)}\b`?", cell.source), (name, p, cell.source[:200])
            assert not re.search(rf"`{re.escape(p)}` (seeds|tokens|layers|epochs)\b", cell.source), (name, p)
