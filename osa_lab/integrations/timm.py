"""Orthogonal self-attention in timm's Vision Transformers (``pip install 'osa_lab[lab,timm]'``).

Zhang & Martens (arXiv 2602.05996) replace softmax attention ``softmax(q kᵀ/√r) v`` by
``exp(S) v`` with ``S = α/√r (q kᵀ − k qᵀ)`` skew-symmetric, so every head's token mixing is
orthogonal, and train Vision Transformers without skip connections and without normalisation.
This module puts that model into timm (``timm.models.vision_transformer``), the ViT code most
PyTorch vision researchers use:

:class:`OSAAttention`
    a drop-in for ``timm.layers.Attention``: the same constructor arguments and the same
    parameter names (``qkv``, ``proj``, ``q_norm``, ``k_norm``, ``norm``, ``gate``), so a timm
    state dict loads into it strictly and back (:func:`to_timm_state_dict` drops the one extra
    parameter, ``alpha``, one α per head). α starts at the derived value
    :func:`osa_lab.nn.attention.derived_alpha_init` for the model's token count (``docs/initialisation.md``);
    the layer computes :func:`osa_lab.osa` with ``method="auto"`` (Triton on CUDA) and refuses
    masks with :class:`~osa_lab.errors.CausalMaskError` (OSA is non-causal).
:class:`SkiplessBlock` and :func:`block_fn`
    a ``block_fn`` for ``VisionTransformer`` with the skips and the norms each switched on or off
    (``block_fn(skip=False, norm=False)`` is the paper's block), with the initialisation of
    osa_lab's presets ``skipless-osa`` / ``skipless-ssa`` (``osa_lab.nn.presets``): Gaussian
    W_Q, W_K of variance 1/d, orthogonal W_V, W_O, and a variance-preserving orthogonal MLP.
:func:`create_osa_vit` and :func:`convert_to_osa`
    build any timm ViT variant with OSA (skipless and normless by default), or swap the attention
    of an existing timm model in place keeping its weights, with a :class:`ConversionReport`.
:func:`timm_hidden_states`, :func:`timm_depth_profile`, :func:`timm_jacobian_profile`
    osa_lab's rank-collapse metrics and Jacobian κ across depth for a timm ViT (hidden states
    taken block by block); :func:`osa_lab.studies.depth.depth_profile` accepts a timm ViT directly.

timm without torchvision
    timm imports torchvision at import time (``timm.layers.create_norm`` imports
    ``torchvision.ops.misc``, ``timm.data`` imports ``torchvision.transforms``), although its
    models never call it. Where torchvision is missing or does not import (a CUDA build of it
    beside a CPU build of torch), :func:`import_timm` imports timm behind a placeholder
    ``torchvision`` that exists only during that import: timm's models work, and any timm
    function that really needs torchvision (its image transforms and data sets) raises
    :class:`~osa_lab.errors.OptionalDependencyError` when called. ``scripts/setup.sh`` installs
    timm this way (``pip install --no-deps``) so that it cannot pull another torch build.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import math
import sys
import threading
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from osa_lab.errors import (
    ConfigurationError,
    OptionalDependencyError,
    OSAInputError,
    heads_do_not_divide,
    unknown_name,
)
from osa_lab.nn.attention import derived_alpha_init
from osa_lab.ops.functional import OSA_METHODS, osa
from osa_lab.ops.guards import refuse_masks
from osa_lab.studies.families import ModelFamily, register_model_family

#: The timm releases this integration supports (the ``timm`` extra of pyproject.toml).
TIMM_SPEC = "timm>=1.0.20,<1.1"
#: Token count the derived α₀ is tuned for when a layer is built without one: ViT-*/16 at 224 px
#: (14 × 14 patches + the class token). :func:`create_osa_vit` and :func:`convert_to_osa` set the
#: model's real count.
DEFAULT_TOKENS = 197
ATTENTIONS = ("osa", "softmax")
BLOCK_INITS = ("auto", "orthogonal", "timm")

_placeholder_used = False


# --------------------------------------------------------------------------------------
# Importing timm (with a placeholder torchvision where the real one cannot be imported)
# --------------------------------------------------------------------------------------


def _missing_torchvision(what: str) -> OptionalDependencyError:
    return OptionalDependencyError(
        f"{what} needs torchvision, which is not installed here (or does not import beside this torch "
        "build); osa_lab imported timm behind a placeholder torchvision so that timm's models work. Install "
        "a torchvision that matches your torch to use timm's image transforms and data sets."
    )


class _PlaceholderMeta(type):
    """Any attribute of a placeholder is another placeholder; calling one raises."""

    def __getattr__(cls, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args: object, **kwargs: object) -> Any:
        raise _missing_torchvision(f"`{cls.__qualname__}`")


def _placeholder(qualname: str) -> type:
    return _PlaceholderMeta(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname})


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{self.__name__}.{name}")


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object = None, target: object = None):  # noqa: D102
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:  # noqa: D102
        module = _PlaceholderModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:  # noqa: D102
        return None


def _purge(prefix: str) -> None:
    for name in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        del sys.modules[name]


def _torchvision_imports() -> bool:
    if "torchvision" in sys.modules and not isinstance(sys.modules["torchvision"], _PlaceholderModule):
        return True
    try:
        importlib.import_module("torchvision")
        return True
    except Exception:  # ImportError, or RuntimeError from a torchvision built for another torch
        _purge("torchvision")
        return False


def import_timm() -> types.ModuleType:
    """Import and return ``timm`` (see the module docstring for the torchvision placeholder).

    Raises:
        OptionalDependencyError: timm is not installed (names the extra that installs it).
    """
    global _placeholder_used
    if "timm.models.vision_transformer" in sys.modules:
        return sys.modules["timm"]
    if importlib.util.find_spec("timm") is None:
        raise OptionalDependencyError(
            f"osa_lab.integrations.timm needs timm ({TIMM_SPEC}); install it with `pip install "
            "'osa_lab[lab,timm]'` (or, beside a CPU-only torch, `pip install --no-deps 'timm>=1.0.20,<1.1'`)"
        )
    if _torchvision_imports():
        import timm
        import timm.models.vision_transformer  # noqa: F401

        return timm
    finder = _PlaceholderFinder()
    sys.meta_path.insert(0, finder)
    try:
        import timm
        import timm.models.vision_transformer  # noqa: F401
    except Exception:
        _purge("timm")
        raise
    finally:
        sys.meta_path.remove(finder)
        _purge("torchvision")  # later `import torchvision` elsewhere fails as it would without us
    _placeholder_used = True
    return timm


def torchvision_placeholder_used() -> bool:
    """True when timm was imported behind the placeholder torchvision (see the module docstring)."""
    return _placeholder_used


def _timm_attention_class() -> type:
    import_timm()
    from timm.layers import Attention

    return Attention


def _vit_module() -> types.ModuleType:
    import_timm()
    return sys.modules["timm.models.vision_transformer"]


# --------------------------------------------------------------------------------------
# Initialisation shared with osa_lab's presets
# --------------------------------------------------------------------------------------


def _positive_int(name: str, value: object) -> int:
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
        _positive_int("dim", dim)
        _positive_int("num_heads", num_heads)
        if attn_head_dim is None:
            if dim % num_heads:
                raise heads_do_not_divide(dim, num_heads, heads_name="num_heads", otherwise="give attn_head_dim")
            attn_head_dim = dim // num_heads
        _positive_int("attn_head_dim", attn_head_dim)
        if (qk_norm or scale_norm) and norm_layer is None and _reuse is None:
            raise ConfigurationError("qk_norm / scale_norm need a `norm_layer` (e.g. nn.LayerNorm), as in timm")
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
        self.tokens = DEFAULT_TOKENS if tokens is None else _positive_int("tokens", tokens)
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
            self.tokens = _positive_int("tokens", tokens)
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
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False, **kwargs: Any
    ) -> torch.Tensor:
        """``(B, N, dim) → (B, N, dim_out)``; a mask or ``is_causal=True`` raises CausalMaskError."""
        if attn_mask is not None or is_causal:
            key = "attn_mask" if attn_mask is not None else "is_causal"
            refuse_masks({key: attn_mask if attn_mask is not None else is_causal})
        if kwargs:
            refuse_masks(kwargs)
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise OSAInputError(f"`x` has shape {shape}; OSAAttention needs (batch, tokens, dim={self.dim})")
        B, N, _ = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        y = osa(q, k, v, self.alpha, method=self.method)  # osa forms α/√r in float64
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

        vit = _vit_module()
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
        attn_layer = _timm_attention_class() if attn_layer is None else attn_layer
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
        if not isinstance(self.attn, OSAAttention) and hasattr(self.attn, "qkv") and hasattr(self.attn, "proj"):
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


# --------------------------------------------------------------------------------------
# Building and converting models
# --------------------------------------------------------------------------------------


def is_timm_vit(model: object) -> bool:
    """True for a ``timm.models.VisionTransformer`` (never imports timm itself)."""
    vit = sys.modules.get("timm.models.vision_transformer")
    return vit is not None and isinstance(model, vit.VisionTransformer)


def num_tokens(model: nn.Module) -> int:
    """Tokens a timm ViT's blocks see: patches plus prefix tokens (class and register tokens)."""
    if not is_timm_vit(model):
        raise ConfigurationError(f"`model` must be a timm VisionTransformer, got {type(model).__name__}")
    return int(model.patch_embed.num_patches) + int(getattr(model, "num_prefix_tokens", 0))


def osa_attention_layers(model: nn.Module) -> list[OSAAttention]:
    """Every :class:`OSAAttention` in ``model``."""
    return [m for m in model.modules() if isinstance(m, OSAAttention)]


def _accepts(fn: Callable, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def create_osa_vit(
    name_or_config: str | Mapping[str, Any],
    skipless: bool = True,
    normless: bool = True,
    *,
    attention: str = "osa",
    alpha_init: float | None = None,
    method: str = "auto",
    init: str = "auto",
    dtype: torch.dtype | None = None,
    **timm_kwargs: Any,
) -> nn.Module:
    """A timm Vision Transformer with OSA attention, skipless and normless by default (the paper's model).

    Args:
        name_or_config: a timm model name built on ``VisionTransformer`` (``"vit_tiny_patch16_224"``,
            ``"vit_small_patch16_224"``, ``"deit_tiny_patch16_224"`` …; ``timm.list_models("vit_*")``)
            or a mapping of ``VisionTransformer`` constructor arguments.
        skipless: remove the blocks' skip connections.
        normless: remove the blocks' LayerNorms and the final norm (unless ``final_norm`` /
            ``fc_norm`` is given in ``timm_kwargs``).
        attention: ``"osa"`` (:class:`OSAAttention`) or ``"softmax"`` (timm's ``Attention``, the
            baseline of the same architecture).
        alpha_init: α of every OSA head at init (default: the derived α₀ for the model's tokens).
        method: :func:`osa_lab.osa` method of every OSA layer.
        init: the blocks' init (:class:`SkiplessBlock`); ``"auto"``: the presets' orthogonal
            init when skipless, timm's otherwise.
        dtype: build (and initialise) the parameters in this dtype (e.g. ``torch.float64``).
        timm_kwargs: passed to ``timm.create_model`` / ``VisionTransformer`` (``img_size``,
            ``depth``, ``num_classes``, ``in_chans`` …). ``pretrained`` defaults to False.

    With ``skipless=normless=False`` the blocks are timm's own ``Block`` and only the attention
    changes. Raises :class:`~osa_lab.errors.UnknownNameError` for an unknown model name and
    :class:`~osa_lab.errors.ConfigurationError` for a model that is not a ``VisionTransformer``.
    """
    timm = import_timm()
    vit = _vit_module()
    if attention not in ATTENTIONS:
        raise unknown_name("attention", attention, list(ATTENTIONS))
    if method != "auto" and method not in OSA_METHODS:
        raise unknown_name("method", method, [*OSA_METHODS, "auto"])
    for name, flag in (("skipless", skipless), ("normless", normless)):
        if not isinstance(flag, bool):
            raise ConfigurationError(f"`{name}` must be True or False, got {flag!r}")
    kwargs = dict(timm_kwargs)
    if attention == "osa":
        kwargs["attn_layer"] = osa_attention(method, alpha_init)
    elif alpha_init is not None:
        raise ConfigurationError("`alpha_init` only applies to attention='osa'; leave it None for 'softmax'")
    if skipless or normless:
        kwargs["block_fn"] = block_fn(skip=not skipless, norm=not normless, init=init)
    if normless and "final_norm" not in kwargs and "fc_norm" not in kwargs:
        if _accepts(vit.VisionTransformer.__init__, "final_norm"):
            kwargs["final_norm"] = False
    with _timm_build_dtype(dtype):
        if isinstance(name_or_config, str):
            if name_or_config not in timm.list_models():
                close = difflib.get_close_matches(name_or_config, timm.list_models("*vit*"), n=8, cutoff=0.5)
                raise unknown_name("timm model", name_or_config, close or ["vit_tiny_patch16_224", "…"])
            kwargs.setdefault("pretrained", False)
            try:
                model = timm.create_model(name_or_config, **kwargs)
            except TypeError as exc:
                raise ConfigurationError(
                    f"timm model {name_or_config!r} did not accept the OSA arguments ({exc}); "
                    "create_osa_vit builds models of timm's VisionTransformer class. For another "
                    "architecture build it with timm and call convert_to_osa(model)"
                ) from exc
        elif isinstance(name_or_config, Mapping):
            model = vit.VisionTransformer(**{**name_or_config, **kwargs})
        else:
            raise ConfigurationError(
                "`name_or_config` must be a timm model name or a mapping of VisionTransformer arguments, got "
                f"{type(name_or_config).__name__}"
            )
    if not is_timm_vit(model):
        raise ConfigurationError(
            f"{name_or_config!r} builds a {type(model).__name__}, not a timm VisionTransformer; build it with "
            "timm and call convert_to_osa(model) to swap its attention"
        )
    n = num_tokens(model)
    for layer in osa_attention_layers(model):
        layer.reset_alpha(tokens=n)
    return model


@dataclass
class ConversionReport:
    """What :func:`convert_to_osa` did: module names swapped and left alone (with the reason)."""

    swapped: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    tokens: int = 0
    alpha: float = math.nan
    parameters_reused: int = 0
    parameters_added: int = 0

    def __str__(self) -> str:
        lines = [
            f"converted {len(self.swapped)} attention layer(s) to OSA (tokens N={self.tokens}, α₀={self.alpha:.4g}; "
            f"{self.parameters_reused} parameters reused, {self.parameters_added} added: one α per head)"
        ]
        lines += [f"  swapped  {name}" for name in self.swapped]
        lines += [f"  skipped  {name}: {why}" for name, why in self.skipped]
        return "\n".join(lines)


def convert_to_osa(
    model: nn.Module,
    *,
    alpha_init: float | None = None,
    method: str = "auto",
    tokens: int | None = None,
) -> ConversionReport:
    """Replace every ``timm.layers.Attention`` in ``model`` by :class:`OSAAttention`, in place.

    The new layers share the old ones' ``qkv``, ``proj`` (and norm / gate) modules, so the
    weights are kept exactly; each gets one α per head, at ``alpha_init`` or the derived α₀ for
    ``tokens`` (default: the ViT's patches + prefix tokens). The skips, norms and everything
    else stay. Other attention classes (timm's ``AttentionRope``, ``DiffAttention`` …, whose
    forward differs) are left alone and listed in the report's ``skipped``.

    Raises:
        ConfigurationError: ``tokens`` is needed (not a timm ViT), a layer uses attention
            dropout (nothing is swapped then), or the model has no ``timm.layers.Attention`` and
            no OSA layer (nothing would be converted; the message names the attention types found).
    """
    attention_cls = _timm_attention_class()
    if tokens is None:
        if not is_timm_vit(model):
            raise ConfigurationError(
                f"{type(model).__name__} is not a timm VisionTransformer, so its token count is unknown; pass "
                "tokens=N (the sequence length the derived α₀ is tuned for)"
            )
        tokens = num_tokens(model)
    _positive_int("tokens", tokens)
    report = ConversionReport(tokens=tokens)
    targets: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if type(module) is attention_cls:
            p = getattr(module.attn_drop, "p", 0.0)
            if p:
                raise ConfigurationError(
                    f"{name}.attn_drop has p={p}: OSA never forms the attention matrix and dropping its entries "
                    "would break orthogonality. Rebuild the model with attn_drop_rate=0 (nothing was converted)"
                )
            targets.append((name, module))
        elif isinstance(module, OSAAttention):
            report.skipped.append((name, "already OSAAttention"))
        elif "Attention" in type(module).__name__ and not any(
            name.startswith(t + ".") for t, _ in targets
        ):
            report.skipped.append(
                (name, f"{type(module).__name__} is not timm.layers.Attention (its forward differs); unchanged")
            )
    if not targets and not any(isinstance(m, OSAAttention) for m in model.modules()):
        found = sorted({type(m).__name__ for m in model.modules() if "Attention" in type(m).__name__})
        raise ConfigurationError(
            f"convert_to_osa found no timm.layers.Attention in {type(model).__name__}, so nothing would be "
            f"converted (attention modules found: {', '.join(found) or 'none'}); their forward differs "
            "from timm's Attention (e.g. rotary or relative position terms), so OSA cannot replace them "
            "in place. Use a timm VisionTransformer, or build the model with OSAAttention"
        )
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        new = OSAAttention.from_timm(module, alpha_init=alpha_init, method=method, tokens=tokens)
        setattr(parent, child, new)
        report.swapped.append(name)
        report.parameters_reused += sum(p.numel() for p in module.parameters())
        report.parameters_added += new.alpha.numel()
        report.alpha = new.alpha0
    return report


def to_timm_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` without the α of its OSA layers: loads strictly into the timm original."""
    drop = {f"{name}.alpha" if name else "alpha" for name, m in model.named_modules() if isinstance(m, OSAAttention)}
    return {k: v for k, v in model.state_dict().items() if k not in drop}


# --------------------------------------------------------------------------------------
# Analysis: hidden states, depth profiles and Jacobian κ of timm ViTs
# --------------------------------------------------------------------------------------


def _timm_block_parts(block: nn.Module) -> tuple[Callable, Callable] | None:
    if isinstance(block, SkiplessBlock):
        return block.attention_part, block.mlp_part
    vit = sys.modules.get("timm.models.vision_transformer")
    if vit is not None and type(block) is vit.Block:

        def attention_part(x: torch.Tensor) -> torch.Tensor:
            return x + block.drop_path1(block.ls1(block.attn(block.norm1(x))))

        def mlp_part(h: torch.Tensor) -> torch.Tensor:
            return h + block.drop_path2(block.ls2(block.mlp(block.norm2(h))))

        return attention_part, mlp_part
    return None


def embed_tokens(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The tokens a timm ViT's first block sees: patch embedding, prefix tokens, position embedding."""
    if not is_timm_vit(model):
        raise ConfigurationError(f"`model` must be a timm VisionTransformer, got {type(model).__name__}")
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise OSAInputError(f"`images` has shape {shape}; a ViT needs (batch, channels, height, width)")
    x = model.patch_embed(images)
    x = model._pos_embed(x)
    x = model.patch_drop(x)
    return model.norm_pre(x)


def timm_hidden_states(model: nn.Module, images: torch.Tensor, *, check_finite: bool = True):
    """:class:`~osa_lab.nn.models.HiddenStates` of a timm ViT: the embedded tokens and every block's output.

    ``blocks[0]`` is the first block's input and ``blocks[l]`` block l's output; ``attention[l-1]``
    is block l's attention sub-layer output (with its skip) for timm's ``Block`` and
    :class:`SkiplessBlock` (empty for other block types). A NaN/Inf state raises
    :class:`~osa_lab.nn.models.NonFiniteHiddenStateError` naming the first layer where it appears.
    """
    from osa_lab.nn.models import HiddenStates, check_hidden_state_finite

    x = embed_tokens(model, images)
    hidden = HiddenStates()
    if check_finite:
        check_hidden_state_finite(x, 0, "block")
    hidden.blocks.append(x)
    parts = [_timm_block_parts(b) for b in model.blocks]
    with_attention = all(p is not None for p in parts)
    for i, (block, part) in enumerate(zip(model.blocks, parts, strict=True), start=1):
        if with_attention:
            h = part[0](x)
            if check_finite:
                check_hidden_state_finite(h, i, "attention")
            hidden.attention.append(h)
            x = part[1](h)
        else:
            x = block(x)
        if check_finite:
            check_hidden_state_finite(x, i, "block")
        hidden.blocks.append(x)
    return hidden


def _model_dtype(model: nn.Module) -> torch.dtype:
    for p in model.parameters():
        return p.dtype
    return torch.get_default_dtype()


def default_images(model: nn.Module, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """``batch`` images of i.i.d. N(0, 1) pixels at the ViT's input size, drawn from ``seed``."""
    if not is_timm_vit(model):
        raise ConfigurationError(f"`model` must be a timm VisionTransformer, got {type(model).__name__}")
    _positive_int("batch", batch)
    h, w = model.patch_embed.img_size
    chans = model.patch_embed.proj.in_channels
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, chans, h, w, generator=gen, dtype=torch.float64).to(_model_dtype(model))


def _label(model: nn.Module, label: str | None) -> str:
    if label:
        return label
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return str(cfg.get("architecture") or "timm-vit")


def _keys(model: nn.Module, hidden, label: str | None, seed: int) -> dict[str, object]:
    layers = osa_attention_layers(model)
    heads = getattr(model.blocks[0].attn, "num_heads", 0) if len(model.blocks) else 0
    return {
        "preset": _label(model, label),
        "depth": len(hidden.blocks) - 1,
        "tokens": int(hidden.blocks[0].shape[-2]),
        "dim": int(hidden.blocks[0].shape[-1]),
        "heads": int(heads),
        "alpha": float(layers[0].alpha.detach().reshape(-1)[0]) if layers else math.nan,
        "seed": int(seed),
    }


def timm_depth_profile(
    model: nn.Module,
    images: torch.Tensor | None = None,
    *,
    seed: int = 0,
    batch: int = 1,
    site: str | Sequence[str] = "both",
    metrics: Sequence[str] | None = None,
    spectra: bool = True,
    label: str | None = None,
):
    """osa_lab's depth profile (:func:`osa_lab.studies.depth.depth_profile`) of a timm ViT.

    Rank-collapse metrics and singular-value spectra of the tokens after every block (and every
    attention sub-layer), averaged over ``batch`` images (default: N(0, 1) pixels from ``seed``).
    The ``preset`` column holds ``label`` (default: the timm architecture name). Run in the
    model's dtype (``model.double()`` for float64); the metrics are computed in float64.
    """
    from osa_lab.studies.depth import DepthProfile, profile_tables, resolve_sites
    from osa_lab.studies.metrics import METRICS

    metric_names = list(METRICS) if metrics is None else list(metrics)
    for name in metric_names:
        if name not in METRICS:
            raise unknown_name("metric", name, list(METRICS))
    sites = resolve_sites(site)
    if images is None:
        images = default_images(model, batch, seed)
    elif not isinstance(images, torch.Tensor):
        raise OSAInputError(f"`images` must be a torch.Tensor, got {type(images).__name__}")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            hidden = timm_hidden_states(model, images.to(_model_dtype(model)))
    finally:
        model.train(was_training)
    keys = _keys(model, hidden, label, seed)
    metrics_df, spectra_df = profile_tables(hidden, keys, sites, metric_names, spectra)
    return DepthProfile(metrics_df, spectra_df, None)


@contextlib.contextmanager
def timm_functional_mode(model: nn.Module, osa_method: str = "qr") -> Iterator[nn.Module]:
    """Make a timm model usable under ``torch.func`` (jacrev, jvp, vmap) inside the block.

    OSA layers switch to ``osa_method`` (pure autograd); timm's attention layers to their explicit
    softmax (``fused_attn=False``: SDPA has no vmap/forward-mode rule on the CPU). Restored on exit.
    """
    saved_methods = [(m, m.method) for m in osa_attention_layers(model)]
    fused = [(m, m.fused_attn) for m in model.modules() if hasattr(m, "fused_attn") and hasattr(m, "qkv")]
    try:
        for m, _ in saved_methods:
            m.method = osa_method
        for m, _ in fused:
            m.fused_attn = False
        yield model
    finally:
        for m, method in saved_methods:
            m.method = method
        for m, flag in fused:
            m.fused_attn = flag


def timm_jacobian_profile(
    model: nn.Module,
    images: torch.Tensor | None = None,
    *,
    algorithm: str = "auto",
    layers: Sequence[int] | None = None,
    scopes: Sequence[str] = ("end_to_end", "layer"),
    max_exact_dim: int | None = None,
    max_bytes: int | None = None,
    solver: str = "arpack",
    tol: float = 1e-6,
    seed: int = 0,
    label: str | None = None,
) -> pd.DataFrame:
    """Jacobian κ across depth of a timm ViT, as :func:`osa_lab.studies.jacobian.jacobian_depth_profile`.

    At the embedded tokens ``X_0`` of one image (default: N(0, 1) pixels from ``seed``): κ of
    ``∂X_l/∂X_0`` (``scope="end_to_end"``) and of block l alone (``"layer"``). ``"exact"``
    multiplies the per-block Jacobians (chain rule); ``"matrix-free"`` finds the extreme singular
    values by ARPACK/lobpcg from jvp/vjp products (the ``algorithm``); ``"auto"`` is exact up to ``max_exact_dim``
    input entries (N·d). Returns the columns :data:`osa_lab.studies.jacobian.KAPPA_COLUMNS`.
    """
    from osa_lab.studies import jacobian as jac

    jac.check_algorithm(algorithm)
    for s in scopes:
        if s not in jac.SCOPES:
            raise unknown_name("scope", s, list(jac.SCOPES))
    if images is None:
        images = default_images(model, 1, seed)
    if images.dim() != 4 or images.shape[0] != 1:
        raise OSAInputError(f"`images` has shape {tuple(images.shape)}; give one image (1, C, H, W)")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            hidden = timm_hidden_states(model, images.to(_model_dtype(model)))
        inputs = [h[0] for h in hidden.blocks]
        depth = len(model.blocks)
        wanted = jac.resolve_layers(layers, depth)
        x0 = inputs[0]
        n = x0.numel()
        limit = jac.MAX_EXACT_DIM if max_exact_dim is None else max_exact_dim
        resolved = algorithm if algorithm != "auto" else ("exact" if n <= limit else "matrix-free")
        keys = _keys(model, hidden, label, seed)
        rows = []

        def block_fn_(l: int) -> Callable:
            return lambda z: model.blocks[l - 1](z[None])[0]

        def prefix_fn(l: int) -> Callable:
            def fn(z: torch.Tensor) -> torch.Tensor:
                x = z[None]
                for block in model.blocks[:l]:
                    x = block(x)
                return x[0]

            return fn

        def row(scope: str, l: int, smax: float, smin: float, converged: bool = True) -> dict:
            return {
                **keys,
                "layer": l,
                "scope": scope,
                "algorithm": resolved,
                "sigma_max": smax,
                "sigma_min": smin,
                "kappa": jac.kappa_from_extremes(smax, smin),
                "converged": converged,
            }

        with timm_functional_mode(model):
            if resolved == "exact":
                jac.check_size(n, n, x0.dtype, max_bytes)
                product = None
                for l in range(1, max(wanted) + 1):
                    jl = jac.exact_jacobian(block_fn_(l), inputs[l - 1], max_bytes=max_bytes).double()
                    product = jl if product is None else jl @ product
                    if l not in wanted:
                        continue
                    for scope in scopes:
                        sigma = torch.linalg.svdvals(product if scope == "end_to_end" else jl)
                        rows.append(row(scope, l, float(sigma[0]), float(sigma[-1])))
            else:
                for l in wanted:
                    for scope in scopes:
                        fn, at = (prefix_fn(l), x0) if scope == "end_to_end" else (block_fn_(l), inputs[l - 1])
                        smax, smin, ok = jac.matrix_free_extremes(
                            fn, at, solver=solver, tol=tol, seed=seed, return_converged=True
                        )
                        rows.append(row(scope, l, smax, smin, ok))
    finally:
        model.train(was_training)
    return pd.DataFrame(rows, columns=jac.KAPPA_COLUMNS)


__all__ = [
    "ATTENTIONS",
    "DEFAULT_TOKENS",
    "TIMM_SPEC",
    "ConversionReport",
    "OSAAttention",
    "SkiplessBlock",
    "block_fn",
    "convert_to_osa",
    "create_osa_vit",
    "default_images",
    "embed_tokens",
    "import_timm",
    "init_mlp_orthogonal",
    "init_qkv_orthogonal",
    "is_timm_vit",
    "num_tokens",
    "osa_attention",
    "osa_attention_layers",
    "timm_depth_profile",
    "timm_functional_mode",
    "timm_hidden_states",
    "timm_jacobian_profile",
    "to_timm_state_dict",
    "torchvision_placeholder_used",
]


#: timm's constructors take no ``dtype``; building one in another dtype switches torch's default
#: dtype for the duration of the build (timm models only: osa_lab's own models receive ``dtype``).
_TIMM_BUILD_LOCK = threading.Lock()


@contextlib.contextmanager
def _timm_build_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    if dtype is None:
        yield
        return
    with _TIMM_BUILD_LOCK:
        old = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(old)


register_model_family(
    ModelFamily(
        library="timm", is_member=is_timm_vit, hidden_states=timm_hidden_states, depth_profile=timm_depth_profile
    )
)
