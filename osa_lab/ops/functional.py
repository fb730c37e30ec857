"""The functional OSA and SSA operators.

``osa(q, k, v, alpha)`` returns ``exp(S) v`` with ``S = α/√r (q kᵀ − k qᵀ)``: orthogonal
self-attention of Zhang & Martens (arXiv 2602.05996, the definition restated in
docs/design.md §1), computed by a method chosen by name (docs/design.md §6, as geotorch selects maps).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable

import numpy as np
import torch

from osa_lab.errors import (
    MethodUnavailableError,
    NonFiniteError,
    OSAAccuracyWarning,
    OSADtypeError,
    OSAInputError,
    unknown_name,
)
from osa_lab.ops import expm
from osa_lab.ops.guards import check_float_tensor, check_qkv, refuse_masks

#: ``eps · ‖S‖₁`` of the working precision above which ``"dense"`` warns: rounding S's entries
#: already moves ``exp(S) v`` by about this much (measured float64 errors against a 60-digit
#: mpmath reference: 4e-5 at ‖S‖₁ = 1.4e12, 3e-3 at 1.4e14).
DENSE_ROUNDING_WARN = 1e-4


def _dense(q, k, v, scale):
    """The N×N reference. Below float64 the product and exponential run in float64 once ``‖S‖₁``
    is past the short-Taylor range: ``torch.linalg.matrix_exp`` in float32 loses ≈ eps₃₂·‖S‖
    (relative error 0.57 at ‖S‖₂ ≈ 8.5e6) and overflows beyond."""
    s = expm.skew_symmetric_from_qk(q, k, scale * math.sqrt(q.shape[-1]))
    try:
        norm = float(s.detach().abs().sum(-2).amax())
    except RuntimeError:  # under torch.func.vmap: no single value, take the float64 path
        norm = math.inf if q.dtype != torch.float64 else 0.0
    if q.dtype != torch.float64 and (not math.isfinite(norm) or expm.short_taylor_plan(norm, q.dtype) is None):
        s = expm.skew_symmetric_from_qk(q.double(), k.double(), scale.double() * math.sqrt(q.shape[-1]))
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
    def run(q, k, v, scale):
        if name == "qr" and q.shape[-2] <= 4 * q.shape[-1] and q.shape[0] and v.shape[-1]:
            # small N: exp(S)V through the N×N S, backward fused down to q, k, α (no J built)
            y = expm.osa_chebyshev_action(q, k, scale, v)
            if y is not None:
                return y
        return expm.blocked_action(q, k, expm.osa_skew_core(q.shape[-1], scale), v, name, osa_core=True)

    return run


def _triton(q, k, v, scale):
    from osa_lab.ops.triton import kernels as triton_osa

    return triton_osa.osa_triton(q, k, v, scale)


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


def _alpha_tensor(alpha: float | torch.Tensor, q: torch.Tensor, batch: tuple[int, ...]) -> torch.Tensor:
    """α as a float64 or floating tensor that broadcasts to ``batch`` (the output's leading dims).

    Shape rule (see :func:`osa`): a scalar; a tensor broadcasting to the leading dims without
    adding dims (leading size-1 dims are dropped); or SDPA-style ``(..., 1, 1)`` whose leading
    part does. Anything else (e.g. ``(5, B, H)``) raises, so the output always has the batch
    shape of q and v.
    """
    if isinstance(alpha, torch.Tensor):
        if alpha.dtype == torch.bool or alpha.is_complex():
            raise OSADtypeError(
                f"`alpha` is a tensor of dtype {alpha.dtype}; α must be real: pass a float or a "
                "floating-point tensor (e.g. `alpha.float()`, or `alpha.real` for a complex one)"
            )
        if not alpha.is_floating_point():
            alpha = alpha.to(q.dtype)
        if not torch.isfinite(alpha).all():
            raise NonFiniteError(f"`alpha` contains NaN or Inf: {alpha}")
        shape = _alpha_view(tuple(alpha.shape), batch)
        if shape is None and alpha.dim() >= 2 and tuple(alpha.shape[-2:]) == (1, 1):
            shape = _alpha_view(tuple(alpha.shape[:-2]), batch)  # SDPA-style (..., H, 1, 1)
        if shape is None:
            raise OSAInputError(
                f"`alpha` has shape {tuple(alpha.shape)}, which does not broadcast over the leading "
                f"dims {tuple(batch)} of q and v without changing the output's shape; use a scalar or one "
                "value per head: shape (heads,) or (heads, 1, 1) for q of shape (batch, heads, N, r)"
            )
        return alpha.reshape(shape).to(device=q.device)
    if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, numbers.Real):
        raise OSADtypeError(
            f"`alpha` must be a real number or a floating-point tensor, got {type(alpha).__name__}"
        )
    if not math.isfinite(alpha):
        raise OSAInputError(f"`alpha` must be finite, got {alpha}")
    return torch.tensor(float(alpha), dtype=torch.float64, device=q.device)


def osa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    alpha: float | torch.Tensor = 1.0,
    *,
    method: str = "auto",
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

    OSA is non-causal: ``mask``, ``attn_mask``, ``causal`` and ``is_causal`` are refused with
    :class:`~osa_lab.errors.CausalMaskError`.

    Returns:
        ``(*batch, N, d_v)`` with ``batch`` the broadcast leading dims of q and v (v's shape when
        v carries them), same dtype as ``v``; an empty batch or ``d_v = 0`` gives an empty result
        of that shape (N = 0 raises). The columns keep their norms: ``‖y‖ = ‖v‖``; an output
        whose norms drift (a method failing on this input) warns with
        :class:`~osa_lab.errors.OSAAccuracyWarning`, as does a ``"dense"`` call whose ``‖S‖`` is so
        large that even float64 rounding (≈ eps·‖S‖₁) spoils it.
    """
    refuse_masks(kwargs)
    check_qkv(q, k, v, finite=False)
    name = resolve_method(method, q, v.shape[-1])
    if name == "triton" and q.device.type != "cuda":
        import os

        if os.environ.get("TRITON_INTERPRET") != "1":
            raise MethodUnavailableError(
                "method='triton' needs a CUDA tensor (got device "
                f"{q.device}); on the CPU set TRITON_INTERPRET=1 before importing osa_lab to run the "
                "kernel in Triton's interpreter (slow, for tests), or use method='lowrank'"
            )
    batch = tuple(torch.broadcast_shapes(q.shape[:-2], v.shape[:-2]))
    alpha_t = _alpha_tensor(alpha, q, batch)
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
    q3 = q.to(work_dtype).expand(*batch, n, r).reshape(-1, n, r)
    k3 = k.to(work_dtype).expand(*batch, n, r).reshape(-1, n, r)
    v3 = v.to(work_dtype).expand(*batch, n, d).reshape(-1, n, d)
    scale = (alpha_t / math.sqrt(r)).expand(batch).reshape(-1)
    y = OSA_METHODS[name](q3, k3, v3, scale)
    _check_output(y, v3, (q, k, v), name, n, r)
    return y.reshape(*batch, n, d).to(v.dtype)


#: Largest relative drift ``|‖y_b‖ − ‖v_b‖| / ‖v_b‖`` of one matrix's output norm accepted
#: without an :class:`OSAAccuracyWarning`, per working dtype. ``exp(S)`` is orthogonal, so the
#: norms match to rounding; a drift this large means the method failed on this input.
NORM_DRIFT_WARN = {torch.float64: 1e-6, torch.float32: 1e-3}
NORM_DRIFT_WARN_HALF = 3e-2


def _check_output(y: torch.Tensor, v3: torch.Tensor, inputs: tuple, name: str, n: int, r: int) -> None:
    """Raise for non-finite output (naming a NaN/Inf input first); warn when norms drift."""
    acc = torch.float64 if y.dtype == torch.float64 else torch.float32
    try:
        ny = torch.linalg.vector_norm(y.detach(), dim=(-2, -1), dtype=acc)
        nv = torch.linalg.vector_norm(v3.detach(), dim=(-2, -1), dtype=acc)
        drift = float(((ny - nv).abs() / nv.clamp_min(torch.finfo(acc).tiny)).max())
    except RuntimeError:  # under torch.func.vmap there is no single value to test: skip the check
        return
    if not math.isfinite(drift):
        # Any NaN/Inf in q, k or v reaches y; name the input (this raises) before blaming overflow.
        for arg, x in zip(("q", "k", "v"), inputs, strict=True):
            check_float_tensor(arg, x)
        if not bool(torch.isfinite(y).all()):
            raise NonFiniteError(
                f"OSA produced non-finite values from finite inputs (method {name!r}, N={n}, r={r}); "
                "the inputs or α are too large for the dtype: rescale them or use float64"
            )
        return
    limit = NORM_DRIFT_WARN.get(y.dtype, NORM_DRIFT_WARN_HALF)
    if drift > limit:
        warnings.warn(
            f"osa(method={name!r}, {y.dtype}, N={n}, r={r}): the output's norms differ from v's by more "
            f"than {limit:g} (relative) although exp(S) is orthogonal; the result is inaccurate for "
            "this input. Rescale q, k or α"
            + (", compute in float64" if y.dtype != torch.float64 else "")
            + (", or use method='qr'" if name != "qr" else "")
            + ".",
            OSAAccuracyWarning,
            stacklevel=3,
        )
