"""The functional OSA and SSA operators.

``osa(q, k, v, alpha)`` returns ``exp(S) v`` with ``S = α/√r (q kᵀ − k qᵀ)``: orthogonal
self-attention of Zhang & Martens (arXiv 2602.05996, the definition restated in
DESIGN.md §1), computed by a method chosen by name (DESIGN.md §6, as geotorch selects maps).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from osa_lab import expm
from osa_lab.errors import MethodUnavailableError, OSADtypeError, OSAInputError, unknown_name
from osa_lab.validation import check_float_tensor, check_qkv, refuse_masks, sum_is_finite


def _dense(q, k, v, scale):
    s = expm.skew_symmetric_from_qk(q, k, scale * math.sqrt(q.shape[-1]))
    return expm.matrix_exp(s) @ v


def _engine(name: str) -> Callable:
    def run(q, k, v, scale):
        return expm.blocked_action(q, k, expm.osa_skew_core(q.shape[-1], scale), v, name, osa_core=True)

    return run


def _triton(q, k, v, scale):
    from osa_lab.kernels import triton_osa

    return triton_osa.osa_triton(q, k, v, scale)


METHODS: dict[str, Callable] = {
    "dense": _dense,
    "lowrank": _engine("lowrank"),
    "gram": _engine("gram"),
    "qr": _engine("qr"),
    "triton": _triton,
}
METHOD_DOCS = {
    "dense": "N×N torch.linalg.matrix_exp, O(N³): the reference",
    "lowrank": "Gram/Cholesky engine with a QR fallback where it would be inaccurate; linear in N",
    "gram": "Gram/Cholesky engine alone: two passes over tokens, fastest, needs well-conditioned [q k]",
    "qr": "Householder QR form V + B(exp(R J Rᵀ) − I)Bᵀ V; robust for any q, k; linear in N",
    "triton": "fused Triton kernels for CUDA (Gram pass, float64 core, output pass)",
    "auto": "triton on CUDA when available, qr (direct N×N exponential) when N ≤ 4r, else lowrank",
}


def resolve_method(method: str, q: torch.Tensor, d_v: int | None = None) -> str:
    """Map ``method`` (possibly ``"auto"``) to a concrete method name for these inputs."""
    d_v = q.shape[-1] if d_v is None else d_v
    if method != "auto":
        if method not in METHODS:
            raise unknown_name("method", method, [*METHODS, "auto"])
        return method
    n, r = q.shape[-2], q.shape[-1]
    if q.device.type == "cuda":
        from osa_lab.kernels import triton_available

        # The Triton kernels take float32/bf16/fp16 with head widths up to 128.
        if triton_available() and q.dtype != torch.float64 and r <= 128 and d_v <= 128:
            return "triton"
    if n <= 4 * r:
        return "qr"  # the QR engine exponentiates the N×N S directly when that is cheaper
    return "lowrank"


def _alpha_tensor(alpha: float | torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    if isinstance(alpha, torch.Tensor):
        if not alpha.is_floating_point():
            alpha = alpha.to(q.dtype)
        if not torch.isfinite(alpha).all():
            raise OSAInputError(f"`alpha` contains NaN or Inf: {alpha}")
        try:
            torch.broadcast_shapes(alpha.shape, q.shape[:-2])
        except RuntimeError as exc:
            raise OSAInputError(
                f"`alpha` has shape {tuple(alpha.shape)}, which does not broadcast over the leading "
                f"dims {tuple(q.shape[:-2])} of q; use a scalar or one value per head: shape (heads,) for q of shape (batch, heads, N, r)"
            ) from exc
        return alpha.to(device=q.device)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise OSADtypeError(f"`alpha` must be a float or a tensor, got {type(alpha).__name__}")
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
    """Orthogonal self-attention ``exp(S) v``, ``S = α/√r · (q kᵀ − k qᵀ)`` (DESIGN.md §1).

    Args:
        q, k: ``(..., N, r)`` queries and keys.
        v: ``(..., N, d_v)`` values; leading dims broadcast with those of q.
        alpha: float or tensor broadcasting over the leading dims (e.g. one α per head);
            differentiable.
        method: one of ``"auto"``, ``"dense"``, ``"lowrank"``, ``"gram"``, ``"qr"``,
            ``"triton"`` (see ``METHOD_DOCS``).

    OSA is non-causal: ``mask``, ``attn_mask``, ``causal`` and ``is_causal`` are refused with
    :class:`~osa_lab.errors.CausalMaskError`.

    Returns:
        ``(..., N, d_v)``, same dtype as ``v``. The columns keep their norms: ``‖y‖ = ‖v‖``.
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
    alpha_t = _alpha_tensor(alpha, q)
    batch = torch.broadcast_shapes(q.shape[:-2], v.shape[:-2], alpha_t.shape)
    n, r, d = q.shape[-2], q.shape[-1], v.shape[-1]
    work_dtype = q.dtype
    if q.dtype in (torch.float16, torch.bfloat16) and name != "triton":
        work_dtype = torch.float32
    q3 = q.to(work_dtype).expand(*batch, n, r).reshape(-1, n, r)
    k3 = k.to(work_dtype).expand(*batch, n, r).reshape(-1, n, r)
    v3 = v.to(work_dtype).expand(*batch, n, d).reshape(-1, n, d)
    scale = (alpha_t / math.sqrt(r)).expand(batch).reshape(-1)
    y = METHODS[name](q3, k3, v3, scale)
    try:
        finite = sum_is_finite(y)
    except RuntimeError:  # under torch.func.vmap there is no single value to test: skip the check
        finite = True
    if not finite:
        # Any NaN/Inf in q, k or v reaches y; name the input (this raises) before blaming overflow.
        for arg, x in (("q", q), ("k", k), ("v", v)):
            check_float_tensor(arg, x)
        if not bool(torch.isfinite(y).all()):
            raise OSAInputError(
                f"OSA produced non-finite values from finite inputs (method {name!r}, N={n}, r={r}); "
                "the inputs or α are too large for the dtype: rescale them or use float64"
            )
    return y.reshape(*batch, n, d).to(v.dtype)
