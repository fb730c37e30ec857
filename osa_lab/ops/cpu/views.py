"""How the CPU kernels see a tensor: a (*batch, rows, cols) view as a base pointer, per-matrix
element offsets (batch flattened row-major) and strides, so that views such as a layer's
head-split q, k, v are read and written in place (no packing pass)."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=64)
def matrix_offsets(shape: tuple[int, ...], strides: tuple[int, ...]) -> torch.Tensor:
    """Element offsets of each matrix of a (*batch, rows, cols) view, batch flattened row-major."""
    offs = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(shape, strides, strict=True):
        offs = offs.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride
    return offs.reshape(-1).contiguous()


def view_args(x: torch.Tensor | None, keep: list, *, column_stride: bool = True) -> tuple:
    """The C arguments of a (*batch, rows, cols) view: base pointer, per-matrix offsets, row stride
    and (``column_stride=True``) column stride; NULL and zeros for None. ``keep`` holds the offsets
    alive for the call."""
    if x is None:
        return (None, None, 0, 0) if column_stride else (None, None, 0)
    offs = matrix_offsets(tuple(x.shape[:-2]), tuple(x.stride()[:-2]))
    keep.append(offs)
    head = (x.data_ptr(), offs.data_ptr(), x.stride(-2))
    return (*head, x.stride(-1)) if column_stride else head
