"""The wrapper: OSA as a timm attention layer, and timm's ViT block with switchable skips and norms.

:class:`OSAAttention` is a drop-in for ``timm.layers.Attention`` (same constructor arguments and
parameter names, plus one α per head); :class:`SkiplessBlock` is timm's ViT ``Block`` with the
skips and the norms each switched on or off and the presets' initialisation
(:func:`init_qkv_orthogonal`, :func:`init_mlp_orthogonal`); :func:`osa_attention` and
:func:`block_fn` make the classes timm's ``VisionTransformer`` takes as ``attn_layer`` and
``block_fn``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from osa_lab.errors import ConfigurationError, OSAInputError, heads_do_not_divide, unknown_name
from osa_lab.integrations.timm.loading import import_timm, timm_attention_class, vit_module
from osa_lab.nn.attention import derived_alpha_init
from osa_lab.ops.functional import OSA_METHODS, osa
from osa_lab.ops.guards import refuse_masks

#: Token count the derived α₀ is tuned for when a layer is built without one: ViT-*/16 at 224 px
#: (14 × 14 patches + the class token). :func:`create_osa_vit` and :func:`convert_to_osa` set the
#: model's real count.
DEFAULT_TOKENS = 197
ATTENTIONS = ("osa", "softmax")
BLOCK_INITS = ("auto", "orthogonal", "timm")


def check_positive_int(name: str, value: object) -> int:
    """``value`` when it is a positive int; else :class:`~osa_lab.errors.ConfigurationError` naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"`{name}` must be a positive int, got {value!r}")
    return value


@torch.no_grad()
def init_qkv_orthogonal(attn: nn.Module) -> None:
    """The presets' attention init on a fused ``qkv``/``proj`` layer (timm's or :class:`OSAAttention`).

    W_Q, W_K ~ N(0, 1/d) and orthogonal W_V and W_O (``proj``), zero biases: with α = 0 (or
    uniform softmax) the value path ``X W_V W_O`` then has κ = 1 (``docs/initialisation.md``).
    """
    qkv, proj = attn.qkv, attn.proj
    d = qkv.in_features
    a = qkv.out_features // 3
    weight = qkv.weight
    weight[: 2 * a].normal_(0.0, 1.0 / math.sqrt(d))
    wv = torch.empty(a, d, dtype=weight.dtype, device=weight.device)
    nn.init.orthogonal_(wv)
    weight[2 * a :].copy_(wv)
    nn.init.orthogonal_(proj.weight)
    for lin in (qkv, proj):
        if lin.bias is not None:
            lin.bias.zero_()


@torch.no_grad()
def init_mlp_orthogonal(mlp: nn.Module) -> None:
    """The presets' variance-preserving orthogonal MLP init on timm's ``Mlp`` (``fc1``, ``act``, ``fc2``).

    As :meth:`osa_lab.nn.models.MLP.init_orthogonal`: ``fc1`` orthogonal with gain ``√(hidden/d)``,
    ``fc2`` orthogonal with gain ``1/√E[φ(z)²]``, zero biases, so a skipless stack neither grows
    nor shrinks unit-variance tokens at initialisation.
    """
    from osa_lab.nn.models import activation_second_moment

    fc1, fc2 = getattr(mlp, "fc1", None), getattr(mlp, "fc2", None)
    if not isinstance(fc1, nn.Linear) or not isinstance(fc2, nn.Linear):
        raise ConfigurationError(
            f"the orthogonal MLP init needs an MLP with Linear `fc1` and `fc2` (timm's Mlp); got "
            f"{type(mlp).__name__}. Use init='timm' for this block."
        )
    hidden, dim = fc1.weight.shape
    act = getattr(mlp, "act", nn.GELU())
    gain2 = 1.0 / math.sqrt(activation_second_moment(act)) if not isinstance(act, nn.Identity) else 1.0
    nn.init.orthogonal_(fc1.weight, gain=math.sqrt(hidden / dim))
    nn.init.orthogonal_(fc2.weight, gain=gain2)
    for lin in (fc1, fc2):
        if lin.bias is not None:
            lin.bias.zero_()


# --------------------------------------------------------------------------------------
# The attention layer
# --------------------------------------------------------------------------------------


class OSAAttention(nn.Module):
    """Orthogonal self-attention with the interface and parameter names of ``timm.layers.Attention``.

    ``forward(x)`` maps ``(B, N, dim) → (B, N, dim_out)``: per head ``h``,
    ``exp(S_h) V_h`` with ``S_h = α_h/√r (Q_h K_hᵀ − K_h Q_hᵀ)`` (Zhang & Martens 2026, eq. for
    OSA; ``docs/``), then timm's optional ``norm`` (``scale_norm``) and ``gate``, and ``proj``.

    Args (timm's, same meaning): dim, num_heads, attn_head_dim, dim_out, qkv_bias, qk_norm,
        scale_norm, proj_bias, gated, attn_drop (must be 0: OSA never forms the N × N matrix, and
        dropping its entries would break orthogonality; use ``proj_drop``), proj_drop,
        norm_layer, device, dtype.
    Keyword-only (OSA's):
        alpha_init: initial α of every head; ``None`` uses
            :func:`~osa_lab.nn.attention.derived_alpha_init` for ``tokens``.
        tokens: sequence length N the derived α₀ is tuned for (default :data:`DEFAULT_TOKENS`).
        learn_alpha: α is a parameter (else a buffer).
        method: computation method of :func:`osa_lab.osa` (``"auto"``: Triton on CUDA).

    Initialisation (:meth:`init_weights`, which timm's ``VisionTransformer.init_weights`` calls
    after its own Linear init): Gaussian W_Q, W_K of variance 1/dim, orthogonal W_V, W_O, zero
    biases, α = α₀ (``docs/initialisation.md``).

    timm's ``Block`` needs ``attn_layer`` to be a class: :func:`osa_attention` makes a subclass
    with other defaults for ``method`` and ``alpha_init``.
    """

    #: ``method`` when none is given (subclasses from :func:`osa_attention` change it).
    default_method: str = "auto"
    #: ``alpha_init`` when none is given (``None``: the derived α₀).
    default_alpha_init: float | None = None

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        attn_head_dim: int | None = None,
        dim_out: int | None = None,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        gated: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: Callable[..., nn.Module] | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        alpha_init: float | None = None,
        tokens: int | None = None,
        learn_alpha: bool = True,
        method: str | None = None,
        _reuse: nn.Module | None = None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        method = self.default_method if method is None else method
        alpha_init = self.default_alpha_init if alpha_init is None else alpha_init
        check_positive_int("dim", dim)
        check_positive_int("num_heads", num_heads)
        if attn_head_dim is None:
            if dim % num_heads:
                raise heads_do_not_divide(
                    dim, num_heads, heads_name="num_heads", otherwise="give attn_head_dim"
                )
            attn_head_dim = dim // num_heads
        check_positive_int("attn_head_dim", attn_head_dim)
        if (qk_norm or scale_norm) and norm_layer is None and _reuse is None:
            raise ConfigurationError(
                "qk_norm / scale_norm need a `norm_layer` (e.g. nn.LayerNorm), as in timm"
            )
        if attn_drop:
            raise ConfigurationError(
                f"`attn_drop`={attn_drop}: OSA never forms the N × N attention matrix, and dropping its entries "
                "would break its orthogonality; use attn_drop=0 (and proj_drop for dropout)"
            )
        if method != "auto" and method not in OSA_METHODS:
            raise unknown_name("method", method, [*OSA_METHODS, "auto"])
        self.num_heads = num_heads
        self.head_dim = attn_head_dim
        self.attn_dim = num_heads * attn_head_dim
        self.scale = attn_head_dim**-0.5
        self.method = method
        self.tokens = DEFAULT_TOKENS if tokens is None else check_positive_int("tokens", tokens)
        self._alpha_init = None if alpha_init is None else float(alpha_init)
        if self._alpha_init is not None and not math.isfinite(self._alpha_init):
            raise ConfigurationError(f"`alpha_init` must be finite, got {alpha_init!r}")
        if _reuse is not None:
            # Share timm's modules (convert_to_osa): the same Parameter objects, nothing copied.
            self.qkv = _reuse.qkv
            self.q_norm = _reuse.q_norm
            self.k_norm = _reuse.k_norm
            self.attn_drop = _reuse.attn_drop
            self.norm = getattr(_reuse, "norm", nn.Identity())
            self.gate = getattr(_reuse, "gate", None)
            self.proj = _reuse.proj
            self.proj_drop = _reuse.proj_drop
            ref = self.qkv.weight
            dd = {"device": ref.device, "dtype": ref.dtype}
        else:
            self.qkv = nn.Linear(dim, self.attn_dim * 3, bias=qkv_bias, **dd)
            self.q_norm = norm_layer(attn_head_dim, **dd) if qk_norm else nn.Identity()
            self.k_norm = norm_layer(attn_head_dim, **dd) if qk_norm else nn.Identity()
            self.attn_drop = nn.Dropout(0.0)
            self.norm = norm_layer(self.attn_dim, **dd) if scale_norm else nn.Identity()
            self.gate = nn.Linear(dim, self.attn_dim, bias=qkv_bias, **dd) if gated else None
            self.proj = nn.Linear(self.attn_dim, dim_out or dim, bias=proj_bias, **dd)
            self.proj_drop = nn.Dropout(proj_drop)
        self.dim = self.qkv.in_features
        alpha = torch.full((num_heads,), self.alpha0, **dd)
        if learn_alpha:
            self.alpha = nn.Parameter(alpha)
        else:
            self.register_buffer("alpha", alpha)
        if _reuse is None:
            self.init_weights()

    @classmethod
    def from_timm(cls, attn: nn.Module, **osa_kwargs: Any) -> OSAAttention:
        """An OSA layer that *shares* ``attn``'s modules (``qkv``, ``proj``, norms, gate): no copy.

        ``attn`` is a ``timm.layers.Attention``; ``osa_kwargs`` are the keyword-only OSA arguments.
        """
        drop = getattr(attn.attn_drop, "p", 0.0)
        return cls(
            attn.qkv.in_features,
            attn.num_heads,
            attn_head_dim=attn.head_dim,
            attn_drop=drop,
            _reuse=attn,
            **osa_kwargs,
        )

    @property
    def alpha0(self) -> float:
        """The initial α: ``alpha_init`` if given, else the derived α₀ for ``tokens``."""
        if self._alpha_init is not None:
            return self._alpha_init
        return derived_alpha_init(self.tokens, self.dim, self.head_dim)

    @torch.no_grad()
    def reset_alpha(self, tokens: int | None = None, alpha_init: float | None = None) -> None:
        """Set every head's α to α₀, re-derived for ``tokens`` (and ``alpha_init``) when given."""
        if tokens is not None:
            self.tokens = check_positive_int("tokens", tokens)
        if alpha_init is not None:
            if not math.isfinite(float(alpha_init)):
                raise ConfigurationError(f"`alpha_init` must be finite, got {alpha_init!r}")
            self._alpha_init = float(alpha_init)
        self.alpha.fill_(self.alpha0)

    def init_weights(self) -> None:
        """Gaussian W_Q, W_K (variance 1/dim), orthogonal W_V, W_O, zero biases, α = α₀."""
        init_qkv_orthogonal(self)
        self.reset_alpha()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, *args):  # noqa: D102
        # A timm Attention state dict has no α: keep this layer's α (the derived init) instead of
        # reporting it missing, so timm checkpoints load strictly.
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, *args)
        if prefix + "alpha" not in state_dict and prefix + "alpha" in missing_keys:
            missing_keys.remove(prefix + "alpha")

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        key_padding_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """``(B, N, dim) → (B, N, dim_out)``; a mask or ``is_causal=True`` raises CausalMaskError,
        ``key_padding_mask`` (bool (B, N), True = pad) is exact (:func:`osa_lab.osa`)."""
        refuse_masks({"attn_mask": attn_mask, "is_causal": is_causal, **kwargs})
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise OSAInputError(f"`x` has shape {shape}; OSAAttention needs (batch, tokens, dim={self.dim})")
        B, N, _ = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        y = osa(q, k, v, self.alpha, method=self.method, key_padding_mask=key_padding_mask)  # α/√r in float64
        y = y.transpose(1, 2).reshape(B, N, self.attn_dim)
        y = self.norm(y)
        if gate is not None:
            y = y * gate
        return self.proj_drop(self.proj(y))

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, tokens={self.tokens}, "
            f"method={self.method!r}"
        )


@functools.cache
def osa_attention(method: str = "auto", alpha_init: float | None = None) -> type[OSAAttention]:
    """An ``attn_layer`` class for timm: :class:`OSAAttention` with these ``method`` / ``alpha_init`` defaults.

    ``VisionTransformer(attn_layer=osa_attention("qr"))``; timm needs a class there, not a partial.
    """
    if method != "auto" and method not in OSA_METHODS:
        raise unknown_name("method", method, [*OSA_METHODS, "auto"])
    if alpha_init is not None and not math.isfinite(float(alpha_init)):
        raise ConfigurationError(f"`alpha_init` must be finite, got {alpha_init!r}")
    if method == "auto" and alpha_init is None:
        return OSAAttention
    attrs = {
        "default_method": method,
        "default_alpha_init": None if alpha_init is None else float(alpha_init),
        "__module__": __name__,
        "__doc__": f"OSAAttention with method={method!r}, alpha_init={alpha_init!r} by default.",
    }
    return type("OSAAttention", (OSAAttention,), attrs)


# --------------------------------------------------------------------------------------
# Blocks
# --------------------------------------------------------------------------------------


class SkiplessBlock(nn.Module):
    """timm's ViT ``Block`` with the skips and the (pre-)norms each switchable.

    ``h = ls1(attn(norm1 x)) [+ x]``, ``y = ls2(mlp(norm2 h)) [+ h]``: the bracketed skips only
    with ``skip=True``; ``norm=False`` makes ``norm1`` and ``norm2`` identities. ``skip=True,
    norm=True`` is timm's ``Block``; ``skip=False, norm=False`` with :class:`OSAAttention` is
    the paper's block. Submodule names are timm's (``norm1, attn, ls1, drop_path1, norm2, mlp,
    ls2, drop_path2``), so the shared parameters load from and into a timm ``Block``.

    The constructor takes timm ``Block``'s arguments (what ``VisionTransformer`` passes to its
    ``block_fn``) plus keyword-only ``skip``, ``norm`` and ``init``:

    * ``init="orthogonal"`` (the default when ``skip=False``): the presets' skipless init
      (:func:`init_qkv_orthogonal` for a softmax ``attn``; :class:`OSAAttention` keeps its own,
      which is the same plus α₀; :func:`init_mlp_orthogonal`).
    * ``init="timm"`` (the default with skips): timm's own init.

    Without skips, stochastic depth (``drop_path``) would drop the whole signal of a sample and
    LayerScale (``init_values``) would shrink it at every block; both are refused.
    :func:`block_fn` makes subclasses with other defaults for ``skip``, ``norm`` and ``init``.
    """

    default_skip: bool = False
    default_norm: bool = False
    default_init: str = "auto"

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_attn_norm: bool = False,
        scale_mlp_norm: bool = False,
        proj_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        init_values: float | None = None,
        drop_path: float = 0.0,
        act_layer: Callable[..., nn.Module] = nn.GELU,
        norm_layer: Callable[..., nn.Module] | None = None,
        mlp_layer: Callable[..., nn.Module] | None = None,
        attn_layer: Any = None,
        depth: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        skip: bool | None = None,
        norm: bool | None = None,
        init: str | None = None,
    ) -> None:
        super().__init__()
        import_timm()
        skip = self.default_skip if skip is None else skip
        norm = self.default_norm if norm is None else norm
        init = self.default_init if init is None else init
        from timm.layers import DropPath, LayerNorm, LayerScale, Mlp

        vit = vit_module()
        dd = {"device": device, "dtype": dtype}
        for name, flag in (("skip", skip), ("norm", norm)):
            if not isinstance(flag, bool):
                raise ConfigurationError(f"`{name}` must be True or False, got {flag!r}")
        if init not in BLOCK_INITS:
            raise unknown_name("init", init, list(BLOCK_INITS))
        if not skip and drop_path:
            raise ConfigurationError(
                f"`drop_path`={drop_path} (stochastic depth) drops a residual branch; without skips it would "
                "drop the whole signal. Use drop_path_rate=0 for skipless blocks"
            )
        if not skip and init_values:
            raise ConfigurationError(
                f"`init_values`={init_values} (LayerScale) scales a residual branch; without skips it would "
                "shrink the signal at every block. Leave init_values=None for skipless blocks"
            )
        self.skip, self.use_norm = skip, norm
        self.init_mode = ("orthogonal" if not skip else "timm") if init == "auto" else init
        norm_layer = norm_layer or LayerNorm
        mlp_layer = mlp_layer or Mlp
        attn_layer = timm_attention_class() if attn_layer is None else attn_layer
        self.norm1 = norm_layer(dim, **dd) if norm else nn.Identity()
        create = getattr(vit, "_create_attn", None)
        attn_kwargs = {
            "num_heads": num_heads,
            "qkv_bias": qkv_bias,
            "qk_norm": qk_norm,
            "proj_bias": proj_bias,
            "attn_drop": attn_drop,
            "proj_drop": proj_drop,
            "norm_layer": norm_layer,
        }
        if scale_attn_norm:
            attn_kwargs["scale_norm"] = True
        if create is not None:
            self.attn = create(attn_layer, dim, depth=depth, **attn_kwargs, **dd)
        else:  # older timm: the attention class directly
            self.attn = attn_layer(dim, **attn_kwargs, **dd)
        self.ls1 = LayerScale(dim, init_values=init_values, **dd) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim, **dd) if norm else nn.Identity()
        mlp_kwargs: dict[str, Any] = {"bias": proj_bias, "drop": proj_drop}
        if scale_mlp_norm:
            mlp_kwargs["norm_layer"] = norm_layer
        self.mlp = mlp_layer(
            in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer, **mlp_kwargs, **dd
        )
        self.ls2 = LayerScale(dim, init_values=init_values, **dd) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.init_weights()

    def init_weights(self) -> None:
        """The block's init (see the class docstring); timm calls it after its Linear init."""
        if self.init_mode != "orthogonal":
            return
        # An OSAAttention initialises itself (and timm calls its init_weights too).
        if (
            not isinstance(self.attn, OSAAttention)
            and hasattr(self.attn, "qkv")
            and hasattr(self.attn, "proj")
        ):
            init_qkv_orthogonal(self.attn)
        init_mlp_orthogonal(self.mlp)

    def attention_part(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        """Output of the attention sub-layer, with its skip if any."""
        kw = {} if attn_mask is None and not is_causal else {"attn_mask": attn_mask, "is_causal": is_causal}
        h = self.drop_path1(self.ls1(self.attn(self.norm1(x), **kw)))
        return x + h if self.skip else h

    def mlp_part(self, h: torch.Tensor) -> torch.Tensor:
        """Output of the MLP sub-layer, with its skip if any."""
        y = self.drop_path2(self.ls2(self.mlp(self.norm2(h))))
        return h + y if self.skip else y

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        """``(B, N, dim) → (B, N, dim)``."""
        return self.mlp_part(self.attention_part(x, attn_mask=attn_mask, is_causal=is_causal))

    def extra_repr(self) -> str:
        return f"skip={self.skip}, norm={self.use_norm}, init={self.init_mode!r}"


@functools.cache
def block_fn(skip: bool = False, norm: bool = False, init: str = "auto") -> type[SkiplessBlock]:
    """A ``block_fn`` class for ``timm.models.VisionTransformer``: :class:`SkiplessBlock` with these switches.

    ``VisionTransformer(block_fn=block_fn(), attn_layer=OSAAttention)`` (no skips, no norms, OSA)
    is the paper's model.
    """
    for name, flag in (("skip", skip), ("norm", norm)):
        if not isinstance(flag, bool):
            raise ConfigurationError(f"`{name}` must be True or False, got {flag!r}")
    if init not in BLOCK_INITS:
        raise unknown_name("init", init, list(BLOCK_INITS))
    name = f"SkiplessBlock_{'skip' if skip else 'noskip'}_{'norm' if norm else 'nonorm'}"
    attrs = {
        "default_skip": skip,
        "default_norm": norm,
        "default_init": init,
        "__module__": __name__,
        "__doc__": f"SkiplessBlock with skip={skip}, norm={norm}, init={init!r} by default.",
    }
    return type(name, (SkiplessBlock,), attrs)
