"""Compiled CPU kernels (float32): the small-N Chebyshev action of OSA fused per matrix, and the
Gram engine's passes over the tokens.

Rooms: :mod:`~osa_lab.ops.cpu.build` (compile at first use into a private directory, load,
:func:`~osa_lab.ops.cpu.build.status`), :mod:`~osa_lab.ops.cpu.kernels` (the small-N action,
beside its PyTorch reference in :mod:`osa_lab.ops.expm.chebyshev`),
:mod:`~osa_lab.ops.cpu.gram_kernels` (the token passes, beside their reference in
:mod:`osa_lab.ops.expm.gram`), :mod:`~osa_lab.ops.cpu.core_kernels` (the float64 products of the
core's exponential, beside ``torch.matmul`` in :mod:`osa_lab.ops.expm.core`), :mod:`~osa_lab.ops.cpu.views` (how a kernel sees a tensor view)
and :mod:`~osa_lab.ops.cpu.pool` (reused memory). docs/cpu_kernels.md describes them.
"""

from osa_lab.ops.cpu.build import enabled, status, turned_off
from osa_lab.ops.cpu.kernels import chebyshev_backward, chebyshev_forward, prepare, usable

__all__ = ["chebyshev_backward", "chebyshev_forward", "enabled", "prepare", "status", "turned_off", "usable"]
