# ruff: noqa: E402  (the imports below follow the lab check)
"""Registration with the studies: hidden states, depth profiles and Jacobian κ of timm ViTs.

:func:`timm_hidden_states` takes a timm ViT's tokens block by block (and after each attention
sub-layer), so :func:`timm_depth_profile` scores them with osa_lab's rank-collapse metrics and
:func:`timm_jacobian_profile` measures κ across depth. Importing this module registers timm ViTs
as a :class:`~osa_lab.studies.families.ModelFamily`, so
:func:`osa_lab.studies.depth.depth_profile` accepts one directly.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator, Sequence

from osa_lab.extras import require_lab

require_lab("osa_lab.integrations.timm.analysis")  # before pandas: the error names the extra

import pandas as pd
import torch
from torch import nn

from osa_lab.errors import ConfigurationError, OSAInputError, unknown_name
from osa_lab.integrations.timm.conversion import is_timm_vit, osa_attention_layers
from osa_lab.integrations.timm.layers import SkiplessBlock, check_positive_int
from osa_lab.studies.families import ModelFamily, register_model_family


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


@contextlib.contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode inside the block, its own mode restored on exit (errors included)."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _eval_hidden_states(model: nn.Module, images: torch.Tensor):
    """:func:`timm_hidden_states` without autograd, the images cast to the model's dtype."""
    with torch.no_grad():
        return timm_hidden_states(model, images.to(_model_dtype(model)))


def _model_dtype(model: nn.Module) -> torch.dtype:
    for p in model.parameters():
        return p.dtype
    return torch.get_default_dtype()


def default_images(model: nn.Module, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """``batch`` images of i.i.d. N(0, 1) pixels at the ViT's input size, drawn from ``seed``."""
    if not is_timm_vit(model):
        raise ConfigurationError(f"`model` must be a timm VisionTransformer, got {type(model).__name__}")
    check_positive_int("batch", batch)
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
    with _evaluating(model):
        hidden = _eval_hidden_states(model, images)
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
    with _evaluating(model):
        hidden = _eval_hidden_states(model, images)
        inputs = [h[0] for h in hidden.blocks]
        depth = len(model.blocks)
        wanted = jac.resolve_layers(layers, depth)
        x0 = inputs[0]
        n = x0.numel()
        limit = jac.MAX_EXACT_DIM if max_exact_dim is None else max_exact_dim
        resolved = algorithm if algorithm != "auto" else ("exact" if n <= limit else "matrix-free")
        keys = {**_keys(model, hidden, label, seed), "algorithm": resolved}
        with timm_functional_mode(model):
            if resolved == "exact":
                jac.check_size(n, n, x0.dtype, max_bytes)
                extremes = _exact_extremes(model, inputs, wanted, scopes, max_bytes)
            else:
                extremes = _matrix_free_extremes(model, inputs, wanted, scopes, solver, tol, seed)
            rows = [
                {**keys, "layer": l, "scope": scope, "sigma_max": smax, "sigma_min": smin,
                 "kappa": jac.kappa_from_extremes(smax, smin), "converged": ok}
                for scope, l, smax, smin, ok in extremes
            ]  # fmt: skip
    return pd.DataFrame(rows, columns=jac.KAPPA_COLUMNS)


def _block_function(model: nn.Module, l: int) -> Callable:
    """Block ``l`` of a timm ViT as a function of one sample ``(N, d)``."""
    return lambda z: model.blocks[l - 1](z[None])[0]


def _prefix_function(model: nn.Module, l: int) -> Callable:
    """The first ``l`` blocks of a timm ViT as a function of one sample (``X_0 ↦ X_l``)."""

    def fn(z: torch.Tensor) -> torch.Tensor:
        x = z[None]
        for block in model.blocks[:l]:
            x = block(x)
        return x[0]

    return fn


def _exact_extremes(model: nn.Module, inputs: list[torch.Tensor], wanted: list[int], scopes: Sequence[str],
                    max_bytes: int | None) -> Iterator[tuple[str, int, float, float, bool]]:  # fmt: skip
    """(scope, layer, σ_max, σ_min, converged) from the per-block Jacobians and their running product."""
    from osa_lab.studies import jacobian as jac

    product = None
    for l in range(1, max(wanted) + 1):
        jl = jac.exact_jacobian(_block_function(model, l), inputs[l - 1], max_bytes=max_bytes).double()
        product = jl if product is None else jl @ product
        if l not in wanted:
            continue
        for scope in scopes:
            sigma = torch.linalg.svdvals(product if scope == "end_to_end" else jl)
            yield scope, l, float(sigma[0]), float(sigma[-1]), True


def _matrix_free_extremes(model: nn.Module, inputs: list[torch.Tensor], wanted: list[int], scopes: Sequence[str],
                          solver: str, tol: float, seed: int) -> Iterator[tuple[str, int, float, float, bool]]:  # fmt: skip
    """(scope, layer, σ_max, σ_min, converged) from one matrix-free solve per layer and scope."""
    from osa_lab.studies import jacobian as jac

    for l in wanted:
        for scope in scopes:
            if scope == "end_to_end":
                fn, at = _prefix_function(model, l), inputs[0]
            else:
                fn, at = _block_function(model, l), inputs[l - 1]
            smax, smin, ok = jac.matrix_free_extremes(
                fn, at, solver=solver, tol=tol, seed=seed, return_converged=True
            )
            yield scope, l, smax, smin, ok


register_model_family(
    ModelFamily(
        library="timm",
        is_member=is_timm_vit,
        hidden_states=timm_hidden_states,
        depth_profile=timm_depth_profile,
    )
)
