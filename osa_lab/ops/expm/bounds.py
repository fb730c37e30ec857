"""Norm bounds of S and the rules built on them: float64 recomputation, float64-rounding warnings, the
spectral-norm bound of the small-N action.

Part of :mod:`osa_lab.ops.expm` (Zhang & Martens, arXiv 2602.05996; docs/design.md §1–§2).
"""

from __future__ import annotations

import math
import sys
import warnings

import torch

from osa_lab.errors import OSAAccuracyWarning
from osa_lab.ops.expm.batch import any_row, concrete, under_transform

#: ``‖S‖₂`` above which the low-rank engines recompute a float32 matrix in float64 and round only
#: the result. The float32 engines lose ``≈ eps₃₂·‖S‖₂`` (rounding ``U``, ``G`` or ``R`` perturbs
#: ``M`` by that much): measured against scipy's float64 ``expm`` of the same (float32-exact)
#: inputs, N = 12–256, r = 8–16, the relative error of ``qr``, ``gram`` and ``lowrank`` was
#: 0.6–4.6e-8 · ‖S‖₂, from ≤ 1.3e-6 at α = 1 to 5e-3–1.2e-2 at α = 1e4 and 0.45–0.76 at α = 1e6
#: (‖S‖₂ ≈ 1e7–1e8), with no warning. Recomputed in float64 they are within 3e-8 up to
#: ‖S‖₂ = 1e8 (float64 rounding ≈ 2e-16·‖S‖₂ adds to that), as ``method="dense"`` already was.
#: Below this bound the float32 error stays ≲ 5e-4 and within the float32 accuracy budget ``1e-7·‖S‖₂``
#: (``GRAM_TOLERANCE``); trained layers sit at ‖S‖₂ of order 1–300, so the float32 speed is kept
#: there. The rule is on the spectral norm, which the error follows, not on ``‖S‖_F`` (up to
#: √(2r) times larger; nearly that for unit-variance q, k with N ≫ r, whose 2r singular values
#: are close): the core benchmark's inputs (r = 64, α = 0.5) have ‖S‖_F ≈ 2,900 and
#: ‖S‖₂ ≈ 310–320 at N = 4096, ‖S‖_F ≈ 11,600 and ‖S‖₂ ≈ 1,140–1,150 at N = 16384 (measured),
#: where float32 is accurate; a rule on ‖S‖_F sent that N = 16384 row to the float64 path.
#: ``‖S‖_F ≤`` this bound settles a matrix at no extra cost (``‖S‖₂ ≤ ‖S‖_F``); above it
#: :func:`spectral_norm_bound` decides, within :data:`SPECTRAL_SLACK` of ``‖S‖₂``.
FLOAT64_NORM = 1e4


#: ``eps₆₄/2 · ‖S‖₂`` above which the low-rank engines warn (:class:`OSAAccuracyWarning`): float64
#: rounding alone then moves ``exp(S) V`` by about this much (the ``"dense"`` rule,
#: ``functional.DENSE_ROUNDING_WARN``, which uses ``‖S‖₁``). Measured (N = 64, r = 8, float32 or
#: float64 inputs): relative error 5.8e-5 at ‖S‖₂ = 4.1e11 (α = 1e10), 5.8e-3 at 4.1e13
#: (α = 1e12). As for :data:`FLOAT64_NORM`, ``‖S‖₂`` (:data:`FLOAT64_ROUNDING_NORM`) and not
#: ``‖S‖_F`` is compared.
FLOAT64_ROUNDING_WARN = 1e-4


#: ``‖S‖₂`` at which :data:`FLOAT64_ROUNDING_WARN` is reached: ``2·FLOAT64_ROUNDING_WARN/eps₆₄`` ≈ 9.0e11.
FLOAT64_ROUNDING_NORM = 2 * FLOAT64_ROUNDING_WARN / torch.finfo(torch.float64).eps


#: Largest factor by which :func:`spectral_norm_bound` may exceed ``‖S‖₂`` (in exact arithmetic it
#: is never below it).
SPECTRAL_SLACK = 1.01


def spectral_norm_bound(
    m: torch.Tensor, fro: torch.Tensor, above: float, *, rows: torch.Tensor | None = None, sync: bool = True
) -> torch.Tensor:
    """An upper bound of ``‖M‖₂`` for normal (e.g. skew-symmetric) ``M`` (..., w, w): ``fro``
    (``‖M‖_F``, given), tightened where it is above ``above`` (or where ``rows`` holds) to
    ``‖M^p‖_F^{1/p}``, within :data:`SPECTRAL_SLACK` of ``‖M‖₂``.

    For normal ``M`` with singular values ``σᵢ``, ``‖M^p‖_F = (Σ σᵢ^{2p})^{1/2}``, so
    ``‖M‖₂ ≤ ‖M^p‖_F^{1/p} ≤ w^{1/(2p)} ‖M‖₂``; ``p = 2^k`` comes from ``k`` squarings of
    ``M / ‖M‖_F``, each renormalised (no overflow), with ``w^{1/(2p)} ≤ SPECTRAL_SLACK``
    (8 squarings for w = 128). A matrix stops early once its bound is at or below ``above``
    (one squaring for the N = 16384, α = 0.5 benchmark row), so the result is tight (within the
    slack) exactly where it is above ``above``. Entries where it comes out non-finite keep
    ``fro``. ``sync=False``, and under torch.func transforms, every selected matrix takes all
    ``k`` squarings by device operations only (no host synchronisation, no data-dependent shapes).
    """
    width = m.shape[-1]
    fro = fro.detach()
    sel = (fro > above) if rows is None else rows
    steps = _spectral_squarings(width)
    tiny = torch.finfo(torch.float64).tiny
    if not sync or under_transform(m, fro, sel):
        x = m.detach().double()
        scale = fro.double().clamp_min(tiny)
        x, log_b = x / scale[..., None, None], scale.log()
        for step in range(steps):
            x, log_b = _normalised_square(x, log_b, step)
        bound = log_b.exp().to(fro.dtype)
        return torch.where(sel & torch.isfinite(bound), torch.minimum(bound, fro), fro)
    flat = fro.reshape(-1).clone()
    idx = sel.reshape(-1).nonzero().squeeze(-1)
    if idx.numel() == 0:
        return flat.reshape(fro.shape)
    ms = m.detach().reshape(-1, width, width)[idx].double()
    scale = flat[idx].double()
    x, log_b = ms / scale[:, None, None], scale.log()
    for step in range(steps):
        x, log_b = _normalised_square(x, log_b, step)
        bound = log_b.exp()
        last = step == steps - 1
        done = torch.ones_like(bound, dtype=torch.bool) if last else (bound <= above) | ~torch.isfinite(bound)
        if last or bool(done.any()):
            fin = torch.isfinite(bound) & done
            flat[idx[fin]] = torch.minimum(bound[fin], scale[fin]).to(flat.dtype)
            keep = ~done
            idx, x, log_b, scale = idx[keep], x[keep], log_b[keep], scale[keep]
            if idx.numel() == 0:
                break
    return flat.reshape(fro.shape)


def _spectral_squarings(width: int) -> int:
    """Squarings ``k`` of :func:`spectral_norm_bound`: the fewest with ``width^{1/2^{k+1}} ≤ SPECTRAL_SLACK``."""
    k = 0
    while width > 1 and math.log(width) / 2 ** (k + 1) > math.log(SPECTRAL_SLACK):
        k += 1
    return k


def _normalised_square(x: torch.Tensor, log_b: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of :func:`spectral_norm_bound`: ``x = M^p/‖M^p‖_F`` → ``M^{2p}/‖M^{2p}‖_F`` and
    ``log_b = log ‖M^p‖_F^{1/p}`` → ``log ‖M^{2p}‖_F^{1/(2p)}`` (``p = 2^step``)."""
    x = x @ x
    n = torch.linalg.matrix_norm(x).clamp_min(torch.finfo(x.dtype).tiny)
    return x / n[..., None, None], log_b + n.log() / 2 ** (step + 1)


def float64_needed(s_two: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Mask of the matrices that ``dtype`` (below float64) cannot compute accurately: ``‖S‖₂``
    above :data:`FLOAT64_NORM`. ``s_two`` is an upper bound of ``‖S‖₂`` that is tight (within
    :data:`SPECTRAL_SLACK`) wherever it is above the bound: ``s_two`` of :func:`gram_core_parts`
    with ``norm_above = FLOAT64_NORM``, or :func:`spectral_norm_bound`; NaN where unknown (e.g. a
    failed Cholesky factorisation) counts as not needed. All False for float64. Device operations only."""
    if dtype == torch.float64:
        return torch.zeros_like(s_two, dtype=torch.bool)
    return s_two > FLOAT64_NORM


def spectral_refine_above(dtype: torch.dtype) -> float:
    """``‖S‖`` above which an engine working on ``dtype`` inputs needs ``‖S‖₂`` itself rather than
    ``‖S‖_F``: :data:`FLOAT64_NORM` below float64 (the float64 recompute), else
    :data:`FLOAT64_ROUNDING_NORM` (the float64-rounding warning)."""
    return FLOAT64_ROUNDING_NORM if dtype == torch.float64 else FLOAT64_NORM


def warn_float64_rounding(s_two: torch.Tensor, engine: str) -> None:
    """Warn (:class:`OSAAccuracyWarning`) when float64 rounding of ``S`` moves the result by more
    than :data:`FLOAT64_ROUNDING_WARN`: ``eps₆₄/2 · ‖S‖₂`` with ``s_two`` per matrix an upper bound
    of ``‖S‖₂``, tight where above :data:`FLOAT64_ROUNDING_NORM` (:func:`spectral_norm_bound`)."""
    two = concrete(s_two).detach()
    worst = float(two.nan_to_num(0.0, 0.0, 0.0).max()) if two.numel() else 0.0
    moved = torch.finfo(torch.float64).eps / 2 * worst
    if moved > FLOAT64_ROUNDING_WARN:
        frame, level = sys._getframe(0), 1  # point the warning at the first caller outside osa_lab/torch
        while frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[0] in ("osa_lab", "torch"):
            frame, level = frame.f_back, level + 1
        warnings.warn(
            f"osa low-rank engine {engine!r}: ‖S‖₂ ≈ {worst:.3g} is so large that float64 rounding of S "
            f"alone moves exp(S) v by about {moved:.1g} (relative); the result is inaccurate. Rescale q, k or α.",
            OSAAccuracyWarning,
            stacklevel=level,
        )


#: relative slack of :func:`skew_spectral_bound` beyond its rounding allowance (see there)
NORM_BOUND_SLACK = 1e-4

_SQRT_HALF = 0.5**0.5


def small_skew_bound(n: int, dtype: torch.dtype) -> float:
    """The bound below which :func:`skew_spectral_bound` takes ``‖D‖_F/√2``: ``D²``'s squares
    there come near the bottom of ``dtype``'s range."""
    return (torch.finfo(dtype).tiny * n * 1e3) ** 0.25


def skew_bound_with_allowance(bound: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """``bound`` raised, in place, by ``N² u`` (the rounding of ``D²`` and its norm) and
    :data:`NORM_BOUND_SLACK`, plus the smallest normal number: a bound among the subnormals is
    rounded by more than any relative slack lifts it. :func:`skew_spectral_bound` ends with it,
    and so do bounds computed elsewhere: the CPU kernels' :func:`~osa_lab.ops.cpu.kernels.prepare`
    gives, for N×N skew ``D``, ``min((‖D²‖_F²/2)^{1/4}, ‖D‖_F/√2)`` with ``D²`` in ``dtype`` and
    its squares summed in float64, and ``‖D‖_F/√2`` below :func:`small_skew_bound` and for the
    matrices it did not square; their largest matches the reference's up to the rounding of the sums."""
    info = torch.finfo(dtype)
    return bound.mul_(1 + n * n * info.eps / 2 + NORM_BOUND_SLACK).add_(info.tiny)


def skew_spectral_bound(d: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """An upper bound of ``‖D‖₂`` per matrix of a batch of skew-symmetric ``D`` (b, N, N):
    ``(‖D²‖_F² / 2)^{1/4}``.

    A real skew-symmetric ``D`` has eigenvalues ``0`` and conjugate pairs ``±iθ_j``, so the
    symmetric ``D²`` has each ``−θ_j²`` at least twice and ``‖D²‖_F² = 2 Σ_j θ_j⁴ ≥ 2 θ_max⁴``,
    ``θ_max = ‖D‖₂``. Where one pair dominates the bound is ``‖D‖₂`` itself (for the heads of
    ``benchmarks/train_throughput.py``'s networks it was 1.00–1.07× ``‖D‖₂``); it is never above
    ``‖D‖_F/√2``. For random ``q, k`` (N = 20–64, r = 4–16) it was 1.01–1.39× ``‖D‖₂`` and
    1.6–2.5× below ``‖D‖_F`` (the Frobenius norm counts every pair, this bound mostly the
    largest): a degree or two fewer in :func:`chebyshev_degree` for the price of one N×N×N
    product (written into ``scratch``, a contiguous tensor of ``d``'s shape and dtype, when given).

    ``D`` must be skew-symmetric exactly (``D == −Dᵀ``, as ``c·(P − Pᵀ)`` is), not up to rounding:
    the bound has no room beyond the slack below for a symmetric part (one of relative size δ
    lowers it to about ``(1 − δ)‖D‖₂``), nor for products rounded to TF32.

    Rounding: the computed ``D²`` is off by at most ``N u ‖|D|·|D|‖_F ≤ N² u ‖D‖₂²`` (``u`` the
    unit roundoff), that is by ``N² u/√2`` of ``‖D²‖_F``, and its norm's sum by ``N² u/2`` more;
    the square root halves both, so raising the bound by ``N² u`` covers them, and
    :data:`NORM_BOUND_SLACK` on top.

    Where the squares of ``D²``'s entries come near the bottom of the dtype's range (‖D‖ ≲ 1e-8
    in float32, 1e-76 in float64) its norm loses its digits; for those matrices
    ``‖D‖_F/√2``, taken after scaling by the largest entry, is the bound; the smallest normal
    number is added to every bound, since a relative slack cannot lift a subnormal one. Asking
    whether any matrix is that small is one host read (the callers read the bound on the host
    anyway); the second pass runs only where one is.
    """
    n = d.shape[-1]
    d2_norm = torch.linalg.vector_norm(torch.bmm(d, d, out=scratch), dim=(-2, -1))
    bound = d2_norm.mul_(_SQRT_HALF).sqrt_()
    small = bound < small_skew_bound(n, d.dtype)
    if any_row(small):
        largest = d.abs().amax(dim=(-2, -1), keepdim=True).clamp_min(torch.finfo(d.dtype).tiny)
        fro = torch.linalg.vector_norm(d / largest, dim=(-2, -1)) * largest[..., 0, 0]
        bound = torch.where(small, fro * _SQRT_HALF, bound)
    return skew_bound_with_allowance(bound, n, d.dtype)


def skew_norm_bound(s: torch.Tensor) -> float:
    """Largest ``min(‖S‖₁, ‖S‖_F)`` over the batch: an upper bound of every ``‖S‖₂`` (``inf``
    under torch.func.vmap, where a tensor has no single value, or for non-finite ``S``)."""
    if not s.numel():
        return 0.0
    sd = s.detach()
    try:
        bound = torch.minimum(sd.abs().sum(-2).amax(-1), torch.linalg.matrix_norm(sd))
        out = float(bound.max())
    except RuntimeError:
        return math.inf
    return out if math.isfinite(out) else math.inf
