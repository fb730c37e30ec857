"""Matrix exponentials of skew-symmetric matrices: dense references and low-rank actions.

Implements docs/design.md §1–§2 (Zhang & Martens, "Orthogonal Self-Attention", arXiv 2602.05996):

* ``S = (α/√r)(Q Kᵀ − K Qᵀ) = U J Uᵀ`` with ``U = [Q K]`` and ``J = (α/√r)[[0, I], [−I, 0]]``;
* the OSA matrix ``A = exp(S)`` is orthogonal with determinant +1;
* its action on ``V`` is computed in time and memory linear in N from a ``2r × 2r`` problem.

Two low-rank engines live here, both exact in exact arithmetic:

``"gram"``  (Cholesky form, the fast path). With ``G = UᵀU = L Lᵀ`` (Cholesky) the matrix
    ``B = U L⁻ᵀ`` has orthonormal columns and ``S = B M Bᵀ`` with ``M = Lᵀ J L`` (2r×2r,
    skew), so ``exp(S) V = V + U F (Uᵀ V)`` with ``F = L⁻ᵀ (exp(M) − I) L⁻¹``. Only two
    passes over the tokens (``Uᵀ[U V]`` and ``V + U C``); the small problem runs in float64.
    Its rounding error grows like ``eps · ‖U‖ ‖C‖ / ‖V‖`` (≈ eps · cond(U)), so it needs a
    well-conditioned ``U``; an a-posteriori estimate of that bound is returned per matrix.
    Used alone it raises :class:`~osa_lab.errors.UntrustedResultError` for any matrix whose
    estimate is over the budget (it returned O(1) errors and zero gradients there).
``"qr"``  (QR form, docs/design.md §2). ``U = B R`` (Householder), ``M = R J Rᵀ``,
    ``exp(S) V = V + B (exp(M) − I)(Bᵀ V)``: backward stable for any ``U``, including rank
    deficient ones (``Q = K``, ``N < 2r``), at the price of a slower QR.

``"lowrank"`` runs ``"gram"`` and recomputes with ``"qr"`` exactly those matrices whose
Cholesky factorisation failed or whose error estimate is above the dtype's tolerance.

Below float64 every engine recomputes in float64 the matrices with ``‖S‖₂`` above
:data:`FLOAT64_NORM` (float32 loses ≈ eps₃₂·‖S‖₂: relative error ≈ 0.5 at α = 1e6, measured), and
every engine warns (:class:`~osa_lab.errors.OSAAccuracyWarning`) where even float64 rounding of
``S`` spoils the result (:data:`FLOAT64_ROUNDING_WARN`). Both rules look at ``‖S‖₂ = ‖M‖₂`` of the
2r×2r core, not at ``‖S‖_F`` (up to √(2r) times larger): ``‖S‖_F`` is computed anyway and settles
every matrix at or below the bound; only matrices above it get the tighter
:func:`spectral_norm_bound`.
"""

from __future__ import annotations

import functools
import math
import sys
import threading
import warnings
from collections.abc import Callable

import torch

from osa_lab.errors import OSAAccuracyWarning, OSAInputError, UntrustedResultError, unknown_name
from osa_lab.ops.guards import check_alpha, check_float_tensor, sum_is_finite

#: Engines of :func:`lowrank_action` and :func:`blocked_action`.
ENGINES = ("gram", "qr", "lowrank")

#: Error budget of the Gram engine: ``max(base, slope · ‖S‖)`` per dtype. The float32 budget is
#: half the accuracy target (2e-6 while ‖S‖₂ ≤ 10, 1e-7·‖S‖₂ beyond); an estimate
#: above it sends the matrix to the QR engine.
GRAM_TOLERANCE = {torch.float64: (1e-11, 2e-16), torch.float32: (1e-6, 5e-8)}
#: Largest condition estimate ``‖L‖_F ‖L⁻¹‖_F / 2r`` of ``U`` the Gram engine accepts. Rounding
#: ``G = UᵀU`` perturbs ``M`` by about ``eps · cond(U) · ‖S‖``; beyond this the QR engine is used.
GRAM_MAX_COND = {torch.float64: 300.0, torch.float32: 4.0}
#: Truncation tolerance of the float64 core exponential per input dtype (None: float64's unit
#: roundoff). For float32 inputs 1e-10 sits four orders below the float32 budget and saves a
#: squaring or two (:func:`core_skew_exp`).
CORE_TOLERANCE = {torch.float64: None, torch.float32: 1e-10}
#: ``‖S‖₂`` above which the low-rank engines recompute a float32 matrix in float64 and round only
#: the result. The float32 engines lose ``≈ eps₃₂·‖S‖₂`` (rounding ``U``, ``G`` or ``R`` perturbs
#: ``M`` by that much): measured against scipy's float64 ``expm`` of the same (float32-exact)
#: inputs, N = 12–256, r = 8–16, the relative error of ``qr``, ``gram`` and ``lowrank`` was
#: 0.6–4.6e-8 · ‖S‖₂, from ≤ 1.3e-6 at α = 1 to 5e-3–1.2e-2 at α = 1e4 and 0.45–0.76 at α = 1e6
#: (‖S‖₂ ≈ 1e7–1e8), with no warning. Recomputed in float64 they are within 3e-8 up to
#: ‖S‖₂ = 1e8 (float64 rounding ≈ 2e-16·‖S‖₂ adds to that), as ``method="dense"`` already was.
#: Below this bound the float32 error stays ≲ 5e-4 and within the issue-2 budget ``1e-7·‖S‖₂``
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
    if value is None:
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


def _differentiable_plan(plan: tuple[int, int], x: torch.Tensor) -> tuple[int, int]:
    """``plan`` with two more Taylor terms where autograd records ``x``: the degree reaches the
    dtype's roundoff for the value, and a derivative of order p of the polynomial loses p
    terms (degree 1 at ``S = 0`` has a zero second derivative where exp's is ``(E₁E₂ + E₂E₁)/2``),
    so first and second derivatives keep the value's accuracy."""
    if torch.is_grad_enabled() and x.requires_grad:
        return plan[0] + 2, plan[1]
    return plan


def _short_taylor(x: torch.Tensor, degree: int, squarings: int) -> torch.Tensor:
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
            return _short_taylor(x, *_differentiable_plan(plan, x))
    lead = x.shape[:-2]
    if math.prod(lead) >= 2:
        return torch.linalg.matrix_exp(x)
    flat = x.reshape(-1, *x.shape[-2:])
    padded = torch.cat([flat, torch.zeros_like(flat[:1]).expand(2 - flat.shape[0], -1, -1)], 0)
    return torch.linalg.matrix_exp(padded)[: flat.shape[0]].reshape(x.shape)


@functools.cache
def taylor_theta(degree: int, unit: float) -> float:
    """Largest ``θ`` with Taylor remainder bound ``θ^{m+1}/(m+1)! / (1 − θ/(m+2)) ≤ unit`` (m = degree)."""
    lo, hi = 0.0, float(degree + 2)
    for _ in range(80):
        mid = (lo + hi) / 2
        bound = mid ** (degree + 1) / math.factorial(degree + 1) / (1 - mid / (degree + 2))
        lo, hi = (mid, hi) if bound <= unit else (lo, mid)
    return lo


#: Paterson–Stockmeyer Taylor schemes ``(degree m, block q)`` of :func:`core_skew_exp`: powers
#: ``X², …, X^q`` then Horner in ``X^q``, ``(q − 1) + ⌊m/q⌋ − [q | m]`` products.
_PS_SCHEMES = ((2, 2), (4, 2), (6, 3), (9, 3), (12, 4), (16, 4))


def _ps_products(degree: int, block: int) -> int:
    return (block - 1) + degree // block - (degree % block == 0)


def _skew_exp_plan(rho: float, unit: float, blocks: tuple[int, ...] = (2, 3, 4)) -> tuple[int, int, int]:
    """``(degree, block, squarings)`` with the fewest products for spectral radius bound ``rho``
    and truncation tolerance ``unit`` (ties: the higher degree, which needs fewer squarings)."""
    best = None
    for degree, block in _PS_SCHEMES:
        if block not in blocks:
            continue
        theta = taylor_theta(degree, unit)
        squarings = max(0, math.ceil(math.log2(rho / theta))) if rho > 0 else 0
        key = (_ps_products(degree, block) + squarings, -degree)
        if best is None or key < best[0]:
            best = (key, degree, block, squarings)
    return best[1:]


def one_norm(x: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """``‖x‖₁`` over the last two dims of a skew-symmetric or symmetric ``x`` (``‖x‖₁ = ‖x‖_∞``):
    the largest row sum (a contiguous reduction); ``|x|`` goes into ``scratch`` when given.
    (``torch.linalg.vector_norm(ord=1)`` measured 10× slower than this.)"""
    x = x.detach()
    ax = torch.abs(x, out=scratch) if scratch is not None else x.abs()
    return ax.sum(-1).amax(-1)


class _Scratch(threading.local):
    """Per-thread CPU buffers reused across calls by the no-autograd exponential.

    glibc hands multi-megabyte blocks back to the kernel when they are freed, so every fresh
    tensor of that size is page-faulted (zeroed) again on first touch: for 32 matrices of
    128 × 128 that was ≈ 40 % of :func:`core_skew_exp`. Buffers of one shape are kept, at most
    ``SCRATCH_LIMIT_BYTES`` per thread. :func:`core_skew_exp` returns fresh tensors; only the
    internal :func:`gram_core_parts` hands two scratch-backed tensors to its callers, which use
    them at once. Buffers are allocated outside inference mode, so they can be written in and
    out of it.
    """

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.buffers: list[torch.Tensor] = []

    def take(self, like: torch.Tensor, count: int) -> list[torch.Tensor]:
        size = like.numel() * like.element_size() * count
        if like.device.type != "cpu" or size > SCRATCH_LIMIT_BYTES:
            return [torch.empty_like(like, memory_format=torch.contiguous_format) for _ in range(count)]
        key = (tuple(like.shape), like.dtype)
        if key != self.key or len(self.buffers) < count:
            with torch.inference_mode(False):  # inference tensors could not be written outside it
                self.key, self.buffers = key, [torch.empty(like.shape, dtype=like.dtype) for _ in range(count)]
        return self.buffers[:count]


#: Most bytes of scratch buffers :func:`core_skew_exp` keeps per thread between calls.
SCRATCH_LIMIT_BYTES = 64 * 2**20
_SCRATCH = _Scratch()


def release_scratch() -> int:
    """Free this thread's scratch buffers (they are re-allocated on the next call); returns the bytes freed."""
    freed = sum(b.numel() * b.element_size() for b in _SCRATCH.buffers)
    _SCRATCH.key, _SCRATCH.buffers = None, []
    return freed


def core_skew_exp(m: torch.Tensor, *, tol: float | None = None, minus_identity: bool = False) -> torch.Tensor:
    """``exp(M)`` of real skew-symmetric matrices ``M`` (..., n, n): the fast core of the low-rank engines.

    Scaling and squaring of a Taylor polynomial evaluated by Paterson–Stockmeyer, with the degree
    and the number of squarings chosen from the spectral radius instead of ``‖M‖₁``
    (Al-Mohy & Higham, SIAM J. Matrix Anal. Appl. 31(3), 2009, use ``‖M^p‖^{1/p}`` the same way).
    ``M`` is normal, so ``‖M‖₂ = ρ(M) ≤ ‖M^p‖₁^{1/p}`` for every p, and the 2-norm error of
    the Taylor polynomial ``T_m`` is ``max_j |e^{iθ_j} − T_m(iθ_j)| ≤ θ^{m+1}/(m+1)!/(1 − θ/(m+2))``
    over the eigenvalues ``±iθ_j``: at most ``tol`` (default: the unit roundoff of ``M``'s dtype)
    when ``ρ(M)/2^s ≤ θ_m``. For OSA's ``M`` (docs/design.md §2: ``‖M‖₂ = ‖S‖₂``, often hundreds)
    the bound from ``M²`` and ``M⁴`` is within ≈ 1.3× of ``‖M‖₂`` where ``‖M‖₁`` (PyTorch's
    choice) is ≈ 2.5× above it, and degree 16 costs 6 products: at ``‖S‖₂ ≈ 300`` 15 products
    (14 with the float32-input tolerance 1e-10) where PyTorch's takes the time of ≈ 25
    (`BENCHMARKS.md`). One scaling serves the whole batch while the matrices' own squaring
    counts differ by at most ``SHARED_SCALING_SPREAD``; beyond that each matrix is scaled and
    squared on its own (else small ones would lose ≈ 2^Δs·eps). A NaN/Inf matrix gives a
    non-finite result in its own slot only. Products only, so autograd differentiates it at about twice the
    forward cost (PyTorch's backward exponentiates a 2n×2n matrix). ``minus_identity=True``
    returns ``exp(M) − I``. Skew-symmetry is assumed, not checked (:func:`dense_exp` is general).
    """
    n = m.shape[-1]
    if m.numel() == 0 or n == 1:
        out = torch.ones_like(m) if n == 1 else m.clone()
        return out - 1 if minus_identity else out
    unit = _truncation_unit(m.dtype, tol)
    bufs = _SCRATCH.take(m, 6) if _may_reuse(m) else None
    e = _skew_exp(m, unit, bufs)
    if minus_identity:
        return e - torch.eye(n, dtype=e.dtype, device=e.device)
    return e.clone() if bufs is not None else e  # never hand out a scratch buffer


def _truncation_unit(dtype: torch.dtype, tol: float | None) -> float:
    """The Taylor truncation tolerance: ``tol``, or the unit roundoff of ``dtype`` when None."""
    if tol is None:
        return torch.finfo(dtype).eps / 2
    if not (isinstance(tol, (int, float)) and 0 < tol < 1):
        raise OSAInputError(f"`tol` must be a number in (0, 1) (a relative truncation error), got {tol!r}")
    return float(tol)


def _finite_max(t: torch.Tensor) -> float:
    """Largest finite entry of ``t`` (0 if none); raises RuntimeError under torch.func.vmap."""
    return float(torch.where(torch.isfinite(t), t, 0.0).max())


def _may_reuse(*tensors: torch.Tensor) -> bool:
    """True when products may be written into scratch buffers: 3-D CPU tensors of one shape,
    outside autograd, forward-mode AD and torch.func transforms (whose wrappers hide the real shape)."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    return (
        not grad
        and all(t.dim() == 3 and t.device.type == "cpu" for t in tensors)
        and all(t.shape == tensors[0].shape for t in tensors)
        and not _transformed(*tensors)
    )


#: Largest spread of squaring counts (doublings of ‖M‖) over a batch that :func:`core_skew_exp`
#: serves with one shared scaling; beyond it each matrix is scaled and squared on its own.
SHARED_SCALING_SPREAD = 4


def taylor_ps(
    powers: list[torch.Tensor | None], degree: int, block: int, h: float | torch.Tensor, bufs: list | None
) -> torch.Tensor:
    """Paterson–Stockmeyer value of the degree-``degree`` Taylor polynomial of ``X = h·M`` from the
    powers ``M, …, M^q`` (q = ``block``); ``h`` is a float, or a tensor ``(..., 1, 1)`` with one
    scaling per matrix. With ``bufs`` (float ``h`` only) the work goes into ``bufs[3:6]``."""
    reuse = bufs is not None
    hq = h**block

    def add_scaled(out: torch.Tensor, x: torch.Tensor, c: float | torch.Tensor) -> torch.Tensor:
        return out.addcmul_(x, c) if torch.is_tensor(c) else out.add_(x, alpha=c)

    def block_poly(first: int) -> torch.Tensor:
        """``B_i(X) = Σ_{0≤j<q, first+j≤m} X^j / (first+j)!`` with ``first = q·i``."""
        out = None
        for j in range(1, block):
            if first + j <= degree:
                c = h**j / math.factorial(first + j)
                if out is None:
                    out = torch.mul(powers[j], c, out=bufs[3]) if reuse else powers[j] * c
                else:
                    add_scaled(out, powers[j], c)
        out.diagonal(dim1=-2, dim2=-1).add_(1 / math.factorial(first))
        return out

    # Horner in X^q: p = B_0 + X^q (B_1 + X^q (… + X^q B_top)); B_top = I/m! when q | m.
    top = degree // block
    xq = powers[block]
    if degree % block == 0:
        top -= 1
        first = add_scaled(block_poly(block * top), xq, hq / math.factorial(degree))
    else:
        first = block_poly(block * top)
    e, spare = (bufs[4].copy_(first), bufs[5]) if reuse else (first, None)
    for i in range(top - 1, -1, -1):
        if reuse:  # spare = B_i + h^q X^q e in one pass
            e, spare = torch.baddbmm(block_poly(block * i), xq, e, alpha=hq, out=spare), e
        else:
            e = (xq @ e).mul(hq).add(block_poly(block * i))
    return e


def _skew_exp(m: torch.Tensor, unit: float, bufs: list[torch.Tensor] | None) -> torch.Tensor:
    """:func:`core_skew_exp` with truncation tolerance ``unit``; with ``bufs`` (6 tensors shaped
    like ``m``) every product is written into them and the result may be one of them."""

    def mm(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        return torch.matmul(x, y, out=out) if out is not None else torch.matmul(x, y)

    slot = bufs if bufs is not None else [None] * 6
    m2 = mm(m, m, slot[0])
    rho_t = torch.minimum(one_norm(m, slot[3]), one_norm(m2, slot[3]).sqrt())
    try:
        # The plan follows the finite matrices; a NaN/Inf matrix stays NaN/Inf in its own slot
        # (every product is per matrix), the callers report it.
        rho = _finite_max(rho_t)
    except RuntimeError:  # under torch.func.vmap a tensor has no single value
        return dense_exp(m)
    degree, block, squarings = _skew_exp_plan(rho, unit)
    powers = [None, m, m2]
    if block >= 3:
        powers.append(mm(m2, m, slot[1]))
    if block >= 4:
        powers.append(mm(m2, m2, slot[2]))
        # ‖M⁴‖₁^{1/4} is usually the tighter bound: re-plan among the schemes that use M⁴.
        rho_t = torch.minimum(rho_t, one_norm(powers[4], slot[3]) ** 0.25)
        degree, block, squarings = _skew_exp_plan(_finite_max(rho_t), unit, blocks=(4,))
    if rho_t.numel() > 1 and squarings > SHARED_SCALING_SPREAD:
        # One scaling for all would square small-norm matrices 2^Δs times too often (error
        # ≈ 2^Δs·eps): when the batch spans more than SHARED_SCALING_SPREAD doublings, each
        # matrix gets its own scaling and squaring count (allocating freely: a rare path).
        own = torch.ceil(torch.log2(rho_t.clamp_min(1e-300) / taylor_theta(degree, unit))).clamp_min(0)
        own = own.nan_to_num(nan=squarings, posinf=squarings)
        if squarings - int(own.min()) > SHARED_SCALING_SPREAD:
            counts = own.reshape(*own.shape, 1, 1)
            e = taylor_ps(powers, degree, block, torch.pow(2.0, -counts.to(m.dtype)), None)
            for k in range(squarings):
                e = torch.where(counts > k, e @ e, e)
            return e
    e = taylor_ps(powers, degree, block, 2.0**-squarings, bufs)
    if bufs is None:
        for _ in range(squarings):
            e = e @ e
        return e
    spare = bufs[5] if e is bufs[4] else bufs[4]
    for _ in range(squarings):
        e, spare = torch.matmul(e, e, out=spare), e
    return e


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


def osa_skew_core(q_width: int, scale: torch.Tensor) -> torch.Tensor:
    """Return ``J = scale · [[0, I], [−I, 0]]`` of shape ``scale.shape + (2r, 2r)`` (float64)."""
    r = q_width
    j0 = torch.zeros(2 * r, 2 * r, dtype=torch.float64, device=scale.device)
    eye = torch.eye(r, dtype=torch.float64, device=scale.device)
    j0[:r, r:] = eye
    j0[r:, :r] = -eye
    return scale.to(torch.float64)[..., None, None] * j0


# --------------------------------------------------------------------------------------
# The Gram (Cholesky) engine
# --------------------------------------------------------------------------------------


def gram_core(g: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From ``G = UᵀU`` and skew ``J`` return ``(F, ok)`` with ``exp(U J Uᵀ) = I + U F Uᵀ``.

    ``F = L⁻ᵀ (exp(Lᵀ J L) − I) L⁻¹`` with ``G = L Lᵀ``; ``ok`` is False where the Cholesky
    factorisation failed (rank-deficient ``U``). Runs in the dtype of ``g`` (float64 in use).
    """
    chol_inv, e_minus_i, ok, _ = gram_core_parts(g, j)
    return chol_inv.mT @ e_minus_i @ chol_inv, ok


def gram_core_parts(
    g: torch.Tensor,
    j: torch.Tensor,
    tol: float | None = None,
    osa_core: bool = False,
    norm_above: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple]:
    """``(L⁻¹, exp(M) − I, ok, (s_norm, cond, s_two))`` of the Gram core, ``F = L⁻ᵀ (exp(M) − I) L⁻¹``.

    ``S = B M Bᵀ`` with ``B = U L⁻ᵀ`` orthonormal (module docstring), so ``S`` and ``M`` have the
    same nonzero singular values: ``‖S‖₂ = ‖M‖₂`` and ``‖S‖_F = ‖M‖_F``. ``s_norm = ‖M‖_F / √m``
    is a lower bound of ``‖S‖₂``; ``s_two`` an upper bound: ``‖M‖_F``, and where that is above
    ``norm_above`` :func:`spectral_norm_bound` (within :data:`SPECTRAL_SLACK` of ``‖S‖₂``; None:
    never, ``s_two = ‖M‖_F``). ``cond = ‖L‖_F ‖L⁻¹‖_F / m`` estimates cond(U). ``tol`` is the
    truncation tolerance of :func:`core_skew_exp`. ``osa_core=True`` promises
    ``J = s·[[0, I], [−I, 0]]`` (:func:`osa_skew_core`): then ``M = s (XᵀY − YᵀX)`` from the row
    blocks ``X, Y`` of ``L``, one half-size product instead of two. One host synchronisation
    (whether every factorisation succeeded and whether any ``‖M‖_F`` is above ``norm_above``),
    more only where one is.
    """
    # Outside autograd every (b, m, m) temporary lives in per-thread scratch buffers (see
    # _Scratch); the returned L⁻¹ and exp(M) − I then do too, and are valid until the next call
    # in this thread: callers use them at once (F or C are fresh tensors).
    bufs = _SCRATCH.take(g, 10) if _may_reuse(g, j) else None
    width = g.shape[-1]
    eye = torch.eye(width, dtype=g.dtype, device=g.device)
    chol, chol_inv, ok = cholesky_with_inverse(g, None if bufs is None else (bufs[6], bufs[9]))
    m_out = None if bufs is None else (bufs[7], bufs[8])
    # M before the one host decision, so that "all factorisations succeeded?" and "any ‖M‖_F above
    # norm_above?" are read together (rows that failed hold garbage until replaced below).
    m = core_matrix(chol, j, osa_core, m_out)
    fro = torch.linalg.matrix_norm(m.detach())
    big = None if norm_above is None else ok & (fro > norm_above)
    try:
        if big is None:
            all_ok, any_big = bool(ok.all()), False
        else:
            all_ok, any_big = (bool(x) for x in torch.stack((ok.all(), big.any())).tolist())
    except RuntimeError:  # under torch.func.vmap there is no single value: replace unconditionally
        all_ok, any_big = False, big is not None and _any(big)
    if not all_ok:
        # Failed factorisations contain garbage; replace by I so the batch stays finite, and M
        # again from there (the M above then feeds nothing, so no gradient passes its garbage).
        chol = torch.where(ok[..., None, None], chol, eye)
        chol_inv = torch.where(ok[..., None, None], chol_inv, eye)
        m = core_matrix(chol, j, osa_core, m_out)
        fro = torch.linalg.matrix_norm(m.detach())
    s_norm_lower = fro / math.sqrt(width)
    s_two = spectral_norm_bound(m, fro, norm_above, rows=big) if any_big else fro
    e_minus_i = _skew_exp(m, _truncation_unit(g.dtype, tol), None if bufs is None else bufs[:6])
    if bufs is None:
        e_minus_i = e_minus_i - eye
    else:
        e_minus_i.diagonal(dim1=-2, dim2=-1).sub_(1)
    cond = (torch.linalg.matrix_norm(chol.detach()) * torch.linalg.matrix_norm(chol_inv.detach())) / width
    return chol_inv, e_minus_i, ok, (s_norm_lower, cond, s_two)


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
    if not sync or _transformed(m, fro, sel):
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


def core_matrix(
    chol: torch.Tensor, j: torch.Tensor, osa_core: bool, out: tuple[torch.Tensor, torch.Tensor] | None = None
) -> torch.Tensor:
    """``M = Lᵀ J L``. With ``osa_core`` (``J = s·[[0, I], [−I, 0]]``): ``M = s (XᵀY − YᵀX)`` from
    the row blocks ``X, Y`` of ``L``, one half-size product; ``out`` holds ``XᵀY`` and ``M`` then."""
    if not osa_core:
        return chol.mT @ (j @ chol)
    half = chol.shape[-1] // 2
    top, bottom = chol[..., :half, :].mT, chol[..., half:, :]
    x = torch.matmul(top, bottom) if out is None else torch.matmul(top, bottom, out=out[0])
    m = (x - x.mT) if out is None else torch.sub(x, x.mT, out=out[1])
    return m.mul_(j[..., :1, half : half + 1])


def cholesky_with_inverse(
    g: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(L, L⁻¹, ok)`` with ``G = L Lᵀ``; ``ok`` False where the factorisation failed.

    Even sizes ≥ 32 use one 2 × 2 block step (``L₁₁ = chol(G₁₁)``, ``L₂₁ = G₂₁ L₁₁⁻ᵀ``,
    ``L₂₂ = chol(G₂₂ − L₂₁ L₂₁ᵀ)``, ``(L⁻¹)₂₁ = −L₂₂⁻¹ L₂₁ L₁₁⁻¹``): LAPACK factors a batch of
    small matrices one at a time, and this moves half the work into batched products
    (3.6 ms instead of 5.2 ms for 32 matrices of 128 × 128 on 2 cores). ``out``: two tensors
    shaped like ``g`` to assemble ``L`` and ``L⁻¹`` in (no autograd).
    """
    width = g.shape[-1]
    if width % 2 or width < 32:
        chol, info = torch.linalg.cholesky_ex(g)
        eye = torch.eye(width, dtype=g.dtype, device=g.device)
        return chol, torch.linalg.solve_triangular(chol, eye.expand_as(chol), upper=False), info == 0
    h = width // 2
    eye = torch.eye(h, dtype=g.dtype, device=g.device)
    l11, info1 = torch.linalg.cholesky_ex(g[..., :h, :h])
    l11_inv = torch.linalg.solve_triangular(l11, eye.expand_as(l11), upper=False)
    l21 = g[..., h:, :h] @ l11_inv.mT
    l22, info2 = torch.linalg.cholesky_ex(g[..., h:, h:] - l21 @ l21.mT)
    l22_inv = torch.linalg.solve_triangular(l22, eye.expand_as(l22), upper=False)
    inv21 = -(l22_inv @ (l21 @ l11_inv))
    ok = (info1 == 0) & (info2 == 0)
    if out is None:
        zero = torch.zeros_like(l11)
        chol = torch.cat([torch.cat([l11, zero], -1), torch.cat([l21, l22], -1)], -2)
        chol_inv = torch.cat([torch.cat([l11_inv, zero], -1), torch.cat([inv21, l22_inv], -1)], -2)
        return chol, chol_inv, ok
    for dest, (b11, b21, b22) in zip(out, ((l11, l21, l22), (l11_inv, inv21, l22_inv)), strict=True):
        dest[..., :h, :h] = b11
        dest[..., :h, h:] = 0
        dest[..., h:, :h] = b21
        dest[..., h:, h:] = b22
    return out[0], out[1], ok


def gram_core_with_norm(
    g: torch.Tensor, j: torch.Tensor, norm_above: float | None = FLOAT64_NORM
) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """:func:`gram_core` plus ``(s_norm, cond, s_two)`` of :func:`gram_core_parts` (``s_two``
    tight where above ``norm_above``, by default the float64-recompute bound :data:`FLOAT64_NORM`)."""
    chol_inv, e_minus_i, ok, extra = gram_core_parts(g, j, norm_above=norm_above)
    return chol_inv.mT @ e_minus_i @ chol_inv, ok, extra


def gram_trust_ratio(
    g: torch.Tensor,
    c: torch.Tensor,
    v_norm: torch.Tensor,
    ok: torch.Tensor,
    s_norm: torch.Tensor,
    cond: torch.Tensor,
    dtype: torch.dtype,
    eps: float | None = None,
) -> torch.Tensor:
    """The trust rule of the Gram engine: estimated error over the accuracy budget, per batch element.

    The a-posteriori estimate ``eps·‖U‖_F‖C‖_F/‖V‖_F`` of the cond(U)-amplified rounding error
    (module docstring), with ``‖U‖_F = √tr G``, divided by ``dtype``'s budget
    ``max(base, slope·s_norm)`` (:data:`GRAM_TOLERANCE`); ``inf`` where the Cholesky factorisation
    failed (``ok`` False) or ``cond`` is above :data:`GRAM_MAX_COND`. A ratio above 1 (or NaN)
    means the result is not trusted. ``eps`` defaults to ``dtype``'s machine epsilon (the Triton
    kernels pass float32's, scaled for tf32x3 dots). The torch engine (:func:`gram_action`) and
    the Triton kernels (:mod:`osa_lab.ops.triton.kernels`) both decide with this function, so the
    CPU and GPU paths cannot disagree. Device operations only (no host synchronisation).
    """
    eps = torch.finfo(dtype).eps if eps is None else eps
    u_norm = g.diagonal(dim1=-2, dim2=-1).sum(-1).clamp_min(0).sqrt()
    v_norm = v_norm.double().clamp_min(torch.finfo(torch.float64).tiny)
    est = eps * u_norm * torch.linalg.vector_norm(c.double(), dim=(-2, -1)) / v_norm
    base, slope = GRAM_TOLERANCE.get(dtype, GRAM_TOLERANCE[torch.float32])
    est = est / torch.clamp(slope * s_norm, min=base)
    max_cond = GRAM_MAX_COND.get(dtype, GRAM_MAX_COND[torch.float32])
    return torch.where(ok & (cond <= max_cond), est, torch.full_like(est, math.inf))


def gram_core_backward(
    core: Callable[..., torch.Tensor], g: torch.Tensor, extra: tuple[torch.Tensor, ...], gc: torch.Tensor, p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """Backward of ``C = F(G, …) P`` through the small float64 core, shared by the torch and the
    Triton engine: given ``gC``, returns ``(gG + gGᵀ, gP = Fᵀ gC, grads of extra)``.

    ``core(g, *extra)`` recomputes ``F`` (e.g. ``gram_core(g, j)[0]``); its vector-Jacobian product
    with ``gF = gC Pᵀ`` is taken by autograd with respect to ``g`` and each tensor of ``extra``
    (e.g. ``J`` or the scale it is built from). ``gG`` comes back symmetrised because ``G = UᵀU``.
    """
    with torch.enable_grad():
        g_leaf = g.detach().requires_grad_(True)
        leaves = tuple(x.detach().requires_grad_(True) for x in extra)
        f = core(g_leaf, *leaves)
    gf = gc @ p.mT
    gp = f.detach().mT @ gc
    grads = torch.autograd.grad(f, (g_leaf, *leaves), gf)
    return grads[0] + grads[0].mT, gp, tuple(grads[1:])


def output_norm_change(g: torch.Tensor, p: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``‖V + U C‖_F² − ‖V‖_F² = 2⟨P, C⟩ + ⟨C, G C⟩`` per matrix (float64) from ``G = UᵀU``,
    ``P = UᵀV`` and ``C`` (2r × d): the output check's norm change of the Gram engine's
    ``Y = V + U C`` without another pass over the tokens."""
    c = c.detach().double()
    return 2 * (p.detach().double() * c).sum((-2, -1)) + (c * (g.detach().double() @ c)).sum((-2, -1))


def block_gram(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``UᵀU`` in float64 for ``U = [a b]`` from three products (``bᵀa`` is the transpose of ``aᵀb``)."""
    aa, ab, bb = (a.mT @ a).double(), (a.mT @ b).double(), (b.mT @ b).double()
    return torch.cat([torch.cat([aa, ab], -1), torch.cat([ab.mT, bb], -1)], -2)


class _GramAction(torch.autograd.Function):
    """``exp(U J Uᵀ) V`` by the Gram engine for ``U = [a b]``, with a backward linear in N.

    ``U`` is passed as two column blocks (for OSA, ``a = q`` and ``b = k``) so that it is never
    copied into one N×2r tensor. Forward: ``G = UᵀU``, ``P = UᵀV``, ``C = F(G, J) P``,
    ``Y = V + U C = V + a C_a + b C_b``. Backward (``gY`` given): ``gC = Uᵀ gY``;
    ``gF = gC Pᵀ``; ``gP = Fᵀ gC``; ``gV = gY + U gP``; ``gU = gY Cᵀ + V gPᵀ + U (gG + gGᵀ)``,
    with ``(gG, gJ)`` the vector-Jacobian product of the small float64 core, by autograd.
    With ``create_graph=True`` the backward is the autograd backward of
    :func:`gram_action_reference` (:func:`composite_backward`), so second derivatives are right.
    """

    @staticmethod
    def forward(ctx, a, b, j, v, replaced: bool, osa_core: bool):  # noqa: D102
        ma = a.shape[-1]
        g = block_gram(a, b)
        p = torch.cat([a.mT @ v, b.mT @ v], -2)
        parts = gram_core_parts(g, j, CORE_TOLERANCE.get(v.dtype), osa_core, spectral_refine_above(v.dtype))
        chol_inv, e_minus_i, ok, (s_norm, cond, s_two) = parts
        c = (chol_inv.mT @ (e_minus_i @ (chol_inv @ p.double()))).to(v.dtype)  # F P without forming F
        y = torch.baddbmm(v, a, c[:, :ma])
        y.baddbmm_(b, c[:, ma:])
        # The trust rule (estimate over the dtype's budget): > 1 means "use the QR engine".
        v_norm = torch.linalg.vector_norm(v, dim=(-2, -1))
        est = gram_trust_ratio(g, c, v_norm, ok, s_norm, cond, v.dtype)
        s_two = torch.where(ok, s_two, math.nan)  # an upper bound of ‖M‖₂ = ‖S‖₂
        # Rows whose Y the caller replaces (QR fallback, float64 recompute) get no gradient from here.
        keep = ok & (est <= 1.0) & ~float64_needed(s_two, v.dtype) if replaced else ok
        ctx.save_for_backward(a, b, j, v, g, p, c, keep)
        ctx.flags = (replaced, osa_core)
        v_sq, delta = v_norm.double() ** 2, output_norm_change(g, p, c)
        ctx.mark_non_differentiable(est, s_two, v_sq, delta)
        return y, est, s_two, v_sq, delta

    @staticmethod
    def backward(ctx, gy: torch.Tensor, _gest, _gtwo, _gvsq, _gdelta):  # noqa: D102
        a, b, j, v, g, p, c, keep = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a backward that autograd can differentiate
            gy = torch.where(keep[..., None, None], gy, torch.zeros((), dtype=gy.dtype, device=gy.device))
            ref = functools.partial(gram_action_reference, replaced=ctx.flags[0], osa_core=ctx.flags[1])
            grads = composite_backward(lambda *x: ref(*x)[0], (a, b, j, v), ctx.needs_input_grad[:4], gy)
            return (*grads, None, None)
        need_a, need_b, need_j, need_v = ctx.needs_input_grad[:4]
        ma = a.shape[-1]
        # Rows that failed the Cholesky factorisation or that the caller replaced by the QR
        # engine get no gradient from here: run the core on G = I there so the batch stays
        # finite (a near-singular G would put inf·0 = NaN into the whole batch's gradient).
        eye = torch.eye(g.shape[-1], dtype=g.dtype, device=g.device)
        g = torch.where(keep[..., None, None], g, eye)
        gy = torch.where(keep[..., None, None], gy, torch.zeros((), dtype=gy.dtype, device=gy.device))
        gc = torch.cat([a.mT @ gy, b.mT @ gy], -2)
        if need_j:
            gg, gp, (gj,) = gram_core_backward(lambda g_, j_: gram_core(g_, j_)[0], g, (j,), gc.double(), p.double())
        else:
            j_const = j.detach()
            gg, gp, _ = gram_core_backward(lambda g_: gram_core(g_, j_const)[0], g, (), gc.double(), p.double())
            gj = None
        gg, gp = gg.to(v.dtype), gp.to(v.dtype)
        ga = gb = gv = None
        if need_a or need_b:
            # gU = U gGs + gY Cᵀ + V gPᵀ, one column block at a time.
            def grad_block(cols: slice) -> torch.Tensor:
                out = a @ gg[:, :ma, cols]
                out.baddbmm_(b, gg[:, ma:, cols])
                out.baddbmm_(gy, c[:, cols].mT)
                return out.baddbmm_(v, gp[:, cols].mT)

            ga = grad_block(slice(0, ma)) if need_a else None
            gb = grad_block(slice(ma, None)) if need_b else None
        if need_v:
            gv = torch.baddbmm(gy, a, gp[:, :ma])
            gv.baddbmm_(b, gp[:, ma:])
        return ga, gb, gj, gv, None, None


def gram_action(
    a: torch.Tensor,
    b: torch.Tensor,
    j: torch.Tensor,
    v: torch.Tensor,
    *,
    replaced: bool = False,
    osa_core: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``exp(U J Uᵀ) V`` for ``U = [a b]`` by the Gram engine; returns ``(Y, estimate / budget)``.

    Shapes ``a (b, N, m_a)``, ``b (b, N, m_b)``, ``j (b, m, m)`` skew with ``m = m_a + m_b``,
    ``v (b, N, d)``. A ratio above 1 means the result may miss the dtype's accuracy budget
    (``GRAM_TOLERANCE``, ``GRAM_MAX_COND``); where the Cholesky factorisation failed it is
    ``inf`` and ``Y`` is unreliable, and for inputs below float64 it is ``inf`` too where ``‖S‖₂``
    is above :data:`FLOAT64_NORM` (the float32 result is off by ≈ eps₃₂·‖S‖₂; :func:`blocked_action`
    recomputes those matrices in float64). ``replaced=True`` promises that the caller replaces the
    rows with a ratio above 1, which then get no gradient from here.
    """
    y, est, s_two, _ = _gram_engine(a, b, j, v, replaced, osa_core)
    return y, torch.where(float64_needed(s_two, v.dtype), math.inf, est)


def _gram_engine(
    a: torch.Tensor, b: torch.Tensor, j: torch.Tensor, v: torch.Tensor, replaced: bool, osa_core: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple | None]:
    """``(Y, estimate / budget, ‖S‖₂ bound, norms)`` of the Gram engine (the bound is ``s_two`` of
    :func:`gram_core_parts`, NaN where the factorisation failed; ``norms`` is ``(‖Y‖² , ‖V‖²,
    their difference)`` per matrix for the output check, or None): :class:`_GramAction`, or under
    torch.func transforms and forward-mode AD (which its hand-written backward does not support:
    vmap raised PyTorch's "must override the setup_context" error) :func:`gram_action_reference`."""
    j = j.to(torch.float64)
    if _transformed(a, b, j, v):
        return (*gram_action_reference(a, b, j, v, replaced, osa_core), None)
    y, est, s_two, v_sq, delta = _GramAction.apply(a, b, j, v, replaced, osa_core)
    return y, est, s_two, (v_sq + delta, v_sq, delta)


def composite_backward(
    forward: Callable[..., torch.Tensor], inputs: tuple, needs: tuple[bool, ...], grad_out: torch.Tensor
) -> tuple[torch.Tensor | None, ...]:
    """The vector-Jacobian product of ``forward(*inputs)`` with ``grad_out`` by autograd, with a
    graph (``create_graph=True``): the backward of a hand-written :class:`torch.autograd.Function`
    when a graph of the backward is requested (Hessian-vector products, gradient penalties),
    differentiable to any order. ``inputs`` are the Function's saved inputs, still attached to
    their graph; ``needs`` says which of them want a gradient."""
    with torch.enable_grad():
        outs = forward(*inputs)
        wanted = [x for x, need in zip(inputs, needs, strict=True) if need]
        grads = iter(torch.autograd.grad(outs, wanted, grad_out, create_graph=True, allow_unused=True))
    return tuple(_zero_if_none(next(grads), x) if need else None for x, need in zip(inputs, needs, strict=True))


def _zero_if_none(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like) if grad is None else grad


def gram_action_reference(
    a: torch.Tensor, b: torch.Tensor, j: torch.Tensor, v: torch.Tensor, replaced: bool, osa_core: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:class:`_GramAction`'s forward by plain tensor operations, differentiated by autograd or
    torch.func. With ``replaced``, the rows the caller replaces are recomputed from ``G = I`` (no
    gradient reaches them, and a singular ``G`` cannot put NaN into the others')."""

    def run(g: torch.Tensor, norm_above: float | None) -> tuple[torch.Tensor, ...]:
        parts = gram_core_parts(g, j, CORE_TOLERANCE.get(v.dtype), osa_core, norm_above)
        chol_inv, e_minus_i, ok, (s_norm, cond, s_two) = parts
        c = (chol_inv.mT @ (e_minus_i @ (chol_inv @ p.double()))).to(v.dtype)
        y = v + a @ c[..., : a.shape[-1], :] + b @ c[..., a.shape[-1] :, :]
        v_norm = torch.linalg.vector_norm(v.detach(), dim=(-2, -1))
        est = gram_trust_ratio(g.detach(), c.detach(), v_norm, ok, s_norm.detach(), cond.detach(), v.dtype)
        s_two = torch.where(ok, s_two.detach(), math.nan)
        return y, est, s_two, ok

    g = block_gram(a, b)
    p = torch.cat([a.mT @ v, b.mT @ v], -2)
    y, est, s_two, ok = run(g, spectral_refine_above(v.dtype))
    if replaced:
        keep = ok & (est <= 1.0) & ~float64_needed(s_two, v.dtype)
        if not bool(_concrete(keep).all()):
            eye = torch.eye(g.shape[-1], dtype=g.dtype, device=g.device)
            y = run(torch.where(keep[..., None, None], g, eye), None)[0]  # only Y is used: no ‖S‖₂ needed
    return y, est, s_two


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


def _warn_float64_rounding(s_two: torch.Tensor, engine: str) -> None:
    """Warn (:class:`OSAAccuracyWarning`) when float64 rounding of ``S`` moves the result by more
    than :data:`FLOAT64_ROUNDING_WARN`: ``eps₆₄/2 · ‖S‖₂`` with ``s_two`` per matrix an upper bound
    of ``‖S‖₂``, tight where above :data:`FLOAT64_ROUNDING_NORM` (:func:`spectral_norm_bound`)."""
    two = _concrete(s_two).detach()
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


def _concrete(t: torch.Tensor) -> torch.Tensor:
    """``t`` without its torch.func wrappers: under ``vmap`` the values of the whole vmapped
    batch, so that a decision on them ("does any matrix need float64?") holds for every call."""
    wrapped, unwrap = torch._C._functorch.is_functorch_wrapped_tensor, torch._C._functorch.get_unwrapped
    while wrapped(t):
        t = unwrap(t)
    return t


def _any(mask: torch.Tensor) -> bool:
    """Whether any entry of ``mask`` is True (under torch.func.vmap: anywhere in the vmapped batch)."""
    return bool(_concrete(mask).any())


def _rows(x: torch.Tensor, idx: torch.Tensor | None) -> torch.Tensor:
    return x if idx is None else x[idx]


def _replace_rows(
    y: torch.Tensor, mask: torch.Tensor, compute: Callable[[torch.Tensor | None], torch.Tensor]
) -> torch.Tensor:
    """``y`` (b, …) with the matrices where ``mask`` (b,) holds replaced by ``compute(idx)``, their
    recomputation from the rows ``idx``. Under torch.func transforms, which allow no shapes that
    depend on values, ``compute(None)`` recomputes every row and ``torch.where`` selects."""
    if _transformed(y, mask):
        return torch.where(mask[..., None, None], compute(None), y)
    idx = mask.nonzero().squeeze(-1)
    return y.index_copy(0, idx, compute(idx))


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
    if not (torch.is_grad_enabled() and u.requires_grad) or _transformed(u):
        return b, r
    diag = r.detach().diagonal(dim1=-2, dim2=-1).abs()
    if diag.numel() and _any(diag.amin(-1) <= math.sqrt(torch.finfo(r.dtype).eps) * diag.amax(-1)):
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
    if _any(fro > above):  # else ‖S‖₂ ≤ ‖S‖_F ≤ above: no float64 recompute, no warning
        s_two = spectral_norm_bound(m, fro, above)
        if u.dtype == torch.float64:
            _warn_float64_rounding(s_two, "qr")
            return y
        big = float64_needed(s_two, u.dtype)
        if _any(big):  # eps₃₂·‖S‖₂ would spoil them: those matrices again in float64

            def again(idx: torch.Tensor | None) -> torch.Tensor:
                y64 = qr_action(_rows(u, idx).double(), _rows(j, idx), _rows(v, idx).double(), osa_core=osa_core)
                return y64.to(v.dtype)

            one_batch = u.dim() == 3 and u.shape[:1] == j.shape[:-2] == v.shape[:1] == big.shape
            return _replace_rows(y, big, again) if one_batch else again(None)
    return y


#: Highest degree (products ``S·X``, N×N times N×d, in the forward) of the Chebyshev action of
#: :func:`_small_n_action`: covers ``‖S‖₂ ≲ 10`` in float32 and ``≲ 4.5`` in float64. One product
#: costs ``d/N`` of an N×N product, so 24 of them at N = 49, d = 16 cost what the 8 N×N
#: products of the short-Taylor path (``SHORT_TAYLOR_MAX_PRODUCTS``) cost.
ACTION_MAX_DEGREE = 24


def bessel_j_sequence(x: float, count: int) -> list[float]:
    """``J₀(x), …, J_{count−1}(x)`` for ``x ≥ 0`` in float64 by Miller's backward recurrence
    ``J_{k−1} = (2k/x) J_k − J_{k+1}``, normalised by ``J₀ + 2 Σ J_{2k} = 1`` (stable; matches
    ``scipy.special.jv`` to ≈ 2e-16, tested)."""
    if x < 0 or not math.isfinite(x):
        raise OSAInputError(f"bessel_j_sequence needs a finite x ≥ 0, got {x}")
    if x == 0.0:
        return [1.0] + [0.0] * (count - 1)
    start = count + int(x) + 20
    start += start % 2
    vals = [0.0] * (start + 2)
    vals[start] = 1e-300
    for k in range(start, 0, -1):
        vals[k - 1] = 2 * k / x * vals[k] - vals[k + 1]
        if abs(vals[k - 1]) > 1e250:  # rescale before overflow (only the ratios matter)
            vals = [t * 1e-250 for t in vals]
    norm = vals[0] + 2 * sum(vals[2 : start + 1 : 2])
    return [t / norm for t in vals[:count]]


#: Truncation tolerance of :func:`chebyshev_action` (relative 2-norm error of ``exp(S) V``) per
#: working dtype: float64's unit roundoff; for float32 1e-7, 20× below the float32 accuracy
#: target (2e-6 while ‖S‖₂ ≤ 10, see ``GRAM_TOLERANCE``) and below the rounding of the float32
#: products themselves (≈ √N·eps₃₂/2 ≈ 4e-7 at N = 49): 1.7× the unit roundoff, which saves a
#: term near trained-network norms (degree 7 instead of 8 at ‖S‖₂ = 0.9).
ACTION_TOLERANCE = {torch.float64: torch.finfo(torch.float64).eps / 2, torch.float32: 1e-7}


def chebyshev_degree(rho: float, dtype: torch.dtype) -> int | None:
    """Smallest degree ``m`` of :func:`chebyshev_action` for skew ``S`` with ``‖S‖₂ ≤ rho`` whose
    truncation error is at most ``ACTION_TOLERANCE[dtype]`` (other dtypes: their unit roundoff);
    ``None`` beyond ``ACTION_MAX_DEGREE``.

    ``S`` is normal with eigenvalues ``iθ``, ``|θ| ≤ rho``; by the Jacobi–Anger expansion
    ``e^{iρy} = J₀(ρ) + 2 Σ_k i^k J_k(ρ) T_k(y)`` with ``‖T_k(Y)‖₂ ≤ 1``, the tail after degree
    ``m`` is at most ``2 Σ_{k>m} |J_k(ρ)| ≤ 2 (ρ/2)^{m+1}/(m+1)! / (1 − (ρ/2)/(m+2))`` (using
    ``|J_k(ρ)| ≤ (ρ/2)^k/k!``): the Taylor bound at ``ρ/2``, so about ``m·log 2`` fewer digits
    are lost per degree than by the Taylor series of :func:`taylor_theta`.
    """
    if not math.isfinite(rho) or rho < 0:
        return None
    unit = ACTION_TOLERANCE.get(dtype, torch.finfo(dtype).eps / 2)
    half, term = rho / 2, 1.0  # term = half^m / m!
    for degree in range(1, ACTION_MAX_DEGREE + 1):
        term *= half / degree
        nxt = term * half / (degree + 1)
        if degree + 2 > half and 2 * nxt / (1 - half / (degree + 2)) <= unit:
            return degree
    return None


def chebyshev_coefficients(rho: float, degree: int) -> list[float]:
    """``[J₀(ρ), 2J₁(ρ), …, 2J_m(ρ)]``: ``exp(S) V ≈ Σ_k a_k W_k`` (see :func:`chebyshev_action`)."""
    j = bessel_j_sequence(rho, degree + 1)
    return [j[0]] + [2 * t for t in j[1:]]


def _chebyshev_forward(xt: torch.Tensor, v: torch.Tensor, coef: list[float]) -> tuple[torch.Tensor, list]:
    """``Σ a_k W_k`` with ``W₀ = V``, ``W₁ = X V``, ``W_{k+1} = 2 X W_k + W_{k−1}``, given
    ``xt = Xᵀ``; also returns the transposes ``Z_k = W_kᵀ`` for ``k < m`` (the backward's inputs).

    The recurrence runs on the transposes (``Z_{k+1} = 2 Z_k Xᵀ + Z_{k−1}``) so that the
    backward's ``∂L/∂X = Σ c_k Ḡ_{k+1} Z_k`` multiplies operands stored the way the BLAS reads
    them: a batched product with a transposed right operand (``Ḡ W_kᵀ``) costs about 2.5× as
    much on the CPU at N = 20, d = 16.
    """
    z = v.mT.contiguous()
    zs = [z]
    cur = torch.bmm(z, xt)
    y_t = z.mul(coef[0]).add_(cur, alpha=coef[1])
    prev = z
    for k in range(2, len(coef)):
        zs.append(cur)
        prev, cur = cur, torch.baddbmm(prev, cur, xt, alpha=2.0)
        y_t.add_(cur, alpha=coef[k])
    return y_t.mT.contiguous(), zs


def _chebyshev_backward(
    xt: torch.Tensor, zs: list, coef: list[float], g: torch.Tensor, need_x: bool
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Adjoint of :func:`_chebyshev_forward` (``xt = Xᵀ``): returns ``(∂L/∂X, ∂L/∂V)``.

    With ``Ḡ_k = ∂L/∂W_k`` (through the recurrence): ``Ḡ_m = a_m G``,
    ``Ḡ_k = a_k G + 2Xᵀ Ḡ_{k+1} + Ḡ_{k+2}`` (1 ≤ k < m), ``∂L/∂V = Ḡ₀ = a₀ G + Xᵀ Ḡ₁ + Ḡ₂`` and
    ``∂L/∂X = Ḡ₁ W₀ᵀ + 2 Σ_{k=1}^{m−1} Ḡ_{k+1} W_kᵀ`` (``W_kᵀ = zs[k]``).
    """
    m = len(coef) - 1
    g = g.contiguous()
    after, cur = None, g * coef[m]  # Ḡ_{k+2}, Ḡ_{k+1}
    gx = None
    for k in range(m - 1, -1, -1):
        if need_x:
            scale = 2.0 if k else 1.0
            gx = torch.bmm(cur, zs[k]).mul_(scale) if gx is None else gx.baddbmm_(cur, zs[k], alpha=scale)
        new = torch.baddbmm(g, xt, cur, beta=coef[k], alpha=2.0 if k else 1.0)
        if after is not None:
            new.add_(after)
        after, cur = cur, new
    return gx, cur


class _ChebyshevAction(torch.autograd.Function):
    """``Σ a_k W_k ≈ exp(S) V`` for skew ``S`` (b, N, N) and ``X = S/ρ``, hand-written backward."""

    @staticmethod
    def forward(ctx, s, v, rho: float, degree: int):  # noqa: D102
        xt = (s.mT / rho).contiguous()
        coef = chebyshev_coefficients(rho, degree)
        y, zs = _chebyshev_forward(xt, v, coef)
        ctx.coef, ctx.rho, ctx.degree = coef, rho, degree
        ctx.save_for_backward(s, v, xt, *zs)
        return y

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        s, v, xt, *zs = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the plain-operation reference
            # two more terms: a second derivative of the expansion loses two (see _differentiable_plan)
            ref = functools.partial(chebyshev_action_reference, rho=ctx.rho, degree=ctx.degree + 2)
            return (*composite_backward(ref, (s, v), ctx.needs_input_grad[:2], g), None, None)
        gx, gv = _chebyshev_backward(xt, zs, ctx.coef, g, ctx.needs_input_grad[0])
        gs = gx / ctx.rho if gx is not None else None
        return gs, (gv if ctx.needs_input_grad[1] else None), None, None


class _OSAChebyshevAction(torch.autograd.Function):
    """``exp(S) V`` for the OSA matrix ``S = c (q kᵀ − k qᵀ)`` given ``D = q kᵀ − k qᵀ`` (formed
    by the caller without autograd); the backward goes straight to ``q``, ``k``, ``c``, ``V``:
    with ``A = ∂L/∂S − (∂L/∂S)ᵀ``: ``∂L/∂q = c A k``, ``∂L/∂k = −c A q``, ``∂L/∂c = ½⟨A, D⟩``."""

    @staticmethod
    def forward(ctx, q, k, c, v, d, rho: float, degree: int):  # noqa: D102
        xt = d * (c / -rho)[:, None, None]  # Xᵀ = −X: D is skew by construction
        coef = chebyshev_coefficients(rho, degree)
        y, zs = _chebyshev_forward(xt, v, coef)
        ctx.coef, ctx.rho, ctx.degree = coef, rho, degree
        ctx.save_for_backward(q, k, c, v, d, xt, *zs)
        return y

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        q, k, c, v, d, xt, *zs = ctx.saved_tensors
        need_q, need_k, need_c, need_v = ctx.needs_input_grad[:4]
        if torch.is_grad_enabled():  # create_graph=True: differentiate the plain-operation reference

            def ref(q_, k_, c_, v_):
                qk = q_ @ k_.mT
                return chebyshev_action_reference((qk - qk.mT) * c_[:, None, None], v_, ctx.rho, ctx.degree + 2)

            return (*composite_backward(ref, (q, k, c, v), (need_q, need_k, need_c, need_v), g), None, None, None)
        gx, gv = _chebyshev_backward(xt, zs, ctx.coef, g, need_q or need_k or need_c)
        gq = gk = gc = None
        if gx is not None:
            a = gx - gx.mT  # ρ·A, A = ∂L/∂S − (∂L/∂S)ᵀ (∂L/∂S = ∂L/∂X / ρ; 1/ρ folded in below)
            cc = (c / ctx.rho)[:, None, None]
            gq = torch.bmm(a, k).mul_(cc) if need_q else None
            gk = torch.bmm(a, q).mul_(-cc) if need_k else None
            gc = torch.einsum("bij,bij->b", a, d).mul_(0.5 / ctx.rho) if need_c else None
        return gq, gk, gc, (gv if need_v else None), None, None, None


def chebyshev_action(
    s: torch.Tensor, v: torch.Tensor, rho: float | None = None, degree: int | None = None
) -> torch.Tensor:
    """``exp(S) V`` for skew-symmetric ``S`` without forming ``exp(S)``: the Chebyshev (Jacobi–
    Anger) expansion ``Σ_{k≤m} a_k W_k``, ``a₀ = J₀(ρ)``, ``a_k = 2J_k(ρ)``, ``W₀ = V``,
    ``W₁ = X V``, ``W_{k+1} = 2 X W_k + W_{k−1}`` with ``X = S/ρ`` (Bergamaschi & Vianello,
    Numer. Linear Algebra Appl. 7, 2000; the real recurrence because ``S`` is skew).

    ``rho`` must bound ``‖S‖₂`` (default: :func:`_skew_norm_bound`); ``degree`` defaults to
    :func:`chebyshev_degree` (truncation ≤ ``ACTION_TOLERANCE``). ``‖W_k‖ ≤ ‖V‖`` in exact
    arithmetic, so rounding does not grow with ``ρ`` as the Taylor series' ``e^ρ`` partial sums
    do. One product per degree; for 3-D ``S`` (b, N, N) and ``V`` (b, N, d) the backward is
    hand-written (:class:`_ChebyshevAction`, ``2m`` products, ``Sᵀ = −S``); under torch.func
    transforms and forward-mode AD the autograd reference :func:`chebyshev_action_reference` runs.
    Raises :class:`~osa_lab.errors.OSAInputError` when no degree up to ``ACTION_MAX_DEGREE`` reaches the tolerance.
    """
    rho = _skew_norm_bound(s) if rho is None else float(rho)
    degree = chebyshev_degree(rho, s.dtype) if degree is None else degree
    if degree is None:
        raise OSAInputError(f"‖S‖₂ bound {rho:.3g} needs more than ACTION_MAX_DEGREE = {ACTION_MAX_DEGREE} terms")
    rho = max(rho, 1e-30)  # S = 0: X = 0 and the expansion sums to V for any ρ > 0
    if s.dim() == 3 and v.dim() == 3 and s.shape[0] == v.shape[0] and not _transformed(s, v):
        return _ChebyshevAction.apply(s, v, rho, degree)
    return chebyshev_action_reference(s, v, rho, degree)


def chebyshev_action_reference(s: torch.Tensor, v: torch.Tensor, rho: float, degree: int) -> torch.Tensor:
    """:func:`chebyshev_action` by plain tensor operations, differentiated by autograd (the reference)."""
    coef = chebyshev_coefficients(rho, degree)
    x = s / rho
    prev, cur = v, x @ v
    y = coef[0] * v + coef[1] * cur
    for k in range(2, degree + 1):
        prev, cur = cur, 2 * (x @ cur) + prev
        y = y + coef[k] * cur
    return y


#: relative slack of :func:`skew_spectral_bound` over its float-rounded value (``D²`` is
#: rounded by about N·eps of its dtype; 1e-4 keeps the bound above ``‖D‖₂`` with room to spare)
NORM_BOUND_SLACK = 1e-4


def skew_spectral_bound(d: torch.Tensor) -> torch.Tensor:
    """An upper bound of ``‖D‖₂`` per matrix of a batch of skew-symmetric ``D`` (b, N, N):
    ``‖D²‖_F^{1/2}``, since ``D`` is normal and so ``‖D‖₂² = ‖D²‖₂ ≤ ‖D²‖_F``.

    It is never above ``‖D‖_F`` and was 1.2–1.9× below it for random ``q, k`` (the Frobenius
    bound counts every eigenvalue pair, this one mostly the largest): a degree or two fewer in
    :func:`chebyshev_degree` for the price of one N×N×N product.
    """
    return torch.linalg.vector_norm(torch.bmm(d, d), dim=(-2, -1)).sqrt_().mul_(1 + NORM_BOUND_SLACK)


def osa_chebyshev_action(q: torch.Tensor, k: torch.Tensor, c: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
    """``exp(c (q kᵀ − k qᵀ)) V`` by :func:`chebyshev_action` with the backward fused down to
    ``q, k, c`` (:class:`_OSAChebyshevAction`); 3-D ``q, k (b, N, r)``, ``c (b,)``, ``V (b, N, d)``.
    ``None`` when ``‖S‖₂``'s bound needs more than ``ACTION_MAX_DEGREE`` terms or under torch.func
    transforms / forward-mode AD (the caller's general path handles those)."""
    if _transformed(q, k, c, v):
        return None
    with torch.no_grad():
        qk = torch.bmm(q, k.mT)
        d = qk - qk.mT
        bound = skew_spectral_bound(d) * c.detach().abs().to(d.dtype)
        rho = float(bound.max()) if bound.numel() else 0.0
    degree = chebyshev_degree(rho, v.dtype)
    if degree is None:
        return None
    return _OSAChebyshevAction.apply(q, k, c.to(q.dtype), v, d, max(rho, 1e-30), degree)


def _transformed(*tensors: torch.Tensor) -> bool:
    """True under torch.func transforms (jacrev, jacfwd, vmap, grad) or forward-mode AD, which the
    hand-written backwards of :class:`_ChebyshevAction` and :class:`_GramAction` do not support:
    the plain-operation references run there."""
    from torch.autograd import forward_ad

    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    return any(wrapped(t) or forward_ad.unpack_dual(t).tangent is not None for t in tensors)


def _skew_norm_bound(s: torch.Tensor) -> float:
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
        bound = _skew_norm_bound(s)
        degree = chebyshev_degree(bound, s.dtype)
        if degree is not None:
            return chebyshev_action(s, v, bound, degree)
    try:
        norm = float(s.detach().abs().sum(-2).amax()) if s.numel() else 0.0
    except RuntimeError:  # under torch.func.vmap a tensor has no single value
        norm = math.inf
    plan = short_taylor_plan(norm, s.dtype) if math.isfinite(norm) else None
    if plan is not None:
        return _short_taylor(s, *_differentiable_plan(plan, s)) @ v
    if u.shape[-2] > u.shape[-1]:
        return None
    u64 = u.double()
    s64 = u64 @ j.to(torch.float64) @ u64.mT
    fro = torch.linalg.matrix_norm(s64.detach())
    if _any(fro > FLOAT64_ROUNDING_NORM):  # else no warning: eps₆₄/2·‖S‖₂ ≤ eps₆₄/2·‖S‖_F ≤ the threshold
        _warn_float64_rounding(spectral_norm_bound(s64, fro, FLOAT64_ROUNDING_NORM), "qr")
    return (core_skew_exp(s64) @ v.double()).to(v.dtype)


def lowrank_action(u: torch.Tensor, j: torch.Tensor, v: torch.Tensor, *, engine: str = "lowrank") -> torch.Tensor:
    """``exp(U J Uᵀ) V`` for skew ``J`` without forming an N×N matrix.

    ``u (..., N, m)``, ``j (..., m, m)`` skew-symmetric, ``v (..., N, d)``; leading dims
    broadcast. ``engine`` is ``"gram"``, ``"qr"`` or ``"lowrank"`` (Gram with a QR fallback
    for the matrices the Gram engine cannot compute accurately; see module docstring).
    """
    if j.shape[-1] != u.shape[-1] or j.shape[-2] != u.shape[-1]:
        raise OSAInputError(f"`j` must be ({u.shape[-1]}, {u.shape[-1]}) to match `u`; got {tuple(j.shape)}")
    if u.shape[-2] != v.shape[-2]:
        raise OSAInputError(f"`u` has N={u.shape[-2]} tokens but `v` has N={v.shape[-2]}")
    if u.shape[-2] == 0:
        raise OSAInputError(f"`u` has N=0 tokens (shape {tuple(u.shape)}); lowrank_action needs at least one token")
    try:
        batch = torch.broadcast_shapes(u.shape[:-2], j.shape[:-2], v.shape[:-2])
    except RuntimeError as exc:
        raise OSAInputError(
            f"leading dims of `u` {tuple(u.shape[:-2])}, `j` {tuple(j.shape[:-2])} and `v` "
            f"{tuple(v.shape[:-2])} do not broadcast"
        ) from exc
    n, m, d = u.shape[-2], u.shape[-1], v.shape[-1]
    if math.prod(batch) == 0 or d == 0:  # nothing to transform: an empty result of the right shape
        return v.expand(*batch, n, d).clone()
    u3 = u.expand(*batch, n, m).reshape(-1, n, m)
    j3 = j.expand(*batch, m, m).reshape(-1, m, m)
    v3 = v.expand(*batch, n, d).reshape(-1, n, d)
    half = m // 2
    y3 = blocked_action(u3[..., :half], u3[..., half:], j3, v3, engine)
    return y3.reshape(*batch, n, d)


def blocked_action(
    a: torch.Tensor,
    b: torch.Tensor,
    j: torch.Tensor,
    v: torch.Tensor,
    engine: str,
    *,
    osa_core: bool = False,
    norms: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, tuple | None]:
    """``exp(U J Uᵀ) V`` for ``U = [a b]`` given as 3-D blocks ``(batch, N, ·)`` (no broadcasting).

    The entry point of :func:`osa_lab.osa` (``a = q``, ``b = k``, ``osa_core=True``: ``j`` is
    :func:`osa_skew_core`) and :func:`lowrank_action`. Below float64, the matrices with ``‖S‖₂``
    above :data:`FLOAT64_NORM` are recomputed by the same engine in float64 (measured there);
    ``‖S‖_F`` settles those at or below it without further cost (:func:`gram_core_parts`).
    ``norms=True`` returns ``(Y, norms)`` with the output check's ``(‖Y‖², ‖V‖², difference)``
    per matrix where the Gram engine's small matrices give them (:func:`output_norm_change`), None
    where rows were recomputed or another engine ran.
    """
    if engine not in ENGINES:
        raise unknown_name("engine", engine, ENGINES)
    if engine == "qr":  # (osa() tries osa_chebyshev_action before building J; not again here)
        y = qr_action(torch.cat([a, b], -1), j, v, osa_core=osa_core and a.shape[-1] == b.shape[-1])
        return (y, None) if norms else y
    if v.shape[0] == 0 or v.shape[-2] == 0:
        return (v.clone(), None) if norms else v.clone()
    y, est, s_two, sq = _gram_engine(a, b, j, v, engine != "gram", osa_core)
    if v.dtype == torch.float64:
        _warn_float64_rounding(s_two, engine)
    big = float64_needed(s_two, v.dtype)
    if _any(big):  # below float64 with ‖S‖₂ > FLOAT64_NORM: the same engine in float64 there

        def in_float64(idx: torch.Tensor | None) -> torch.Tensor:
            a64, b64, v64 = (_rows(x, idx).double() for x in (a, b, v))
            return blocked_action(a64, b64, _rows(j, idx), v64, engine, osa_core=osa_core).to(v.dtype)

        y, sq = _replace_rows(y, big, in_float64), None
        est = torch.where(big, 0.0, est)  # settled by the float64 engine, which refuses or falls back itself
    if engine == "gram":
        y = _refuse_untrusted_gram(a, b, v, y, est)
        return (y, sq) if norms else y
    bad = est > 1.0
    if _any(bad):

        def by_qr(idx: torch.Tensor | None) -> torch.Tensor:
            return qr_action(torch.cat([_rows(a, idx), _rows(b, idx)], -1), _rows(j, idx), _rows(v, idx))

        y, sq = _replace_rows(y, bad, by_qr), None
    return (y, sq) if norms else y


def _refuse_untrusted_gram(a: torch.Tensor, b: torch.Tensor, v: torch.Tensor, y: torch.Tensor, est: torch.Tensor) -> torch.Tensor:
    """The ``"gram"`` engine alone: return ``y`` only where its own estimate trusts it.

    ``est`` is the Gram engine's error estimate over its budget, ``inf`` where the Cholesky
    factorisation failed or the condition estimate of ``U = [a b]`` is over ``GRAM_MAX_COND``
    (rank-deficient ``U``: N < 2r, k ∥ q, q = 0; there the result is wrong by O(1) and its
    gradients are zero). Any untrusted matrix raises :class:`UntrustedResultError`, unless the
    inputs hold NaN/Inf (the caller names those), where the untrusted rows become NaN instead
    of a wrong value. Under ``torch.func.vmap`` the decision is taken on the whole vmapped batch
    (:func:`_concrete`), so vmap raises exactly where a loop over the batch would; it used to
    turn those rows into NaN there.
    """
    bad = ~(est <= 1.0)  # NaN counts as untrusted
    if not _any(bad):
        return y
    if not all(sum_is_finite(_concrete(t)) for t in (a, b, v)):
        return torch.where(bad[..., None, None], torch.full_like(y, math.nan), y)
    bad, est = _concrete(bad), _concrete(est)
    count, n, width = int(bad.sum()), a.shape[-2], a.shape[-1] + b.shape[-1]
    worst = float(est.max())
    why = (
        "its Cholesky factorisation failed or its condition estimate of U = [q k] is over the limit"
        if not math.isfinite(worst)
        else f"its error estimate is {worst:.3g}× the {v.dtype} accuracy budget"
    )
    raise UntrustedResultError(
        f"method/engine 'gram' refuses {count} of {est.numel()} matrices (N={n}, 2r={width}): the "
        f"Gram/Cholesky factorisation is not trustworthy for this input ({why}; [q k] is "
        "rank-deficient or ill-conditioned, e.g. N < 2r, k parallel to q, or q = 0), so its result "
        "and gradients would be wrong. Use method=\"qr\", \"lowrank\" or \"auto\" (engine \"qr\" or "
        "\"lowrank\" for lowrank_action), which handle any q, k."
    )
