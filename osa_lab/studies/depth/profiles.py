"""Depth profiles: the metrics and singular-value spectra of one model's hidden states, layer by layer.

:func:`depth_profile` builds a model from a :class:`~osa_lab.studies.settings.StudyPoint` (or a
preset name and its sizes, a :class:`~osa_lab.nn.models.ModelConfig`, a built model, or a timm
ViT), runs it on Gaussian tokens and scores every hidden state with :mod:`osa_lab.studies.metrics`
(:func:`profile_tables`). The tables' schema is in :mod:`osa_lab.studies.depth`.
"""

from __future__ import annotations

import argparse
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch
from torch import nn

from osa_lab.arguments import positive_int
from osa_lab.errors import ConfigurationError, OSAInputError, unknown_name
from osa_lab.nn.models import Encoder, ModelConfig, ViTClassifier, build_model
from osa_lab.studies.families import model_family
from osa_lab.studies.metrics import METRICS, all_metrics, singular_values
from osa_lab.studies.settings import POINT_COLUMNS, StudyPoint, alpha_of, gaussian_tokens

KEY_COLUMNS = list(POINT_COLUMNS)  # the fields of StudyPoint
METRIC_COLUMNS = [*KEY_COLUMNS, "layer", "site", "metric", "value"]
SPECTRA_COLUMNS = [*KEY_COLUMNS, "layer", "site", "index", "sigma", "sigma_normalized"]
SITES = ("block", "attention")
DTYPES = {"float64": torch.float64, "float32": torch.float32}


@dataclass
class DepthProfile:
    """Metrics and spectra of one model across depth (tidy tables, see module docstring)."""

    metrics: pd.DataFrame
    spectra: pd.DataFrame
    config: ModelConfig | None = None

    def pivot(self, site: str = "block") -> pd.DataFrame:
        """Wide view: one row per layer, one column per metric (for a quick look)."""
        df = self.metrics[self.metrics["site"] == site]
        return df.pivot_table(index="layer", columns="metric", values="value")


def resolve_sites(site: str | Sequence[str]) -> list[str]:
    """The hidden-state sites named by ``site`` (``"both"``/``"all"``: every site); refuses unknown names."""
    if isinstance(site, str):
        sites = list(SITES) if site in ("both", "all") else [site]
    else:
        sites = list(site)
    for s in sites:
        if s not in SITES:
            raise unknown_name("site", s, [*SITES, "both"])
    return sites


def _model_dtype(model: nn.Module) -> torch.dtype:
    for p in model.parameters():
        return p.dtype
    return torch.get_default_dtype()


def hidden_states(model: nn.Module, inputs: torch.Tensor):
    """Run ``model`` (an :class:`Encoder` or :class:`ViTClassifier`) under ``no_grad``; return its HiddenStates."""
    with torch.no_grad():
        if isinstance(model, ViTClassifier):
            _, hidden = model(inputs, return_hidden=True)
        elif isinstance(model, Encoder):
            _, hidden = model(inputs, return_hidden=True)
        elif (family := model_family(model)) is not None:
            hidden = family.hidden_states(model, inputs)
        else:
            raise ConfigurationError(
                f"`model_or_preset` must be a preset name, a ModelConfig, an Encoder, a ViTClassifier or a timm "
                f"VisionTransformer; got {type(model).__name__}"
            )
    return hidden


def profile_tables(
    hidden,
    keys: dict[str, object],
    sites: list[str],
    metric_names: list[str],
    spectra: bool,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The tidy metrics and spectra tables of one model's hidden states, each row tagged with ``keys``."""
    metric_parts, spectra_parts = [], []
    for site in sites:
        states = hidden.site(site)
        if not states:
            continue
        first_layer = 0 if site == "block" else 1
        stack = torch.stack(states)  # (L, B, N, d)
        layers = np.arange(first_layer, first_layer + stack.shape[0])
        values = all_metrics(stack, metric_names)  # name → (L, B)
        for name in metric_names:
            v = values[name].mean(dim=1).numpy()
            metric_parts.append(pd.DataFrame({"layer": layers, "site": site, "metric": name, "value": v}))
        if spectra:
            sv = singular_values(stack).mean(dim=1)  # (L, k)
            top = sv[:, :1]
            norm = torch.where(
                top > 0, sv / top.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(sv)
            )
            n_layers, k = sv.shape
            spectra_parts.append(
                pd.DataFrame(
                    {
                        "layer": np.repeat(layers, k),
                        "site": site,
                        "index": np.tile(np.arange(k), n_layers),
                        "sigma": sv.reshape(-1).numpy(),
                        "sigma_normalized": norm.reshape(-1).numpy(),
                    }
                )
            )
    metrics_df = _with_keys(pd.concat(metric_parts, ignore_index=True), keys, METRIC_COLUMNS)
    spectra_df = (
        _with_keys(pd.concat(spectra_parts, ignore_index=True), keys, SPECTRA_COLUMNS)
        if spectra_parts
        else pd.DataFrame({c: pd.Series(dtype=COLUMN_DTYPES.get(c, "float64")) for c in SPECTRA_COLUMNS})
    )
    return metrics_df, spectra_df


COLUMN_DTYPES = {
    "preset": "object",
    "site": "object",
    "metric": "object",
    "depth": "int64",
    "tokens": "int64",
    "dim": "int64",
    "heads": "int64",
    "seed": "int64",
    "layer": "int64",
    "index": "int64",
}


def _with_keys(df: pd.DataFrame, keys: dict[str, object], columns: list[str]) -> pd.DataFrame:
    for k, v in keys.items():
        df[k] = v
    df = df[columns]
    return df.astype({c: t for c, t in COLUMN_DTYPES.items() if c in df.columns and t != "object"})


def depth_profile(
    model_or_preset: str | StudyPoint | ModelConfig | nn.Module,
    inputs: torch.Tensor | None = None,
    *,
    depth: int = 12,
    tokens: int = 64,
    dim: int = 64,
    heads: int | None = None,
    alpha: float | None = None,
    seed: int = 0,
    batch: int = 1,
    site: str | Sequence[str] = "both",
    metrics: Sequence[str] | None = None,
    spectra: bool = True,
    dtype: torch.dtype = torch.float64,
    label: str | None = None,
    **overrides: object,
) -> DepthProfile:
    """Every metric of docs/design.md §4 and the singular-value spectrum after every layer.

    Args:
        model_or_preset: a :class:`~osa_lab.studies.settings.StudyPoint` (the preset at its
            sizes, α and seed, with ``overrides``); a preset name (the same, from ``depth``,
            ``tokens``, ``dim``, ``heads``, ``alpha``, ``seed``); a :class:`ModelConfig`; a built
            :class:`Encoder` / :class:`ViTClassifier` (then the size arguments are ignored); or a
            timm ``VisionTransformer`` (hidden states block by block: :mod:`osa_lab.integrations.timm`).
        inputs: tokens ``(B, N, dim)`` (images ``(B, C, H, W)`` for a classifier); default
            ``batch`` samples of i.i.d. N(0, 1) tokens drawn from the seed.
        seed: the seed of the inputs (and of the weights of a preset or a config without one);
            a :class:`StudyPoint` brings its own.
        site: ``"block"``, ``"attention"`` or ``"both"``.
        metrics: metric names (default: all of :data:`osa_lab.studies.metrics.METRICS`).
        spectra: also build the spectra table.
        dtype: dtype the model is built in (float64 by default; ignored for a built model).
        label: the ``preset`` column for a model or config (default ``"custom"``).

    Returns:
        :class:`DepthProfile` with ``.metrics`` and ``.spectra`` in the module's tidy schema.

    Raises:
        NonFiniteHiddenStateError: a hidden state is NaN/Inf; the message names the first layer.
        ConfigurationError: fewer than 2 tokens (the metrics compare tokens), before the model runs.
    """
    metric_names = list(METRICS) if metrics is None else list(metrics)
    for name in metric_names:
        if name not in METRICS:
            raise unknown_name("metric", name, list(METRICS))
    sites = resolve_sites(site)
    check_batch(batch)
    if isinstance(model_or_preset, str):
        model_or_preset = StudyPoint(model_or_preset, depth, tokens, dim, heads, alpha, seed)
    if isinstance(model_or_preset, StudyPoint):
        seed = model_or_preset.seed
    elif not isinstance(model_or_preset, (ModelConfig, Encoder, ViTClassifier)):
        family = model_family(model_or_preset)
        if family is None:
            raise ConfigurationError(
                "`model_or_preset` must be a preset name, a StudyPoint, a ModelConfig, an Encoder, a ViTClassifier "
                f"or a timm VisionTransformer; got {type(model_or_preset).__name__}"
            )
        # e.g. a timm ViT: hidden states block by block (osa_lab.integrations.timm); `inputs` are images.
        return family.depth_profile(
            model_or_preset, inputs, seed=seed, batch=batch, site=sites, metrics=metric_names,
            spectra=spectra, label=label,
        )  # fmt: skip
    model, config, name = _model_of(model_or_preset, seed, dtype, label, overrides)
    model.eval()
    inputs = _inputs_for(model, config, inputs, batch, seed).to(_model_dtype(model))
    hidden = hidden_states(model, inputs)
    n_tokens, width = hidden.blocks[0].shape[-2], hidden.blocks[0].shape[-1]
    keys = {
        "preset": name,
        "depth": hidden.depth,
        "tokens": int(n_tokens),
        "dim": int(width),
        "heads": int(config.heads),
        "alpha": alpha_of(model, config),
        "seed": int(seed),
    }
    metrics_df, spectra_df = profile_tables(hidden, keys, sites, metric_names, spectra)
    return DepthProfile(metrics_df, spectra_df, config)


def _model_of(
    source: StudyPoint | ModelConfig | Encoder | ViTClassifier,
    seed: int,
    dtype: torch.dtype,
    label: str | None,
    overrides: dict[str, object],
) -> tuple[nn.Module, ModelConfig, str]:
    """The model of a :func:`depth_profile` call, its config and its ``preset`` column."""
    if isinstance(source, StudyPoint):
        check_tokens(source.tokens)
        config = source.config(**overrides)
        return build_model(config, dtype=dtype), config, source.preset
    if isinstance(source, ModelConfig):
        config = source if source.seed is not None else replace(source, seed=seed)
        return build_model(config, dtype=dtype), config, label or "custom"
    return source, source.config, label or "custom"


def _inputs_for(
    model: nn.Module, config: ModelConfig, inputs: torch.Tensor | None, batch: int, seed: int
) -> torch.Tensor:
    """The given ``inputs`` (checked), or ``batch`` Gaussian samples drawn from ``seed``: images for
    a classifier, tokens (:func:`~osa_lab.studies.settings.gaussian_tokens`) otherwise."""
    if inputs is None:
        if isinstance(model, ViTClassifier):
            gen = torch.Generator().manual_seed(seed)
            shape = (batch, config.channels, config.image_size, config.image_size)
            return torch.randn(*shape, generator=gen, dtype=torch.float64)
        check_tokens(config.tokens)
        return gaussian_tokens(batch, config.tokens, config.dim, seed, torch.float64)
    if not isinstance(inputs, torch.Tensor):
        raise OSAInputError(f"`inputs` must be a torch.Tensor, got {type(inputs).__name__}")
    if not isinstance(model, ViTClassifier) and inputs.dim() >= 2:
        check_tokens(int(inputs.shape[-2]), "inputs.shape[-2] (tokens)")
    return inputs


def check_batch(batch: object) -> None:
    if not isinstance(batch, numbers.Integral) or isinstance(batch, bool) or batch < 1:
        raise ConfigurationError(f"`batch`={batch!r}: give the number of random inputs per model, an int ≥ 1")


#: Fewest tokens a depth profile takes: the rank-collapse metrics compare tokens with each other
#: (token cosine, distance to rank one), so a single token has nothing to compare.
MIN_TOKENS = 2


def check_tokens(n: object, name: str = "tokens") -> None:
    """Refuse N < :data:`MIN_TOKENS` up front (not as a failed metric after the model ran)."""
    if isinstance(n, numbers.Integral) and not isinstance(n, bool) and 1 <= n < MIN_TOKENS:
        raise ConfigurationError(
            f"`{name}` must be ≥ {MIN_TOKENS}, got {n}: the metrics compare tokens with each other "
            "(token cosine, rank collapse), so one token has nothing to compare"
        )


def token_count(text: str) -> int:
    """argparse type of ``--tokens``: an int ≥ :data:`MIN_TOKENS` (the metrics compare tokens)."""
    value = positive_int(text)
    if value < MIN_TOKENS:
        raise argparse.ArgumentTypeError(
            f"must be an int ≥ {MIN_TOKENS} (the metrics compare tokens with each other), got {text!r}"
        )
    return value
