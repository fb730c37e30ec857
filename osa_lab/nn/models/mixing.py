"""Token-mixing diagnostics of OSA layers (they measure mixing, not α) and the α := 0 ablation.

:func:`skew_generator` is OSA's generator ``S``; :func:`mixing_stats` gives ``‖S‖₂`` and how far
``exp(S)`` moves the values; :func:`mixing_table` collects both per OSA layer and head of a
model; :func:`alpha_zeroed` evaluates a model with every α set to 0.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import cast

import torch
from torch import nn

from osa_lab.nn.attention import OrthogonalSelfAttention
from osa_lab.nn.models.blocks import Block
from osa_lab.nn.models.builders import Encoder, ViTClassifier, osa_layers


def skew_generator(q: torch.Tensor, k: torch.Tensor, alpha: torch.Tensor | float) -> torch.Tensor:
    """OSA's generator ``S = α/√r (q kᵀ − k qᵀ)`` (Zhang & Martens 2026) in float64, shape ``(…, N, N)``.

    ``alpha`` broadcasts against the leading dimensions of ``q`` (e.g. one value per head).
    """
    q64, k64 = q.double(), k.double()
    a = torch.as_tensor(alpha, dtype=torch.float64, device=q.device)
    a = a.reshape(*a.shape, 1, 1)  # α's dimensions align with q's leading (batch) dimensions
    return a / math.sqrt(q.shape[-1]) * (q64 @ k64.mT - k64 @ q64.mT)


def mixing_stats(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alpha: torch.Tensor | float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(‖S‖₂, ‖exp(S) V − V‖_F / ‖V‖_F)`` for every leading index of ``q``, ``k``, ``v`` (float64).

    ``‖S‖₂`` is the spectral norm of the generator (the largest rotation angle of ``exp(S)``, in
    radians); the second number is the **mixing ratio**: how far OSA moves the values away from
    the identity map ``V ↦ V`` (0: no mixing). Both are computed exactly with
    ``torch.linalg.matrix_exp`` (meant for diagnostics at N ≲ 100). Example: N = 2, r = 1,
    q = (1, 0), k = (0, 1), v = (1, 0) gives ``S = α [[0, 1], [−1, 0]]``, ‖S‖₂ = |α| and the
    ratio ``‖(cos α − 1, −sin α)‖ = 2|sin(α/2)|``.
    """
    s = skew_generator(q, k, alpha)
    v64 = v.double()
    s_norm = torch.linalg.matrix_norm(s, ord=2)
    moved = torch.linalg.matrix_exp(s) @ v64 - v64
    den = torch.linalg.matrix_norm(v64)
    ratio = torch.linalg.matrix_norm(moved) / torch.where(den > 0, den, torch.ones_like(den))
    return s_norm, ratio


def mixing_table(model: nn.Module, x: torch.Tensor) -> list[tuple[int, int, str, float]]:
    """``(osa_layer, head, metric, value)`` rows: ``s_norm`` (‖S‖₂) and ``mixing_ratio`` per OSA layer and head.

    Computed on the inputs ``x`` (held-out images or sequences, or tokens for an
    :class:`Encoder`) from each OSA layer's actual input (one forward pass with hidden states),
    summarised by the **median** over the batch. ``osa_layer`` is the index of the OSA layer in
    block order (0-based), as in the ``alpha`` rows of the training metrics. Empty for models
    without OSA layers.
    """
    encoder = model.encoder if isinstance(model, ViTClassifier) else model
    if not isinstance(encoder, Encoder) or not osa_layers(encoder):
        return []
    was_training = model.training
    model.eval()
    rows: list[tuple[int, int, str, float]] = []
    try:
        with torch.no_grad():
            _, hidden = model(x, return_hidden=True)
            index = 0
            for i, block in enumerate(cast("list[Block]", list(encoder.blocks))):
                if not isinstance(block.attn, OrthogonalSelfAttention):
                    continue
                q, k, v = block.attn._split(block.norm1(hidden.blocks[i]))
                s_norm, ratio = mixing_stats(q, k, v, block.attn.alpha.reshape(-1))
                for h in range(block.attn.heads):
                    rows.append((index, h, "s_norm", float(s_norm[:, h].median())))
                    rows.append((index, h, "mixing_ratio", float(ratio[:, h].median())))
                index += 1
    finally:
        model.train(was_training)
    return rows


@contextlib.contextmanager
def alpha_zeroed(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block every OSA layer's α is 0 (exp(S) = I: no token mixing); restored on exit.

    The "α := 0 after training" ablation: evaluating a trained skipless OSA network
    this way measures how much its accuracy depends on the mixing it learned.
    """
    layers = osa_layers(model)
    saved = [m.alpha.detach().clone() for m in layers]
    try:
        with torch.no_grad():
            for m in layers:
                m.alpha.zero_()
        yield model
    finally:
        with torch.no_grad():
            for m, a in zip(layers, saved, strict=True):
                m.alpha.copy_(a)
