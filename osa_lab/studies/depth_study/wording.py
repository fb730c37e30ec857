"""The verdict's wording of failures, trainability, claims and tuning edges (:func:`.report.verdict_text`)."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import numpy as np
import pandas as pd

from osa_lab.studies.depth_study.claims import Claim, difference_words, interval_words
from osa_lab.studies.depth_study.spec import StudySpec
from osa_lab.studies.depth_study.tuning_checks import AXIS_LABELS
from osa_lab.studies.summaries import number
from osa_lab.studies.training.config import DEFAULT_WARMUP_FRACTION

#: steps at which a run's training loss is read (a primary endpoint of trainability) and the training
#: loss whose first crossing is the other (the curve's losses are epoch means)
LOSS_STEPS: tuple[int, ...] = (1000, 3000, 6000)
TRAIN_LOSS_THRESHOLD = 0.1



def holm_family(claims: int, reverse: int) -> str:
    """The family Holm's correction runs over, in words (the verdict names it)."""
    return (f"{claims + reverse} tests: the {claims} claim test(s) and the {reverse} reverse one-sided test(s) "
            "that would refute a superiority claim")  # fmt: skip


def failure_words(r) -> str:
    """A cell's failed and diverged runs with the exact interval of the failure rate."""
    bad = r.failed + r.diverged
    if r.finished == 0:
        return "no run finished"
    interval = f"failure rate 95 % CI [{r.failure_rate_low * 100:.0f}, {r.failure_rate_high * 100:.0f}] %"
    return f"{r.failed} failed, {r.diverged} diverged; {interval}" if bad else f"none failed or diverged; {interval}"


def _direction_words(r) -> str:
    """The two-sided test of a claim's paired difference, in words ("worse" where the data say so)."""
    p = f"p = {r.p_two_sided:.3g}, Holm p = {r.p_two_sided_holm:.3g}"
    if r.direction == "worse":
        return f"`{r.preset}` is **worse** than `{r.other}` ({difference_words(r.endpoint, r.diff_mean)}; {p})"
    if r.direction == "better":
        return f"`{r.preset}` is better than `{r.other}` ({difference_words(r.endpoint, r.diff_mean)}; {p})"
    return f"no difference shown ({p})"


def trainability_lines(summary: pd.DataFrame) -> list[str]:
    """The primary endpoints of trainability per cell: median training loss at fixed steps and at the end,
    and the median step at which the training loss first reached :data:`TRAIN_LOSS_THRESHOLD`."""
    def loss(v: float) -> str:
        return f"{v:.3g}" if math.isfinite(v) else "—"

    steps = ", ".join(f"{s:,}" for s in LOSS_STEPS)
    lines = [f"## Trainability: median training loss of the runs that did not diverge, at steps {steps} and at the end; "
             f"steps to a training loss of {TRAIN_LOSS_THRESHOLD:g}", "",
             "Losses are epoch means: \"at step s\" is the mean over the first epoch whose end reaches s, "
             "and the steps to the threshold end the first epoch whose mean reached it.", ""]  # fmt: skip
    for r in summary.itertuples():
        if r.finished == 0:
            continue
        ok = r.finished - r.diverged
        at = " / ".join(loss(getattr(r, f"train_loss_at_{s}_median")) for s in LOSS_STEPS)
        reached = (f"{r.steps_to_threshold_median:.0f}" if math.isfinite(r.steps_to_threshold_median) else "not reached")
        if 0 < r.reached_threshold < ok:
            reached += f" (median of the {r.reached_threshold} of {ok} runs that reached it)"
        lines.append(f"* `{r.preset}` depth {r.depth}: {at} / final {loss(r.train_loss_final_median)}; steps to "
                     f"{TRAIN_LOSS_THRESHOLD:g}: {reached}")  # fmt: skip
    return lines


def _past(points: pd.DataFrame, axis: str, value: float, side: int) -> pd.Series:
    """Rows of ``points`` whose ``axis`` lies beyond ``value`` on ``side`` (+1 above, −1 below)."""
    return points[axis] > value * (1 + 1e-9) if side > 0 else points[axis] < value * (1 - 1e-9)


def unstable_neighbours(tuning: pd.DataFrame, lr: float, alpha_lr_mult: float,
                        warmup_fraction: float = DEFAULT_WARMUP_FRACTION) -> list[str]:  # fmt: skip
    """The grid neighbours of a cell's chosen setting at which some tuning run failed or diverged.

    Neighbours are the adjacent values tried along each axis (learning rate, α-lr multiplier,
    warm-up) with the other two at the chosen setting. The search's grid need not be a full
    rectangle: where the chosen setting has no learning rate on one side, the next learning rate
    tried on that side at any multiplier and warm-up stands in. A setting beside one that broke
    sits at the stability edge: a small change of budget or seed may break it.
    """
    def broke(points: pd.DataFrame) -> list[str]:
        return sorted(set(points.loc[points["status"] != "ok", "status"]))

    if "warmup_fraction" not in tuning:
        tuning = tuning.assign(warmup_fraction=DEFAULT_WARMUP_FRACTION)
    chosen = {"lr": lr, "alpha_lr_mult": alpha_lr_mult, "warmup_fraction": warmup_fraction}
    out = []
    for axis in chosen:
        line = tuning[np.logical_and.reduce([np.isclose(tuning[a], v) for a, v in chosen.items() if a != axis])]
        fallback = tuning if axis == "lr" else None
        for side in (-1, 1):
            beyond = _past(line, axis, chosen[axis], side)
            pool = line if beyond.any() or fallback is None else fallback
            beyond = _past(pool, axis, chosen[axis], side)
            if not beyond.any():
                continue
            nearest = pool.loc[beyond, axis].min() if side > 0 else pool.loc[beyond, axis].max()
            bad = broke(pool[np.isclose(pool[axis], nearest)])
            if bad:
                out.append(f"{AXIS_LABELS[axis].format(number(nearest))} ({' and '.join(bad)})")
    return out


def _margin_words(spec: StudySpec, endpoint: str) -> str:
    if endpoint == "train_loss":
        return f"{spec.log_loss_margin:g} decades of training loss"
    return f"{spec.equivalence_margin * 100:.0f} points"


def untuned_words(claim_row: Any, untuned: Collection[tuple[str, int]]) -> str:
    """"; `P` at an untuned setting" for each preset of a claim whose cell chose its setting by fewest
    failures (no setting trained on every tuning seed); "" otherwise."""
    names = [p for p in (claim_row.preset, claim_row.other) if (p, int(claim_row.depth)) in untuned]
    return "".join(f"; `{p}` at an untuned setting (no setting trained on every tuning seed)" for p in names)


def claims_lines(claims: pd.DataFrame, spec: StudySpec, testable: list[tuple[Claim, int]],
                 untuned: Collection[tuple[str, int]] = ()) -> list[str]:  # fmt: skip
    """The verdict's claims section: the Holm families named, then one line per claim with its tests
    (and, where a cell ran at an untuned setting, :func:`untuned_words`)."""
    lines: list[str] = []
    tested = claims[claims["verdict"] != "waiting"] if len(claims) else claims
    family = holm_family(len(tested), int(tested["p_reverse"].notna().sum()) if len(tested) else 0)
    lines += ["", "## Claims (paired per-seed differences, the claim's preset − the other, oriented so that positive "
              "favours the claim's preset; a claim is tested once both its cells are complete)", "", f"Holm's correction runs over {family}. The two-sided t-tests (a difference in "
              f"either direction) are a second Holm family of {len(tested)} test(s); the Wilcoxon signed-rank p "
              "(one-sided like its claim, two-sided for equivalence) is given beside, unadjusted.", ""]  # fmt: skip
    if not testable:
        pairs = ", ".join(f"`{c.preset}` with `{c.other}`" for c in spec.claims)
        lines.append(f"* this study tests no claim: no depth runs both presets of a claim ({pairs}); the tables "
                     "above are descriptive only")  # fmt: skip
    elif claims.empty:
        lines.append("* no claim has two paired seeds yet")
    start = len(lines)
    for r in claims.itertuples():
        if r.verdict == "waiting":
            lines.append(f"* depth {r.depth}: {r.claim}: **waiting** for its cells' {r.planned} planned seeds "
                         f"(untested; paired difference so far {difference_words(r.endpoint, r.diff_mean)} over {r.n} "
                         "seeds)")  # fmt: skip
            continue
        if r.verdict == "untestable":
            lines.append(f"* depth {r.depth}: {r.claim}: **untestable** ({r.n} of {r.planned} seeds paired: the others "
                         "diverged in one preset or both; it stays in both Holm families at p = 1, and the cells' "
                         "failure rates above compare them)")  # fmt: skip
            continue
        extra = "" if not math.isfinite(r.seeds_needed) else f"; ≈ {r.seeds_needed:.0f} seeds would be needed"
        if r.verdict == "inconclusive" and math.isinf(r.seeds_needed):
            extra = "; no number of seeds would show it if the observed mean were the truth"
        margin = f" (±{_margin_words(spec, r.endpoint)})" if r.kind == "equivalence" else ""
        lines.append(f"* depth {r.depth}: {r.claim}{margin}: **{r.verdict}** ({difference_words(r.endpoint, r.diff_mean)}, "
                     f"{r.ci_level * 100:.0f} % CI [{interval_words(r.endpoint, r.ci_low, r.ci_high)}], n = {r.n}, "
                     f"p = {r.p:.3g}, Holm p = {r.p_holm:.3g}{extra}; signed-rank p = {r.p_rank:.3g}); "
                     f"two-sided: {_direction_words(r)}")  # fmt: skip
    # the loop wrote one line per claim row, in order
    lines[start:] = [line + untuned_words(r, untuned) for line, r in zip(lines[start:], claims.itertuples(), strict=True)]
    return lines
