"""Orthogonal self-attention in timm's Vision Transformers (``pip install 'osa_lab[timm]'``).

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

The layer, the block, building, converting and loading need only torch and timm (``pip install
'osa_lab[timm]'``); the analysis names (hidden states, profiles, Jacobians) are imported on first
use and need the laboratory too (``pip install 'osa_lab[lab,timm]'``; without it they raise one
:class:`~osa_lab.errors.OptionalDependencyError` that names the extra).

The package's rooms: :mod:`~osa_lab.integrations.timm.loading` (importing timm),
:mod:`~osa_lab.integrations.timm.layers` (the wrapper: the attention layer and the block),
:mod:`~osa_lab.integrations.timm.conversion` (building and converting models) and
:mod:`~osa_lab.integrations.timm.analysis` (hidden states, profiles, and the registration with
the studies). Every public name imports from ``osa_lab.integrations.timm`` itself.

timm and torchvision
    timm imports torchvision when it is imported (torchvision is one of its requirements), so
    this integration needs the torchvision release made for the installed torch;
    :func:`import_timm` says so in one line when it is missing or does not import. Models are
    built in the requested dtype by passing ``dtype`` to timm's constructors (timm ≥ 1.0.21);
    torch's default dtype is never switched.
"""

from osa_lab.integrations.timm.conversion import (
    ConversionReport,
    convert_to_osa,
    create_osa_vit,
    is_timm_vit,
    num_tokens,
    osa_attention_layers,
    to_timm_state_dict,
)
from osa_lab.integrations.timm.layers import (
    ATTENTIONS,
    BLOCK_INITS,
    DEFAULT_TOKENS,
    OSAAttention,
    SkiplessBlock,
    block_fn,
    init_mlp_orthogonal,
    init_qkv_orthogonal,
    osa_attention,
)
from osa_lab.integrations.timm.loading import TIMM_SPEC, import_timm

#: the names of :mod:`~osa_lab.integrations.timm.analysis`, imported on first use (they need the lab)
ANALYSIS_NAMES = frozenset(
    {"default_images", "embed_tokens", "timm_depth_profile", "timm_functional_mode", "timm_hidden_states",
     "timm_jacobian_profile"}
)  # fmt: skip


def __getattr__(name: str) -> object:
    """The analysis names on first use, once the laboratory is known to be installed."""
    if name in ANALYSIS_NAMES:
        from osa_lab.extras import require_lab

        require_lab(f"osa_lab.integrations.timm.{name}")
        from osa_lab.integrations.timm import analysis

        return getattr(analysis, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *ANALYSIS_NAMES})


__all__ = [
    "ATTENTIONS",
    "BLOCK_INITS",
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
]
