"""The small-N Chebyshev action of the OSA exponential.

``expm.chebyshev_action`` computes ``exp(S) V`` as ``Σ_k a_k W_k`` (Jacobi–Anger:
``a₀ = J₀(ρ)``, ``a_k = 2J_k(ρ)``, ``W_{k+1} = 2(S/ρ)W_k + W_{k−1}``) with a hand-written backward
(``expm.chebyshev._ChebyshevAction``); ``expm.osa_chebyshev_action`` fuses the backward down to q, k and
α (``expm.chebyshev._OSAChebyshevAction``) and ``osa()`` takes it for N ≤ 2·(2r) when a bound of ``‖S‖₂``
allows. Every test compares outputs AND gradients against float64 references: the dense
``torch.linalg.matrix_exp`` / ``scipy.linalg.expm`` and the autograd version
``expm.chebyshev_action_reference``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import scipy.special
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import osa_lab
from osa_lab.ops import cpu as cpu_kernels
from osa_lab.ops import expm
from tests.helpers import autograd_node_names


@pytest.fixture(params=["kernels", "pytorch"])
def fused_node(request, monkeypatch) -> str:
    """Run a float32 test on both paths of the fused action: the compiled CPU kernels
    (``osa_lab.ops.cpu``; skipped where none can be built) and the PyTorch reference path.
    Returns the name of the autograd node the path puts into the graph."""
    if request.param == "kernels":
        monkeypatch.setenv("OSA_LAB_CPU_KERNELS", "1")
        if not cpu_kernels.usable(torch.ones(1, 1, 1), torch.ones(1, 1, 1), torch.ones(1, 1, 1)):
            pytest.skip(f"CPU kernels: {cpu_kernels.status()}")
        return "_OSAChebyshevActionCPUBackward"
    monkeypatch.setenv("OSA_LAB_CPU_KERNELS", "0")
    return "_OSAChebyshevActionBackward"


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def skew(b: int, n: int, norm: float, seed: int, dtype=torch.float64) -> torch.Tensor:
    """A batch of skew-symmetric matrices whose largest ‖S‖₂ is ``norm``."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(b, n, n, dtype=torch.float64, generator=g)
    s = a - a.mT
    s = s / torch.linalg.matrix_norm(s, ord=2).amax() * norm
    return s.to(dtype)


def dense_reference(q, k, v, alpha):
    """float64 ``exp(S) V`` by torch.linalg.matrix_exp, differentiable (the dense reference)."""
    s = expm.skew_symmetric_from_qk(q.double(), k.double(), alpha.double() if torch.is_tensor(alpha) else alpha)
    return torch.linalg.matrix_exp(s) @ v.double()


@pytest.mark.parametrize("x", [0.0, 1e-3, 0.5, 0.94, 3.0, 10.0, 40.0])
def test_bessel_sequence_matches_scipy(x):
    got = expm.bessel_j_sequence(x, 30)
    want = scipy.special.jv(np.arange(30), x)
    assert np.max(np.abs(np.array(got) - want)) <= 1e-15 * max(1.0, x)


@pytest.mark.parametrize("norm", [0.0, 1e-3, 0.05, 0.5, 1.0, 1.9, 5.0, 9.0])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_degree_meets_truncation_bound(norm, dtype):
    """The chosen degree's tail 2 Σ_{k>m} |J_k(ρ)| (computed by scipy) is below the tolerance,
    the degree below it is not (the choice is minimal up to the bound's slack), and the cap holds."""
    degree = expm.chebyshev_degree(norm, dtype)
    unit = expm.ACTION_TOLERANCE[dtype]
    assert unit <= (1e-7 if dtype == torch.float32 else torch.finfo(dtype).eps / 2)  # 20× below float32's 2e-6
    if degree is None:
        assert dtype == torch.float64 and norm >= 5.0  # float64 needs more terms than the cap there
        return
    assert 1 <= degree <= expm.ACTION_MAX_DEGREE
    tail = 2 * np.sum(np.abs(scipy.special.jv(np.arange(degree + 1, degree + 60), norm)))
    assert tail <= unit
    if degree > 2:
        assert 2 * np.sum(np.abs(scipy.special.jv(np.arange(degree - 1, degree + 60), norm))) > unit


def test_degree_refuses_large_norms():
    assert expm.chebyshev_degree(50.0, torch.float32) is None
    assert expm.chebyshev_degree(math.inf, torch.float32) is None
    assert expm.chebyshev_degree(0.0, torch.float32) == 1
    # fewer terms than the Taylor series for the same bound (Taylor: ρ^{m+1}/(m+1)! ≤ unit)
    assert expm.chebyshev_degree(0.94, torch.float32) == 8  # Taylor needs 10 (at unit roundoff)
    assert expm.chebyshev_degree(0.85, torch.float32) == 7


@pytest.mark.parametrize("degree", [1, 2, 3, 8, 14])
@pytest.mark.parametrize("shape", [(3, 5, 2), (2, 20, 16), (1, 49, 16)])
def test_custom_backward_matches_autograd_reference(degree, shape):
    """_ChebyshevAction (hand-written backward) vs chebyshev_action_reference (autograd), float64."""
    b, n, d = shape
    s = skew(b, n, 0.7, seed=degree * 10 + n).requires_grad_(True)
    v = torch.randn(b, n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    y = expm.chebyshev_action(s, v, 0.9, degree)
    y_ref = expm.chebyshev_action_reference(s, v, 0.9, degree)
    assert rel_err(y, y_ref) <= 1e-14
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (s, v), g)
    ref = torch.autograd.grad(y_ref, (s, v), g)
    for a, r in zip(got, ref, strict=True):
        assert rel_err(a, r) <= 1e-13


def test_custom_backward_gradcheck():
    s = skew(2, 6, 0.4, seed=3).requires_grad_(True)
    v = torch.randn(2, 6, 3, dtype=torch.float64).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s, v: expm.chebyshev_action(s, v, 0.5, 6), (s, v))
    # only one input needing a gradient
    assert torch.autograd.gradcheck(lambda s: expm.chebyshev_action(s, v.detach(), 0.5, 4), (s,))
    assert torch.autograd.gradcheck(lambda v: expm.chebyshev_action(s.detach(), v, 0.5, 4), (v,))


def test_fused_osa_action_gradcheck():
    """_OSAChebyshevAction: the backward fused down to q, k, c (and v), by finite differences."""
    g = torch.Generator().manual_seed(11)
    q, k = (torch.randn(2, 7, 3, dtype=torch.float64, generator=g).requires_grad_(True) for _ in range(2))
    v = torch.randn(2, 7, 2, dtype=torch.float64, generator=g).requires_grad_(True)
    c = torch.tensor([0.05, -0.03], dtype=torch.float64, requires_grad=True)
    assert expm.osa_chebyshev_action(q, k, c, v) is not None  # the fused path runs at this ‖S‖
    assert torch.autograd.gradcheck(expm.osa_chebyshev_action, (q, k, c, v))
    # one input needing a gradient at a time
    for i in range(4):
        args = [t.detach().requires_grad_(j == i) for j, t in enumerate((q, k, c, v))]
        assert torch.autograd.gradcheck(expm.osa_chebyshev_action, tuple(args))


def test_fused_osa_action_gradients_match_the_autograd_reference(fused_node):
    """Float32 fused backward against float64 autograd through the plain-operation reference,
    α = 0 included (the ``skipless-osa-alpha0`` control): ``∂L/∂c = ⟨A k, q⟩`` needs no D."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(6, 20, 16, generator=g) for _ in range(3))
    gy = torch.randn(6, 20, 16, generator=g)
    for cval in (0.0, 0.01, -0.04):
        c = torch.full((6,), cval)
        fused = [t.clone().requires_grad_(True) for t in (q, k, c, v)]
        y = expm.osa_chebyshev_action(*fused)
        assert y is not None and fused_node in autograd_node_names(y)
        y.backward(gy)
        ref = [t.double().requires_grad_(True) for t in (q, k, c, v)]
        qk = ref[0] @ ref[1].mT
        y64 = expm.dense_exp((qk - qk.mT) * ref[2][:, None, None]) @ ref[3]
        y64.backward(gy.double())
        assert rel_err(y.double(), y64) <= 2e-6
        for a, b in zip(fused, ref, strict=True):
            assert rel_err(a.grad, b.grad) <= 2e-5  # (α = 0: ∂L/∂q = ∂L/∂k = 0 exactly on both sides)


def test_fused_osa_action_results_do_not_alias_its_scratch_buffers():
    """The bound's S² and the backward's N×N temporaries live in reused per-thread buffers;
    outputs and gradients must be fresh tensors that later calls leave alone."""
    g = torch.Generator().manual_seed(8)
    first = [torch.randn(4, 24, 8, generator=g).requires_grad_(True) for _ in range(2)]
    c = torch.full((4,), 0.05, requires_grad=True)
    v = torch.randn(4, 24, 8, generator=g).requires_grad_(True)
    y = expm.osa_chebyshev_action(first[0], first[1], c, v)
    y.backward(torch.ones_like(y))
    kept = [t.detach().clone() for t in (y, first[0].grad, first[1].grad, c.grad, v.grad)]
    buffers = [b.data_ptr() for b in expm.ACTION_SCRATCH.buffers]
    assert len(buffers) == 2  # the fused path did use the scratch buffers
    for t in (y, first[0].grad, first[1].grad, c.grad, v.grad):
        assert t.data_ptr() not in buffers
    q2, k2, v2 = (torch.randn(4, 24, 8, generator=g).requires_grad_(True) for _ in range(3))
    expm.osa_chebyshev_action(q2, k2, c.detach(), v2).sum().backward()
    for a, b in zip(kept, (y, first[0].grad, first[1].grad, c.grad, v.grad), strict=True):
        assert torch.equal(a, b.detach())
    assert expm.release_scratch() >= 2 * 4 * 24 * 24 * 4 and expm.ACTION_SCRATCH.buffers == []


@pytest.mark.parametrize("norm", [1e-3, 0.1, 1.0, 1.9, 6.0])
def test_planned_action_matches_scipy(norm):
    """With its own degree, the action equals scipy.linalg.expm(S) @ V to the dtype's accuracy."""
    for dtype, tol in ((torch.float64, 1e-14), (torch.float32, 3e-7)):
        s = skew(4, 20, norm, seed=int(norm * 1000))
        v = torch.randn(4, 20, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        degree = expm.chebyshev_degree(norm * 1.0001, dtype)
        if degree is None:
            continue
        got = expm.chebyshev_action(s.to(dtype), v.to(dtype), norm * 1.0001, degree)
        ref = torch.from_numpy(np.stack([scipy.linalg.expm(m) @ x for m, x in zip(s.numpy(), v.numpy(), strict=True)]))
        assert rel_err(got, ref) <= tol, (dtype, degree)


def test_default_bound_and_degree():
    """Without ρ and degree the action bounds ‖S‖₂ itself; a bound past the cap raises."""
    s = skew(3, 12, 0.8, seed=9)
    v = torch.randn(3, 12, 4, dtype=torch.float64)
    assert rel_err(expm.chebyshev_action(s, v), torch.linalg.matrix_exp(s) @ v) <= 1e-14
    with pytest.raises(ValueError, match="ACTION_MAX_DEGREE"):
        expm.chebyshev_action(s * 100, v)


def test_non_batched_shapes_use_the_reference():
    s = skew(1, 7, 0.3, seed=5)[0]
    v = torch.randn(7, 2, dtype=torch.float64)
    got = expm.chebyshev_action(s, v, 0.3, 12)
    assert rel_err(got, torch.linalg.matrix_exp(s) @ v) <= 1e-14


ALPHAS = [1e-3, 0.01, 0.03, 0.1, 1.0]  # 1.0: ‖S‖₂ ≈ 20 at N = 49, past the action (fallback)


@pytest.mark.parametrize("method", ["qr", "auto"])
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("n,r,d", [(20, 16, 16), (49, 16, 16), (9, 4, 3), (1, 4, 2)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_osa_small_n_matches_dense_float64(method, alpha, n, r, d, dtype):
    """osa() on the small-N path (N ≤ 4r): outputs and gradients of q, k, v, α against the dense
    float64 torch.linalg.matrix_exp reference."""
    g = torch.Generator().manual_seed(n * 100 + r)
    q = torch.randn(2, 3, n, r, dtype=torch.float64, generator=g)
    k = torch.randn(2, 3, n, r, dtype=torch.float64, generator=g)
    v = torch.randn(2, 3, n, d, dtype=torch.float64, generator=g)
    a = torch.full((3,), alpha, dtype=torch.float64) * torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    leaves = [t.to(dtype).requires_grad_(True) for t in (q, k, v, a)]
    y = osa_lab.osa(*leaves[:3], leaves[3], method=method)
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, v, a)]
    ref = dense_reference(*ref_leaves[:3], ref_leaves[3])
    out_tol, grad_tol = (1e-13, 1e-12) if dtype == torch.float64 else (2e-6, 2e-5)
    assert rel_err(y, ref) <= out_tol
    w = torch.randn(ref.shape, dtype=torch.float64, generator=g)
    got = torch.autograd.grad((y.double() * w).sum(), leaves)
    want = torch.autograd.grad((ref * w).sum(), ref_leaves)
    for name, a_, b_ in zip("qkvα", got, want, strict=True):
        assert rel_err(a_, b_) <= grad_tol, name


def test_small_n_action_path_is_taken_and_matches_previous_path():
    """At a trained network's norms (‖S‖₂ ≈ 1) the Chebyshev action runs and agrees with the
    previous small-N path (action=False) and with float64."""
    g = torch.Generator().manual_seed(7)
    n, r = 20, 16
    q = torch.randn(8, n, r, dtype=torch.float64, generator=g)
    k = torch.randn(8, n, r, dtype=torch.float64, generator=g)
    v = torch.randn(8, n, r, dtype=torch.float64, generator=g)
    scale = torch.full((8,), 0.02, dtype=torch.float64)
    j = expm.osa_skew_core(r, scale)
    u = torch.cat([q, k], -1)
    s = u @ j @ u.mT
    bound = float(torch.linalg.matrix_norm(s).max())
    assert 0.3 < float(torch.linalg.matrix_norm(s, ord=2).max()) and expm.chebyshev_degree(bound, torch.float32)
    ref = torch.linalg.matrix_exp(s) @ v
    for dtype, tol in ((torch.float32, 2e-6), (torch.float64, 1e-13)):
        new = expm.qr._small_n_action(u.to(dtype), j, v.to(dtype), osa_core=True)
        old = expm.qr._small_n_action(u.to(dtype), j, v.to(dtype), action=False)
        assert rel_err(new, ref) <= tol and rel_err(old, ref) <= tol


def test_large_norm_falls_back_to_previous_path():
    """Beyond the action's range the previous paths run (float64 core or QR), still accurate."""
    g = torch.Generator().manual_seed(8)
    q = torch.randn(2, 20, 16, generator=g)
    k = torch.randn(2, 20, 16, generator=g)
    v = torch.randn(2, 20, 16, generator=g)
    s = expm.skew_symmetric_from_qk(q, k, 4.0)
    assert expm.chebyshev_degree(float(torch.linalg.matrix_norm(s, ord=2).max()), torch.float32) is None
    y = osa_lab.osa(q, k, v, 4.0, method="auto")
    assert rel_err(y, dense_reference(q, k, v, 4.0)) <= 2e-6


def test_vmap_falls_back():
    """Under torch.func.vmap the norm has no single value: the previous path runs (no crash)."""
    q = torch.randn(3, 2, 6, 4, dtype=torch.float64)
    k = torch.randn(3, 2, 6, 4, dtype=torch.float64)
    v = torch.randn(3, 2, 6, 4, dtype=torch.float64)
    y = torch.func.vmap(lambda a, b, c: osa_lab.osa(a, b, c, 0.01, method="qr"))(q, k, v)
    assert rel_err(y, dense_reference(q, k, v, 0.01)) <= 1e-12


def test_torch_func_and_forward_ad_use_the_reference():
    """jacrev/jacfwd and forward-mode AD run the autograd reference (the hand-written backward
    supports neither); the Jacobians match the float64 dense reference's."""
    from torch.func import jacfwd, jacrev

    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(8, 4, dtype=torch.float64, generator=g) for _ in range(3))

    def f(x):
        return osa_lab.osa(q, k, x, 0.01, method="qr")

    def ref(x):
        return dense_reference(q, k, x, 0.01)

    want = jacrev(ref)(v)
    assert rel_err(jacrev(f)(v), want) <= 1e-12 and rel_err(jacfwd(f)(v), want) <= 1e-12
    from torch.autograd import forward_ad

    tangent = torch.randn(v.shape, dtype=torch.float64, generator=g)
    with forward_ad.dual_level():
        out = f(forward_ad.make_dual(v, tangent))
        jvp = forward_ad.unpack_dual(out).tangent
    assert rel_err(jvp, torch.einsum("ijkl,kl->ij", want, tangent)) <= 1e-12


def test_osa_takes_the_fused_path_at_small_n(fused_node):
    """osa() at the MNIST token count (N = 49, r = 16, trained-size ‖S‖) runs the fused action."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(4, 2, 49, 16, generator=g).requires_grad_(True) for _ in range(3))
    y = osa_lab.osa(q, k, v, torch.tensor([0.01, 0.02], requires_grad=True))
    assert fused_node in autograd_node_names(y)


def _head_split(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(batch, N, heads·r) → the (batch, heads, N, r) view a layer passes to osa()."""
    b, n, width = t.shape
    return t.view(b, n, heads, width // heads).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("n", [7, 20, 49])
def test_osa_on_head_split_views_matches_dense_float64_and_keeps_the_layers_layout(dtype, n, fused_node):
    """A layer's head-split views go into the fused action as they are: the output takes v's
    (batch, N, heads, d) layout, so the merge back to (batch, N, heads·d) is a view, and output
    and gradients (of the token tensors and the per-head α) match the float64 dense reference."""
    g = torch.Generator().manual_seed(n)
    heads, r = 3, 16  # N ≤ 4r: the fused small-N path
    tokens = [torch.randn(2, n, heads * r, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True) for _ in range(3)]
    alpha = torch.tensor([0.1, -0.07, 0.0], dtype=dtype, requires_grad=True)  # ‖S‖₂ within float64's degree cap
    q, k, v = (_head_split(t, heads) for t in tokens)
    y = osa_lab.osa(q, k, v, alpha)
    assert (fused_node if dtype == torch.float32 else "_OSAChebyshevActionBackward") in autograd_node_names(y)
    assert y.shape == v.shape and y.stride() == v.stride()
    merged = y.transpose(1, 2).reshape(2, n, heads * r)
    assert merged.data_ptr() == y.data_ptr()  # a view: no copy for the merge
    gy = torch.randn(2, n, heads * r, generator=g, dtype=torch.float64)
    merged.backward(gy.to(dtype))

    ref_leaves = [t.detach().double().requires_grad_(True) for t in (*tokens, alpha)]
    q64, k64, v64 = (_head_split(t, heads) for t in ref_leaves[:3])
    y64 = dense_reference(q64, k64, v64, ref_leaves[3])  # α per head: (heads,) over (batch, heads)
    y64.transpose(1, 2).reshape(2, n, heads * r).backward(gy)
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    assert rel_err(y, y64) <= tol
    for got, want in zip((*tokens, alpha), ref_leaves, strict=True):
        assert rel_err(got.grad, want.grad) <= 10 * tol


def test_fused_osa_action_returns_the_output_checks_norms():
    """``norms=True``: the squared norms of every output and input matrix, as the two norm
    passes of the output check would give them, from the action's packed data."""
    g = torch.Generator().manual_seed(4)
    tokens = [torch.randn(3, 20, 32, generator=g) for _ in range(3)]
    q, k, v = (_head_split(t, 2) for t in tokens)
    c = torch.full((3, 2), 0.03)
    y, (y_sq, v_sq) = expm.osa_chebyshev_action(q, k, c, v, norms=True)
    assert y_sq.dtype == v_sq.dtype == torch.float64 and y_sq.shape == v_sq.shape == (6,)
    torch.testing.assert_close(y_sq, y.double().square().sum((-2, -1)).reshape(-1), rtol=1e-5, atol=0)
    torch.testing.assert_close(v_sq, v.double().square().sum((-2, -1)).reshape(-1), rtol=1e-5, atol=0)
    assert torch.equal(y, expm.osa_chebyshev_action(q, k, c, v))


def test_fused_osa_action_on_strided_views_gradcheck_and_second_order():
    """The fused action on head-split views, by finite differences to first and second order
    (the second through its plain-operation reference)."""
    g = torch.Generator().manual_seed(2)
    tokens = [torch.randn(2, 5, 6, dtype=torch.float64, generator=g).requires_grad_(True) for _ in range(3)]
    c = torch.tensor([[0.05, -0.03, 0.02], [0.0, 0.04, -0.01]], dtype=torch.float64, requires_grad=True)

    def fused(qt, kt, c, vt):
        y = expm.osa_chebyshev_action(_head_split(qt, 3), _head_split(kt, 3), c, _head_split(vt, 3))
        assert y is not None
        return y.transpose(1, 2).reshape(2, 5, 6)

    args = (tokens[0], tokens[1], c, tokens[2])
    assert torch.autograd.gradcheck(fused, args)
    assert torch.autograd.gradgradcheck(fused, args)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 24),
    r=st.integers(1, 12),
    rank_one=st.booleans(),
    scale=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**31 - 1),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
@example(n=16, r=2, rank_one=True, scale=1.0, seed=0, dtype=torch.float32)  # D ≈ 1e-16: D²'s squares underflow
def test_skew_spectral_bound_bounds_the_spectral_norm(n, r, rank_one, scale, seed, dtype):
    """The fused action's ‖S‖₂ bound is at least the exact ‖S‖₂ and at most ‖S‖_F/√2 (within
    rounding), also for rank-deficient [q k] (k ∥ q)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(3, n, r, dtype=torch.float64, generator=g) * scale
    k = 0.5 * q if rank_one else torch.randn(3, n, r, dtype=torch.float64, generator=g)
    qk = q @ k.mT
    d64 = qk - qk.mT
    d = d64.to(dtype)
    bound = expm.skew_spectral_bound(d).double()
    exact = torch.linalg.matrix_norm(d.double(), ord=2)
    fro = torch.linalg.matrix_norm(d.double())
    assert bool((bound >= exact).all())
    assert bool((bound <= fro / 2**0.5 * (1 + 1e-3) + 1e-30).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [2, 20, 49, 64])
def test_skew_spectral_bound_is_the_norm_itself_for_one_eigenvalue_pair(n, dtype):
    """``D = q kᵀ − k qᵀ`` with single vectors q, k has one pair ``±iθ``: ``‖D²‖_F² = 2θ⁴``, so the
    bound equals ``‖D‖₂`` up to its rounding allowance (``N² u``) and slack, and never falls below it."""
    g = torch.Generator().manual_seed(n)
    q, k = (torch.randn(8, n, 1, dtype=torch.float64, generator=g) for _ in range(2))
    d = (q @ k.mT - k @ q.mT).to(dtype)
    exact = torch.linalg.matrix_norm(d.double(), ord=2)
    ratio = expm.skew_spectral_bound(d).double() / exact
    allowance = n * n * torch.finfo(dtype).eps / 2 + expm.bounds.NORM_BOUND_SLACK
    assert bool((ratio >= 1).all())
    assert bool((ratio <= 1 + 2 * allowance).all()), ratio


@pytest.mark.parametrize("dtype, size", [(torch.float32, 1e-30), (torch.float64, 1e-200)], ids=["f32", "f64"])
def test_skew_spectral_bound_holds_for_matrices_near_the_bottom_of_the_range(dtype, size):
    """Squares of entries this small underflow: the bound falls back to the scaled ‖D‖_F/√2 there,
    while a matrix of ordinary size in the same batch keeps the tighter bound."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(2, 9, 9, dtype=torch.float64, generator=g)
    scale = torch.tensor([size, 1.0], dtype=torch.float64)
    d = ((a - a.mT) * scale[:, None, None]).to(dtype)
    bound = expm.skew_spectral_bound(d).double()
    unscaled = d.double() / scale[:, None, None]  # the references' own squares would underflow too
    exact = torch.linalg.matrix_norm(unscaled, ord=2) * scale
    fro = torch.linalg.matrix_norm(unscaled) * scale
    assert bool((bound >= exact).all()) and bool((bound <= fro * (1 + 1e-3)).all())
    assert float(bound[1]) < 0.99 * float(fro[1])  # the ordinary matrix: (‖D²‖_F²/2)^¼, not ‖D‖_F/√2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("steps", [1, 3, 40])
def test_skew_spectral_bound_holds_for_subnormal_matrices(dtype, steps):
    """Entries a few steps above zero on the subnormal grid: the fallback's ‖D‖_F/√2 is rounded
    there by more than any relative slack, so the bound must still be at least ‖D‖₂."""
    a = steps * torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps  # a subnormal multiple
    d = torch.tensor([[0.0, a, -a], [-a, 0.0, a], [a, -a, 0.0]], dtype=torch.float64).to(dtype)[None]
    assert float(d.abs().max()) > 0  # representable, not flushed
    exact = torch.linalg.matrix_norm(d.double(), ord=2)
    assert bool((expm.skew_spectral_bound(d).double() >= exact).all())


def test_skew_spectral_bound_is_tighter_than_frobenius_for_random_heads():
    """For random q, k at the MNIST-1D head size the bound sits well below ‖S‖_F (the degree it saves)."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(64, 20, 16, dtype=torch.float64, generator=g) for _ in range(2))
    qk = q @ k.mT
    d = qk - qk.mT
    ratio = torch.linalg.matrix_norm(d) / expm.skew_spectral_bound(d)
    assert float(ratio.median()) > 1.6
