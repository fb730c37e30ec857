"""Input–output Jacobians of layers, blocks and networks: singular values and condition numbers.

Implements the Jacobian-conditioning row of DESIGN.md §4 (Ji et al. 2025, *Cutting the Skip*,
arXiv 2510.00345, who measure κ of ``∂X_l/∂X_0``) and the OSA initialisation evidence of
DESIGN.md §3 (Zhang & Martens 2026, arXiv 2602.05996: the OSA layer's Jacobian is
well-conditioned at the right α).

Two methods, one interface (:func:`jacobian_spectrum`):

``"exact"``
    the full Jacobian by ``torch.func.jacrev`` (reverse mode, ``chunk_size`` rows at a time so
    memory stays bounded) and all its singular values (``torch.linalg.svdvals``, float64).
    Needs ``n_out · n_in`` numbers; refused with :class:`JacobianTooLargeError` (which says how
    many bytes it would need) above ``max_bytes``.
``"matrix-free"``
    only the extreme singular values, from Jacobian–vector products: ``J v`` by
    ``torch.func.jvp`` and ``Jᵀ u`` by ``torch.func.vjp``, wrapped as
    ``scipy.sparse.linalg.LinearOperator`` s. σ_max by ``svds(J, k=1)`` (ARPACK), σ_min from the
    smallest eigenvalue of ``JᵀJ`` by ``eigsh(which="SA")`` (or both ends by ``lobpcg``). Memory is
    a few copies of the input; σ_min is resolved only down to about ``√eps · σ_max`` (the normal
    matrix squares κ), so κ beyond ~1e7 is reported as a lower bound or ``inf``.
``"auto"``
    exact when the input has at most ``max_exact_dim`` entries, else matrix-free.

Models run under :func:`osa_lab.models.functional_mode` (OSA by the ``"qr"`` method, SSA by an
explicit softmax) because the fast OSA engine and SDPA do not support ``torch.func`` transforms;
the function computed is the same.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from osa_lab.errors import ConfigurationError, OSAInputError, SolverNotConvergedWarning, unknown_name
from osa_lab.layers import OrthogonalSelfAttention, derived_alpha_init
from osa_lab.models import Encoder, build_model, functional_mode

METHODS = ("auto", "exact", "matrix-free")
SOLVERS = ("arpack", "lobpcg")
SCOPES = ("end_to_end", "layer")
#: Krylov subspace size for ARPACK: larger than scipy's default (20), because Jacobians at a
#: good init have clustered singular values near 1, where small subspaces converge slowly.
ARPACK_NCV = 64
#: ARPACK restarts before giving up (σ_min of an ill-conditioned J then comes back NaN).
ARPACK_MAXITER = 50
#: Inputs up to this many entries get the exact Jacobian under method="auto".
MAX_EXACT_DIM = 2048
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
    "method",
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
    "method",
    "index",
    "sigma",
]


class JacobianTooLargeError(ConfigurationError):
    """The exact Jacobian would not fit in memory; the message gives its size and the alternative."""


def default_max_bytes() -> int:
    """Byte budget for one exact Jacobian: a quarter of physical memory, at most 4 GiB."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        phys = 16 * 2**30
    return int(min(phys // 4, 4 * 2**30))


@dataclass
class JacobianSpectrum:
    """Singular values of a Jacobian (all of them for ``method="exact"``, the two extremes otherwise)."""

    sigma: np.ndarray
    sigma_max: float
    sigma_min: float
    kappa: float
    method: str
    shape: tuple[int, int]
    #: False when the matrix-free solver stopped before converging: then ``sigma_min`` is an
    #: upper bound (partial Ritz value) and ``kappa`` a lower bound.
    converged: bool = True


def _kappa(smax: float, smin: float) -> float:
    if smin > 0:
        return smax / smin
    return math.inf if smax > 0 else math.nan


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise unknown_name("method", method, list(METHODS))


def _check_size(n_out: int, n_in: int, dtype: torch.dtype, max_bytes: int | None) -> None:
    limit = default_max_bytes() if max_bytes is None else max_bytes
    itemsize = torch.finfo(dtype).bits // 8
    need = n_out * n_in * itemsize
    if need > limit:
        raise JacobianTooLargeError(
            f"the exact Jacobian is {n_out} × {n_in} {str(dtype).removeprefix('torch.')} = {need / 2**30:.2f} GiB "
            f"(and about as much again for its SVD), over the limit of {limit / 2**30:.2f} GiB (`max_bytes`); "
            "use method='matrix-free' (extreme singular values from jvp/vjp products, memory linear in the "
            "input) or method='auto'"
        )


def _as_function(fn_or_model: Callable | nn.Module, x: torch.Tensor) -> tuple[Callable, torch.Tensor]:
    """A function of one sample; a module gets a batch dim of 1 added (and removed)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise OSAInputError(f"`x` must be a floating-point tensor, got {type(x).__name__}")
    if isinstance(fn_or_model, nn.Module):
        module = fn_or_model
        if x.dim() == 3:
            if x.shape[0] != 1:
                raise OSAInputError(f"`x` has shape {tuple(x.shape)}; give one sample (N, d) or (1, N, d)")
            x = x[0]
        if x.dim() != 2:
            raise OSAInputError(f"`x` has shape {tuple(x.shape)}; a model's Jacobian needs one sample (N, d)")

        def fn(z: torch.Tensor) -> torch.Tensor:
            return module(z[None])[0]

        return fn, x
    if not callable(fn_or_model):
        raise ConfigurationError(
            f"`fn_or_model` must be a callable or an nn.Module, got {type(fn_or_model).__name__}"
        )
    return fn_or_model, x


def exact_jacobian(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    *,
    chunk_size: int | None = 256,
    max_bytes: int | None = None,
) -> torch.Tensor:
    """The Jacobian of ``fn`` at ``x`` as an ``(fn(x).numel(), x.numel())`` matrix by ``torch.func.jacrev``.

    ``chunk_size`` rows are computed per vectorised backward pass (memory ≈ chunk_size forward
    activations). Raises :class:`JacobianTooLargeError` above ``max_bytes``.
    """
    x = x.detach()
    with torch.no_grad():
        y = fn(x)
    _check_size(y.numel(), x.numel(), x.dtype, max_bytes)
    flat = lambda z: fn(z.reshape(x.shape)).reshape(-1)  # noqa: E731
    jac = torch.func.jacrev(flat, chunk_size=chunk_size)(x.reshape(-1))
    return jac.detach()


def _operators(fn: Callable, x: torch.Tensor):
    from scipy.sparse.linalg import LinearOperator

    x = x.detach()
    y, vjp_fn = torch.func.vjp(fn, x)
    n_in, n_out = x.numel(), y.numel()
    np_dtype = np.float64 if x.dtype == torch.float64 else np.float32

    def matvec(v: np.ndarray) -> np.ndarray:
        t = torch.as_tensor(np.ascontiguousarray(v, dtype=np_dtype)).reshape(x.shape)
        _, jv = torch.func.jvp(fn, (x,), (t,))
        return jv.detach().reshape(-1).numpy().astype(np.float64)

    def rmatvec(u: np.ndarray) -> np.ndarray:
        t = torch.as_tensor(np.ascontiguousarray(u, dtype=np_dtype)).reshape(y.shape)
        (g,) = vjp_fn(t)
        return g.detach().reshape(-1).numpy().astype(np.float64)

    jac = LinearOperator((n_out, n_in), matvec=matvec, rmatvec=rmatvec, dtype=np.float64)
    normal = LinearOperator((n_in, n_in), matvec=lambda v: rmatvec(matvec(v)), dtype=np.float64)
    return jac, normal


def matrix_free_extremes(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    *,
    solver: str = "arpack",
    tol: float = 1e-6,
    maxiter: int | None = None,
    seed: int = 0,
    return_converged: bool = False,
) -> tuple[float, float] | tuple[float, float, bool]:
    """``(σ_max, σ_min)`` of the Jacobian of ``fn`` at ``x`` from jvp/vjp products only.

    ``solver="arpack"``: ``scipy.sparse.linalg.svds(J, k=1)`` for σ_max and
    ``eigsh(JᵀJ, k=1, which="SA")`` for σ_min. ``solver="lobpcg"``: ``lobpcg`` on ``JᵀJ`` for both.
    When the σ_min solve does not converge (κ beyond ≈ 1e7: the normal matrix squares κ), σ_min
    is the smallest partial Ritz value — an upper bound, so κ is a lower bound — and a
    :class:`~osa_lab.errors.SolverNotConvergedWarning` says so; ``return_converged=True``
    returns ``(σ_max, σ_min, converged)`` instead of warning.
    """
    from scipy.sparse.linalg import ArpackNoConvergence, eigsh, lobpcg, svds

    if solver not in SOLVERS:
        raise unknown_name("solver", solver, list(SOLVERS))
    jac, normal = _operators(fn, x)
    n = normal.shape[0]
    rng = np.random.default_rng(seed)
    converged = True
    if n <= 2:  # ARPACK needs k < n; such tiny problems are exact anyway.
        dense = np.stack([jac.matvec(e) for e in np.eye(n)], axis=1)
        s = np.linalg.svd(dense, compute_uv=False)
        smax, smin = float(s[0]), float(s[-1])
    elif solver == "arpack":
        ncv = min(n - 1, ARPACK_NCV)
        v0 = rng.standard_normal(min(jac.shape))
        s = svds(
            jac, k=1, which="LM", tol=tol, maxiter=maxiter or ARPACK_MAXITER, v0=v0, ncv=min(min(jac.shape) - 1, ncv),
            solver="arpack", return_singular_vectors=False,
        )  # fmt: skip
        smax = float(s[0])
        try:
            lam = eigsh(
                normal, k=1, which="SA", tol=tol, maxiter=maxiter or ARPACK_MAXITER, ncv=ncv,
                v0=rng.standard_normal(n), return_eigenvectors=False,
            )  # fmt: skip
            smin = math.sqrt(max(float(lam[0]), 0.0))
        except ArpackNoConvergence as exc:
            # Ill-conditioned J: the smallest eigenvalue of JᵀJ is below ARPACK's resolution.
            found = np.asarray(exc.eigenvalues, dtype=float)
            smin = math.sqrt(max(float(found.min()), 0.0)) if found.size else math.nan
            converged = False
    else:
        block = rng.standard_normal((n, 2))
        iters = maxiter or 500
        lam_max = lobpcg(normal, block, largest=True, tol=tol, maxiter=iters)[0]
        lam_min = lobpcg(normal, rng.standard_normal((n, 2)), largest=False, tol=tol, maxiter=iters)[0]
        smax = math.sqrt(max(float(np.max(lam_max)), 0.0))
        smin = math.sqrt(max(float(np.min(lam_min)), 0.0))
    if return_converged:
        return smax, smin, converged
    if not converged:
        found = f"σ_min ≤ {smin:.3g} is an upper bound and κ ≥ {_kappa(smax, smin):.3g} a lower bound"
        if math.isnan(smin):
            found = "no Ritz value converged, σ_min and κ are unknown (NaN)"
        warnings.warn(
            f"matrix-free σ_min did not converge (ARPACK, tol={tol:g}): {found}; raise maxiter, use the exact "
            "method for small inputs, or read κ as a bound",
            SolverNotConvergedWarning,
            stacklevel=2,
        )
    return smax, smin


def jacobian_spectrum(
    fn_or_model: Callable | nn.Module,
    x: torch.Tensor,
    method: str = "auto",
    max_exact_dim: int = MAX_EXACT_DIM,
    *,
    chunk_size: int | None = 256,
    max_bytes: int | None = None,
    solver: str = "arpack",
    tol: float = 1e-6,
) -> JacobianSpectrum:
    """Singular values and κ of the Jacobian of ``fn_or_model`` at ``x`` (see module docstring).

    Args:
        fn_or_model: a function of one tensor, or an ``nn.Module`` taking ``(1, N, d)`` (then
            ``x`` is one sample ``(N, d)`` or ``(1, N, d)`` and the module runs in
            :func:`~osa_lab.models.functional_mode`).
        x: the point at which the Jacobian is taken.
        method: ``"auto"``, ``"exact"`` or ``"matrix-free"``.
        max_exact_dim: largest input size that ``"auto"`` computes exactly.
    """
    _check_method(method)
    fn, x = _as_function(fn_or_model, x)
    resolved = method
    if method == "auto":
        resolved = "exact" if x.numel() <= max_exact_dim else "matrix-free"
    module = fn_or_model if isinstance(fn_or_model, nn.Module) else None
    with functional_mode(module) if module is not None else contextlib.nullcontext():
        if resolved == "exact":
            jac = exact_jacobian(fn, x, chunk_size=chunk_size, max_bytes=max_bytes)
            sigma = torch.linalg.svdvals(jac.double()).numpy()
            shape = tuple(jac.shape)
            smax, smin, converged = float(sigma[0]), float(sigma[-1]), True
        else:
            smax, smin, converged = matrix_free_extremes(fn, x, solver=solver, tol=tol, return_converged=True)
            sigma = np.array([smax, smin])
            with torch.no_grad():
                shape = (fn(x).numel(), x.numel())
    return JacobianSpectrum(sigma, smax, smin, _kappa(smax, smin), resolved, shape, converged)


# --------------------------------------------------------------------------------------
# Across depth
# --------------------------------------------------------------------------------------


def _build(preset: str, depth: int, tokens: int, dim: int, heads, alpha, seed: int, dtype):
    from osa_lab.analysis import _alpha_of, _gaussian_tokens, config_for

    config = config_for(preset, depth=depth, tokens=tokens, dim=dim, heads=heads, alpha=alpha, seed=seed)
    model = build_model(config, dtype=dtype).eval()
    x0 = _gaussian_tokens(1, tokens, dim, seed, dtype)[0]
    keys = {
        "preset": preset,
        "depth": depth,
        "tokens": tokens,
        "dim": dim,
        "heads": config.heads,
        "alpha": _alpha_of(model, config),
        "seed": seed,
    }
    return model, x0, keys


def _layer_inputs(model: Encoder, x0: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        _, hidden = model(x0[None], return_hidden=True)
    return [h[0] for h in hidden.blocks]


def _block_fn(block: nn.Module) -> Callable:
    return lambda z: block(z[None])[0]


def _prefix_fn(model: Encoder, layers: int) -> Callable:
    return lambda z: model(z[None], layers=layers)[0]


def _resolve_layers(layers: Sequence[int] | None, depth: int) -> list[int]:
    if layers is None:
        return list(range(1, depth + 1))
    out = sorted(set(int(l) for l in layers))
    if not out or out[0] < 1 or out[-1] > depth:
        raise ConfigurationError(f"`layers`={list(layers)} must lie in 1..depth={depth}")
    return out


def _depth_spectra(
    preset: str,
    depth: int,
    tokens: int,
    dim: int,
    heads,
    alpha,
    seed: int,
    method: str,
    layers,
    scopes,
    max_exact_dim: int,
    dtype,
    max_bytes,
    solver: str,
    tol: float,
    progress: bool,
):
    """Yield (keys, scope, layer, JacobianSpectrum) for every requested layer and scope."""
    from tqdm.auto import tqdm

    _check_method(method)
    for s in scopes:
        if s not in SCOPES:
            raise unknown_name("scope", s, list(SCOPES))
    model, x0, keys = _build(preset, depth, tokens, dim, heads, alpha, seed, dtype)
    n = x0.numel()
    resolved = method if method != "auto" else ("exact" if n <= max_exact_dim else "matrix-free")
    wanted = _resolve_layers(layers, depth)
    inputs = _layer_inputs(model, x0)
    bar = tqdm(total=len(wanted) * len(scopes), desc=f"jacobian {preset}", disable=not progress, leave=False)
    with functional_mode(model):
        if resolved == "exact":
            _check_size(n, n, dtype, max_bytes)
            product = None
            for l in range(1, max(wanted) + 1):
                jl = exact_jacobian(
                    _block_fn(model.blocks[l - 1]), inputs[l - 1], max_bytes=max_bytes
                ).double()
                product = jl if product is None else jl @ product
                if l not in wanted:
                    continue
                for scope in scopes:
                    mat = product if scope == "end_to_end" else jl
                    sigma = torch.linalg.svdvals(mat).numpy()
                    smax, smin = float(sigma[0]), float(sigma[-1])
                    yield (
                        keys,
                        scope,
                        l,
                        JacobianSpectrum(sigma, smax, smin, _kappa(smax, smin), "exact", tuple(mat.shape)),
                    )
                    bar.update()
        else:
            for l in wanted:
                for scope in scopes:
                    if scope == "end_to_end":
                        fn, at = _prefix_fn(model, l), x0
                    else:
                        fn, at = _block_fn(model.blocks[l - 1]), inputs[l - 1]
                    smax, smin, converged = matrix_free_extremes(
                        fn, at, solver=solver, tol=tol, seed=seed, return_converged=True
                    )
                    yield (
                        keys,
                        scope,
                        l,
                        JacobianSpectrum(
                            np.array([smax, smin]), smax, smin, _kappa(smax, smin), "matrix-free", (n, n), converged
                        ),
                    )
                    bar.update()
    bar.close()


def jacobian_depth_profile(
    preset: str,
    depth: int,
    tokens: int,
    dim: int,
    heads: int | None = None,
    alpha: float | None = None,
    seed: int = 0,
    method: str = "auto",
    *,
    layers: Sequence[int] | None = None,
    scopes: Sequence[str] = SCOPES,
    max_exact_dim: int = MAX_EXACT_DIM,
    dtype: torch.dtype = torch.float64,
    max_bytes: int | None = None,
    solver: str = "arpack",
    tol: float = 1e-6,
    progress: bool = False,
) -> pd.DataFrame:
    """κ across depth: of ``∂X_l/∂X_0`` (``scope="end_to_end"``) and of block l alone (``"layer"``).

    The preset is built as in :func:`osa_lab.analysis.depth_profile` (weights and Gaussian input
    tokens from ``seed``). Exact: the per-block Jacobians ``J_l`` at the block inputs and their
    running product ``J_l ⋯ J_1`` (chain rule, no extra network passes). Matrix-free: one
    ARPACK/lobpcg solve per layer and scope (``layers`` selects which, default all).

    Returns a DataFrame with columns :data:`KAPPA_COLUMNS`.
    """
    rows = []
    for keys, scope, layer, spec in _depth_spectra(
        preset, depth, tokens, dim, heads, alpha, seed, method, layers, scopes, max_exact_dim, dtype, max_bytes,
        solver, tol, progress,
    ):  # fmt: skip
        rows.append(
            {
                **keys,
                "layer": layer,
                "scope": scope,
                "method": spec.method,
                "sigma_max": spec.sigma_max,
                "sigma_min": spec.sigma_min,
                "kappa": spec.kappa,
                "converged": spec.converged,
            }
        )
    return pd.DataFrame(rows, columns=KAPPA_COLUMNS)


def jacobian_singular_values(
    preset: str,
    depth: int,
    tokens: int,
    dim: int,
    heads: int | None = None,
    alpha: float | None = None,
    seed: int = 0,
    method: str = "auto",
    *,
    layers: Sequence[int] | None = None,
    scopes: Sequence[str] = ("end_to_end",),
    max_exact_dim: int = MAX_EXACT_DIM,
    dtype: torch.dtype = torch.float64,
    max_bytes: int | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Every singular value of the Jacobians (for histograms), one row each: :data:`SIGMA_COLUMNS`.

    With the exact method all ``N·d`` singular values per layer; matrix-free gives only the two
    extremes (``index`` 0 and ``N·d − 1``). ``layers`` default: the last layer only.
    """
    layers = [depth] if layers is None else layers
    parts = []
    for keys, scope, layer, spec in _depth_spectra(
        preset, depth, tokens, dim, heads, alpha, seed, method, layers, scopes, max_exact_dim, dtype, max_bytes,
        "arpack", 1e-6, progress,
    ):  # fmt: skip
        n = spec.shape[1]
        index = np.arange(len(spec.sigma)) if spec.method == "exact" else np.array([0, n - 1])
        df = pd.DataFrame({"index": index, "sigma": spec.sigma})
        for k, v in keys.items():
            df[k] = v
        df["scope"], df["layer"], df["method"] = scope, layer, spec.method
        parts.append(df[SIGMA_COLUMNS])
    return pd.concat(parts, ignore_index=True)


# --------------------------------------------------------------------------------------
# The OSA layer against α, N and d (initialisation evidence, DESIGN.md §3)
# --------------------------------------------------------------------------------------


def osa_layer_conditioning(
    alphas: Sequence[float | str | None],
    tokens: Sequence[int],
    dims: Sequence[int],
    seeds: int | Sequence[int] = 3,
    *,
    heads: int | Sequence[int] = 1,
    method: str = "auto",
    max_exact_dim: int = MAX_EXACT_DIM,
    dtype: torch.dtype = torch.float64,
) -> pd.DataFrame:
    """κ of one OSA layer's Jacobian against α, N and d, at X ~ N(0, 1) tokens.

    The layer is :class:`~osa_lab.layers.OrthogonalSelfAttention` with its default init
    (Gaussian W_Q, W_K of variance 1/d, orthogonal W_V, W_O) and ``tokens=N``; ``alphas``
    entries are floats or ``"derived"`` / ``None`` for the core's
    :func:`~osa_lab.layers.derived_alpha_init` at that N, d. Seeds draw the weights and the input.

    Returns columns ``alpha, alpha_source ("given"|"derived"), alpha_over_derived, tokens, dim,
    heads, seed, method, sigma_max, sigma_min, kappa``.
    """
    from osa_lab.analysis import _as_list, _seed_list

    seeds_l = _seed_list(seeds)
    rows = []
    for n in _as_list("tokens", tokens):
        for d in _as_list("dims", dims):
            for h in _as_list("heads", heads):
                if d % h:
                    raise ConfigurationError(f"`dims` value {d} is not divisible by `heads`={h}")
                derived = derived_alpha_init(n, d, d // h)
                for a in _as_list("alphas", alphas):
                    source = "derived" if a is None or a == "derived" else "given"
                    value = derived if source == "derived" else float(a)
                    for s in seeds_l:
                        gen = torch.random.fork_rng(devices=[])
                        with gen:
                            torch.manual_seed(s)
                            with _default_dtype(dtype):
                                layer = OrthogonalSelfAttention(d, h, alpha_init=value, tokens=n)
                            x = torch.randn(n, d, dtype=torch.float64).to(dtype)
                        spec = jacobian_spectrum(layer, x, method=method, max_exact_dim=max_exact_dim)
                        rows.append(
                            {
                                "alpha": value,
                                "alpha_source": source,
                                "alpha_over_derived": value / derived,
                                "tokens": n,
                                "dim": d,
                                "heads": h,
                                "seed": s,
                                "method": spec.method,
                                "sigma_max": spec.sigma_max,
                                "sigma_min": spec.sigma_min,
                                "kappa": spec.kappa,
                            }
                        )
    return pd.DataFrame(rows)


def _default_dtype(dtype: torch.dtype):
    from osa_lab.models import _default_dtype as ctx

    return ctx(dtype)
