"""Rank collapse and singular-value spectra across depth: depth profiles, sweeps, the ``sweep`` CLI.

Implements the measurements of docs/design.md §4 on the models of :mod:`osa_lab.nn.models`: the tokens
after every block (and every attention sub-layer) are scored by the metrics of
:mod:`osa_lab.studies.metrics` and their full singular-value spectra are recorded.

Tidy schema
-----------
Every table is long format, one row per observation, keyed by all its parameters.

**metrics** (:data:`METRIC_COLUMNS`)::

    preset, depth, tokens, dim, heads, alpha, seed, layer, site, metric, value

**spectra** (:data:`SPECTRA_COLUMNS`)::

    preset, depth, tokens, dim, heads, alpha, seed, layer, site, index, sigma, sigma_normalized

* ``preset``: preset name (or the ``label`` given for a custom model); ``depth``: number of
  blocks of the model the row belongs to; ``tokens`` N, ``dim`` d, ``heads``: as built.
* ``alpha``: the OSA α used at initialisation (the derived α₀ when none is given); NaN for SSA.
* ``seed``: seeds both the weights (:attr:`ModelConfig.seed`) and the Gaussian input tokens.
* ``layer``: 0 = the input, l = after block l (``site="block"``) or after block l's attention
  sub-layer (``site="attention"``, layers 1..depth only).
* ``metric``: a key of :data:`osa_lab.studies.metrics.METRICS`; ``value``: float64, averaged over the
  input batch when ``batch > 1``.
* ``index``: 0 = largest singular value; ``sigma_normalized = σ_i / σ_1``.

Depth sweeps are cheap: block ``i`` of a seeded model is initialised from ``(seed, i)``, so the
first l blocks of a depth-L model *are* the depth-l model; :func:`sweep` runs the deepest model
once per configuration and slices it for every requested depth.

CLI::

    osa-lab sweep --presets pure-osa pure-ssa --depth 24 --tokens 64 --dim 64 --seeds 3 \\
        --output results.csv          # also writes results_spectra.csv
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import math
import numbers
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from osa_lab.arguments import finite_float, positive_int
from osa_lab.errors import (
    ConfigurationError,
    GridTaskFailedWarning,
    OSAInputError,
    TaskStoreWarning,
    unknown_name,
)
from osa_lab.fileio import OutputLock, output_locks, write_all_or_nothing
from osa_lab.nn.models import Encoder, ModelConfig, ViTClassifier, build_model
from osa_lab.nn.presets import PRESETS, preset_names
from osa_lab.studies.families import model_family
from osa_lab.studies.grid import GridOptions, Task, add_grid_arguments, options_from_args, run_grid
from osa_lab.studies.metrics import METRICS, all_metrics, singular_values
from osa_lab.studies.settings import (
    POINT_COLUMNS,
    StudyPoint,
    alpha_of,
    as_list,
    config_for,
    gaussian_tokens,
    seed_list,
)

KEY_COLUMNS = list(POINT_COLUMNS)  # the fields of StudyPoint
METRIC_COLUMNS = [*KEY_COLUMNS, "layer", "site", "metric", "value"]
SPECTRA_COLUMNS = [*KEY_COLUMNS, "layer", "site", "index", "sigma", "sigma_normalized"]
SITES = ("block", "attention")
DTYPES = {"float64": torch.float64, "float32": torch.float32}

#: Bounds of what :func:`sweep` runs without ``allow_large=True`` (``osa-lab sweep --allow-large``):
#: beyond them a sweep takes hours or runs out of memory, which is almost always a typo.
MAX_DEPTH = 1024
MAX_WIDTH = 4096  # tokens N and width d
MAX_BATCH = 1024
MAX_MODELS = 10_000  # model runs: presets × N × d × heads × α × seeds
MAX_HIDDEN_BYTES = 4 * 2**30  # hidden states of one model run (all layers and sites)


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


@dataclass
class SweepResult:
    """Tidy tables of a :func:`sweep`; ``.metrics`` and ``.spectra`` follow the module schema."""

    metrics: pd.DataFrame
    spectra: pd.DataFrame
    parameters: dict = field(default_factory=dict)
    #: Jacobian κ across depth (``osa_lab.studies.jacobian.KAPPA_COLUMNS``) when ``sweep(jacobian=…)``; else None
    jacobian: pd.DataFrame | None = None
    #: one row per grid task (its settings, ``kind``, status, error …; see :mod:`osa_lab.studies.grid`)
    tasks: pd.DataFrame | None = None

    @property
    def failures(self) -> pd.DataFrame:
        """The rows of :attr:`tasks` that failed (settings, ``error_type``, ``error``); empty if none."""
        if self.tasks is None or self.tasks.empty:
            return pd.DataFrame()
        return self.tasks[self.tasks["status"] != "ok"].reset_index(drop=True)

    def summary(self) -> pd.DataFrame:
        """Mean, std, min and max over seeds of every metric (one row per preset/config/layer/site/metric)."""
        return summarize_over_seeds(self.metrics)

    def to_csv(self, path: str | Path, spectra_path: str | Path | None = None) -> tuple[Path, Path | None]:
        """Write the metrics CSV to ``path`` and the spectra CSV beside it (``<stem>_spectra.csv``);
        both files are replaced together or not at all."""
        path = Path(path)
        if spectra_path is None:
            spectra_path = path.with_name(f"{path.stem}_spectra{path.suffix or '.csv'}")
        spectra_path = Path(spectra_path)
        _write_tables([(path, self.metrics), (spectra_path, self.spectra)])
        return path, spectra_path


def summarize_over_seeds(metrics: pd.DataFrame) -> pd.DataFrame:
    """Aggregate a tidy metrics table over seeds: columns ``mean, std, min, max, n`` per key."""
    keys = [c for c in METRIC_COLUMNS if c not in ("seed", "value")]
    grouped = metrics.groupby(keys, dropna=False, sort=True)["value"]
    return grouped.agg(["mean", "std", "min", "max", "count"]).rename(columns={"count": "n"}).reset_index()


# --------------------------------------------------------------------------------------
# Depth profile
# --------------------------------------------------------------------------------------


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
        else pd.DataFrame({c: pd.Series(dtype=_COLUMN_DTYPES.get(c, "float64")) for c in SPECTRA_COLUMNS})
    )
    return metrics_df, spectra_df


_COLUMN_DTYPES = {
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
    return df.astype({c: t for c, t in _COLUMN_DTYPES.items() if c in df.columns and t != "object"})


def depth_profile(
    model_or_preset: str | ModelConfig | nn.Module,
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
        model_or_preset: a preset name (built at ``depth``, ``tokens``, ``dim``, ``heads``,
            ``alpha``, ``seed`` with ``overrides``), a :class:`ModelConfig`, or a built
            :class:`Encoder` / :class:`ViTClassifier` (then the size arguments are ignored), or a
            timm ``VisionTransformer`` (hidden states block by block: :mod:`osa_lab.integrations.timm`).
        inputs: tokens ``(B, N, dim)`` (images ``(B, C, H, W)`` for a classifier); default
            ``batch`` samples of i.i.d. N(0, 1) tokens drawn from ``seed``.
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
    _check_batch(batch)
    config: ModelConfig | None = None
    if isinstance(model_or_preset, str):
        _check_tokens(tokens)
        config = config_for(
            model_or_preset,
            depth=depth,
            tokens=tokens,
            dim=dim,
            heads=heads,
            alpha=alpha,
            seed=seed,
            **overrides,
        )
        model: nn.Module = build_model(config, dtype=dtype)
        name = model_or_preset
    elif isinstance(model_or_preset, ModelConfig):
        config = model_or_preset
        if config.seed is None:
            config = replace(config, seed=seed)
        model = build_model(config, dtype=dtype)
        name = label or "custom"
    elif isinstance(model_or_preset, (Encoder, ViTClassifier)):
        model = model_or_preset
        config = model.config
        name = label or "custom"
    elif (family := model_family(model_or_preset)) is not None:
        # e.g. a timm ViT: hidden states block by block (osa_lab.integrations.timm); `inputs` are images.
        return family.depth_profile(
            model_or_preset, inputs, seed=seed, batch=batch, site=sites, metrics=metric_names,
            spectra=spectra, label=label,
        )  # fmt: skip
    else:
        raise ConfigurationError(
            "`model_or_preset` must be a preset name, a ModelConfig, an Encoder, a ViTClassifier or a timm "
            f"VisionTransformer; got {type(model_or_preset).__name__}"
        )
    model.eval()
    mdtype = _model_dtype(model)
    if inputs is None:
        if isinstance(model, ViTClassifier):
            c = config
            gen = torch.Generator().manual_seed(seed)
            inputs = torch.randn(
                batch, c.channels, c.image_size, c.image_size, generator=gen, dtype=torch.float64
            )
        else:
            _check_tokens(config.tokens)
            inputs = gaussian_tokens(batch, config.tokens, config.dim, seed, torch.float64)
    elif not isinstance(inputs, torch.Tensor):
        raise OSAInputError(f"`inputs` must be a torch.Tensor, got {type(inputs).__name__}")
    elif not isinstance(model, ViTClassifier) and inputs.dim() >= 2:
        _check_tokens(int(inputs.shape[-2]), "inputs.shape[-2] (tokens)")
    inputs = inputs.to(mdtype)
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


# --------------------------------------------------------------------------------------
# Sweeps with a disk cache
# --------------------------------------------------------------------------------------


def _check_batch(batch: object) -> None:
    if not isinstance(batch, numbers.Integral) or isinstance(batch, bool) or batch < 1:
        raise ConfigurationError(f"`batch`={batch!r}: give the number of random inputs per model, an int ≥ 1")


#: Fewest tokens a depth profile takes: the rank-collapse metrics compare tokens with each other
#: (token cosine, distance to rank one), so a single token has nothing to compare.
MIN_TOKENS = 2


def _check_tokens(n: object, name: str = "tokens") -> None:
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


def _check_sweep_values(tokens_l: list, dims_l: list, heads_l: list, alphas_l: list, batch: object) -> None:
    """Refuse values the models would misuse silently (before anything is built)."""
    _check_batch(batch)
    for name, values in (("tokens", tokens_l), ("dims", dims_l), ("heads", heads_l)):
        for v in values:
            if v is None and name == "heads":
                continue
            if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 1:
                raise ConfigurationError(f"`{name}` must be ints ≥ 1, got {v!r}")
    for n in tokens_l:
        _check_tokens(n)
    for a in alphas_l:
        if a is not None and not math.isfinite(a):
            raise ConfigurationError(
                f"`alphas` must be finite numbers (None for the derived initialisation), got {a!r}"
            )


def check_sweep_size(
    units: Sequence[StudyPoint | tuple], sites: Sequence[str], batch: int, dtype: torch.dtype, allow_large: bool = False
) -> None:
    """Refuse clearly unreasonable sweeps unless ``allow_large``: depth > :data:`MAX_DEPTH`, N or d >
    :data:`MAX_WIDTH`, batch > :data:`MAX_BATCH`, more than :data:`MAX_MODELS` model runs, or hidden
    states of one run over :data:`MAX_HIDDEN_BYTES`. ``units`` are the sweep's
    :class:`~osa_lab.studies.settings.StudyPoint` s (or ``(preset, depth, N, d, heads, α, seed)``
    tuples). Raises :class:`ConfigurationError` naming the override."""
    if allow_large or not units:
        return
    points = [StudyPoint(*u) for u in units]
    hint = "pass allow_large=True (osa-lab sweep --allow-large) if you really mean it"
    depth = max(p.depth for p in points)
    n = max(p.tokens for p in points)
    d = max(p.dim for p in points)
    if depth > MAX_DEPTH:
        raise ConfigurationError(f"depth {depth} is over the limit of {MAX_DEPTH} layers; {hint}")
    if max(n, d) > MAX_WIDTH:
        raise ConfigurationError(f"tokens N = {n}, dim d = {d}: over the limit of {MAX_WIDTH}; {hint}")
    if batch > MAX_BATCH:
        raise ConfigurationError(f"batch {batch} is over the limit of {MAX_BATCH} inputs per model; {hint}")
    if len(units) > MAX_MODELS:
        raise ConfigurationError(f"the sweep runs {len(units)} models, over the limit of {MAX_MODELS}; {hint}")
    itemsize = torch.finfo(dtype).bits // 8
    need = max((p.depth + 1) * len(sites) * batch * p.tokens * p.dim * itemsize for p in points)
    if need > MAX_HIDDEN_BYTES:
        raise ConfigurationError(
            f"one model's hidden states would take {need / 2**30:.1f} GiB (depth {depth}, N = {n}, d = {d}, "
            f"batch {batch}, {len(sites)} site(s)), over {MAX_HIDDEN_BYTES / 2**30:.0f} GiB; "
            f"lower the depth, sizes or batch, or {hint}"
        )


def _cache_key(params: dict) -> str:
    from osa_lab.version import __version__

    blob = json.dumps(
        {**params, "osa_lab": __version__, "torch": torch.__version__}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _units(presets, depths, tokens, dims, heads, alphas, seeds) -> Iterator[StudyPoint]:
    """One :class:`StudyPoint` per model to run, at the largest depth; SSA presets ignore α."""
    max_depth = max(depths)
    seen = set()
    for preset, n, d, h, a, s in itertools.product(presets, tokens, dims, heads, alphas, seeds):
        attention = PRESETS[preset].config.attention
        a_key = a if attention == "osa" else None
        key = (preset, n, d, h, a_key, s)
        if key in seen:
            continue
        seen.add(key)
        yield StudyPoint(preset, max_depth, n, d, h, a_key, s)


def sweep(
    presets: str | Sequence[str],
    depths: int | Sequence[int],
    tokens: int | Sequence[int] = 64,
    dims: int | Sequence[int] = 64,
    heads: int | Sequence[int] | None = None,
    alphas: float | Sequence[float | None] | None = None,
    seeds: int | Sequence[int] = 3,
    *,
    site: str | Sequence[str] = "block",
    metrics: Sequence[str] | None = None,
    spectra: bool = True,
    batch: int = 1,
    dtype: torch.dtype = torch.float64,
    cache_dir: str | Path | None = None,
    progress: bool = True,
    threads: int | None = 1,
    allow_large: bool = False,
    jacobian: str = "none",
    grid: GridOptions | None = None,
) -> SweepResult:
    """Depth profiles over presets × depths × tokens × dims × heads × α × seeds, as tidy tables.

    Args:
        presets: preset names (:func:`osa_lab.nn.presets.preset_names`).
        depths: model depths; each model is run once at the largest depth and sliced (see module
            docstring), so ``depth`` in the tables is the depth of the model the row belongs to.
        tokens, dims: N and d values.
        heads: head counts (``None``: each preset's default).
        alphas: OSA α values (``None`` entries: the derived init). SSA presets run once, α = NaN.
        seeds: a number of seeds (``3`` → 0, 1, 2) or an explicit list.
        site: ``"block"``, ``"attention"`` or ``"both"``.
        cache_dir: folder of finished model runs, one ``.npz`` file per run (read without pickle,
            so a file from elsewhere never runs code), keyed by every parameter and the osa_lab
            and torch versions; a damaged or foreign file is computed again with a warning.
        progress: show a tqdm progress bar (on stderr).
        threads: torch intra-op threads while sweeping (default 1: the matrices are small and
            extra threads only contend, ~8× slower on a loaded 2-core machine); ``None`` keeps
            the current setting.
        allow_large: run sweeps beyond the bounds of :func:`check_sweep_size` (depth > 1024, …).
        jacobian: also compute Jacobian κ across depth per model into ``.jacobian``, by this
            algorithm (``"auto"``, ``"exact"``, ``"matrix-free"``;
            :func:`osa_lab.studies.jacobian.jacobian_depth_profile`); ``"none"``: no Jacobians.
        grid: where the model runs go (:class:`osa_lab.studies.grid.GridOptions`: in-process, a local
            Dask cluster, or an existing one); default in-process with ``threads`` torch threads
            and ``progress``. Each model run (and each Jacobian profile) is one task; with
            ``cache_dir`` finished tasks are stored there and skipped on a rerun. A task that
            fails is listed in ``.tasks``/``.failures`` (with a ``GridTaskFailedWarning``)
            and the others finish. The tables do not depend on where the tasks ran.

    Returns:
        :class:`SweepResult` with ``.metrics`` and ``.spectra`` (schema in the module docstring).

    Raises:
        UnknownNameError: unknown preset, metric or site (lists the valid ones).
        ConfigurationError: an impossible configuration (e.g. dim not divisible by heads, batch < 1,
            a non-finite α) or one over the bounds of :func:`check_sweep_size`, raised before any
            computation.
    """
    presets_l = as_list("presets", presets)
    for p in presets_l:
        if p not in PRESETS:
            raise unknown_name("preset", p, preset_names())
    depths_l = as_list("depths", depths)
    if any(isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 1 for x in depths_l):
        raise ConfigurationError(f"`depths` must be positive ints, got {depths_l}")
    depths_l = [int(x) for x in depths_l]
    tokens_l = as_list("tokens", tokens)
    dims_l = as_list("dims", dims)
    heads_l = as_list("heads", heads)
    alphas_l = [None if a is None else float(a) for a in as_list("alphas", alphas)]
    seeds_l = seed_list(seeds)
    _check_sweep_values(tokens_l, dims_l, heads_l, alphas_l, batch)
    sites = resolve_sites(site)
    metric_names = list(METRICS) if metrics is None else list(metrics)
    for name in metric_names:
        if name not in METRICS:
            raise unknown_name("metric", name, list(METRICS))
    dtype_name = str(dtype).removeprefix("torch.")
    units = list(_units(presets_l, depths_l, tokens_l, dims_l, heads_l, alphas_l, seeds_l))
    # Validate every configuration before computing anything.
    check_sweep_size(units, sites, batch, dtype, allow_large)
    for point in units:
        point.config()
    cache = Path(cache_dir) if cache_dir is not None else None
    # The task store is created by run_grid with the first finished task, not here: a sweep that
    # fails before any task finishes (an unreachable scheduler) leaves no empty folder behind.
    if cache is not None and cache.exists() and not cache.is_dir():
        raise ConfigurationError(f"`cache_dir` {str(cache)!r} is a file; give a folder")
    if jacobian != "none":
        from osa_lab.studies.jacobian import JACOBIAN_ALGORITHMS

        if jacobian not in JACOBIAN_ALGORITHMS:
            raise unknown_name("Jacobian algorithm", jacobian, [*JACOBIAN_ALGORITHMS, "none"])
    options = grid if grid is not None else GridOptions.in_process(threads=threads, progress=progress)
    tasks = _sweep_tasks(units, sites, metric_names, spectra, batch, dtype, dtype_name, jacobian, allow_large)
    outcome = run_grid(tasks, options, store=cache, desc="sweep")
    metric_parts, spectra_parts, jacobian_parts = [], [], []
    for o in outcome.outcomes:
        if not o.ok:
            continue
        if o.task.settings["kind"] == "jacobian":
            jacobian_parts.append(o.value)
            continue
        prof_m, prof_s = o.value
        for depth in sorted(set(depths_l)):
            m = prof_m[prof_m["layer"] <= depth].copy()
            m["depth"] = depth
            metric_parts.append(m)
            if spectra:
                sp = prof_s[prof_s["layer"] <= depth].copy()
                sp["depth"] = depth
                spectra_parts.append(sp)
    outcome.warn_failures("sweep")
    parameters = {
        "presets": presets_l,
        "depths": depths_l,
        "tokens": tokens_l,
        "dims": dims_l,
        "heads": heads_l,
        "alphas": alphas_l,
        "seeds": seeds_l,
        "sites": sites,
        "batch": batch,
        "dtype": dtype_name,
    }
    result = _finish(metric_parts, spectra_parts, parameters)
    result.tasks = outcome.table()
    if jacobian != "none":
        from osa_lab.studies.jacobian import KAPPA_COLUMNS

        result.jacobian = (
            pd.concat(jacobian_parts, ignore_index=True) if jacobian_parts else pd.DataFrame(columns=KAPPA_COLUMNS)
        )
    return result


def _profile_task(
    preset: str,
    depth: int,
    tokens: int,
    dim: int,
    heads: int | None,
    alpha: float | None,
    seed: int,
    sites: list[str],
    metrics: list[str],
    spectra: bool,
    batch: int,
    dtype: torch.dtype,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One grid task of :func:`sweep`: the depth profile of one model (metrics and spectra tables)."""
    prof = depth_profile(
        preset,
        depth=depth,
        tokens=tokens,
        dim=dim,
        heads=heads,
        alpha=alpha,
        seed=seed,
        batch=batch,
        site=sites,
        metrics=metrics,
        spectra=spectra,
        dtype=dtype,
    )
    return prof.metrics, prof.spectra


def _check_table(value: object, columns: list[str], what: str) -> None:
    if not isinstance(value, pd.DataFrame):
        raise TypeError(f"{what} must be a DataFrame, got {type(value).__name__}")
    missing = [c for c in columns if c not in value.columns]
    if missing:
        raise ValueError(f"{what} lacks the columns {missing}")


def check_profile_result(value: object) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``value`` is a sweep task's result: a pair of
    (metrics, spectra) tables with :data:`METRIC_COLUMNS` and :data:`SPECTRA_COLUMNS`."""
    if not isinstance(value, tuple) or len(value) != 2:
        raise TypeError(f"a depth profile is a pair of tables (metrics, spectra), got {type(value).__name__}")
    _check_table(value[0], METRIC_COLUMNS, "the metrics table")
    _check_table(value[1], SPECTRA_COLUMNS, "the spectra table")


def check_jacobian_result(value: object) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``value`` is a κ-profile table (``KAPPA_COLUMNS``)."""
    from osa_lab.studies.jacobian import KAPPA_COLUMNS

    _check_table(value, list(KAPPA_COLUMNS), "the Jacobian κ table")


def _sweep_tasks(
    units, sites, metric_names, spectra, batch, dtype, dtype_name, jacobian, allow_large=False
) -> list[Task]:
    """The grid of a sweep: one task per model run (key = the cache key of earlier versions, so
    old ``--cache-dir`` folders are reused) and, with ``jacobian``, one κ-profile task per model;
    ``allow_large`` lifts the matrix-free Jacobian's input-size bound for exactly these sizes."""
    tasks = []
    for point in units:
        settings = {"kind": "profile", **point._asdict()}
        params = {
            **point._asdict(),
            "sites": sites,
            "metrics": metric_names,
            "spectra": spectra,
            "batch": batch,
            "dtype": dtype_name,
        }
        kwargs = {**params, "dtype": dtype}
        tasks.append(Task(_profile_task, kwargs, settings, key=f"profile-{_cache_key(params)}",
                          check=check_profile_result))  # fmt: skip
    if jacobian != "none":
        from osa_lab.studies.jacobian import jacobian_depth_profile

        for point in units:
            settings = {"kind": "jacobian", **point._asdict()}
            kwargs = {**point._asdict(), "algorithm": jacobian}
            key = f"jacobian-{_cache_key({**kwargs, 'kind': 'jacobian'})}"
            if allow_large:  # not part of the key: it changes whether a task runs, not its result
                kwargs["max_input_dim"] = point.tokens * point.dim
            tasks.append(Task(jacobian_depth_profile, kwargs, settings, key=key, progress_kwarg="progress",
                              check=check_jacobian_result))  # fmt: skip
    return tasks


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Temporarily set ``torch.set_num_threads(n)`` (``None``: leave it)."""
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _finish(metric_parts: list[pd.DataFrame], spectra_parts: list[pd.DataFrame], parameters: dict) -> SweepResult:
    """The sweep's tables (typed empty tables when nothing ran) with the parameters that made them."""
    metrics_df = (
        pd.concat(metric_parts, ignore_index=True)
        if metric_parts
        else pd.DataFrame({c: pd.Series(dtype=_COLUMN_DTYPES.get(c, "float64")) for c in METRIC_COLUMNS})
    )
    spectra_df = (
        pd.concat(spectra_parts, ignore_index=True)
        if spectra_parts
        else pd.DataFrame({c: pd.Series(dtype=_COLUMN_DTYPES.get(c, "float64")) for c in SPECTRA_COLUMNS})
    )
    return SweepResult(metrics_df, spectra_df, parameters)


# --------------------------------------------------------------------------------------
# CLI: osa-lab sweep
# --------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``osa-lab sweep``."""
    parser.add_argument("--presets", nargs="+", default=["pure-osa", "pure-ssa"], metavar="NAME",
                        help=f"presets to compare (from: {', '.join(preset_names())})")  # fmt: skip
    parser.add_argument("--depth", nargs="+", type=positive_int, default=[24], help="model depth(s)")
    parser.add_argument("--tokens", nargs="+", type=token_count, default=[64], help="sequence length(s) N (≥ 2)")
    parser.add_argument("--dim", nargs="+", type=positive_int, default=[64], help="width(s) d")
    parser.add_argument(
        "--heads", nargs="+", type=positive_int, default=None, help="head count(s) (default: each preset's)"
    )
    parser.add_argument("--alpha", nargs="+", type=finite_float, default=None,
                        help="OSA α value(s) (default: the derived init); ignored for SSA presets")  # fmt: skip
    parser.add_argument("--seeds", type=positive_int, default=3, help="number of seeds (0..n-1)")
    parser.add_argument("--site", choices=["block", "attention", "both"], default="block")
    parser.add_argument("--batch", type=positive_int, default=1, help="random inputs per model (metrics averaged)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float64")
    parser.add_argument(
        "--output", default="results.csv", help="metrics CSV (spectra go to <stem>_spectra.csv)"
    )
    parser.add_argument("--spectra-output", default=None, help="spectra CSV path")
    parser.add_argument("--no-spectra", action="store_true", help="skip the spectra table")
    parser.add_argument("--jacobian", choices=["none", "auto", "exact", "matrix-free"], default="none",
                        help="also write Jacobian κ across depth to <stem>_jacobian.csv, computed by this algorithm")  # fmt: skip
    parser.add_argument("--cache-dir", default=None,
                        help="folder of finished task results, reused on a rerun (default: <stem>_tasks/ "
                        "beside --output)")  # fmt: skip
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--allow-large", action="store_true",
        help=f"run sweeps beyond the sanity bounds (depth > {MAX_DEPTH}, N or d > {MAX_WIDTH}, matrix-free "
        f"Jacobians of more than {MAX_MATRIX_FREE_INPUTS} inputs, …)",
    )
    add_grid_arguments(parser)


#: Largest N·d of a matrix-free Jacobian the CLI runs without ``--allow-large`` (4× the 16 384
#: inputs of the BENCHMARKS.md case, which takes ≈ 25 s for 12 layers).
MAX_MATRIX_FREE_INPUTS = 65_536


def _check_jacobian_request(args: argparse.Namespace) -> None:
    """Refuse a ``--jacobian`` run that cannot fit or would run for a very long time, before sweeping."""
    if args.jacobian == "none":
        return
    from osa_lab.studies.jacobian import MAX_EXACT_DIM, JacobianTooLargeError, default_max_bytes

    n_inputs = max(args.tokens) * max(args.dim)
    exact = args.jacobian == "exact" or (args.jacobian == "auto" and n_inputs <= MAX_EXACT_DIM)
    if exact:
        need, limit = n_inputs * n_inputs * 8, default_max_bytes()
        if need > limit:
            raise JacobianTooLargeError(
                f"--jacobian exact: the Jacobian at N = {max(args.tokens)}, d = {max(args.dim)} is {n_inputs} × "
                f"{n_inputs} float64 = {need / 2**30:.2f} GiB, over the limit of {limit / 2**30:.2f} GiB; use "
                "--jacobian matrix-free (or auto)"
            )
    elif n_inputs > MAX_MATRIX_FREE_INPUTS and not args.allow_large:
        raise ConfigurationError(
            f"--jacobian {args.jacobian}: a matrix-free Jacobian of N·d = {n_inputs} inputs takes very long "
            f"(limit {MAX_MATRIX_FREE_INPUTS}); use smaller --tokens/--dim or pass --allow-large"
        )


def _write_tables(tables: list[tuple[Path, pd.DataFrame]]) -> None:
    """Write every CSV to a uniquely named temporary beside it, then move them all into place:
    either every table is replaced or none is, and a failed write (a full disk) leaves no
    temporary behind (:func:`osa_lab.fileio.write_all_or_nothing`)."""
    write_all_or_nothing([(path, lambda fh, df=df: df.to_csv(fh, index=False), "w") for path, df in tables])


def run(args: argparse.Namespace) -> int:
    """Run ``osa-lab sweep``: writes the tidy CSV(s) and prints a short summary."""
    from osa_lab.arguments import check_output_dir, check_output_file
    from osa_lab.errors import OutputPathError

    # Every output path is checked before anything is computed.
    out = check_output_file(args.output, "--output")
    outputs: dict[str, Path] = {"--output": out}
    if not args.no_spectra:
        default_spectra = out.with_name(f"{out.stem}_spectra.csv")
        outputs["--spectra-output"] = check_output_file(args.spectra_output or default_spectra, "--spectra-output")
    if args.jacobian != "none":
        outputs["the Jacobian table"] = check_output_file(out.with_name(f"{out.stem}_jacobian.csv"),
                                                          "--output (its <stem>_jacobian.csv)")  # fmt: skip
    outputs["the task table"] = check_output_file(out.with_name(f"{out.stem}_tasks.csv"),
                                                  "--output (its <stem>_tasks.csv)")  # fmt: skip
    resolved = [p.resolve() for p in outputs.values()]
    if len(set(resolved)) < len(resolved):
        raise OutputPathError(
            f"output paths collide ({', '.join(f'{k} {v}' for k, v in outputs.items())}); give distinct files"
        )
    store = args.cache_dir if args.cache_dir is not None else out.with_name(f"{out.stem}_tasks")
    check_output_dir(store, "--cache-dir")
    _check_jacobian_request(args)
    # One sweep at a time writes the files named after an --output (and an explicit
    # --spectra-output): a second sweep on the same output is refused, naming the first.
    locks = [OutputLock.for_file(out, f"--output {out}")]
    if args.spectra_output is not None and not args.no_spectra:
        locks.append(OutputLock.for_file(outputs["--spectra-output"], f"--spectra-output {outputs['--spectra-output']}"))
    with output_locks(locks):
        return _run_locked(args, out, outputs, store)


def _run_locked(args: argparse.Namespace, out: Path, outputs: dict[str, Path], store: str | Path) -> int:
    """The part of :func:`run` that computes and writes, while the outputs are locked."""
    from osa_lab.arguments import one_line
    from osa_lab.errors import UnknownNameError

    try:
        # failed tasks are listed below, once; notes on the task store come after the tables
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("ignore", GridTaskFailedWarning)
            warnings.simplefilter("always", TaskStoreWarning)
            result = sweep(
                args.presets,
                args.depth,
                args.tokens,
                args.dim,
                args.heads,
                args.alpha,
                args.seeds,
                site=args.site,
                spectra=not args.no_spectra,
                batch=args.batch,
                dtype=DTYPES[args.dtype],
                cache_dir=store,
                allow_large=args.allow_large,
                jacobian=args.jacobian,
                grid=options_from_args(args, progress=not args.no_progress),
            )
    except (UnknownNameError, ConfigurationError) as exc:
        print(f"osa-lab sweep: error: {one_line(exc)}", file=sys.stderr)
        return 2
    tables = [(out, result.metrics)]
    if not args.no_spectra:
        tables.append((outputs["--spectra-output"], result.spectra))
    if args.jacobian != "none":
        tables.append((outputs["the Jacobian table"], result.jacobian))
    tables.append((outputs["the task table"], result.tasks))
    _write_tables(tables)
    for path, df in tables:
        print(f"wrote {path} ({len(df)} rows)")
    for note in caught:
        if issubclass(note.category, TaskStoreWarning):
            print(f"osa-lab sweep: warning: {one_line(note.message)}", file=sys.stderr)
        else:
            warnings.warn_explicit(note.message, note.category, note.filename, note.lineno)
    final = result.metrics[
        (result.metrics["layer"] == result.metrics["depth"]) & (result.metrics["site"] == "block")
    ]
    if len(final):
        table = final.groupby(["preset", "depth", "metric"])["value"].mean().unstack("metric")
        with pd.option_context("display.width", 160, "display.float_format", "{:.4g}".format):
            print("mean over seeds at the last layer:")
            print(table.to_string())
    failed = result.failures
    if len(failed):
        print(f"osa-lab sweep: {len(failed)} of {len(result.tasks)} tasks failed (the others finished; "
              f"see {outputs['the task table']}):", file=sys.stderr)  # fmt: skip
        for _, row in failed.iterrows():
            settings = " ".join(f"{k}={row[k]}" for k in ("kind", "preset", "depth", "tokens", "dim", "heads",
                                                            "alpha", "seed"))  # fmt: skip
            print(f"  {settings}: {row['error_type']}: {one_line(row['error'])}", file=sys.stderr)
        return 1
    return 0
