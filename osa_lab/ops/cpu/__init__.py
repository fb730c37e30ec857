"""Compiled CPU kernels: the small-N Chebyshev action of OSA fused per matrix (float32).

Rooms: :mod:`~osa_lab.ops.cpu.build` (compile at first use into a private directory, load,
:func:`~osa_lab.ops.cpu.build.status`) and :mod:`~osa_lab.ops.cpu.kernels` (the calls, beside
their PyTorch reference in :mod:`osa_lab.ops.expm.chebyshev`). docs/cpu_kernels.md describes them.
"""

from osa_lab.ops.cpu.build import enabled, status
from osa_lab.ops.cpu.kernels import chebyshev_backward, chebyshev_forward, prepare, usable

__all__ = ["chebyshev_backward", "chebyshev_forward", "enabled", "prepare", "status", "usable"]
