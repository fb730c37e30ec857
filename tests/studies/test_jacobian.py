"""Jacobians: exact vs finite differences, exact vs matrix-free, OSA conditioning, SSA growth with depth."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from osa_lab.errors import UnknownNameError
from osa_lab.nn.attention import OrthogonalSelfAttention
from osa_lab.nn.models import build_model
from osa_lab.nn.presets import get_preset
from osa_lab.studies.jacobian import (
    KAPPA_COLUMNS,
    SIGMA_COLUMNS,
    JacobianTooLargeError,
    exact_jacobian,
    jacobian_depth_profile,
    jacobian_singular_values,
    jacobian_spectrum,
    osa_layer_conditioning,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

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
    from osa_lab.nn.models import functional_mode

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
    """σ_max and σ_min within 1 %, end-to-end and per layer (κ from 1.2 to ~200)."""
    kw = dict(
        tokens=8, dim=8, heads=None if preset == "pure-osa" else 2, seed=0, layers=layers, scopes=scopes
    )
    exact = jacobian_depth_profile(preset, 2, algorithm="exact", **kw)
    free = jacobian_depth_profile(preset, 2, algorithm="matrix-free", **kw)
    assert list(exact.columns) == KAPPA_COLUMNS
    assert set(exact["algorithm"]) == {"exact"} and set(free["algorithm"]) == {"matrix-free"}
    assert np.allclose(free["sigma_max"], exact["sigma_max"], rtol=1e-2)
    assert np.allclose(free["sigma_min"], exact["sigma_min"], rtol=1e-2)


def test_lobpcg_solver_agrees_with_exact():
    layer = OrthogonalSelfAttention(16, 2, tokens=8).double()
    x = torch.randn(8, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    exact = jacobian_spectrum(layer, x, algorithm="exact")
    free = jacobian_spectrum(layer, x, algorithm="matrix-free")
    assert free.sigma_max == pytest.approx(exact.sigma_max, rel=1e-2)
    assert free.sigma_min == pytest.approx(exact.sigma_min, rel=1e-2)
    from osa_lab.nn.models import functional_mode
    from osa_lab.studies.jacobian.solvers import _as_function, matrix_free_extremes

    with functional_mode(layer):
        fn, at = _as_function(layer, x)
        smax, smin = matrix_free_extremes(fn, at, solver="lobpcg", tol=1e-8)
    assert smax == pytest.approx(exact.sigma_max, rel=1e-2) and smin == pytest.approx(
        exact.sigma_min, rel=1e-2
    )


def test_osa_layer_kappa_at_default_init():
    """The core's derived init keeps κ(J) ≤ 1.5 for N, d ∈ {8, 16, 32} (docs/initialisation.md)."""
    df = osa_layer_conditioning(["derived"], tokens=[8, 16, 32], dims=[8, 16, 32], seeds=1, heads=[1, 2])
    assert len(df) == 3 * 3 * 2
    assert (df["algorithm"] == "exact").all()
    assert df["kappa"].max() <= 1.5, df.sort_values("kappa").tail(3).to_string()


def test_osa_layer_kappa_grows_with_alpha():
    df = osa_layer_conditioning([0.0, 0.1, 1.0], tokens=[16], dims=[16], seeds=1)
    kappa = df.set_index("alpha")["kappa"]
    assert kappa[0.0] == pytest.approx(1.0, abs=1e-10)  # A = I: J = W_Vᵀ W_Oᵀ ⊗ I, orthogonal
    assert kappa[0.1] > 2 and kappa[1.0] > 10 * kappa[0.1]


def test_skipless_ssa_kappa_grows_with_depth():
    df = jacobian_depth_profile("skipless-ssa", 4, 8, 16, heads=2, seed=0, algorithm="exact")
    e2e = df[df["scope"] == "end_to_end"].sort_values("layer")["kappa"].to_numpy()
    assert (np.diff(np.log(e2e)) > 0).all() and e2e[-1] > 100 * e2e[0]
    osa = jacobian_depth_profile("pure-osa", 4, 8, 16, seed=0, algorithm="exact", scopes=["end_to_end"])
    assert osa["kappa"].max() < 2.0  # attention-only OSA stays well conditioned


def test_singular_values_table():
    df = jacobian_singular_values("pure-osa", 2, 8, 8, seed=0, algorithm="exact")
    assert list(df.columns) == SIGMA_COLUMNS
    assert len(df) == 64 and (df["layer"] == 2).all()
    assert df["sigma"].is_monotonic_decreasing


def test_auto_algorithm_and_size_errors():
    layer = OrthogonalSelfAttention(8, 1, tokens=8).double()
    x = torch.randn(8, 8, dtype=torch.float64)
    assert jacobian_spectrum(layer, x, algorithm="auto", max_exact_dim=64).algorithm == "exact"
    assert jacobian_spectrum(layer, x, algorithm="auto", max_exact_dim=63).algorithm == "matrix-free"
    with pytest.raises(JacobianTooLargeError, match=r"64 × 64 float64 .*matrix-free"):
        jacobian_spectrum(layer, x, algorithm="exact", max_bytes=1000)
    with pytest.raises(UnknownNameError, match="matrix-free"):
        jacobian_spectrum(layer, x, algorithm="svd")
    with pytest.raises(JacobianTooLargeError, match="GiB"):
        jacobian_depth_profile("pure-osa", 1, 4096, 64, algorithm="exact")
    assert isinstance(jacobian_depth_profile("pure-osa", 1, 4, 4, algorithm="auto"), pd.DataFrame)


def _ill_conditioned_diagonal(n: int = 400):
    scale = torch.cat([torch.tensor([1000.0]), torch.linspace(1e-3, 1e-2, n - 1)]).double()
    return (lambda x: x * scale), torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def test_matrix_free_non_convergence_is_flagged_not_silent():
    """σ_min that ARPACK did not resolve comes with a warning (or converged=False), never as a plain value."""
    import warnings

    from osa_lab.errors import SolverNotConvergedWarning
    from osa_lab.studies.jacobian import matrix_free_extremes

    fn, x = _ill_conditioned_diagonal()
    # ncv=16: a small restarted basis (the default basis spans all 400 inputs and converges).
    with pytest.warns(SolverNotConvergedWarning, match="did not converge"):
        smax, smin = matrix_free_extremes(fn, x, maxiter=3, ncv=16)
    assert smax == pytest.approx(1000.0) and np.isnan(smin)
    *_, converged = matrix_free_extremes(fn, x, maxiter=3, ncv=16, return_converged=True)
    assert converged is False
    with warnings.catch_warnings():
        warnings.simplefilter("error", SolverNotConvergedWarning)
        smax, smin, converged = matrix_free_extremes(fn, x, return_converged=True)
    assert converged is True
    assert smin == pytest.approx(1e-3, rel=1e-4) and smax == pytest.approx(1000.0)


# --------------------------------------------------------------------------------------
# matrix-free σ_min across the documented κ range; progress, cancel, bounds,
# cost model
# --------------------------------------------------------------------------------------


def _osa_case(tokens: int, dim: int, alpha: float, seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = OrthogonalSelfAttention(dim, 1, alpha_init=alpha, tokens=tokens).double()
        x = torch.randn(tokens, dim, dtype=torch.float64)
    return layer, x


@pytest.mark.parametrize(("tokens", "alpha"), [(16, 1.0), (12, 3.0)])
def test_matrix_free_resolves_ill_conditioned_osa_layer(tokens, alpha):
    """The README's N = d = 16, α = 1 (κ ≈ 1000) and N = d = 12, α = 3 (κ ≈ 3100): the old ARPACK
    path returned σ_min = NaN and κ = inf after about a minute; now σ_min to 1e-8 relative."""
    layer, x = _osa_case(tokens, tokens, alpha)
    exact = jacobian_spectrum(layer, x, algorithm="exact")
    assert exact.kappa > 500
    free = jacobian_spectrum(layer, x, algorithm="matrix-free")
    assert free.algorithm == "matrix-free" and free.converged is True
    assert free.sigma_max == pytest.approx(exact.sigma_max, rel=1e-8)
    assert free.sigma_min == pytest.approx(exact.sigma_min, rel=1e-8)
    assert free.kappa == pytest.approx(exact.kappa, rel=1e-7)
    assert 0 < free.products <= 2 * x.numel()


def test_matrix_free_with_krylov_space_much_smaller_than_the_input():
    """N = d = 32 (1024 inputs), α = 0.1 (κ ≈ 44): a 64-vector basis (16× smaller), thick restarts."""
    layer, x = _osa_case(32, 32, 0.1)
    exact = jacobian_spectrum(layer, x, algorithm="exact")
    free = jacobian_spectrum(layer, x, algorithm="matrix-free", ncv=64)
    assert free.converged is True and exact.kappa > 20
    assert free.products > 2 * 64  # it did restart
    assert free.sigma_max == pytest.approx(exact.sigma_max, rel=1e-8)
    assert free.sigma_min == pytest.approx(exact.sigma_min, rel=1e-6)


def test_transposed_vjp_matvec_equals_jvp():
    from osa_lab.nn.models import functional_mode
    from osa_lab.studies.jacobian.solvers import _operators

    layer, x = _osa_case(6, 4, 0.7)
    v = torch.randn(x.numel(), dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with functional_mode(layer):
        fn = lambda z: layer(z[None])[0]  # noqa: E731
        matvec, rmatvec, n_in, n_out = _operators(fn, x)
        ref = torch.func.jvp(fn, (x,), (v.reshape(x.shape),))[1].reshape(-1)
        jac = exact_jacobian(fn, x)
    assert torch.allclose(matvec(v), ref, rtol=1e-12, atol=1e-13)
    assert torch.allclose(rmatvec(v), jac.T @ v, rtol=1e-12, atol=1e-13)


def _geometric_spectrum(n: int = 300, kappa: float = 1e4):
    """A dense map with σ spread geometrically (no isolated σ_min: the hardest case for Krylov)."""
    g = torch.Generator().manual_seed(1)
    u, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=g))
    v, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=g))
    a = (u * torch.logspace(0, -np.log10(kappa), n, dtype=torch.float64)) @ v.T
    return (lambda z: a @ z), torch.randn(n, dtype=torch.float64, generator=g)


def test_unconverged_sigma_min_is_nan_with_flag_never_inf():
    """κ of an unresolved σ_min is NaN (unknown), never inf (old: inf) — for every solver."""
    import warnings

    from osa_lab.studies.jacobian import matrix_free_extremes

    fn, x = _geometric_spectrum()
    spec = jacobian_spectrum(fn, x, algorithm="matrix-free", ncv=12, maxiter=4)
    assert spec.converged is False and np.isnan(spec.sigma_min) and np.isnan(spec.kappa)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy's own lobpcg/ARPACK messages
        for solver in ("arpack", "lobpcg"):
            smax, smin, converged = matrix_free_extremes(
                fn, x, solver=solver, maxiter=5, ncv=8, return_converged=True
            )
            assert converged is False and np.isnan(smin), solver


def test_lobpcg_warning_is_not_reported_as_converged():
    """lobpcg at κ ≈ 200 (N = d = 24, α = 0.3): scipy warned 'not reaching the requested
    tolerance' and the old code returned a 0.7 %-off σ_min with converged=True."""
    from osa_lab.nn.models import functional_mode
    from osa_lab.studies.jacobian import matrix_free_extremes

    layer, x = _osa_case(12, 12, 1.0)
    with functional_mode(layer):
        fn = lambda z: layer(z[None])[0]  # noqa: E731
        smax, smin, converged = matrix_free_extremes(
            fn, x, solver="lobpcg", tol=1e-12, maxiter=20, return_converged=True
        )
    assert converged is False and np.isnan(smin)


def test_progress_callback_and_cancel_hook():
    from osa_lab.errors import ComputationCancelledError
    from osa_lab.studies.jacobian import JacobianProgress

    layer, x = _osa_case(8, 8, 1.0)
    seen: list[JacobianProgress] = []
    spec = jacobian_spectrum(layer, x, algorithm="matrix-free", progress=seen.append)
    assert spec.converged and seen and seen[-1].products == spec.products
    assert all(0.0 <= p.fraction <= 1.0 for p in seen) and seen[0].algorithm == "matrix-free"
    calls = {"n": 0}

    def stop_after_ten() -> bool:
        calls["n"] += 1
        return calls["n"] > 10

    with pytest.raises(ComputationCancelledError, match="cancelled"):
        jacobian_spectrum(layer, x, algorithm="matrix-free", should_stop=stop_after_ten)
    assert calls["n"] == 11  # checked between products, stopped at once
    calls["n"] = 5
    with pytest.raises(ComputationCancelledError):  # between chunks of 8 rows (8 chunks)
        jacobian_spectrum(layer, x, algorithm="exact", chunk_size=8, should_stop=stop_after_ten)
    assert calls["n"] == 11
    profile_seen: list[JacobianProgress] = []
    df = jacobian_depth_profile("pure-osa", 2, 4, 4, seed=0, algorithm="matrix-free", progress=profile_seen.append)
    assert len(df) == 4 and {p.tasks for p in profile_seen} == {4}
    assert profile_seen[-1].fraction == 1.0
    calls["n"] = 0
    with pytest.raises(ComputationCancelledError):
        jacobian_depth_profile("pure-osa", 2, 4, 4, algorithm="exact", should_stop=stop_after_ten)


def test_unreasonable_sizes_are_refused_with_the_override():
    with pytest.raises(JacobianTooLargeError, match=r"262144 entries.*max_input_dim=262144"):
        jacobian_depth_profile("pure-osa", 1, 512, 512, algorithm="matrix-free")
    with pytest.raises(JacobianTooLargeError, match="max_input_dim"):
        jacobian_depth_profile("pure-osa", 1, 512, 512, algorithm="auto")
    layer, x = _osa_case(4, 4, 0.1)
    with pytest.raises(JacobianTooLargeError, match="max_input_dim=16"):
        jacobian_spectrum(layer, x, algorithm="matrix-free", max_input_dim=8)
    assert jacobian_spectrum(layer, x, algorithm="matrix-free", max_input_dim=16).converged


def test_cost_model_and_auto_resolution():
    from osa_lab.errors import ConfigurationError
    from osa_lab.studies.jacobian import estimate_jacobian_seconds, resolve_algorithm

    small = {m: estimate_jacobian_seconds(16, 16, 8, 1, m) for m in ("exact", "matrix-free", "auto")}
    assert 0 < small["exact"] < small["matrix-free"] and small["auto"] == small["exact"]
    big = estimate_jacobian_seconds(64, 64, 8, 1, "exact")
    assert big > small["exact"] and estimate_jacobian_seconds(16, 16, 8, 1, "exact", layers=[2]) < small["exact"]
    assert resolve_algorithm("auto", 16, 16, 8) == "exact"
    assert resolve_algorithm("auto", 256, 64, 12) == "matrix-free"  # above max_exact_dim
    assert resolve_algorithm("matrix-free", 4, 4) == "matrix-free"
    with pytest.raises(UnknownNameError):
        estimate_jacobian_seconds(16, 16, 8, 1, "fast")
    with pytest.raises(ConfigurationError, match="tokens"):
        estimate_jacobian_seconds(0, 16, 8)
    # auto's result is the resolved algorithm's result: a cache can key on the resolved algorithm.
    kw = dict(seed=0, layers=[1, 2])
    auto = jacobian_depth_profile("pure-osa", 2, 4, 4, algorithm="auto", **kw)
    resolved = resolve_algorithm("auto", 4, 4, 2, layers=[1, 2])
    assert set(auto["algorithm"]) == {resolved}
    same = jacobian_depth_profile("pure-osa", 2, 4, 4, algorithm=resolved, **kw)
    pd.testing.assert_frame_equal(auto, same)


def test_depth_facts_pass_hooks_and_skip_unresolved_kappa():
    from osa_lab.errors import ComputationCancelledError
    from osa_lab.studies import summaries as depth_facts

    with pytest.raises(ComputationCancelledError):
        depth_facts.jacobian_sweep(["pure-osa"], 2, 4, 4, seeds=1, should_stop=lambda: True)
    kappa = pd.DataFrame(
        {"preset": "p", "layer": [1, 1, 2, 2], "scope": "end_to_end", "kappa": [2.0, 8.0, 10.0, np.nan]}
    )
    table = depth_facts.kappa_table(kappa)
    assert table.loc[0, "kappa_first_layer"] == pytest.approx(4.0)
    assert table.loc[0, "kappa_last_layer"] == pytest.approx(10.0)  # the unresolved seed is left out
    assert table.loc[0, "unresolved"] == 1


def test_osa_layer_conditioning_issue_case_matrix_free():
    """The issue's N = d = 12, α = 3 layer (κ ≈ 8,600): matrix-free agrees with exact and says so."""
    exact = osa_layer_conditioning([3.0], [12], [12], seeds=[0], algorithm="exact").iloc[0]
    free = osa_layer_conditioning([3.0], [12], [12], seeds=[0], algorithm="matrix-free").iloc[0]
    assert exact["kappa"] > 5000 and bool(free["converged"]) is True
    assert free["kappa"] == pytest.approx(exact["kappa"], rel=1e-7)
