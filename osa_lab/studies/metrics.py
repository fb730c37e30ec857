"""Rank-collapse and conditioning metrics of token matrices (docs/design.md §4).

Every function takes ``x`` of shape ``(..., N, d)`` — N tokens of width d, any leading batch
dims — and returns a float64 tensor over the leading dims. Computation is in float64 (the
input is promoted), since collapse metrics span many decades.

=====================  ===================================================  ==========================
name                   formula                                              source
=====================  ===================================================  ==========================
relative_residual      ‖X − 1 x̄ᵀ‖_{1,∞} / ‖X‖_{1,∞},  ‖M‖_{1,∞} = √(‖M‖₁‖M‖_∞)  Dong et al. 2021, eq. (1)
token_cosine           mean over k ≠ k' of cos(x_k, x_k')                   Noci et al. 2022
stable_rank            ‖X‖_F² / ‖X‖₂²                                       —
effective_rank         exp(H(p)),  p_i = σ_i / Σ_j σ_j                      Roy & Vetterli 2007
condition_number       σ_max / σ_min over the min(N, d) singular values     Ji et al. 2025
=====================  ===================================================  ==========================

``‖M‖₁`` is the maximum absolute column sum and ``‖M‖_∞`` the maximum absolute row sum (the
induced matrix norms of Dong, Cordonnier & Loukas 2021, *Attention is Not All You Need*,
arXiv 2103.03404). :func:`singular_values` and :func:`normalized_spectrum` give the full spectrum.

Conventions for degenerate inputs: a zero matrix has relative residual 0 and stable/effective
rank 0; a rank-deficient matrix has condition number ``inf``; a zero token's cosine with any
other token is taken as 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from osa_lab.errors import NonFiniteError, OSAInputError, unknown_name


def _as64(x: torch.Tensor, name: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise OSAInputError(f"`{name}` must be a torch.Tensor of shape (..., N, d), got {type(x).__name__}")
    if x.dim() < 2:
        raise OSAInputError(f"`{name}` has shape {tuple(x.shape)}; metrics need (..., N tokens, d features)")
    if x.shape[-1] == 0 or x.shape[-2] == 0:
        raise OSAInputError(f"`{name}` has shape {tuple(x.shape)}; N and d must both be at least 1")
    x = x.detach()
    if not x.is_floating_point():
        x = x.to(torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise NonFiniteError(
            f"`{name}` (shape {tuple(x.shape)}) contains {int(torch.isnan(x).sum())} NaN and "
            f"{int(torch.isinf(x).sum())} Inf entries; metrics need finite hidden states "
            "(the model's NonFiniteHiddenStateError names the layer where they first appear)"
        )
    return x if x.dtype == torch.float64 else x.to(torch.float64)


def composite_norm(m: torch.Tensor) -> torch.Tensor:
    """``‖M‖_{1,∞} = √(‖M‖₁ ‖M‖_∞)`` over the last two dims (Dong et al. 2021, §2)."""
    m = _as64(m, "m")
    one = m.abs().sum(dim=-2).amax(dim=-1)  # max column sum
    inf = m.abs().sum(dim=-1).amax(dim=-1)  # max row sum
    return (one * inf).sqrt()


def residual(x: torch.Tensor) -> torch.Tensor:
    """``res(X) = X − 1 x̄ᵀ`` with ``x̄`` the token mean (Dong et al. 2021)."""
    x = _as64(x)
    return x - x.mean(dim=-2, keepdim=True)


def relative_residual(x: torch.Tensor) -> torch.Tensor:
    """``‖X − 1 x̄ᵀ‖_{1,∞} / ‖X‖_{1,∞}``: 0 when every token is the same (rank collapse)."""
    x = _as64(x)
    den = composite_norm(x)
    num = composite_norm(residual(x))
    return torch.where(den > 0, num / den.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(den))


def token_cosine(x: torch.Tensor) -> torch.Tensor:
    """Mean over ordered pairs k ≠ k' of ``cos(x_k, x_k')`` (Noci et al. 2022); 1 for identical tokens.

    Needs N ≥ 2 tokens. Zero tokens contribute a cosine of 0.
    """
    x = _as64(x)
    n = x.shape[-2]
    if n < 2:
        raise OSAInputError(f"token_cosine needs at least 2 tokens, got N={n} (shape {tuple(x.shape)})")
    norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    unit = torch.where(norms > 0, x / norms.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(x))
    # Σ_{k,k'} cos = ‖Σ_k u_k‖²; subtract the diagonal Σ_k ‖u_k‖².
    total = torch.linalg.vector_norm(unit.sum(dim=-2), dim=-1) ** 2
    diag = (unit**2).sum(dim=(-2, -1))
    return (total - diag) / (n * (n - 1))


def singular_values(x: torch.Tensor) -> torch.Tensor:
    """All ``min(N, d)`` singular values of each ``X``, largest first, float64."""
    return torch.linalg.svdvals(_as64(x))


def normalized_spectrum(x: torch.Tensor) -> torch.Tensor:
    """``σ_i / σ_1`` (largest first); all zeros for a zero matrix."""
    s = singular_values(x)
    top = s[..., :1]
    return torch.where(top > 0, s / top.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(s))


def stable_rank_from_sv(s: torch.Tensor) -> torch.Tensor:
    """``Σσ_i² / σ_1²`` from singular values (largest first)."""
    top = s[..., 0] ** 2
    return torch.where(
        top > 0, (s**2).sum(-1) / top.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(top)
    )


def effective_rank_from_sv(s: torch.Tensor) -> torch.Tensor:
    """``exp(−Σ p_i log p_i)``, ``p_i = σ_i / Σσ`` (Roy & Vetterli 2007), with ``0 log 0 = 0``."""
    total = s.sum(-1, keepdim=True)
    p = torch.where(total > 0, s / total.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(s))
    plogp = torch.where(
        p > 0, p * torch.log(p.clamp_min(torch.finfo(torch.float64).tiny)), torch.zeros_like(p)
    )
    h = -plogp.sum(-1)
    return torch.where(total[..., 0] > 0, torch.exp(h), torch.zeros_like(h))


def condition_number_from_sv(s: torch.Tensor) -> torch.Tensor:
    """``σ_max / σ_min``; ``inf`` where σ_min = 0 (and NaN for an all-zero matrix)."""
    return s[..., 0] / s[..., -1]


def stable_rank(x: torch.Tensor) -> torch.Tensor:
    """``‖X‖_F² / ‖X‖₂²``: between 1 (rank one) and min(N, d) (all singular values equal)."""
    return stable_rank_from_sv(singular_values(x))


def effective_rank(x: torch.Tensor) -> torch.Tensor:
    """Effective rank ``exp(H(σ / Σσ))`` (Roy & Vetterli 2007): k for k equal singular values."""
    return effective_rank_from_sv(singular_values(x))


def condition_number(x: torch.Tensor) -> torch.Tensor:
    """``σ_max(X) / σ_min(X)`` over the min(N, d) singular values (Ji et al. 2025, "Always Skip Attention")."""
    return condition_number_from_sv(singular_values(x))


#: Metric name → function ``(..., N, d) → (...)``; the names used in every table and UI.
METRICS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relative_residual": relative_residual,
    "token_cosine": token_cosine,
    "stable_rank": stable_rank,
    "effective_rank": effective_rank,
    "condition_number": condition_number,
}

#: Metrics whose values span decades (plot them on a log axis).
LOG_SCALE_METRICS = ("relative_residual", "condition_number")

METRIC_DESCRIPTIONS = {
    "relative_residual": "‖X − 1x̄ᵀ‖_{1,∞}/‖X‖_{1,∞} (Dong et al. 2021); 0 = all tokens equal",
    "token_cosine": "mean cosine between distinct tokens (Noci et al. 2022); 1 = all tokens parallel",
    "stable_rank": "‖X‖_F²/‖X‖₂²",
    "effective_rank": "exp(entropy of σ/Σσ) (Roy & Vetterli 2007)",
    "condition_number": "σ_max/σ_min of X (Ji et al. 2025)",
}


def all_metrics(x: torch.Tensor, names: list[str] | tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
    """Every metric in ``names`` (default: all of :data:`METRICS`) with one SVD shared by the spectral ones."""
    names = list(METRICS) if names is None else list(names)
    for name in names:
        if name not in METRICS:
            raise unknown_name("metric", name, list(METRICS))
    x = _as64(x)
    out: dict[str, torch.Tensor] = {}
    spectral = {"stable_rank", "effective_rank", "condition_number"}
    s = singular_values(x) if spectral & set(names) else None
    for name in names:
        if name == "stable_rank":
            out[name] = stable_rank_from_sv(s)
        elif name == "effective_rank":
            out[name] = effective_rank_from_sv(s)
        elif name == "condition_number":
            out[name] = condition_number_from_sv(s)
        else:
            out[name] = METRICS[name](x)
    return out
