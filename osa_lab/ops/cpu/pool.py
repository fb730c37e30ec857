"""Reused, already-faulted CPU memory for large results, and huge-page advice for fresh memory.

glibc hands multi-megabyte blocks back to the kernel when they are freed (and trims the heap
above its threshold), so a fresh tensor of that size is page-faulted again on first touch. The
small-N action saves ``Sᵀ`` and the Chebyshev iterates (2.8 MB per layer at N = 20, 6.4 MB at
N = 49, batch 64 × 4 heads) from every forward for its backward and returns an output that lives
until the backward too, and the low-rank engines write token-sized results (33.5 MB at N = 4096,
32 heads, d = 64; :func:`osa_lab.ops.expm.scratch.fresh_output`): without reuse every call
faults them in anew (BENCHMARKS.md).

A buffer is a NumPy array held by this thread's pool. A tensor handed out is a view of it
(``torch.from_numpy``), and every tensor or view of that memory keeps a reference to the array,
autograd's saved tensors included; so the array is handed out again only when the pool's own
reference is the last one (``sys.getrefcount``), never while anything can still read it. A
request takes the smallest free buffer that holds it and is at most :data:`REUSE_SLACK` times its
size, so a caller whose sizes drift upward (the action's saved iterates, one block per term of a
degree that follows ``‖S‖`` through training) can ask for headroom (``reserve``) and have the
next larger request served by the same memory. At most :data:`POOL_LIMIT_BYTES` per thread are
kept: a new buffer evicts unused buffers of the sizes least recently used, and beyond the limit
tensors are fresh ones.

A pooled tensor's storage is a NumPy array's memory: it cannot be resized (``resize_`` to a larger
size raises), and ``torch.utils.deterministic.fill_uninitialized_memory`` does not fill it (every
caller overwrites all of it before returning).
"""

from __future__ import annotations

import ctypes
import functools
import math
import sys
import threading
from collections.abc import Callable

import numpy as np
import torch

from osa_lab.errors import OSAInputError

#: Most bytes one thread's pool keeps (beyond it, :func:`empty` returns fresh tensors).
POOL_LIMIT_BYTES = 256 * 2**20

#: Largest ratio of a reused buffer's size to the request's (a request takes the smallest that fits).
REUSE_SLACK = 2.0

_ALIGN = 64  # bytes: the kernels load 32-byte vectors from rows that start at multiples of 32

#: Smallest new buffer, in bytes, that :func:`empty` (and
#: :func:`~osa_lab.ops.expm.scratch.fresh_output` for other dtypes) asks the kernel to back with huge pages.
HUGE_PAGE_MIN_BYTES = 8 * 2**20
_HUGE_PAGE_BYTES = 2 * 2**20
_MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise`` on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def advise_huge_pages(t: torch.Tensor) -> bool:
    """Ask Linux to back the whole 2 MiB pages inside ``t``'s memory with transparent huge pages
    (``madvise(MADV_HUGEPAGE)``, what PyTorch's opt-in ``THP_MEM_ALLOC_ENABLE=1`` does for every
    allocation). Advisory: True when the kernel accepted it; False on other systems, for tensors
    without real CPU memory (meta, fake or other subclasses, under torch.compile), for tensors that
    are not contiguous (an expanded view spans more than its storage) and where the kernel declined.
    Only the tensor's own bytes, inside its storage, are advised."""
    if t.device.type != "cpu" or type(t) is not torch.Tensor or torch.compiler.is_compiling():
        return False
    madvise = _madvise()
    if madvise is None or not t.is_contiguous():
        return False
    try:
        start, storage = t.data_ptr(), t.untyped_storage()
        end = min(start + t.numel() * t.element_size(), storage.data_ptr() + storage.nbytes())
    except (RuntimeError, NotImplementedError):  # functional tensors have no storage
        return False
    first = -(-start // _HUGE_PAGE_BYTES) * _HUGE_PAGE_BYTES
    last = end // _HUGE_PAGE_BYTES * _HUGE_PAGE_BYTES
    return start != 0 and last > first and madvise(first, last - first, _MADV_HUGEPAGE) == 0


class _Pool(threading.local):
    def __init__(self) -> None:
        self.arrays: dict[int, list[np.ndarray]] = {}
        self.bytes = 0


_POOL = _Pool()


def _refcount(arrays: list[np.ndarray], i: int) -> int:
    return sys.getrefcount(arrays[i])


#: What :func:`_refcount` reads for an array that only the pool's list refers to (the list's
#: reference and the call's own, 2 on CPython 3.11), measured once the same way.
_UNUSED = _refcount([np.empty(1)], 0)


def _free(arrays: list[np.ndarray], i: int) -> bool:
    return _refcount(arrays, i) <= _UNUSED


_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}


def empty(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, *, reserve: int = 0) -> torch.Tensor:
    """An uninitialised, contiguous, 64-byte aligned CPU tensor of ``shape`` and ``dtype``
    (float32 or float64) whose memory comes from this thread's pool (reused once nothing refers
    to it any more): the smallest free buffer that holds it and is at most :data:`REUSE_SLACK`
    times its size. A new buffer holds ``max(numel, reserve)`` elements (``reserve`` at most
    :data:`REUSE_SLACK` × numel, so that the buffer serves its own size again); one of
    :data:`HUGE_PAGE_MIN_BYTES` or more is advised huge pages before its first write."""
    count = math.prod(shape)
    need = count * dtype.itemsize + _ALIGN
    nbytes = max(count, reserve) * dtype.itemsize + _ALIGN
    if reserve > REUSE_SLACK * count:
        raise OSAInputError(f"reserve={reserve} is more than REUSE_SLACK = {REUSE_SLACK} times the {count} elements asked for")
    array = _reuse(need)
    if array is not None:
        return _view(array, count, shape, dtype)
    array = np.empty(nbytes, dtype=np.uint8)
    if _POOL.bytes + nbytes > POOL_LIMIT_BYTES:
        _evict(POOL_LIMIT_BYTES - nbytes)
    if _POOL.bytes + nbytes <= POOL_LIMIT_BYTES:
        _POOL.arrays[nbytes] = [*_POOL.arrays.pop(nbytes, []), array]  # most recently used last
        _POOL.bytes += nbytes
    out = _view(array, count, shape, dtype)
    if nbytes >= HUGE_PAGE_MIN_BYTES:
        advise_huge_pages(torch.from_numpy(array))  # the whole buffer, its reserve included
    return out


def _reuse(need: int) -> np.ndarray | None:
    """The smallest free buffer of ``need`` to ``need × REUSE_SLACK`` bytes, its size moved to the
    end of the eviction order; None when there is none."""
    for size in sorted(size for size in _POOL.arrays if need <= size <= need * REUSE_SLACK):
        arrays = _POOL.arrays[size]
        for array_index in range(len(arrays)):
            if _free(arrays, array_index):
                _POOL.arrays[size] = _POOL.arrays.pop(size)  # most recently used last
                return arrays[array_index]
    return None


def _evict(keep: int) -> None:
    """Drop unused buffers, of sizes least recently used first, until the pool holds at most
    ``keep`` bytes (buffers in use stay)."""
    for size in list(_POOL.arrays):  # dicts keep insertion order: a size used is moved to the end
        arrays = _POOL.arrays[size]
        for i in range(len(arrays) - 1, -1, -1):
            if _POOL.bytes <= keep:
                return
            if _free(arrays, i):
                del arrays[i]
                _POOL.bytes -= size
        if not arrays:
            del _POOL.arrays[size]


def empty_like(x: torch.Tensor) -> torch.Tensor:  # float32 (the kernels' dtype)
    """:func:`empty` with ``x``'s shape and its order of strides (``torch.empty_like``'s layout for
    a dense ``x``; for a view with gaps, the dense layout with the same order of dimensions)."""
    if 0 in x.stride():  # an expanded view: contiguous, as torch.empty_like gives it
        return empty(tuple(x.shape))
    strides = x.stride()
    order = sorted(range(x.dim()), key=lambda i: (-strides[i], -i))  # outermost first
    out = empty(tuple(x.shape[i] for i in order))
    return out.permute(*sorted(range(x.dim()), key=order.__getitem__))


def _view(array: np.ndarray, count: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    start = -array.ctypes.data % _ALIGN
    return torch.from_numpy(array[start : start + dtype.itemsize * count].view(_NUMPY[dtype]).reshape(shape))


def release() -> int:
    """Drop this thread's pool (buffers still in use stay alive with their tensors); returns the
    bytes it held."""
    held = _POOL.bytes
    _POOL.arrays, _POOL.bytes = {}, 0
    return held
