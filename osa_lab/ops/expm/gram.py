"""The Gram (Cholesky) engine: ``exp(S) V = V + U L⁻ᵀ(e^M − I)L⁻¹ UᵀV`` with its float64 core, trust estimate
and hand-written backward.

Part of :mod:`osa_lab.ops.expm` (Zhang & Martens, arXiv 2602.05996; docs/design.md §1–§2).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from osa_lab.ops.amp import autocast_off_backward
from osa_lab.ops.cpu import gram_kernels, pool
from osa_lab.ops.expm.batch import any_row, composite_backward, concrete, transformed, under_transform
from osa_lab.ops.expm.bounds import FLOAT64_NORM, float64_needed, spectral_norm_bound, spectral_refine_above
from osa_lab.ops.expm.core import may_reuse, skew_exp, truncation_unit
from osa_lab.ops.expm.scratch import SCRATCH, fresh_output

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
    # expm.scratch); the returned L⁻¹ and exp(M) − I then do too, and are valid until the next call
    # in this thread: callers use them at once (F or C are fresh tensors).
    bufs = SCRATCH.take(g, 10) if may_reuse(g, j) else None
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
        all_ok, any_big = False, big is not None and any_row(big)
    if not all_ok:
        # Failed factorisations contain garbage; replace by I so the batch stays finite, and M
        # again from there (the M above then feeds nothing, so no gradient passes its garbage).
        chol = torch.where(ok[..., None, None], chol, eye)
        chol_inv = torch.where(ok[..., None, None], chol_inv, eye)
        m = core_matrix(chol, j, osa_core, m_out)
        fro = torch.linalg.matrix_norm(m.detach())
    s_norm_lower = fro / math.sqrt(width)
    s_two = spectral_norm_bound(m, fro, norm_above, rows=big) if any_big and norm_above is not None else fro
    e_minus_i = skew_exp(m, truncation_unit(g.dtype, tol), None if bufs is None else bufs[:6])
    if bufs is None:
        e_minus_i = e_minus_i - eye
    else:
        e_minus_i.diagonal(dim1=-2, dim2=-1).sub_(1)
    cond = (torch.linalg.matrix_norm(chol.detach()) * torch.linalg.matrix_norm(chol_inv.detach())) / width
    return chol_inv, e_minus_i, ok, (s_norm_lower, cond, s_two)


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
    scale = j[..., :1, half : half + 1]
    if out is None and transformed(scale):  # vmapped over α alone: m has fewer entries than the scale
        return m * scale
    return m.mul_(scale)


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


def _cpu_kernels_apply(*tensors: torch.Tensor) -> bool:
    """Whether the token passes may run in the CPU kernels (:mod:`osa_lab.ops.cpu.gram_kernels`):
    outside autograd's recording and torch.func transforms, on tensors the kernels accept."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    return not grad and gram_kernels.usable(*tensors) and not under_transform(*tensors)


def gram_and_projection(a: torch.Tensor, b: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(G, P)``: ``G = UᵀU`` in float64 (:func:`block_gram`) and ``P = UᵀV`` in ``v``'s dtype for
    ``U = [a b]``. Where the CPU kernels apply and ``a``, ``b`` have one width, one pass over the
    tokens computes ``aᵀ[a b v]`` and ``bᵀ[b v]`` (:func:`~osa_lab.ops.cpu.gram_kernels.transposed_products`);
    elsewhere five batched products (the reference)."""
    ma = a.shape[-1]
    if a.shape == b.shape and _cpu_kernels_apply(a, b, v):
        top, bottom = gram_kernels.transposed_products((a, b, v), (0, 1))
        g = pool.empty((*top.shape[:-2], 2 * ma, 2 * ma), torch.float64)  # kept for the backward: reused memory
        g[..., :ma, :ma] = top[..., :ma]
        g[..., :ma, ma:] = top[..., ma : 2 * ma]
        g[..., ma:, :ma] = top[..., ma : 2 * ma].mT
        g[..., ma:, ma:] = bottom[..., :ma]
        return g, torch.cat([top[..., 2 * ma :], bottom[..., ma:]], -2)
    return block_gram(a, b), torch.cat([a.mT @ v, b.mT @ v], -2)


def gram_output(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The Gram engine's output pass ``Y = V + a C_a + b C_b`` (``C`` split by rows at ``a``'s width),
    written into :func:`~osa_lab.ops.expm.scratch.fresh_output` (huge pages for large outputs), by the
    CPU kernels' :func:`~osa_lab.ops.cpu.gram_kernels.token_products` where they apply;
    differentiable by autograd where an input requires grad, and under torch.func transforms and
    forward-mode AD (``out=`` is none of these, so a plain result then)."""
    return output_and_value_squares(a, b, c, v, squares=False)[0]


def output_and_value_squares(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, v: torch.Tensor, *, squares: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(Y, ‖V‖_F²)`` of :func:`gram_output`, ``‖V‖_F²`` per matrix in float64 (the output check's
    and the trust rule's), from the output pass's own read of ``V`` where the CPU kernels run it
    (else a norm pass); ``squares=False`` leaves it out (None)."""
    ma = a.shape[-1]

    def value_squares() -> torch.Tensor | None:
        return torch.linalg.vector_norm(v.detach(), dim=(-2, -1)).double() ** 2 if squares else None

    if (torch.is_grad_enabled() and any(t.requires_grad for t in (a, b, c, v))) or under_transform(a, b, c, v):
        return torch.baddbmm(v, a, c[..., :ma, :]).baddbmm(b, c[..., ma:, :]), value_squares()
    y = fresh_output(v, (*v.shape[:-1], c.shape[-1]))
    if gram_kernels.usable(a, b, v, y) and c.dtype == v.dtype:  # one pass, C in cache
        v_sq = torch.empty(v.shape[:-2], dtype=torch.float64) if squares else None
        gram_kernels.token_products([(a, c[..., :ma, :]), (b, c[..., ma:, :])], y, add=v, add_squares=v_sq)
        return y, v_sq
    return torch.baddbmm(v, a, c[..., :ma, :], out=y).baddbmm_(b, c[..., ma:, :]), value_squares()


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
        g, p = gram_and_projection(a, b, v)
        parts = gram_core_parts(g, j, CORE_TOLERANCE.get(v.dtype), osa_core, spectral_refine_above(v.dtype))
        chol_inv, e_minus_i, ok, (s_norm, cond, s_two) = parts
        c = (chol_inv.mT @ (e_minus_i @ (chol_inv @ p.double()))).to(v.dtype)  # F P without forming F
        y, v_sq = output_and_value_squares(a, b, c, v)
        if v_sq is None:  # asked for (squares=True)
            raise RuntimeError("output_and_value_squares gave no ‖V‖² although asked")
        # The trust rule (estimate over the dtype's budget): > 1 means "use the QR engine".
        est = gram_trust_ratio(g, c, v_sq.sqrt(), ok, s_norm, cond, v.dtype)
        s_two = torch.where(ok, s_two, math.nan)  # an upper bound of ‖M‖₂ = ‖S‖₂
        # Rows whose Y the caller replaces (QR fallback, float64 recompute) get no gradient from here.
        keep = ok & (est <= 1.0) & ~float64_needed(s_two, v.dtype) if replaced else ok
        ctx.save_for_backward(a, b, j, v, g, p, c, keep)
        ctx.flags = (replaced, osa_core)
        delta = output_norm_change(g, p, c)
        ctx.mark_non_differentiable(est, s_two, v_sq, delta)
        return y, est, s_two, v_sq, delta

    @staticmethod
    @autocast_off_backward
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
        if not _all_kept_on_cpu(keep):  # (a token-sized copy of gY; on the CPU only where a row is dropped)
            gy = torch.where(keep[..., None, None], gy, torch.zeros((), dtype=gy.dtype, device=gy.device))
        fused = a.shape == b.shape and gram_kernels.usable(a, b, v, gy)  # the token passes in the CPU kernels
        if fused:
            gc = torch.cat(gram_kernels.transposed_products((a, b, gy), (2, 2)), -2)
        else:
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
                rhs = gg[:, :ma, cols]
                out = fresh_output(a, (*a.shape[:-1], rhs.shape[-1]))
                if fused:
                    terms = [(a, rhs), (b, gg[:, ma:, cols]), (gy, c[:, cols].mT), (v, gp[:, cols].mT)]
                    return gram_kernels.token_products(terms, out)
                torch.bmm(a, rhs, out=out)
                out.baddbmm_(b, gg[:, ma:, cols])
                out.baddbmm_(gy, c[:, cols].mT)
                return out.baddbmm_(v, gp[:, cols].mT)

            ga = grad_block(slice(0, ma)) if need_a else None
            gb = grad_block(slice(ma, None)) if need_b else None
        if need_v:
            gv = fresh_output(v)
            if fused:
                gram_kernels.token_products([(a, gp[:, :ma]), (b, gp[:, ma:])], gv, add=gy)
            else:
                torch.baddbmm(gy, a, gp[:, :ma], out=gv).baddbmm_(b, gp[:, ma:])
        return ga, gb, gj, gv, None, None


def _all_kept_on_cpu(keep: torch.Tensor) -> bool:
    """True when ``keep`` is a CPU tensor of all True, read without cost there; False on other
    devices (no host synchronisation) and while torch.compile traces."""
    return keep.device.type == "cpu" and not torch.compiler.is_compiling() and bool(keep.all())


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
    y, est, s_two, _ = gram_engine(a, b, j, v, replaced, osa_core)
    return y, torch.where(float64_needed(s_two, v.dtype), math.inf, est)


def gram_engine(
    a: torch.Tensor, b: torch.Tensor, j: torch.Tensor, v: torch.Tensor, replaced: bool, osa_core: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple | None]:
    """``(Y, estimate / budget, ‖S‖₂ bound, norms)`` of the Gram engine (the bound is ``s_two`` of
    :func:`gram_core_parts`, NaN where the factorisation failed; ``norms`` is ``(‖Y‖² , ‖V‖²,
    their difference)`` per matrix for the output check, or None): :class:`_GramAction`, or under
    torch.func transforms and forward-mode AD (which its hand-written backward does not support:
    vmap raised PyTorch's "must override the setup_context" error) :func:`gram_action_reference`."""
    j = j.to(torch.float64)
    if under_transform(a, b, j, v):
        return (*gram_action_reference(a, b, j, v, replaced, osa_core), None)
    y, est, s_two, v_sq, delta = _GramAction.apply(a, b, j, v, replaced, osa_core)
    return y, est, s_two, (v_sq + delta, v_sq, delta)


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
        if not bool(concrete(keep).all()):
            eye = torch.eye(g.shape[-1], dtype=g.dtype, device=g.device)
            y = run(torch.where(keep[..., None, None], g, eye), None)[0]  # only Y is used: no ‖S‖₂ needed
    return y, est, s_two
