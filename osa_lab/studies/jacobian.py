"""Input–output Jacobians of layers, blocks and networks: singular values and condition numbers.

Implements the Jacobian-conditioning analysis of docs/analysis.md (Ji et al. 2025, *Cutting the Skip*,
arXiv 2510.00345, who measure κ of ``∂X_l/∂X_0``) and the OSA initialisation evidence of
docs/initialisation.md (Zhang & Martens 2026, arXiv 2602.05996: the OSA layer's Jacobian is
well-conditioned at the right α).

Two methods, one interface (:func:`jacobian_spectrum`):

``"exact"``
    the full Jacobian by ``torch.func.jacrev`` (reverse mode, ``chunk_size`` rows at a time so
    memory stays bounded) and all its singular values (``torch.linalg.svdvals``, float64).
    Needs ``n_out · n_in`` numbers; refused with :class:`JacobianTooLargeError` (which says how
    many bytes it would need) above ``max_bytes``.
``"matrix-free"``
    only the extreme singular values, from Jacobian–vector products: ``Jᵀ u`` by
    ``torch.func.vjp`` and ``J v`` as the transpose of that linear map (a vjp of the vjp, 5–6×
    cheaper than ``torch.func.jvp`` through the OSA layer's QR path). The default solver
    ``"lanczos"`` is Golub–Kahan–Lanczos bidiagonalisation of ``J`` itself (never the normal
    matrix ``JᵀJ``, so σ_min keeps its accuracy down to ≈ eps·σ_max) with full
    reorthogonalisation and thick restarts that keep the smallest Ritz triplets and the largest
    one (which deflates the top of the spectrum; Baglama & Reichel 2005, SIAM J. Sci. Comput.
    27:19–42). Converged means the residual bound ``‖Jᵀu − σv‖ ≤ tol·σ`` holds for both ends, which
    bounds the relative error of each σ by ``tol``. ``"arpack"`` (``svds``/``eigsh`` on ``JᵀJ``)
    and ``"lobpcg"`` remain as alternatives. A σ_min that did not converge is NaN with
    ``converged=False`` (κ NaN: unknown, never ``inf``). Memory is ``ncv + 1`` copies of the
    input and ``ncv`` of the output.
``"auto"``
    the cheaper of the two by :func:`estimate_jacobian_seconds` (a cost model fitted to timings
    on the development machine), exact only when it also fits ``max_bytes``.

Long calls take ``progress`` (a callback receiving :class:`JacobianProgress`) and
``should_stop`` (checked between products; returning True raises
:class:`~osa_lab.errors.ComputationCancelledError`). Inputs above ``max_input_dim`` entries are
refused with :class:`JacobianTooLargeError` naming the override.

Models run under :func:`osa_lab.nn.models.functional_mode` (OSA by the ``"qr"`` method, SSA by an
explicit softmax) because the fast OSA engine and SDPA do not support ``torch.func`` transforms;
the function computed is the same.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from osa_lab.errors import (
    ComputationCancelledError,
    ConfigurationError,
    JacobianTooLargeError,
    OSAInputError,
    SolverNotConvergedWarning,
    heads_do_not_divide,
    unknown_name,
)
from osa_lab.nn.attention import OrthogonalSelfAttention, derived_alpha_init
from osa_lab.nn.models import Encoder, functional_mode
from osa_lab.studies.settings import StudyPoint, as_list, seed_list

JACOBIAN_METHODS = ("auto", "exact", "matrix-free")
SOLVERS = ("lanczos", "arpack", "lobpcg")
SCOPES = ("end_to_end", "layer")
#: Krylov subspace size for ARPACK: larger than scipy's default (20), because Jacobians at a
#: good init have clustered singular values near 1, where small subspaces converge slowly.
ARPACK_NCV = 64
#: ARPACK restarts before giving up (σ_min of an ill-conditioned J then comes back NaN).
ARPACK_MAXITER = 50
#: Largest Lanczos basis (vectors per side) of the default solver; the basis also stays under
#: :data:`LANCZOS_BASIS_BYTES`. A basis as large as the input is a full (unrestarted) Krylov space.
LANCZOS_NCV = 1024
#: Memory for the Lanczos bases (both sides, float64).
LANCZOS_BASIS_BYTES = 512 * 2**20
#: Jacobian products of one Lanczos solve before it reports non-convergence (NaN,
#: converged=False) unless ``max_products`` says otherwise. Restarted solves of the issue's
#: ill-conditioned layers with a 32-vector basis needed ≈ 3,700 (κ 1,000–3,100, N·d 144–256).
LANCZOS_MAX_PRODUCTS = 8000
#: Share of the basis kept (smallest Ritz triplets) at a thick restart.
LANCZOS_KEEP = 0.5
#: Inputs up to this many entries get the exact Jacobian under method="auto" (when the cost
#: model also prefers it).
MAX_EXACT_DIM = 2048
#: Largest input (N·d entries) the Jacobian functions accept unless ``max_input_dim`` is raised:
#: N = 256, d = 256. Above it a single matrix-free solve takes tens of minutes on a CPU.
MAX_INPUT_DIM = 65536
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


@dataclass(frozen=True)
class JacobianProgress:
    """What a long Jacobian computation reports to its ``progress`` callback.

    ``task_index`` of ``tasks`` (layer × scope solves, or blocks of an exact profile) is under
    way; ``products`` of at most ``max_products`` Jacobian products (rows for the exact method)
    of that task are done; ``estimate`` is the current σ_min estimate (NaN when none yet).
    """

    method: str
    task: str
    task_index: int
    tasks: int
    products: int
    max_products: int
    estimate: float = math.nan

    @property
    def fraction(self) -> float:
        """Share of the whole call done, in [0, 1] (the product budget is an upper bound, so it
        is a lower estimate while a solve runs)."""
        inner = min(self.products / self.max_products, 1.0) if self.max_products > 0 else 0.0
        return min((self.task_index + inner) / max(self.tasks, 1), 1.0)


ProgressCallback = Callable[[JacobianProgress], None]
StopHook = Callable[[], bool]


class _Monitor:
    """Checks ``should_stop`` on every product and calls ``progress`` at most every 0.2 s."""

    def __init__(self, progress: ProgressCallback | None, should_stop: StopHook | None, method: str,
                 tasks: int = 1, interval: float = 0.2) -> None:  # fmt: skip
        self.progress, self.should_stop, self.method = progress, should_stop, method
        self.tasks, self.interval = tasks, interval
        self.task, self.task_index, self.max_products, self.last, self.products = "", 0, 1, 0.0, 0

    def start(self, task: str, task_index: int, max_products: int) -> None:
        self.task, self.task_index, self.max_products = task, task_index, max(int(max_products), 1)
        self.check()
        self.report(0, force=True)

    def check(self) -> None:
        if self.should_stop is not None and self.should_stop():
            raise ComputationCancelledError(
                f"Jacobian computation cancelled by its should_stop hook during {self.task or 'setup'}"
            )

    def report(self, products: int, estimate: float = math.nan, force: bool = False) -> None:
        self.products = products
        if self.progress is None:
            return
        now = time.monotonic()
        if force or now - self.last >= self.interval:
            self.last = now
            self.progress(
                JacobianProgress(self.method, self.task, self.task_index, self.tasks, products, self.max_products,
                                 estimate)
            )  # fmt: skip

    def tick(self, products: int, estimate: float = math.nan) -> None:
        self.check()
        self.report(products, estimate)


def default_max_bytes() -> int:
    """Byte budget for one exact Jacobian: a quarter of physical memory, at most 4 GiB."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        phys = 16 * 2**30
    return int(min(phys // 4, 4 * 2**30))


@dataclass
class JacobianSpectrum:
    """Singular values of a Jacobian (all of them for ``method="exact"``, the two extremes otherwise).

    ``method`` is the method that ran (``"auto"`` resolved), so results can be cached under it.
    """

    sigma: np.ndarray
    sigma_max: float
    sigma_min: float
    kappa: float
    method: str
    shape: tuple[int, int]
    #: False when the matrix-free solver stopped before converging: then ``sigma_min`` and
    #: ``kappa`` are NaN (unknown).
    converged: bool = True
    #: Jacobian products (matrix-free) or rows (exact) computed.
    products: int = 0


def kappa_from_extremes(smax: float, smin: float) -> float:
    """σ_max/σ_min; ∞ only for an exactly singular converged J, NaN when either end is unknown."""
    if math.isnan(smax) or math.isnan(smin):
        return math.nan
    if smin > 0:
        return smax / smin
    return math.inf if smax > 0 else math.nan


def check_method(method: str) -> None:
    """Raise :class:`~osa_lab.errors.UnknownNameError` unless ``method`` is one of :data:`JACOBIAN_METHODS`."""
    if method not in JACOBIAN_METHODS:
        raise unknown_name("method", method, list(JACOBIAN_METHODS))


def check_size(n_out: int, n_in: int, dtype: torch.dtype, max_bytes: int | None) -> None:
    """Raise :class:`JacobianTooLargeError` when a dense ``n_out × n_in`` Jacobian in ``dtype`` would exceed ``max_bytes``."""
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


def _check_input_dim(n: int, max_input_dim: int | None) -> None:
    limit = MAX_INPUT_DIM if max_input_dim is None else int(max_input_dim)
    if n > limit:
        raise JacobianTooLargeError(
            f"the input has {n} entries (N·d), over the limit of {limit} (`max_input_dim`): one Jacobian solve "
            f"would take about {_fmt_seconds(_mf_products(n) * _product_seconds(n, 1))} per layer on a CPU; "
            f"pass max_input_dim={n} (or larger) to run it anyway, or use fewer tokens or a smaller dim"
        )


def _fmt_seconds(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _check_positive(name: str, value: float | None) -> None:
    if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ConfigurationError(f"`{name}` must be a positive finite number, got {value!r}")


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
    progress: ProgressCallback | None = None,
    should_stop: StopHook | None = None,
) -> torch.Tensor:
    """The Jacobian of ``fn`` at ``x`` as an ``(fn(x).numel(), x.numel())`` matrix, by reverse mode.

    ``chunk_size`` rows are computed per vectorised backward pass (``torch.func.vmap`` over the
    vjp, as ``torch.func.jacrev`` does; memory ≈ chunk_size forward activations); ``should_stop``
    is checked and ``progress`` called between chunks. Raises :class:`JacobianTooLargeError`
    above ``max_bytes``.
    """
    x = x.detach()
    monitor = progress if isinstance(progress, _Monitor) else _Monitor(progress, should_stop, "exact")
    y, vjp_fn = torch.func.vjp(fn, x)
    n_out = y.numel()
    check_size(n_out, x.numel(), x.dtype, max_bytes)
    if monitor.task == "":
        monitor.start("exact Jacobian", 0, n_out)
    step = n_out if chunk_size is None else max(int(chunk_size), 1)
    rows = torch.func.vmap(lambda u: vjp_fn(u.reshape(y.shape))[0].reshape(-1))
    parts = []
    for start in range(0, n_out, step):
        monitor.check()
        k = min(step, n_out - start)
        basis = torch.zeros(k, n_out, dtype=y.dtype, device=y.device)
        basis[torch.arange(k), torch.arange(start, start + k)] = 1.0
        parts.append(rows(basis).detach())
        monitor.report(start + k)
    return torch.cat(parts, dim=0) if parts else torch.zeros(0, x.numel(), dtype=x.dtype)


def _operators(fn: Callable, x: torch.Tensor):
    """``(matvec, rmatvec, n_in, n_out)`` of the Jacobian at ``x`` on flat float64 torch vectors.

    ``rmatvec`` is ``torch.func.vjp``; ``matvec`` is the vjp of that (linear) map, i.e. its
    transpose: the same ``J v`` as ``torch.func.jvp`` to rounding, 5–6× faster through the OSA
    layer's QR path (measured at N = d = 16 and 24: 5–6 ms against 32–38 ms).
    """
    x = x.detach()
    y, vjp_fn = torch.func.vjp(fn, x)
    _, transposed = torch.func.vjp(vjp_fn, torch.zeros_like(y))
    dtype = x.dtype

    def matvec(v: torch.Tensor) -> torch.Tensor:
        (jv,) = transposed((v.to(device=x.device, dtype=dtype).reshape(x.shape),))
        return jv.detach().reshape(-1).to(device="cpu", dtype=torch.float64)

    def rmatvec(u: torch.Tensor) -> torch.Tensor:
        (g,) = vjp_fn(u.to(device=y.device, dtype=dtype).reshape(y.shape))
        return g.detach().reshape(-1).to(device="cpu", dtype=torch.float64)

    return matvec, rmatvec, x.numel(), y.numel()


def _lanczos_ncv(n: int, n_out: int, ncv: int | None) -> int:
    if ncv is not None:
        return max(2, min(int(ncv), n))
    by_memory = LANCZOS_BASIS_BYTES // (8 * (n + n_out + 2))
    return max(2, min(n, LANCZOS_NCV, by_memory))


def _bidiag_extremes(
    matvec: Callable[[np.ndarray], np.ndarray],
    rmatvec: Callable[[np.ndarray], np.ndarray],
    n: int,
    n_out: int,
    *,
    tol: float,
    ncv: int,
    maxiter: int | None,
    max_products: int | None,
    rng: np.random.Generator,
    monitor: _Monitor,
) -> tuple[float, float, bool, int]:
    """``(σ_max, σ_min, converged, products)`` of an ``n_out × n`` operator with ``n_out ≥ n``.

    Golub–Kahan–Lanczos bidiagonalisation with full (two-pass) reorthogonalisation: ``A P = Q B``
    with ``B`` upper triangular (bidiagonal until the first restart) and ``Aᵀ Q = P Bᵀ + r e_lastᵀ``.
    A Ritz triplet ``(σ, Q ũ, P ṽ)`` of ``B`` satisfies ``A v = σ u`` exactly and
    ``‖Aᵀu − σv‖ = ‖r‖·|ũ_last|``; a singular value of ``A`` lies within that residual of σ.
    After ``ncv`` steps the basis is restarted from the ``ncv/2 − 1`` smallest Ritz triplets and
    the largest one (thick restart; Baglama & Reichel 2005).
    """
    m = ncv
    f64 = torch.float64
    P = torch.zeros(n, m + 1, dtype=f64)
    Q = torch.zeros(n_out, m, dtype=f64)
    B = torch.zeros(m, m, dtype=f64)
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    p = torch.randn(n, dtype=f64, generator=gen)
    P[:, 0] = p / p.norm()
    j, products, restarts, scale = 0, 0, 0, 0.0
    while True:
        w = matvec(P[:, j])
        products += 1
        monitor.tick(products)
        Qj = Q[:, :j]
        c = Qj.T @ w
        w = w - Qj @ c
        c2 = Qj.T @ w
        w = w - Qj @ c2
        c = c + c2
        a = float(w.norm())
        scale = max(scale, a, float(c.abs().max()) if j else 0.0)
        if not math.isfinite(a):
            return math.nan, math.nan, False, products
        if a <= 1e-14 * scale:
            # A p lies in span(Q): A is singular on span(P). Continue with any new direction.
            w = torch.randn(n_out, dtype=f64, generator=gen)
            for _ in range(2):
                w = w - Qj @ (Qj.T @ w)
            q, a = w / w.norm(), 0.0
        else:
            q = w / a
        B[:j, j] = c
        B[j, j] = a
        Q[:, j] = q
        j += 1
        r = rmatvec(q)
        products += 1
        Pj = P[:, :j]
        for _ in range(2):
            r = r - Pj @ (Pj.T @ r)
        b = float(r.norm())
        # The SVD of B costs O(j³): test every step while j ≤ 64, then every ~j/16 steps.
        budget_left = max_products is None or products < max_products
        if j > 64 and j % max(1, j // 16) and j < min(m, n) and math.isfinite(b) and b > 0 and budget_left:
            monitor.tick(products)
            P[:, j] = r / b
            continue
        U, S, Vh = torch.linalg.svd(B[:j, :j])
        smax_r, smin_r = float(S[0]), float(S[-1])
        res_max, res_min = b * abs(float(U[-1, 0])), b * abs(float(U[-1, -1]))
        monitor.tick(products, smin_r)
        if not math.isfinite(b):
            return math.nan, math.nan, False, products
        invariant = j >= n or b <= 1e-14 * max(scale, smax_r)
        if invariant or (res_max <= tol * smax_r and res_min <= tol * smin_r):
            return smax_r, smin_r, True, products
        smax_ok = res_max <= tol * smax_r
        if max_products is not None and products >= max_products:
            return (smax_r if smax_ok else math.nan), math.nan, False, products
        P[:, j] = r / b
        if j == m:
            if maxiter is not None and restarts >= maxiter:
                return (smax_r if smax_ok else math.nan), math.nan, False, products
            restarts += 1
            keep = torch.tensor(sorted({0, *range(max(1, m - max(1, int(LANCZOS_KEEP * m) - 1)), m)}))
            k = len(keep)
            P[:, :k] = P[:, :m] @ Vh[keep].T
            P[:, k] = r / b
            Q[:, :k] = Q[:, :m] @ U[:, keep]
            B.zero_()
            B[torch.arange(k), torch.arange(k)] = S[keep]
            j = k


def matrix_free_extremes(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    *,
    solver: str = "lanczos",
    tol: float = 1e-6,
    maxiter: int | None = None,
    seed: int = 0,
    return_converged: bool = False,
    ncv: int | None = None,
    max_products: int | None = None,
    max_input_dim: int | None = None,
    progress: ProgressCallback | None = None,
    should_stop: StopHook | None = None,
) -> tuple[float, float] | tuple[float, float, bool]:
    """``(σ_max, σ_min)`` of the Jacobian of ``fn`` at ``x`` from Jacobian–vector products only.

    ``solver="lanczos"`` (default): Golub–Kahan–Lanczos bidiagonalisation of ``J`` with thick
    restarts (module docstring); ``ncv`` basis vectors (default: as many as fit
    :data:`LANCZOS_BASIS_BYTES`, at most :data:`LANCZOS_NCV` or the input size), at most
    ``maxiter`` restarts (default unlimited) and ``max_products`` products (default
    :data:`LANCZOS_MAX_PRODUCTS`). ``tol`` bounds the relative error of
    each σ (residual test ``‖Jᵀu − σv‖ ≤ tol·σ``). ``"arpack"``: ``svds(J, k=1)`` for σ_max and
    ``eigsh(JᵀJ, which="SA")`` for σ_min; ``"lobpcg"``: ``lobpcg`` on ``JᵀJ`` for both (both
    square κ, so σ_min is resolved only to ≈ √eps·σ_max).

    A σ that did not converge is returned as NaN with a
    :class:`~osa_lab.errors.SolverNotConvergedWarning` (or ``converged=False`` in the triple
    that ``return_converged=True`` returns instead of warning). ``should_stop`` is checked
    between products (True raises :class:`~osa_lab.errors.ComputationCancelledError`);
    ``progress`` receives :class:`JacobianProgress` at most every 0.2 s.
    """
    if solver not in SOLVERS:
        raise unknown_name("solver", solver, list(SOLVERS))
    _check_positive("tol", tol)
    for name, value in (("maxiter", maxiter), ("ncv", ncv), ("max_products", max_products)):
        if value is not None and (not isinstance(value, (int, np.integer)) or value < 1):
            raise ConfigurationError(f"`{name}` must be a positive integer or None, got {value!r}")
    _check_input_dim(x.numel(), max_input_dim)
    monitor = progress if isinstance(progress, _Monitor) else _Monitor(progress, should_stop, "matrix-free")
    matvec, rmatvec, n_in, n_out = _operators(fn, x)
    rng = np.random.default_rng(seed)
    if n_out < n_in:  # work on Jᵀ, whose σ are the same and whose Krylov side is the smaller one
        matvec, rmatvec, n_in, n_out = rmatvec, matvec, n_out, n_in
    if solver == "lanczos" and max_products is None:
        max_products = LANCZOS_MAX_PRODUCTS
    budget = max_products or 2 * ARPACK_NCV * ((maxiter or ARPACK_MAXITER) + 1)
    if monitor.task == "":
        monitor.start("matrix-free solve", 0, budget)
    converged = True
    products = 0
    if n_in <= 2:  # tiny problems: the dense Jacobian from n_in products
        monitor.check()
        dense = torch.stack([matvec(e) for e in torch.eye(n_in, dtype=torch.float64)], dim=1)
        s = torch.linalg.svdvals(dense)
        smax, smin, products = float(s[0]), float(s[-1]), n_in
    elif solver == "lanczos":
        smax, smin, converged, products = _bidiag_extremes(
            matvec, rmatvec, n_in, n_out, tol=tol, ncv=_lanczos_ncv(n_in, n_out, ncv),
            maxiter=maxiter, max_products=max_products, rng=rng,
            monitor=monitor,
        )  # fmt: skip
    else:
        smax, smin, converged, products = _scipy_extremes(
            matvec, rmatvec, n_in, n_out, solver=solver, tol=tol, maxiter=maxiter, ncv=ncv, rng=rng, monitor=monitor
        )
    monitor.report(products, smin, force=True)
    if not converged:
        smin = math.nan
    if return_converged:
        return smax, smin, converged
    if not converged:
        warnings.warn(
            f"matrix-free σ_min did not converge ({solver}, tol={tol:g}, {products} products): σ_min and κ are "
            "unknown (NaN); raise max_products, maxiter or ncv, or use the exact method for inputs up to a few "
            "thousand entries",
            SolverNotConvergedWarning,
            stacklevel=2,
        )
    return smax, smin


def _scipy_extremes(matvec, rmatvec, n, n_out, *, solver, tol, maxiter, ncv, rng, monitor):
    """The ARPACK / LOBPCG paths on ``JᵀJ``; non-convergence (an exception or scipy's warning) → NaN."""
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh, lobpcg, svds

    count = [0]

    def counted(f):
        def g(v):
            count[0] += 1
            monitor.tick(count[0])
            return f(torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64))).numpy()

        return g

    mv, rmv = counted(matvec), counted(rmatvec)
    jac = LinearOperator((n_out, n), matvec=mv, rmatvec=rmv, dtype=np.float64)
    normal = LinearOperator((n, n), matvec=lambda v: rmv(mv(v)), dtype=np.float64)
    converged = True
    if solver == "arpack":
        k_ncv = min(n - 1, ncv or ARPACK_NCV)
        try:
            s = svds(
                jac, k=1, which="LM", tol=tol, maxiter=maxiter or ARPACK_MAXITER, v0=rng.standard_normal(n_out),
                ncv=k_ncv, solver="arpack", return_singular_vectors=False,
            )  # fmt: skip
            smax = float(s[0])
        except ArpackNoConvergence:
            smax, converged = math.nan, False
        try:
            lam = eigsh(
                normal, k=1, which="SA", tol=tol, maxiter=maxiter or ARPACK_MAXITER, ncv=k_ncv,
                v0=rng.standard_normal(n), return_eigenvectors=False,
            )  # fmt: skip
            smin = math.sqrt(max(float(lam[0]), 0.0))
        except ArpackNoConvergence:
            smin, converged = math.nan, False
        return smax, smin, converged, count[0]
    iters = maxiter or 500
    ends = []
    for largest in (True, False):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lam, _ = lobpcg(normal, rng.standard_normal((n, 2)), largest=largest, tol=tol, maxiter=iters)
        failed = [w for w in caught if "tolerance" in str(w.message) or "converge" in str(w.message).lower()]
        value = float(np.max(lam) if largest else np.min(lam))
        if failed or not math.isfinite(value):
            converged = False
            value = math.nan
        ends.append(math.sqrt(max(value, 0.0)) if math.isfinite(value) else math.nan)
    return ends[0], ends[1], converged, count[0]


def jacobian_spectrum(
    fn_or_model: Callable | nn.Module,
    x: torch.Tensor,
    method: str = "auto",
    max_exact_dim: int = MAX_EXACT_DIM,
    *,
    chunk_size: int | None = 256,
    max_bytes: int | None = None,
    solver: str = "lanczos",
    tol: float = 1e-6,
    ncv: int | None = None,
    maxiter: int | None = None,
    max_input_dim: int | None = None,
    progress: ProgressCallback | None = None,
    should_stop: StopHook | None = None,
) -> JacobianSpectrum:
    """Singular values and κ of the Jacobian of ``fn_or_model`` at ``x`` (see module docstring).

    Args:
        fn_or_model: a function of one tensor, or an ``nn.Module`` taking ``(1, N, d)`` (then
            ``x`` is one sample ``(N, d)`` or ``(1, N, d)`` and the module runs in
            :func:`~osa_lab.nn.models.functional_mode`).
        x: the point at which the Jacobian is taken.
        method: ``"auto"``, ``"exact"`` or ``"matrix-free"``; the result's ``method`` says which ran.
        max_exact_dim: largest input size that ``"auto"`` computes exactly.
        solver, tol, ncv, maxiter: the matrix-free solver's settings (:func:`matrix_free_extremes`).
        max_input_dim: refuse matrix-free inputs with more entries (:data:`MAX_INPUT_DIM` by default).
        progress, should_stop: progress callback and cancel hook (module docstring).
    """
    check_method(method)
    fn, x = _as_function(fn_or_model, x)
    resolved = method
    if method == "auto":
        resolved = "exact" if x.numel() <= max_exact_dim else "matrix-free"
    if resolved == "matrix-free":
        _check_input_dim(x.numel(), max_input_dim)
    module = fn_or_model if isinstance(fn_or_model, nn.Module) else None
    monitor = _Monitor(progress, should_stop, resolved)
    with functional_mode(module) if module is not None else contextlib.nullcontext():
        if resolved == "exact":
            jac = exact_jacobian(fn, x, chunk_size=chunk_size, max_bytes=max_bytes, progress=monitor)
            monitor.check()
            sigma = torch.linalg.svdvals(jac.double()).numpy()
            shape = tuple(jac.shape)
            smax, smin, converged, products = float(sigma[0]), float(sigma[-1]), True, int(jac.shape[0])
        else:
            smax, smin, converged = matrix_free_extremes(
                fn, x, solver=solver, tol=tol, ncv=ncv, maxiter=maxiter, return_converged=True,
                max_input_dim=max_input_dim, progress=monitor,
            )  # fmt: skip
            sigma = np.array([smax, smin])
            with torch.no_grad():
                shape = (fn(x).numel(), x.numel())
            products = monitor.products
    return JacobianSpectrum(sigma, smax, smin, kappa_from_extremes(smax, smin), resolved, shape, converged, products)


# --------------------------------------------------------------------------------------
# Cost model (seconds) and the choice of method
# --------------------------------------------------------------------------------------

#: Fitted constants of :func:`estimate_jacobian_seconds` (seconds; see its docstring).
COST_MODEL = {
    "product_overhead_osa": 0.017,
    "product_overhead_ssa": 0.003,
    "product_per_flop": 7e-9,
    "exact_row_per_flop_osa": 3e-8,
    "exact_row_per_flop_ssa": 1.4e-8,
    "dense_per_n3": 2.5e-9,
    "mf_products_cap": 2000,
}


def _block_flops(tokens: int, dim: int) -> float:
    """The size term of one block's product cost: ``N·d² + N²·d``."""
    return float(tokens) * dim * dim + float(tokens) ** 2 * dim


def _product_seconds(n: int, blocks: int, tokens: int | None = None, dim: int | None = None, osa: bool = True) -> float:
    """Seconds of one Jacobian product through ``blocks`` blocks (N, d guessed as √n when not given)."""
    if tokens is None or dim is None:
        tokens = dim = max(int(round(math.sqrt(n))), 1)
    c = COST_MODEL
    overhead = c["product_overhead_osa"] if osa else c["product_overhead_ssa"]
    return blocks * (overhead + c["product_per_flop"] * _block_flops(tokens, dim))


def _mf_products(n: int) -> int:
    """Planning figure for the products of one matrix-free solve: the unrestarted Krylov space
    needs at most ``2n``; ill-conditioned cases measured 900–1600 (N·d = 144–576, κ 170–3,100)."""
    return int(min(2 * n, COST_MODEL["mf_products_cap"]))


def estimate_jacobian_seconds(
    tokens: int,
    dim: int,
    depth: int,
    heads: int = 1,
    mode: str = "auto",
    *,
    layers: Sequence[int] | None = None,
    scopes: Sequence[str] = SCOPES,
    attention: str = "osa",
) -> float:
    """Estimated CPU seconds (one torch thread) of :func:`jacobian_depth_profile` with these settings.

    ``mode`` ``"exact"``, ``"matrix-free"`` or ``"auto"`` (the cheaper of the two, which is
    what ``method="auto"`` runs); ``attention`` ``"osa"`` or ``"ssa"`` (softmax blocks are cheaper
    per product); ``heads`` does not change the estimate measurably and is accepted for the
    callers' convenience. The model, with ``n = N·d``, ``f = N·d² + N²·d``, ``L`` the deepest
    requested layer and ``c`` from :data:`COST_MODEL`:

    * one product through one block: ``t_p = c₀ + 7e-9·f`` with ``c₀`` = 17 ms (OSA, QR path)
      or 3 ms (softmax);
    * exact: per block, ``n`` vjp rows at ``3e-8·f`` (OSA) or ``1.4e-8·f`` (softmax) s each,
      then ``2.5e-9·n³`` s per dense product or SVD (one product per block for the end-to-end
      scope, one SVD per requested layer and scope);
    * matrix-free: per requested layer ``l`` and scope, ``P = min(2n, 2000)`` products through
      ``l`` blocks (end-to-end) or one block (layer); a well-conditioned Jacobian converges in
      far fewer (tens), so this is a planning figure for κ ≳ 100, and solves stop at the
      product budget reported in :class:`JacobianProgress`.

    Fitted to timings of pure-osa and vit blocks at (N, d) from (8, 8) to (256, 64) on the
    2-core development machine under a load average of ≈ 12 (other jobs running): absolute
    seconds are pessimistic by up to ≈ 5× on an idle machine, the exact/matrix-free ratio is
    what ``"auto"`` uses. Reproduce with ``benchmarks/analysis_speed.py``.
    """
    if mode not in JACOBIAN_METHODS:
        raise unknown_name("mode", mode, list(JACOBIAN_METHODS))
    for name, value in (("tokens", tokens), ("dim", dim), ("depth", depth), ("heads", heads)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ConfigurationError(f"`{name}` must be a positive integer, got {value!r}")
    if attention not in ("osa", "ssa"):
        raise unknown_name("attention", attention, ["osa", "ssa"])
    for s in scopes:
        if s not in SCOPES:
            raise unknown_name("scope", s, list(SCOPES))
    wanted = resolve_layers(layers, depth)
    osa = attention == "osa"
    n = tokens * dim
    f = _block_flops(tokens, dim)
    c = COST_MODEL
    row = c["exact_row_per_flop_osa" if osa else "exact_row_per_flop_ssa"] * f
    dense = c["dense_per_n3"] * float(n) ** 3
    deepest = max(wanted)
    exact = deepest * (n * row + (dense if "end_to_end" in scopes else 0.0)) + len(wanted) * len(scopes) * dense
    per_product = _product_seconds(n, 1, tokens, dim, osa)
    blocks = sum((l if s == "end_to_end" else 1) for l in wanted for s in scopes)
    free = blocks * _mf_products(n) * per_product
    if mode == "exact":
        return float(exact)
    if mode == "matrix-free":
        return float(free)
    return float(min(exact, free))


def resolve_method(
    method: str,
    tokens: int,
    dim: int,
    depth: int = 1,
    heads: int = 1,
    *,
    layers: Sequence[int] | None = None,
    scopes: Sequence[str] = SCOPES,
    attention: str = "osa",
    max_exact_dim: int = MAX_EXACT_DIM,
    max_bytes: int | None = None,
    dtype: torch.dtype = torch.float64,
) -> str:
    """The method ``"auto"`` runs for these settings (other methods are returned unchanged).

    Exact when the input has at most ``max_exact_dim`` entries, the ``n × n`` Jacobian fits
    ``max_bytes``, and :func:`estimate_jacobian_seconds` rates it no slower than matrix-free;
    otherwise matrix-free. Results of a call with ``method="auto"`` equal those of the resolved
    method (same seed and settings), so caches can key on the resolved method.
    """
    check_method(method)
    if method != "auto":
        return method
    n = tokens * dim
    limit = default_max_bytes() if max_bytes is None else max_bytes
    if n > max_exact_dim or n * n * (torch.finfo(dtype).bits // 8) > limit:
        return "matrix-free"
    kw = dict(layers=layers, scopes=scopes, attention=attention)
    exact = estimate_jacobian_seconds(tokens, dim, depth, heads, "exact", **kw)
    free = estimate_jacobian_seconds(tokens, dim, depth, heads, "matrix-free", **kw)
    return "exact" if exact <= free else "matrix-free"


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

    method: str = "auto"
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


def _block_fn(block: nn.Module) -> Callable:
    return lambda z: block(z[None])[0]


def _prefix_fn(model: Encoder, layers: int) -> Callable:
    return lambda z: model(z[None], layers=layers)[0]


def resolve_layers(layers: Sequence[int] | None, depth: int) -> list[int]:
    """The layers 1..depth to study (all when ``layers`` is None); refuses layers outside 1..depth."""
    if layers is None:
        return list(range(1, depth + 1))
    out = sorted(set(int(l) for l in layers))
    if not out or out[0] < 1 or out[-1] > depth:
        raise ConfigurationError(f"`layers`={list(layers)} must lie in 1..depth={depth}")
    return out


def _depth_spectra(
    point: StudyPoint,
    how: JacobianSettings,
    progress: bool | ProgressCallback,
    should_stop: StopHook | None = None,
):
    """Yield (keys, scope, layer, JacobianSpectrum) for every requested layer and scope of ``point``."""
    from tqdm.auto import tqdm

    preset, depth, tokens, dim, seed = point.preset, point.depth, point.tokens, point.dim, point.seed
    method, layers, scopes, dtype = how.method, how.layers, how.scopes, how.dtype
    max_exact_dim, max_bytes, max_input_dim = how.max_exact_dim, how.max_bytes, how.max_input_dim
    solver, tol = how.solver, how.tol

    check_method(method)
    for s in scopes:
        if s not in SCOPES:
            raise unknown_name("scope", s, list(SCOPES))
    wanted = resolve_layers(layers, depth)
    if method == "exact":
        check_size(tokens * dim, tokens * dim, dtype, max_bytes)
    model, x0, keys = build_point(point, dtype)
    n = x0.numel()
    attention = "osa" if getattr(getattr(model, "config", None), "attention", "osa") == "osa" else "ssa"
    resolved = resolve_method(
        method, tokens, dim, depth, keys["heads"] or 1, layers=wanted, scopes=scopes, attention=attention,
        max_exact_dim=max_exact_dim, max_bytes=max_bytes, dtype=dtype,
    )  # fmt: skip
    if resolved == "matrix-free":
        _check_input_dim(n, max_input_dim)
    bar = tqdm(total=len(wanted) * len(scopes), desc=f"jacobian {preset}", disable=progress is not True, leave=False)
    if callable(progress):
        callback = progress
    elif progress is True:  # progress inside a long solve: products so far on the bar

        def callback(p: JacobianProgress) -> None:
            est = "" if math.isnan(p.estimate) else f", σ_min ≈ {p.estimate:.3g}"
            bar.set_postfix_str(f"{p.task.split(': ', 1)[-1]}: {p.products} products{est}", refresh=True)

    else:
        callback = None
    tasks = max(wanted) if resolved == "exact" else len(wanted) * len(scopes)
    monitor = _Monitor(callback, should_stop, resolved, tasks=tasks)
    monitor.check()
    inputs = _layer_inputs(model, x0)
    with functional_mode(model):
        if resolved == "exact":
            check_size(n, n, dtype, max_bytes)
            product = None
            for l in range(1, max(wanted) + 1):
                monitor.start(f"{preset}: exact Jacobian of block {l}", l - 1, n)
                jl = exact_jacobian(
                    _block_fn(model.blocks[l - 1]), inputs[l - 1], max_bytes=max_bytes, progress=monitor
                ).double()
                monitor.check()
                product = jl if product is None else jl @ product
                if l not in wanted:
                    continue
                for scope in scopes:
                    monitor.check()
                    mat = product if scope == "end_to_end" else jl
                    sigma = torch.linalg.svdvals(mat).numpy()
                    smax, smin = float(sigma[0]), float(sigma[-1])
                    yield (
                        keys,
                        scope,
                        l,
                        JacobianSpectrum(
                            sigma, smax, smin, kappa_from_extremes(smax, smin), "exact", tuple(mat.shape), True, n
                        ),
                    )
                    bar.update()
            monitor.start(f"{preset}: done", tasks, 1)
        else:
            index = 0
            for l in wanted:
                for scope in scopes:
                    if scope == "end_to_end":
                        fn, at = _prefix_fn(model, l), x0
                    else:
                        fn, at = _block_fn(model.blocks[l - 1]), inputs[l - 1]
                    budget = LANCZOS_MAX_PRODUCTS if solver == "lanczos" else 0
                    monitor.start(f"{preset}: layer {l} ({scope})", index, budget)
                    smax, smin, converged = matrix_free_extremes(
                        fn, at, solver=solver, tol=tol, seed=seed, return_converged=True,
                        max_input_dim=max_input_dim, progress=monitor,
                    )  # fmt: skip
                    yield (
                        keys,
                        scope,
                        l,
                        JacobianSpectrum(
                            np.array([smax, smin]), smax, smin, kappa_from_extremes(smax, smin), "matrix-free", (n, n), converged
                        ),
                    )
                    bar.update()
                    index += 1
            monitor.start(f"{preset}: done", tasks, 1)
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
    solver: str = "lanczos",
    tol: float = 1e-6,
    progress: bool | ProgressCallback = False,
    should_stop: StopHook | None = None,
    max_input_dim: int | None = None,
) -> pd.DataFrame:
    """κ across depth: of ``∂X_l/∂X_0`` (``scope="end_to_end"``) and of block l alone (``"layer"``).

    The preset is built as in :func:`osa_lab.studies.depth.depth_profile` (weights and Gaussian input
    tokens from ``seed``). Exact: the per-block Jacobians ``J_l`` at the block inputs and their
    running product ``J_l ⋯ J_1`` (chain rule, no extra network passes). Matrix-free: one
    Lanczos (or ARPACK/lobpcg) solve per layer and scope (``layers`` selects which, default all).
    ``"auto"`` runs :func:`resolve_method`'s choice; the ``method`` column says which ran.

    ``progress``: True for a tqdm bar, or a callback receiving :class:`JacobianProgress`;
    ``should_stop``: cancel hook checked between products (raises
    :class:`~osa_lab.errors.ComputationCancelledError`); ``max_input_dim``: refuse larger inputs
    (default :data:`MAX_INPUT_DIM`) with :class:`JacobianTooLargeError`.

    Returns a DataFrame with columns :data:`KAPPA_COLUMNS`.
    """
    rows = []
    point = StudyPoint(preset, depth, tokens, dim, heads, alpha, seed)
    how = JacobianSettings(method, layers, scopes, max_exact_dim, dtype, max_bytes, solver, tol, max_input_dim)
    for keys, scope, layer, spec in _depth_spectra(point, how, progress, should_stop):
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
    progress: bool | ProgressCallback = False,
    should_stop: StopHook | None = None,
    max_input_dim: int | None = None,
) -> pd.DataFrame:
    """Every singular value of the Jacobians (for histograms), one row each: :data:`SIGMA_COLUMNS`.

    With the exact method all ``N·d`` singular values per layer; matrix-free gives only the two
    extremes (``index`` 0 and ``N·d − 1``). ``layers`` default: the last layer only.
    ``progress``, ``should_stop``, ``max_input_dim`` as in :func:`jacobian_depth_profile`.
    """
    layers = [depth] if layers is None else layers
    parts = []
    point = StudyPoint(preset, depth, tokens, dim, heads, alpha, seed)
    how = JacobianSettings(method, layers, scopes, max_exact_dim, dtype, max_bytes, max_input_dim=max_input_dim)
    for keys, scope, layer, spec in _depth_spectra(point, how, progress, should_stop):
        n = spec.shape[1]
        index = np.arange(len(spec.sigma)) if spec.method == "exact" else np.array([0, n - 1])
        df = pd.DataFrame({"index": index, "sigma": spec.sigma})
        for k, v in keys.items():
            df[k] = v
        df["scope"], df["layer"], df["method"] = scope, layer, spec.method
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
    method: str = "auto",
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
    heads, seed, method, sigma_max, sigma_min, kappa, converged``. ``progress`` and
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
                        gen = torch.random.fork_rng(devices=[])
                        with gen:
                            torch.manual_seed(s)
                            layer = OrthogonalSelfAttention(d, h, alpha_init=value, tokens=n, dtype=dtype)
                            x = torch.randn(n, d, dtype=torch.float64).to(dtype)
                        spec = jacobian_spectrum(
                            layer, x, method=method, max_exact_dim=max_exact_dim, progress=progress,
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
                                "method": spec.method,
                                "sigma_max": spec.sigma_max,
                                "sigma_min": spec.sigma_min,
                                "kappa": spec.kappa,
                                "converged": spec.converged,
                            }
                        )
    return pd.DataFrame(rows)
