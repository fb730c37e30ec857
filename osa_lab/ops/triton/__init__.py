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


def __getattr__(name: str):
    """``from osa_lab.kernels import triton_osa`` (the module's name before the regrouping)."""
    if name == "triton_osa":
        import importlib

        return importlib.import_module("osa_lab.ops.triton.kernels")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
