"""Multi-head attention layers with one interface: ``(batch, tokens, dim)`` in and out.

``OrthogonalSelfAttention`` implements OSA (Zhang & Martens, arXiv 2602.05996; docs/design.md §1)
with the initialisation derived in ``docs/initialisation.md`` (summary below);
``SoftmaxSelfAttention`` is the SSA baseline on ``F.scaled_dot_product_attention``. The variants
the model presets use live here too: ``SoftmaxAttention`` (SSA with an explicit-softmax path for
the Jacobian code), ``ValueSkipInitAttention`` (He et al. 2023) and :func:`init_cutting_skip`
(Ji et al. 2025).

Initialisation of OSA (derivation: ``docs/initialisation.md``). For one layer
``Y = Σ_h exp(S_h(X)) X W_V^h W_O^h``, the Jacobian splits as ``J = J_fixed + J_S``:

* ``J_fixed``: ``dX ↦ Σ_h A_h dX W_V^h W_O^h`` with every ``A_h`` orthogonal. At α = 0 it is
  ``dX ↦ dX W_V W_O``, whose singular values are those of ``W_V W_O``: orthogonal ``W_V`` and
  ``W_O`` give κ = 1 exactly.
* ``J_S``: the dependence of ``A_h`` on X, ``dA_h X W``, with
  ``‖dA_h‖ ≤ ‖dS_h‖ ≤ 2 α/√r ‖W_Q W_Kᵀ‖ ‖X‖₂ ‖dX‖``, so
  ``‖J_S‖ ≤ δ := 2 α/√r ‖W_Q^h W_K^hᵀ‖₂ ‖X‖₂²`` (summed over heads through ``W_O``).

Then κ(J) ≤ (1 + δ)/(1 − δ) as long as ``J_fixed`` stays close to orthogonal. With
``W_Q, W_K ~ N(0, 1/d)``, ``‖W_Q W_Kᵀ‖₂ ≈ (1 + √(r/d))² r/d·…`` is O(1) and ``‖X‖₂² ≈ (√N + √d)²``
for unit-variance tokens, so ``α₀ = c · √r / (√N + √d)²`` keeps δ ≈ c fixed across N and d.
We take c = 0.05 (κ ≤ 1.5 asserted on N, d ∈ {8, 16, 32}; see tests/nn/test_attention.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from osa_lab.errors import ConfigurationError, heads_do_not_divide, unknown_name
from osa_lab.ops.functional import OSA_METHODS, OSAMethod, osa
from osa_lab.ops.guards import check_float_tensor, refuse_masks

#: δ target in the derived initialisation α₀ = c √r / (√N + √d)².
ALPHA_INIT_C = 0.05


def derived_alpha_init(tokens: int, dim: int, head_dim: int, c: float = ALPHA_INIT_C) -> float:
    """α₀ = c √r / (√N + √d)²: keeps the α-dependent Jacobian term near c (see module docstring)."""
    return c * math.sqrt(head_dim) / (math.sqrt(tokens) + math.sqrt(dim)) ** 2


def check_alpha_init(value: object) -> float:
    """``value`` as a float after checking it is a finite real number (a bad α₀ must be refused
    at construction, not at the first forward): :class:`ConfigurationError` otherwise."""
    if isinstance(value, (bool, str, bytes)) or (isinstance(value, torch.Tensor) and value.numel() != 1):
        raise ConfigurationError(f"`alpha_init` must be a finite real number or None, got {value!r}")
    try:
        alpha = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigurationError(f"`alpha_init` must be a finite real number or None, got {value!r}") from None
    if not math.isfinite(alpha):
        raise ConfigurationError(f"`alpha_init` must be finite, got {value!r}")
    return alpha


def _check_dims(dim: int, heads: int, head_dim: int | None) -> int:
    for name, val in (("dim", dim), ("heads", heads)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ConfigurationError(f"`{name}` must be a positive int, got {val!r}")
    if dim % heads != 0:
        raise heads_do_not_divide(dim, heads)
    if head_dim is not None and (not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim < 1):
        raise ConfigurationError(f"`head_dim` must be a positive int or None, got {head_dim!r}")
    return head_dim if head_dim is not None else dim // heads


def _check_tokens(x: torch.Tensor, dim: int) -> None:
    check_float_tensor("x", x)
    if x.dim() != 3 or x.shape[-1] != dim:
        raise ConfigurationError(
            f"input `x` has shape {tuple(x.shape)}; the layer needs (batch, tokens, dim={dim})"
        )


class _MultiHead(nn.Module):
    """Shared projections: q, k of width ``head_dim`` per head, v of width ``dim // heads``."""

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int | None,
        bias: bool,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        factory = {"dtype": dtype, "device": device}
        self.dim, self.heads = dim, heads
        self.head_dim = _check_dims(dim, heads, head_dim)
        self.value_dim = dim // heads
        self.to_q = nn.Linear(dim, heads * self.head_dim, bias=bias, **factory)
        self.to_k = nn.Linear(dim, heads * self.head_dim, bias=bias, **factory)
        self.to_v = nn.Linear(dim, dim, bias=bias, **factory)
        self.to_out = nn.Linear(dim, dim, bias=bias, **factory)

    def _split(self, x: torch.Tensor):
        b, n, _ = x.shape
        q = self.to_q(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.to_k(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        v = self.to_v(x).view(b, n, self.heads, self.value_dim).transpose(1, 2)
        return q, k, v

    def _merge(self, y: torch.Tensor) -> torch.Tensor:
        b, _, n, _ = y.shape
        return self.to_out(y.transpose(1, 2).reshape(b, n, self.dim))

    def init_gaussian_qk(self) -> None:
        """W_Q, W_K ~ N(0, 1/dim) (docs/design.md §3)."""
        for lin in (self.to_q, self.to_k):
            nn.init.normal_(lin.weight, std=1.0 / math.sqrt(self.dim))
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def init_orthogonal_vo(self, gain: float = 1.0) -> None:
        """Orthogonal W_V and W_O: the fixed-A Jacobian then has κ = 1 (docs/design.md §3)."""
        for lin in (self.to_v, self.to_out):
            nn.init.orthogonal_(lin.weight, gain=gain)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)


class OrthogonalSelfAttention(_MultiHead):
    """Multi-head orthogonal self-attention: ``concat_h(exp(S_h) X W_V^h) W_O`` (docs/design.md §1).

    Args:
        dim: model width d.
        heads: number of heads; ``dim`` must be divisible by ``heads``.
        head_dim: query/key width r per head (default ``dim // heads``).
        alpha_init: initial α per head; ``None`` uses :func:`derived_alpha_init` for ``tokens``.
        learn_alpha: make α (one per head) a parameter.
        method: computation method of :func:`osa_lab.osa`.
        tokens: sequence length the derived α₀ is tuned for (κ grows slowly beyond it).
        bias: biases in the projections (off by default: the derivation assumes none).
        dtype, device: the parameters' dtype and device (created and initialised there).

    OSA is non-causal: a mask or ``is_causal=True`` passed to ``forward`` raises
    :class:`~osa_lab.CausalMaskError`; ``attn_mask=None`` and ``is_causal=False`` are accepted,
    and ``key_padding_mask`` (bool ``(batch, tokens)``, True = pad) is exact (:func:`osa_lab.osa`).
    """

    def __init__(
        self,
        dim: int,
        heads: int = 1,
        head_dim: int | None = None,
        alpha_init: float | None = None,
        learn_alpha: bool = True,
        method: OSAMethod = "auto",
        tokens: int = 64,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(dim, heads, head_dim, bias, dtype=dtype, device=device)
        if method != "auto" and method not in OSA_METHODS:
            raise unknown_name("method", method, [*OSA_METHODS, "auto"])
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise ConfigurationError(f"`tokens` must be a positive int (the sequence length), got {tokens!r}")
        if alpha_init is None:
            alpha_init = derived_alpha_init(tokens, dim, self.head_dim)
        alpha = torch.full((heads, 1), check_alpha_init(alpha_init), dtype=dtype, device=device)
        if learn_alpha:
            self.alpha = nn.Parameter(alpha)
        else:
            self.register_buffer("alpha", alpha)
        self.method = method
        self.init_gaussian_qk()
        self.init_orthogonal_vo()

    def attend(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Per-head outputs ``exp(S_h) V_h`` of shape (batch, heads, tokens, dim // heads)."""
        q, k, v = self._split(x)
        # α is stored (heads, 1); q is (batch, heads, N, r), so pass one α per head as (heads,).
        return osa(q, k, v, self.alpha.reshape(-1), method=self.method, key_padding_mask=key_padding_mask)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        key_padding_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """``(batch, tokens, dim)`` → ``(batch, tokens, dim)``."""
        refuse_masks({"attn_mask": attn_mask, "is_causal": is_causal, **kwargs})
        _check_tokens(x, self.dim)
        return self._merge(self.attend(x, key_padding_mask=key_padding_mask))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, head_dim={self.head_dim}, method={self.method!r}"


class SoftmaxSelfAttention(_MultiHead):
    """Multi-head softmax self-attention on ``F.scaled_dot_product_attention`` (the SSA baseline).

    Same interface as :class:`OrthogonalSelfAttention`; accepts ``attn_mask`` / ``is_causal``.
    Default init is PyTorch's ``nn.Linear`` init; ``init="orthogonal"`` uses Gaussian W_Q, W_K
    (variance 1/d) and orthogonal W_V, W_O, matching OSA's value path. ``dtype`` and
    ``device`` are the parameters' (created and initialised there).
    """

    def __init__(
        self,
        dim: int,
        heads: int = 1,
        head_dim: int | None = None,
        init: str = "default",
        bias: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(dim, heads, head_dim, bias, dtype=dtype, device=device)
        if init == "orthogonal":
            self.init_gaussian_qk()
            self.init_orthogonal_vo()
        elif init != "default":
            raise ConfigurationError(f"unknown init {init!r}; valid: 'default', 'orthogonal'")

    def attention_matrix(self, x: torch.Tensor) -> torch.Tensor:
        """The row-stochastic attention matrices (batch, heads, N, N), for analysis."""
        q, k, _ = self._split(x)
        return torch.softmax(q @ k.mT / math.sqrt(self.head_dim), dim=-1)

    def attend(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        """Per-head outputs (batch, heads, tokens, dim // heads)."""
        q, k, v = self._split(x)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)

    def forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        """``(batch, tokens, dim)`` → ``(batch, tokens, dim)``."""
        _check_tokens(x, self.dim)
        return self._merge(self.attend(x, attn_mask=attn_mask, is_causal=is_causal))


# --------------------------------------------------------------------------------------
# Variants used by the model presets: explicit-softmax SSA, Value-SkipInit, cutting-skip init
# --------------------------------------------------------------------------------------


class SoftmaxAttention(SoftmaxSelfAttention):
    """:class:`SoftmaxSelfAttention` with an explicit-softmax path.

    ``explicit_softmax=True`` computes ``softmax(q kᵀ/√r) v`` with plain tensor ops instead of
    ``F.scaled_dot_product_attention``; the Jacobian code switches it on because SDPA on the CPU
    has no forward-mode AD and no vmap batching rule (same function, same values).
    """

    explicit_softmax: bool = False

    def attend(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        """Per-head outputs (batch, heads, tokens, dim // heads)."""
        if not self.explicit_softmax or attn_mask is not None or is_causal:
            return super().attend(x, attn_mask=attn_mask, is_causal=is_causal)
        q, k, v = self._split(x)
        return torch.softmax(q @ k.mT / math.sqrt(self.head_dim), dim=-1) @ v


class ValueSkipInitAttention(SoftmaxAttention):
    """SSA with Value-SkipInit (He et al. 2023, arXiv 2302.10322, §3): ``A ← a I + b softmax(·)``.

    ``a`` and ``b`` are learnable, one per head, ``a = 1`` and ``b = 0`` at init, so each head
    starts as ``X W_V^h`` (identity attention).
    """

    def __init__(
        self,
        dim: int,
        heads: int = 1,
        head_dim: int | None = None,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(dim, heads, head_dim, init="orthogonal", bias=bias, dtype=dtype, device=device)
        self.skip_a = nn.Parameter(torch.ones(heads, 1, 1, dtype=dtype, device=device))
        self.skip_b = nn.Parameter(torch.zeros(heads, 1, 1, dtype=dtype, device=device))

    def attend(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        """``a v + b softmax(q kᵀ/√r) v`` per head."""
        _, _, v = self._split(x)
        soft = super().attend(x, attn_mask=attn_mask, is_causal=is_causal)
        return self.skip_a * v + self.skip_b * soft


def init_cutting_skip(attn: SoftmaxSelfAttention, a: float, b: float, c: float) -> None:
    """Ji et al. 2025 init: ``W_Q^h W_K^hᵀ ≈ a Z + b I`` (rank-r truncated SVD), ``W_V W_O = c·orthogonal``."""
    d, r, heads = attn.dim, attn.head_dim, attn.heads
    wq = torch.empty(heads * r, d, dtype=torch.float64)
    wk = torch.empty_like(wq)
    for h in range(heads):
        z = torch.randn(d, d, dtype=torch.float64) / math.sqrt(d)
        u, s, vh = torch.linalg.svd(a * z + b * torch.eye(d, dtype=torch.float64))
        root = s[:r].sqrt()
        wq[h * r : (h + 1) * r] = root[:, None] * u[:, :r].mT
        wk[h * r : (h + 1) * r] = root[:, None] * vh[:r]
    with torch.no_grad():
        attn.to_q.weight.copy_(wq)
        attn.to_k.weight.copy_(wk)
        nn.init.orthogonal_(attn.to_v.weight)
        nn.init.orthogonal_(attn.to_out.weight, gain=c)
        for lin in (attn.to_q, attn.to_k, attn.to_v, attn.to_out):
            if lin.bias is not None:
                lin.bias.zero_()
