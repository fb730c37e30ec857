"""Shared test helpers: input generators and error measures."""

from __future__ import annotations

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative Frobenius error ‖a − b‖ / ‖b‖ computed in float64 (0 when both are 0)."""
    a, b = a.double(), b.double()
    denom = torch.linalg.vector_norm(b)
    num = torch.linalg.vector_norm(a - b)
    return float(num / denom) if denom > 0 else float(num)


def make_qk(kind: str, n: int, r: int, *, batch: tuple[int, ...] = (), dtype=torch.float64, seed: int = 0):
    """q, k of shape (*batch, n, r): ``random``, ``equal`` (k = q), ``zero`` or ``parallel`` (k ≈ q)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, n, r, generator=g, dtype=torch.float64)
    if kind == "random":
        k = torch.randn(*batch, n, r, generator=g, dtype=torch.float64)
    elif kind == "equal":
        k = q.clone()
    elif kind == "zero":
        q = torch.zeros_like(q)
        k = torch.zeros_like(q)
    elif kind == "parallel":
        k = q + 1e-4 * torch.randn(*batch, n, r, generator=g, dtype=torch.float64)
    else:
        raise ValueError(kind)
    return q.to(dtype), k.to(dtype)
