"""The reports' one table formatter (osa_lab.reporting.tables) and the depth study's answer table."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from osa_lab.errors import OSAInputError
from osa_lab.reporting import depth_answer
from osa_lab.reporting.tables import (
    KAPPA_BEYOND_TEXT,
    MISSING,
    Column,
    format_table,
    interval_text,
    kappa_text,
    percent_text,
    table_html,
    value_text,
)
from osa_lab.studies.summaries import KAPPA_RESOLVED, number

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------------------
# κ and numbers
# --------------------------------------------------------------------------------------------


def test_kappa_beyond_float64_is_never_a_number():
    assert KAPPA_BEYOND_TEXT == "> 4.5e15"
    for k in (KAPPA_RESOLVED, 5.59e20, 5.35e111, 1.13e210, 6.99e162, math.inf, np.float64(1e300)):
        assert kappa_text(k) == "> 4.5e15", k
    assert kappa_text(np.nextafter(KAPPA_RESOLVED, 0)) == "4.5e15"  # resolved, just below the ceiling
    assert kappa_text(2.25e7) == "2.25e7" and kappa_text(38.1) == "38.1" and kappa_text(1.0) == "1"
    assert kappa_text(float("nan")) == MISSING and kappa_text(None) == MISSING


@given(st.floats(min_value=KAPPA_RESOLVED, allow_nan=False))
def test_kappa_at_or_beyond_the_ceiling_always_reads_as_the_ceiling(k):
    assert kappa_text(k) == KAPPA_BEYOND_TEXT


@given(st.floats(min_value=1.0, max_value=KAPPA_RESOLVED, exclude_max=True))
def test_resolved_kappa_reads_back_within_its_three_digits(k):
    text = kappa_text(k)
    assert not text.startswith(">")
    assert abs(float(text) - k) <= 0.0051 * k  # three significant digits


@given(st.floats(min_value=1e-7, max_value=10.0))
def test_a_learning_rate_reads_back_within_three_significant_digits(lr):
    text = number(lr)
    digits = text.split("e")[0].replace(".", "").lstrip("0")
    assert len(digits) <= 3, text
    assert abs(float(text) - lr) <= 0.0051 * lr


def test_number_writes_small_learning_rates_in_exponent_form():
    assert number(1 / 3000) == "3.33e-4" and number(0.000333333) == "3.33e-4"
    assert number(0.001) == "0.001" and number(1 / 3) == "0.333" and number(1.0) == "1"


def test_percent_interval_and_values():
    assert percent_text(0.8805) == "88.0" or percent_text(0.8805) == "88.1"  # rounding of a binary fraction
    assert percent_text(0.869) == "86.9" and percent_text(np.nan) == MISSING
    assert interval_text(0.869, 0.864, 0.873) == "86.9 [86.4, 87.3]"
    assert interval_text(0.869, np.nan, np.nan) == "86.9"
    assert value_text(0.000333333) == "3.33e-4"  # not 0.000333333
    assert value_text(0.29485) == "0.295"  # not 2.9485e-01
    assert value_text(np.int64(4)) == "4" and value_text(4.0) == "4" and value_text(True) == "yes"
    assert value_text("skipless-osa") == "skipless-osa" and value_text(None) == MISSING


# --------------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------------


def test_format_table_human_headers_units_no_index_and_kappa():
    df = pd.DataFrame({"preset": ["vit", "skipless-ssa"], "test_accuracy_mean": [0.88, 0.739],
                       "kappa_init_median": [38.1, 5.35e111], "lr": [0.01, 0.000333333]})  # fmt: skip
    cols = {"preset": Column("preset", "text"), "test_accuracy_mean": Column("test accuracy %", "percent"),
            "kappa_init_median": Column("κ at init", "kappa"), "lr": "learning rate"}  # fmt: skip
    table = format_table(df, cols)
    assert list(table.columns) == ["preset", "test accuracy %", "κ at init", "learning rate"]
    assert table.to_dict("list") == {"preset": ["vit", "skipless-ssa"], "test accuracy %": ["88.0", "73.9"],
                                     "κ at init": ["38.1", "> 4.5e15"], "learning rate": ["0.01", "3.33e-4"]}  # fmt: skip
    html = table_html(table)
    assert "&gt; 4.5e15" in html and "5.35e" not in html and "111" not in html
    assert "<th></th>" not in html and "<th>0</th>" not in html  # no index column
    assert html.count("<th>") == 4


def test_format_table_without_columns_names_kappa_columns_by_name_and_keeps_a_named_index():
    wide = pd.DataFrame({"kappa_last_layer": [1.13e210, 12.0]}, index=pd.Index(["a", "b"], name="preset"))
    table = format_table(wide)
    assert list(table.columns) == ["preset", "κ last layer"]
    assert table["κ last layer"].tolist() == ["> 4.5e15", "12"]
    plain = format_table(pd.DataFrame({"steps_to_90": [1908.0, np.nan]}))
    assert list(plain.columns) == ["steps to 90"] and plain["steps to 90"].tolist() == ["1908", MISSING]


def test_format_table_cells_are_escaped_in_html():
    html = table_html(format_table(pd.DataFrame({"name": ["<b>x</b>"]}), {"name": Column("name", "text")}))
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html


def test_format_table_bad_input_names_the_problem():
    df = pd.DataFrame({"a": [1]})
    with pytest.raises(OSAInputError, match=r"lacks column\(s\) \['b'\]"):
        format_table(df, {"b": "B"})
    with pytest.raises(OSAInputError, match="unknown column format 'percentage'"):
        format_table(df, {"a": Column("A", "percentage")})
    with pytest.raises(OSAInputError, match="needs a pandas DataFrame"):
        format_table([1, 2])  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# the depth study's answer
# --------------------------------------------------------------------------------------------


def _study() -> tuple[pd.DataFrame, pd.DataFrame]:
    summary = pd.DataFrame({
        "preset": ["vit", "vit", "skipless-osa", "skipless-osa"], "depth": [4, 8, 4, 8],
        "finished": [2, 4, 2, 4], "test_accuracy_mean": [0.88, 0.883, 0.869, 0.663],
        "ci_low": [0.872, 0.874, 0.864, 0.068], "ci_high": [0.888, 0.892, 0.873, 1.258],
    })  # fmt: skip
    runs = pd.DataFrame({
        "preset": ["vit"] * 6 + ["skipless-osa"] * 6, "depth": [4, 4, 8, 8, 8, 8] * 2, "seed": [0, 1, 0, 1, 2, 3] * 2,
        "status": ["ok"] * 11 + ["failed"],
        "failure": [""] * 11 + ["chance: final training accuracy 10.2 % is within 5 points of chance (10 %)"],
        "test_accuracy": [0.88, 0.88, 0.886, 0.876, 0.882, 0.889, 0.87, 0.868, 0.848, 0.867, 0.834, 0.102],
    })  # fmt: skip
    return summary, runs


def test_the_failed_runs_are_the_studys_own_classification():
    _, runs = _study()
    failed = depth_answer.failed_runs(runs)
    assert failed[["preset", "depth", "seed"]].values.tolist() == [["skipless-osa", 8, 3]]
    assert failed["why"].iloc[0].startswith("chance: final training accuracy 10.2 %")
    runs.loc[0, "status"] = "diverged"  # a diverged run without a reason is named by its status
    assert depth_answer.failed_runs(runs)["why"].tolist()[0] == "diverged"
    # a run at chance that the study counted ok is not re-judged here: one rule, the study's
    runs.loc[11, ["status", "failure"]] = ["ok", ""]
    assert depth_answer.failed_runs(runs)["seed"].tolist() == [0]


def test_answer_table_is_preset_by_depth_in_percent_with_intervals_and_failures():
    summary, runs = _study()
    table = depth_answer.answer_table(depth_answer.answer_data(summary, runs))
    assert list(table.columns) == ["preset", "depth 4: test accuracy % [95 % CI] (2 seeds)",
                                   "depth 8: test accuracy % [95 % CI] (4 seeds)"]  # fmt: skip
    assert table.iloc[0].tolist()[1:] == ["88.0 [87.2, 88.8]", "88.3 [87.4, 89.2]"]
    # the interval past 100 % is cut and marked; the failed seed is counted
    assert table.iloc[1, 2] == "66.3 [6.8, 100.0]‡ · 1 of 4 failed"
    finding = depth_answer.answer_finding(depth_answer.answer_data(summary, runs))
    assert finding == "test accuracy % at depth 4 / 8: vit 88.0 / 88.3; skipless-osa 86.9 / 66.3 (1 failed)."


def test_the_detail_table_says_how_each_cells_setting_was_chosen():
    """The committed depth study chose every setting by the tie rule; a fallback reads as such."""
    summary = pd.read_csv(ROOT / "docs" / "results" / "mnist1d-depth" / "summary.csv")
    summary.loc[0, "chosen_by"] = "fewest failures"
    shown = format_table(summary, {c: v for c, v in depth_answer.DETAIL_COLUMNS.items() if c in summary})
    assert shown["setting chosen by"].iloc[0] == "fewest failures"
    assert set(shown["setting chosen by"].iloc[1:]) == {"tie rule"}


def test_answer_of_the_committed_study_names_the_seed_at_chance():
    folder = ROOT / "docs" / "results" / "mnist1d-depth"
    runs = pd.read_csv(folder / "runs.csv")
    text = depth_answer.failures_text(runs)
    assert "`skipless-osa` depth 8 seed 3 (chance: final training accuracy 10.2 % is within 5 points" in text
    assert "test accuracy 10.2 %)" in text


def test_claims_text_gives_verdict_and_difference_in_points():
    claims = pd.DataFrame({"claim": ["skipless OSA is better than skipless softmax attention"], "depth": [4], "n": [10],
                           "diff_mean": [0.1297], "ci_low": [0.1202], "ci_high": [0.1392], "ci_level": [0.95],
                           "verdict": ["shown"]})  # fmt: skip
    assert depth_answer.claims_text(claims) == ("- depth 4: skipless OSA is better than skipless softmax attention: "
                                                "**shown** (+13.0 points, 95 % CI [+12.0, +13.9], 10 seeds)")


def test_claims_text_says_worse_where_the_two_sided_test_does():
    claims = pd.DataFrame({"claim": ["skipless OSA is comparable to the skip-connected ViT"], "depth": [4], "n": [10],
                           "diff_mean": [-0.0113], "ci_low": [-0.0175], "ci_high": [-0.0051], "ci_level": [0.9],
                           "verdict": ["inconclusive"], "direction": ["worse"], "p_two_sided_holm": [0.0341]})  # fmt: skip
    assert depth_answer.claims_text(claims).endswith("; two-sided: `skipless-osa` is **worse** (Holm p = 0.034)")


def test_readme_answer_table_agrees_with_the_committed_results():
    """The README's answer is copied from the study: each mean there is the study's, to the digit."""
    folder = ROOT / "docs" / "results" / "mnist1d-depth"
    summary = pd.read_csv(folder / "summary.csv")
    runs = pd.read_csv(folder / "runs.csv")
    data = depth_answer.answer_data(summary, runs)
    readme = (ROOT / "README.md").read_text()
    rows = {"`vit`": "vit", "**skipless OSA**": "skipless-osa", "`ssa-cutting-skip`": "ssa-cutting-skip",
            "skipless SSA": "skipless-ssa"}  # fmt: skip
    for label, preset in rows.items():
        line = next(ln for ln in readme.splitlines() if ln.startswith(f"| {label}"))
        means = [percent_text(m) for m in data[data["preset"] == preset].sort_values("depth")["mean"]]
        shown = re.findall(r"\|\s*\**(\d+\.\d)", line)
        assert shown == means, (preset, shown, means)
