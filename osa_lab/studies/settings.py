"""The grid point every study shares, and the set-up that turns it into a model and inputs.

A study (depth profile, sweep, Jacobian κ across depth) runs the same unit again and again: one
preset at one size (depth L, tokens N, width d, heads h), one OSA α and one seed.
:class:`StudyPoint` is that unit as a small frozen value; the tables' identifying columns
(``preset, depth, tokens, dim, heads, alpha, seed``) are its fields. The helpers below (building
its :class:`~osa_lab.nn.models.ModelConfig`, its Gaussian input tokens, reading back the α the
model got, normalising list arguments) are shared by :mod:`osa_lab.studies.depth` and
:mod:`osa_lab.studies.jacobian`, so neither imports the other's internals.

Data path (docs/architecture.md): settings (:class:`StudyPoint`) → model + inputs → hidden
states → tidy DataFrame → :mod:`osa_lab.plots`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from osa_lab.errors import ConfigurationError, unknown_name
from osa_lab.nn.models import ModelConfig, build_model, osa_layers
from osa_lab.nn.presets import PRESETS, get_preset, preset_names

__all__ = [
    "POINT_COLUMNS",
    "StudyPoint",
    "alpha_of",
    "as_list",
    "as_point",
    "config_for",
    "gaussian_tokens",
    "seed_list",
]

#: The identifying columns of every study table row, in order (the fields of :class:`StudyPoint`).
POINT_COLUMNS = ("preset", "depth", "tokens", "dim", "heads", "alpha", "seed")


def config_for(
    preset: str | StudyPoint,
    *,
    depth: int | None = None,
    tokens: int | None = None,
    dim: int | None = None,
    heads: int | None = None,
    alpha: float | None = None,
    seed: int = 0,
    **overrides: object,
) -> ModelConfig:
    """The :class:`ModelConfig` of a :class:`StudyPoint`, or of ``preset`` at these sizes; ``alpha``
    applies to OSA presets only; ``overrides`` are further :class:`ModelConfig` fields.

    ``heads=None`` keeps the preset's head count (4; 1 for the pure stacks); ``alpha=None`` uses
    the derived OSA init. For SSA presets ``alpha`` is ignored (the tables show NaN).
    """
    point = as_point(preset, depth, tokens, dim, heads, alpha, seed)
    if point.preset not in PRESETS:
        raise unknown_name("preset", point.preset, preset_names())
    base = PRESETS[point.preset].config
    kw: dict[str, object] = {"depth": point.depth, "tokens": point.tokens, "dim": point.dim, "seed": point.seed,
                             **overrides}  # fmt: skip
    if point.heads is not None:
        kw["heads"] = point.heads
    alpha = point.alpha
    if base.attention == "osa" and alpha is not None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
            raise ConfigurationError(
                f"`alpha`={alpha!r}: give a finite number, or None for the derived initialisation"
            )
        kw["alpha_init"] = float(alpha)
    return get_preset(point.preset, **kw)


def as_point(
    preset: str | StudyPoint,
    depth: int | None = None,
    tokens: int | None = None,
    dim: int | None = None,
    heads: int | None = None,
    alpha: float | None = None,
    seed: int = 0,
) -> StudyPoint:
    """``preset`` itself when it is a :class:`StudyPoint` (then the sizes must not be given as
    well), else the point of ``preset`` at these sizes (``depth``, ``tokens`` and ``dim`` required)."""
    if isinstance(preset, StudyPoint):
        given = [n for n, v in (("depth", depth), ("tokens", tokens), ("dim", dim), ("heads", heads),
                                ("alpha", alpha)) if v is not None] + (["seed"] if seed != 0 else [])  # fmt: skip
        if given:
            raise ConfigurationError(
                f"give either a StudyPoint or the settings {given} as arguments, not both (the point holds them)"
            )
        return preset
    missing = [n for n, v in (("depth", depth), ("tokens", tokens), ("dim", dim)) if v is None]
    if missing:
        raise ConfigurationError(
            f"preset {preset!r} needs {', '.join(f'`{n}`' for n in missing)} (or give a StudyPoint)"
        )
    return StudyPoint(preset, depth, tokens, dim, heads, alpha, seed)


def gaussian_tokens(batch: int, tokens: int, dim: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """``batch`` samples of N i.i.d. N(0, 1) tokens of width d, drawn in float64 from ``seed`` (a
    stream separate from the weights'), then cast to ``dtype``: the same inputs in every dtype."""
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, 7919]).generate_state(1)[0]))
    return torch.randn(batch, tokens, dim, generator=gen, dtype=torch.float64).to(dtype)


def alpha_of(model: nn.Module, config: ModelConfig) -> float:
    """The α the model's first OSA layer holds (NaN for softmax models): the ``alpha`` column."""
    if config.attention != "osa":
        return math.nan
    layers = osa_layers(model)
    if layers:
        return float(layers[0].alpha.detach().reshape(-1)[0])
    return config.resolved_alpha


def as_list(name: str, value: object) -> list:
    """``value`` as a list of grid values: a scalar (or string) becomes ``[value]``, None ``[None]``;
    an empty sequence raises :class:`~osa_lab.errors.ConfigurationError` naming ``name``."""
    if value is None:
        return [None]
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        return [value]
    out = list(value)
    if not out:
        raise ConfigurationError(f"`{name}` is empty; give at least one value")
    return out


def seed_list(seeds: int | Sequence[int]) -> list[int]:
    """A count of seeds (``3`` → ``[0, 1, 2]``) or an explicit list of non-negative ints."""
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        if seeds < 1:
            raise ConfigurationError(f"`seeds`={seeds}: give a number of seeds ≥ 1 or a list of seeds")
        return list(range(seeds))
    out = as_list("seeds", seeds)
    for s in out:
        if not isinstance(s, int) or isinstance(s, bool) or s < 0:
            raise ConfigurationError(f"`seeds` must be a count or a list of non-negative ints; got {seeds!r}")
    return out


class StudyPoint(NamedTuple):
    """One grid point of a study: ``preset`` at depth L, N ``tokens``, width ``dim``, ``heads``
    (None: the preset's), OSA ``alpha`` (None: the derived init; ignored by SSA presets), ``seed``.

    Frozen and hashable; unpacks like the ``(preset, depth, tokens, dim, heads, alpha, seed)``
    tuple it replaces. ``point._asdict()`` gives the settings dict a grid task records.
    """

    preset: str
    depth: int
    tokens: int
    dim: int
    heads: int | None = None
    alpha: float | None = None
    seed: int = 0

    def config(self, **overrides: object) -> ModelConfig:
        """The point's :class:`ModelConfig` (:func:`config_for`)."""
        return config_for(self, **overrides)

    def inputs(self, batch: int = 1, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The point's ``(batch, N, d)`` Gaussian input tokens (:func:`gaussian_tokens`)."""
        return gaussian_tokens(batch, self.tokens, self.dim, self.seed, dtype)

    def build(self, dtype: torch.dtype = torch.float64) -> tuple[nn.Module, ModelConfig, dict[str, object]]:
        """The point's model (eval mode, built in ``dtype``), its config and the row keys of its
        tables: the :data:`POINT_COLUMNS` with the heads and α the model really got."""
        config = self.config()
        model = build_model(config, dtype=dtype).eval()
        keys = {**self._asdict(), "heads": config.heads, "alpha": alpha_of(model, config)}
        return model, config, keys
