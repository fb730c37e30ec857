"""The depth study: experiment file, bracketing tuner, statistics, tables regenerated from results alone."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats as sps

from osa_lab.errors import ConfigurationError
from osa_lab.studies.depth_study import bracket, report, run, stats
from osa_lab.studies.depth_study.spec import StudySpec, TuningSpec, load_spec, spec_from_dict

EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "mnist1d_depth.yaml"


# ----------------------------------------------------------------------------- experiment file


@pytest.mark.parametrize("profile", [None, "quick"])
def test_the_experiment_file_round_trips(profile):
    spec = load_spec(EXPERIMENT, profile)
    again = spec_from_dict(yaml.safe_load(yaml.safe_dump(spec.to_dict())), spec.profile)
    assert again == spec


def test_the_full_profile_meets_the_study_floors():
    spec = load_spec(EXPERIMENT)
    assert spec.steps >= 6000 and spec.batch_size == 100
    at = {d: {p for p, dd in spec.run_order() if dd == d} for d in (4, 8, 16)}
    four = {"vit", "skipless-osa", "skipless-ssa", "ssa-cutting-skip"}
    assert four <= at[8] and four <= at[16]
    assert four | {"skipless-osa-alpha0", "vit-no-attn", "mlp", "cnn1d"} <= at[4]
    assert spec.seeds[4] >= 10 and spec.seeds[8] >= 3 and spec.seeds[16] >= 3
    assert len(spec.tuning.seeds) >= 2 and len(spec.tuning.alpha_lr_mult) >= 2
    assert spec.gate == {"cnn1d": 0.90, "mlp": 0.65}


def test_the_quick_profile_is_small():
    spec = load_spec(EXPERIMENT, "quick")
    assert sorted({d for _, d in spec.run_order()}) == [2, 4]
    assert all(n == 2 for n in spec.seeds.values()) and spec.steps <= 500


def test_tuning_seeds_that_are_also_final_seeds_are_refused():
    raw = yaml.safe_load(EXPERIMENT.read_text())
    raw.pop("profiles")
    raw["tuning"]["seeds"] = [3, 1000]
    with pytest.raises(ConfigurationError, match=r"tuning seeds \[3\] are also final seeds"):
        spec_from_dict(raw)


def test_one_tuning_seed_is_refused():
    with pytest.raises(ConfigurationError, match="≥ 2 distinct seeds"):
        TuningSpec(seeds=(1000,))


def test_unknown_keys_and_profiles_are_named(tmp_path):
    path = tmp_path / "e.yaml"
    path.write_text("name: x\ncells: [{presets: [vit], depths: [2]}]\nseeds: {2: 2}\nsteps_total: 5\n")
    with pytest.raises(ConfigurationError, match="steps_total"):
        load_spec(path)
    with pytest.raises(ConfigurationError, match="no profile 'fast'"):
        load_spec(EXPERIMENT, "fast")


# ----------------------------------------------------------------------------- bracketing tuner


def search(score, start, *, axes=("lr",), starts=None, max_extensions=3):
    bounds = {"lr": (1e-6, 1.0), "alpha_lr_mult": (0.1, 1e3), "warmup_fraction": (0.005, 0.5)}
    state = bracket.BracketState(axes, starts or {"lr": start}, bounds, max_extensions=max_extensions)
    points = state.initial_points()
    while points:
        for p in points:
            state.scores[p] = score(*p)
        points = state.next_points()
    return state


def test_an_edge_optimum_extends_the_grid_and_is_recorded():
    state = search(lambda lr: -abs(math.log(lr / 0.05)), [1e-3, 3e-3, 1e-2])
    assert state.best() == (0.03,)
    assert (0.03,) in state.added_by_extension and (0.09,) in state.added_by_extension
    assert state.extensions == {("lr", "high"): 2}
    assert state.edge_after_limit() == []


def test_an_optimum_beyond_the_limit_is_reported_at_the_edge():
    state = search(lambda lr: -abs(math.log(lr / 0.9)), [1e-3, 3e-3, 1e-2], max_extensions=1)
    assert state.best() == (0.03,) and state.edge_after_limit() == ["lr high"]


def test_an_interior_optimum_is_not_extended():
    state = search(lambda lr: -abs(math.log(lr / 3e-3)), [1e-3, 3e-3, 1e-2])
    assert state.added_by_extension == set() and state.best() == (3e-3,)


def test_a_results_folder_of_another_profile_is_refused_naming_the_field(tmp_path):
    """The large-depth study's quick profile given the full profile's folder (or the other way round)."""
    from osa_lab.studies.depth_study.runner import check_results_budget

    root = Path(__file__).resolve().parents[2]
    full = load_spec(root / "experiments" / "mnist1d_large_depth.yaml")
    quick = load_spec(root / "experiments" / "mnist1d_large_depth.yaml", "quick")

    def as_dict(spec: StudySpec) -> dict:
        return {"data": spec.data, "val_fraction": spec.val_fraction, "batch_size": spec.batch_size,
                "model": dict(spec.model)}  # fmt: skip

    (tmp_path / "experiment.yaml").write_text(yaml.safe_dump(full.to_dict(), sort_keys=False))
    check_results_budget(full, tmp_path, as_dict(full))  # its own folder resumes
    with pytest.raises(ConfigurationError, match=r"records `data` 'mnist1d-large', but this study has 'mnist1d'"):
        check_results_budget(quick, tmp_path, as_dict(quick))
    # a committed run of the full profile, in a folder without its experiment.yaml
    (tmp_path / "experiment.yaml").unlink()
    committed = sorted((root / "docs" / "results" / "mnist1d-large-depth" / "final").glob("vit-d8-*.json"))[0]
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / committed.name).write_text(committed.read_text())
    check_results_budget(full, tmp_path, as_dict(full))
    with pytest.raises(ConfigurationError, match=r"was trained with `data` 'mnist1d-large' \(the study asks for 'mnist1d'\)"):
        check_results_budget(quick, tmp_path, as_dict(quick))


def test_where_no_point_trained_on_every_seed_the_least_failed_is_named():
    state = bracket.BracketState(("lr", "warmup_fraction"), {"lr": [1e-3, 3e-3], "warmup_fraction": [0.05, 0.15]},
                                 {"lr": (1e-5, 1.0), "warmup_fraction": (0.005, 0.5)})  # fmt: skip
    assert state.least_failed() is None  # nothing evaluated yet
    for point, failed, score in [((1e-3, 0.05), 2, 0.9), ((1e-3, 0.15), 1, 0.5), ((3e-3, 0.05), 1, 0.7),
                                 ((3e-3, 0.15), 3, math.nan)]:  # fmt: skip
        state.scores[point], state.failures[point], state.finished_scores[point] = math.nan, failed, score
    assert state.best() is None
    assert state.least_failed() == (3e-3, 0.05)  # fewest failures, then the higher mean of the finished seeds
    state.finished_scores[(3e-3, 0.05)] = 0.5  # an exact tie: the tie rule's order (smallest lr first)
    assert state.least_failed() == (1e-3, 0.15)
    for point in state.failures:  # every point failed on every seed: the tie rule's order alone
        state.failures[point], state.finished_scores[point] = 3, math.nan
    assert state.least_failed() == (1e-3, 0.15)  # smallest lr, then the longest warm-up


def test_a_diverged_point_bounds_the_optimum_but_is_never_chosen():
    state = search(lambda lr: math.nan if lr > 0.02 else lr, [1e-3, 3e-3, 1e-2])
    assert state.best() == (0.01,) and state.edge_after_limit() == []
    assert math.isnan(state.scores[(0.03,)])


def test_when_everything_diverges_the_learning_rate_goes_down():
    state = search(lambda lr: math.nan if lr > 2e-4 else 1.0 - lr, [1e-3, 3e-3])
    assert min(p[0] for p in state.scores) < 2e-4 and state.best() is not None


def test_the_tie_rule_takes_the_smallest_lr_then_multiplier_then_longest_warm_up():
    """Scores within ``tie_margin`` of the top tie; the search still brackets the top point."""
    axes = ("lr", "alpha_lr_mult", "warmup_fraction")
    state = bracket.BracketState(axes, {"lr": [1e-3, 3e-3, 1e-2], "alpha_lr_mult": [1, 10], "warmup_fraction": [0.05, 0.15]},
                                 {"lr": (1e-6, 1.0), "alpha_lr_mult": (0.1, 1e3), "warmup_fraction": (0.005, 0.5)},
                                 tie_margin=0.005)  # fmt: skip
    scores = {(1e-3, 1.0, 0.05): 0.800, (1e-3, 1.0, 0.15): 0.800, (3e-3, 1.0, 0.05): 0.804,
              (3e-3, 10.0, 0.05): 0.806, (1e-2, 1.0, 0.05): 0.790}  # fmt: skip
    state.scores.update({p: 0.5 for p in state.initial_points()} | scores)
    assert state.top() == (3e-3, 10.0, 0.05)
    # within 0.005 of 0.806: (3e-3, ×1, 0.05) and (3e-3, ×10, 0.05); the smaller lr ties first, then ×1
    assert state.best() == (3e-3, 1.0, 0.05)
    state.scores[(3e-3, 1.0, 0.15)] = 0.803  # same lr and multiplier, a longer warm-up: preferred
    assert state.best() == (3e-3, 1.0, 0.15)
    state.tie_margin = 0.0  # no margin: the chosen point is the top point
    assert state.best() == state.top() == (3e-3, 10.0, 0.05)


def test_the_warm_up_is_bracketed_like_the_other_axes():
    def score(lr, warmup):
        return -abs(math.log(lr / 3e-3)) - abs(math.log(warmup / 0.4))

    state = search(score, None, axes=("lr", "warmup_fraction"),
                   starts={"lr": [1e-3, 3e-3, 1e-2], "warmup_fraction": [0.05, 0.15]})  # fmt: skip
    assert state.best() == (3e-3, 0.45)  # 0.15 × 3; the next step (1.35) lies past the bound 0.5
    assert state.edge_after_limit() == ["warmup_fraction high"]


def test_two_axes_extend_along_the_best_line_only():
    def score(lr, mult):
        return -abs(math.log(lr / 3e-3)) - abs(math.log(mult / 100))

    state = search(score, None, axes=("lr", "alpha_lr_mult"),
                   starts={"lr": [1e-3, 3e-3, 1e-2], "alpha_lr_mult": [1, 10]})  # fmt: skip
    assert state.best() == (3e-3, 90.0)
    extended = {(3e-3, 30.0), (3e-3, 90.0), (3e-3, 270.0)}
    # each new top (×30, then ×90) is also tried at the learning rates beside it: its lr line is bracketed
    filled = {(lr, m) for lr in (1e-3, 1e-2) for m in (30.0, 90.0)}
    assert state.added_by_extension == extended | filled
    assert state.extensions == {("alpha_lr_mult", "high"): 3}  # fill points are not extensions
    assert state.edge_after_limit() == []


def test_a_top_found_along_one_axis_is_bracketed_along_the_others():
    """The top found by extending the learning rate (at one warm-up) is also tried at the warm-ups beside
    it; a warm-up there can become the top. An axis with one start value is not tuned at all."""
    def score(lr, warmup):
        return -abs(math.log(lr / 9e-3)) - abs(math.log(warmup / 0.45)) / 4

    state = search(score, None, axes=("lr", "warmup_fraction"),
                   starts={"lr": [3e-4, 1e-3, 3e-3], "warmup_fraction": [0.05, 0.15]}, max_extensions=2)  # fmt: skip
    assert (9e-3, 0.05) in state.scores and (9e-3, 0.45) in state.scores
    assert state.best() == (9e-3, 0.45) and state.edge_after_limit() == ["warmup_fraction high"]
    untuned = search(lambda lr, warmup: -abs(math.log(lr / 9e-3)), None, axes=("lr", "warmup_fraction"),
                     starts={"lr": [1e-3, 3e-3], "warmup_fraction": [0.05]})  # fmt: skip
    assert {w for _, w in untuned.scores} == {0.05}


# ----------------------------------------------------------------------------- statistics


def test_holm_matches_the_hand_computed_step_down():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5, math.nan, 0.01]) == pytest.approx([0.5, math.nan, 0.02], nan_ok=True)
    assert stats.holm([0.4, 0.3]) == pytest.approx([0.6, 0.6])  # monotone: never below an earlier step


def test_tost_matches_two_one_sided_t_tests_by_hand():
    d = np.array([0.004, -0.012, 0.009, 0.015, -0.003, 0.006])
    margin, n = 0.02, len(d)
    se = d.std(ddof=1) / math.sqrt(n)
    p_low = 1 - sps.t.cdf((d.mean() + margin) / se, n - 1)
    p_high = sps.t.cdf((d.mean() - margin) / se, n - 1)
    assert stats.tost(d, margin) == pytest.approx(max(p_low, p_high), rel=1e-9)
    assert stats.tost(d, margin) < 0.01  # tight around 0: equivalent within ±2 points
    assert stats.tost(d + 0.03, margin) > 0.5  # shifted by 3 points: not equivalent


def test_one_sided_paired_test_matches_the_t_distribution():
    d = np.array([0.05, 0.02, 0.04, 0.01, 0.03])
    t = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    greater, less = stats.one_sided_paired(d)
    assert greater == pytest.approx(1 - sps.t.cdf(t, len(d) - 1), rel=1e-9)
    assert less == pytest.approx(sps.t.cdf(t, len(d) - 1), rel=1e-9)


def test_seeds_needed_is_the_fewest_seeds_whose_exact_power_reaches_80_percent():
    def power(n, delta, alpha=0.05):  # the one-sided t-test's power by hand, from scipy's noncentral t
        return 1 - sps.nct.cdf(sps.t.ppf(1 - alpha, n - 1), n - 1, delta * math.sqrt(n))

    for mean, std in ((0.01, 0.02), (0.02, 0.01), (0.005, 0.02)):
        n = int(stats.seeds_needed(mean, std, kind="superiority", alpha=0.05, power=0.8))
        assert power(n, mean / std) >= 0.8 > power(n - 1, mean / std)
        assert stats.superiority_power(n, mean / std) == pytest.approx(power(n, mean / std), rel=1e-12)
    # a 2σ effect: the normal approximation says 2 seeds, the t-test needs 4
    assert math.ceil(((sps.norm.ppf(0.95) + sps.norm.ppf(0.8)) / 2) ** 2) == 2
    assert stats.seeds_needed(2.0, 1.0, kind="superiority") == 4
    assert stats.seeds_needed(-0.01, 0.02, kind="superiority") == math.inf
    assert stats.seeds_needed(0.03, 0.02, kind="equivalence", margin=0.02) == math.inf


def test_equivalence_power_is_the_bonferroni_bound_of_the_two_noncentral_t_tails():
    n, mean, std, margin = 12, 0.004, 0.02, 0.02
    t_c = sps.t.ppf(0.95, n - 1)
    by_hand = (sps.nct.sf(t_c, n - 1, (mean + margin) * math.sqrt(n) / std)
               + sps.nct.cdf(-t_c, n - 1, (mean - margin) * math.sqrt(n) / std) - 1)  # fmt: skip
    assert stats.equivalence_power(n, mean, std, margin) == pytest.approx(by_hand, rel=1e-12)
    # and it is a lower bound of TOST's simulated power
    rng = np.random.default_rng(0)
    d = rng.normal(mean, std, size=(20_000, n))
    simulated = np.mean([stats.tost(row, margin) < 0.05 for row in d[:4000]])
    assert by_hand <= simulated + 0.02
    n_needed = int(stats.seeds_needed(mean, std, kind="equivalence", margin=margin))
    assert stats.equivalence_power(n_needed, mean, std, margin) >= 0.8 > stats.equivalence_power(n_needed - 1, mean, std, margin)


def test_two_sided_and_rank_tests_match_scipy():
    d = np.array([-0.011, -0.008, -0.015, 0.002, -0.012, -0.009, -0.01, -0.013, -0.007, -0.014])
    assert stats.two_sided_paired(d) == pytest.approx(sps.ttest_1samp(d, 0.0).pvalue, rel=1e-12)
    assert stats.signed_rank(d) == pytest.approx(sps.wilcoxon(d).pvalue, rel=1e-12)
    assert stats.signed_rank(d, "greater") == pytest.approx(sps.wilcoxon(d, alternative="greater").pvalue, rel=1e-12)
    assert math.isnan(stats.signed_rank([0.0, 0.0, 0.01]))


def test_differences_without_spread_take_the_t_tests_limit():
    """Every seed's difference equal: t is ±∞ (or 0/0), and p is the limit of a vanishing spread."""
    assert stats.one_sided_paired([0.1] * 4) == (0.0, 1.0)
    assert stats.one_sided_paired([-0.1] * 4) == (1.0, 0.0)
    assert stats.one_sided_paired([0.0] * 4) == (1.0, 1.0)
    assert stats.tost([0.01] * 4, 0.02) == 0.0 and stats.tost([0.03] * 4, 0.02) == 1.0
    assert stats.two_sided_paired([0.1] * 4) == 0.0 and stats.two_sided_paired([0.0] * 4) == 1.0
    nearly = 0.1 + 1e-9 * np.array([1.0, -1.0, 0.5, -0.5])  # the limit it stands for
    assert stats.one_sided_paired(nearly)[0] < 1e-6 and stats.tost(nearly - 0.09, 0.02) < 1e-6
    assert math.isnan(stats.one_sided_paired([0.1])[0]) and math.isnan(stats.tost([0.1], 0.2))


def test_clopper_pearson_matches_the_beta_quantiles():
    assert stats.clopper_pearson(0, 10) == pytest.approx((0.0, 1 - 0.025 ** (1 / 10)))
    assert stats.clopper_pearson(10, 10) == pytest.approx((0.025 ** (1 / 10), 1.0))
    lo, hi = stats.clopper_pearson(3, 10)
    assert lo == pytest.approx(sps.beta.ppf(0.025, 3, 8)) and hi == pytest.approx(sps.beta.ppf(0.975, 4, 7))
    assert sps.binom.sf(2, 10, lo) == pytest.approx(0.025) and sps.binom.cdf(3, 10, hi) == pytest.approx(0.025)


# ----------------------------------------------------------------------------- tables from results alone


def _spec(**kw) -> StudySpec:
    return StudySpec(name="t", cells=((("vit", "skipless-osa", "skipless-ssa"), (4,)), (("mlp",), (4,))),
                     seeds={4: 4}, gate={"mlp": 0.65}, **kw)  # fmt: skip


def _write_run(root: Path, preset: str, seed: int, acc: float, status: str = "ok", lr: float = 0.01,
               kappa_init: float = 3.0, train_loss: float = 0.1) -> None:
    search = root / "search" / f"{preset}-d4.json"
    search.parent.mkdir(parents=True, exist_ok=True)
    search.write_text(json.dumps({"preset": preset, "depth": 4, "chosen": [0.01, 1.0], "edge_after_limit": []}))
    path = root / "final" / f"{preset}-d4-lr{lr:g}-am1-s{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    curve = [{"epoch": e, "step": 36 * e, "train_loss": 1.0 / e, "train_accuracy": min(1.0, 0.5 + 0.1 * e),
              "val_accuracy": acc, "test_accuracy": acc} for e in range(1, 7)]  # fmt: skip
    path.write_text(json.dumps({"stage": "final", "preset": preset, "depth": 4, "seed": seed, "lr": lr,
                                "alpha_lr_mult": 1.0, "steps": 216, "status": status, "curve": curve,
                                "test_accuracy": acc if status == "ok" else math.nan, "val_accuracy": acc,
                                "train_accuracy": 1.0, "train_loss": train_loss, "steps_to_90": 180.0,
                                "kappa_init": kappa_init, "kappa_trained": 9.0,
                                "rank_init": {"effective_rank": 10.0, "relative_residual": 0.9}}))  # fmt: skip


def test_the_summary_is_regenerated_from_the_results_folder_alone(tmp_path):
    noise = [0.001, -0.002, 0.002, -0.001]
    for s in range(4):
        _write_run(tmp_path, "skipless-osa", s, 0.85 + noise[s])
        _write_run(tmp_path, "vit", s, 0.85 - noise[s] / 2)
        _write_run(tmp_path, "skipless-ssa", s, 0.70 - noise[s])
        _write_run(tmp_path, "mlp", s, 0.66 + noise[s])
    out = report.summarise(tmp_path, _spec())
    runs = json.loads(json.dumps(list(out["runs"]["preset"])))
    assert len(runs) == 16 and (tmp_path / "runs.csv").exists()
    claims = out["claims"].set_index("other")
    assert claims.loc["vit", "verdict"] == "shown" and claims.loc["skipless-ssa", "verdict"] == "shown"
    assert (claims["p_holm"] >= claims["p"]).all()
    assert "**Complete**" in out["verdict"] and "`mlp`: 66.0 %" in out["verdict"]
    assert "* Shown: skipless OSA is comparable to the skip-connected ViT (depth 4)" in out["verdict"]


def test_a_partial_study_says_so_everywhere(tmp_path):
    for s in range(2):
        _write_run(tmp_path, "skipless-osa", s, 0.85)
        _write_run(tmp_path, "vit", s, 0.80 + 0.01 * s)
    out = report.summarise(tmp_path, _spec())
    assert "**PARTIAL**: 4 of 16 planned final runs" in out["verdict"]
    assert "no conclusion" in out["verdict"]
    for name in ("runs", "claims", "curves", "tuning"):
        assert not bool(__import__("pandas").read_csv(tmp_path / f"{name}.csv")["complete"].any())


def test_a_kappa_beyond_float64_is_named_so_not_quoted(tmp_path):
    for s in range(2):
        _write_run(tmp_path, "skipless-ssa", s, 0.7, kappa_init=[7e19, 4.5e34][s])
        _write_run(tmp_path, "vit", s, 0.85, kappa_init=[30.0, 40.0][s])
    text = report.summarise(tmp_path, _spec())["verdict"]
    ssa = next(line for line in text.splitlines() if line.startswith("* `skipless-ssa` depth 4"))
    vit = next(line for line in text.splitlines() if line.startswith("* `vit` depth 4"))
    assert "κ at init above 4.5e15, beyond what float64 resolves" in ssa and "e34" not in ssa and "e+34" not in ssa
    assert vit.endswith("κ at init 35)")


def test_a_resolved_kappa_in_the_verdict_reads_as_in_the_tables(tmp_path):
    for s in range(2):
        _write_run(tmp_path, "vit", s, 0.85, kappa_init=2.78e7)
    text = report.summarise(tmp_path, _spec(), write=False)["verdict"]
    assert next(x for x in text.splitlines() if x.startswith("* `vit` depth 4")).endswith("κ at init 2.78e7)")


def test_seeds_that_never_reach_90_percent_are_counted_beside_the_median(tmp_path):
    """A seed that trains but never reaches 90 % training accuracy is not a failure; the steps-to-90 %
    median is over the seeds that got there, and the line says how many did."""
    for s in range(4):
        _write_run(tmp_path, "vit", s, 0.85)
    path = tmp_path / "final" / "vit-d4-lr0.01-am1-s3.json"
    run = json.loads(path.read_text())
    run.update(steps_to_90=None, test_accuracy=0.60, train_accuracy=0.70)
    path.write_text(json.dumps(run))
    text = report.summarise(tmp_path, _spec(), write=False)["verdict"]
    vit = next(line for line in text.splitlines() if line.startswith("* `vit` depth 4"))
    assert "(4 of 4 seeds, none failed or diverged;" in vit
    assert "steps to 90 % train acc. 180 (median of the 3 of 4 seeds that reached it)" in vit


def test_a_seed_stuck_at_chance_is_a_failure_never_ok(tmp_path):
    """A run whose loss stays finite but whose accuracy ends at chance failed: counted with an exact
    interval and named with its rule in runs.csv; it stays in the cell's mean and the paired tests at
    the accuracy it reached (leaving it out would flatter its preset)."""
    for s, acc in enumerate((0.848, 0.867, 0.834, 0.102)):
        _write_run(tmp_path, "skipless-osa", s, acc)
        _write_run(tmp_path, "vit", s, 0.85)
    out = report.summarise(tmp_path, _spec(), write=False)
    runs = out["runs"].set_index(["preset", "seed"])
    assert runs.loc[("skipless-osa", 3), "status"] == "failed"
    assert runs.loc[("skipless-osa", 3), "failure"].startswith("chance: final test accuracy 10.2 %")
    assert (runs.drop(("skipless-osa", 3))["status"] == "ok").all()
    row = out["summary"].set_index("preset").loc["skipless-osa"]
    assert row["failed"] == 1 and row["test_accuracy_by_seed"] == "84.8 / 86.7 / 83.4 / 10.2"
    assert row["test_accuracy_mean"] == pytest.approx(np.mean([0.848, 0.867, 0.834, 0.102]))
    assert (row["failure_rate_low"], row["failure_rate_high"]) == pytest.approx(sps_beta_interval(1, 4))
    line = next(x for x in out["verdict"].splitlines() if x.startswith("* `skipless-osa` depth 4"))
    assert "(4 of 4 seeds, 1 failed, 0 diverged; failure rate 95 % CI [1, 81] %;" in line
    assert out["claims"].set_index("other").loc["vit", "n"] == 4  # the failed seed is paired


def sps_beta_interval(k: int, n: int) -> tuple[float, float]:
    return sps.beta.ppf(0.025, k, n - k + 1), sps.beta.ppf(0.975, k + 1, n - k)


def test_a_small_cell_lists_its_seeds_and_flags_an_interval_past_the_range(tmp_path):
    """Four seeds, one far below the others (but above chance): the t-interval runs past 100 %, and the
    verdict says so and shows each seed's accuracy, so that a reader sees where the spread comes from."""
    for s, acc in enumerate((0.848, 0.867, 0.834, 0.302)):
        _write_run(tmp_path, "skipless-osa", s, acc)
        _write_run(tmp_path, "vit", s, 0.88)
    out = report.summarise(tmp_path, _spec(), write=False)
    osa_row = out["summary"].set_index("preset").loc["skipless-osa"]
    assert osa_row["ci_high"] > 1 and osa_row["test_accuracy_by_seed"] == "84.8 / 86.7 / 83.4 / 30.2"
    lines = out["verdict"].splitlines()
    osa_line = next(line for line in lines if line.startswith("* `skipless-osa` depth 4"))
    vit_line = next(line for line in lines if line.startswith("* `vit` depth 4"))
    assert "(past 0–100 %: the seeds spread too widely for a t-interval), seeds 84.8 / 86.7 / 83.4 / 30.2 (4 of 4" in osa_line
    assert "past 0–100 %" not in vit_line and ", seeds 88.0 / 88.0 / 88.0 / 88.0 (4 of 4" in vit_line


def test_a_failed_gate_draws_no_conclusion(tmp_path):
    for s in range(4):
        for p, acc in (("skipless-osa", 0.9), ("vit", 0.7), ("skipless-ssa", 0.6), ("mlp", 0.40)):
            _write_run(tmp_path, p, s, acc + 0.01 * s * (p == "vit"))
    text = report.summarise(tmp_path, _spec())["verdict"]
    assert "`mlp`: 40.0 % mean test accuracy (floor 65 %): failed" in text
    assert "draws no conclusion" in text


# ----------------------------------------------------------------------------- end to end


TINY_EXPERIMENT = """
name: tiny
data: mnist1d
steps: 36
batch_size: 100
model: {dim: 8, heads: 2}
cells: [{presets: [vit, mlp], depths: [1]}]
seeds: {1: 2}
tuning: {steps: 36, seeds: [1000, 1001], lr: [0.003, 0.01], alpha_lr_mult: [10], max_extensions: 1}
gate: {mlp: 0.65}
kappa_samples: 1
"""


def test_an_experiment_runs_resumes_and_regenerates_from_its_results(tmp_path, capsys):
    from osa_lab.cli import main as cli_main

    exp = tmp_path / "tiny.yaml"
    exp.write_text(TINY_EXPERIMENT)
    out, checkpoints = tmp_path / "results", tmp_path / "checkpoints"
    args = ["train", "--experiment", str(exp), "--output", str(out), "--checkpoints", str(checkpoints),
            "--serial", "--quiet"]  # fmt: skip
    assert cli_main(args) == 0
    # every run's checkpoint folder lies under --checkpoints, and the study gave its lock back
    trained = sorted(p.relative_to(out).with_suffix("") for p in out.glob("*/*.json") if p.parent.name != "search")
    saved = sorted(p.parent.relative_to(checkpoints) for p in checkpoints.glob("*/*/checkpoint.pt"))
    assert len(trained) >= 12 and [str(p).rsplit("-", 1)[0] for p in saved] == [str(p) for p in trained]
    assert not (checkpoints / "study.lock").exists()
    runs = __import__("pandas").read_csv(out / "runs.csv")
    assert sorted(runs["preset"]) == ["mlp", "mlp", "vit", "vit"] and runs["steps"].eq(36).all()
    assert runs.loc[runs["preset"] == "vit", "kappa_init"].gt(0).all()
    assert runs.loc[runs["preset"] == "mlp", "kappa_init"].isna().all()
    # κ per sub-block, at initialisation and after training: numbers for the ViT, NaN for the MLP
    for when in ("init", "trained"):
        parts = [f"kappa_{part}_{when}" for part in ("embedding", "attention", "mlp", "readout")]
        assert runs.loc[runs["preset"] == "vit", parts].gt(0).all().all(), runs[parts]
        assert runs.loc[runs["preset"] == "mlp", parts].isna().all().all()
    # and layer by layer: the embedding, attention 1, MLP 1 and the readout of each depth-1 ViT run
    layers = __import__("pandas").read_csv(out / "sub_block_layers.csv")
    vit_layers = layers[layers["preset"] == "vit"]
    assert len(vit_layers) == 2 * 2 * 4 and set(layers["preset"]) == {"vit"}  # 2 runs × init/trained × 4 sub-blocks
    assert sorted(vit_layers["layer"].unique()) == [0, 1, 2] and vit_layers["kappa"].gt(0).all()
    searches = sorted(p.name for p in (out / "search").glob("*.json"))
    assert searches == ["mlp-d1.json", "vit-d1.json"]
    tuning = __import__("pandas").read_csv(out / "tuning.csv")
    assert tuning["chosen"].sum() == 4  # one chosen point per cell, two tuning seeds each
    # tuning runs record κ too: end to end and per sub-block, before and after training
    kappas = ["kappa_init", "kappa_trained", *(f"kappa_{part}_{when}" for when in ("init", "trained")
                                               for part in ("embedding", "attention", "mlp", "readout"))]
    vit_tuning = tuning[(tuning["preset"] == "vit") & (tuning["status"] == "ok")]
    assert len(vit_tuning) >= 4 and vit_tuning[kappas].gt(0).all().all(), vit_tuning[kappas]
    assert tuning.loc[tuning["preset"] == "mlp", kappas].isna().all().all()
    first = (out / "verdict.md").read_text()
    capsys.readouterr()
    # a rerun trains nothing (every run's JSON is there) and gives the same tables
    before = {p: p.stat().st_mtime_ns for p in (out / "final").glob("*.json")}
    assert cli_main(args) == 0
    assert {p: p.stat().st_mtime_ns for p in (out / "final").glob("*.json")} == before
    assert (out / "verdict.md").read_text() == first
    # the tables come back from the results folder alone
    for name in ("runs.csv", "verdict.md", "summary.csv"):
        (out / name).unlink()
    assert cli_main([*args, "--summary-only"]) == 0
    assert (out / "verdict.md").read_text() == first
    # the same folder under a changed budget: refused in one line before anything in it changes
    every_file = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    exp.write_text(TINY_EXPERIMENT.replace("steps: 36", "steps: 72"))
    capsys.readouterr()
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()  # the study's opening line, then the error
    assert [line for line in err if "error" in line] == err[-1:] and err[-1].startswith("osa-lab train: error: "), err
    assert "records `steps` 36, but this study has 72" in err[-1] and "--output" in err[-1], err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == every_file
    # without the recorded experiment, the runs themselves are checked (the first one named)
    (out / "experiment.yaml").unlink()
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "/tune/" in err and "was trained with `epochs` 1 (the study asks for 2)" in err, err
    assert not (out / "experiment.yaml").exists()


def test_a_checkpoint_folder_in_use_by_another_study_is_refused_before_any_work(tmp_path, capsys):
    """Two studies of one file with different --output share the default checkpoint folder; the
    second is refused with one line naming the owner and --checkpoints, and trains nothing."""
    from osa_lab.cli import main as cli_main
    from osa_lab.fileio import OutputLock

    exp = tmp_path / "tiny.yaml"
    exp.write_text(TINY_EXPERIMENT)
    checkpoints = tmp_path / "checkpoints"
    with OutputLock(checkpoints / "study.lock"):  # the first study, still running
        code = cli_main(["train", "--experiment", str(exp), "--output", str(tmp_path / "second"),
                         "--checkpoints", str(checkpoints), "--serial", "--quiet"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 2, err  # the paths line, then the error
    assert err[1].startswith(f"osa-lab train: error: checkpoint folder {checkpoints} is in use by process ")
    assert err[1].endswith("wait for it to finish or choose another checkpoint folder (--checkpoints)")
    assert not list((tmp_path / "second").rglob("*.json")) and not list(checkpoints.rglob("checkpoint.pt"))


def test_a_bad_experiment_file_is_one_line_and_exit_2(tmp_path, capsys):
    from osa_lab.cli import main as cli_main

    exp = tmp_path / "bad.yaml"
    exp.write_text(TINY_EXPERIMENT.replace("seeds: [1000, 1001]", "seeds: [0, 1000]"))
    assert cli_main(["train", "--experiment", str(exp), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "are also final seeds" in err[0]


def test_final_runs_of_a_superseded_choice_are_left_out(tmp_path):
    for s in range(2):
        _write_run(tmp_path, "vit", s, 0.80)
    _write_run(tmp_path, "vit", 0, 0.10, lr=0.03)  # an earlier search chose 0.03; its run must not count
    runs = report.summarise(tmp_path, _spec(), write=False)["runs"]
    assert len(runs) == 2 and runs["test_accuracy"].eq(0.80).all()


def _fake_runs(monkeypatch, score, fail=lambda kw: False, extra=lambda kw: {}):
    """Replace training by ``score(lr)`` so the driver's logic runs in milliseconds (``extra(run)``: more
    fields of a run's record, such as its curve)."""
    from osa_lab.studies.depth_study import runner

    calls = []

    def fake(**kw):  # a task is a seed group: one call for all its seeds
        runs = [{**kw, "seed": seed} for seed in kw["seeds"]]
        calls.extend(runs)
        if any(fail(run) for run in runs):
            raise RuntimeError("worker lost")
        takes_warmup = score.__code__.co_argcount == 2
        acc = score(kw["lr"], kw["warmup_fraction"]) if takes_warmup else score(kw["lr"])
        return [{"stage": kw["stage"], "preset": kw["preset"], "depth": kw["depth"], "seed": run["seed"],
                 "lr": kw["lr"], "alpha_lr_mult": kw["alpha_lr_mult"], "warmup_fraction": kw["warmup_fraction"],
                 "status": "ok", "val_accuracy": acc, **extra(run)}
                for run in runs]  # fmt: skip

    monkeypatch.setattr(runner, "study_group_run", fake)
    return calls


def test_the_driver_extends_an_edge_optimum_and_records_the_search(tmp_path, monkeypatch):
    from osa_lab.studies.depth_study import runner

    calls = _fake_runs(monkeypatch, lambda lr: 1 - abs(math.log(lr / 0.05)) / 10)
    spec = StudySpec(name="t", cells=((("vit",), (2,)),), seeds={2: 2})
    chosen = runner.StudyRunner(spec, tmp_path, tmp_path / "ck", runner.GridOptions.in_process(progress=False)).tune("vit", 2)
    assert chosen == (0.03, 1.0, 0.05)  # the warm-up is not tuned here: one value, the default
    record = json.loads((tmp_path / "search" / "vit-d2.json").read_text())
    assert record["extension_points"] == [[0.03, 1.0, 0.05], [0.09, 1.0, 0.05]] and record["edge_after_limit"] == []
    assert {c["seed"] for c in calls} == {1000, 1001} and all(c["stage"] == "tune" for c in calls)


def test_a_failed_tuning_run_is_not_scored_as_a_divergence(tmp_path, monkeypatch, capsys):
    from osa_lab.studies.depth_study import runner

    _fake_runs(monkeypatch, lambda lr: lr, fail=lambda kw: kw["lr"] == 0.01 and kw["seed"] == 1001)
    spec = StudySpec(name="t", cells=((("vit",), (2,)),), seeds={2: 2})
    study = runner.StudyRunner(spec, tmp_path, tmp_path / "ck", runner.GridOptions.in_process(progress=False))
    assert study.tune("vit", 2) is None
    # two tuning seeds train each alone (groups start at six seeds): only the lost one failed
    assert "1 tuning run(s) failed; the cell is skipped" in capsys.readouterr().err
    assert not (tmp_path / "search" / "vit-d2.json").exists()  # a rerun searches again


def test_a_tuning_run_that_collapsed_to_chance_rules_its_setting_out(tmp_path, monkeypatch):
    """A run that ended at chance is a failure even though its JSON says "ok": its setting scores NaN,
    like a divergence, and the next learning rate down is chosen."""
    from osa_lab.studies.depth_study import runner

    def collapsed(run):
        if run["lr"] >= 0.01 and run["seed"] == 1001:
            return {"num_classes": 10, "curve": [{"step": 1, "train_loss": 1.2, "train_accuracy": 0.6},
                                                 {"step": 2, "train_loss": 2.3, "train_accuracy": 0.11}]}  # fmt: skip
        return {}

    _fake_runs(monkeypatch, lambda lr: lr, extra=collapsed)
    spec = StudySpec(name="t", cells=((("vit",), (2,)),), seeds={2: 2})
    study = runner.StudyRunner(spec, tmp_path, tmp_path / "ck", runner.GridOptions.in_process(progress=False))
    assert study.tune("vit", 2) == (3e-3, 1.0, 0.05)
    record = json.loads((tmp_path / "search" / "vit-d2.json").read_text())
    assert math.isnan(dict(((lr, w), s) for lr, _, w, s in record["scores"])[(0.01, 0.05)])


def test_a_task_is_a_seed_group_from_six_seeds_up_and_a_seed_alone_below(tmp_path):
    from osa_lab.studies.depth_study import runner

    spec = StudySpec(name="t", cells=((("vit",), (2,)),), seeds={2: 6})
    study = runner.StudyRunner(spec, tmp_path, tmp_path / "ck", runner.GridOptions.in_process(progress=False))
    six = study._tasks("final", "vit", 2, [(0.01, 1.0, 0.05)], list(range(6)), 5)
    assert [t.kwargs["seeds"] for t in six] == [list(range(6))] and six[0].settings["seeds"] == "0,1,2,3,4,5"
    two = study._tasks("tune", "vit", 2, [(0.01, 1.0, 0.05), (0.03, 1.0, 0.05)], [1000, 1001], 5)
    assert [(t.kwargs["lr"], t.kwargs["seeds"]) for t in two] == [(0.01, [1000]), (0.01, [1001]), (0.03, [1000]),
                                                                 (0.03, [1001])]  # fmt: skip
    assert len({t.key for t in two}) == 4
    assert all(t.kwargs["kappa"] for t in six + two)  # every run records κ, tuning runs too


def test_the_kappa_sentence_follows_the_sign_and_the_test():
    k = [1, 10, 100, 1e3, 1e4, 1e5]
    assert "had lower test accuracy" in report.kappa_correlation_sentence(k, [0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    assert "had higher test accuracy" in report.kappa_correlation_sentence(k, [0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    assert "not significant" in report.kappa_correlation_sentence(k, [0.5, 0.9, 0.4, 0.8, 0.6, 0.7])
    assert "too few" in report.kappa_correlation_sentence(k[:3], [0.1, 0.2, 0.3])
    assert "beyond what float64 resolves" not in report.kappa_correlation_sentence(k, [0.9, 0.8, 0.7, 0.6, 0.5, 0.4])


def test_the_kappa_sentence_separates_the_points_beyond_float64():
    from scipy.stats import spearmanr

    # four resolved points ordered one way, three beyond float64 (tied at the ceiling) far down:
    # over all seven ρ is negative, over the resolved four it is +1
    kappa = [10.0, 100.0, 1e3, 1e4, 1e20, 1e40, 1e200]
    acc = [0.50, 0.60, 0.70, 0.80, 0.20, 0.30, 0.10]
    text = report.kappa_correlation_sentence(kappa, acc)
    ceiling = report.KAPPA_RESOLVED
    rho_all = spearmanr([min(x, ceiling) for x in kappa], acc)[0]
    assert f"over 7 preset × depth points: ρ = {rho_all:+.2f}" in text
    assert "3 of the 7 points have κ beyond what float64 resolves (tied); over the 4 below it alone, ρ = +1.00" in text
    few = report.kappa_correlation_sentence(kappa[2:], acc[2:])
    assert "the 2 below it are too few" in few


def test_the_finding_names_the_state_the_gate_and_the_claims(tmp_path):
    for s in range(4):
        _write_run(tmp_path, "skipless-osa", s, 0.85 + 0.01 * (s % 2))
        _write_run(tmp_path, "vit", s, 0.80)
    _write_run(tmp_path, "skipless-ssa", 0, 0.70)
    _write_run(tmp_path, "skipless-ssa", 1, 0.71)
    line = report.summarise(tmp_path, _spec(), write=False)["finding"]
    assert line.startswith("Depth study (partial, 10 of 16 final runs); baselines' gate not measured")
    assert "vit at depth 4: refuted" in line and line.endswith("no conclusion drawn.")  # 5.5 points apart: not within ±2
    assert "skipless-ssa at depth 4: waiting" in line  # 2 of its 4 seeds


def test_a_claim_waits_untested_until_both_its_cells_are_complete(tmp_path):
    """Two of four planned seeds: the difference so far is shown, but no p, no Holm slot and no
    verdict (a 'shown' from a partial cell would be a look before the planned sample is in)."""
    for s in range(4):
        _write_run(tmp_path, "skipless-osa", s, 0.85 + 0.001 * s)
        _write_run(tmp_path, "vit", s, 0.80 + 0.002 * s)
    for s in range(2):
        _write_run(tmp_path, "skipless-ssa", s, 0.60 + 0.01 * s)
    out = report.summarise(tmp_path, _spec(), write=False)
    claims = out["claims"].set_index("other")
    waiting = claims.loc["skipless-ssa"]
    assert waiting["verdict"] == "waiting" and waiting["n"] == 2 and math.isnan(waiting["p"]) and math.isnan(waiting["p_holm"])
    assert waiting["diff_mean"] == pytest.approx(0.85 + 0.0005 - 0.605)
    tested = claims.loc["vit"]
    assert tested["verdict"] in ("shown", "refuted", "inconclusive") and tested["p_holm"] == pytest.approx(tested["p"])  # a family of one
    line = next(x for x in out["verdict"].splitlines() if "softmax attention" in x and "depth 4" in x)
    assert "**waiting** for its cells' 4 planned seeds" in line and "+24.6 points over 2 seeds" in line and "p =" not in line


def test_a_cell_without_final_runs_says_how_far_its_tuning_got(tmp_path):
    """Not run, tuning under way, or tuned: the verdict line says which, with the chosen setting."""
    for s in range(4):
        _write_run(tmp_path, "vit", s, 0.85)
    tune = tmp_path / "tune"
    tune.mkdir()
    for preset in ("skipless-osa", "skipless-ssa"):
        for i, lr in enumerate((0.001, 0.003, 0.01)):
            (tune / f"{preset}-d4-lr{lr:g}-am1-s1000.json").write_text(json.dumps(
                {"stage": "tune", "preset": preset, "depth": 4, "seed": 1000, "lr": lr, "alpha_lr_mult": 1.0,
                 "status": "ok", "val_accuracy": 0.5 + 0.1 * i}))  # fmt: skip
    (tmp_path / "search" / "skipless-ssa-d4.json").write_text(json.dumps(
        {"preset": "skipless-ssa", "depth": 4, "chosen": [0.003, 1.0], "extension_points": [[0.01, 1.0]],
         "edge_after_limit": []}))  # fmt: skip
    out = report.summarise(tmp_path, _spec(), write=False)
    lines = {line.split(" depth 4: ")[0]: line.split(" depth 4: ")[1] for line in out["verdict"].splitlines()
             if line.startswith("* `") and " depth 4: " in line}  # fmt: skip
    assert lines["* `skipless-ssa`"] == "tuned at lr 0.003, α-lr ×1, warm-up 0.05 (3 tuning runs, grid extended); no final run yet"
    assert lines["* `skipless-osa`"] == "tuning (3 tuning runs so far); no final run yet"
    assert lines["* `mlp`"] == "not run yet"
    summary = out["summary"].set_index("preset")
    assert summary.loc["skipless-ssa", "lr"] == 0.003 and summary.loc["skipless-ssa", "finished"] == 0
    assert math.isnan(summary.loc["skipless-osa", "lr"])


def test_the_verdict_counts_the_training_time_the_runs_recorded(tmp_path):
    """Σ epoch_time_s × epochs trained per stage, from the run files: 2 final runs of 6 epochs (their
    curves) at 300 s, 1 tuning run of 50 epochs (no curve) at 36 s, and 1 final run planned for 6 epochs
    that diverged after 2 at 900 s are 1.0 + 0.5 + 0.5 hours."""
    for s in range(2):
        _write_run(tmp_path, "vit", s, 0.85)
        path = tmp_path / "final" / f"vit-d4-lr0.01-am1-s{s}.json"
        assert len(json.loads(path.read_text())["curve"]) == 6
        path.write_text(json.dumps({**json.loads(path.read_text()), "epochs": 6, "epoch_time_s": 300.0}))
    (tmp_path / "tune").mkdir()
    (tmp_path / "tune" / "vit-d4-lr0.01-am1-s1000.json").write_text(json.dumps(
        {"stage": "tune", "preset": "vit", "depth": 4, "seed": 1000, "lr": 0.01, "alpha_lr_mult": 1.0,
         "status": "ok", "val_accuracy": 0.8, "epochs": 50, "epoch_time_s": 36.0}))  # fmt: skip
    assert report.training_hours(tmp_path) == {"final": (2, pytest.approx(1.0)), "tune": (1, pytest.approx(0.5))}
    _write_run(tmp_path, "vit", 2, 0.85, status="diverged")
    path = tmp_path / "final" / "vit-d4-lr0.01-am1-s2.json"
    diverged = json.loads(path.read_text())
    path.write_text(json.dumps({**diverged, "curve": diverged["curve"][:2], "epochs": 6, "epoch_time_s": 900.0}))
    assert report.training_hours(tmp_path) == {"final": (3, pytest.approx(1.5)), "tune": (1, pytest.approx(0.5))}
    text = report.summarise(tmp_path, _spec(), write=False)["verdict"]
    assert "Compute: 2.0 hours of training steps, 1.5 in 3 final runs and 0.5 in 1 tuning runs" in text


def test_a_finished_claim_whose_seeds_diverged_stays_in_the_holm_family_as_untestable(tmp_path):
    """`skipless-ssa` diverges on 3 of 4 seeds: its claim has one paired seed. It is listed as untestable and
    counted at p = 1, so the family stays 3 tests (2 claims and 1 reverse) and the other claim's Holm p is
    taken over all three."""
    noise = [0.001, -0.002, 0.002, -0.001]
    for s in range(4):
        _write_run(tmp_path, "skipless-osa", s, 0.85 + noise[s])
        _write_run(tmp_path, "vit", s, 0.85 - noise[s] / 2)
        _write_run(tmp_path, "skipless-ssa", s, 0.70, status="ok" if s == 0 else "diverged")
        _write_run(tmp_path, "mlp", s, 0.66 + noise[s])
    out = report.summarise(tmp_path, _spec(), write=False)
    claims = out["claims"].set_index("other")
    ssa = claims.loc["skipless-ssa"]
    assert ssa["verdict"] == "untestable" and ssa["n"] == 1 and ssa["p"] == 1.0 and ssa["direction"] == "untestable"
    vit = claims.loc["vit"]
    assert vit["p_holm"] == pytest.approx(stats.holm([vit["p"], 1.0, 1.0])[0])
    text = out["verdict"]
    assert "Holm's correction runs over 3 tests: the 2 claim test(s) and the 1 reverse" in text
    assert "**untestable** (1 of 4 seeds paired: the others diverged in one preset or both" in text


def test_a_finished_claim_without_spread_is_tested_not_left_waiting(tmp_path):
    """Identical per-seed differences (p is the t-test's limit) are a test result, never "waiting"."""
    for s in range(4):
        _write_run(tmp_path, "skipless-osa", s, 0.85)
        _write_run(tmp_path, "vit", s, 0.85)
        _write_run(tmp_path, "skipless-ssa", s, 0.70)
        _write_run(tmp_path, "mlp", s, 0.66)
    claims = report.summarise(tmp_path, _spec(), write=False)["claims"].set_index("other")
    assert claims.loc["vit", "verdict"] == "shown" and claims.loc["vit", "diff_std"] == 0  # comparable: d ≡ 0
    assert claims.loc["skipless-ssa", "verdict"] == "shown" and claims.loc["skipless-ssa", "direction"] == "better"


def test_the_verdict_names_the_holm_family_and_says_worse_where_the_data_do(tmp_path):
    """An equivalence claim whose paired difference is clearly negative: the one-sided claim is not shown,
    the two-sided test says skipless OSA is worse, and the verdict names both Holm families."""
    noise = [0.001, -0.002, 0.002, -0.001]
    for s in range(4):
        _write_run(tmp_path, "skipless-osa", s, 0.85 + noise[s])
        _write_run(tmp_path, "vit", s, 0.861 + noise[s] * 0.8)
        _write_run(tmp_path, "skipless-ssa", s, 0.70 - noise[s])
        _write_run(tmp_path, "mlp", s, 0.70)
    out = report.summarise(tmp_path, _spec(), write=False)
    claims = out["claims"].set_index("other")
    assert claims.loc["vit", "direction"] == "worse" and claims.loc["vit", "p_two_sided_holm"] < 0.05
    assert claims.loc["vit", "p_two_sided"] == pytest.approx(
        sps.ttest_1samp(np.array(noise) * 0.2 - 0.011, 0.0).pvalue, rel=1e-6)
    assert claims.loc["skipless-ssa", "direction"] == "better"
    assert claims.loc["vit", "p_rank"] == pytest.approx(sps.wilcoxon(np.array(noise) * 0.2 - 0.011).pvalue, rel=1e-9)
    text = out["verdict"]
    assert "Holm's correction runs over 3 tests: the 2 claim test(s) and the 1 reverse one-sided test(s)" in text
    assert "a second Holm family of 2 test(s)" in text
    vit_claim = next(x for x in text.splitlines() if "comparable to the skip-connected ViT" in x and x.startswith("* depth"))
    assert "two-sided: `skipless-osa` is **worse** than `vit` (-1.1 points;" in vit_claim
    assert "* Worse (two-sided): `skipless-osa` below `vit` at depth 4 (-1.1 points)" in text


def test_a_claim_on_the_training_loss_compares_decades_paired_by_seed(tmp_path):
    """The study's own claims: `skipless-osa` reaches ≈ 10× lower final training loss than `vit` on every
    seed, so "better in final training loss" is shown, with the difference in decades; and a claim on
    test accuracy beside it is tested in the same Holm family."""
    from osa_lab.studies.depth_study.claims import Claim

    factors = [9.0, 11.0, 10.0, 10.5]
    for s in range(4):
        _write_run(tmp_path, "skipless-osa", s, 0.85, train_loss=1e-3 * (1 + 0.01 * s))
        _write_run(tmp_path, "vit", s, 0.86 + 0.001 * s, train_loss=1e-3 * (1 + 0.01 * s) * factors[s])
        _write_run(tmp_path, "skipless-ssa", s, 0.70)
        _write_run(tmp_path, "mlp", s, 0.70)
    claims = (Claim("skipless-osa", "vit", "superiority", "train_loss"), Claim("vit", "skipless-ssa", "superiority"))
    out = report.summarise(tmp_path, _spec(claims=claims), write=False)
    table = out["claims"].set_index("endpoint")
    loss = table.loc["train_loss"]
    d = np.log10(factors)
    assert loss["preset"] == "skipless-osa" and loss["diff_mean"] == pytest.approx(d.mean(), rel=1e-9)
    assert loss["p"] == pytest.approx(sps.ttest_1samp(d, 0.0, alternative="greater").pvalue, rel=1e-6)
    assert loss["verdict"] == "shown" and table.loc["test_accuracy", "preset"] == "vit"
    text = out["verdict"]
    assert "Holm's correction runs over 4 tests: the 2 claim test(s) and the 2 reverse" in text
    line = next(x for x in text.splitlines() if x.startswith("* depth 4: `skipless-osa` is better than `vit`"))
    assert f"{d.mean():+.2f} decades of training loss" in line and "**shown**" in line


def test_the_trainability_endpoints_come_from_the_curves(tmp_path):
    for s in range(4):
        _write_run(tmp_path, "vit", s, 0.85)
    out = report.summarise(tmp_path, _spec(), write=False)
    runs = out["runs"]
    # the synthetic curve: loss 1/e at step 36 e, e = 1..6 (steps 36 … 216)
    assert runs["train_loss_at_1000"].isna().all() and runs["steps_to_threshold"].isna().all()
    row = out["summary"].set_index("preset").loc["vit"]
    assert row["train_loss_final_median"] == pytest.approx(0.1)
    assert "## Trainability" in out["verdict"]
    assert "* `vit` depth 4: — / — / — / final 0.1; steps to 0.1: not reached" in out["verdict"]


def test_a_choice_beside_a_setting_that_broke_is_at_the_stability_edge():
    rows = [(1e-3, 1.0, "ok"), (3e-3, 1.0, "ok"), (1e-2, 1.0, "diverged"), (3e-3, 10.0, "failed"), (3e-3, 0.1, "ok"),
            (1e-4, 1.0, "ok"), (1e-3, 10.0, "ok")]  # fmt: skip
    t = pd.DataFrame([{"lr": lr, "alpha_lr_mult": am, "status": st} for lr, am, st in rows])
    assert report.unstable_neighbours(t, 3e-3, 1.0) == ["lr 0.01 (diverged)", "α-lr ×10 (failed)"]
    assert report.unstable_neighbours(t, 1e-3, 1.0) == []  # its neighbours at ×1, 1e-4 and 3e-3, are fine
    # at ×10 the neighbour above is (3e-3, ×10); below, ×10 has no lr, so the next lr tried (1e-4) stands in
    assert report.unstable_neighbours(t, 1e-3, 10.0) == ["lr 0.003 (failed)"]
    t.loc[len(t)] = {"lr": 1e-4, "alpha_lr_mult": 1.0, "status": "diverged"}  # one tuning seed of the point broke
    assert report.unstable_neighbours(t, 1e-3, 10.0) == ["lr 1e-4 (diverged)", "lr 0.003 (failed)"]
    assert report.unstable_neighbours(t, 1e-3, 1.0) == ["lr 1e-4 (diverged)"]


def test_a_warm_up_beside_one_that_broke_is_at_the_stability_edge():
    rows = [(3e-3, 1.0, 0.05, "ok"), (3e-3, 1.0, 0.15, "ok"), (3e-3, 1.0, 0.017, "diverged"), (1e-2, 1.0, 0.15, "ok"),
            (1e-3, 1.0, 0.15, "ok")]  # fmt: skip
    t = pd.DataFrame([{"lr": lr, "alpha_lr_mult": am, "warmup_fraction": w, "status": st} for lr, am, w, st in rows])
    assert report.unstable_neighbours(t, 3e-3, 1.0, 0.05) == ["warm-up 0.017 (diverged)"]
    assert report.unstable_neighbours(t, 3e-3, 1.0, 0.15) == []  # its warm-up neighbour below (0.05) is fine


def test_a_run_at_the_default_warm_up_keeps_the_name_of_a_study_that_did_not_tune_it():
    assert run.result_name("tune", "vit", 8, 1000, 1e-3, 1.0) == "tune/vit-d8-lr0.001-am1-s1000.json"
    assert run.result_name("tune", "vit", 8, 1000, 1e-3, 1.0, 0.05) == "tune/vit-d8-lr0.001-am1-s1000.json"
    assert run.result_name("tune", "vit", 8, 1000, 1e-3, 1.0, 0.15) == "tune/vit-d8-lr0.001-am1-wu0.15-s1000.json"


def test_the_driver_tunes_the_warm_up_and_names_its_runs(tmp_path, monkeypatch):
    from osa_lab.studies.depth_study import runner
    from osa_lab.studies.depth_study.records import read_records

    calls = _fake_runs(monkeypatch, lambda lr, warmup: 0.9 - abs(math.log(lr / 3e-3)) / 10 - abs(math.log(warmup / 0.15)) / 10)
    spec = StudySpec(name="t", cells=((("vit",), (2,)),), seeds={2: 2},
                     tuning=TuningSpec(lr=(1e-3, 3e-3, 1e-2), warmup_fraction=(0.05, 0.15)))  # fmt: skip
    chosen = runner.StudyRunner(spec, tmp_path, tmp_path / "ck", runner.GridOptions.in_process(progress=False)).tune("vit", 2)
    assert chosen == (3e-3, 1.0, 0.15)
    record = json.loads((tmp_path / "search" / "vit-d2.json").read_text())
    assert record["axes"] == ["lr", "warmup_fraction"] and record["chosen"] == [3e-3, 1.0, 0.15]
    assert [3e-3, 1.0, 0.45] in record["extension_points"]  # 0.15 was the top edge: bracketed from above
    assert {c["warmup_fraction"] for c in calls} == {0.05, 0.15, 0.45}
    assert read_records(tmp_path).notices == []


def test_a_learning_rate_is_written_with_three_significant_digits(tmp_path):
    """A tuned lr such as 1/3000 reads ``3.33e-4`` in the verdict, never ``0.000333333``."""
    for s in range(2):
        _write_run(tmp_path, "vit", s, 0.85, lr=1 / 3000)
    search = tmp_path / "search" / "vit-d4.json"
    search.write_text(json.dumps({**json.loads(search.read_text()), "chosen": [1 / 3000, 1.0]}))
    text = report.summarise(tmp_path, _spec(), write=False)["verdict"]
    vit = next(line for line in text.splitlines() if line.startswith("* `vit` depth 4"))
    assert "lr 3.33e-4, α-lr ×1, warm-up 0.05;" in vit
    assert not re.search(r"0\.000\d", text)
