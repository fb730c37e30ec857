"""Encoders and ViT classifiers built from OSA or SSA blocks, with or without skips and norms.

The package's rooms: :mod:`~osa_lab.nn.models.config` (:class:`ModelConfig`),
:mod:`~osa_lab.nn.models.blocks` (the block and its parts, :class:`HiddenStates`),
:mod:`~osa_lab.nn.models.builders` (encoders, classifiers, their builders, ``functional_mode``),
:mod:`~osa_lab.nn.models.seeding` (seeded builds from a local generator) and
:mod:`~osa_lab.nn.models.mixing` (token-mixing diagnostics). Every public name imports from
``osa_lab.nn.models`` itself.

One configuration dataclass (:class:`ModelConfig`) and two builders:

* :func:`build_model` → :class:`Encoder`, tokens ``(B, N, dim) → (B, N, dim)``;
* :func:`build_classifier` → :class:`ViTClassifier`, images ``(B, C, H, W) → (B, classes)``
  (patch embedding + position embedding, encoder, mean pool, linear head).

A block is ``h = attn(norm₁(x)) [+ x]``, ``y = mlp(norm₂(h)) [+ h]`` (pre-norm, as in ViT;
the bracketed skips only when ``skip=True``; ``norm="none"`` makes the norms identities;
``mlp_ratio=0`` removes the MLP, giving an attention-only stack ``y = h``).

Every ``forward`` accepts ``return_hidden=True`` and then also returns :class:`HiddenStates`:
the input (layer 0), the output of every attention sub-layer and of every block, without hooks.
A non-finite hidden state raises :class:`NonFiniteHiddenStateError` naming the first layer
and site where it appears.

Initialisation schemes (``ModelConfig.init``):

``"default"``
    OSA: the core's derived init (Gaussian W_Q, W_K with variance 1/d, orthogonal W_V, W_O,
    α₀ from :func:`osa_lab.nn.attention.derived_alpha_init`). SSA and MLP: PyTorch's ``nn.Linear`` init
    (the "standard init" of a ViT).
``"orthogonal"``
    As ``"default"`` for attention except that SSA also gets Gaussian W_Q, W_K and orthogonal
    W_V, W_O (matching OSA's value path), and MLP weights are orthogonal with zero biases and a
    variance-preserving gain on the second layer (:meth:`MLP.init_orthogonal`).
``"cutting-skip"`` (SSA only)
    Ji et al. 2025, *Cutting the Skip: Training Residual-Free Transformers* (arXiv 2510.00345),
    docs/design.md §3: per head ``W_Q^h W_K^hᵀ ≈ a Z + b I`` with ``Z_ij ~ N(0, 1/d)`` (rank-r truncated
    SVD, the mimetic construction of Trockman & Kolter 2023), ``W_V W_O = c·(orthogonal)`` (κ = 1),
    a = 2, b = 0.6, c = 3 (their ViT-B values; :data:`CUTTING_SKIP_ABC`). MLP: PyTorch default.
``"value-skipinit"`` (SSA only)
    He et al. 2023, *Deep Transformers without Shortcuts* (arXiv 2302.10322): each head's
    attention matrix becomes ``a I + b softmax(q kᵀ/√r)`` with learnable ``a = 1, b = 0`` at init
    (:class:`ValueSkipInitAttention`), orthogonal W_V, W_O and the orthogonal MLP init above, so
    the network starts as a product of orthogonal maps and nonlinearities.

``ModelConfig.seed`` (optional) makes initialisation reproducible *and depth-consistent*: block
``i`` is initialised from its own local generator seeded by ``(seed, i)``, so the first ``l``
blocks of a depth-L model equal a depth-l model built with the same seed (a sweep over depths
needs one forward pass of the deepest model). torch's global generator is neither used nor
locked, so seeded builds in several threads run at once and get the same weights
(:mod:`~osa_lab.nn.models.seeding`).
"""

from osa_lab.errors import NonFiniteHiddenStateError
from osa_lab.nn.models.blocks import (
    MLP,
    Block,
    HiddenStates,
    activation_second_moment,
    check_hidden_state_finite,
)
from osa_lab.nn.models.builders import (
    CNN1dClassifier,
    Encoder,
    MLPClassifier,
    ViTClassifier,
    build_classifier,
    build_model,
    functional_mode,
    osa_layers,
)
from osa_lab.nn.models.config import (
    ACTIVATIONS,
    ATTENTIONS,
    BACKBONES,
    CUTTING_SKIP_ABC,
    INITS,
    INPUTS,
    NORMS,
    ModelConfig,
)
from osa_lab.nn.models.mixing import alpha_zeroed, mixing_stats, mixing_table, skew_generator
from osa_lab.nn.models.seeding import random_draws_from

__all__ = [
    "ACTIVATIONS", "ATTENTIONS", "BACKBONES", "CUTTING_SKIP_ABC", "INITS", "INPUTS", "MLP", "NORMS", "Block",
    "CNN1dClassifier", "Encoder", "HiddenStates", "MLPClassifier", "ModelConfig", "NonFiniteHiddenStateError",
    "ViTClassifier", "activation_second_moment", "alpha_zeroed", "build_classifier", "build_model",
    "check_hidden_state_finite", "functional_mode", "mixing_stats", "mixing_table", "osa_layers", "random_draws_from",
    "skew_generator",
]  # fmt: skip
