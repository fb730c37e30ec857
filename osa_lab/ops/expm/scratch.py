"""Per-thread CPU buffers that the engines' temporaries reuse across calls.

glibc hands multi-megabyte blocks back to the kernel when they are freed, so every fresh tensor
of that size is page-faulted (zeroed) again on first touch: for 32 matrices of 128 × 128 that was
≈ 40 % of :func:`~osa_lab.ops.expm.core.core_skew_exp`. A buffer holds a temporary only while one
call uses it: it is never returned to a caller nor saved for a backward.

Part of :mod:`osa_lab.ops.expm` (Zhang & Martens, arXiv 2602.05996; docs/design.md §1–§2).
"""

from __future__ import annotations

import threading

import torch

from osa_lab.ops.cpu.pool import HUGE_PAGE_MIN_BYTES, advise_huge_pages
from osa_lab.ops.cpu.pool import empty as pooled_empty

#: Most bytes one :class:`Scratch` keeps per thread between calls (larger requests get fresh tensors).
SCRATCH_LIMIT_BYTES = 64 * 2**20


class Scratch(threading.local):
    """Buffers of one shape and dtype per thread, at most ``SCRATCH_LIMIT_BYTES``; a request
    for another shape replaces them. Buffers are allocated outside inference mode, so they can
    be written in and out of it. CUDA tensors get fresh tensors (PyTorch's caching allocator
    already reuses their memory)."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.buffers: list[torch.Tensor] = []

    def take(self, like: torch.Tensor, count: int) -> list[torch.Tensor]:
        """``count`` contiguous tensors of ``like``'s shape and dtype, uninitialised."""
        size = like.numel() * like.element_size() * count
        if like.device.type != "cpu" or size > SCRATCH_LIMIT_BYTES:
            return [torch.empty_like(like, memory_format=torch.contiguous_format) for _ in range(count)]
        key = (tuple(like.shape), like.dtype)
        if key != self.key or len(self.buffers) < count:
            with torch.inference_mode(False):  # inference tensors could not be written outside it
                self.key, self.buffers = key, [torch.empty(like.shape, dtype=like.dtype) for _ in range(count)]
        return self.buffers[:count]

    def release(self) -> int:
        """Free this thread's buffers; returns the bytes freed."""
        freed = sum(b.numel() * b.element_size() for b in self.buffers)
        self.key, self.buffers = None, []
        return freed


#: The low-rank engines' core exponential (:func:`~osa_lab.ops.expm.core.core_skew_exp`) and Gram
#: step (:func:`~osa_lab.ops.expm.gram.gram_core_parts`, whose two scratch-backed results its
#: callers use at once).
SCRATCH = Scratch()

#: The fused small-N action's N×N temporaries (:func:`~osa_lab.ops.expm.chebyshev.osa_chebyshev_action`:
#: ``P = k qᵀ`` and the bound's ``S²`` in the forward, the backward's ``∂L/∂X`` and its skew part).
ACTION_SCRATCH = Scratch()


def fresh_output(like: torch.Tensor, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """An uninitialised contiguous tensor of ``like``'s dtype and device (and shape, unless given)
    for a result the caller keeps. On the CPU in float32 and float64 it comes from the per-thread
    pool of reused memory (:func:`osa_lab.ops.cpu.pool.empty`): once a result is freed its
    memory serves the next one without being page-faulted again (a token-sized output at N = 4096,
    32 heads: 33.5 MB; BENCHMARKS.md). Other CPU tensors of :data:`HUGE_PAGE_MIN_BYTES` or more
    are advised huge pages before their first write: glibc maps such blocks fresh from the
    kernel, and first touch then faults once per 4 KiB page (a ``baddbmm`` into a fresh 32 MiB
    output: 8,193 faults and 22.6 ms; advised, 528 faults and 12.2 ms; into memory already
    mapped, 13.0 ms; BENCHMARKS.md)."""
    shape = tuple(like.shape) if shape is None else shape
    if like.device.type == "cpu" and like.dtype in (torch.float32, torch.float64) and not torch.compiler.is_compiling():
        return pooled_empty(shape, like.dtype)
    out = torch.empty(shape, dtype=like.dtype, device=like.device)
    if out.numel() * out.element_size() >= HUGE_PAGE_MIN_BYTES:
        advise_huge_pages(out)  # (False, and nothing done, off the CPU)
    return out


def release_scratch() -> int:
    """Free this thread's scratch buffers of every engine (re-allocated on the next call); returns the bytes freed."""
    return SCRATCH.release() + ACTION_SCRATCH.release()
