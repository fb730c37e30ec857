"""The claims a study tests: which preset against which, how, and on which endpoint.

A claim is a paired comparison of two presets at each depth both run, seed by seed (the same
final seeds train both). ``kind`` is ``"equivalence"`` (TOST within a margin: "comparable") or
``"superiority"`` (one-sided paired t-test, with the reverse test that would refute it). The
endpoint is what is compared, oriented so that a positive difference favours ``preset``:

* ``test_accuracy``: test accuracy of the final checkpoint, ``preset − other`` (the depth
  study's endpoint; margin: the study's ``equivalence_margin``);
* ``train_loss``: the final training loss in decades, ``log10(other) − log10(preset)`` (trainability
  apart from generalisation; losses below 1e-12 count as 1e-12; margin: ``log_loss_margin``
  decades). Failed runs are paired at the value they reached, diverged runs have none.

:func:`claims_table` tests them with Holm's correction over every claim tested together with
the reverse one-sided tests (the verdict names this family), the two-sided tests as a second
family, and the Wilcoxon signed-rank test beside (:mod:`.stats`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from osa_lab.studies.depth_study import stats
from osa_lab.studies.depth_study.schema import Choice, Context, ListOf, check_mapping, refuse

#: a :class:`~osa_lab.studies.depth_study.spec.StudySpec` (the spec module imports this one)
StudySpec = Any

KINDS = ("equivalence", "superiority")
ENDPOINTS = ("test_accuracy", "train_loss")
#: training losses below this count as this (a loss of exactly 0 has no logarithm)
LOSS_FLOOR = 1e-12

#: the columns of a claim's row before the corrections (the rest are added by :func:`claims_table`)
TEST_COLUMNS = ["claim", "preset", "other", "endpoint", "kind", "depth", "n", "diff_mean", "diff_std", "ci_low",
                "ci_high", "ci_level", "p", "p_reverse", "p_two_sided", "p_rank", "planned"]  # fmt: skip
CLAIM_COLUMNS = [*TEST_COLUMNS, "p_holm", "p_reverse_holm", "p_two_sided_holm", "direction", "verdict", "seeds_needed"]


@dataclass(frozen=True)
class Claim:
    """``preset`` is comparable to (``equivalence``) or better than (``superiority``) ``other`` on ``endpoint``."""

    preset: str
    other: str
    kind: str
    endpoint: str = "test_accuracy"
    text: str = ""

    @property
    def statement(self) -> str:
        """The claim in words (its ``text``, else made from its fields)."""
        if self.text:
            return self.text
        what = "test accuracy" if self.endpoint == "test_accuracy" else "final training loss"
        verb = "is comparable to" if self.kind == "equivalence" else "is better than"
        return f"`{self.preset}` {verb} `{self.other}` in {what}"


#: the depth study's claims (the paper's, on test accuracy): what a study that names none tests
DEFAULT_CLAIMS: tuple[Claim, ...] = (
    Claim("skipless-osa", "vit", "equivalence", text="skipless OSA is comparable to the skip-connected ViT"),
    Claim("skipless-osa", "skipless-ssa", "superiority", text="skipless OSA is better than skipless softmax attention"),
    Claim("skipless-osa", "ssa-cutting-skip", "superiority",
          text="skipless OSA is better than Cutting-the-Skip softmax attention"),
    Claim("skipless-osa", "skipless-osa-alpha0", "superiority", text="learned token mixing helps skipless OSA (vs α ≡ 0)"),
)  # fmt: skip


def _presets() -> list[str]:
    from osa_lab.nn.presets import preset_names

    return preset_names(training=True)


def _statement(value: Any, where: str) -> str:
    if not isinstance(value, str) or "\n" in value or len(value) > 200:
        raise refuse(where, "must be one line of text (at most 200 characters)", "write the claim in a short sentence")
    return value


@dataclass(frozen=True)
class Claims:
    """``[{preset, other, kind, endpoint, text}, …]``: the claims the study tests (schema check)."""

    def __call__(self, value: Any, where: str, ctx: Context) -> tuple[Claim, ...]:
        if isinstance(value, tuple) and all(isinstance(c, Claim) for c in value):
            return value
        out = []
        for i, item in enumerate(ListOf(lambda v, w, c: v, 1, 64)(value, where, ctx)):
            here = f"{where}[{i}]"
            item = check_mapping(item, here)
            unknown = sorted(set(item) - {"preset", "other", "kind", "endpoint", "text"})
            if unknown:
                raise refuse(here, f"has unknown key {unknown[0]!r}", "a claim has preset, other, kind, endpoint, text")
            for key in ("preset", "other", "kind"):
                if key not in item:
                    raise refuse(here, f"has no `{key}`", "write {preset: skipless-osa, other: vit, kind: equivalence}")
            claim = Claim(Choice(_presets, "preset")(item["preset"], f"{here}.preset", ctx),
                          Choice(_presets, "preset")(item["other"], f"{here}.other", ctx),
                          Choice(lambda: KINDS, "kind")(item["kind"], f"{here}.kind", ctx),
                          Choice(lambda: ENDPOINTS, "endpoint")(item.get("endpoint", "test_accuracy"), f"{here}.endpoint", ctx),
                          _statement(item.get("text", ""), f"{here}.text"))  # fmt: skip
            if claim.preset == claim.other:
                raise refuse(here, f"compares `{claim.preset}` with itself", "name two different presets")
            out.append(claim)
        return tuple(out)

    def describe(self) -> str:
        return "list of {preset, other, kind (equivalence or superiority), endpoint (test_accuracy or train_loss), text}"


def endpoint_values(runs: pd.DataFrame, endpoint: str) -> pd.DataFrame:
    """``(depth, seed) × preset`` values of ``endpoint`` of the runs that did not diverge, oriented so
    that higher favours the preset (the negated log10 of the training loss)."""
    ok = runs[runs["status"] != "diverged"].copy()  # failed runs are paired at the value they reached
    if endpoint == "train_loss":
        ok["value"] = -np.log10(np.maximum(ok["train_loss"].to_numpy(dtype=float), LOSS_FLOOR))
    else:
        ok["value"] = ok[endpoint].to_numpy(dtype=float)
    return ok.pivot_table(index=["depth", "seed"], columns="preset", values="value")


def margin_of(spec: StudySpec, claim: Claim) -> float:
    """The equivalence margin of ``claim``, in its endpoint's units."""
    return spec.log_loss_margin if claim.endpoint == "train_loss" else spec.equivalence_margin


def difference_words(endpoint: str, d: float) -> str:
    """A paired difference in its endpoint's units: ``+1.2 points`` or ``+0.35 decades of training loss``."""
    if endpoint == "train_loss":
        return f"{d:+.2f} decades of training loss"
    return f"{d * 100:+.1f} points"


def interval_words(endpoint: str, low: float, high: float) -> str:
    """An interval of a paired difference in its endpoint's units, without the unit: ``-1.1, +0.4``."""
    if endpoint == "train_loss":
        return f"{low:+.2f}, {high:+.2f}"
    return f"{low * 100:+.1f}, {high * 100:+.1f}"


def testable_claims(spec: StudySpec) -> list[tuple[Claim, int]]:
    """(claim, depth) of every claim the study's cells can test: both presets run at that depth."""
    at = set(spec.run_order())
    depths = sorted({d for _, d in at})
    return [(c, d) for c in spec.claims for d in depths if {(c.preset, d), (c.other, d)} <= at]


def _test_row(claim: Claim, depth: int, d: np.ndarray, planned: int, waiting: bool, margin: float, alpha: float) -> dict:
    m = float(d.mean()) if len(d) else math.nan
    s = float(d.std(ddof=1)) if len(d) > 1 else math.nan
    row = {"claim": claim.statement, "preset": claim.preset, "other": claim.other, "endpoint": claim.endpoint,
           "kind": claim.kind, "depth": depth, "n": len(d), "diff_mean": m, "diff_std": s, "planned": planned}  # fmt: skip
    if waiting:
        return {**row, "ci_low": math.nan, "ci_high": math.nan, "ci_level": math.nan, "p": math.nan,
                "p_reverse": math.nan, "p_two_sided": math.nan, "p_rank": math.nan}  # fmt: skip
    if len(d) < 2:  # untestable: it stays in the Holm families at p = 1 rather than shrinking them
        return {**row, "ci_low": math.nan, "ci_high": math.nan, "ci_level": math.nan, "p": 1.0,
                "p_reverse": 1.0 if claim.kind == "superiority" else math.nan, "p_two_sided": 1.0,
                "p_rank": math.nan}  # fmt: skip
    if claim.kind == "equivalence":
        p, p_rev = stats.tost(d, margin), math.nan
        (lo, hi), level = stats.mean_interval(d, 1 - 2 * alpha), 1 - 2 * alpha
    else:
        p, p_rev = stats.one_sided_paired(d)
        (lo, hi), level = stats.mean_interval(d, 0.95), 0.95
    return {**row, "ci_low": lo, "ci_high": hi, "ci_level": level, "p": p, "p_reverse": p_rev,
            "p_two_sided": stats.two_sided_paired(d),
            "p_rank": stats.signed_rank(d, "greater" if claim.kind == "superiority" else "two-sided")}  # fmt: skip


def claims_table(runs: pd.DataFrame, spec: StudySpec, alpha: float = 0.05) -> pd.DataFrame:
    """Every claim × depth both of whose cells ran: mean difference, interval, p, Holm-adjusted p, verdict.

    A claim is tested only once both of its cells have all their planned final runs: until then
    its row has the verdict ``"waiting"`` (listed once it has ≥ 2 paired seeds), the paired
    difference so far and no p (a "shown" from two of four seeds would be a look at the data
    before the planned sample is in). Holm runs over the tested claims and their reverse
    one-sided tests. A finished claim with fewer than 2 seeds that did not diverge in both
    presets is ``"untestable"`` and stays in both Holm families at p = 1, so that divergences
    never shrink a family and make the other claims easier to show.
    """
    finished = runs.groupby(["preset", "depth"]).size()
    values = {e: endpoint_values(runs, e) for e in {c.endpoint for c in spec.claims}}
    rows = []
    for depth in sorted({d for _, ds in spec.cells for d in ds}):
        planned = len(spec.final_seeds(depth))
        for claim in spec.claims:
            table = values[claim.endpoint]
            if depth not in table.index.get_level_values(0):
                continue
            at = table.loc[depth]
            if claim.preset not in at or claim.other not in at:
                continue
            d = (at[claim.preset] - at[claim.other]).dropna().to_numpy(dtype=float)
            waiting = min(finished.get((claim.preset, depth), 0), finished.get((claim.other, depth), 0)) < planned
            if len(d) < 2 and (waiting or planned < 2):  # untestable by the plan itself: not listed
                continue
            rows.append(_test_row(claim, depth, d, planned, waiting, margin_of(spec, claim), alpha))
    df = pd.DataFrame(rows, columns=TEST_COLUMNS)
    if df.empty:  # no claim has two paired seeds (or the study's cells test none): the columns still exist
        return pd.DataFrame(columns=CLAIM_COLUMNS)
    return _corrected(df, spec, alpha)


def _corrected(df: pd.DataFrame, spec: StudySpec, alpha: float) -> pd.DataFrame:
    """Holm's corrections, the two-sided direction, each claim's verdict and the seeds it would need."""
    tested = df["p"].notna()
    adjusted = stats.holm(list(df.loc[tested, "p"]) + list(df.loc[tested, "p_reverse"].dropna()))
    n_tested = int(tested.sum())
    family = len(adjusted)  # the claim tests and their reverse tests: Holm's first step is at alpha / family
    holm, rev = iter(adjusted[:n_tested]), iter(adjusted[n_tested:])
    df["p_holm"] = [next(holm) if t else math.nan for t in tested]
    df["p_reverse_holm"] = [next(rev) if t and not math.isnan(v) else math.nan for t, v in zip(tested, df["p_reverse"], strict=True)]
    # the two-sided tests are a family of their own: a difference in either direction, whatever the claim
    two_sided = iter(stats.holm(list(df.loc[tested, "p_two_sided"])))
    df["p_two_sided_holm"] = [next(two_sided) if t else math.nan for t in tested]
    df["direction"] = [
        "waiting" if not t else "untestable" if n < 2 else ("better" if m > 0 else "worse") if p2 < alpha
        else "no difference shown"
        for t, n, m, p2 in zip(tested, df["n"], df["diff_mean"], df["p_two_sided_holm"], strict=True)
    ]  # fmt: skip
    margins = {c.endpoint: margin_of(spec, c) for c in spec.claims}
    verdicts, needed = [], []
    for _, r in df.iterrows():
        margin = margins[r["endpoint"]]
        if math.isnan(r["p"]):
            verdicts.append("waiting")
        elif r["n"] < 2:
            verdicts.append("untestable")
        elif r["p_holm"] < alpha:
            verdicts.append("shown")
        elif r["kind"] == "equivalence" and (r["ci_low"] > margin or r["ci_high"] < -margin):
            verdicts.append("refuted")
        elif r["kind"] == "superiority" and r["p_reverse_holm"] < alpha:
            verdicts.append("refuted")
        else:
            verdicts.append("inconclusive")
        needed.append(stats.seeds_needed(r["diff_mean"], r["diff_std"], kind=r["kind"], margin=margin,
                                         alpha=alpha / family) if verdicts[-1] == "inconclusive" else math.nan)  # fmt: skip
    df["verdict"], df["seeds_needed"] = verdicts, needed
    return df
