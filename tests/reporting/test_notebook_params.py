"""The report notebooks 01–03 declare bounds on their numeric parameters (``# ≥ 1`` comments,
read by :func:`osa_lab.reporting.runner.declared_bounds`): ``osa-lab report`` refuses a value outside
them with one line and exit code 2 before running anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from osa_lab.reporting import runner as report
from tests.helpers import assert_cli_user_error

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
#: every numeric parameter of notebooks 01–03 declares a lower bound
BOUNDED = {
    "01_osa_matrix_exponential": {"ns_accuracy", "alphas", "rank", "value_dim", "seeds", "orthogonality_max_n",
                                  "ns_timing", "dense_max_n", "sdpa_max_n", "batch_heads", "head_dim", "repeat",
                                  "fit_points"},
    "02_rank_collapse": {"depth", "tokens", "dim", "seeds"},
    "03_jacobian_conditioning": {"alphas", "alpha_tokens", "alpha_dim", "grid_tokens", "grid_dims", "contrast_alpha",
                                 "layer_seeds", "depth", "tokens", "dim", "depth_seeds"},
}


@pytest.mark.parametrize("name", sorted(BOUNDED))
def test_numeric_parameters_declare_bounds_that_their_defaults_meet(name):
    declared = report.declared_parameters(NOTEBOOKS / f"{name}.py")
    bounded = {k for k, v in declared.items() if report.declared_bounds(v)}
    assert bounded == BOUNDED[name]
    defaults = {k: eval(v["default"]) for k, v in declared.items()}  # noqa: S307 - literals from our notebooks
    report.check_params(name, defaults, declared)  # the defaults are within their own bounds


@pytest.mark.parametrize(("name", "key", "value", "bound"), [
    ("02_rank_collapse", "depth", "-3", "≥ 1"),
    ("03_jacobian_conditioning", "depth", "-3", "≥ 1"),
    ("03_jacobian_conditioning", "alphas", "[0.1, -0.5]", "≥ 0"),
    ("01_osa_matrix_exponential", "repeat", "0", "≥ 1"),
])  # fmt: skip
def test_report_refuses_a_value_outside_the_notebook_bounds_in_one_line_exit_2(tmp_path, name, key, value, bound):
    params = tmp_path / "p.yaml"
    params.write_text(f"{name}:\n  {key}: {value}\n")
    out = tmp_path / "out"
    assert_cli_user_error(["report", "--notebooks", str(NOTEBOOKS), "--only", name[:2], "--output", str(out),
                           "--params", str(params), "--no-progress"],
                          rf"parameter {key} must be {bound} \(declared by the notebook", watch=[tmp_path])  # fmt: skip
    assert not out.exists() or not any(out.iterdir())


def test_depth_minus_3_in_a_terminal_is_one_line_and_exit_2(tmp_path):
    """What a user sees: ``osa-lab report --only 02 --params p.yaml`` with ``depth: -3``."""
    from tests.helpers import assert_cli_user_error_subprocess

    params = tmp_path / "p.yaml"
    params.write_text("02_rank_collapse:\n  depth: -3\n")
    line = assert_cli_user_error_subprocess(
        ["report", "--notebooks", str(NOTEBOOKS), "--only", "02", "--output", str(tmp_path / "out"), "--params",
         str(params), "--no-progress"], r"parameter depth must be ≥ 1", watch=[tmp_path])  # fmt: skip
    assert "got -3" in line
