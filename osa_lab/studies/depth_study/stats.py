"""Tests of the study's claims: paired one-sided t-tests, TOST equivalence, Holm's correction.

Every claim compares skipless OSA with another preset on the same final seeds (runs of one seed
share the batch order and the data split), so each test is on the per-seed differences
``d = acc(skipless-osa) − acc(other)``:

* **superiority** ("OSA is better"): one-sided paired t-test of H0: mean d ≤ 0;
* **equivalence** ("comparable", margin m): TOST (Schuirmann 1987) — two one-sided tests of
  H0: mean d ≤ −m and H0: mean d ≥ m, p = the larger of the two.

The p-values of every test made — each claim's own test and, for superiority claims, the
reverse test that would refute it — are adjusted together by Holm's step-down method (Holm
1979), which is conservative for the pair.
A claim is *shown* when its adjusted p < α; *refuted* when the opposite is significant at α
(superiority: mean d < 0 by the reverse one-sided test; equivalence: the (1 − 2α) interval lies
wholly outside ±m); otherwise *inconclusive*, with the number of seeds a test of the same power
(80 %) would need if the observed mean and spread were the truth.
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


def one_sided_paired(d: Sequence[float]) -> tuple[float, float]:
    """(p of H0: mean ≤ 0, p of H0: mean ≥ 0) for per-seed differences ``d`` (NaN with < 2 values)."""
    d = np.asarray(d, dtype=float)
    if len(d) < 2 or np.std(d, ddof=1) == 0:
        return math.nan, math.nan
    greater = stats.ttest_1samp(d, 0.0, alternative="greater").pvalue
    less = stats.ttest_1samp(d, 0.0, alternative="less").pvalue
    return float(greater), float(less)


def tost(d: Sequence[float], margin: float) -> float:
    """TOST p-value for |mean d| < ``margin`` (the larger of the two one-sided p-values)."""
    d = np.asarray(d, dtype=float)
    if len(d) < 2 or np.std(d, ddof=1) == 0:
        return math.nan
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


def seeds_needed(mean: float, std: float, *, kind: str, margin: float = 0.0, alpha: float = 0.05,
                 power: float = 0.8) -> float:
    """Seeds a paired test needs for ``power`` if the observed ``mean`` and ``std`` were the truth (normal approximation).

    Superiority: n = ((z₁₋α + z_power) σ / mean)², infinite when mean ≤ 0. Equivalence (TOST):
    n = ((z₁₋α + z_{(1+power)/2}) σ / (margin − |mean|))², infinite when |mean| ≥ margin.
    """  # fmt: skip
    if not (math.isfinite(mean) and math.isfinite(std)) or std == 0:
        return math.nan
    z_a = stats.norm.ppf(1 - alpha)
    if kind == "superiority":
        if mean <= 0:
            return math.inf
        return float(math.ceil(((z_a + stats.norm.ppf(power)) * std / mean) ** 2))
    gap = margin - abs(mean)
    if gap <= 0:
        return math.inf
    return float(math.ceil(((z_a + stats.norm.ppf((1 + power) / 2)) * std / gap) ** 2))
