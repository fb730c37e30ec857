"""The low-rank engines' own pieces: the skew exponential, its scratch buffers, the blocked Cholesky.

References: ``scipy.linalg.expm`` and LAPACK (``torch.linalg.cholesky`` / ``solve_triangular``)
in float64.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import scipy.linalg
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import osa_lab
from osa_lab.ops import expm
from tests.helpers import rel_err


def _skew_batch(n: int, norm2: float, *, batch: int = 3, seed: int = 0) -> torch.Tensor:
    """Random skew-symmetric (batch, n, n) float64 matrices with spectral norm ``norm2``."""
    a = torch.randn(batch, n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    m = a - a.mT
    if n > 1:
        m = m / torch.linalg.matrix_norm(m, 2)[:, None, None].clamp_min(1e-300)
    return m * norm2


def _scipy_expm(m: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.stack([scipy.linalg.expm(x) for x in m.double().numpy()]))


@pytest.mark.parametrize("n", [1, 2, 7, 32, 128], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("norm2", [0.0, 1e-8, 1e-3, 0.5, 3.0, 30.0, 300.0, 3000.0], ids=lambda x: f"norm{x:g}")
def test_core_skew_exp_matches_scipy_float64(n, norm2):
    m = _skew_batch(n, norm2, seed=n)
    got = expm.core_skew_exp(m)
    # exp is ‖M‖-conditioned on skew matrices: scipy's own error reaches ≈ 6e-15·‖M‖₂ here
    # (see the exact 2 × 2 rotations below, where ours is the more accurate of the two).
    tol = 1e-14 * max(1.0, norm2) * math.sqrt(max(n, 1))
    assert rel_err(got, _scipy_expm(m)) <= tol
    got_minus_i = expm.core_skew_exp(m, minus_identity=True)
    assert float((got_minus_i - (_scipy_expm(m) - torch.eye(n))).norm()) <= tol * math.sqrt(n)
    assert expm.orthogonality_error(got).max() <= 1e-13 * max(1.0, norm2)


@pytest.mark.parametrize("theta", [0.3, 3.0, 30.0, 300.0, 3000.0], ids=lambda x: f"theta{x:g}")
def test_core_skew_exp_exact_rotations(theta):
    """exp([[0, θ], [−θ, 0]]) is the rotation by θ: exact to ≈ eps·θ (scipy: ≈ 6e-15·θ)."""
    m = torch.tensor([[[0.0, theta], [-theta, 0.0]]], dtype=torch.float64)
    exact = torch.tensor([[[math.cos(theta), math.sin(theta)], [-math.sin(theta), math.cos(theta)]]], dtype=torch.float64)
    assert rel_err(expm.core_skew_exp(m), exact) <= 1e-15 * max(1.0, theta)


@pytest.mark.parametrize("norm2", [0.1, 10.0, 300.0], ids=lambda x: f"norm{x:g}")
def test_core_skew_exp_float32_and_tolerance(norm2):
    m = _skew_batch(16, norm2, seed=3)
    ref = _scipy_expm(m)
    assert rel_err(expm.core_skew_exp(m.float()), ref) <= 1e-6 * max(1.0, norm2)
    # A looser truncation tolerance (used for float32 inputs) keeps the float64 error near
    # 2^s · tol and never worse than the float32 budget it serves.
    assert rel_err(expm.core_skew_exp(m, tol=1e-10), ref) <= 1e-8 * max(1.0, norm2)


def test_core_skew_exp_uses_fewer_squarings_than_the_one_norm_needs():
    """The spectral-radius plan: at ‖M‖₂ = 300 the 1-norm is ≈ 3× larger; the plan follows ‖M‖₂."""
    m = _skew_batch(128, 300.0, batch=2)
    one_norm = float(m.abs().sum(-2).amax())
    assert one_norm > 2 * 300.0
    m4 = m @ m @ m @ m
    rho = min(float((m @ m).abs().sum(-1).amax()) ** 0.5, float(m4.abs().sum(-1).amax()) ** 0.25)
    assert 300.0 <= rho <= 1.5 * 300.0  # a true upper bound of ρ(M), and a tight one
    unit = 2.0**-53
    _, _, squarings = expm.core._skew_exp_plan(rho, unit, blocks=(4,))
    _, _, squarings_one_norm = expm.core._skew_exp_plan(one_norm, unit, blocks=(4,))
    assert squarings < squarings_one_norm


def test_core_skew_exp_gradcheck():
    leaf = _skew_batch(6, 4.0, batch=2).requires_grad_(True)
    assert torch.autograd.gradcheck(expm.core_skew_exp, (leaf,), eps=1e-6, atol=1e-8)
    leaf_small = _skew_batch(5, 0.01, batch=2).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: expm.core_skew_exp(x, minus_identity=True), (leaf_small,))


def test_core_skew_exp_keeps_non_finite_input_in_its_own_slot():
    """A NaN/Inf matrix gives a non-finite result; the other matrices of the batch stay exact."""
    m = _skew_batch(8, 2.0)
    ref = _scipy_expm(m)
    m[1, 2, 3] = float("nan")
    m[2, 0, 1] = float("inf")
    out = expm.core_skew_exp(m)
    assert rel_err(out[0], ref[0]) <= 1e-14
    assert not bool(torch.isfinite(out[1]).all()) and not bool(torch.isfinite(out[2]).all())
    u = torch.randn(3, 40, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    w = torch.randn(3, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    j, v = w - w.mT, torch.randn(3, 40, 2, dtype=torch.float64)
    exact = torch.linalg.matrix_exp(u @ j @ u.mT) @ v
    u[1, 5, 2] = float("nan")
    y = osa_lab.lowrank_action(u, j, v, engine="qr")
    assert rel_err(y[0], exact[0]) <= 1e-12 and rel_err(y[2], exact[2]) <= 1e-12
    assert not bool(torch.isfinite(y[1]).all())


def test_core_skew_exp_scales_each_matrix_when_norms_differ_widely():
    """A tiny-norm matrix batched with a huge-norm one is not squared 2^Δs times too often."""
    m = torch.cat([_skew_batch(16, 0.1, batch=1, seed=1), _skew_batch(16, 1e7, batch=1, seed=2)])
    out = expm.core_skew_exp(m)
    assert rel_err(out[0], _scipy_expm(m[:1])[0]) <= 1e-14
    assert float(expm.orthogonality_error(out[1:])) <= 1e-6  # ‖M‖ = 1e7: the product of many squarings
    alone = expm.core_skew_exp(m[:1])
    assert rel_err(out[0], alone[0]) <= 1e-14


def test_core_skew_exp_rejects_a_bad_tolerance():
    from osa_lab.errors import OSAInputError

    for tol in (0, -1e-3, 1.5, "x"):
        with pytest.raises(OSAInputError, match="tol"):
            expm.core_skew_exp(_skew_batch(4, 1.0), tol=tol)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 40), norm2=st.floats(0.0, 200.0), seed=st.integers(0, 2**16))
def test_core_skew_exp_is_orthogonal_with_det_one(n, norm2, seed):
    """docs/design.md §1: exp of a skew-symmetric matrix is orthogonal with determinant +1."""
    e = expm.core_skew_exp(_skew_batch(n, norm2, batch=2, seed=seed))
    assert float(expm.orthogonality_error(e).max()) <= 1e-12 * max(1.0, norm2)
    assert torch.allclose(torch.linalg.det(e), torch.ones(2, dtype=torch.float64), atol=1e-10)


# ---------------------------------------------------------------------------------------------
# Scratch buffers: reused between calls, never visible to the caller
# ---------------------------------------------------------------------------------------------


def test_core_skew_exp_results_do_not_alias_scratch_buffers():
    m1, m2 = _skew_batch(32, 5.0, seed=1), _skew_batch(32, 7.0, seed=2)
    e1 = expm.core_skew_exp(m1)
    kept = e1.clone()
    e2 = expm.core_skew_exp(m2)
    d1 = expm.core_skew_exp(m1, minus_identity=True)
    expm.core_skew_exp(m2, minus_identity=True)
    assert torch.equal(e1, kept)
    assert rel_err(d1 + torch.eye(32, dtype=torch.float64), kept) <= 1e-15
    assert e1.data_ptr() != e2.data_ptr()
    assert all(e1.data_ptr() != b.data_ptr() for b in expm.SCRATCH.buffers)


def test_gram_engine_outputs_survive_later_calls():
    """The Gram core's L⁻¹ and exp(M) − I live in scratch buffers; its outputs must not."""
    g = torch.Generator().manual_seed(0)
    q1, k1, v1 = (torch.randn(4, 300, 16, generator=g) for _ in range(3))
    q2, k2, v2 = (torch.randn(4, 300, 16, generator=g) for _ in range(3))
    y1 = osa_lab.osa(q1, k1, v1, 0.5, method="gram")
    kept = y1.clone()
    y2 = osa_lab.osa(q2, k2, v2, 0.5, method="gram")
    assert torch.equal(y1, kept)
    assert rel_err(y2, osa_lab.osa(q2.double(), k2.double(), v2.double(), 0.5, method="dense")) <= 2e-6


def test_concurrent_threads_get_their_own_scratch():
    """Two threads running the engine at once (as the dashboard's workers do) give serial results."""
    g = torch.Generator().manual_seed(1)
    inputs = [tuple(torch.randn(8, 400, 16, dtype=torch.float64, generator=g) for _ in range(3)) for _ in range(4)]
    serial = [osa_lab.osa(q, k, v, 0.7, method="gram") for q, k, v in inputs]
    results: dict[int, list[torch.Tensor]] = {}

    def work(tid: int) -> None:
        results[tid] = [osa_lab.osa(q, k, v, 0.7, method="gram") for _ in range(5) for q, k, v in inputs]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for tid in range(2):
        for i, y in enumerate(results[tid]):
            assert torch.equal(y, serial[i % len(inputs)]), (tid, i)


def test_scratch_limit_falls_back_to_fresh_buffers(monkeypatch):
    monkeypatch.setattr(expm.scratch, "SCRATCH_LIMIT_BYTES", 0)
    m = _skew_batch(16, 20.0)
    assert rel_err(expm.core_skew_exp(m), _scipy_expm(m)) <= 1e-13


def _thp_mode() -> str | None:
    """The kernel's transparent-huge-page mode (the bracketed word), None where it has none."""
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else None


def test_fresh_output_has_the_requested_shape_dtype_and_layout():
    like = torch.empty(4, 6, 3, dtype=torch.float64).transpose(0, 1)
    out = expm.fresh_output(like)
    assert out.shape == like.shape and out.dtype == like.dtype and out.is_contiguous()
    assert expm.fresh_output(like, (2, 5)).shape == (2, 5)


def test_huge_pages_are_not_advised_for_meta_small_or_overlapping_tensors():
    assert not expm.advise_huge_pages(torch.empty(8, 2**20, device="meta"))
    assert not expm.advise_huge_pages(torch.empty(1000))  # no whole 2 MiB page inside
    big = torch.empty(4 * 2**20)
    assert not expm.advise_huge_pages(big[-1:].expand(4 * 2**20))  # would reach past big's storage


def test_gram_output_under_vmap_and_forward_mode_ad():
    from torch.autograd import forward_ad

    gen = torch.Generator().manual_seed(4)
    a, b, v = (torch.randn(3, 2, 30, 4, dtype=torch.float64, generator=gen) for _ in range(3))
    c = torch.randn(3, 2, 8, 4, dtype=torch.float64, generator=gen)
    ref = v + a @ c[..., :4, :] + b @ c[..., 4:, :]
    assert rel_err(torch.func.vmap(expm.gram_output)(a, b, c, v), ref) <= 1e-14
    tangent = torch.randn(v.shape, dtype=v.dtype, generator=gen)
    with forward_ad.dual_level():
        y = expm.gram_output(a[0], b[0], c[0], forward_ad.make_dual(v[0], tangent[0]))
        assert rel_err(forward_ad.unpack_dual(y).tangent, tangent[0]) <= 1e-14  # ∂Y/∂V = I


@pytest.mark.skipif(_thp_mode() != "madvise", reason="huge pages need no advice ('always') or take none ('never')")
def test_fresh_output_first_write_faults_huge_pages_not_small_ones():
    """A 32 MiB fresh output faulted 8,193 times at 4 KiB per page (glibc maps blocks this size
    from the kernel); with huge pages advised, the whole 2 MiB pages fault once each."""
    import resource

    like = torch.empty(8, 16384, 64)  # 32 MiB
    assert like.numel() * like.element_size() >= expm.HUGE_PAGE_MIN_BYTES
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    out = expm.fresh_output(like)
    out.fill_(1.0)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < 8193 // 4, faults  # 4 KiB pages everywhere would be 8,193 (measured: 528)


def test_gram_output_matches_its_definition():
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 50, 3, generator=gen), torch.randn(2, 50, 4, generator=gen)
    c, v = torch.randn(2, 7, 5, generator=gen), torch.randn(2, 50, 5, generator=gen)
    ref = v.double() + a.double() @ c[:, :3].double() + b.double() @ c[:, 3:].double()
    assert rel_err(expm.gram_output(a, b, c, v), ref) <= 1e-6
    leaves = [x.double().requires_grad_(True) for x in (a, b, c, v)]
    assert torch.autograd.gradcheck(expm.gram_output, leaves)  # autograd's path where inputs need grad


@pytest.mark.parametrize("dropped", [False, True], ids=["all-kept", "one-dropped"])
def test_gram_action_backward_gives_no_gradient_from_a_failed_factorisation(dropped):
    """A matrix whose Cholesky factorisation failed gets no gradient from the Gram engine (its
    result is not to be trusted); the others get exactly their float64 gradients."""
    gen = torch.Generator().manual_seed(11)
    a, b, v = (torch.randn(3, 40, 4, dtype=torch.float64, generator=gen) for _ in range(3))
    if dropped:
        b[1] = a[1]  # U = [a a] is rank deficient: the factorisation of G fails
    j = expm.osa_skew_core(4, torch.full((3,), 0.3, dtype=torch.float64))
    leaves = [x.clone().requires_grad_(True) for x in (a, b, v)]
    y, est = expm.gram_action(*leaves[:2], j, leaves[2])
    assert bool(torch.isinf(est[1])) == dropped
    gy = torch.randn(y.shape, dtype=y.dtype, generator=gen)
    grads = torch.autograd.grad(y, leaves, gy)
    for i in range(3):
        if dropped and i == 1:
            assert all(torch.equal(g[1], torch.zeros_like(g[1])) for g in grads)
            continue
        refs = [x[i : i + 1].detach().clone().requires_grad_(True) for x in (a, b, v)]
        y_ref = expm.osa_matrix(refs[0], refs[1], 0.3 * 2) @ refs[2]  # osa_matrix takes α, scale = α/√r
        ref_grads = torch.autograd.grad(y_ref, refs, gy[i : i + 1])
        for g, ref in zip(grads, ref_grads, strict=True):
            assert rel_err(g[i : i + 1], ref) <= 1e-9


# ---------------------------------------------------------------------------------------------
# Blocked Cholesky with its inverse
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [2, 31, 32, 128], ids=lambda w: f"m{w}")
def test_blocked_cholesky_matches_lapack(width):
    u = torch.randn(5, 3 * width, width, dtype=torch.float64, generator=torch.Generator().manual_seed(width))
    g = u.mT @ u
    chol, chol_inv, ok = expm.cholesky_with_inverse(g)
    ref = torch.linalg.cholesky(g)
    assert bool(ok.all())
    assert rel_err(chol, ref) <= 1e-13
    assert rel_err(chol_inv, torch.linalg.inv(ref)) <= 1e-12
    assert torch.equal(chol.triu(1), torch.zeros_like(chol))


@pytest.mark.parametrize("failing_block", ["first", "second"])
def test_blocked_cholesky_flags_rank_deficient_matrices(failing_block):
    width = 64
    u = torch.randn(3, 200, width, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    col = 3 if failing_block == "first" else 40
    u[1, :, col] = 0.0  # a zero column: G has a zero pivot, the factorisation must fail
    _, _, ok = expm.cholesky_with_inverse(u.mT @ u)
    assert ok.tolist() == [True, False, True]


def test_gram_engine_flags_rank_deficient_heads_for_the_qr_fallback():
    """lowrank = Gram + QR fallback stays exact when one head has q = k (singular Gram matrix)."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(3, 200, 16, dtype=torch.float64, generator=g) for _ in range(3))
    k[1] = q[1]
    ref = osa_lab.osa(q, k, v, 0.8, method="dense")
    assert rel_err(osa_lab.osa(q, k, v, 0.8, method="lowrank"), ref) <= 1e-10


def test_release_scratch_frees_this_threads_buffers():
    m = _skew_batch(32, 5.0)
    expm.release_scratch()  # whatever earlier tests left in this thread
    before = expm.core_skew_exp(m)
    assert expm.release_scratch() == 6 * m.numel() * m.element_size()
    assert expm.SCRATCH.buffers == [] and expm.release_scratch() == 0
    assert torch.equal(expm.core_skew_exp(m), before)  # re-allocated, same result


def test_scratch_buffers_work_after_inference_mode():
    """Buffers first made under torch.inference_mode() must stay writable outside it."""
    expm.release_scratch()
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 256, 32, generator=g) for _ in range(3))
    with torch.inference_mode():
        inside = osa_lab.osa(q, k, v, 0.5, method="gram")
    outside = osa_lab.osa(q, k, v, 0.5, method="gram")
    assert torch.equal(inside, outside)


def test_gram_core_broadcasts_and_composes_with_vmap():
    g = torch.Generator().manual_seed(6)
    u = torch.randn(3, 200, 64, dtype=torch.float64, generator=g)
    gram = u.mT @ u
    j = expm.osa_skew_core(32, torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64))
    f_all, _ = expm.gram_core(gram, j)
    f_broadcast, _ = expm.gram_core(gram[:1], j)  # one G against three J
    for i in range(3):
        assert rel_err(f_broadcast[i], expm.gram_core(gram[:1], j[i : i + 1])[0][0]) <= 1e-13
    f_vmap = torch.func.vmap(lambda a, b: expm.gram_core(a, b)[0])(gram[None].expand(2, -1, -1, -1), j[None].expand(2, -1, -1, -1))
    assert rel_err(f_vmap[1], f_all) <= 1e-12
