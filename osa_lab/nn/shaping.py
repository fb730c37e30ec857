"""Kernel shaping of deep skipless networks with TAT's tailored leaky ReLU.

Tailored Activation Transformation (TAT; Zhang, Botev & Martens, arXiv 2203.08120) makes a deep
network without skips or normalisation trainable by choosing the negative slope α of a
normalised leaky ReLU from the depth, so that the network's C-map (how the cosine between two
inputs maps through the network at initialisation, with orthogonal "delta" weights) is neither
degenerate nor linear. This module computes the kernel maps analytically and solves for α.

The normalised leaky ReLU (TAT §4, eq. 9) is

    φ_α(x) = sqrt(2 / (1 + α²)) · (max(x, 0) + α · min(x, 0)),

so that E[φ_α(z)²] = 1 for z ~ N(0, 1): its q-map fixes q = 1 (DKS, arXiv 2110.01765, §4.2).
Its local C-map (TAT eq. 10; the arc-cosine kernel of Cho & Saul for the ReLU part) is

    C_α(c) = c + (1 - α)² / (π (1 + α²)) · (sqrt(1 - c²) - c · arccos(c)),

with C_α(1) = 1 and C_α'(1) = 1 for every α. A network of ``depth`` such layers has the C-map
C_α^{∘depth}; TAT's rule (arXiv 2203.08120, eq. 11) picks α ∈ [0, 1) such that

    C_α^{∘depth}(0) = η,

with η = 0.9 by default (the target used in the paper and in google-deepmind/dks).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from osa_lab.errors import ConfigurationError

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_C0_TARGET = 0.9
"""TAT's default target η for the network's C-map at c = 0 (arXiv 2203.08120, §4)."""


def leaky_relu_scale(negative_slope: float) -> float:
    """The factor sqrt(2 / (1 + α²)) that makes E[φ_α(z)²] = 1 for z ~ N(0, 1) (TAT eq. 9)."""
    return math.sqrt(2.0 / (1.0 + negative_slope**2))


def normalised_leaky_relu(x: np.ndarray, negative_slope: float) -> np.ndarray:
    """TAT's normalised leaky ReLU φ_α(x) (arXiv 2203.08120, eq. 9), for NumPy arrays."""
    scale = leaky_relu_scale(negative_slope)
    return scale * np.where(x > 0, x, negative_slope * x)


def leaky_relu_c_map(c: np.ndarray | float, negative_slope: float) -> np.ndarray:
    """The local C-map C_α(c) of the normalised leaky ReLU (arXiv 2203.08120, eq. 10)."""
    c = np.clip(np.asarray(c, dtype=np.float64), -1.0, 1.0)
    curvature = (1.0 - negative_slope) ** 2 / (math.pi * (1.0 + negative_slope**2))
    return c + curvature * (np.sqrt(1.0 - c**2) - c * np.arccos(c))


def network_c_map(c: np.ndarray | float, negative_slope: float, depth: int) -> np.ndarray:
    """The C-map C_α^{∘depth}(c) of ``depth`` normalised leaky-ReLU layers with delta init."""
    _check_depth(depth)
    value = np.asarray(c, dtype=np.float64)
    for _ in range(depth):
        value = leaky_relu_c_map(value, negative_slope)
    return value


def tat_leaky_relu_slope(depth: int, c0_target: float = DEFAULT_C0_TARGET) -> float:
    """TAT's negative slope α for a network of ``depth`` nonlinear layers (arXiv 2203.08120, eq. 11).

    Solves C_α^{∘depth}(0) = ``c0_target`` for α ∈ [0, 1). C_α^{∘depth}(0) falls monotonically
    from the ReLU's value (α = 0) to 0 (α = 1, the identity), so a solution exists exactly when
    the target lies in (0, C_0^{∘depth}(0)]; otherwise the network is too shallow for the target.
    """
    _check_depth(depth)
    if not 0.0 < c0_target < 1.0:
        raise ConfigurationError(
            f"c0_target must lie strictly between 0 and 1, got {c0_target!r}; TAT uses 0.9"
        )
    relu_value = float(network_c_map(0.0, 0.0, depth))
    if c0_target > relu_value:
        raise ConfigurationError(
            f"c0_target={c0_target} is unreachable at depth {depth}: even a ReLU (slope 0) only "
            f"reaches C(0)={relu_value:.4f}; lower the target or use a deeper network"
        )
    if c0_target == relu_value:
        return 0.0
    # bisection on the monotone map: f(0) > 0 > f(1); 200 halvings reach float64's resolution
    low, high = 0.0, 1.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        if float(network_c_map(0.0, middle, depth)) > c0_target:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


def c_map_table(negative_slope: float, depths: list[int], c_in: np.ndarray | None = None) -> pd.DataFrame:
    """The predicted C-map as DKS reports it: one row per (depth, c_in) with ``c_out``.

    Columns: ``depth``, ``c_in``, ``c_out`` (analytic C_α^{∘depth}(c_in), arXiv 2203.08120 eq. 10).
    A table needs pandas (the ``lab`` extra); the maps above need only NumPy.
    """
    from osa_lab.extras import require_lab

    require_lab("osa_lab.nn.shaping.c_map_table")
    import pandas as pd

    grid = np.linspace(-1.0, 1.0, 21) if c_in is None else np.asarray(c_in, dtype=np.float64)
    rows = [
        {"depth": depth, "c_in": float(c), "c_out": float(network_c_map(c, negative_slope, depth))}
        for depth in depths
        for c in grid
    ]
    return pd.DataFrame(rows, columns=["depth", "c_in", "c_out"])


def monte_carlo_c_map(c_in: float, negative_slope: float, samples: int = 200_000, seed: int = 0) -> float:
    """Empirical one-layer C-map: cosine E[φ(u)φ(v)] for unit Gaussians u, v with correlation c_in.

    The reference for :func:`leaky_relu_c_map`; since q = 1 is fixed, the covariance is the cosine.
    """
    if not -1.0 <= c_in <= 1.0:
        raise ConfigurationError(f"c_in must lie in [-1, 1], got {c_in!r}")
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(samples)
    w = rng.standard_normal(samples)
    v = c_in * u + math.sqrt(max(0.0, 1.0 - c_in**2)) * w
    return float(np.mean(normalised_leaky_relu(u, negative_slope) * normalised_leaky_relu(v, negative_slope)))


def shaped_slope(depth: int, c0_target: float = DEFAULT_C0_TARGET) -> float:
    """The slope the shaped presets use for ``depth`` nonlinear layers: TAT's rule
    (:func:`tat_leaky_relu_slope`), or 0 (the normalised ReLU) where the network is too shallow
    for ``c0_target``. A ReLU network of that depth already keeps C(0) below the target
    (C_0^{∘8}(0) = 0.834 < 0.9), so no slope can raise it further."""
    _check_depth(depth)
    if float(network_c_map(0.0, 0.0, depth)) <= c0_target:
        return 0.0
    return tat_leaky_relu_slope(depth, c0_target)


def measured_c_map(
    layers: list[nn.Module], c_in: float, dim: int, *, pairs: int = 64, seed: int = 0
) -> float:
    """The C-map of a built stack, measured as DKS reports it (arXiv 2110.01765, §3): the mean
    cosine, after ``layers`` applied in turn, between ``pairs`` pairs of Gaussian vectors of width
    ``dim`` whose cosine is ``c_in`` (in expectation), computed in float64 without gradients.
    Compare with :func:`network_c_map`, the infinite-width prediction."""
    if not -1.0 <= c_in <= 1.0:
        raise ConfigurationError(f"c_in must lie in [-1, 1], got {c_in!r}")
    g = torch.Generator().manual_seed(seed)
    u, w = (torch.randn(pairs, dim, generator=g, dtype=torch.float64) for _ in range(2))
    x1, x2 = u, c_in * u + math.sqrt(max(0.0, 1.0 - c_in**2)) * w
    with torch.no_grad():
        for layer in layers:
            x1, x2 = layer(x1), layer(x2)
    return float(nn.functional.cosine_similarity(x1, x2, dim=-1).mean())


def tied_mlp_gain(q: torch.Tensor, negative_slope: float) -> float:
    """The gain g for which the tied MLP ``g √(d/h) Qᵀ φ_α(√(h/d) Q x)`` keeps the mean square of its
    input: E‖out‖² = E‖x‖² for x ~ N(0, I_d), i.e. its q-map fixes q (DKS, arXiv 2110.01765, §4.2).

    ``q`` is the (h × d) semi-orthogonal matrix (QᵀQ = I). Without the gain the block shrinks the
    signal: ``Qᵀ`` keeps all of φ's linear part but only part of its ``|u|`` part, e.g. ≈ 0.67 of the
    mean square per block at α = 0, h = 4d. Exactly (φ_α is positively homogeneous, so every input
    scale gives the same g): with φ_α(u) = s (a u + b |u|), s² = 2 / (1 + α²), a = (1 + α)/2,
    b = (1 − α)/2 and u = Q x ~ N(0, P), P = Q Qᵀ, E⟨u, |u|⟩ = 0 and

        E‖Qᵀ φ_α(u)‖² = s² (a² d + b² Σ_jk P_jk E|u_j||u_k|),
        E|u_j||u_k| = (2/π) σ_j σ_k (√(1 − ρ²) + ρ arcsin ρ),

    σ_j² = P_jj, ρ = P_jk / (σ_j σ_k) (the absolute moment of a bivariate normal); g² = d / that.
    """
    q = q.detach().to(torch.float64)
    d = q.shape[1]
    p = q @ q.mT
    sigma = p.diagonal().clamp_min(0.0).sqrt()
    outer = sigma[:, None] * sigma[None, :]
    rho = torch.where(outer > 0, p / outer.clamp_min(1e-300), torch.zeros_like(p)).clamp(-1.0, 1.0)
    abs_moment = (2.0 / math.pi) * outer * ((1.0 - rho**2).sqrt() + rho * torch.asin(rho))
    a, b = (1.0 + negative_slope) / 2.0, (1.0 - negative_slope) / 2.0
    kept = leaky_relu_scale(negative_slope) ** 2 * (a**2 * d + b**2 * float((p * abs_moment).sum()))
    return math.sqrt(d / kept)


class TATLeakyReLU(nn.Module):
    """TAT's normalised leaky ReLU φ_α(x) = sqrt(2/(1+α²)) · (max(x, 0) + α min(x, 0))
    (arXiv 2203.08120, eq. 9) as a layer: E[φ_α(z)²] = 1 for z ~ N(0, 1)."""

    def __init__(self, negative_slope: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= negative_slope < 1.0:
            raise ConfigurationError(f"negative_slope must lie in [0, 1), got {negative_slope!r}")
        self.negative_slope = float(negative_slope)
        self.scale = leaky_relu_scale(self.negative_slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self.scale * nn.functional.leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:  # noqa: D102
        return f"negative_slope={self.negative_slope:.4g}"


def _check_depth(depth: int) -> None:
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        raise ConfigurationError(f"depth must be a positive integer, got {depth!r}")
