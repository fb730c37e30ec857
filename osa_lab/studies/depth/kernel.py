"""The network's kernel as Deep Kernel Shaping reports it: how the cosine between two inputs maps
through depth.

DKS (Martens et al. 2021, arXiv 2110.01765, §3–4) describes a network at initialisation by its
C-map: for two inputs whose cosine is ``c``, the cosine of their representations after each layer.
A kernel that runs to 1 for every ``c`` is degenerate (the network maps every input alike, the
cross-input face of rank collapse); one that stays at ``c`` is linear on the pair. TAT
(arXiv 2203.08120) shapes the activation so that the whole network's C(0) reaches a target η <
1. :func:`osa_lab.nn.shaping.network_c_map` predicts it for a stack of shaped MLPs with
independent weights; :func:`encoder_c_map` measures the built encoder, attention included.

Measured on token sequences: ``X₁`` Gaussian ``(N, d)``, ``X₂ = c X₁ + √(1 − c²) W`` with ``W``
an independent Gaussian, so the flattened pair has cosine ``c`` in expectation. ``c_out`` is the
mean over the pairs of the cosine between the flattened hidden states (all tokens) after every
block (layer 0 is the input) and after every block's attention sub-layer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch
import torch.nn.functional as F

from osa_lab.errors import ConfigurationError
from osa_lab.nn.models import Encoder

__all__ = ["KERNEL_COLUMNS", "encoder_c_map"]

#: the columns of :func:`encoder_c_map`'s table
KERNEL_COLUMNS = ["c_in", "site", "layer", "c_out", "c_out_std"]


def _input_cosines(c_in: Sequence[float]) -> list[float]:
    try:
        values = [float(c) for c in c_in]
    except (TypeError, ValueError):
        raise ConfigurationError(f"`c_in` must be a sequence of cosines in [-1, 1], got {c_in!r}") from None
    bad = [c for c in values if not (math.isfinite(c) and -1.0 <= c <= 1.0)]
    if not values or bad:
        raise ConfigurationError(f"`c_in` must be one or more cosines in [-1, 1], got {values!r}")
    return values


def encoder_c_map(encoder: Encoder, c_in: Sequence[float] = (0.0, 0.5, 0.9), *, tokens: int | None = None,
                  pairs: int = 16, seed: int = 0) -> pd.DataFrame:  # fmt: skip
    """The C-map of ``encoder`` through depth, measured as DKS reports it (module docstring).

    Args:
        encoder: a token encoder (:func:`osa_lab.nn.models.build_model`); run in eval mode without
            gradients, in its parameters' dtype, and left as it was.
        c_in: the input cosines.
        tokens: sequence length N (default: the encoder's ``config.tokens``).
        pairs: input pairs per cosine (the same draws for every ``c_in``).
        seed: seeds the Gaussian inputs.

    Returns:
        One row per input cosine, site (``"block"``: layers 0..depth, 0 the input; ``"attention"``:
        layers 1..depth) and layer: ``c_in, site, layer, c_out`` (mean over the pairs) and
        ``c_out_std`` (their standard deviation).
    """
    if not isinstance(encoder, Encoder):
        raise ConfigurationError(f"`encoder` must be a token Encoder (build_model), got {type(encoder).__name__}; "
                                 "for a classifier pass its `.encoder`")  # fmt: skip
    values = _input_cosines(c_in)
    if not isinstance(pairs, int) or isinstance(pairs, bool) or pairs < 2:
        raise ConfigurationError(f"`pairs` must be an int ≥ 2 (a mean and a spread over pairs), got {pairs!r}")
    n = encoder.config.tokens if tokens is None else tokens
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigurationError(f"`tokens` must be an int ≥ 1, got {n!r}")
    dtype = next(encoder.parameters()).dtype
    g = torch.Generator().manual_seed(seed)
    u, w = (torch.randn(pairs, n, encoder.config.dim, generator=g, dtype=dtype) for _ in range(2))
    rows = []
    was_training = encoder.training
    encoder.eval()
    try:
        with torch.no_grad():
            _, first = encoder(u, return_hidden=True)
            for c in values:
                _, second = encoder(c * u + math.sqrt(max(0.0, 1.0 - c * c)) * w, return_hidden=True)
                for site, offset in (("block", 0), ("attention", 1)):
                    for i, (a, b) in enumerate(zip(first.site(site), second.site(site), strict=True)):
                        cos = F.cosine_similarity(a.flatten(1).double(), b.flatten(1).double(), dim=1)
                        rows.append({"c_in": c, "site": site, "layer": i + offset, "c_out": float(cos.mean()),
                                     "c_out_std": float(cos.std())})  # fmt: skip
    finally:
        encoder.train(was_training)
    return pd.DataFrame(rows, columns=KERNEL_COLUMNS)
