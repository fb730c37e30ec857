"""Autocast and the OSA methods: they compute in their own working dtype.

Under ``torch.autocast`` PyTorch would run the methods' products in float16/bfloat16 (silently,
where their working dtype is float32 or float64, e.g. the float64 cores and recomputations) and
mix dtypes in their in-place updates. :func:`osa_lab.osa` therefore runs its method with autocast
off, and every hand-written backward does the same (:func:`autocast_off_backward`), since a
backward may run inside an autocast region too. The output still comes back in ``v``'s dtype.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch


def autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """``torch.autocast(device_type, enabled=False)`` where autocast is on, else a no-op context."""
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def autocast_off_backward(backward: Callable) -> Callable:
    """Decorate an ``autograd.Function.backward`` to run with autocast off on its gradients' device."""

    @functools.wraps(backward)
    def run(ctx, *grads):
        device = next((g.device.type for g in grads if isinstance(g, torch.Tensor)), "cpu")
        with autocast_off(device):
            return backward(ctx, *grads)

    return run
