"""Dense N×N references: the OSA matrix, the short Taylor path of small ‖S‖, orthogonality checks.

Part of :mod:`osa_lab.ops.expm` (Zhang & Martens, arXiv 2602.05996; docs/design.md §1–§2).
"""

from __future__ import annotations

import math

import torch

from osa_lab.errors import OSAInputError
from osa_lab.ops.guards import check_alpha, check_float_tensor


def skew_symmetric_from_qk(q: torch.Tensor, k: torch.Tensor, alpha: float | torch.Tensor = 1.0) -> torch.Tensor:
    """Return ``S = α/√r · (q kᵀ − k qᵀ)`` (docs/design.md §1), shape ``(..., N, N)``.

    ``alpha`` is a float or a tensor broadcasting over the leading dims of ``q``; ``α/√r`` is
    formed in float64 and rounded once to ``q``'s dtype.
    """
    return skew_from_scale(q, k, _alpha_wide(alpha, q) / math.sqrt(q.shape[-1]))


def skew_from_scale(q: torch.Tensor, k: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``S = scale · (q kᵀ − k qᵀ)`` with ``scale`` (``α/√r``, any float dtype) over the leading dims."""
    qk = q @ k.mT
    return scale.to(q.dtype)[..., None, None] * (qk - qk.mT)


def _alpha_wide(alpha: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """α checked (:func:`~osa_lab.ops.guards.check_alpha`) as a float64 tensor on ``like``'s device."""
    wide = torch.float32 if like.device.type == "mps" else torch.float64
    value = check_alpha(alpha)
    if isinstance(alpha, torch.Tensor):  # checked, value None
        return alpha.to(device=like.device, dtype=wide)
    return torch.tensor(value, dtype=wide, device=like.device)


#: Most matrix products (Taylor degree + squarings) the short-Taylor path may use.
SHORT_TAYLOR_MAX_PRODUCTS = 8


def short_taylor_plan(norm: float, dtype: torch.dtype) -> tuple[int, int] | None:
    """``(degree m, squarings s)`` with the fewest products ``m + s`` such that the Taylor
    remainder bound ``ν^{m+1}/(m+1)!`` with ``ν = norm / 2^s`` is below the unit roundoff of
    ``dtype``; ``None`` if that needs more than ``SHORT_TAYLOR_MAX_PRODUCTS`` products."""
    unit = torch.finfo(dtype).eps / 2
    best = None
    for s in range(SHORT_TAYLOR_MAX_PRODUCTS):
        nu = norm / 2**s
        term = 1.0
        for m in range(1, SHORT_TAYLOR_MAX_PRODUCTS - s + 1):
            term *= nu / m  # ν^m / m!
            if term * nu / (m + 1) <= unit:
                if best is None or m + s < sum(best):
                    best = (m, s)
                break
    return best


def differentiable_plan(plan: tuple[int, int], x: torch.Tensor) -> tuple[int, int]:
    """``plan`` with two more Taylor terms where autograd records ``x``: the degree reaches the
    dtype's roundoff for the value, and a derivative of order p of the polynomial loses p
    terms (degree 1 at ``S = 0`` has a zero second derivative where exp's is ``(E₁E₂ + E₂E₁)/2``),
    so first and second derivatives keep the value's accuracy."""
    if torch.is_grad_enabled() and x.requires_grad:
        return plan[0] + 2, plan[1]
    return plan


def short_taylor(x: torch.Tensor, degree: int, squarings: int) -> torch.Tensor:
    """``exp(x)`` by a degree-``degree`` Taylor polynomial (Horner) of ``x / 2^s``, squared ``s`` times."""
    x = x / 2**squarings
    eye = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device)
    e = eye + x / degree
    for k in range(degree - 1, 0, -1):
        e = eye + (x @ e) / k
    for _ in range(squarings):
        e = e @ e
    return e


def dense_exp(x: torch.Tensor) -> torch.Tensor:
    """Matrix exponential over the last two dims; ``torch.linalg.matrix_exp`` is its reference.

    * Small norms (``‖x‖₁`` such that a Taylor polynomial plus squarings within
      ``SHORT_TAYLOR_MAX_PRODUCTS`` products reaches the dtype's unit roundoff, e.g. the tiny
      ``S`` of a freshly initialised or trained OSA layer) use that short Taylor series: a few
      matrix products forward and twice that backward, where PyTorch always evaluates degree 18
      and its backward exponentiates a 2n×2n block matrix.
    * Otherwise PyTorch's batched algorithm. For a single matrix (or a batch of one) PyTorch
      picks a norm-dependent Taylor degree whose degree-8 branch is inaccurate (docs/design.md §2):
      we measured float64 errors up to 2.4e-10 against ``scipy.linalg.expm`` versus 1e-13 for
      the batched path (degree 18 with scaling and squaring); a zero matrix is stacked on to
      force that path.
    """
    if x.dim() < 2:
        raise OSAInputError(f"dense_exp needs (..., n, n); got shape {tuple(x.shape)}")
    if x.numel():
        try:
            norm = float(x.detach().abs().sum(-2).amax())  # max over the batch of ‖x‖₁
        except RuntimeError:  # under torch.func.vmap a tensor has no single value
            norm = None
        plan = short_taylor_plan(norm, x.dtype) if norm is not None and math.isfinite(norm) else None
        if plan is not None:
            return short_taylor(x, *differentiable_plan(plan, x))
    lead = x.shape[:-2]
    if math.prod(lead) >= 2:
        return torch.linalg.matrix_exp(x)
    flat = x.reshape(-1, *x.shape[-2:])
    padded = torch.cat([flat, torch.zeros_like(flat[:1]).expand(2 - flat.shape[0], -1, -1)], 0)
    return torch.linalg.matrix_exp(padded)[: flat.shape[0]].reshape(x.shape)


def reference_skew_exp(s: torch.Tensor, *, check: bool = True) -> torch.Tensor:
    """Dense ``exp(S)`` of a skew-symmetric ``S`` (..., n, n) via ``torch.linalg.matrix_exp``.

    This is the O(n³) reference. ``check=True`` refuses an ``S`` that is not skew-symmetric
    (the result would not be orthogonal).
    """
    check_float_tensor("s", s, allow_half_on_cpu=True)
    if s.dim() < 2 or s.shape[-1] != s.shape[-2]:
        raise OSAInputError(f"`s` must be square (..., n, n); got shape {tuple(s.shape)}")
    if check:
        asym = (s + s.mT).abs().amax() if s.numel() else torch.tensor(0.0)
        scale = s.abs().amax() if s.numel() else torch.tensor(0.0)
        if asym > 1e3 * torch.finfo(s.dtype).eps * max(float(scale), 1.0):
            raise OSAInputError(
                f"`s` is not skew-symmetric: max |S + Sᵀ| = {float(asym):.3g}; "
                "build it as X − Xᵀ or pass check=False"
            )
    return dense_exp(s)


def osa_matrix(q: torch.Tensor, k: torch.Tensor, alpha: float | torch.Tensor = 1.0) -> torch.Tensor:
    """The explicit N×N OSA matrix ``A = exp(α/√r (q kᵀ − k qᵀ))`` for analysis of small inputs.

    Orthogonal with det +1 (docs/design.md §1). Costs O(N³): use :func:`osa_lab.osa` to apply it.
    ``q`` and ``k`` must be real floating tensors of one shape ``(..., N, r)``.
    """
    for name, x in (("q", q), ("k", k)):
        check_float_tensor(name, x, allow_half_on_cpu=True)
        if x.dim() < 2:
            raise OSAInputError(f"`{name}` has shape {tuple(x.shape)}; osa_matrix needs (..., N, r)")
    if q.shape != k.shape:
        raise OSAInputError(f"`q` has shape {tuple(q.shape)} but `k` has shape {tuple(k.shape)}; they must match")
    return dense_exp(skew_symmetric_from_qk(q, k, alpha))


def orthogonality_error(a: torch.Tensor) -> torch.Tensor:
    """Return ``max |AᵀA − I|`` over the last two dims (a tensor over the leading dims)."""
    if a.dim() < 2 or a.shape[-1] != a.shape[-2]:
        raise OSAInputError(f"`a` must be square (..., n, n); got shape {tuple(a.shape)}")
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    return (a.mT @ a - eye).abs().amax(dim=(-2, -1))


def is_orthogonal(a: torch.Tensor, atol: float = 1e-5) -> bool:
    """True when every matrix in ``a`` satisfies ``max |AᵀA − I| ≤ atol`` (geotorch-style checker)."""
    return bool((orthogonality_error(a) <= atol).all())
