"""Named model presets, usable by name everywhere (CLI, notebooks, dashboard, training).

=====================  ======================================================================
name                   architecture (depth 6, dim 64, N = 64; 4 heads, 1 for the pure stacks)
=====================  ======================================================================
vit                    skip + pre-LayerNorm + SSA + MLP, PyTorch default init (Dosovitskiy et al. 2021)
skipless-ssa           no skip, no norm, SSA + MLP, orthogonal init (Ji et al. 2025, "Always Skip Attention")
skipless-osa           no skip, no norm, OSA + MLP, derived OSA init + orthogonal MLP (Zhang & Martens 2026)
skipless-osa-shaped    skipless-osa with TAT's leaky ReLU (slope from depth) and tied orthogonal MLPs
skipless-ssa-shaped    no skip, no norm, Value-SkipInit SSA + TAT-shaped MLPs (He et al. 2023; TAT 2022)
pure-ssa               attention-only SSA stack, no skip/norm/MLP, default init (Dong et al. 2021)
pure-osa               attention-only OSA stack, no skip/norm/MLP, orthogonal W_V, W_O (Zhang & Martens 2026)
ssa-cutting-skip       no skip, pre-LayerNorm, SSA + MLP, Cutting-the-Skip init (Ji et al. 2025)
ssa-value-skipinit     no skip, no norm, SSA + MLP, Value-SkipInit attention (He et al. 2023)
skipless-osa-alpha0    control: skipless-osa with α ≡ 0 frozen, so exp(S) = I (no token mixing)
vit-no-attn            control: vit with the attention sub-layers removed (skips + LN + MLP only)
mlp                    baseline: MLP on the flattened input, 2 hidden layers of 100 ReLU units
cnn1d                  baseline (1-D data only): 3 stride-2 convolutions of 25 channels, ReLU
=====================  ======================================================================

The last four (:data:`TRAINING_PRESETS`, listed by ``preset_names(training=True)``) exist
for the training comparison on MNIST-1D: the two controls
isolate what token mixing contributes in the same network, and ``mlp`` / ``cnn1d`` follow
the MLP (68 %) and CNN (94 %) rows of Greydanus & Kobak's MNIST-1D table so the numbers sit
on the published scale. The baselines are not transformers: :func:`osa_lab.studies.training.model_config_for`
applies ``--depth/--dim/--heads`` to transformer presets only.

``get_preset(name, **overrides)`` returns a :class:`~osa_lab.nn.models.ModelConfig`; overrides are
any of its fields (``depth=24, tokens=32, seed=0`` ...).

The pure stacks default to one head: a single OSA head maps ``X ↦ A X W_V W_O`` with ``A``
orthogonal, which keeps every singular value of ``X`` exactly when ``W_V W_O`` is orthogonal.
With several heads each head output keeps the singular values of its ``X W_V^h`` and the layer
keeps the Frobenius norm, but the concatenation mixes heads rotated by different ``A_h``, so the
layer's full spectrum drifts (≈ 3 % after 48 layers at 4 heads, N = 32, d = 64).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from osa_lab.errors import ConfigurationError, unknown_name
from osa_lab.nn.models import ModelConfig


@dataclass(frozen=True)
class Preset:
    """A named configuration with the paper it follows."""

    name: str
    config: ModelConfig
    description: str
    reference: str


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "vit",
            ModelConfig(attention="ssa", skip=True, norm="layernorm", mlp_ratio=4.0, init="default"),
            "skip-connected pre-LayerNorm ViT encoder with softmax attention and MLP, standard init",
            "Dosovitskiy et al. 2021, An Image is Worth 16x16 Words (arXiv 2010.11929)",
        ),
        Preset(
            "skipless-ssa",
            ModelConfig(attention="ssa", skip=False, norm="none", mlp_ratio=4.0, init="orthogonal"),
            "skipless, normless softmax-attention transformer (Gaussian W_Q, W_K; orthogonal W_V, W_O, MLP): "
            "the baseline whose attention Jacobian is ill-conditioned",
            "Ji et al. 2025, Always Skip Attention (arXiv 2505.01996); Zhang & Martens 2026 (arXiv 2602.05996)",
        ),
        Preset(
            "skipless-osa",
            ModelConfig(attention="osa", skip=False, norm="none", mlp_ratio=4.0, init="orthogonal"),
            "skipless, normless transformer with orthogonal self-attention (derived α₀, orthogonal W_V, W_O "
            "and MLP): the paper's model",
            "Zhang & Martens 2026, Orthogonal Self-Attention (arXiv 2602.05996)",
        ),
        Preset(
            "skipless-osa-shaped",
            ModelConfig(
                attention="osa", skip=False, norm="none", mlp_ratio=4.0, init="orthogonal", activation="tat-leaky-relu",
            ),  # fmt: skip
            "skipless-osa with TAT-shaped MLPs: the normalised leaky ReLU, its slope set from the depth, and a "
            "tied orthogonal MLP init (fc2 fc1 = g I, g keeping the signal's scale), so each MLP is well "
            "conditioned at init (end to end the network is not: docs/shaping.md)",
            "Zhang & Martens 2026 (arXiv 2602.05996) with TAT, Zhang, Botev & Martens 2022 (arXiv 2203.08120, "
            "eqs. 9–11)",
        ),
        Preset(
            "skipless-ssa-shaped",
            ModelConfig(
                attention="ssa", skip=False, norm="none", mlp_ratio=4.0, init="value-skipinit",
                activation="tat-leaky-relu",
            ),  # fmt: skip
            "skipless, normless SSA with Value-SkipInit attention (a I + b softmax, a = 1, b = 0 at init) and "
            "TAT-shaped MLPs as in skipless-osa-shaped",
            "He et al. 2023, Deep Transformers without Shortcuts (arXiv 2302.10322), Value-SkipInit, with TAT "
            "(arXiv 2203.08120); not its E-SPA/U-SPA attention",
        ),
        Preset(
            "pure-ssa",
            ModelConfig(attention="ssa", skip=False, norm="none", mlp_ratio=0.0, init="default", heads=1),
            "attention-only softmax stack (no skip, norm or MLP), standard init: loses rank doubly "
            "exponentially with depth",
            "Dong, Cordonnier & Loukas 2021, Attention is Not All You Need (arXiv 2103.03404)",
        ),
        Preset(
            "pure-osa",
            ModelConfig(attention="osa", skip=False, norm="none", mlp_ratio=0.0, init="default", heads=1),
            "attention-only OSA stack (no skip, norm or MLP) with orthogonal W_V, W_O: each head keeps the "
            "singular values of its input (exactly the whole layer's with heads=1)",
            "Zhang & Martens 2026, Orthogonal Self-Attention (arXiv 2602.05996), docs/design.md §1",
        ),
        Preset(
            "ssa-cutting-skip",
            ModelConfig(attention="ssa", skip=False, norm="layernorm", mlp_ratio=4.0, init="cutting-skip"),
            "skipless pre-LayerNorm SSA transformer with W_Q W_Kᵀ ≈ 2Z + 0.6I and W_V W_O = 3·orthogonal "
            "(only the skips removed, as in the paper)",
            "Ji et al. 2025, Cutting the Skip: Training Residual-Free Transformers (arXiv 2510.00345)",
        ),
        Preset(
            "ssa-value-skipinit",
            ModelConfig(attention="ssa", skip=False, norm="none", mlp_ratio=4.0, init="value-skipinit"),
            "skipless, normless SSA transformer whose attention is a I + b softmax(·) with learnable a = 1, "
            "b = 0 at init",
            "He, Martens, Zhang, Botev, Brock, Smith & Teh 2023, Deep Transformers without Shortcuts "
            "(arXiv 2302.10322), Value-SkipInit",
        ),
    )
}


#: controls and baselines of the training comparison, usable by name in training only
#: (``osa-lab train``, :mod:`osa_lab.studies.training`); the depth sweeps and the dashboard list :data:`PRESETS`.
TRAINING_PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "skipless-osa-alpha0",
            ModelConfig(
                attention="osa", skip=False, norm="none", mlp_ratio=4.0, init="orthogonal",
                alpha_init=0.0, learn_alpha=False,
            ),  # fmt: skip
            "control: skipless-osa with α ≡ 0 (a frozen buffer, not learned): S = 0 and exp(S) = I, so "
            "attention is the token-wise map X W_V W_O and nothing mixes tokens except the mean pool",
            "Zhang & Martens 2026 (arXiv 2602.05996) with mixing switched off; a control",
        ),
        Preset(
            "vit-no-attn",
            ModelConfig(attention="none", skip=True, norm="layernorm", mlp_ratio=4.0, init="default"),
            "control: vit with the attention sub-layers removed (skip + LayerNorm + MLP per token, mean pool)",
            "Dosovitskiy et al. 2021 (arXiv 2010.11929) without attention; a control",
        ),
        Preset(
            "mlp",
            ModelConfig(
                backbone="mlp", attention="none", depth=2, dim=100, heads=1, mlp_ratio=0.0, activation="relu",
            ),  # fmt: skip
            "baseline: MLP on the flattened input (2 hidden layers of 100 ReLU units)",
            "Greydanus & Kobak 2024, Scaling down deep learning with MNIST-1D (arXiv 2011.14439), MLP row",
        ),
        Preset(
            "cnn1d",
            ModelConfig(
                backbone="cnn1d", attention="none", depth=3, dim=25, heads=1, mlp_ratio=0.0, activation="relu",
            ),  # fmt: skip
            "baseline for 1-D sequences: three stride-2 convolutions (kernels 5, 3, 3) of 25 channels, ReLU, "
            "linear head",
            "Greydanus & Kobak 2024, Scaling down deep learning with MNIST-1D (arXiv 2011.14439), CNN row",
        ),
    )
}

_ALL = {**PRESETS, **TRAINING_PRESETS}


def preset_names(training: bool = False) -> list[str]:
    """The preset names, in a stable order; ``training=True`` adds :data:`TRAINING_PRESETS`."""
    return list(_ALL) if training else list(PRESETS)


def get_preset(name: str, **overrides: object) -> ModelConfig:
    """The :class:`ModelConfig` of preset ``name`` with ``overrides`` applied (any config field).

    Raises :class:`~osa_lab.errors.UnknownNameError` listing the valid presets for an unknown name
    and :class:`~osa_lab.errors.ConfigurationError` for an unknown override.
    """
    if name not in _ALL:
        raise unknown_name("preset", name, preset_names(training=True))
    valid = ModelConfig.field_names()
    bad = sorted(set(overrides) - set(valid))
    if bad:
        raise ConfigurationError(
            f"unknown override(s) {bad} for preset {name!r}; valid fields are: {', '.join(valid)}"
        )
    return replace(_ALL[name].config, **overrides)  # type: ignore[arg-type]  # each field checked by ModelConfig


def describe(name: str) -> str:
    """One line: the preset's description and the paper it follows."""
    if name not in _ALL:
        raise unknown_name("preset", name, preset_names(training=True))
    p = _ALL[name]
    return f"{p.name}: {p.description} [{p.reference}]"
