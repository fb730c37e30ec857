"""The transformer block and its parts: the MLP, the attention sub-layer by configuration, hidden states.

A block is ``h = attn(norm₁(x)) [+ x]``, ``y = mlp(norm₂(h)) [+ h]`` (pre-norm, as in ViT; the
bracketed skips only when ``skip=True``). :class:`HiddenStates` holds every hidden state of one
forward pass; :func:`check_hidden_state_finite` names the first layer where one is NaN/Inf.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from osa_lab.errors import NonFiniteHiddenStateError, unknown_name
from osa_lab.nn.attention import (
    OrthogonalSelfAttention,
    SoftmaxAttention,
    ValueSkipInitAttention,
    init_cutting_skip,
)
from osa_lab.nn.models.config import ACTIVATIONS, CUTTING_SKIP_ABC, ModelConfig
from osa_lab.nn.shaping import TATLeakyReLU, shaped_slope, tied_mlp_gain
from osa_lab.ops.guards import all_finite, sum_is_finite, whole_batch


@dataclass
class HiddenStates:
    """Every hidden state of one forward pass.

    ``blocks[0]`` is the encoder input (layer 0), ``blocks[l]`` the output of block ``l``
    (``len(blocks) == depth + 1``); ``attention[l - 1]`` is the output of block ``l``'s
    attention sub-layer, after its skip if any (``len(attention) == depth``).
    """

    blocks: list[torch.Tensor] = field(default_factory=list)
    attention: list[torch.Tensor] = field(default_factory=list)

    @property
    def depth(self) -> int:
        """Number of blocks recorded."""
        return len(self.attention)

    def site(self, name: str) -> list[torch.Tensor]:
        """The list for ``"block"`` or ``"attention"``."""
        if name == "block":
            return self.blocks
        if name == "attention":
            return self.attention
        raise unknown_name("site", name, ["block", "attention"])

    def stacked(self, name: str = "block") -> torch.Tensor:
        """``(layers, batch, N, dim)`` tensor of one site (block site includes layer 0)."""
        return torch.stack(self.site(name))


def activation_second_moment(act: nn.Module, points: int = 80) -> float:
    """``E[φ(z)²]`` for ``z ~ N(0, 1)`` by Gauss–Hermite quadrature (GELU: 0.4252, ReLU: 0.5)."""
    return _second_moment(type(act), points)  # type: ignore[arg-type]  # classes hash by identity


@functools.cache
def _second_moment(act_type: type[nn.Module], points: int) -> float:
    act = act_type()
    nodes, weights = np.polynomial.hermite_e.hermegauss(points)
    z = torch.as_tensor(nodes, dtype=torch.float64)
    with torch.no_grad():
        values = act(z).double() ** 2
    return float((torch.as_tensor(weights, dtype=torch.float64) * values).sum() / math.sqrt(2 * math.pi))


class MLP(nn.Module):
    """Two-layer MLP ``fc2(act(fc1(x)))`` of hidden width ``round(dim · mlp_ratio)``."""

    def __init__(
        self, dim: int, hidden: int, activation: str = "gelu", dtype: torch.dtype | None = None, *, depth: int = 1
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, dtype=dtype)
        # TAT's leaky ReLU takes its slope from the network's number of MLPs (arXiv 2203.08120, eq. 11)
        self.act = TATLeakyReLU(shaped_slope(depth)) if activation == "tat-leaky-relu" else ACTIVATIONS[activation]()
        self.fc2 = nn.Linear(hidden, dim, dtype=dtype)

    def init_orthogonal(self) -> None:
        """Variance-preserving orthogonal init (zero biases).

        ``fc1`` is (semi-)orthogonal with gain ``√(hidden/dim)``, so the pre-activations of a token
        with i.i.d. N(0, 1) entries are again ≈ N(0, 1); ``fc2`` is (semi-)orthogonal with gain
        ``1/√E[φ(z)²]``, so the output has unit mean-square entries again. A skipless stack then
        neither shrinks nor grows the signal at init.
        """
        hidden, dim = self.fc1.weight.shape
        nn.init.orthogonal_(self.fc1.weight, gain=math.sqrt(hidden / dim))
        nn.init.orthogonal_(self.fc2.weight, gain=1.0 / math.sqrt(activation_second_moment(self.act)))
        nn.init.zeros_(self.fc1.bias)
        nn.init.zeros_(self.fc2.bias)

    def init_tied_orthogonal(self) -> None:
        """A tied orthogonal init for TAT's leaky ReLU (orthogonal "delta" weights as in TAT,
        arXiv 2203.08120, §4, and DKS, arXiv 2110.01765; the tie is this project's): ``fc1 = √(hidden/dim) Q``
        and ``fc2 = g √(dim/hidden) Qᵀ`` for one (semi-)orthogonal ``Q`` (hidden × dim), zero biases.
        Then ``fc2 fc1 = g I``: with a near-linear φ the block is near a multiple of the identity.
        ``g`` (:func:`~osa_lab.nn.shaping.tied_mlp_gain`) makes the block keep the mean square of
        its input, as :meth:`init_orthogonal` does, so a deep stack neither shrinks nor grows the
        signal (without it, ≈ ×0.67 per block at slope 0). The C-map is not TAT's: the tie moves
        it towards the identity (docs/shaping.md). Independent draws of the two matrices
        (:meth:`init_orthogonal`) leave the product far from orthogonal."""
        hidden, dim = self.fc1.weight.shape
        q = torch.empty(hidden, dim, dtype=torch.float64)
        nn.init.orthogonal_(q)  # draws from torch's generator, like the other inits
        gain = tied_mlp_gain(q, self.act.negative_slope) if isinstance(self.act, TATLeakyReLU) else 1.0
        with torch.no_grad():
            self.fc1.weight.copy_(math.sqrt(hidden / dim) * q)
            self.fc2.weight.copy_(gain * math.sqrt(dim / hidden) * q.mT)
        nn.init.zeros_(self.fc1.bias)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self.fc2(self.act(self.fc1(x)))


def _make_attention(config: ModelConfig, dtype: torch.dtype | None = None) -> nn.Module:
    if config.attention == "osa":
        return OrthogonalSelfAttention(
            config.dim,
            config.heads,
            head_dim=config.head_dim,
            alpha_init=config.alpha_init,
            learn_alpha=config.learn_alpha,
            method=config.osa_method,
            tokens=config.tokens,
            dtype=dtype,
        )
    if config.init == "value-skipinit":
        return ValueSkipInitAttention(config.dim, config.heads, head_dim=config.head_dim, dtype=dtype)
    attn = SoftmaxAttention(
        config.dim,
        config.heads,
        head_dim=config.head_dim,
        init="orthogonal" if config.init == "orthogonal" else "default",
        dtype=dtype,
    )
    if config.init == "cutting-skip":
        init_cutting_skip(attn, *CUTTING_SKIP_ABC)
    return attn


class Block(nn.Module):
    """One transformer block: ``h = attn(norm₁ x) [+ x]``, ``y = mlp(norm₂ h) [+ h]`` (pre-norm).

    ``dtype``: the parameters' dtype, passed to every sub-module (default: torch's default).
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.skip = config.skip
        self.norm1 = nn.LayerNorm(config.dim, dtype=dtype) if config.norm == "layernorm" else nn.Identity()
        # attention="none" removes the attention sub-layer: h = x (the "attention removed" control)
        self.attn = _make_attention(config, dtype) if config.attention != "none" else None
        self.mlp: MLP | None = None
        self.norm2: nn.Module | None = None
        if config.mlp_ratio > 0:
            self.norm2 = (
                nn.LayerNorm(config.dim, dtype=dtype) if config.norm == "layernorm" else nn.Identity()
            )
            self.mlp = MLP(
                config.dim, round(config.dim * config.mlp_ratio), config.activation, dtype=dtype, depth=config.depth
            )
            if config.init in ("orthogonal", "value-skipinit"):
                if config.activation == "tat-leaky-relu":
                    self.mlp.init_tied_orthogonal()
                else:
                    self.mlp.init_orthogonal()

    def attention_part(self, x: torch.Tensor) -> torch.Tensor:
        """Output of the attention sub-layer (with its skip); ``x`` itself when attention is removed."""
        if self.attn is None:
            return x
        h = self.attn(self.norm1(x))
        return x + h if self.skip else h

    def mlp_part(self, h: torch.Tensor) -> torch.Tensor:
        """Output of the MLP sub-layer (with its skip); identity when there is no MLP."""
        mlp, norm2 = self.mlp, self.norm2
        if mlp is None or norm2 is None:  # built together
            return h
        y = mlp(norm2(h))
        return h + y if self.skip else y

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self.mlp_part(self.attention_part(x))


def check_hidden_state_finite(x: torch.Tensor, layer: int, site: str) -> None:
    """Raise :class:`~osa_lab.errors.NonFiniteHiddenStateError` naming ``layer`` and ``site`` if ``x`` has NaN/Inf."""
    # one reduction (any NaN/Inf entry makes the sum non-finite); the elementwise scan only then,
    # since a sum of finite entries can overflow
    # (under torch.func.vmap both decide on the whole vmapped batch: the check is batched, not skipped)
    if not sum_is_finite(x) and not all_finite(x):
        values = whole_batch(x)
        n_nan, n_inf = int(torch.isnan(values).sum()), int(torch.isinf(values).sum())
        where = "the input (layer 0)" if layer == 0 else f"layer {layer} ({site} output)"
        raise NonFiniteHiddenStateError(
            f"hidden state of {where} contains {n_nan} NaN and {n_inf} Inf entries (shape {tuple(x.shape)}); "
            f"this is the first layer where they appear. Lower the depth or the init scale (alpha), or use "
            "float64.",
            layer,
            site,
        )
