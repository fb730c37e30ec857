"""Packaging: environment.yml agrees with pyproject.toml, the README example runs, CI runs the README's tests."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _env() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def _pip_section(env: dict) -> list[str]:
    for dep in env["dependencies"]:
        if isinstance(dep, dict) and "pip" in dep:
            return dep["pip"]
    raise AssertionError("environment.yml has no pip section")


def test_environment_python_satisfies_requires_python():
    requires = SpecifierSet(_pyproject()["project"]["requires-python"])
    pythons = [d for d in _env()["dependencies"] if isinstance(d, str) and d.startswith("python")]
    assert len(pythons) == 1
    version = pythons[0].split("=", 1)[1]
    assert requires.contains(version + ".0"), (version, str(requires))


def test_environment_installs_the_package_with_all_extras():
    pip = _pip_section(_env())
    assert "-e .[all]" in pip
    extras = _pyproject()["project"]["optional-dependencies"]
    assert "all" in extras
    named = set().union(*(Requirement(e).extras for e in extras["all"]))
    assert named == set(extras) - {"all"} - NO_DEPS_EXTRAS, "the 'all' extra must include every other extra"


#: Extras that scripts/setup.sh installs with ``pip install --no-deps`` instead of through ``all``:
#: timm requires torchvision, which pip would resolve to a build (with its own torch) that does not
#: import beside the project's CPU torch.
NO_DEPS_EXTRAS = {"timm"}


def test_setup_installs_the_no_deps_extras_with_the_pyproject_specifiers():
    extras = _pyproject()["project"]["optional-dependencies"]
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    for extra in NO_DEPS_EXTRAS:
        assert extra in extras, f"pyproject.toml has no {extra!r} extra"
        for req in extras[extra]:
            line = f'--no-deps "{req}"'
            assert line in setup, f"scripts/setup.sh must install {req!r} of the {extra!r} extra with {line}"


def test_environment_torch_pin_satisfies_the_pyproject_range_and_setup_script():
    pins = [Requirement(p) for p in _pip_section(_env()) if p.startswith("torch")]
    assert len(pins) == 1
    (pinned,) = [s.version for s in pins[0].specifier]
    deps = {Requirement(d).name: Requirement(d) for d in _pyproject()["project"]["dependencies"]}
    assert deps["torch"].specifier.contains(pinned)
    assert deps["torch"].specifier.contains("2.11.0"), "the GPU machine runs torch 2.11"
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert f"torch=={pinned}" in setup, "scripts/setup.sh and environment.yml must pin the same torch"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make report" in readme
    # the README's command, with at most environment settings before it
    assert re.search(r"^(?:[A-Z_]+=\S+ )*make test$", ci, flags=re.M)


def test_ci_lets_the_tests_check_the_reports_it_made_first():
    """CI executes the quick reports once, then the report-page tests read those (``OSA_LAB_REPORTS``)."""
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    test_line = next(i for i, line in enumerate(lines) if line.endswith("make test"))
    assert lines[test_line].startswith('OSA_LAB_REPORTS="$PWD/reports" ')
    assert lines.index("make report-quick") < test_line
    fixture = (ROOT / "tests" / "reporting" / "test_report_pages.py").read_text()
    assert 'os.environ.get("OSA_LAB_REPORTS")' in fixture
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^report-quick: setup\n\t\.venv/bin/osa-lab report --quick --jobs 2$", makefile, flags=re.M)


def _readme_python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_example_runs():
    blocks = _readme_python_blocks()
    assert blocks, "README has no python example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)  # noqa: S102
    y, out = namespace["y"], namespace["out"]
    assert tuple(y.shape) == (2, 8, 4096, 64)
    assert tuple(out.shape) == (8, 197, 256)
    v = namespace["v"]
    # the example's output is orthogonal attention applied to v: column norms are kept
    assert (y.norm(dim=-2) - v.norm(dim=-2)).abs().max() < 1e-3


def test_nothing_cites_notes_outside_the_repository():
    """Code, notebooks and docs cite docs/design.md, never design notes a clone does not have."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    suffixes = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg"}
    offenders = []
    for name in tracked.split():
        path = ROOT / name
        if path.suffix not in suffixes or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for pattern in ("DESIGN.md", "../shared"):
            if pattern in text and path.name != "test_packaging.py":
                offenders.append(f"{name}: {pattern}")
    assert not offenders, offenders
    assert (ROOT / "docs" / "design.md").is_file()


# ---- the lean core and the lab extra ----------------------------------------------------------

#: import name → distribution name, where they differ
_DISTRIBUTION = {"yaml": "pyyaml", "sklearn": "scikit-learn"}


def test_the_core_needs_only_torch_and_numpy():
    deps = sorted(Requirement(d).name for d in _pyproject()["project"]["dependencies"])
    assert deps == ["numpy", "torch"]


def test_the_lab_extra_installs_what_the_lab_wings_check_for():
    from osa_lab.extras import LAB_IMPORTS

    lab = {Requirement(r).name for r in _pyproject()["project"]["optional-dependencies"]["lab"]}
    assert {_DISTRIBUTION.get(name, name) for name in LAB_IMPORTS} <= lab
    # the laboratory's data sets, grids, reports and dashboard come with it too
    assert {"mnist1d", "scikit-learn", "dask", "panel", "papermill"} <= lab


def test_the_core_is_type_checked_in_the_readme_test_command():
    """`make test` runs mypy over the core; the dev extra (and so environment.yml's `.[all]`) installs it."""
    project = _pyproject()
    assert project["tool"]["mypy"]["files"] == ["osa_lab/ops", "osa_lab/nn"]
    assert "mypy" in {Requirement(r).name for r in project["project"]["optional-dependencies"]["dev"]}
    recipe = (ROOT / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert ".venv/bin/mypy" in recipe and recipe.index(".venv/bin/mypy") < recipe.index("pytest"), recipe


def test_ci_checks_the_lean_core_and_stops_when_it_fails():
    """The lean-core check runs beside the set-up and the reports; CI waits for it before the tests,
    stops there if it failed, and stops every job still running when it exits."""
    ci = (ROOT / ".ci" / "run").read_text()
    lines = [line.strip() for line in ci.splitlines()]
    started = lines.index("background lean-core bash scripts/check_lean_core.sh")
    test_line = next(i for i, line in enumerate(lines) if line.endswith("make test"))
    assert started < lines.index("make report-quick") < lines.index("finish lean-core") < test_line
    background = ci.split("background() {", 1)[1].split("\n}", 1)[0]
    assert 'setsid --wait "$@"' in background and "pids[$name]=$!" in background, background
    finish = ci.split("finish() {", 1)[1].split("\n}", 1)[0]
    assert 'wait "${pids[$1]}" || status=$?' in finish and "exit 1" in finish, finish
    assert "trap stop_jobs EXIT" in lines and 'kill -- "-$pid"' in ci
    script = (ROOT / "scripts" / "check_lean_core.sh").read_text()
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    (pin,) = re.findall(r"TORCH_SPEC:-(torch==[\d.]+)", setup)
    assert f"TORCH_SPEC:-{pin}" in script, "the lean-core check and setup.sh must pin the same torch"
    for needed in ("OrthogonalSelfAttention", "backward", "matplotlib", "pandas", "dask", 'osa_lab[lab]'):
        assert needed in script, needed


_BLOCK_LAB = """
import sys
for name in ("pandas", "scipy", "matplotlib", "holoviews", "bokeh", "panel", "param", "tqdm", "yaml",
             "dask", "distributed", "sklearn", "mnist1d", "papermill"):
    sys.modules[name] = None  # as if not installed: import and find_spec both fail
"""


def _python(code: str, tmp_path) -> subprocess.CompletedProcess:
    import os
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300)  # fmt: skip


def test_the_core_imports_and_runs_without_the_lab(tmp_path):
    proc = _python(_BLOCK_LAB + """
import torch
import osa_lab
y = osa_lab.osa(torch.randn(5, 2), torch.randn(5, 2), torch.randn(5, 3))
osa_lab.OrthogonalSelfAttention(8, 2)(torch.randn(1, 5, 8)).sum().backward()
osa_lab.build_model(osa_lab.get_preset("pure-osa", depth=2, dim=8, tokens=5))
print("core ok", tuple(y.shape))
""", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "core ok (5, 3)" in proc.stdout


def test_every_core_module_imports_without_the_lab(tmp_path):
    """Each module of the core wings (osa_lab.ops, osa_lab.nn) imports with the lab packages absent."""
    proc = _python(_BLOCK_LAB + """
import importlib
import pkgutil
import osa_lab.nn
import osa_lab.ops
names = [m.name for pkg in (osa_lab.ops, osa_lab.nn) for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
for name in names:
    importlib.import_module(name)
print("imported", len(names))
""", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) > 20, proc.stdout


@pytest.mark.parametrize(
    "module",
    ["osa_lab.studies", "osa_lab.studies.depth", "osa_lab.plots.depth", "osa_lab.reporting.runner",
     "osa_lab.benchmarking.runner", "osa_lab.dashboard", "osa_lab.integrations.timm.analysis"],
)  # fmt: skip
def test_a_lab_module_without_the_extra_names_it(module, tmp_path):
    proc = _python(_BLOCK_LAB + f"""
import importlib
from osa_lab.errors import OptionalDependencyError
try:
    importlib.import_module({module!r})
except OptionalDependencyError as exc:
    print("refused:", exc)
""", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert 'refused:' in proc.stdout and 'pip install "osa_lab[lab]"' in proc.stdout, proc.stdout


def test_a_lab_command_without_the_extra_is_one_line_and_exit_2(tmp_path):
    proc = _python(_BLOCK_LAB + """
import sys
from osa_lab import cli
sys.exit(cli.main(["sweep", "--depth", "2"]))
""", tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("osa-lab sweep: error:") and "osa_lab[lab]" in lines[0]
