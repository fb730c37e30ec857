"""Reused, already-faulted memory for the tensors the CPU kernels keep for the backward.

glibc hands multi-megabyte blocks back to the kernel when they are freed (and trims the heap
above its threshold), so a fresh tensor of that size is page-faulted again on first touch. The
small-N action saves ``Sᵀ`` and the Chebyshev iterates (2.8 MB per layer at N = 20, 6.4 MB at
N = 49, batch 64 × 4 heads) from every forward for its backward, and returns an output that lives
until the backward too: without reuse a training step faults them in anew each time
(BENCHMARKS.md).

A buffer is a NumPy array held by this thread's pool. A tensor handed out is a view of it
(``torch.from_numpy``), and every tensor or view of that memory keeps a reference to the array,
autograd's saved tensors included; so the array is handed out again only when the pool's own
reference is the last one (``sys.getrefcount``), never while anything can still read it. At most
:data:`POOL_LIMIT_BYTES` per thread are kept; beyond, tensors are fresh ones.
"""

from __future__ import annotations

import math
import sys
import threading

import numpy as np
import torch

#: Most bytes one thread's pool keeps (beyond it, :func:`empty` returns fresh tensors).
POOL_LIMIT_BYTES = 256 * 2**20

_ALIGN = 64  # bytes: the kernels load 32-byte vectors from rows that start at multiples of 32


class _Pool(threading.local):
    def __init__(self) -> None:
        self.arrays: dict[int, list[np.ndarray]] = {}
        self.bytes = 0


_POOL = _Pool()


def _free(arrays: list[np.ndarray], i: int) -> bool:
    return sys.getrefcount(arrays[i]) == 2  # the list's reference and the argument's


def empty(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised, contiguous, 64-byte aligned float32 CPU tensor of ``shape`` whose memory
    comes from this thread's pool (reused once nothing refers to it any more)."""
    count = math.prod(shape)
    nbytes = count * 4 + _ALIGN
    arrays = _POOL.arrays.setdefault(nbytes, [])
    for i in range(len(arrays)):
        if _free(arrays, i):
            return _view(arrays[i], count, shape)
    array = np.empty(nbytes, dtype=np.uint8)
    if _POOL.bytes + nbytes <= POOL_LIMIT_BYTES:
        arrays.append(array)
        _POOL.bytes += nbytes
    return _view(array, count, shape)


def empty_like(x: torch.Tensor) -> torch.Tensor:
    """:func:`empty` with ``x``'s shape and its order of strides (``torch.empty_like``'s layout for
    a dense ``x``; for a view with gaps, the dense layout with the same order of dimensions)."""
    if 0 in x.stride():  # an expanded view: contiguous, as torch.empty_like gives it
        return empty(tuple(x.shape))
    order = sorted(range(x.dim()), key=lambda i: (-x.stride(i), -i))  # outermost first
    out = empty(tuple(x.shape[i] for i in order))
    return out.permute(*sorted(range(x.dim()), key=order.__getitem__))


def _view(array: np.ndarray, count: int, shape: tuple[int, ...]) -> torch.Tensor:
    start = -array.ctypes.data % _ALIGN
    return torch.from_numpy(array[start : start + 4 * count].view(np.float32).reshape(shape))


def release() -> int:
    """Drop this thread's pool (buffers still in use stay alive with their tensors); returns the
    bytes it held."""
    held = _POOL.bytes
    _POOL.arrays, _POOL.bytes = {}, 0
    return held
