"""Headline numbers of the depth analyses, as tidy tables for the reports (notebooks 2 and 3).

docs/analysis.md lists facts the analysis must reproduce: a pure softmax-attention stack loses rank
doubly exponentially with depth (Dong et al. 2021) while skip connections prevent it, and a
pure OSA stack keeps every singular value of its input. These helpers reduce the tidy tables
of :mod:`osa_lab.studies.depth` and :mod:`osa_lab.studies.jacobian` to the few numbers a reader checks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from osa_lab.errors import OSAInputError


def listing(items: Iterable[object], word: str = "and") -> str:
    """``a``, ``a and b``, ``a, b and c`` (``word`` in place of "and"): the one list of the reports and
    the study verdict."""
    items = [str(i) for i in items]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + f" {word} " + items[-1]


def number(x: float, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits, as ``1.23e4`` outside 1e-3…1e4 (``3.33e-4``, not
    ``0.000333333``): the one number format of the reports, the study verdict and its progress lines."""
    x = float(x)
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if x != 0 and (abs(x) >= 1e4 or abs(x) < 1e-3):
        mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
        if "." in mantissa:
            mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exponent)}"
    return f"{x:.{digits}g}"


def _require(df: pd.DataFrame, columns: list[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise OSAInputError(f"{what} lacks columns {missing}; it has {list(df.columns)}")


def _block_site(df: pd.DataFrame) -> pd.DataFrame:
    if "site" in df.columns and (df["site"] == "block").any():
        return df[df["site"] == "block"]
    return df


def collapse_table(metrics: pd.DataFrame, metric: str = "relative_residual") -> pd.DataFrame:
    """``metric`` at the input and at the last layer per preset (mean over seeds) and their ratio.

    Columns ``preset, depth, input, last, ratio`` (``ratio = last / input``); a ratio far below 1
    for ``relative_residual`` means the tokens have collapsed to their mean (rank collapse).
    """
    _require(metrics, ["preset", "depth", "seed", "layer", "metric", "value"], "metrics table")
    df = _block_site(metrics[metrics["metric"] == metric])
    if df.empty:
        raise OSAInputError(f"no rows for metric {metric!r}; metrics present: {sorted(metrics['metric'].unique())}")
    df = df[df["depth"] == df["depth"].max()]
    rows = []
    for preset, g in df.groupby("preset", sort=False):
        last_layer = g["layer"].max()
        first = g[g["layer"] == 0]["value"].mean()
        last = g[g["layer"] == last_layer]["value"].mean()
        rows.append(
            {"preset": preset, "depth": int(last_layer), "input": first, "last": last, "ratio": last / first if first else np.nan}
        )
    return pd.DataFrame(rows)


def spectrum_drift(spectra: pd.DataFrame) -> pd.DataFrame:
    """Largest relative change of any singular value between the input and each preset's last layer.

    ``max_i |σ_i(X_L) − σ_i(X_0)| / σ_1(X_0)`` per preset and seed, then the maximum over seeds
    (columns ``preset, depth, max_relative_change``): zero to rounding for a pure OSA stack
    with orthogonal value and output maps, which applies an orthogonal map on the token side and
    an orthogonal one on the feature side.
    """
    _require(spectra, ["preset", "depth", "seed", "layer", "index", "sigma"], "spectra table")
    df = _block_site(spectra)
    df = df[df["depth"] == df["depth"].max()]
    rows = []
    for preset, g in df.groupby("preset", sort=False):
        last_layer = g["layer"].max()
        worst = 0.0
        for _, s in g.groupby("seed"):
            first = s[s["layer"] == 0].sort_values("index")["sigma"].to_numpy()
            last = s[s["layer"] == last_layer].sort_values("index")["sigma"].to_numpy()
            k = min(len(first), len(last))
            if k == 0 or first[0] == 0:
                continue
            worst = max(worst, float(np.max(np.abs(last[:k] - first[:k])) / first[0]))
        rows.append({"preset": preset, "depth": int(last_layer), "max_relative_change": worst})
    return pd.DataFrame(rows)


def jacobian_sweep(
    presets: list[str],
    depth: int,
    tokens: int,
    dim: int,
    seeds: int | list[int] = 2,
    *,
    histogram_seed: int = 0,
    algorithm: str = "auto",
    progress: bool | Callable = False,
    should_stop: Callable[[], bool] | None = None,
    max_input_dim: int | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """κ across depth for several presets and seeds, and the last layer's Jacobian singular values.

    Thin loop over :func:`osa_lab.studies.jacobian.jacobian_depth_profile` (both scopes: end-to-end
    ``∂X_l/∂X_0`` and each block alone) and :func:`osa_lab.studies.jacobian.jacobian_singular_values`
    (end-to-end Jacobian of the whole network, seed ``histogram_seed``). Returns
    ``(kappa_table, singular_values)`` in that module's schemas. ``progress`` (True for tqdm
    bars, or a callback receiving :class:`osa_lab.studies.jacobian.JacobianProgress` for each call),
    ``should_stop`` (cancel hook), ``max_input_dim`` and the Jacobian ``algorithm`` are passed to
    every call.
    """
    from osa_lab.studies import jacobian

    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    hooks = dict(progress=progress, should_stop=should_stop, max_input_dim=max_input_dim)
    kappa = pd.concat(
        [
            jacobian.jacobian_depth_profile(p, depth, tokens, dim, seed=s, algorithm=algorithm, **hooks)
            for p in presets
            for s in seed_list
        ],
        ignore_index=True,
    )
    sigmas = pd.concat(
        [
            jacobian.jacobian_singular_values(p, depth, tokens, dim, seed=histogram_seed, algorithm=algorithm, **hooks)
            for p in presets
        ],
        ignore_index=True,
    )
    return kappa, sigmas


def _geometric_mean(values: pd.Series) -> float:
    """Geometric mean of the resolved values (NaN = a matrix-free σ_min that did not converge)."""
    v = values.to_numpy(dtype=float)
    v = v[~np.isnan(v)]
    return float(np.exp(np.log(v).mean())) if v.size else float("nan")


def kappa_table(kappa: pd.DataFrame) -> pd.DataFrame:
    """κ of the end-to-end Jacobian at the first and the last layer per preset (geometric mean over seeds).

    Unresolved κ (NaN: the matrix-free solver did not converge) are left out of the means and
    counted in ``unresolved``; a mean over none is NaN. ``beyond_float64`` counts the values at
    the last layer at or above :data:`KAPPA_RESOLVED` (≈ 4.5e15) or infinite: σ_min is rounding
    noise there, so such a κ says only "numerically singular", not how large it is.
    """
    _require(kappa, ["preset", "layer", "scope", "kappa"], "Jacobian profile")
    df = kappa[kappa["scope"] == "end_to_end"] if "scope" in kappa.columns else kappa
    rows = []
    for preset, g in df.groupby("preset", sort=False):
        first, last = g["layer"].min(), g["layer"].max()
        ends = g[g["layer"].isin([first, last])]
        rows.append(
            {
                "preset": preset,
                "kappa_first_layer": _geometric_mean(g[g["layer"] == first]["kappa"]),
                "kappa_last_layer": _geometric_mean(g[g["layer"] == last]["kappa"]),
                "last_layer": int(last),
                "unresolved": int(ends["kappa"].isna().sum()),
                "beyond_float64": int((g[g["layer"] == last]["kappa"] >= KAPPA_RESOLVED).sum()),
            }
        )
    return pd.DataFrame(rows)


#: κ of a float64 matrix is resolved only up to about 1/ε ≈ 4.5e15; larger values are noise.
KAPPA_RESOLVED = 1.0 / float(np.finfo(np.float64).eps)


def cap_condition_numbers(metrics: pd.DataFrame, cap: float = KAPPA_RESOLVED) -> pd.DataFrame:
    """Copy of a metrics table with ``condition_number`` values above ``cap`` (and ∞) set to ``cap``.

    A collapsed hidden state has σ_min at rounding level, so its computed κ is anywhere from
    1e16 to ∞ (or 1e278: the smallest σ of a rank-one float64 matrix is noise). Those values
    carry one fact — "beyond what float64 resolves" — and capping them keeps log axes readable.
    """
    _require(metrics, ["metric", "value"], "metrics table")
    out = metrics.copy()
    rows = out["metric"] == "condition_number"
    out.loc[rows, "value"] = out.loc[rows, "value"].clip(upper=cap).fillna(cap)
    return out
