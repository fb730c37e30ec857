"""The "OSA check": orthogonality and dense-vs-low-rank accuracy of OSA for one configuration.

For tokens ``X ∈ R^{N×d}`` (standard normal), per head Gaussian ``W_Q, W_K`` with variance
``1/d`` and an orthogonal ``W_V`` (the initialisation of :class:`osa_lab.OrthogonalSelfAttention`,
docs/design.md §3), it measures:

``orthogonality_error``
    ``max |AᵀA − I|`` of the explicit OSA matrix ``A = exp(S)`` (docs/design.md §1) in the working
    dtype, worst head.
``dense_vs_lowrank``
    ``‖osa(method="lowrank") − osa(method="dense")‖_F / ‖osa(method="dense")‖_F``: the linear-time
    path (docs/design.md §2) against the O(N³) reference, both in the working dtype.
``lowrank_vs_float64``
    the same low-rank output against a float64 dense reference (the error a user actually gets).
``norm_preservation``
    ``max_j | ‖y_j‖ / ‖v_j‖ − 1 |`` over value columns: OSA is norm preserving (docs/design.md §1).

The dashboard shows these as badges; :func:`osa_check_table` gives the tidy form.
"""

from __future__ import annotations

import math
import time

import pandas as pd
import torch

from osa_lab.errors import ConfigurationError, OSADtypeError, heads_do_not_divide
from osa_lab.nn.attention import derived_alpha_init
from osa_lab.ops.expm import orthogonality_error, osa_matrix
from osa_lab.ops.functional import osa, resolve_method

#: Largest N for which the check forms the dense N×N reference (O(N³) per head).
MAX_DENSE_TOKENS = 1024

#: Pass thresholds per working dtype (float32 errors scale with ‖S‖; these hold at init-scale α).
TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float32: {
        "orthogonality_error": 1e-4,
        "dense_vs_lowrank": 1e-4,
        "lowrank_vs_float64": 1e-4,
        "norm_preservation": 1e-4,
    },
    torch.float64: {
        "orthogonality_error": 1e-10,
        "dense_vs_lowrank": 1e-10,
        "lowrank_vs_float64": 1e-10,
        "norm_preservation": 1e-10,
    },
}

_DESCRIPTIONS = {
    "orthogonality_error": "max |AᵀA − I| of A = exp(S), worst head",
    "dense_vs_lowrank": "relative error, low-rank vs dense OSA (same dtype)",
    "lowrank_vs_float64": "relative error, low-rank vs float64 dense reference",
    "norm_preservation": "max | ‖y_j‖/‖v_j‖ − 1 | over value columns",
}


def _inputs(tokens: int, dim: int, heads: int, seed: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(int(seed))
    r = dim // heads
    x = torch.randn(tokens, dim, generator=gen, dtype=torch.float64)
    w_q = torch.randn(dim, heads * r, generator=gen, dtype=torch.float64) / math.sqrt(dim)
    w_k = torch.randn(dim, heads * r, generator=gen, dtype=torch.float64) / math.sqrt(dim)
    w_v, _ = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))

    def split(m: torch.Tensor) -> torch.Tensor:  # (N, heads*r) -> (heads, N, r)
        return m.view(tokens, heads, -1).transpose(0, 1).contiguous()

    q, k, v = split(x @ w_q), split(x @ w_k), split(x @ w_v)
    return q.to(dtype), k.to(dtype), v.to(dtype), q, k, v


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    den = float(torch.linalg.vector_norm(b.double()))
    return float(torch.linalg.vector_norm(a.double() - b.double())) / max(den, 1e-300)


def osa_check(
    tokens: int,
    dim: int,
    heads: int = 1,
    alpha: float | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    method: str = "auto",
) -> dict[str, object]:
    """Run the OSA check for one configuration and return a flat dict.

    Args:
        tokens, dim, heads: N, d and the number of heads (``dim % heads == 0``; r = d / heads).
        alpha: OSA α; ``None`` uses the derived initialisation
            :func:`osa_lab.nn.attention.derived_alpha_init` (as the presets do).
        seed: seed of the random tokens and weights.
        dtype: working dtype, float32 or float64.
        method: the low-rank method checked against the dense reference (``"auto"`` resolves
            as :func:`osa_lab.osa` does; the resolved name is returned).

    Returns:
        ``{"tokens", "dim", "heads", "head_dim", "alpha", "dtype", "method", "seconds",
        "orthogonality_error", "dense_vs_lowrank", "lowrank_vs_float64", "norm_preservation",
        "passed"}``, where ``passed`` maps each measured quantity to a bool (error ≤ tolerance).

    Raises:
        ConfigurationError: ``dim`` not divisible by ``heads``, non-positive sizes, or
            ``tokens > MAX_DENSE_TOKENS`` (the dense reference would cost O(N³)).
        OSADtypeError: a dtype other than float32 / float64.
    """
    for name, val in (("tokens", tokens), ("dim", dim), ("heads", heads)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ConfigurationError(f"`{name}` must be a positive int, got {val!r}")
    if dim % heads:
        raise heads_do_not_divide(dim, heads)
    if tokens > MAX_DENSE_TOKENS:
        raise ConfigurationError(
            f"the OSA check forms the dense {tokens}×{tokens} matrix exponential per head (O(N³)); "
            f"it is limited to tokens ≤ {MAX_DENSE_TOKENS}"
        )
    if dtype not in TOLERANCES:
        raise OSADtypeError(f"`dtype` must be torch.float32 or torch.float64, got {dtype}")
    r = dim // heads
    a = derived_alpha_init(tokens, dim, r) if alpha is None else float(alpha)
    if not math.isfinite(a):
        raise ConfigurationError(f"`alpha` must be finite, got {alpha!r}")
    start = time.perf_counter()
    q, k, v, q64, k64, v64 = _inputs(tokens, dim, heads, seed, dtype)
    name = resolve_method(method, q)
    orth = float(orthogonality_error(osa_matrix(q, k, a)).max())
    dense = osa(q, k, v, a, method="dense")
    low = osa(q, k, v, a, method=name)
    ref = osa(q64, k64, v64, a, method="dense")
    col_ratio = torch.linalg.vector_norm(low.double(), dim=-2) / torch.linalg.vector_norm(v64, dim=-2)
    out: dict[str, object] = {
        "tokens": tokens,
        "dim": dim,
        "heads": heads,
        "head_dim": r,
        "alpha": a,
        "dtype": str(dtype).replace("torch.", ""),
        "method": name,
        "orthogonality_error": orth,
        "dense_vs_lowrank": _rel(low, dense),
        "lowrank_vs_float64": _rel(low, ref),
        "norm_preservation": float((col_ratio - 1).abs().max()),
    }
    out["seconds"] = time.perf_counter() - start
    tol = TOLERANCES[dtype]
    out["passed"] = {key: bool(out[key] <= tol[key]) for key in tol}  # type: ignore[operator]
    return out


def osa_check_table(result: dict[str, object]) -> pd.DataFrame:
    """Tidy form of :func:`osa_check`'s result: one row per check with its tolerance and verdict."""
    passed = result["passed"]
    assert isinstance(passed, dict)
    dtype = getattr(torch, str(result["dtype"]))
    rows = [
        {
            "check": key,
            "description": _DESCRIPTIONS[key],
            "value": result[key],
            "tolerance": TOLERANCES[dtype][key],
            "passed": passed[key],
            "tokens": result["tokens"],
            "dim": result["dim"],
            "heads": result["heads"],
            "alpha": result["alpha"],
            "dtype": result["dtype"],
            "method": result["method"],
        }
        for key in passed
    ]
    return pd.DataFrame(rows)
