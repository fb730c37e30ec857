"""The functional OSA and SSA operators.

``osa(q, k, v, alpha)`` returns ``exp(S) v`` with ``S = α/√r (q kᵀ − k qᵀ)``: orthogonal
self-attention of Zhang & Martens (arXiv 2602.05996, the definition restated in
docs/design.md §1), computed by a method chosen by name (docs/design.md §6, as geotorch selects maps).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Literal, cast

import torch

from osa_lab.errors import MethodUnavailableError, OSAAccuracyWarning, OSAInputError, unknown_name
from osa_lab.ops import expm, output_check
from osa_lab.ops.amp import autocast_off
from osa_lab.ops.guards import (
    apply_key_padding,
    check_alpha,
    check_float_tensor,
    check_qkv,
    refuse_masks,
    whole_batch,
)
from osa_lab.ops.output_check import NORM_DRIFT_WARN, NORM_DRIFT_WARN_HALF  # noqa: F401  (public names)

#: ``eps · ‖S‖₁`` of the working precision above which ``"dense"`` warns: rounding S's entries
#: already moves ``exp(S) v`` by about this much (measured float64 errors against a 60-digit
#: mpmath reference: 4e-5 at ‖S‖₁ = 1.4e12, 3e-3 at 1.4e14).
DENSE_ROUNDING_WARN = 1e-4


def _dense(q, k, v, scale):
    """The N×N reference. Below float64 the product and exponential run in float64 once ``‖S‖₁``
    is past the short-Taylor range: ``torch.linalg.matrix_exp`` in float32 loses ≈ eps₃₂·‖S‖
    (relative error 0.57 at ‖S‖₂ ≈ 8.5e6) and overflows beyond."""
    s = expm.skew_from_scale(q, k, scale)
    try:
        norm = float(s.detach().abs().sum(-2).amax())
    except RuntimeError:  # under torch.func.vmap: the largest ‖S‖₁ of the whole vmapped batch
        norm = float(whole_batch(s.detach()).abs().sum(-2).amax())
    if q.dtype != torch.float64 and (not math.isfinite(norm) or expm.short_taylor_plan(norm, q.dtype) is None):
        s = expm.skew_from_scale(q.double(), k.double(), scale)
        norm = float(s.detach().abs().sum(-2).amax()) if math.isfinite(norm) else norm
        y = (expm.dense_exp(s) @ v.double()).to(v.dtype)
    else:
        y = expm.dense_exp(s) @ v
    if math.isfinite(norm) and torch.finfo(torch.float64).eps / 2 * norm > DENSE_ROUNDING_WARN:
        warnings.warn(
            f"osa(method='dense'): ‖S‖₁ = {norm:.3g} is so large that float64 rounding of S alone "
            f"moves exp(S) v by about {torch.finfo(torch.float64).eps / 2 * norm:.1g} (relative); "
            "the result is inaccurate. Rescale q, k or α.",
            OSAAccuracyWarning,
            stacklevel=4,
        )
    return y


def _engine(name: str) -> Callable:
    def run(q, k, v, scale, *, norms: bool = False):
        """``q, k (*batch, N, r)``, ``v (*batch, N, d)`` with the same leading dims, any layout;
        ``scale`` (B,). Returns ``(B, N, d)``, or ``(*batch, N, d)`` in v's layout from the fused
        small-N action."""
        n, r = q.shape[-2:]
        if name == "qr" and n <= 4 * r and q.numel() and v.numel():
            # small N: exp(S)V through the N×N S, backward fused down to q, k, α (no J built),
            # reading head-split views in place
            out = expm.osa_chebyshev_action(q, k, scale, v, norms=norms)
            if out is not None:
                return out
        q, k, v = (x.reshape(-1, n, x.shape[-1]) for x in (q, k, v))
        j = expm.osa_skew_core(r, scale)
        return expm.blocked_action(q, k, j, v, name, osa_core=True, norms=norms)

    setattr(run, "gives_norms", True)  # noqa: B010 - norms=True: (y, the output check's sums or None), see osa()
    return run


def _triton(q, k, v, scale, *, strict: bool = True, norms: bool = False):
    """The Triton kernels: the adaptive core (QR fallback, a few host synchronisations) in the
    strict output-check mode, the sync-free fixed core otherwise (untrusted matrices come out
    NaN and the deferred check reports them). ``norms=True`` returns ``(y, (Σ y², Σ v², None))``,
    the sums taken by the kernels' own passes."""
    from osa_lab.ops.triton import kernels as triton_osa

    cfg = triton_osa.TritonConfig(core="adaptive" if strict else "fixed")
    return triton_osa.osa_triton(q, k, v, scale, config=cfg, norms=norms)


#: The computation methods of :func:`osa` (``"auto"`` picks one per call; see ``METHOD_DOCS``).
OSAMethod = Literal["auto", "dense", "lowrank", "gram", "qr", "triton"]

OSA_METHODS: dict[str, Callable] = {
    "dense": _dense,
    "lowrank": _engine("lowrank"),
    "gram": _engine("gram"),
    "qr": _engine("qr"),
    "triton": _triton,
}
METHOD_DOCS = {
    "dense": "N×N torch.linalg.matrix_exp, O(N³): the reference (in float64 for lower-precision inputs unless ‖S‖ is tiny)",
    "lowrank": "Gram/Cholesky engine with a QR fallback where it would be inaccurate; linear in N",
    "gram": "Gram/Cholesky engine alone: two passes over tokens, fastest; refuses (UntrustedResultError) an ill-conditioned or rank-deficient [q k]",
    "qr": "Householder QR form V + B(exp(R J Rᵀ) − I)Bᵀ V; robust for any q, k; linear in N",
    "triton": "fused Triton kernels for CUDA (Gram pass, float64 core, output pass)",
    "auto": "triton on CUDA when available, qr (direct N×N exponential) when N ≤ 4r, else lowrank",
}


def resolve_method(method: str, q: torch.Tensor, d_v: int | None = None) -> str:
    """Map ``method`` (possibly ``"auto"``) to a concrete method name for these inputs."""
    d_v = q.shape[-1] if d_v is None else d_v
    if method != "auto":
        if method not in OSA_METHODS:
            raise unknown_name("method", method, [*OSA_METHODS, "auto"])
        return method
    n, r = q.shape[-2], q.shape[-1]
    if q.device.type == "cuda":
        from osa_lab.ops.triton import triton_available

        # The Triton kernels take float32/bf16/fp16 with head widths up to 128.
        if triton_available() and q.dtype != torch.float64 and r <= 128 and d_v <= 128:
            return "triton"
    if n <= 4 * r:
        return "qr"  # the QR engine exponentiates the N×N S directly when that is cheaper
    return "lowrank"


def _alpha_view(shape: tuple[int, ...], batch: tuple[int, ...]) -> tuple[int, ...] | None:
    """``shape`` without leading 1s if it then broadcasts to ``batch`` without adding or growing
    a dim, else None."""
    while len(shape) > len(batch) and shape[0] == 1:
        shape = shape[1:]
    if len(shape) <= len(batch) and all(a in (1, b) for a, b in zip(shape[::-1], batch[::-1], strict=False)):
        return shape
    return None


def _alpha_tensor(alpha: float | torch.Tensor, q: torch.Tensor, batch: tuple[int, ...], *, check_finite: bool) -> torch.Tensor:
    """α as a tensor of the widest float dtype (float64; float32 on devices without float64) that
    broadcasts to ``batch`` (the output's leading dims), so that ``α/√r`` is formed once in that
    dtype and never rounded through α's own, narrower one (integer α tensors included).

    Shape rule (see :func:`osa`): a scalar; a tensor broadcasting to the leading dims without
    adding dims (leading size-1 dims are dropped); or SDPA-style ``(..., 1, 1)`` whose leading
    part does. Anything else (e.g. ``(5, B, H)``) raises, so the output always has the batch
    shape of q and v. ``check_finite=False`` leaves a NaN/Inf α tensor to the output check
    (no host synchronisation).
    """
    wide = torch.float32 if q.device.type == "mps" else torch.float64
    value = check_alpha(alpha, finite=check_finite)
    if value is not None:
        return torch.tensor(value, dtype=wide, device=q.device)
    alpha = cast(torch.Tensor, alpha)  # check_alpha returns None for tensors only
    shape = _alpha_view(tuple(alpha.shape), batch)
    if shape is None and alpha.dim() >= 2 and tuple(alpha.shape[-2:]) == (1, 1):
        shape = _alpha_view(tuple(alpha.shape[:-2]), batch)  # SDPA-style (..., H, 1, 1)
    if shape is None:
        raise OSAInputError(
            f"`alpha` has shape {tuple(alpha.shape)}, which does not broadcast over the leading "
            f"dims {tuple(batch)} of q and v without changing the output's shape; use a scalar or one "
            "value per head: shape (heads,) or (heads, 1, 1) for q of shape (batch, heads, N, r)"
        )
    return alpha.reshape(shape).to(device=q.device, dtype=wide)


def osa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    alpha: float | torch.Tensor = 1.0,
    *,
    method: OSAMethod = "auto",
    key_padding_mask: torch.Tensor | None = None,
    **kwargs,
) -> torch.Tensor:
    """Orthogonal self-attention ``exp(S) v``, ``S = α/√r · (q kᵀ − k qᵀ)`` (Zhang & Martens,
    arXiv 2602.05996, the OSA definition).

    Args:
        q, k: ``(..., N, r)`` queries and keys, N ≥ 1, r ≥ 1.
        v: ``(..., N, d_v)`` values; leading dims broadcast with those of q.
        alpha: a real number (Python or NumPy scalar) or a real tensor; differentiable. A tensor
            must broadcast to the leading dims of q and v *without adding dims*: a scalar, one
            value per head ``(heads,)`` or ``(batch, heads)`` for q ``(batch, heads, N, r)``
            (leading size-1 dims are ignored), or the SDPA-style per-head scale
            ``(..., heads, 1, 1)``. Any other shape (e.g. ``(5, batch, heads)``) raises
            :class:`~osa_lab.errors.OSAInputError`; complex and bool α raise
            :class:`~osa_lab.errors.OSADtypeError`.
        method: one of ``"auto"``, ``"dense"``, ``"lowrank"``, ``"gram"``, ``"qr"``,
            ``"triton"`` (see ``METHOD_DOCS``). A named method is right or refuses: ``"gram"``
            raises :class:`~osa_lab.errors.UntrustedResultError` where its own error or condition
            estimate does not trust its result (rank-deficient ``[q k]``: N < 2r, k ∥ q, q = 0);
            ``"qr"``, ``"lowrank"`` and ``"auto"`` handle any q, k.

    OSA is non-causal: a mask or causal flag (``mask``, ``attn_mask``, ``causal``,
    ``is_causal``) is refused with :class:`~osa_lab.errors.CausalMaskError`; their neutral values
    (``attn_mask=None``, ``is_causal=False``) are accepted, as PyTorch and timm pass them.
    ``key_padding_mask`` (bool ``(B, N)``, True = pad, as in ``nn.MultiheadAttention``; q with a
    leading batch dim B) is exact: the pads' rows of q and k are zeroed
    (:func:`osa_lab.ops.guards.apply_key_padding`), so the valid tokens get the truncated
    sequence's output and each pad its value.

    Returns:
        ``(*batch, N, d_v)`` with ``batch`` the broadcast leading dims of q and v (v's shape when
        v carries them), same dtype as ``v``; an empty batch or ``d_v = 0`` gives an empty result
        of that shape (N = 0 raises). The columns keep their norms: ``‖y‖ = ‖v‖``; an output
        whose norms drift (a method failing on this input) warns with
        :class:`~osa_lab.errors.OSAAccuracyWarning`, as does a ``"dense"`` call whose ``‖S‖`` is so
        large that even float64 rounding (≈ eps·‖S‖₁) spoils it; a non-finite output raises
        :class:`~osa_lab.errors.OSAInputError`. On CUDA that check is deferred by default (no
        host synchronisation; reported by a later call or :func:`osa_lab.ops.output_check.flush`),
        see :mod:`osa_lab.ops.output_check` for the strict mode. Differentiable to second order
        (``create_graph=True``) by every method.
    """
    refuse_masks(kwargs)
    check_qkv(q, k, v, finite=False)
    if key_padding_mask is not None:
        if q.dim() < 3:
            raise OSAInputError(f"`key_padding_mask` needs q with a batch dim (B, ..., N, r); q is {tuple(q.shape)}")
        q, k = apply_key_padding(q, k, key_padding_mask)
    name = resolve_method(method, q, v.shape[-1])
    if name == "triton" and q.device.type != "cuda":
        import os

        if os.environ.get("TRITON_INTERPRET") != "1":
            raise MethodUnavailableError(
                "method='triton' needs a CUDA tensor (got device "
                f"{q.device}); on the CPU set TRITON_INTERPRET=1 before importing osa_lab to run the "
                "kernel in Triton's interpreter (slow, for tests), or use method='lowrank'"
            )
    mode = output_check.effective_mode(q.device)
    output_check.report_pending()  # deferred checks of earlier calls whose values have arrived
    batch = tuple(q.shape[:-2] if q.shape[:-2] == v.shape[:-2] else torch.broadcast_shapes(q.shape[:-2], v.shape[:-2]))
    alpha_t = _alpha_tensor(alpha, q, batch, check_finite=mode == "strict")
    n, r, d = q.shape[-2], q.shape[-1], v.shape[-1]
    if math.prod(batch) == 0 or d == 0:
        # Nothing to transform: an empty result of the documented shape, still connected to the
        # inputs so that backward() gives (empty or zero) gradients.
        for arg, x in (("q", q), ("k", k), ("v", v)):
            check_float_tensor(arg, x)
        tie = (q.sum() + k.sum() + alpha_t.sum()).to(v.dtype) * 0
        return v.expand(*batch, n, d) + tie
    work_dtype = q.dtype
    if q.dtype in (torch.float16, torch.bfloat16) and name != "triton":
        work_dtype = torch.float32
    method_fn = OSA_METHODS[name]
    gives_norms = getattr(method_fn, "gives_norms", False)
    if gives_norms and work_dtype == q.dtype and q.shape[:-2] == batch == v.shape[:-2]:
        q3, k3, v3 = q, k, v  # the engines take any layout (the fused small-N action reads views in place)
    else:
        q3 = q.to(work_dtype).expand(*batch, n, r).reshape(-1, n, r)
        k3 = k.to(work_dtype).expand(*batch, n, r).reshape(-1, n, r)
        v3 = v.to(work_dtype).expand(*batch, n, d).reshape(-1, n, d)
    scale = (alpha_t / math.sqrt(r)).expand(batch).reshape(-1)
    with autocast_off(q.device.type):  # the method computes in work_dtype, not autocast's dtype
        if name == "triton":
            y, norms = _triton(q3, k3, v3, scale, strict=mode == "strict", norms=True)
        elif gives_norms:
            y, norms = method_fn(q3, k3, v3, scale, norms=True)
        else:
            y, norms = method_fn(q3, k3, v3, scale), None
    out = y.reshape(*batch, n, d).to(v.dtype)
    context = {"method": name, "n": n, "r": r, "work_dtype": work_dtype}
    on_host = norms is not None and norms[0].device.type == "cpu" and out.dtype == y.dtype
    if mode == "strict" and on_host and not expm.transformed(norms[0]):
        # the CPU's blocking check in NumPy: no ATen operation per step of the formula
        output_check.check_now(output_check.relative_drift_on_host(*norms), out, (q, k, v, alpha_t), context)
        return out
    # one value per matrix, flat: an engine may give (B·H,) beside (B, H) (under vmap, torch.compile)
    sums = norms or output_check.squared_norms(y, v3)
    flat = [t if t is None else t.reshape(-1) for t in sums]  # Σ y², Σ v² (never None), then the delta or None
    drift = output_check.relative_drift(*cast("list[torch.Tensor]", flat[:2]), *flat[2:])
    if out.dtype == torch.float16 and y.dtype != torch.float16:  # the cast may overflow float16
        drift = torch.where(torch.isfinite(out).all(), drift, math.inf)
    if expm.transformed(drift):  # a torch.func wrapper: decide on the whole vmapped batch's worst
        drift = whole_batch(drift).amax()  # drift (a loop over the calls raises or warns alike)
    if mode == "strict":
        output_check.check_now(drift, out, (q, k, v, alpha_t), context)
    else:
        output_check.defer(drift.detach(), context)
    return out

