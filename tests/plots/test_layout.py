"""Report figures as the reports save them: at least 600 px wide, legends outside the data.

:func:`osa_lab.plots.layout.layout_problems` renders a figure with matplotlib at the reports'
resolution and lists what is wrong with its layout; these tests run it on the figures the
reports draw (report 05 on the committed study results) and check that it can fail.
"""

from __future__ import annotations

from pathlib import Path

import holoviews as hv
import pandas as pd
import pytest

from osa_lab.plots import depth as D
from osa_lab.plots import study, training
from osa_lab.plots.layout import REPORT_DPI, layout_problems
from osa_lab.plots.style import stacked, wide_figure
from osa_lab.reporting import kernel_setup
from tests.plots.test_plots import FOUR, _jacobian, _metrics, _spectra, _training_metrics

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "mnist1d-depth"


def test_the_checker_uses_the_reports_resolution():
    assert REPORT_DPI == kernel_setup.DPI


def test_the_checker_finds_a_narrow_figure_and_a_legend_over_the_data():
    curves = hv.Overlay([hv.Curve([(0, 0), (1, 1)], label="a"), hv.Curve([(0, 1), (1, 0)], label="b")])
    narrow_inside = curves.opts(clone=True).opts(fig_inches=(4, 3), legend_position="top_right", backend="matplotlib")
    problems = layout_problems(narrow_inside)
    assert any("narrower than 600 px" in p for p in problems), problems
    assert any("overlaps the axes" in p for p in problems), problems
    assert layout_problems(wide_figure(curves.opts(clone=True))) == []


@pytest.mark.skipif(not RESULTS.is_dir(), reason="the committed depth-study results are not in this checkout")
def test_report_05_figures_are_wide_with_legends_outside_the_data():
    tables = {name: pd.read_csv(RESULTS / f"{name}.csv") for name in ("summary", "runs", "curves", "tuning")}
    figures = {"accuracy against depth": study.accuracy_vs_depth(tables["summary"], tables["runs"], chance=10.0)}
    for d in sorted(tables["curves"]["depth"].unique()):
        figures[f"training loss at depth {d}"] = study.loss_curves(tables["curves"], int(d))
    for d in sorted(tables["tuning"]["depth"].unique()):
        figures[f"tuning at depth {d}"] = study.tuning_curves(tables["tuning"], int(d))
    for y in ("steps_to_90", "test_accuracy"):
        figures[f"κ against {y}"] = study.kappa_vs_trainability(tables["runs"], y)
    figures["training loss by depth"] = study.loss_curves_by_depth(tables["curves"])
    for name, fig in figures.items():
        assert layout_problems(fig) == [], name


def test_rank_and_conditioning_figures_are_wide_with_legends_outside_the_data():
    figures = {
        "metric against depth": wide_figure(D.metric_vs_depth(_metrics(), "relative_residual")),
        "κ against depth": wide_figure(D.kappa_vs_depth(_jacobian(presets=FOUR))),
        "κ against a parameter": D.kappa_vs_parameter(_jacobian(presets=FOUR), "layer"),
        "κ panels stacked": stacked([D.kappa_vs_parameter(_jacobian(presets=FOUR), "layer", title=f"panel {i}")
                                     for i in range(2)]),
        "spectra lines": D.spectra_lines(_spectra(presets=FOUR)).cols(2).opts(
            hspace=0.5, vspace=0.35, backend="matplotlib"),
    }  # fmt: skip
    for name, fig in figures.items():
        assert layout_problems(fig) == [], name


def test_training_figures_are_wide_with_legends_outside_the_data():
    m = _training_metrics(presets=("vit", "skipless-osa", "skipless-ssa"))
    accuracy = m[m["metric"] == "test_accuracy"]
    m = pd.concat([m, accuracy.assign(metric="train_loss", value=2.0 - accuracy["value"])], ignore_index=True)
    figures = {
        "learning panel": training.learning_panel(m, ("train_loss", "test_accuracy")),
        "diagnostics over training": training.diagnostics_over_training(m, "stable_rank"),
        "depth profiles": training.depth_profiles(m, "stable_rank"),
        "mixing profiles": training.mixing_profiles(m, "mixing_ratio"),
        "ablation": training.ablation_bars(m),
        "summary bars": training.summary_bars(pd.DataFrame({
            "preset": ["vit", "skipless-osa"], "test_accuracy_mean": [0.8, 0.7], "test_accuracy_std": [0.01, 0.02]})),
        "paired differences": training.paired_differences_plot(pd.DataFrame({
            "preset": ["vit", "skipless-ssa"], "diff_mean": [-0.01, 0.1], "ci_low": [-0.02, 0.05], "ci_high": [0.0, 0.15]})),
    }  # fmt: skip
    for name, fig in figures.items():
        assert layout_problems(fig) == [], name
