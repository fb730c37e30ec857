"""Jacobian κ across depth and of one OSA layer against α, N and d: the tables of the Jacobian study.

:func:`jacobian_depth_profile` (κ of ``∂X_l/∂X_0`` and of each block, :data:`KAPPA_COLUMNS`),
:func:`jacobian_singular_values` (every σ, :data:`SIGMA_COLUMNS`) and
:func:`osa_layer_conditioning` (the initialisation evidence of docs/initialisation.md). A study's
grid point is a :class:`~osa_lab.studies.settings.StudyPoint`, its computation settings a
:class:`JacobianSettings`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from osa_lab.errors import heads_do_not_divide, unknown_name
from osa_lab.nn.attention import OrthogonalSelfAttention, derived_alpha_init
from osa_lab.nn.models import Encoder, functional_mode
from osa_lab.nn.models.seeding import random_draws_from, seeded_generator
from osa_lab.studies.jacobian.estimates import (
    MAX_EXACT_DIM,
    SCOPES,
    check_algorithm,
    check_input_dim,
    check_size,
    resolve_algorithm,
    resolve_layers,
)
from osa_lab.studies.jacobian.krylov import LANCZOS_MAX_PRODUCTS
from osa_lab.studies.jacobian.monitor import JacobianProgress, ProgressCallback, SolveMonitor, StopHook
from osa_lab.studies.jacobian.solvers import (
    JacobianSpectrum,
    exact_jacobian,
    jacobian_spectrum,
    kappa_from_extremes,
    matrix_free_extremes,
)
from osa_lab.studies.settings import StudyPoint, as_list, as_point, seed_list

KAPPA_COLUMNS = [
    "preset",
    "depth",
    "tokens",
    "dim",
    "heads",
    "alpha",
    "seed",
    "layer",
    "scope",
    "algorithm",
    "sigma_max",
    "sigma_min",
    "kappa",
    "converged",
]
SIGMA_COLUMNS = [
    "preset",
    "depth",
    "tokens",
    "dim",
    "heads",
    "alpha",
    "seed",
    "scope",
    "layer",
    "algorithm",
    "index",
    "sigma",
]


# --------------------------------------------------------------------------------------
# Across depth
# --------------------------------------------------------------------------------------


def build_point(point: StudyPoint, dtype: torch.dtype = torch.float64) -> tuple[Encoder, torch.Tensor, dict]:
    """The model of ``point`` (eval mode, in ``dtype``), its input tokens X_0 ``(N, d)`` and the row
    keys of its tables (as :func:`osa_lab.studies.depth.depth_profile` builds them)."""
    model, _, keys = point.build(dtype)
    return model, point.inputs(1, dtype)[0], keys


@dataclass(frozen=True)
class JacobianSettings:
    """How a Jacobian study computes: the algorithm, which layers and scopes, and its limits
    (the keyword arguments of :func:`jacobian_depth_profile`)."""

    algorithm: str = "auto"
    layers: Sequence[int] | None = None
    scopes: Sequence[str] = SCOPES
    max_exact_dim: int = MAX_EXACT_DIM
    dtype: torch.dtype = torch.float64
    max_bytes: int | None = None
    solver: str = "lanczos"
    tol: float = 1e-6
    max_input_dim: int | None = None


def _layer_inputs(model: Encoder, x0: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        _, hidden = model(x0[None], return_hidden=True)
    return [h[0] for h in hidden.blocks]


def block_function(block: nn.Module) -> Callable:
    """Block ``block`` as a function of one sample ``(N, d)``."""
    return lambda z: block(z[None])[0]


def prefix_function(model: Encoder, layers: int) -> Callable:
    """The first ``layers`` blocks of ``model`` as a function of one sample ``(N, d)`` (``X_0 ↦ X_l``)."""
    return lambda z: model(z[None], layers=layers)[0]


def _progress_callback(progress: bool | ProgressCallback, bar) -> ProgressCallback | None:
    """``progress`` itself when callable; with ``True``, one that writes the products so far to ``bar``."""
    if callable(progress):
        return progress
    if progress is not True:
        return None

    def callback(p: JacobianProgress) -> None:
        est = "" if math.isnan(p.estimate) else f", σ_min ≈ {p.estimate:.3g}"
        bar.set_postfix_str(f"{p.task.split(': ', 1)[-1]}: {p.products} products{est}", refresh=True)

    return callback


def _exact_spectra(model: Encoder, inputs: list[torch.Tensor], wanted: list[int], how: JacobianSettings,
                   monitor: SolveMonitor, label: str):  # fmt: skip
    """Yield (scope, layer, JacobianSpectrum) from the exact per-block Jacobians ``J_l`` at the block
    inputs and their running product ``J_l ⋯ J_1`` (the chain rule, no extra network passes)."""
    n = inputs[0].numel()
    check_size(n, n, how.dtype, how.max_bytes)
    product = None
    for l in range(1, max(wanted) + 1):
        monitor.start(f"{label}: exact Jacobian of block {l}", l - 1, n)
        jl = exact_jacobian(
            block_function(model.blocks[l - 1]), inputs[l - 1], max_bytes=how.max_bytes, progress=monitor
        ).double()
        monitor.check()
        product = jl if product is None else jl @ product
        if l not in wanted:
            continue
        for scope in how.scopes:
            monitor.check()
            mat = product if scope == "end_to_end" else jl
            sigma = torch.linalg.svdvals(mat).numpy()
            smax, smin = float(sigma[0]), float(sigma[-1])
            spectrum = JacobianSpectrum(sigma, smax, smin, kappa_from_extremes(smax, smin), "exact", tuple(mat.shape),
                                        True, n)  # fmt: skip
            yield scope, l, spectrum


def _matrix_free_spectra(model: Encoder, x0: torch.Tensor, inputs: list[torch.Tensor], wanted: list[int],
                         how: JacobianSettings, monitor: SolveMonitor, label: str, seed: int):  # fmt: skip
    """Yield (scope, layer, JacobianSpectrum) from one matrix-free solve per layer and scope."""
    n = x0.numel()
    index = 0
    for l in wanted:
        for scope in how.scopes:
            if scope == "end_to_end":
                fn, at = prefix_function(model, l), x0
            else:
                fn, at = block_function(model.blocks[l - 1]), inputs[l - 1]
            budget = LANCZOS_MAX_PRODUCTS if how.solver == "lanczos" else 0
            monitor.start(f"{label}: layer {l} ({scope})", index, budget)
            smax, smin, converged = matrix_free_extremes(
                fn, at, solver=how.solver, tol=how.tol, seed=seed, return_converged=True,
                max_input_dim=how.max_input_dim, progress=monitor,
            )  # fmt: skip
            spectrum = JacobianSpectrum(np.array([smax, smin]), smax, smin, kappa_from_extremes(smax, smin),
                                        "matrix-free", (n, n), converged)  # fmt: skip
            yield scope, l, spectrum
            index += 1


def _depth_spectra(
    point: StudyPoint,
    how: JacobianSettings,
    progress: bool | ProgressCallback,
    should_stop: StopHook | None = None,
):
    """Yield (keys, scope, layer, JacobianSpectrum) for every requested layer and scope of ``point``."""
    from tqdm.auto import tqdm

    check_algorithm(how.algorithm)
    for s in how.scopes:
        if s not in SCOPES:
            raise unknown_name("scope", s, list(SCOPES))
    wanted = resolve_layers(how.layers, point.depth)
    n = point.tokens * point.dim
    if how.algorithm == "exact":
        check_size(n, n, how.dtype, how.max_bytes)
    model, x0, keys = build_point(point, how.dtype)
    attention = "osa" if getattr(getattr(model, "config", None), "attention", "osa") == "osa" else "ssa"
    resolved = resolve_algorithm(
        how.algorithm, point.tokens, point.dim, point.depth, keys["heads"] or 1, layers=wanted, scopes=how.scopes,
        attention=attention, max_exact_dim=how.max_exact_dim, max_bytes=how.max_bytes, dtype=how.dtype,
    )  # fmt: skip
    if resolved == "matrix-free":
        check_input_dim(n, how.max_input_dim)
    bar = tqdm(total=len(wanted) * len(how.scopes), desc=f"jacobian {point.preset}", disable=progress is not True,
               leave=False)  # fmt: skip
    tasks = max(wanted) if resolved == "exact" else len(wanted) * len(how.scopes)
    monitor = SolveMonitor(_progress_callback(progress, bar), should_stop, resolved, tasks=tasks)
    monitor.check()
    inputs = _layer_inputs(model, x0)  # the block inputs of the model as built (outside functional_mode)
    with functional_mode(model):
        if resolved == "exact":
            spectra = _exact_spectra(model, inputs, wanted, how, monitor, point.preset)
        else:
            spectra = _matrix_free_spectra(model, x0, inputs, wanted, how, monitor, point.preset, point.seed)
        for scope, layer, spectrum in spectra:
            yield keys, scope, layer, spectrum
            bar.update()
        monitor.start(f"{point.preset}: done", tasks, 1)
    bar.close()


def jacobian_depth_profile(
    preset: str | StudyPoint,
    depth: int | None = None,
    tokens: int | None = None,
    dim: int | None = None,
    heads: int | None = None,
    alpha: float | None = None,
    seed: int = 0,
    algorithm: str = "auto",
    *,
    layers: Sequence[int] | None = None,
    scopes: Sequence[str] = SCOPES,
    max_exact_dim: int = MAX_EXACT_DIM,
    dtype: torch.dtype = torch.float64,
    max_bytes: int | None = None,
    solver: str = "lanczos",
    tol: float = 1e-6,
    progress: bool | ProgressCallback = False,
    should_stop: StopHook | None = None,
    max_input_dim: int | None = None,
) -> pd.DataFrame:
    """κ across depth: of ``∂X_l/∂X_0`` (``scope="end_to_end"``) and of block l alone (``"layer"``).

    The study's grid point is a :class:`~osa_lab.studies.settings.StudyPoint` (or a preset name with
    ``depth``, ``tokens``, ``dim``, ``heads``, ``alpha``, ``seed``), built as in
    :func:`osa_lab.studies.depth.depth_profile` (weights and Gaussian input tokens from the seed). Exact: the per-block Jacobians ``J_l`` at the block inputs and their
    running product ``J_l ⋯ J_1`` (chain rule, no extra network passes). Matrix-free: one
    Lanczos (or ARPACK/lobpcg) solve per layer and scope (``layers`` selects which, default all).
    ``"auto"`` runs :func:`resolve_algorithm`'s choice; the ``algorithm`` column says which ran.

    ``progress``: True for a tqdm bar, or a callback receiving :class:`JacobianProgress`;
    ``should_stop``: cancel hook checked between products (raises
    :class:`~osa_lab.errors.ComputationCancelledError`); ``max_input_dim``: refuse larger inputs
    (default :data:`MAX_INPUT_DIM`) with :class:`JacobianTooLargeError`.

    Returns a DataFrame with columns :data:`KAPPA_COLUMNS`.
    """
    rows = []
    point = as_point(preset, depth, tokens, dim, heads, alpha, seed)
    how = JacobianSettings(
        algorithm, layers, scopes, max_exact_dim, dtype, max_bytes, solver, tol, max_input_dim
    )
    for keys, scope, layer, spec in _depth_spectra(point, how, progress, should_stop):
        rows.append(
            {
                **keys,
                "layer": layer,
                "scope": scope,
                "algorithm": spec.algorithm,
                "sigma_max": spec.sigma_max,
                "sigma_min": spec.sigma_min,
                "kappa": spec.kappa,
                "converged": spec.converged,
            }
        )
    return pd.DataFrame(rows, columns=KAPPA_COLUMNS)


def jacobian_singular_values(
    preset: str | StudyPoint,
    depth: int | None = None,
    tokens: int | None = None,
    dim: int | None = None,
    heads: int | None = None,
    alpha: float | None = None,
    seed: int = 0,
    algorithm: str = "auto",
    *,
    layers: Sequence[int] | None = None,
    scopes: Sequence[str] = ("end_to_end",),
    max_exact_dim: int = MAX_EXACT_DIM,
    dtype: torch.dtype = torch.float64,
    max_bytes: int | None = None,
    progress: bool | ProgressCallback = False,
    should_stop: StopHook | None = None,
    max_input_dim: int | None = None,
) -> pd.DataFrame:
    """Every singular value of the Jacobians (for histograms), one row each: :data:`SIGMA_COLUMNS`.

    With the exact algorithm all ``N·d`` singular values per layer; matrix-free gives only the two
    extremes (``index`` 0 and ``N·d − 1``). ``layers`` default: the last layer only.
    ``progress``, ``should_stop``, ``max_input_dim`` as in :func:`jacobian_depth_profile`.
    """
    point = as_point(preset, depth, tokens, dim, heads, alpha, seed)
    layers = [point.depth] if layers is None else layers
    parts = []
    how = JacobianSettings(
        algorithm, layers, scopes, max_exact_dim, dtype, max_bytes, max_input_dim=max_input_dim
    )
    for keys, scope, layer, spec in _depth_spectra(point, how, progress, should_stop):
        n = spec.shape[1]
        index = np.arange(len(spec.sigma)) if spec.algorithm == "exact" else np.array([0, n - 1])
        df = pd.DataFrame({"index": index, "sigma": spec.sigma})
        for k, v in keys.items():
            df[k] = v
        df["scope"], df["layer"], df["algorithm"] = scope, layer, spec.algorithm
        parts.append(df[SIGMA_COLUMNS])
    return pd.concat(parts, ignore_index=True)


# --------------------------------------------------------------------------------------
# The OSA layer against α, N and d (initialisation evidence, docs/initialisation.md)
# --------------------------------------------------------------------------------------


def osa_layer_conditioning(
    alphas: Sequence[float | str | None],
    tokens: Sequence[int],
    dims: Sequence[int],
    seeds: int | Sequence[int] = 3,
    *,
    heads: int | Sequence[int] = 1,
    algorithm: str = "auto",
    max_exact_dim: int = MAX_EXACT_DIM,
    dtype: torch.dtype = torch.float64,
    progress: ProgressCallback | None = None,
    should_stop: StopHook | None = None,
) -> pd.DataFrame:
    """κ of one OSA layer's Jacobian against α, N and d, at X ~ N(0, 1) tokens.

    The layer is :class:`~osa_lab.nn.attention.OrthogonalSelfAttention` with its default init
    (Gaussian W_Q, W_K of variance 1/d, orthogonal W_V, W_O) and ``tokens=N``; ``alphas``
    entries are floats or ``"derived"`` / ``None`` for the core's
    :func:`~osa_lab.nn.attention.derived_alpha_init` at that N, d. Seeds draw the weights and the input.

    Returns columns ``alpha, alpha_source ("given"|"derived"), alpha_over_derived, tokens, dim,
    heads, seed, algorithm, sigma_max, sigma_min, kappa, converged``. ``progress`` and
    ``should_stop`` are passed to every :func:`jacobian_spectrum` call.
    """
    seeds_l = seed_list(seeds)
    rows = []
    for n in as_list("tokens", tokens):
        for d in as_list("dims", dims):
            for h in as_list("heads", heads):
                if d % h:
                    raise heads_do_not_divide(d, h, dim_name="dims")
                derived = derived_alpha_init(n, d, d // h)
                for a in as_list("alphas", alphas):
                    source = "derived" if a is None or a == "derived" else "given"
                    value = derived if source == "derived" else float(a)
                    for s in seeds_l:
                        with random_draws_from(seeded_generator(s)):  # weights, then input, from seed s
                            layer = OrthogonalSelfAttention(d, h, alpha_init=value, tokens=n, dtype=dtype)
                            x = torch.randn(n, d, dtype=torch.float64).to(dtype)
                        spec = jacobian_spectrum(
                            layer, x, algorithm=algorithm, max_exact_dim=max_exact_dim, progress=progress,
                            should_stop=should_stop,
                        )  # fmt: skip
                        rows.append(
                            {
                                "alpha": value,
                                "alpha_source": source,
                                "alpha_over_derived": value / derived,
                                "tokens": n,
                                "dim": d,
                                "heads": h,
                                "seed": s,
                                "algorithm": spec.algorithm,
                                "sigma_max": spec.sigma_max,
                                "sigma_min": spec.sigma_min,
                                "kappa": spec.kappa,
                                "converged": spec.converged,
                            }
                        )
    return pd.DataFrame(rows)
