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

import functools
import math

import torch

from osa_lab.errors import KernelFailedError
from osa_lab.ops.cpu import pool
from osa_lab.ops.cpu.build import library

_INT32_MAX = 2**31 - 1


def _padded(n: int) -> int:
    return (n + 7) // 8 * 8


@functools.lru_cache(maxsize=64)
def _offsets(shape: tuple[int, ...], strides: tuple[int, ...]) -> torch.Tensor:
    """Element offsets of each matrix of a (*batch, rows, cols) view, batch flattened row-major."""
    offs = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(shape, strides, strict=True):
        offs = offs.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride
    return offs.reshape(-1).contiguous()


def _args(x: torch.Tensor | None, keep: list) -> tuple:
    """The four C arguments of a (*batch, rows, cols) view: base pointer, per-matrix offsets, row
    stride, column stride (NULL and zeros for None); ``keep`` holds the offsets alive for the call."""
    if x is None:
        return (None, None, 0, 0)
    offs = _offsets(tuple(x.shape[:-2]), tuple(x.stride()[:-2]))
    keep.append(offs)
    return (x.data_ptr(), offs.data_ptr(), x.stride(-2), x.stride(-1))


def usable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """True when the kernels can run on ``q, k (*batch, N, r)`` and ``v (*batch, N, d)``: plain
    (not subclassed) float32 CPU tensors with the same leading dims, strides that fit in 32 bits,
    and the library built (:func:`osa_lab.ops.cpu.build.status`)."""
    tensors = (q, k, v)
    if not all(type(t) is torch.Tensor and t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors):
        return False
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]) or any(t.dim() < 2 for t in tensors):
        return False
    if any(abs(s) > _INT32_MAX for t in tensors for s in t.stride()[-2:]) or q.shape[-2] * q.shape[-2] > _INT32_MAX:
        return False
    return library() is not None


def _check(code: int, what: str) -> None:
    if code == 1:
        raise KernelFailedError(f"the CPU kernel {what} found no memory for its per-thread workspace")
    if code != 0:
        raise KernelFailedError(f"the CPU kernel {what} refused its arguments (code {code})")


def prepare(q: torch.Tensor, k: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(Sᵀ, ‖Sᵀ²‖_F², ‖Sᵀ‖_F²)``: ``Sᵀ = c (k qᵀ − q kᵀ)`` (B, N, N), exactly skew, and the two
    float64 sums of squares per matrix that :func:`~osa_lab.ops.expm.bounds.skew_bound_from_squares`
    turns into a bound of ``‖S‖₂``; ``c`` one value per matrix, (B,)."""
    n, r = q.shape[-2:]
    b = math.prod(q.shape[:-2])
    c = c.to(torch.float32).contiguous()
    st = pool.empty((b, n, n))  # kept for the backward: reused memory, not fresh pages
    d2_sq = torch.empty(b, dtype=torch.float64)
    fro_sq = torch.empty(b, dtype=torch.float64)
    keep: list = []
    code = library().osa_cheb_prepare(
        b, n, r, *_args(q, keep), *_args(k, keep), c.data_ptr(), st.data_ptr(), d2_sq.data_ptr(), fro_sq.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    _check(code, "prepare")
    return st, d2_sq, fro_sq


def chebyshev_forward(
    st: torch.Tensor, v: torch.Tensor, coef: list[float], rho: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, zs, Σ y², Σ v²)``: ``y = Σ_k a_k W_k ≈ exp(S) v`` in ``v``'s layout, with ``X = S/ρ``,
    ``coef = [a_0, …, a_m]`` and ``st = Sᵀ`` from :func:`prepare`; ``zs`` (B, m, ⌈d⌉₈, ⌈N⌉₈)
    keeps ``W_0ᵀ … W_{m−1}ᵀ`` for :func:`chebyshev_backward`; the float64 sums of squares per
    matrix are the output check's."""
    n, d = v.shape[-2:]
    b, m = st.shape[0], len(coef) - 1
    y = pool.empty_like(v)  # v's order of dimensions: a layer's merge of the heads is a view
    zs = pool.empty((b, m, _padded(d), _padded(n)))  # kept for the backward, as st
    y_sq = torch.empty(b, dtype=torch.float64)
    v_sq = torch.empty(b, dtype=torch.float64)
    a = torch.tensor(coef, dtype=torch.float64)
    keep: list = []
    code = library().osa_cheb_forward(
        b, n, d, m, st.data_ptr(), *_args(v, keep), a.data_ptr(), 1.0 / rho, zs.data_ptr(), *_args(y, keep),
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

    def like(x: torch.Tensor, wanted: bool) -> torch.Tensor | None:
        if not wanted:
            return None
        out = torch.empty_like(x)
        return out if out.stride() == x.stride() else torch.empty(x.shape, dtype=x.dtype)

    gq, gk, gv = like(q, need_q), like(k, need_k), like(v, need_v)
    gc = torch.empty(b, dtype=torch.float32) if need_c else None
    cc = (c.to(torch.float64) / rho).to(torch.float32).contiguous()
    a = torch.tensor(coef, dtype=torch.float64)
    keep: list = []
    code = library().osa_cheb_backward(
        b, n, d, r, m, st.data_ptr(), zs.data_ptr(), a.data_ptr(), 1.0 / rho, cc.data_ptr(),
        *_args(g, keep), *_args(q, keep), *_args(k, keep), *_args(gv, keep), *_args(gq, keep), *_args(gk, keep),
        gc.data_ptr() if gc is not None else None, torch.get_num_threads(),
    )  # fmt: skip
    _check(code, "backward")
    return gq, gk, gc, gv
