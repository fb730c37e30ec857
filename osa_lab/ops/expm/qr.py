"""The QR engine ``exp(S) V = V + B(e^{R J Rᵀ} − I)BᵀV``, backward stable for any q, k, and its small-N
branch through the N×N S.

Part of :mod:`osa_lab.ops.expm` (Zhang & Martens, arXiv 2602.05996; docs/design.md §1–§2).
"""

from __future__ import annotations

import math

import torch

from osa_lab.errors import UntrustedResultError
from osa_lab.ops.amp import autocast_off_backward
from osa_lab.ops.expm.batch import any_row, composite_backward, replace_rows, take_rows, under_transform
from osa_lab.ops.expm.bounds import (
    FLOAT64_ROUNDING_NORM,
    float64_needed,
    skew_norm_bound,
    spectral_norm_bound,
    spectral_refine_above,
    warn_float64_rounding,
)
from osa_lab.ops.expm.chebyshev import chebyshev_action, chebyshev_degree
from osa_lab.ops.expm.core import core_skew_exp
from osa_lab.ops.expm.dense import differentiable_plan, short_taylor, short_taylor_plan


class _RankDeficientQR(torch.autograd.Function):
    """``torch.linalg.qr`` of a rank-deficient ``U`` whose backward refuses a graph: PyTorch's QR
    backward divides by ``R``'s diagonal, and differentiated again it returns O(1)-wrong second
    derivatives there (measured: relative error 1.0 for ``q = k``, N = 20, r = 2). First
    derivatives are autograd's own."""

    @staticmethod
    def forward(ctx, u):  # noqa: D102
        ctx.save_for_backward(u)
        return torch.linalg.qr(u)

    @staticmethod
    @autocast_off_backward
    def backward(ctx, gb, gr):  # noqa: D102
        if torch.is_grad_enabled():
            raise UntrustedResultError(
                "second derivatives (a graph of the backward, create_graph=True) through the QR engine "
                "are not defined for a rank-deficient [q k] (k parallel to q, q = 0, N < 2r): PyTorch's QR "
                "backward divides by R's zero diagonal. Use method=\"dense\" for second derivatives of "
                "such inputs."
            )
        (u,) = ctx.saved_tensors
        return composite_backward(torch.linalg.qr, (u,), (True,), (gb, gr))[0]


def _householder_qr(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.qr(u)``; under autograd, a rank-deficient ``u`` (a diagonal entry of ``R``
    below ``√eps`` of the largest) goes through :class:`_RankDeficientQR`."""
    b, r = torch.linalg.qr(u)
    if not (torch.is_grad_enabled() and u.requires_grad) or under_transform(u):
        return b, r
    diag = r.detach().diagonal(dim1=-2, dim2=-1).abs()
    if diag.numel() and any_row(diag.amin(-1) <= math.sqrt(torch.finfo(r.dtype).eps) * diag.amax(-1)):
        return _RankDeficientQR.apply(u)
    return b, r


def qr_action(u: torch.Tensor, j: torch.Tensor, v: torch.Tensor, *, osa_core: bool = False) -> torch.Tensor:
    """``exp(U J Uᵀ) V`` by the QR form ``V + B (exp(R J Rᵀ) − I)(Bᵀ V)`` (docs/design.md §2).

    Householder QR keeps ``B`` orthonormal to working precision for any ``U``, including
    rank-deficient ones; the small exponential runs in float64. Differentiable by autograd.
    When ``N ≤ m``, or ``N ≤ 2m`` and ``‖S‖`` is small, the N×N matrix ``S = U J Uᵀ`` costs no
    more than the low-rank problem (``N³ ≤ 4 N m²``) and is exponentiated directly
    (:func:`_small_n_action`); for ``N ≤ m`` this also avoids PyTorch's QR backward, which is
    undefined for wide rank-deficient ``U``. ``osa_core=True`` promises ``J`` of
    :func:`osa_skew_core` (``S`` is then formed from one N×N×r product). Below float64, matrices
    with ``‖S‖₂`` (``= ‖R J Rᵀ‖₂``: ``S = B M Bᵀ`` with orthonormal ``B``) above
    :data:`FLOAT64_NORM` are recomputed in float64 (float32 QR loses ≈ eps₃₂·‖S‖₂: relative error
    0.45 at α = 1e6, measured there); ``‖S‖_F`` settles the matrices at or below it, and only those
    above get :func:`spectral_norm_bound`.
    """
    if u.shape[-2] <= 2 * u.shape[-1]:
        y = _small_n_action(u, j, v, osa_core=osa_core)
        if y is not None:
            return y
    b, r = _householder_qr(u)
    r64 = r.double()
    m = r64 @ j.to(torch.float64) @ r64.mT
    e_minus_i = core_skew_exp(m, minus_identity=True)
    y = v + b @ (e_minus_i @ (b.mT @ v).double()).to(v.dtype)
    fro, above = torch.linalg.matrix_norm(m.detach()), spectral_refine_above(u.dtype)  # ‖M‖_F = ‖S‖_F
    if any_row(fro > above):  # else ‖S‖₂ ≤ ‖S‖_F ≤ above: no float64 recompute, no warning
        s_two = spectral_norm_bound(m, fro, above)
        if u.dtype == torch.float64:
            warn_float64_rounding(s_two, "qr")
            return y
        big = float64_needed(s_two, u.dtype)
        if any_row(big):  # eps₃₂·‖S‖₂ would spoil them: those matrices again in float64

            def again(idx: torch.Tensor | None) -> torch.Tensor:
                y64 = qr_action(take_rows(u, idx).double(), take_rows(j, idx), take_rows(v, idx).double(), osa_core=osa_core)
                return y64.to(v.dtype)

            one_batch = u.dim() == 3 and u.shape[:1] == j.shape[:-2] == v.shape[:1] == big.shape
            return replace_rows(y, big, again) if one_batch else again(None)
    return y


def _osa_s(u: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """``S = U J Uᵀ`` for :func:`osa_skew_core`'s ``J = c·[[0, I], [−I, 0]]`` and ``U = [q k]``:
    ``c (q kᵀ − k qᵀ)`` from one N×N×r product (``J``'s structure is the caller's promise)."""
    half = u.shape[-1] // 2
    qk = u[..., :half] @ u[..., half:].mT
    return (qk - qk.mT) * j[..., :1, half : half + 1].to(u.dtype)


def _small_n_action(
    u: torch.Tensor, j: torch.Tensor, v: torch.Tensor, *, action: bool = True, osa_core: bool = False
) -> torch.Tensor | None:
    """``exp(U J Uᵀ) V`` through the N×N ``S``, for N ≤ 2m; ``None`` to use the QR form.

    When a bound of ``‖S‖₂`` allows it (:func:`chebyshev_degree`; up to ``‖S‖₂ ≈ 10`` in
    float32, beyond the range of a trained network's OSA layers), ``exp(S) V`` is computed as a
    Chebyshev action in the input dtype (:func:`chebyshev_action`). Otherwise (or with
    ``action=False``, the path before the action and a reference for it) when ``S`` is small
    enough for the short Taylor path of :func:`dense_exp` it runs there. Otherwise, for
    ``N ≤ m``, ``S`` is formed and exponentiated in float64 (the float32 error stays within
    ``GRAM_TOLERANCE``'s budget for large ``‖S‖``); for ``m < N ≤ 2m`` the QR form is cheaper
    and ``None`` is returned. ``osa_core=True`` promises ``J = c·[[0, I], [−I, 0]]``
    (:func:`osa_skew_core`).
    """
    s = _osa_s(u, j) if osa_core else u @ j.to(u.dtype) @ u.mT
    if action:
        bound = skew_norm_bound(s)
        degree = chebyshev_degree(bound, s.dtype)
        if degree is not None:
            return chebyshev_action(s, v, bound, degree)
    try:
        norm = float(s.detach().abs().sum(-2).amax()) if s.numel() else 0.0
    except RuntimeError:  # under torch.func.vmap a tensor has no single value
        norm = math.inf
    plan = short_taylor_plan(norm, s.dtype) if math.isfinite(norm) else None
    if plan is not None:
        return short_taylor(s, *differentiable_plan(plan, s)) @ v
    if u.shape[-2] > u.shape[-1]:
        return None
    u64 = u.double()
    s64 = u64 @ j.to(torch.float64) @ u64.mT
    fro = torch.linalg.matrix_norm(s64.detach())
    if any_row(fro > FLOAT64_ROUNDING_NORM):  # else no warning: eps₆₄/2·‖S‖₂ ≤ eps₆₄/2·‖S‖_F ≤ the threshold
        warn_float64_rounding(spectral_norm_bound(s64, fro, FLOAT64_ROUNDING_NORM), "qr")
    return (core_skew_exp(s64) @ v.double()).to(v.dtype)
