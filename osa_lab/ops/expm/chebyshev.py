"""The small-N Chebyshev (Jacobi–Anger) action ``exp(S) V = Σ a_k W_k`` with hand-written backwards.

Part of :mod:`osa_lab.ops.expm` (Zhang & Martens, arXiv 2602.05996; docs/design.md §1–§2).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from osa_lab.errors import OSAInputError
from osa_lab.ops import cpu as cpu_kernels
from osa_lab.ops.amp import autocast_off_backward
from osa_lab.ops.expm.batch import composite_backward, under_transform, vmap_only
from osa_lab.ops.expm.bounds import (
    skew_bound_with_allowance,
    skew_norm_bound,
    skew_spectral_bound,
    small_skew_bound,
)
from osa_lab.ops.expm.scratch import ACTION_SCRATCH

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


def _chebyshev_forward(
    xt: torch.Tensor, z: torch.Tensor, coef: list[float], scale: float = 1.0
) -> tuple[torch.Tensor, list]:
    """``(Σ a_k W_k)ᵀ`` with ``W₀ = V``, ``W₁ = X V``, ``W_{k+1} = 2 X W_k + W_{k−1}``, given
    ``xt = Xᵀ / scale`` and ``z = Vᵀ`` (packed, (b, d, N)); also returns the transposes
    ``Z_k = W_kᵀ`` for ``k < m`` (the backward's inputs). ``scale`` rides on the products, so the
    caller never rescales an N×N matrix.

    The recurrence runs on the transposes (``Z_{k+1} = 2 Z_k Xᵀ + Z_{k−1}``) so that the
    backward's ``∂L/∂X = Σ c_k Ḡ_{k+1} Z_k`` multiplies operands stored the way the BLAS reads
    them: a batched product with a transposed right operand (``Ḡ W_kᵀ``) costs about 2.5× as
    much on the CPU at N = 20, d = 16.
    """
    zs = [z]
    cur = torch.bmm(z, xt)
    if scale != 1.0:
        cur.mul_(scale)
    y_t = z.mul(coef[0]).add_(cur, alpha=coef[1])
    prev = z
    for k in range(2, len(coef)):
        zs.append(cur)
        prev, cur = cur, torch.baddbmm(prev, cur, xt, alpha=2.0 * scale)
        y_t.add_(cur, alpha=coef[k])
    return y_t, zs


def _chebyshev_backward(
    xt: torch.Tensor,
    zs: list,
    coef: list[float],
    g: torch.Tensor,
    need_x: bool,
    scale: float = 1.0,
    gx_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Adjoint of :func:`_chebyshev_forward` (``xt = Xᵀ / scale``): returns ``(∂L/∂X, ∂L/∂V)``.

    With ``Ḡ_k = ∂L/∂W_k`` (through the recurrence): ``Ḡ_m = a_m G``,
    ``Ḡ_k = a_k G + 2Xᵀ Ḡ_{k+1} + Ḡ_{k+2}`` (1 ≤ k < m), ``∂L/∂V = Ḡ₀ = a₀ G + Xᵀ Ḡ₁ + Ḡ₂`` and
    ``∂L/∂X = Ḡ₁ W₀ᵀ + 2 Σ_{k=1}^{m−1} Ḡ_{k+1} W_kᵀ`` (``W_kᵀ = zs[k]``), written into ``gx_out``
    when given.
    """
    m = len(coef) - 1
    g = g.contiguous()
    after, cur = None, g * coef[m]  # Ḡ_{k+2}, Ḡ_{k+1}
    gx = None
    for k in range(m - 1, -1, -1):
        if need_x:
            weight = 2.0 if k else 1.0
            if gx is None:
                gx = torch.bmm(cur, zs[k], out=gx_out).mul_(weight)
            else:
                gx.baddbmm_(cur, zs[k], alpha=weight)
        step = (2.0 if k else 1.0) * scale
        if after is None:
            new = torch.baddbmm(g, xt, cur, beta=coef[k], alpha=step)
        else:  # Ḡ_{k+2} is not needed again: Ḡ_k overwrites it (no fresh tensor per degree)
            new = after.add_(g, alpha=coef[k]).baddbmm_(xt, cur, alpha=step)
        after, cur = cur, new
    return gx, cur


class _ChebyshevAction(torch.autograd.Function):
    """``Σ a_k W_k ≈ exp(S) V`` for skew ``S`` (b, N, N) and ``X = S/ρ``, hand-written backward."""

    @staticmethod
    def forward(ctx, s, v, rho: float, degree: int):  # noqa: D102
        xt = (s.mT / rho).contiguous()
        coef = chebyshev_coefficients(rho, degree)
        y_t, zs = _chebyshev_forward(xt, v.mT.contiguous(), coef)
        y = y_t.mT.contiguous()
        ctx.coef, ctx.rho, ctx.degree = coef, rho, degree
        ctx.save_for_backward(s, v, xt, *zs)
        return y

    @staticmethod
    @autocast_off_backward
    def backward(ctx, g):  # noqa: D102
        s, v, xt, *zs = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the plain-operation reference
            # two more terms: a second derivative of the expansion loses two (see differentiable_plan)
            ref = functools.partial(chebyshev_action_reference, rho=ctx.rho, degree=ctx.degree + 2)
            return (*composite_backward(ref, (s, v), ctx.needs_input_grad[:2], g), None, None)
        gx, gv = _chebyshev_backward(xt, zs, ctx.coef, g, ctx.needs_input_grad[0])
        gs = gx / ctx.rho if gx is not None else None
        return gs, (gv if ctx.needs_input_grad[1] else None), None, None


class _OSAChebyshevAction(torch.autograd.Function):
    """``exp(S) V`` for the OSA matrix ``S = c (q kᵀ − k qᵀ)`` given ``Sᵀ`` and ``U = [k q]``
    packed (B, N, 2r), formed by the caller without autograd (:func:`_osa_skew_factors`); ``q, k
    (*batch, N, r)`` and ``V (*batch, N, d)`` in any layout, ``c`` one value per matrix,
    flattened to ``(B,)``.

    The backward goes straight to ``q``, ``k``, ``c``, ``V``: with ``A = ∂L/∂S − (∂L/∂S)ᵀ``:
    ``∂L/∂q = c A k``, ``∂L/∂k = −c A q`` and ``∂L/∂c = ⟨∂L/∂S, q kᵀ − k qᵀ⟩ = ½⟨A, q kᵀ − k qᵀ⟩
    = ⟨A k, q⟩`` (``A`` is skew), a by-product of ``∂L/∂q``'s product; ``A U = [A k  A q]`` is
    one product, and the gradients are written straight into q's and k's layout.

    The output takes V's layout (``torch.empty_like``): for a layer's head-split views of
    (batch, N, heads·d) memory, ``y.transpose(1, 2).reshape(batch, N, heads·d)`` is then a view.
    Between the caller's layout and the recurrence's packed one there are no copies beyond the
    passes the recurrence makes anyway (``U``, ``Vᵀ``, the result and the gradients); apart from
    ``A``'s ``gx − gxᵀ``, none of the backward's passes reads transposed memory, which costs 2–3×
    a plain pass on the CPU.

    Also returns the output check's per-matrix squared norms ``‖y_b‖², ‖V_b‖²`` (float64, not
    differentiable), reduced from the packed ``yᵀ, Vᵀ``: a strided reduction over a head-split view
    costs several times as much.
    """

    @staticmethod
    def forward(ctx, q, k, c, v, st, u, rho: float, degree: int):  # noqa: D102
        coef = chebyshev_coefficients(rho, degree)
        zt = _packed(v.mT)
        yt, zs = _chebyshev_forward(st, zt, coef, 1.0 / rho)  # Xᵀ = Sᵀ/ρ, the 1/ρ on the products
        y = torch.empty_like(v)
        y.copy_(yt.view(v.mT.shape).mT)
        acc = torch.float64 if v.dtype == torch.float64 else torch.float32
        y_sq, v_sq = (torch.linalg.vector_norm(t, dim=(-2, -1), dtype=acc).double() ** 2 for t in (yt, zt))
        ctx.mark_non_differentiable(y_sq, v_sq)
        ctx.coef, ctx.rho, ctx.degree = coef, rho, degree
        ctx.save_for_backward(q, k, c, v, st, u, *zs)
        return y, y_sq, v_sq

    @staticmethod
    @autocast_off_backward
    def backward(ctx, g, _y_sq, _v_sq):  # noqa: D102
        q, k, c, v, st, u, *zs = ctx.saved_tensors
        need_q, need_k, need_c, need_v = ctx.needs_input_grad[:4]
        if torch.is_grad_enabled():  # create_graph=True: differentiate the plain-operation reference
            grads = _reference_osa_grads(q, k, c, v, ctx.rho, ctx.degree, (need_q, need_k, need_c, need_v), g)
            return (*grads, None, None, None, None)
        need_x = need_q or need_k or need_c
        gx_out, a_out = ACTION_SCRATCH.take(st, 2) if need_x else (None, None)
        gx, gv = _chebyshev_backward(st, zs, ctx.coef, g.reshape(-1, *v.shape[-2:]), need_x, 1.0 / ctx.rho, gx_out)
        gq = gk = gc = None
        if gx is not None:
            a = torch.sub(gx, gx.mT, out=a_out)  # ρ·A, A = ∂L/∂S − (∂L/∂S)ᵀ (∂L/∂S = ∂L/∂X / ρ; 1/ρ folded in below)
            cc = (c / ctx.rho).view(*q.shape[:-2], 1, 1)
            r = q.shape[-1]
            au = torch.bmm(a, u)  # [A k  A q] (times ρ)
            ak = au[..., :r]
            if need_q:
                gq = torch.mul(ak.view(q.shape), cc, out=torch.empty_like(q))
            if need_k:
                gk = torch.mul(au[..., r:].view(k.shape), cc.neg(), out=torch.empty_like(k))
            if need_c:
                gc = (ak * u[..., r:]).sum((-2, -1)).mul_(1.0 / ctx.rho)
        gv = gv.view(v.shape) if need_v else None
        return gq, gk, gc, gv, None, None, None, None


def _reference_osa_grads(q, k, c, v, rho: float, degree: int, needs: tuple[bool, ...], g: torch.Tensor) -> tuple:
    """``∂L/∂(q, k, c, v)`` by autograd through :func:`chebyshev_action_reference` on the OSA
    matrix, differentiable again (the ``create_graph=True`` backward of the fused actions); two
    more terms, since a second derivative of the expansion loses two."""

    def ref(q_, k_, c_, v_):
        qk = q_ @ k_.mT
        s = (qk - qk.mT) * c_.view(*q_.shape[:-2], 1, 1)
        return chebyshev_action_reference(s, v_, rho, degree + 2)

    return composite_backward(ref, (q, k, c, v), needs, g)


class _OSAChebyshevActionCPU(torch.autograd.Function):
    """:class:`_OSAChebyshevAction` by the fused C kernels of :mod:`osa_lab.ops.cpu` (float32 on
    the CPU): ``Sᵀ`` from :func:`osa_lab.ops.cpu.kernels.prepare`, then one kernel call for the
    forward and one for the whole backward down to ``q, k, c, V``, each matrix start to finish in
    cache and every tensor read and written in its own layout. Same outputs (``y`` in V's layout,
    the float64 sums of squares); :class:`_OSAChebyshevAction` is the reference beside it, and
    ``create_graph=True`` differentiates the same plain-operation reference."""

    @staticmethod
    def forward(ctx, q, k, c, v, st, rho: float, degree: int):  # noqa: D102
        coef = chebyshev_coefficients(rho, degree)
        y, zs, y_sq, v_sq = cpu_kernels.chebyshev_forward(st, v, coef, rho)
        ctx.mark_non_differentiable(y_sq, v_sq)
        ctx.coef, ctx.rho, ctx.degree = coef, rho, degree
        ctx.save_for_backward(q, k, c, v, st, zs)
        return y, y_sq, v_sq

    @staticmethod
    @autocast_off_backward
    def backward(ctx, g, _y_sq, _v_sq):  # noqa: D102
        q, k, c, v, st, zs = ctx.saved_tensors
        needs = tuple(ctx.needs_input_grad[:4])
        if torch.is_grad_enabled():  # create_graph=True
            return (*_reference_osa_grads(q, k, c, v, ctx.rho, ctx.degree, needs, g), None, None, None)
        gq, gk, gc, gv = cpu_kernels.chebyshev_backward(st, zs, ctx.coef, ctx.rho, c, g, q, k, v, needs)
        if gc is not None:
            gc = gc.sum_to_size(c.shape)  # one c for every matrix: its gradient is the sum
        return gq, gk, gc, gv, None, None, None


def _packed(x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` (…, a, b), in any layout, times ``scale`` when given, as a contiguous (B, a, b)
    tensor: one pass, whatever the strides (a transposed or head-split view included); a view of
    ``x`` when it is contiguous already and there is no scale."""
    if scale is None and x.is_contiguous():
        return x.view(-1, *x.shape[-2:])
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if scale is None:
        out.copy_(x)
    else:
        torch.mul(x, scale, out=out)
    return out.view(-1, *x.shape[-2:])


def _osa_skew_factors(q: torch.Tensor, k: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(Sᵀ, U, spare)`` for ``q, k (*batch, N, r)`` in any layout and ``c`` flattened ``(B,)``:
    ``U = [k q]`` (B, N, 2r, packed in one pass per half from the caller's layout and kept for
    the backward) and ``Sᵀ = c (P − Pᵀ)`` with ``P = k qᵀ`` (B, N, N), the OSA matrix of
    docs/design.md §1: one product of inner size r on the halves of ``U`` (the BLAS reads the
    transposed half in place), ``P`` in the second of :data:`ACTION_SCRATCH`'s pair of N×N
    buffers; ``spare`` is the first, for the bound's ``S²`` next. ``Sᵀ`` is exactly
    skew-symmetric, as :func:`~osa_lab.ops.expm.bounds.skew_spectral_bound` assumes.

    Forming the product ``[k q]·[c qᵀ; −c kᵀ]`` instead needed the scaled transposes packed from
    the head-split layout, strided passes that cost more than the product (about 1.3× this
    function at N = 20 and 49, batch 256, r = 16)."""
    n, r = q.shape[-2:]
    batch = q.shape[:-2]
    u = torch.empty(*batch, n, 2 * r, dtype=q.dtype, device=q.device)
    u[..., :r].copy_(k)
    u[..., r:].copy_(q)
    u = u.view(-1, n, 2 * r)
    st = torch.empty(u.shape[0], n, n, dtype=q.dtype, device=q.device)
    spare, kq = ACTION_SCRATCH.take(st, 2)  # (fresh tensors off the CPU)
    torch.bmm(u[..., :r], u[..., r:].mT, out=kq)
    torch.sub(kq, kq.mT, out=st)
    return st.mul_(c.to(q.dtype).view(-1, 1, 1)), u, spare


def chebyshev_action(
    s: torch.Tensor, v: torch.Tensor, rho: float | None = None, degree: int | None = None
) -> torch.Tensor:
    """``exp(S) V`` for skew-symmetric ``S`` without forming ``exp(S)``: the Chebyshev (Jacobi–
    Anger) expansion ``Σ_{k≤m} a_k W_k``, ``a₀ = J₀(ρ)``, ``a_k = 2J_k(ρ)``, ``W₀ = V``,
    ``W₁ = X V``, ``W_{k+1} = 2 X W_k + W_{k−1}`` with ``X = S/ρ`` (Bergamaschi & Vianello,
    Numer. Linear Algebra Appl. 7, 2000; the real recurrence because ``S`` is skew).

    ``rho`` must bound ``‖S‖₂`` (default: :func:`skew_norm_bound`); ``degree`` defaults to
    :func:`chebyshev_degree` (truncation ≤ ``ACTION_TOLERANCE``). ``‖W_k‖ ≤ ‖V‖`` in exact
    arithmetic, so rounding does not grow with ``ρ`` as the Taylor series' ``e^ρ`` partial sums
    do. One product per degree; for 3-D ``S`` (b, N, N) and ``V`` (b, N, d) the backward is
    hand-written (:class:`_ChebyshevAction`, ``2m`` products, ``Sᵀ = −S``); under torch.func
    transforms and forward-mode AD the autograd reference :func:`chebyshev_action_reference` runs.
    Raises :class:`~osa_lab.errors.OSAInputError` when no degree up to ``ACTION_MAX_DEGREE`` reaches the tolerance.
    """
    rho = skew_norm_bound(s) if rho is None else float(rho)
    degree = chebyshev_degree(rho, s.dtype) if degree is None else degree
    if degree is None:
        raise OSAInputError(f"‖S‖₂ bound {rho:.3g} needs more than ACTION_MAX_DEGREE = {ACTION_MAX_DEGREE} terms")
    rho = max(rho, 1e-30)  # S = 0: X = 0 and the expansion sums to V for any ρ > 0
    if s.dim() == 3 and v.dim() == 3 and s.shape[0] == v.shape[0] and not under_transform(s, v):
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


def osa_chebyshev_action(
    q: torch.Tensor,
    k: torch.Tensor,
    c: torch.Tensor,
    v: torch.Tensor,
    *,
    norms: bool = False,
    general: Callable | None = None,
) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]] | None:
    """``exp(c (q kᵀ − k qᵀ)) V`` by :func:`chebyshev_action` with the backward fused down to
    ``q, k, c`` (:class:`_OSAChebyshevAction`): ``q, k (*batch, N, r)`` and ``V (*batch, N, d)``
    with the same leading dims, in any layout (head-split views included; the result takes V's
    layout), ``c`` one value per matrix, ``(*batch)`` or flattened ``(B,)``. ``None`` when
    ``‖S‖₂``'s bound needs more than ``ACTION_MAX_DEGREE`` terms or under torch.func transforms /
    forward-mode AD: there the plain-operation :func:`osa_chebyshev_action_reference` runs.
    Under ``vmap`` alone the vmapped dims are folded into the batch and this path runs on the
    folded tensors; where it cannot (a bound beyond ``ACTION_MAX_DEGREE``), ``general(q, k, c, v)``
    — a general path on 3-D blocks, returning ``(y, (Σ y², Σ V²) or None)``; by default the
    ``"qr"`` engine's, which :mod:`osa_lab.ops.expm.dispatch` registers (:func:`set_general_path`)
    — does, as :func:`osa_lab.osa` would on those blocks.
    ``norms=True`` returns ``(y, (Σ y², Σ V²))`` per matrix, float64, for
    :mod:`osa_lab.ops.output_check`."""
    if under_transform(q, k, c, v):
        if vmap_only(q, k, c, v):  # the vmapped dims folded into the batch: the fused path
            y, y_sq, v_sq = _FoldedVmap.apply(q, k, c.reshape(q.shape[:-2]), v, general or _GENERAL_PATH[0])
            return (y, (y_sq, v_sq)) if norms else y
        return osa_chebyshev_action_reference(q, k, c, v, norms=norms)
    c = c.reshape(-1)
    action: type[torch.autograd.Function]
    factors: tuple[torch.Tensor, ...]
    with torch.no_grad():
        if cpu_kernels.usable(q, k, v):  # float32 on the CPU: the fused C kernels
            n = q.shape[-2]
            st, bound, _ = cpu_kernels.prepare(q, k, c, small_skew_bound(n, q.dtype))
            bound = skew_bound_with_allowance(bound, n, q.dtype)
            action, factors = _OSAChebyshevActionCPU, (st,)
        else:
            st, u, spare = _osa_skew_factors(q, k, c)
            bound = skew_spectral_bound(st, spare)  # ‖Sᵀ‖₂ = ‖S‖₂
            action, factors = _OSAChebyshevAction, (st, u)
        rho = float(bound.max()) if bound.numel() else 0.0
    degree = chebyshev_degree(rho, v.dtype)
    if degree is None:
        return None
    y, y_sq, v_sq = action.apply(q, k, c.to(q.dtype), v, *factors, max(rho, 1e-30), degree)
    return (y, (y_sq, v_sq)) if norms else y


def osa_chebyshev_action_reference(
    q: torch.Tensor, k: torch.Tensor, c: torch.Tensor, v: torch.Tensor, *, norms: bool = False
) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]] | None:
    """:func:`osa_chebyshev_action` by plain tensor operations, for torch.func transforms (``vmap``
    over the members of a seed group, per-sample gradients, ``jacrev``/``jvp``) and forward-mode
    AD: ``S = c (q kᵀ − k qᵀ)`` formed, then :func:`chebyshev_action_reference`, differentiated by
    autograd. The degree is chosen once for the whole vmapped batch from the largest ‖S‖_F
    (≥ ‖S‖₂, read through :func:`~osa_lab.ops.expm.batch.concrete`), so every call of the batch
    meets the tolerance. ``None`` where that needs more than ``ACTION_MAX_DEGREE`` terms."""
    from osa_lab.ops.expm.batch import concrete

    lead = q.shape[:-2]
    s = c.reshape(lead)[..., None, None].to(q.dtype) * (q @ k.mT - k @ q.mT)
    with torch.no_grad():
        fro = torch.linalg.matrix_norm(s.detach())
        rho = float(concrete(fro).max()) if fro.numel() else 0.0
    degree = chebyshev_degree(rho, v.dtype)
    if degree is None or not math.isfinite(rho):
        return None
    y = chebyshev_action_reference(s, v, max(rho, 1e-30), degree)
    if not norms:
        return y
    y_sq, v_sq = (t.detach().double().pow(2).sum((-2, -1)) for t in (y, v))
    return y, (y_sq, v_sq)


#: the general path of :func:`osa_chebyshev_action` under ``vmap`` (set by :func:`set_general_path`)
_GENERAL_PATH: list[Callable | None] = [None]


def set_general_path(fn: Callable) -> None:
    """Register ``fn(q, k, c, v) -> (y, sums or None)`` on 3-D blocks as the path the small-N
    action's ``vmap`` rule takes where the action's degrees do not reach (the engine that
    :func:`osa_lab.osa` falls back to; :mod:`osa_lab.ops.expm.dispatch` registers its ``"qr"``
    path, which this module cannot import: that module imports this one)."""
    _GENERAL_PATH[0] = fn


def _reference_with_norms(q, k, c, v):
    """``(y, Σ y², Σ V²)`` of :func:`osa_chebyshev_action_reference` (``None`` → the dense QR
    path's ``exp(S)`` is not reachable here: raise, as the fused action would)."""
    out = osa_chebyshev_action_reference(q, k, c, v, norms=True)
    if out is None:
        raise OSAInputError("‖S‖₂ is too large for the small-N action's ACTION_MAX_DEGREE terms under vmap")
    y, (y_sq, v_sq) = out
    return y, y_sq, v_sq


class _FoldedVmap(torch.autograd.Function):
    """:func:`osa_chebyshev_action` under ``vmap`` alone (a seed group's stacked members, a vmapped
    batch): the ``vmap`` rule moves the vmapped dimension in front, folds it into the batch of
    matrices and runs the fused action (its CPU kernels included) on the plain tensors; the
    ordinary autograd outside the transforms records that call and its hand-written backward.
    ``q, k (*batch, N, r)``, ``c (*batch)``, ``V (*batch, N, d)`` → ``(y, Σ y², Σ V²)`` per matrix.

    Outside ``vmap`` (not reached from :func:`osa_chebyshev_action`, which calls it under
    ``vmap`` only) the forward is the plain-operation reference and the backward differentiates it."""

    @staticmethod
    def forward(q, k, c, v, general):  # noqa: D102
        return _reference_with_norms(q, k, c, v)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: D102
        ctx.save_for_backward(*inputs[:4])
        ctx.mark_non_differentiable(output[1], output[2])

    @staticmethod
    def backward(ctx, g, _y_sq, _v_sq):  # noqa: D102
        inputs = ctx.saved_tensors
        grads = composite_backward(lambda *x: _reference_with_norms(*x)[0], inputs, tuple(ctx.needs_input_grad[:4]), g)
        return (*grads, None)

    @staticmethod
    def vmap(info, in_dims, q, k, c, v, general):  # noqa: D102
        size = info.batch_size
        q, k, c, v = (x.movedim(d, 0) if d is not None else x.expand(size, *x.shape)
                      for x, d in zip((q, k, c, v), in_dims[:4], strict=True))  # fmt: skip
        lead = q.shape[:-2]  # (members, *batch)
        folded = [x.reshape(-1, *x.shape[-2:]) for x in (q, k, v)]
        out = osa_chebyshev_action(folded[0], folded[1], c.reshape(-1), folded[2], norms=True)
        if out is None and general is not None:  # ‖S‖ beyond the action's degrees: the caller's path
            y, sums = general(folded[0], folded[1], c.reshape(-1), folded[2])
            y_sq, v_sq = (sums[0], sums[1]) if sums is not None else (
                torch.linalg.vector_norm(t.detach(), dim=(-2, -1), dtype=torch.float64) ** 2 for t in (y, folded[2]))  # fmt: skip
        elif out is None:  # no general path given: the reference decides (and raises)
            y, y_sq, v_sq = _reference_with_norms(folded[0], folded[1], c.reshape(-1), folded[2])
        else:
            y, (y_sq, v_sq) = out
        return (y.reshape(*lead, *y.shape[-2:]), y_sq.reshape(lead), v_sq.reshape(lead)), (0, 0, 0)
