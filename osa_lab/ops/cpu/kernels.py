"""Python side of the fused CPU kernels of the small-N Chebyshev action (float32).

:func:`prepare`, :func:`chebyshev_forward` and :func:`chebyshev_backward` compute, one matrix at a
time in C (``chebyshev_action.c``), what :mod:`osa_lab.ops.expm.chebyshev` computes with batched
PyTorch products (the reference beside them: ``_osa_skew_factors``, ``skew_spectral_bound``,
``_chebyshev_forward``, ``_chebyshev_backward`` and the gradient tail of ``_OSAChebyshevAction``):
the OSA action ``exp(S) v``, ``S = c (q kᵀ − k qᵀ)`` (Zhang & Martens, arXiv 2602.05996;
docs/design.md §1–§2). Tensors of shape ``(*batch, N, ·)`` are read and written in their own
layout (per-matrix offsets and row and column strides), so a layer's head-split views need no
packing. :func:`usable` says where the kernels apply; elsewhere the caller keeps the reference.
"""

from __future__ import annotations

import ctypes
import math

import torch

from osa_lab.errors import KernelFailedError, OSAInputError
from osa_lab.ops.cpu import pool
from osa_lab.ops.cpu.build import library, loaded_library
from osa_lab.ops.cpu.views import view_args

_INT32_MAX = 2**31 - 1


def _padded(n: int) -> int:
    return (n + 7) // 8 * 8


#: Largest degree the kernels are asked for (``expm.chebyshev.ACTION_MAX_DEGREE``), for the size checks.
_MAX_TERMS = 25


def usable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """True when the kernels can run on ``q, k (*batch, N, r)`` and ``v (*batch, N, d)``: plain
    (not subclassed) strided float32 CPU tensors, ``q`` and ``k`` of one shape, ``v`` with the
    same leading dims and N, N, r, d ≥ 1, every size and offset within the kernels' 32-bit
    indices, and the library built with hardware vectors (AVX-512 or AVX2 with FMA,
    :data:`osa_lab.ops.cpu.gram_kernels.VECTOR_FLOATS`; :func:`osa_lab.ops.cpu.build.status`).
    A build without them (``x86-64``, ``x86-64-v2``, generic flags, other architectures) keeps
    the PyTorch path: there the kernel's emulated vectors ran 10–20× slower than torch. False
    while ``torch.compile`` traces (the compiled graph takes the PyTorch path, as the Gram
    engine's passes do)."""
    if torch.compiler.is_compiling():  # while Dynamo traces there are no real pointers: torch's ops
        return False
    tensors = (q, k, v)
    if not all(
        type(t) is torch.Tensor and t.device.type == "cpu" and t.dtype == torch.float32 and t.layout == torch.strided
        and t.dim() >= 2
        for t in tensors
    ):  # fmt: skip
        return False
    n, r, d = q.shape[-2], q.shape[-1], v.shape[-1]
    if q.shape != k.shape or v.shape[:-1] != q.shape[:-1] or min(n, r, d) < 1:
        return False
    batch = math.prod(q.shape[:-2])
    per_matrix = max(n * _padded(n), (_MAX_TERMS + 1) * _padded(d) * _padded(n), n * _padded(2 * r))
    if batch > _INT32_MAX or per_matrix > _INT32_MAX:
        return False
    if any(abs(s) > _INT32_MAX for t in tensors for s in t.stride()):
        return False
    from osa_lab.ops.cpu.gram_kernels import VECTOR_FLOATS

    lib = library()
    return lib is not None and lib.osa_gram_vector_floats() in VECTOR_FLOATS


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when contiguous and 64-byte aligned (what the kernels' vector loads need), else
    a copy that is (a saved-tensor hook may hand the backward any layout)."""
    if t.is_contiguous() and t.data_ptr() % 64 == 0:
        return t
    out = pool.empty(tuple(t.shape))
    out.copy_(t)
    return out


def _per_matrix(c: torch.Tensor, b: int) -> torch.Tensor:
    """``c`` as B contiguous float32 values on the CPU (one value broadcast to every matrix)."""
    c = c.detach().to(device="cpu", dtype=torch.float32).reshape(-1)
    if c.numel() == 1:
        c = c.expand(b)
    if c.numel() != b:
        raise OSAInputError(f"`c` has {c.numel()} values for {b} matrices; give one per matrix or one in all")
    return c.contiguous()


def _check(code: int, what: str) -> None:
    if code == 1:
        raise KernelFailedError(f"the CPU kernel {what} found no memory for its workspace")
    if code != 0:
        raise KernelFailedError(f"the CPU kernel {what} refused its arguments (code {code})")


def prepare(
    q: torch.Tensor, k: torch.Tensor, c: torch.Tensor, small: float
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(st, bound, squared)``: ``Sᵀ = c (k qᵀ − q kᵀ)``, exactly skew, stored as ``st`` (B, N, ⌈N⌉₈)
    with rows padded by zeros (``st[..., :N]`` is ``Sᵀ``; the other kernels read it in place), ``c``
    one value per matrix, (B,); ``bound`` (B, float64) bounds each ``‖S_b‖₂`` before the rounding allowance
    (:func:`~osa_lab.ops.expm.bounds.skew_bound_with_allowance` adds it):
    ``min((‖S²‖_F²/2)^{1/4}, ‖S‖_F/√2)``, or ``‖S‖_F/√2`` where the first is below ``small`` or
    where the N×N×N product ``S²`` cannot change the batch's largest bound. The kernel squares
    matrices in decreasing order of ``‖S‖_F`` and stops once the next one's ``‖S‖_F/√2`` is at
    most the largest bound found, so ``bound.max()`` is what squaring every matrix gives;
    ``squared`` is how many it squared."""
    n, r = q.shape[-2:]
    b = math.prod(q.shape[:-2])
    c = _per_matrix(c, b)
    # built_library() from here on, not library(): usable() said yes, and a backward runs the
    # kernels its forward ran even if OSA_LAB_CPU_KERNELS changed in between
    st = pool.empty((b, n, _padded(n)))  # kept for the backward: reused memory, not fresh pages
    bound = torch.empty(b, dtype=torch.float64)
    squared = ctypes.c_int(0)
    keep: list = []
    code = loaded_library().osa_cheb_prepare(
        b, n, r, *view_args(q, keep), *view_args(k, keep), c.data_ptr(), st.data_ptr(), bound.data_ptr(), small,
        ctypes.byref(squared), torch.get_num_threads(),
    )  # fmt: skip
    _check(code, "prepare")
    return st, bound, squared.value


def chebyshev_forward(
    st: torch.Tensor, v: torch.Tensor, coef: list[float], rho: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, zs, Σ y², Σ v²)``: ``y = Σ_k a_k W_k ≈ exp(S) v`` in ``v``'s layout, with ``X = S/ρ``,
    ``coef = [a_0, …, a_m]`` and ``st`` (padded ``Sᵀ``) from :func:`prepare`; ``zs`` (B, m, ⌈d⌉₈, ⌈N⌉₈)
    keeps ``W_0ᵀ … W_{m−1}ᵀ`` for :func:`chebyshev_backward`; the float64 sums of squares per
    matrix are the output check's."""
    n, d = v.shape[-2:]
    b, m = st.shape[0], len(coef) - 1
    if st.shape != (math.prod(v.shape[:-2]), n, _padded(n)) or not st.is_contiguous() or m < 1:
        raise OSAInputError(f"`st` of shape {tuple(st.shape)} does not fit v of shape {tuple(v.shape)} (or no terms)")
    st = _aligned(st)  # the products load its rows as 32-byte vectors
    y = pool.empty_like(v)  # v's order of dimensions: a layer's merge of the heads is a view
    # kept for the backward, as st; room for a quarter more terms, so that the degree's rise as
    # ‖S‖ grows through training reuses this memory instead of making a new buffer
    zs = pool.empty((b, m, _padded(d), _padded(n)), reserve=b * (m + -(-m // 4)) * _padded(d) * _padded(n))
    y_sq = torch.empty(b, dtype=torch.float64)
    v_sq = torch.empty(b, dtype=torch.float64)
    a = torch.tensor(coef, dtype=torch.float64)
    keep: list = []
    code = loaded_library().osa_cheb_forward(
        b, n, d, m, st.data_ptr(), *view_args(v, keep), a.data_ptr(), 1.0 / rho, zs.data_ptr(), *view_args(y, keep),
        y_sq.data_ptr(), v_sq.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    _check(code, "forward")
    return y, zs, y_sq, v_sq


def chebyshev_backward(
    st: torch.Tensor,
    zs: torch.Tensor,
    coef: list[float],
    rho: float,
    c: torch.Tensor,
    g: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    needs: tuple[bool, bool, bool, bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``(∂L/∂q, ∂L/∂k, ∂L/∂c, ∂L/∂v)`` of :func:`chebyshev_forward` for ``g = ∂L/∂y``, each in its
    input's layout (``∂L/∂c`` flat, (B,)); ``needs`` says which to compute (None for the others)."""
    n, r = q.shape[-2:]
    d = v.shape[-1]
    b, m = st.shape[0], len(coef) - 1
    need_q, need_k, need_c, need_v = needs
    if g.shape != v.shape or zs.shape != (b, m, _padded(d), _padded(n)) or st.shape != (b, n, _padded(n)):
        raise OSAInputError(
            f"the backward's tensors do not fit: g {tuple(g.shape)}, v {tuple(v.shape)}, st {tuple(st.shape)}, "
            f"zs {tuple(zs.shape)}"
        )
    st, zs = _aligned(st), _aligned(zs)

    # (the kernel writes through any strides: each gradient takes its input's layout)
    gq, gk, gv = (torch.empty_like(x) if wanted else None for x, wanted in ((q, need_q), (k, need_k), (v, need_v)))
    gc = torch.empty(b, dtype=torch.float32) if need_c else None
    cc = (_per_matrix(c, b).double() / rho).float()
    a = torch.tensor(coef, dtype=torch.float64)
    keep: list = []
    code = loaded_library().osa_cheb_backward(
        b, n, d, r, m, st.data_ptr(), zs.data_ptr(), a.data_ptr(), 1.0 / rho, cc.data_ptr(),
        *view_args(g, keep), *view_args(q, keep), *view_args(k, keep), *view_args(gv, keep), *view_args(gq, keep), *view_args(gk, keep),
        gc.data_ptr() if gc is not None else None, torch.get_num_threads(),
    )  # fmt: skip
    _check(code, "backward")
    return gq, gk, gc, gv
