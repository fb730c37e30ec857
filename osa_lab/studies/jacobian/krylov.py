"""Krylov solvers for the extreme singular values of a linear operator given by its products.

:func:`bidiagonal_extremes` is Golub–Kahan–Lanczos bidiagonalisation of the operator itself
(never the normal matrix ``AᵀA``, so σ_min keeps its accuracy down to ≈ eps·σ_max) with full
reorthogonalisation and thick restarts that keep the smallest Ritz triplets and the largest one
(Baglama & Reichel 2005, SIAM J. Sci. Comput. 27:19–42). :func:`scipy_extremes` runs ARPACK
(``svds`` / ``eigsh``) or LOBPCG on ``AᵀA`` instead. Both work on ``matvec`` / ``rmatvec``
closures over flat float64 tensors; :mod:`osa_lab.studies.jacobian.solvers` builds those from a
function's Jacobian.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
import torch

from osa_lab.studies.jacobian.monitor import SolveMonitor

SOLVERS = ("lanczos", "arpack", "lobpcg")


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


def lanczos_basis_size(n: int, n_out: int, ncv: int | None) -> int:
    if ncv is not None:
        return max(2, min(int(ncv), n))
    by_memory = LANCZOS_BASIS_BYTES // (8 * (n + n_out + 2))
    return max(2, min(n, LANCZOS_NCV, by_memory))


def bidiagonal_extremes(
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
    monitor: SolveMonitor,
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


def scipy_extremes(matvec, rmatvec, n, n_out, *, solver, tol, maxiter, ncv, rng, monitor):
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
