"""Old import paths and renamed names keep working after the regrouping (docs/architecture.md)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import osa_lab
from osa_lab.compat import MOVED


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_old_module_path_is_the_moved_module_itself(old, new):
    module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__name__ == new and module.__spec__.name == new  # the real spec is kept
    assert getattr(osa_lab, old.split(".")[1]) is importlib.import_module(f"osa_lab.{old.split('.')[1]}")


def test_monkeypatching_the_old_path_patches_the_code_that_runs(monkeypatch):
    import osa_lab.analysis as old
    from osa_lab.studies import depth

    monkeypatch.setattr(old, "MIN_TOKENS", 5)
    assert depth.MIN_TOKENS == 5


def test_from_old_package_import_renamed_submodule():
    from osa_lab.kernels import triton_osa
    from osa_lab.ops.triton import kernels

    assert triton_osa is kernels


@pytest.mark.parametrize(
    "module, old, new",
    [
        ("osa_lab", "METHODS", "OSA_METHODS"),
        ("osa_lab", "skew_expm", "reference_skew_exp"),
        ("osa_lab", "skew_matrix_exp", "core_skew_exp"),
        ("osa_lab.ops.expm", "matrix_exp", "dense_exp"),
        ("osa_lab.ops.functional", "METHODS", "OSA_METHODS"),
        ("osa_lab.studies.jacobian", "METHODS", "JACOBIAN_METHODS"),
        ("osa_lab.studies.depth", "summarize", "summarize_over_seeds"),
        ("osa_lab.studies.training", "summarise", "summarize_runs"),
        ("osa_lab.studies.training", "build_model", "build_training_model"),
    ],
)
def test_a_renamed_name_works_for_one_release_and_says_where_it_went(module, old, new):
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=rf"{old} was renamed .*{new}"):
        value = getattr(mod, old)
    assert value is getattr(mod, new)


def test_new_names_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from osa_lab import OSA_METHODS, core_skew_exp, reference_skew_exp  # noqa: F401
        from osa_lab.studies.jacobian import JACOBIAN_METHODS  # noqa: F401


def test_python_dash_m_runs_an_old_module_path(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "osa_lab.report", "--help"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "--no-progress" in proc.stdout
