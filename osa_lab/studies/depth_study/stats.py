"""Tests of the study's claims: paired one-sided t-tests, TOST equivalence, Holm's correction.

Every claim compares its preset with another preset on the same final seeds (runs of one seed
share the batch order and the data split), so each test is on the per-seed differences
``d = value(preset) − value(other)`` of the claim's endpoint, oriented so that larger is better
(test accuracy; or −log10 of the final training loss, in decades):

* **superiority** ("the preset is better"): one-sided paired t-test of H0: mean d ≤ 0;
* **equivalence** ("comparable", margin m): TOST (Schuirmann 1987) — two one-sided tests of
  H0: mean d ≤ −m and H0: mean d ≥ m, p = the larger of the two.

The p-values of every test made — each claim's own test and, for superiority claims, the
reverse test that would refute it — are adjusted together by Holm's step-down method (Holm
1979), which is conservative for the pair.
A claim is *shown* when its adjusted p < α; *refuted* when the opposite is significant at α
(superiority: mean d < 0 by the reverse one-sided test; equivalence: the (1 − 2α) interval lies
wholly outside ±m); otherwise *inconclusive*, with the number of seeds a test of the same power
(80 %) would need if the observed mean and spread were the truth (exact power, noncentral t).

Beside each one-sided claim the report gives the two-sided paired t-test (a difference in either
direction, so "worse" is said where the data say so) and the Wilcoxon signed-rank test (no
normality assumed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (NaN stays NaN and takes no part)."""
    p = np.asarray(p_values, dtype=float)
    idx = [i for i in np.argsort(p) if not math.isnan(p[i])]
    m = len(idx)
    out = np.full(len(p), math.nan)
    running = 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def _no_spread(d: np.ndarray) -> bool:
    """Every per-seed difference is the same: the t statistic is ±∞ (or 0/0 at a zero mean)."""
    return bool(np.std(d, ddof=1) == 0)


def one_sided_paired(d: Sequence[float]) -> tuple[float, float]:
    """(p of H0: mean ≤ 0, p of H0: mean ≥ 0) for per-seed differences ``d`` (NaN with < 2 values).

    With no spread (every difference equal) each p is the t-test's limit: 0 where the mean lies
    strictly on the alternative's side, else 1."""
    d = np.asarray(d, dtype=float)
    if len(d) < 2:
        return math.nan, math.nan
    if _no_spread(d):
        m = float(d.mean())
        return (0.0 if m > 0 else 1.0), (0.0 if m < 0 else 1.0)
    greater = stats.ttest_1samp(d, 0.0, alternative="greater").pvalue
    less = stats.ttest_1samp(d, 0.0, alternative="less").pvalue
    return float(greater), float(less)


def tost(d: Sequence[float], margin: float) -> float:
    """TOST p-value for |mean d| < ``margin`` (the larger of the two one-sided p-values; NaN with
    < 2 values; with no spread the limit: 0 if |mean| < margin, else 1)."""
    d = np.asarray(d, dtype=float)
    if len(d) < 2:
        return math.nan
    if _no_spread(d):
        return 0.0 if abs(float(d.mean())) < margin else 1.0
    p_low = stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    p_high = stats.ttest_1samp(d, margin, alternative="less").pvalue
    return float(max(p_low, p_high))


def mean_interval(d: Sequence[float], level: float) -> tuple[float, float]:
    """Student-t interval of the mean of ``d`` at ``level`` (NaN with < 2 values)."""
    d = np.asarray(d, dtype=float)
    if len(d) < 2:
        return math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, len(d) - 1) * np.std(d, ddof=1) / math.sqrt(len(d))
    return float(d.mean() - half), float(d.mean() + half)


def two_sided_paired(d: Sequence[float]) -> float:
    """Two-sided paired t-test p of H0: mean d = 0 (NaN with < 2 values; with no spread the limit:
    0 for a non-zero mean, else 1)."""
    d = np.asarray(d, dtype=float)
    if len(d) < 2:
        return math.nan
    if _no_spread(d):
        return 0.0 if float(d.mean()) != 0 else 1.0
    return float(stats.ttest_1samp(d, 0.0).pvalue)


def signed_rank(d: Sequence[float], alternative: str = "two-sided") -> float:
    """Wilcoxon signed-rank p for per-seed differences ``d`` (exact where scipy can; NaN with < 2 non-zero values).

    The rank test beside the t-test: it assumes no normality of ``d``, only symmetry about its median.
    """
    d = np.asarray(d, dtype=float)
    if np.count_nonzero(d) < 2:
        return math.nan
    return float(stats.wilcoxon(d, alternative=alternative).pvalue)


def superiority_power(n: int, effect: float, alpha: float = 0.05) -> float:
    """Exact power of the one-sided one-sample (paired) t-test at level ``alpha`` with ``n`` seeds.

    ``effect`` is the standardised mean difference δ = μ/σ; the statistic T = x̄/(s/√n) follows a
    noncentral t distribution with n − 1 degrees of freedom and noncentrality δ√n, so the power is
    P(T > t₁₋α,ₙ₋₁) = 1 − F_nct(t₁₋α,ₙ₋₁; n − 1, δ√n).
    """
    if n < 2:
        return math.nan
    t_crit = stats.t.ppf(1 - alpha, n - 1)
    return float(stats.nct.sf(t_crit, n - 1, effect * math.sqrt(n)))


def equivalence_power(n: int, mean: float, std: float, margin: float, alpha: float = 0.05) -> float:
    """Power of TOST (margin ±``margin``, each one-sided test at ``alpha``) with ``n`` seeds.

    With T₁ = (x̄ + m)/(s/√n) ~ nct(n − 1, (μ + m)√n/σ) and T₂ = (x̄ − m)/(s/√n) ~ nct(n − 1, (μ − m)√n/σ),
    TOST rejects when T₁ > t₁₋α and T₂ < −t₁₋α; the power is taken as
    P(T₁ > t₁₋α) + P(T₂ < −t₁₋α) − 1 (Bonferroni's inequality: a lower bound of the exact
    bivariate probability, and close to it when the power is high), floored at 0.
    """
    if n < 2:
        return math.nan
    t_crit = stats.t.ppf(1 - alpha, n - 1)
    root_n = math.sqrt(n)
    upper = stats.nct.sf(t_crit, n - 1, (mean + margin) * root_n / std)
    lower = stats.nct.cdf(-t_crit, n - 1, (mean - margin) * root_n / std)
    return float(max(0.0, upper + lower - 1.0))


#: the most seeds :func:`seeds_needed` searches before it answers "more than this"
MAX_SEEDS_SEARCHED = 100_000


def seeds_needed(mean: float, std: float, *, kind: str, margin: float = 0.0, alpha: float = 0.05,
                 power: float = 0.8) -> float:
    """The fewest seeds whose paired test reaches ``power`` if the observed ``mean`` and ``std`` were the truth.

    Exact power by the noncentral t distribution (:func:`superiority_power`,
    :func:`equivalence_power`), not the normal approximation, which underestimates at few seeds
    (a 2σ effect: the normal formula says 2 seeds, the t-test needs 4). Infinite when no number of
    seeds would do (superiority with mean ≤ 0; equivalence with |mean| ≥ margin) or more than
    :data:`MAX_SEEDS_SEARCHED` would be needed.
    """  # fmt: skip
    if not (math.isfinite(mean) and math.isfinite(std)) or std == 0:
        return math.nan
    if kind == "superiority":
        if mean <= 0:
            return math.inf

        def reaches(n: int) -> bool:
            return superiority_power(n, mean / std, alpha) >= power
    else:
        if abs(mean) >= margin:
            return math.inf

        def reaches(n: int) -> bool:
            return equivalence_power(n, mean, std, margin, alpha) >= power

    # power rises with n: double to an upper bound, then bisect
    high = 2
    while not reaches(high):
        if high > MAX_SEEDS_SEARCHED:
            return math.inf
        high *= 2
    low = max(2, high // 2)
    if reaches(low):
        return float(low)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if reaches(mid) else (mid, high)
    return float(high)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial (Clopper–Pearson 1934) interval of a rate with ``k`` events in ``n`` trials (NaN for n = 0)."""
    if n == 0:
        return math.nan, math.nan
    tail = (1 - level) / 2
    low = 0.0 if k == 0 else float(stats.beta.ppf(tail, k, n - k + 1))
    high = 1.0 if k == n else float(stats.beta.ppf(1 - tail, k + 1, n - k))
    return low, high
