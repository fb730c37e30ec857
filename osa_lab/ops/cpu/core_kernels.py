"""Python side of the float64 products of the low-rank engines' small core (``core_products.c``).

The exponential of the 2r × 2r skew-symmetric core (:func:`osa_lab.ops.expm.core.skew_exp`;
Zhang & Martens, arXiv 2602.05996, docs/design.md §2) is a chain of batched float64 products:
the powers of ``M``, the Paterson–Stockmeyer Horner steps and the squarings. :func:`matmul`
computes ``out = alpha · a b (+ add)`` for contiguous batches of square matrices; the reference
beside it is ``torch.matmul`` / ``torch.baddbmm``, which the callers keep wherever :func:`usable`
says no.
"""

from __future__ import annotations

import torch

from osa_lab.errors import KernelFailedError, OSAInputError
from osa_lab.ops.cpu.build import library, loaded_library

#: Doubles per vector of the builds the products are used with: 8 (AVX-512) and 4 (AVX2 with FMA).
VECTOR_DOUBLES = (4, 8)

#: The matrices' size n is a multiple of this (whole register blocks on either build).
SIZE_MULTIPLE = 8


def usable(*mats: torch.Tensor) -> bool:
    """True when :func:`matmul` can run on ``mats``: plain (not subclassed) contiguous float64 CPU
    tensors of one shape ``(b, n, n)`` with ``n`` a multiple of 8, outside ``torch.compile``
    tracing, and the library built with hardware vectors (AVX-512 or AVX2 with FMA)."""
    if not mats or torch.compiler.is_compiling():
        return False
    shape = mats[0].shape
    if len(shape) != 3 or shape[1] != shape[2] or shape[1] % SIZE_MULTIPLE or shape[1] < SIZE_MULTIPLE:
        return False
    if not all(
        type(m) is torch.Tensor and m.device.type == "cpu" and m.dtype == torch.float64 and m.shape == shape
        and m.is_contiguous()
        for m in mats
    ):  # fmt: skip
        return False
    lib = library()
    return lib is not None and lib.osa_core_vector_doubles() in VECTOR_DOUBLES


def matmul(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, alpha: float = 1.0, add: torch.Tensor | None = None
) -> torch.Tensor:
    """``out = alpha · a b + add`` (``add`` None: no term) for batches of square float64 matrices
    that :func:`usable` accepts; ``out`` must not share memory with ``a`` or ``b`` (it may be
    ``add``). Returns ``out``."""
    mats = (a, b, out) if add is None else (a, b, out, add)
    if not usable(*mats):
        raise OSAInputError("core_kernels.matmul takes contiguous (b, n, n) float64 CPU tensors of one shape, n a multiple of 8")
    if out.data_ptr() in (a.data_ptr(), b.data_ptr()):
        raise OSAInputError("core_kernels.matmul: `out` must not be `a` or `b`")
    code = loaded_library().osa_core_bmm(
        a.shape[0], a.shape[1], a.data_ptr(), b.data_ptr(), None if add is None else add.data_ptr(), out.data_ptr(),
        float(alpha), torch.get_num_threads(),
    )  # fmt: skip
    if code == 1:
        raise KernelFailedError("the CPU kernel osa_core_bmm found no memory for its per-thread workspace")
    if code != 0:
        raise KernelFailedError(f"the CPU kernel osa_core_bmm refused its arguments (code {code})")
    return out
