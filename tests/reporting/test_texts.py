"""The report sentences (osa_lab.reporting.texts) are written from the tables they describe:
a changed number or parameter changes the sentence, and no sentence prints a variable name."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from osa_lab.reporting import texts
from osa_lab.studies import expm_accuracy, summaries


def _timings(seconds: dict[str, list[float]], spread: float = 1.05) -> pd.DataFrame:
    ns = [256, 512, 1024]
    rows = []
    for method, values in seconds.items():
        for n, s in zip(ns, values, strict=True):
            rows.append(dict(method=method, n=n, seconds=s, seconds_min=s / spread, seconds_max=s * spread, repeats=5,
                             threads=1))
    return pd.DataFrame(rows)


def test_timing_text_states_the_fitted_slopes_and_flags_a_fit_it_cannot_trust():
    clean = _timings({"dense": [1e-3, 8e-3, 6.4e-2], "lowrank": [1e-4, 2e-4, 4e-4], "sdpa": [1e-4, 4e-4, 1.6e-3]})
    slopes = expm_accuracy.fit_slopes(clean)
    assert slopes["trusted"].all(), slopes
    text = texts.timing_text(slopes, clean)
    assert "slope **3.00**" in text and "slope **1.00**" in text and "slope **2.00**" in text
    assert "not a trustworthy fit" not in text and "median of 5 timed runs" in text
    # the report-01 symptom: a noisy SDPA point (0.06 s at N = 128, 0.0005 s at N = 256)
    noisy = _timings({"dense": [1e-3, 3e-3, 5.2e-3], "lowrank": [1e-4, 2e-4, 4e-4], "sdpa": [6e-2, 5e-4, 1.6e-3]},
                     spread=1.2)
    noisy.loc[(noisy["method"] == "sdpa") & (noisy["n"] == 256), "seconds_max"] = 0.2
    slopes = expm_accuracy.fit_slopes(noisy).set_index("method")
    assert not slopes.loc["sdpa", "trusted"] and not slopes.loc["dense", "trusted"]
    text = texts.timing_text(slopes.reset_index(), noisy)
    assert f"slope **{slopes.loc['dense', 'slope']:.2f}** (expected ≈ 3)" in text
    assert text.count("not a trustworthy fit") == 2 and "repeats of one point differ" in text
    assert "Noisiest point: `sdpa` at N = 256" in text
    assert "untrustworthy fit" in texts.timing_finding(slopes.reset_index())


def test_fit_slopes_flags_too_few_points():
    one = _timings({"lowrank": [1e-4, 2e-4, 4e-4]}).head(2)
    row = expm_accuracy.fit_slopes(one).iloc[0]
    assert not row["trusted"] and "only 2 points" in row["doubt"]


def _metrics(presets: dict[str, tuple[float, float]], depth: int = 4, seeds: int = 2) -> pd.DataFrame:
    """Per preset (stable rank at the input, at the last layer), decaying geometrically."""
    rows = []
    for preset, (first, last) in presets.items():
        for seed in range(seeds):
            for layer in range(depth + 1):
                t = layer / depth
                sr = first * (last / first) ** t
                rows += [dict(preset=preset, depth=depth, seed=seed, layer=layer, site="block", metric="stable_rank",
                              value=sr),
                         dict(preset=preset, depth=depth, seed=seed, layer=layer, site="block",
                              metric="effective_rank", value=3 * sr),
                         dict(preset=preset, depth=depth, seed=seed, layer=layer, site="block",
                              metric="relative_residual", value=(sr - 1) / (first - 1) if first > 1 else 1.0)]
    return pd.DataFrame(rows)


def test_rank_collapse_text_follows_the_table_and_names_hidden_curves():
    m = _metrics({"pure-ssa": (10.0, 1.0), "pure-osa": (10.0, 10.0), "skipless-osa": (10.0, 1.05),
                  "ssa-value-skipinit": (10.0, 1.05)})
    text = texts.rank_collapse_text(m)
    assert "**Collapsed to (nearly) rank one" in text
    collapsed = text.split("**Collapsed")[1].split("\n")[0]
    assert "`pure-ssa`" in collapsed and "`pure-osa`" not in collapsed
    # stable rank 1.05 with effective rank 3.15: one dominant direction, not rank one
    assert "`skipless-osa`" not in collapsed and "`skipless-osa`" in text.split("**Lost rank")[1].split("\n")[0]
    assert "stable rank 10 → 1.05" in text and "at layer 4" in text
    hidden = texts.hidden_curves_text(m, ["stable_rank"])
    assert "`skipless-osa` lies under `ssa-value-skipinit`" in hidden
    # a changed result changes the sentence
    changed = texts.rank_collapse_text(_metrics({"pure-ssa": (10.0, 1.0), "skipless-osa": (10.0, 7.0)}, depth=6))
    assert "stable rank 10 → 7" in changed and "at layer 6" in changed
    assert "`skipless-osa`" in changed.split("**Kept")[1].split("\n")[0]
    assert texts.hidden_curves_text(_metrics({"a": (10.0, 1.0), "b": (10.0, 5.0)}), ["stable_rank"]) == ""
    # on a log axis over 16 decades, 1.0 and 0.9 are drawn on top of each other
    logm = pd.DataFrame([dict(preset=p, layer=layer, metric="relative_residual", value=v, seed=0, site="block")
                      for p, vals in (("pure-ssa", [1, 1e-8, 1e-16]), ("pure-osa", [1, 1, 1]), ("vit", [1, 0.9, 0.9]))
                      for layer, v in enumerate(vals)])
    assert texts.hidden_curves(logm, "relative_residual") == [("pure-osa", "vit")]
    assert texts.hidden_curves(logm, "relative_residual", logy=False) == []  # a linear axis 0…1 shows the gap
    assert texts.hidden_curves(logm[logm["preset"] != "pure-ssa"], "relative_residual") == []  # linear 0.9…1
    assert "pure-ssa 1" in texts.collapse_finding(m) and "after layer 4" in texts.collapse_finding(m)


def _by_alpha(kappas: dict[float, float], derived: float, tokens: int = 16, dim: int = 16) -> pd.DataFrame:
    rows = [dict(alpha=a, alpha_source="given", tokens=tokens, dim=dim, seed=s, kappa=k) for a, k in kappas.items()
            for s in range(3)]
    rows += [dict(alpha=0.004, alpha_source="derived", tokens=tokens, dim=dim, seed=s, kappa=derived) for s in range(3)]
    return pd.DataFrame(rows)


def test_osa_layer_text_states_this_runs_kappa_not_quoted_values():
    text = texts.osa_layer_text(_by_alpha({0.0: 1.0, 0.1: 9.6, 0.3: 63.0, 1.0: 651.0}, 1.02))
    assert "At N = 16, d = 16 (3 seeds" in text
    assert "9.6 at α = 0.1" in text and "63 at α = 0.3" in text and "651 at α = 1" in text
    assert "derived α₀ = 0.004 it is 1.02" in text
    assert "14" not in text and "980" not in text
    other = texts.osa_layer_text(_by_alpha({0.0: 1.0, 0.1: 14.0}, 1.5, tokens=8, dim=32))
    assert "N = 8, d = 32" in other and "14 at α = 0.1" in other and "it is 1.5" in other


def test_depth_texts_name_the_settings_and_never_quote_an_unresolvable_kappa():
    settings = texts.depth_settings_text(["skipless-osa", "vit"], 8, 16, 32, 2)
    assert settings == "Exact Jacobians of `skipless-osa` and `vit` at depth 8 (N = 16, d = 32), 2 seeds, float64."
    assert "depth_seeds" not in settings and "tokens" not in settings
    rows = []
    for preset, last in (("skipless-ssa", 6.99e162), ("skipless-osa", 40.0), ("vit", 2.0)):
        for seed in range(2):
            for layer in (1, 8):
                rows.append(dict(preset=preset, layer=layer, scope="end_to_end", seed=seed,
                                 kappa=1.5 if layer == 1 else last))
    table = summaries.kappa_table(pd.DataFrame(rows))
    assert table.set_index("preset").loc["skipless-ssa", "beyond_float64"] == 2
    text = texts.kappa_depth_text(table)
    assert "6.99e162" not in text and "e162" not in text
    assert "`skipless-ssa`" in text.split("**Numerically singular")[1].split("\n")[0]
    assert "κ(∂X_8/∂X₀) = 40" in text and "`skipless-osa` ×26.7" in text and "`vit` ×1.33" in text
    assert "skipless-ssa numerically singular" in texts.kappa_finding(_by_alpha({1.0: 651.0}, 1.02), table)


def test_grid_text_follows_the_contrast_alpha():
    rows = []
    for source, alpha, base in (("derived", 0.01, 1.1), ("given", 0.1, 5.0)):
        for n in (8, 16):
            for d in (8, 16):
                rows.append(dict(alpha_source=source, alpha=alpha, tokens=n, dim=d, seed=0, kappa=base * n * d / 64))
    grid = pd.DataFrame(rows)
    text = texts.grid_text(grid, 0.1)
    assert "at α = 0.1 κ ranges from 5 (N = 8, d = 8) to 20 (N = 16, d = 16)" in text
    assert "keeps the worst κ 4.55× below" in text
    assert "α = 0.3" in texts.grid_text(grid, 0.3)


@pytest.mark.parametrize("value, shown", [(6.99e162, "6.99e162"), (0.5, "0.5"), (12345.0, "1.23e4"),
                                          (float("inf"), "∞"), (float("nan"), "n/a")])
def test_numbers_are_written_for_reading(value, shown):
    assert texts.number(value) == shown


def test_speedup_and_accuracy_texts_come_from_the_tables():
    t = _timings({"lowrank": [1e-4, 2e-4, 4e-4], "sdpa": [1e-4, 4e-4, 1.6e-3]})
    assert "at N = 1024, low-rank OSA took 4e-4 s against 0.0016 s for `sdpa` (4× faster)" in texts.speedup_text(t)
    acc = pd.DataFrame(dict(dtype=["float32", "float32"], method=["dense", "lowrank"], rel_error=[2e-7, 5e-5],
                            norm_s=[1.0, 150.0]))
    text = texts.accuracy_text(acc)
    assert "`dense` float32: 2e-7" in text and "`lowrank` float32: 5e-5" in text and "‖S‖₂ up to 150" in text
    assert np.isfinite(texts.KAPPA_RESOLVED)


def _ends(presets: dict[str, tuple[float, float, float, float, float, float]]) -> pd.DataFrame:
    """Per preset (relative residual, stable rank, effective rank) at the input and at layer 4."""
    rows = []
    for preset, (rr0, rr4, sr0, sr4, er0, er4) in presets.items():
        for metric, (a, b) in (("relative_residual", (rr0, rr4)), ("stable_rank", (sr0, sr4)),
                               ("effective_rank", (er0, er4))):
            rows += [dict(preset=preset, layer=0, site="block", metric=metric, value=a, seed=0),
                     dict(preset=preset, layer=4, site="block", metric=metric, value=b, seed=0)]
    return pd.DataFrame(rows)


def test_rank_one_needs_both_ranks_or_identical_tokens():
    """The report-02 case: skipless OSA keeps effective rank 12.1 of 51.4 while its stable rank falls below
    1.5 (one dominant direction): it lost rank, it did not collapse to rank one."""
    m = _ends({"skipless-osa": (1.0, 0.5, 20.0, 1.2, 51.4, 12.1), "skipless-ssa": (1.0, 1e-9, 20.0, 1.0, 51.4, 1.0),
               "pure-ssa": (1.0, 0.3, 20.0, 1.1, 51.4, 1.2), "vit": (1.0, 0.9, 20.0, 15.0, 51.4, 40.0)})
    text = texts.rank_collapse_text(m)
    collapsed = text.split("**Collapsed")[1].split("\n")[0]
    lost = text.split("**Lost rank")[1].split("\n")[0]
    kept = text.split("**Kept")[1].split("\n")[0]
    assert "`skipless-ssa`" in collapsed and "`pure-ssa`" in collapsed and "`skipless-osa`" not in collapsed
    assert "`skipless-osa`" in lost and "`vit`" in kept and "`skipless-osa`" not in kept
    assert "effective rank 51.4 → 12.1" in text


def test_no_speedup_is_claimed_from_untrustworthy_fits():
    t = _timings({"lowrank": [1e-4, 2e-4, 4e-4], "sdpa": [1e-4, 4e-4, 1.6e-3]})
    trusted = pd.DataFrame({"method": ["lowrank", "sdpa"], "slope": [1.0, 2.0], "expected": [1, 2],
                            "trusted": [True, True], "n_min": [256, 256], "n_max": [1024, 1024]})
    assert "(4× faster)" in texts.speedup_text(t, trusted)
    doubtful = trusted.assign(trusted=[True, False])
    text = texts.speedup_text(t, doubtful)
    assert "faster" not in text and "×" not in text
    assert "low-rank OSA took 4e-4 s and `sdpa` 0.0016 s" in text and "`sdpa` is flagged untrustworthy" in text


def test_paired_verdicts_name_the_better_preset():
    paired = pd.DataFrame({"preset": ["skipless-ssa", "vit", "mlp"], "n": [5, 5, 5],
                           "diff_mean": [0.052, -0.0016, -0.03], "ci_low": [0.0107, -0.0297, -0.05],
                           "ci_high": [0.0933, 0.0265, -0.01]})
    text = texts.paired_verdict_text(paired)
    lines = text.splitlines()
    assert lines[0].endswith("`skipless-osa` is better.") and "+5.2 points, 95 % CI [+1.1, +9.3], 5 seeds" in lines[0]
    assert lines[1].endswith("no difference shown (the interval contains 0).")
    assert lines[2].endswith("`mlp` is better.")
    assert "reference" not in text


def test_ablation_text_reads_the_drop_against_the_alpha0_control():
    ablation = pd.DataFrame({"preset": ["skipless-osa"], "split": ["val"], "drop_mean": [0.485]})
    summary = pd.DataFrame({"preset": ["skipless-osa", "skipless-osa-alpha0"], "test_accuracy_mean": [0.751, 0.745]})
    text = texts.ablation_text(ablation, summary)
    assert "costs 48.5 points of val accuracy" in text and "not what mixing contributes" in text
    assert "`skipless-osa-alpha0` is 0.6 points behind `skipless-osa`" in text
    assert texts.ablation_text(ablation[ablation["preset"] == "x"], summary) == ""
