"""Conversion: building timm ViTs with OSA, swapping the attention of an existing one, and back.

:func:`create_osa_vit` builds any timm ``VisionTransformer`` variant with OSA (skipless and
normless by default, the paper's model), in the requested ``dtype`` passed to timm's constructors;
:func:`convert_to_osa` swaps the attention of an existing model in place keeping its weights
(:class:`ConversionReport`); :func:`to_timm_state_dict` gives a state dict the timm original loads.
"""

from __future__ import annotations

import difflib
import inspect
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from osa_lab.errors import ConfigurationError, unknown_name
from osa_lab.integrations.timm.layers import (
    ATTENTIONS,
    OSAAttention,
    block_fn,
    check_positive_int,
    osa_attention,
)
from osa_lab.integrations.timm.loading import import_timm, timm_attention_class, vit_module
from osa_lab.ops.functional import OSA_METHODS


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
        dtype: build (and initialise) the parameters in this dtype (e.g. ``torch.float64``): passed
            to timm's constructors, which create every layer in it; torch's default dtype is never
            switched.
        timm_kwargs: passed to ``timm.create_model`` / ``VisionTransformer`` (``img_size``,
            ``depth``, ``num_classes``, ``in_chans`` …). ``pretrained`` defaults to False.

    With ``skipless=normless=False`` the blocks are timm's own ``Block`` and only the attention
    changes. Raises :class:`~osa_lab.errors.UnknownNameError` for an unknown model name and
    :class:`~osa_lab.errors.ConfigurationError` for a model that is not a ``VisionTransformer``.
    """
    timm = import_timm()
    vit = vit_module()
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
    if dtype is not None:
        kwargs["dtype"] = dtype
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
    attention_cls = timm_attention_class()
    if tokens is None:
        if not is_timm_vit(model):
            raise ConfigurationError(
                f"{type(model).__name__} is not a timm VisionTransformer, so its token count is unknown; pass "
                "tokens=N (the sequence length the derived α₀ is tuned for)"
            )
        tokens = num_tokens(model)
    check_positive_int("tokens", tokens)
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
        elif "Attention" in type(module).__name__ and not any(name.startswith(t + ".") for t, _ in targets):
            report.skipped.append(
                (
                    name,
                    f"{type(module).__name__} is not timm.layers.Attention (its forward differs); unchanged",
                )
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
    drop = {
        f"{name}.alpha" if name else "alpha"
        for name, m in model.named_modules()
        if isinstance(m, OSAAttention)
    }
    return {k: v for k, v in model.state_dict().items() if k not in drop}
