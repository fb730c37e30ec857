"""Jacobians: exact vs finite differences, exact vs matrix-free, OSA conditioning, SSA growth with depth."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from osa_lab.errors import UnknownNameError
from osa_lab.jacobian import (
    KAPPA_COLUMNS,
    SIGMA_COLUMNS,
    JacobianTooLargeError,
    exact_jacobian,
    jacobian_depth_profile,
    jacobian_singular_values,
    jacobian_spectrum,
    osa_layer_conditioning,
)
from osa_lab.layers import OrthogonalSelfAttention
from osa_lab.models import build_model
from osa_lab.presets import get_preset


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def test_exact_jacobian_of_linear_map_and_finite_differences():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 5, dtype=torch.float64, generator=g)
    x = torch.randn(4, 3, dtype=torch.float64, generator=g)
    jac = exact_jacobian(lambda z: z @ w, x, chunk_size=4)
    assert torch.allclose(
        jac, torch.kron(torch.eye(4, dtype=torch.float64), w.mT.contiguous())
    )  # vec(XW) = (I ⊗ Wᵀ) vec X
    model = build_model(
        get_preset("skipless-ssa", depth=2, dim=8, heads=2, tokens=4, seed=0), dtype=torch.float64
    )
    from osa_lab.models import functional_mode

    x = torch.randn(4, 8, dtype=torch.float64, generator=g)
    with functional_mode(model):
        fn = lambda z: model(z[None])[0]  # noqa: E731
        jac = exact_jacobian(fn, x, chunk_size=7)
    e = torch.zeros_like(x)
    e[1, 3] = 1e-6
    with torch.no_grad():
        fd = (model((x + e)[None]) - model((x - e)[None]))[0].reshape(-1) / 2e-6
    assert torch.allclose(jac[:, 1 * 8 + 3], fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize(
    ("preset", "layers", "scopes"),
    [("vit", [1, 2], ["end_to_end", "layer"]), ("pure-osa", [1, 2], ["end_to_end", "layer"]),
     ("skipless-osa", [1], ["layer"])],
)  # fmt: skip
def test_exact_and_matrix_free_agree(preset, layers, scopes):
    """σ_max and σ_min within 1 % (issue 3), end-to-end and per layer (κ from 1.2 to ~200)."""
    kw = dict(
        tokens=8, dim=8, heads=None if preset == "pure-osa" else 2, seed=0, layers=layers, scopes=scopes
    )
    exact = jacobian_depth_profile(preset, 2, method="exact", **kw)
    free = jacobian_depth_profile(preset, 2, method="matrix-free", **kw)
    assert list(exact.columns) == KAPPA_COLUMNS
    assert set(exact["method"]) == {"exact"} and set(free["method"]) == {"matrix-free"}
    assert np.allclose(free["sigma_max"], exact["sigma_max"], rtol=1e-2)
    assert np.allclose(free["sigma_min"], exact["sigma_min"], rtol=1e-2)


def test_lobpcg_solver_agrees_with_exact():
    layer = OrthogonalSelfAttention(16, 2, tokens=8).double()
    x = torch.randn(8, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    exact = jacobian_spectrum(layer, x, method="exact")
    free = jacobian_spectrum(layer, x, method="matrix-free")
    assert free.sigma_max == pytest.approx(exact.sigma_max, rel=1e-2)
    assert free.sigma_min == pytest.approx(exact.sigma_min, rel=1e-2)
    from osa_lab.jacobian import _as_function, matrix_free_extremes
    from osa_lab.models import functional_mode

    with functional_mode(layer):
        fn, at = _as_function(layer, x)
        smax, smin = matrix_free_extremes(fn, at, solver="lobpcg", tol=1e-8)
    assert smax == pytest.approx(exact.sigma_max, rel=1e-2) and smin == pytest.approx(
        exact.sigma_min, rel=1e-2
    )


def test_osa_layer_kappa_at_default_init():
    """The core's derived init keeps κ(J) ≤ 1.5 for N, d ∈ {8, 16, 32} (DESIGN.md §3)."""
    df = osa_layer_conditioning(["derived"], tokens=[8, 16, 32], dims=[8, 16, 32], seeds=1, heads=[1, 2])
    assert len(df) == 3 * 3 * 2
    assert (df["method"] == "exact").all()
    assert df["kappa"].max() <= 1.5, df.sort_values("kappa").tail(3).to_string()


def test_osa_layer_kappa_grows_with_alpha():
    df = osa_layer_conditioning([0.0, 0.1, 1.0], tokens=[16], dims=[16], seeds=1)
    kappa = df.set_index("alpha")["kappa"]
    assert kappa[0.0] == pytest.approx(1.0, abs=1e-10)  # A = I: J = W_Vᵀ W_Oᵀ ⊗ I, orthogonal
    assert kappa[0.1] > 2 and kappa[1.0] > 10 * kappa[0.1]


def test_skipless_ssa_kappa_grows_with_depth():
    df = jacobian_depth_profile("skipless-ssa", 4, 8, 16, heads=2, seed=0, method="exact")
    e2e = df[df["scope"] == "end_to_end"].sort_values("layer")["kappa"].to_numpy()
    assert (np.diff(np.log(e2e)) > 0).all() and e2e[-1] > 100 * e2e[0]
    osa = jacobian_depth_profile("pure-osa", 4, 8, 16, seed=0, method="exact", scopes=["end_to_end"])
    assert osa["kappa"].max() < 2.0  # attention-only OSA stays well conditioned


def test_singular_values_table():
    df = jacobian_singular_values("pure-osa", 2, 8, 8, seed=0, method="exact")
    assert list(df.columns) == SIGMA_COLUMNS
    assert len(df) == 64 and (df["layer"] == 2).all()
    assert df["sigma"].is_monotonic_decreasing


def test_auto_method_and_size_errors():
    layer = OrthogonalSelfAttention(8, 1, tokens=8).double()
    x = torch.randn(8, 8, dtype=torch.float64)
    assert jacobian_spectrum(layer, x, method="auto", max_exact_dim=64).method == "exact"
    assert jacobian_spectrum(layer, x, method="auto", max_exact_dim=63).method == "matrix-free"
    with pytest.raises(JacobianTooLargeError, match=r"64 × 64 float64 .*matrix-free"):
        jacobian_spectrum(layer, x, method="exact", max_bytes=1000)
    with pytest.raises(UnknownNameError, match="matrix-free"):
        jacobian_spectrum(layer, x, method="svd")
    with pytest.raises(JacobianTooLargeError, match="GiB"):
        jacobian_depth_profile("pure-osa", 1, 4096, 64, method="exact")
    assert isinstance(jacobian_depth_profile("pure-osa", 1, 4, 4, method="auto"), pd.DataFrame)


def _ill_conditioned_diagonal(n: int = 400):
    scale = torch.cat([torch.tensor([1000.0]), torch.linspace(1e-3, 1e-2, n - 1)]).double()
    return (lambda x: x * scale), torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def test_matrix_free_non_convergence_is_flagged_not_silent():
    """σ_min that ARPACK did not resolve comes with a warning (or converged=False), never as a plain value."""
    import warnings

    from osa_lab.errors import SolverNotConvergedWarning
    from osa_lab.jacobian import matrix_free_extremes

    fn, x = _ill_conditioned_diagonal()
    with pytest.warns(SolverNotConvergedWarning, match="did not converge"):
        smax, _ = matrix_free_extremes(fn, x, maxiter=3)
    assert smax == pytest.approx(1000.0)
    *_, converged = matrix_free_extremes(fn, x, maxiter=3, return_converged=True)
    assert converged is False
    with warnings.catch_warnings():
        warnings.simplefilter("error", SolverNotConvergedWarning)
        smax, smin, converged = matrix_free_extremes(fn, x, return_converged=True)
    assert converged is True
    assert smin == pytest.approx(1e-3, rel=1e-4) and smax == pytest.approx(1000.0)
