"""Accuracy and cost of the OSA computation methods: the tidy tables behind report notebook 1.

* :func:`accuracy_table` — relative error of ``osa(q, k, v, α, method=…)`` against an
  independent float64 reference (``scipy.linalg.expm``), and the orthogonality error
  ``max |AᵀA − I|`` of the matrix each method applies, over N, α, dtype and seeds.
* :func:`timing_table` — median wall time against N of dense OSA (``torch.linalg.matrix_exp``
  of the N×N matrix, O(N³)), low-rank OSA (O(N r²), docs/design.md §2) and softmax attention
  (``F.scaled_dot_product_attention``, O(N² r)).
* :func:`fit_slopes` — least-squares slope of log time against log N per method
  (expected ≈ 3, ≈ 1 and ≈ 2 once N is large enough for the leading term to dominate).

All three return long-format ``pandas.DataFrame`` rows keyed by every parameter (docs/design.md §6).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
import scipy.linalg
import torch
import torch.nn.functional as F

from osa_lab.benchmarking.timing import time_call
from osa_lab.errors import OSAInputError, unknown_name
from osa_lab.ops.expm import orthogonality_error, skew_symmetric_from_qk
from osa_lab.ops.functional import OSA_METHODS, osa

#: dtype names accepted by the study.
DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
}

#: Methods :func:`timing_table` knows, with the exponent of N in their cost.
TIMED_METHODS: dict[str, int] = {"dense": 3, "lowrank": 1, "sdpa": 2}


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise unknown_name("dtype", name, list(DTYPES))
    return DTYPES[name]


def _check_positive_ints(name: str, values: Iterable[int]) -> list[int]:
    out = list(values)
    if not out or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in out):
        raise OSAInputError(f"`{name}` must be a non-empty list of positive ints, got {out!r}")
    return out


def _inputs(n: int, r: int, dv: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(n, r, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(n, dv, generator=gen, dtype=torch.float64)
    return q, k, v


def skew_norm(q: torch.Tensor, k: torch.Tensor, alpha: float) -> float:
    """Spectral norm of ``S = α/√r (q kᵀ − k qᵀ)`` from a 2r×2r problem (no N×N SVD).

    ``S = U J Uᵀ`` with ``U = [q k]`` is normal, so ``‖S‖₂`` is its largest eigenvalue modulus,
    and the non-zero eigenvalues of ``U J Uᵀ`` are those of ``J UᵀU`` (docs/design.md §2).
    """
    r = q.shape[-1]
    u = torch.cat([q, k], dim=-1).double()
    eye = torch.eye(r, dtype=torch.float64)
    zero = torch.zeros(r, r, dtype=torch.float64)
    j = alpha / math.sqrt(r) * torch.cat([torch.cat([zero, eye], 1), torch.cat([-eye, zero], 1)], 0)
    return float(torch.linalg.eigvals(j @ (u.mT @ u)).abs().max())


def accuracy_table(
    ns: Sequence[int] = (16, 64, 256, 1024),
    alphas: Sequence[float] = (0.01, 0.1, 1.0, 10.0),
    dtypes: Sequence[str] = ("float64", "float32", "bfloat16"),
    methods: Sequence[str] = ("dense", "lowrank"),
    *,
    rank: int = 8,
    value_dim: int = 8,
    seeds: Sequence[int] = (0,),
    orthogonality_max_n: int = 512,
) -> pd.DataFrame:
    """Errors of each OSA method against a float64 ``scipy.linalg.expm`` reference.

    For every ``(n, alpha, seed)`` one single-head problem with unit-variance ``q, k``
    (``n × rank``) and ``v`` (``n × value_dim``) is drawn; its inputs are rounded to each
    dtype, and the reference is computed from the rounded inputs in float64, so the error
    measures the method, not the rounding of its inputs.

    Returns one row per ``(method, dtype, n, alpha, seed)`` with columns ``method, dtype, n,
    rank, alpha, seed, norm_s`` (spectral norm of S), ``rel_error`` (‖y − y_ref‖_F / ‖y_ref‖_F),
    ``norm_error`` (|‖y‖_F − ‖v‖_F| / ‖v‖_F: OSA preserves norms) and ``orth_error``
    (``max |AᵀA − I|`` of the matrix the method applies, obtained by applying it to the
    identity; NaN above ``orthogonality_max_n``).
    """
    ns = _check_positive_ints("ns", ns)
    for m in methods:
        if m not in OSA_METHODS:
            raise unknown_name("method", m, list(OSA_METHODS))
    rows: list[dict] = []
    for n in ns:
        for seed in seeds:
            q64, k64, v64 = _inputs(n, rank, value_dim, seed)
            for dtype_name in dtypes:
                dt = _dtype(dtype_name)
                q, k, v = q64.to(dt), k64.to(dt), v64.to(dt)
                qr, kr, vr = q.double(), k.double(), v.double()
                for alpha in alphas:
                    s = skew_symmetric_from_qk(qr, kr, float(alpha)).numpy()
                    a_ref = scipy.linalg.expm(s)
                    y_ref = a_ref @ vr.numpy()
                    norm_s = skew_norm(qr, kr, float(alpha))
                    for method in methods:
                        y = osa(q, k, v, float(alpha), method=method).double().numpy()
                        rel = float(np.linalg.norm(y - y_ref) / max(np.linalg.norm(y_ref), 1e-300))
                        v_norm = float(np.linalg.norm(vr.numpy()))
                        norm_err = abs(float(np.linalg.norm(y)) - v_norm) / max(v_norm, 1e-300)
                        orth = math.nan
                        if n <= orthogonality_max_n:
                            eye = torch.eye(n, dtype=dt)
                            a = osa(q, k, eye, float(alpha), method=method).double()
                            orth = float(orthogonality_error(a))
                        rows.append(
                            {
                                "method": method,
                                "dtype": dtype_name,
                                "n": n,
                                "rank": rank,
                                "alpha": float(alpha),
                                "seed": seed,
                                "norm_s": norm_s,
                                "rel_error": rel,
                                "norm_error": norm_err,
                                "orth_error": orth,
                            }
                        )
    return pd.DataFrame(rows)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


def timing_table(
    ns: Sequence[int] = (256, 512, 1024, 2048, 4096, 8192),
    methods: Sequence[str] = ("dense", "lowrank", "sdpa"),
    *,
    max_n: dict[str, int] | None = None,
    batch_heads: int = 4,
    head_dim: int = 64,
    alpha: float = 0.1,
    dtype: str = "float32",
    repeat: int = 3,
    seed: int = 0,
) -> pd.DataFrame:
    """Median forward time over ``repeat`` runs of each method against N (one row per ``(method, n)``).

    ``q, k, v`` have shape ``(batch_heads, n, head_dim)``; ``max_n`` caps the N a method is
    timed at (default: dense ≤ 1024, sdpa ≤ 8192, lowrank unlimited) so that slow methods do
    not dominate the run. Each call runs once untimed (warm-up), then ``repeat`` timed times.
    Columns: ``method, n, batch_heads, head_dim, dtype, seconds`` (the median),
    ``seconds_min, seconds_max, repeats, threads``; ``seconds_max / seconds_min`` tells how
    noisy a point was (another process on a shared machine, a cold cache).
    """
    ns = _check_positive_ints("ns", ns)
    for m in methods:
        if m not in TIMED_METHODS:
            raise unknown_name("timed method", m, list(TIMED_METHODS))
    caps = {"dense": 1024, "sdpa": 8192, "lowrank": 1 << 30}
    caps.update(max_n or {})
    dt = _dtype(dtype)
    gen = torch.Generator().manual_seed(seed)
    rows: list[dict] = []
    for n in sorted(ns):
        q, k, v = (torch.randn(batch_heads, n, head_dim, generator=gen).to(dt) for _ in range(3))
        for method in methods:
            if n > caps[method]:
                continue
            if method == "sdpa":
                fn = lambda q=q, k=k, v=v: _sdpa(q, k, v)  # noqa: E731
            else:
                fn = lambda q=q, k=k, v=v, m=method: osa(q, k, v, alpha, method=m)  # noqa: E731
            with torch.no_grad():
                time_call(fn, repeat=1, warmup=0)  # warm-up
                runs = [time_call(fn, repeat=1, warmup=0) for _ in range(repeat)]
            rows.append(
                {
                    "method": method,
                    "n": n,
                    "batch_heads": batch_heads,
                    "head_dim": head_dim,
                    "dtype": dtype,
                    "seconds": float(np.median(runs)),
                    "seconds_min": float(min(runs)),
                    "seconds_max": float(max(runs)),
                    "repeats": len(runs),
                    "threads": torch.get_num_threads(),
                }
            )
    return pd.DataFrame(rows)


#: A fitted slope is flagged as untrustworthy when it is further than this from the expected
#: exponent, when the log–log fit explains less than :data:`SLOPE_MIN_R2` of the variance, or
#: when a fitted point's slowest run took more than :data:`SLOPE_MAX_SPREAD` × its fastest.
SLOPE_TOLERANCE = 0.5
SLOPE_MIN_R2 = 0.95
SLOPE_MAX_SPREAD = 2.0


def fit_slopes(timings: pd.DataFrame, *, min_n: int | None = None, points: int = 3) -> pd.DataFrame:
    """Slope of ``log(seconds)`` against ``log(n)`` per method, fitted on the largest N.

    Small N is dominated by fixed overheads (and, for low-rank OSA, by the O(r³) work per
    head), so each method's fit uses its ``points`` largest N (or every N ≥ ``min_n`` when
    given). Returns columns ``method, slope, expected, intercept, n_min, n_max, points, r2,
    spread, trusted, doubt``; ``slope`` is NaN for a method with fewer than two usable points.
    ``spread`` is the largest ``seconds_max / seconds_min`` of the fitted points (1 without
    those columns); ``trusted`` is False, and ``doubt`` says why, when the fit has fewer than
    three points, ``r2 < SLOPE_MIN_R2``, ``spread > SLOPE_MAX_SPREAD`` or the slope is more than
    ``SLOPE_TOLERANCE`` from the expected exponent.
    """
    rows = []
    for method, group in timings.groupby("method", sort=False):
        g = group.sort_values("n")
        g = g[g["n"] >= min_n] if min_n is not None else g.tail(points)
        g = g[g["seconds"] > 0]
        slope = intercept = r2 = math.nan
        if len(g) >= 2:
            x, y = np.log(g["n"].to_numpy(float)), np.log(g["seconds"].to_numpy(float))
            slope, intercept = np.polyfit(x, y, 1)
            residual = y - (slope * x + intercept)
            total = float(((y - y.mean()) ** 2).sum())
            r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else math.nan
        spread = 1.0
        if {"seconds_min", "seconds_max"} <= set(g.columns) and len(g) and (g["seconds_min"] > 0).all():
            spread = float((g["seconds_max"] / g["seconds_min"]).max())
        expected = TIMED_METHODS.get(str(method), math.nan)
        doubts = []
        if len(g) < 3:
            doubts.append(f"only {len(g)} point{'s' if len(g) != 1 else ''} fitted")
        if math.isfinite(r2) and r2 < SLOPE_MIN_R2:
            doubts.append(f"the points are not on a line (r² = {r2:.2f})")
        if spread > SLOPE_MAX_SPREAD:
            doubts.append(f"the repeats of one point differ by {spread:.1f}×")
        if math.isfinite(slope) and math.isfinite(expected) and abs(slope - expected) > SLOPE_TOLERANCE:
            doubts.append(f"{slope:.2f} is more than {SLOPE_TOLERANCE} from the expected {expected:g}")
        rows.append(
            {
                "method": method,
                "slope": float(slope),
                "expected": expected,
                "intercept": float(intercept),
                "n_min": int(g["n"].min()) if len(g) else 0,
                "n_max": int(g["n"].max()) if len(g) else 0,
                "points": len(g),
                "r2": float(r2),
                "spread": spread,
                "trusted": bool(math.isfinite(slope) and not doubts),
                "doubt": "; ".join(doubts),
            }
        )
    return pd.DataFrame(rows)
