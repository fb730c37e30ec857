"""The exponential of small skew-symmetric cores: scaling and squaring of a Paterson–Stockmeyer Taylor polynomial,
with products in reused buffers (the low-rank engines' 2r×2r problem).

Part of :mod:`osa_lab.ops.expm` (Zhang & Martens, arXiv 2602.05996; docs/design.md §1–§2).
"""

from __future__ import annotations

import functools
import math

import torch

from osa_lab.errors import OSAInputError
from osa_lab.ops.cpu import core_kernels
from osa_lab.ops.expm.batch import under_transform
from osa_lab.ops.expm.dense import dense_exp
from osa_lab.ops.expm.scratch import SCRATCH


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
    best: tuple[tuple[int, int], int, int, int] | None = None
    for degree, block in _PS_SCHEMES:
        if block not in blocks:
            continue
        theta = taylor_theta(degree, unit)
        squarings = max(0, math.ceil(math.log2(rho / theta))) if rho > 0 else 0
        key = (_ps_products(degree, block) + squarings, -degree)
        if best is None or key < best[0]:
            best = (key, degree, block, squarings)
    if best is None:
        raise ValueError(f"no Paterson–Stockmeyer scheme among the blocks {blocks}")
    return best[1:]


def one_norm(x: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """``‖x‖₁`` over the last two dims of a skew-symmetric or symmetric ``x`` (``‖x‖₁ = ‖x‖_∞``):
    the largest row sum (a contiguous reduction); ``|x|`` goes into ``scratch`` when given.
    (``torch.linalg.vector_norm(ord=1)`` measured 10× slower than this.)"""
    x = x.detach()
    ax = torch.abs(x, out=scratch) if scratch is not None else x.abs()
    return ax.sum(-1).amax(-1)


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
    unit = truncation_unit(m.dtype, tol)
    bufs = SCRATCH.take(m, 6) if may_reuse(m) else None
    e = skew_exp(m, unit, bufs)
    if minus_identity:
        return e - torch.eye(n, dtype=e.dtype, device=e.device)
    return e.clone() if bufs is not None else e  # never hand out a scratch buffer


def truncation_unit(dtype: torch.dtype, tol: float | None) -> float:
    """The Taylor truncation tolerance: ``tol``, or the unit roundoff of ``dtype`` when None."""
    if tol is None:
        return torch.finfo(dtype).eps / 2
    if not (isinstance(tol, (int, float)) and 0 < tol < 1):
        raise OSAInputError(f"`tol` must be a number in (0, 1) (a relative truncation error), got {tol!r}")
    return float(tol)


def _finite_max(t: torch.Tensor) -> float:
    """Largest finite entry of ``t`` (0 if none); raises RuntimeError under torch.func.vmap."""
    return float(torch.where(torch.isfinite(t), t, 0.0).max())


def may_reuse(*tensors: torch.Tensor) -> bool:
    """True when products may be written into scratch buffers: 3-D CPU tensors of one shape,
    outside autograd, forward-mode AD and torch.func transforms (whose wrappers hide the real shape)."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    return (
        not grad
        and all(t.dim() == 3 and t.device.type == "cpu" for t in tensors)
        and all(t.shape == tensors[0].shape for t in tensors)
        and not under_transform(*tensors)
    )


#: Largest spread of squaring counts (doublings of ‖M‖) over a batch that :func:`core_skew_exp`
#: serves with one shared scaling; beyond it each matrix is scaled and squared on its own.
SHARED_SCALING_SPREAD = 4


def product_into(
    x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, alpha: float = 1.0, add: torch.Tensor | None = None
) -> torch.Tensor:
    """``out = alpha · x y + add`` written into the scratch buffer ``out`` (``add`` None: no term):
    by the CPU kernels' float64 products where they apply (:mod:`osa_lab.ops.cpu.core_kernels`),
    else ``torch.baddbmm`` / ``torch.matmul`` (the reference)."""
    if core_kernels.usable(x, y, out):
        return core_kernels.matmul(x, y, out, alpha, add)
    if add is not None:
        return torch.baddbmm(add, x, y, alpha=alpha, out=out)
    out = torch.matmul(x, y, out=out)
    return out.mul_(alpha) if alpha != 1.0 else out


def taylor_ps(
    powers: list[torch.Tensor | None], degree: int, block: int, h: float | torch.Tensor, bufs: list | None
) -> torch.Tensor:
    """Paterson–Stockmeyer value of the degree-``degree`` Taylor polynomial of ``X = h·M`` from the
    powers ``M, …, M^q`` (q = ``block``); ``h`` is a float, or a tensor ``(..., 1, 1)`` with one
    scaling per matrix. With ``bufs`` (float ``h`` only) the work goes into ``bufs[3:6]``."""
    hq = h**block

    def power(j: int) -> torch.Tensor:
        x = powers[j]
        if x is None:
            raise ValueError(f"taylor_ps needs M^{j} among the powers")
        return x

    def add_scaled(out: torch.Tensor, x: torch.Tensor, c: float | torch.Tensor) -> torch.Tensor:
        return out.addcmul_(x, c) if torch.is_tensor(c) else out.add_(x, alpha=c)

    def block_poly(first: int) -> torch.Tensor:
        """``B_i(X) = Σ_{0≤j<q, first+j≤m} X^j / (first+j)!`` with ``first = q·i``."""
        out: torch.Tensor | None = None
        for j in range(1, block):
            if first + j <= degree:
                c = h**j / math.factorial(first + j)
                if out is None:
                    out = torch.mul(power(j), c, out=bufs[3]) if bufs is not None else power(j) * c
                else:
                    add_scaled(out, power(j), c)
        if out is None:  # block ≥ 2 and first + 1 ≤ degree for every block the plan uses
            raise ValueError(f"taylor_ps: no term for block {block} from {first} at degree {degree}")
        out.diagonal(dim1=-2, dim2=-1).add_(1 / math.factorial(first))
        return out

    # Horner in X^q: p = B_0 + X^q (B_1 + X^q (… + X^q B_top)); B_top = I/m! when q | m.
    top = degree // block
    xq = power(block)
    if degree % block == 0:
        top -= 1
        first = add_scaled(block_poly(block * top), xq, hq / math.factorial(degree))
    else:
        first = block_poly(block * top)
    e, spare = (bufs[4].copy_(first), bufs[5]) if bufs is not None else (first, None)
    for i in range(top - 1, -1, -1):
        if spare is not None:  # with bufs: spare = B_i + h^q X^q e in one pass
            e, spare = product_into(xq, e, spare, float(hq), add=block_poly(block * i)), e
        else:
            e = (xq @ e).mul(hq).add(block_poly(block * i))
    return e


def skew_exp(m: torch.Tensor, unit: float, bufs: list[torch.Tensor] | None) -> torch.Tensor:
    """:func:`core_skew_exp` with truncation tolerance ``unit``; with ``bufs`` (6 tensors shaped
    like ``m``) every product is written into them and the result may be one of them."""

    def mm(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        return product_into(x, y, out) if out is not None else torch.matmul(x, y)

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
    powers: list[torch.Tensor | None] = [None, m, m2]
    if block >= 3:
        powers.append(mm(m2, m, slot[1]))
    if block >= 4:
        m4 = mm(m2, m2, slot[2])
        powers.append(m4)
        # ‖M⁴‖₁^{1/4} is usually the tighter bound: re-plan among the schemes that use M⁴.
        rho_t = torch.minimum(rho_t, one_norm(m4, slot[3]) ** 0.25)
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
        e, spare = product_into(e, e, spare), e
    return e
