"""GPU kernels (Triton): :mod:`.kernels`, their compile check and sync counter. Import lazily:
Triton is optional on the CPU."""

from __future__ import annotations

import functools


@functools.cache
def triton_available() -> bool:
    """True when Triton can be imported."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True
