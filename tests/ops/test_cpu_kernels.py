"""The fused CPU kernels of the small-N Chebyshev action (``osa_lab.ops.cpu``) against their
references: the PyTorch path of ``expm.chebyshev`` (``OSA_LAB_CPU_KERNELS=0``) and float64 dense
``torch.linalg.matrix_exp``, outputs and gradients, over grids of N, r, d, ‖S‖ and layouts; the
build's safety (a private, removed directory) and its fallback without a compiler.

The kernels are built by the machine's C compiler; on a machine without one these tests are
skipped (the PyTorch path then runs everywhere, as the first test checks).
"""

from __future__ import annotations

import math
import os
import shutil
import stat
import tempfile

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import osa_lab
from osa_lab.errors import OSAInputError
from osa_lab.ops import cpu, expm
from osa_lab.ops.cpu import build, pool
from tests.helpers import autograd_node_names, rel_err

HAVE_COMPILER = shutil.which(os.environ.get("CC", "cc")) is not None
needs_kernels = pytest.mark.skipif(not HAVE_COMPILER, reason="no C compiler: the kernels cannot be built here")


def _head_split(t: torch.Tensor, heads: int) -> torch.Tensor:
    b, n, width = t.shape
    return t.view(b, n, heads, width // heads).transpose(1, 2)


def _run(q, k, v, alpha, grad, *, native: bool, monkeypatch):
    """osa() and the gradients of q, k, v, α for output gradient ``grad``, on one path."""
    monkeypatch.setenv("OSA_LAB_CPU_KERNELS", "1" if native else "0")
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v, alpha)]
    y = osa_lab.osa(*leaves)
    names = autograd_node_names(y)
    y.backward(grad)
    return y.detach(), [t.grad for t in leaves], names


def test_without_a_compiler_or_when_turned_off_the_pytorch_path_runs(monkeypatch):
    monkeypatch.setenv("OSA_LAB_CPU_KERNELS", "0")
    assert not build.enabled() and build.library() is None
    assert "OSA_LAB_CPU_KERNELS=0" in cpu.status()
    q, k, v = (torch.randn(2, 20, 8, requires_grad=True) for _ in range(3))
    y = osa_lab.osa(q, k, v, 0.1)
    assert "_OSAChebyshevActionBackward" in autograd_node_names(y)


@needs_kernels
def test_kernels_build_here():
    assert cpu.usable(torch.ones(1, 2, 2), torch.ones(1, 2, 2), torch.ones(1, 2, 2)), cpu.status()
    assert cpu.status().startswith("built with")


@needs_kernels
@pytest.mark.parametrize("n", [1, 2, 7, 20, 33, 49, 64])
@pytest.mark.parametrize(("r", "d"), [(16, 16), (3, 5), (1, 1), (8, 24)])
@pytest.mark.parametrize("norm", [0.0, 0.5, 3.0])
def test_kernels_match_the_pytorch_path_and_float64_dense(n, r, d, norm, monkeypatch):
    """Output and the gradients of q, k, v and α, with α set for the largest ‖S‖₂ = ``norm``: the
    kernels agree with the PyTorch path (same float32 arithmetic up to the order of sums) and
    both with the float64 dense reference."""
    if n > 4 * r:
        pytest.skip("the small-N action runs for N ≤ 4r")
    g = torch.Generator().manual_seed(n * 100 + r * 10 + d)
    q, k = (torch.randn(3, n, r, generator=g) for _ in range(2))
    v = torch.randn(3, n, d, generator=g)
    s_two = float(torch.linalg.matrix_norm(expm.skew_symmetric_from_qk(q.double(), k.double(), 1.0), ord=2).amax())
    a = torch.tensor(norm / s_two if s_two > 0 else 0.0)
    grad = torch.randn(3, n, d, generator=g)
    y_c, grads_c, names = _run(q, k, v, a, grad, native=True, monkeypatch=monkeypatch)
    assert "_OSAChebyshevActionCPUBackward" in names
    y_t, grads_t, names_t = _run(q, k, v, a, grad, native=False, monkeypatch=monkeypatch)
    assert "_OSAChebyshevActionBackward" in names_t

    leaves = [t.double().requires_grad_(True) for t in (q, k, v, a)]
    s = expm.skew_symmetric_from_qk(leaves[0], leaves[1], leaves[3])
    y64 = torch.linalg.matrix_exp(s) @ leaves[2]
    y64.backward(grad.double())
    assert rel_err(y_c, y64) <= 2e-6 and rel_err(y_t, y64) <= 2e-6
    assert rel_err(y_c, y_t) <= 2e-6
    for name, got, ref, want in zip("qkva", grads_c, grads_t, leaves, strict=True):
        if want.grad.norm() == 0:  # S = 0: q and k have no influence
            assert float(got.abs().max()) <= 1e-6, name
            continue
        # α's gradient is one sum of signed per-matrix terms: float32 cancellation puts it at up to
        # 2.8e-5 on the PyTorch path in this grid (N = 2, r = 3, d = 5), the kernels at 2.5e-5
        tol = 1e-4 if name == "a" else 2e-5
        assert rel_err(got, want.grad) <= tol, name
        assert rel_err(got, ref) <= tol, name


@needs_kernels
@pytest.mark.parametrize("norm", [1.0, 4.0, 8.0])
def test_kernels_hold_the_accuracy_target_up_to_the_float32_degree_cap(norm, monkeypatch):
    """‖S‖₂ up to ≈ 10 (the float32 degree cap): 2e-6 against float64 dense, outputs and gradients."""
    g = torch.Generator().manual_seed(int(norm * 10))
    n, r, d = 40, 16, 16
    q, k = (torch.randn(2, n, r, generator=g, dtype=torch.float64) for _ in range(2))
    s_two = torch.linalg.matrix_norm(expm.skew_symmetric_from_qk(q, k, 1.0), ord=2).amax()
    alpha = torch.tensor(float(norm / s_two), dtype=torch.float32)
    q, k = q.float(), k.float()
    v, grad = torch.randn(2, n, d, generator=g), torch.randn(2, n, d, generator=g)
    y_c, grads_c, names = _run(q, k, v, alpha, grad, native=True, monkeypatch=monkeypatch)
    assert "_OSAChebyshevActionCPUBackward" in names
    leaves = [t.double().requires_grad_(True) for t in (q, k, v, alpha)]
    y64 = torch.linalg.matrix_exp(expm.skew_symmetric_from_qk(leaves[0], leaves[1], leaves[3])) @ leaves[2]
    y64.backward(grad.double())
    assert rel_err(y_c, y64) <= 2e-6
    for name, got, want in zip("qkva", grads_c, leaves, strict=True):
        assert rel_err(got, want.grad) <= 2e-5, name


@needs_kernels
@pytest.mark.parametrize("wanted", ["q", "k", "v", "alpha", "qv"])
def test_kernels_compute_only_the_gradients_asked_for(wanted, monkeypatch):
    monkeypatch.setenv("OSA_LAB_CPU_KERNELS", "1")
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 3, 20, 16, generator=g) for _ in range(3))
    alpha = torch.tensor([0.1, 0.2, -0.1])
    named = {"q": q, "k": k, "v": v, "alpha": alpha}
    for key in ("q", "k", "v", "alpha"):
        named[key] = named[key].clone().requires_grad_(key in wanted or (wanted == "qv" and key in "qv"))
    w = torch.randn(2, 3, 20, 16, generator=g)  # a linear loss: ‖y‖² = ‖v‖² has no q, k gradient
    y = osa_lab.osa(named["q"], named["k"], named["v"], named["alpha"])
    (y * w).sum().backward()
    monkeypatch.setenv("OSA_LAB_CPU_KERNELS", "0")
    ref = {key: t.detach().clone().requires_grad_(t.requires_grad) for key, t in named.items()}
    (osa_lab.osa(ref["q"], ref["k"], ref["v"], ref["alpha"]) * w).sum().backward()
    for key, t in named.items():
        assert (t.grad is None) == (not t.requires_grad), key
        if t.requires_grad:
            assert rel_err(t.grad, ref[key].grad) <= 2e-5, key


@needs_kernels
def test_kernels_read_and_write_the_layers_layout(monkeypatch):
    """Head-split views of (batch, N, heads·r) memory, and q, k, v as slices of one fused qkv
    projection: read in place, the output in v's layout (the merge is a view), gradients right."""
    monkeypatch.setenv("OSA_LAB_CPU_KERNELS", "1")
    g = torch.Generator().manual_seed(5)
    batch, n, heads, r = 3, 20, 4, 16
    qkv = torch.randn(batch, n, 3 * heads * r, generator=g, requires_grad=True)
    q, k, v = (_head_split(t, heads) for t in qkv.split(heads * r, dim=-1))
    alpha = torch.tensor([0.2, -0.1, 0.05, 0.0], requires_grad=True)
    y = osa_lab.osa(q, k, v, alpha)
    assert "_OSAChebyshevActionCPUBackward" in autograd_node_names(y)
    merged = y.transpose(1, 2).reshape(batch, n, heads * r)
    gy = torch.randn(batch, n, heads * r, generator=g)
    merged.backward(gy)

    ref_qkv = qkv.detach().double().requires_grad_(True)
    ref_alpha = alpha.detach().double().requires_grad_(True)
    q64, k64, v64 = (_head_split(t, heads) for t in ref_qkv.split(heads * r, dim=-1))
    s = expm.skew_symmetric_from_qk(q64, k64, ref_alpha)  # α per head over (batch, heads)
    y64 = torch.linalg.matrix_exp(s) @ v64
    y64.transpose(1, 2).reshape(batch, n, heads * r).backward(gy.double())
    assert rel_err(y, y64) <= 2e-6
    assert rel_err(qkv.grad, ref_qkv.grad) <= 2e-5
    assert rel_err(alpha.grad, ref_alpha.grad) <= 2e-5


@needs_kernels
def test_kernels_give_the_same_bits_on_one_thread_and_on_several(monkeypatch):
    """The batch is split over threads; each matrix is computed the same way whichever thread runs it."""
    monkeypatch.setenv("OSA_LAB_CPU_KERNELS", "1")
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(5, 3, 24, 8, generator=g) for _ in range(3))
    grad = torch.randn(5, 3, 24, 8, generator=g)
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 3):
            torch.set_num_threads(count)
            leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
            y = osa_lab.osa(*leaves, 0.2)
            y.backward(grad)
            results.append([y.detach(), *(t.grad for t in leaves)])
    finally:
        torch.set_num_threads(threads)
    for one, several in zip(*results, strict=True):
        assert torch.equal(one, several)


@needs_kernels
def test_kernels_second_order_through_the_reference(monkeypatch):
    """create_graph=True differentiates the plain-operation reference: gradgradcheck in float64
    is for the PyTorch path; here the float32 kernels' Hessian-vector product matches float64 dense."""
    monkeypatch.setenv("OSA_LAB_CPU_KERNELS", "1")
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 12, 4, generator=g, requires_grad=True) for _ in range(3))
    y = osa_lab.osa(q, k, v, 0.3)
    assert "_OSAChebyshevActionCPUBackward" in autograd_node_names(y)
    (gq,) = torch.autograd.grad(y.square().sum() + (y * v).sum(), q, create_graph=True)
    (hq,) = torch.autograd.grad(gq.square().sum(), k)

    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    y64 = torch.linalg.matrix_exp(expm.skew_symmetric_from_qk(q64, k64, 0.3)) @ v64
    (gq64,) = torch.autograd.grad(y64.square().sum() + (y64 * v64).sum(), q64, create_graph=True)
    (hq64,) = torch.autograd.grad(gq64.square().sum(), k64)
    assert rel_err(gq, gq64) <= 2e-5
    assert rel_err(hq, hq64) <= 1e-4


@needs_kernels
def test_kernels_keep_a_nan_in_its_own_matrix(monkeypatch):
    """NaN in one matrix of v (α finite, so ρ and the degree are): NaN in exactly the outputs and
    gradients where the reference path has it (that matrix's), the rest finite and the same."""
    g = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(3, 12, 4, generator=g) for _ in range(3))
    v[1, 5, 2] = float("nan")
    c = torch.full((3,), 0.1)
    results = {}
    for native in ("1", "0"):
        monkeypatch.setenv("OSA_LAB_CPU_KERNELS", native)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, c, v)]
        y = expm.osa_chebyshev_action(*leaves)
        assert y is not None
        if native == "1":
            assert "_OSAChebyshevActionCPUBackward" in autograd_node_names(y)
        y.backward(torch.ones_like(y))
        results[native] = [y.detach(), *(t.grad for t in leaves)]
    assert torch.isnan(results["1"][0][1]).any() and bool(torch.isfinite(results["1"][0][[0, 2]]).all())
    for got, ref in zip(results["1"], results["0"], strict=True):  # y, ∂q, ∂k, ∂c, ∂v
        assert torch.equal(torch.isnan(got), torch.isnan(ref))  # NaN where the reference has it, only there
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5, equal_nan=True)


@needs_kernels
def test_kernels_leave_mismatched_shapes_to_the_pytorch_path():
    """q, k of different shapes, or v of another N, are not the kernels' to read: usable() says
    no, and the PyTorch path raises as it always did."""
    q, k = torch.randn(3, 40, 16), torch.randn(3, 40, 16)
    assert cpu.usable(q, k, torch.randn(3, 40, 8))
    assert not cpu.usable(q, k, torch.randn(3, 2, 64))
    assert not cpu.usable(q, torch.randn(3, 40, 8), torch.randn(3, 40, 8))
    assert not cpu.usable(q, k, torch.randn(3, 40, 0))
    assert not cpu.usable(q.double(), k.double(), torch.randn(3, 40, 8, dtype=torch.float64))
    with pytest.raises(RuntimeError):
        expm.osa_chebyshev_action(q, k, torch.full((3,), 0.01), torch.randn(3, 2, 64))


@needs_kernels
def test_kernels_backward_takes_saved_tensors_in_any_layout(monkeypatch):
    """A saved-tensor hook may hand the backward copies that are not aligned as the kernels'
    vector loads need: the backward copies them into that layout, and the gradients are the same."""
    monkeypatch.setenv("OSA_LAB_CPU_KERNELS", "1")
    g = torch.Generator().manual_seed(17)
    q, k, v = (torch.randn(2, 20, 8, generator=g) for _ in range(3))
    c = torch.full((2,), 0.05)

    def misaligned(t: torch.Tensor) -> torch.Tensor:  # a copy 4 bytes into a fresh buffer
        flat = torch.empty(t.numel() + 1, dtype=t.dtype)[1:]
        flat.copy_(t.reshape(-1))
        return flat.view(t.shape)

    grads = {}
    for name, hooks in (("plain", None), ("misaligned", (misaligned, lambda t: t))):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, c, v)]
        if hooks is None:
            y = expm.osa_chebyshev_action(*leaves)
        else:
            with torch.autograd.graph.saved_tensors_hooks(*hooks):
                y = expm.osa_chebyshev_action(*leaves)
        assert "_OSAChebyshevActionCPUBackward" in autograd_node_names(y)
        y.backward(torch.ones_like(y))
        grads[name] = [t.grad for t in leaves]
    for a, b in zip(grads["plain"], grads["misaligned"], strict=True):
        assert torch.equal(a, b)


@needs_kernels
def test_kernels_backward_runs_the_kernels_its_forward_ran(monkeypatch):
    """Turning the kernels off between a forward and its backward does not strand the backward."""
    monkeypatch.setenv("OSA_LAB_CPU_KERNELS", "1")
    q, k, v = (torch.randn(2, 10, 4, requires_grad=True) for _ in range(3))
    y = osa_lab.osa(q, k, v, 0.2)
    assert "_OSAChebyshevActionCPUBackward" in autograd_node_names(y)
    monkeypatch.setenv("OSA_LAB_CPU_KERNELS", "0")
    y.sum().backward()
    assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in (q, k, v))


@needs_kernels
def test_kernels_take_one_c_for_every_matrix(monkeypatch):
    monkeypatch.setenv("OSA_LAB_CPU_KERNELS", "1")
    q, k, v = (torch.randn(3, 20, 16) for _ in range(3))
    one = torch.tensor([0.02], requires_grad=True)
    each = torch.full((3,), 0.02, requires_grad=True)
    y_one = expm.osa_chebyshev_action(q, k, one, v)
    y_each = expm.osa_chebyshev_action(q, k, each, v)
    assert torch.equal(y_one, y_each)
    (y_one * v).sum().backward()
    (y_each * v).sum().backward()
    torch.testing.assert_close(one.grad, each.grad.sum().reshape(1))


@needs_kernels
@settings(max_examples=40, deadline=None)
@given(
    r=st.integers(1, 12),
    data=st.data(),
    d=st.integers(1, 20),
    scale=st.floats(0.0, 2.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_kernels_keep_column_norms(r, data, d, scale, seed):
    """exp(S) is orthogonal: ‖y‖ = ‖v‖ per matrix and column (docs/design.md §1), through the kernels."""
    n = data.draw(st.integers(1, 4 * r), label="n")
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, n, r, generator=g) for _ in range(2))
    v = torch.randn(2, n, d, generator=g)
    alpha = scale / max(float(torch.linalg.matrix_norm(q, ord=2).amax() * torch.linalg.matrix_norm(k, ord=2).amax()), 1e-6)
    assert cpu.usable(q, k, v), cpu.status()
    c = torch.full((2,), alpha / r**0.5, requires_grad=True)  # a leaf that needs grad: a graph to inspect
    out = expm.osa_chebyshev_action(q, k, c, v)
    assume(out is not None)
    assert "_OSAChebyshevActionCPUBackward" in autograd_node_names(out)
    col = torch.linalg.vector_norm(v.double(), dim=-2)
    assert torch.allclose(torch.linalg.vector_norm(out.detach().double(), dim=-2), col, rtol=2e-6, atol=1e-6)


def _prepared_bounds(q, k, c):
    """The kernels' prepare: (Sᵀ, each bound with the allowance, matrices squared), and the reference's bounds of Sᵀ."""
    n = q.shape[-2]
    padded, bound, squared = cpu.prepare(q, k, c, expm.small_skew_bound(n, q.dtype))
    assert padded.shape[-1] == (n + 7) // 8 * 8 and not padded[..., n:].any()  # rows padded with zeros
    st_t = padded[..., :n].contiguous()
    return st_t, expm.skew_bound_with_allowance(bound, n, q.dtype), squared, expm.skew_spectral_bound(st_t.clone())


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2])
def test_prepare_squares_only_the_matrices_that_can_raise_the_largest_bound(threads, monkeypatch):
    """Norms spread over three decades: every matrix keeps a valid bound of its ‖S‖₂, the batch's
    largest is the reference's (every matrix squared), and the kernel squares a few of 256."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(256, 20, 16, generator=g) for _ in range(2))
    c = torch.logspace(-3, 0, 256)[torch.randperm(256, generator=g)]
    st_t, bound, squared, ref = _prepared_bounds(q, k, c)
    true = torch.linalg.matrix_norm(st_t.double(), ord=2)
    assert bool((bound >= true).all())
    assert float(bound.max()) == pytest.approx(float(ref.max()), rel=1e-6)
    assert 1 <= squared <= 16, squared


@needs_kernels
def test_prepare_squares_every_matrix_that_can_matter():
    """Equal norms (random q, k, one c): the Frobenius bound is loose by 1.1–1.8×, so most matrices
    are squared; the largest is still the reference's and no bound falls below ‖S‖₂."""
    g = torch.Generator().manual_seed(6)
    q, k = (torch.randn(64, 33, 12, generator=g) for _ in range(2))
    st_t, bound, squared, ref = _prepared_bounds(q, k, torch.full((64,), 0.1))
    assert bool((bound >= torch.linalg.matrix_norm(st_t.double(), ord=2)).all())
    assert float(bound.max()) == pytest.approx(float(ref.max()), rel=1e-6)
    assert squared > 32, squared


@needs_kernels
def test_prepare_keeps_a_non_finite_bound():
    """NaN in one matrix's q: its bound is NaN, so the batch's largest is (the caller then refuses
    the degree); an overflowing c gives Inf the same way. The other matrices' bounds stay finite."""
    q, k = torch.randn(4, 10, 4), torch.randn(4, 10, 4)
    q[2, 3, 1] = float("nan")
    _, bound, _, _ = _prepared_bounds(q, k, torch.full((4,), 0.1))
    assert math.isnan(float(bound[2])) and bool(torch.isfinite(bound[[0, 1, 3]]).all())
    assert math.isnan(float(bound.max()))
    _, bound, _, _ = _prepared_bounds(torch.randn(4, 10, 4), k, torch.tensor([0.1, 3e38, 0.1, 0.1]))
    assert math.isinf(float(bound[1])) and bool(torch.isfinite(bound[[0, 2, 3]]).all())


@needs_kernels
def test_prepare_takes_the_frobenius_bound_where_the_squares_lose_their_digits():
    """Every ‖S‖ near 1e-10, below ``small_skew_bound`` (the squares of S²'s entries come near
    float32's smallest normal number): the matrix squared keeps ‖S‖_F/√2 (float64 from Sᵀ) rather
    than the fourth root, as the reference does, and every bound stays ≥ ‖S‖₂."""
    g = torch.Generator().manual_seed(8)
    q, k = (torch.randn(5, 20, 16, generator=g) for _ in range(2))
    c = torch.tensor([1e-12, 3e-12, 1e-11, 2e-12, 5e-12])
    st_t, bound, squared, ref = _prepared_bounds(q, k, c)
    n = q.shape[-2]
    fro = torch.linalg.matrix_norm(st_t.double()) * 0.5**0.5
    assert bool((fro < expm.small_skew_bound(n, torch.float32)).all()) and squared >= 1  # the case under test
    torch.testing.assert_close(bound, expm.skew_bound_with_allowance(fro, n, torch.float32), rtol=1e-6, atol=0)
    assert bool((bound >= torch.linalg.matrix_norm(st_t.double(), ord=2)).all())
    assert float(bound.max()) == pytest.approx(float(ref.max()), rel=1e-6)


@needs_kernels
@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 12),
    n=st.integers(1, 40),
    r=st.integers(1, 8),
    spread=st.floats(0.0, 6.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_prepare_bounds_hold_and_their_largest_is_the_references(b, n, r, spread, seed):
    """For any batch: each bound ≥ ‖S_b‖₂ (float64), and the largest equals the reference's
    (every matrix squared) to float32 rounding, whatever the spread of norms over the batch."""
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(b, n, r, generator=g) for _ in range(2))
    c = 10.0 ** (-spread * torch.rand(b, generator=g))
    st_t, bound, squared, ref = _prepared_bounds(q, k, c)
    assert bool((bound >= torch.linalg.matrix_norm(st_t.double(), ord=2)).all())
    assert float(bound.max()) == pytest.approx(float(ref.max()), rel=1e-6, abs=1e-30)
    assert 0 <= squared <= b


@needs_kernels
def test_without_the_cache_the_build_compiles_into_a_private_directory_that_it_removes(monkeypatch):
    monkeypatch.setenv("OSA_LAB_CPU_CACHE", "0")
    made = []
    real = tempfile.mkdtemp

    def recording_mkdtemp(*args, **kwargs):
        path = real(*args, **kwargs)
        made.append((path, stat.S_IMODE(os.stat(path).st_mode)))
        return path

    monkeypatch.setattr(build.tempfile, "mkdtemp", recording_mkdtemp)
    lib = build._build.__wrapped__()
    assert lib is not None
    ((path, mode),) = made
    assert mode == 0o700  # nobody else can place or change a file there
    assert not os.path.exists(path)  # nothing is left to be loaded later


def test_a_failing_compiler_leaves_the_pytorch_path(monkeypatch):
    monkeypatch.setenv("CC", shutil.which("false") or "false")
    state = dict(build._state)
    try:
        assert build._build.__wrapped__() is None
        assert build._state["status"].startswith("build failed")
    finally:
        build._state.clear()
        build._state.update(state)


def test_a_missing_compiler_leaves_the_pytorch_path(monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-for-osa-lab")
    state = dict(build._state)
    try:
        assert build._build.__wrapped__() is None
        assert "no C compiler" in build._state["status"]
    finally:
        build._state.clear()
        build._state.update(state)


def test_pool_hands_out_memory_again_only_when_nothing_refers_to_it(monkeypatch):
    """A pooled tensor's memory is reused only after every tensor, view and autograd-saved
    tensor of it is gone; the tensors are 64-byte aligned (the kernels' vector loads need 32)."""
    monkeypatch.setattr(pool, "_POOL", pool._Pool())
    first = pool.empty((3, 5, 7))
    assert first.data_ptr() % 64 == 0 and first.is_contiguous() and first.dtype == torch.float32
    first_ptr, view = first.data_ptr(), first[1]
    del first
    second = pool.empty((3, 5, 7))
    assert second.data_ptr() != first_ptr  # the view still holds the first buffer
    del view

    class Keep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, saved):
            ctx.save_for_backward(saved)
            return x * 1

        @staticmethod
        def backward(ctx, g):
            return g, None

    held = second.data_ptr()
    x = torch.ones(2, requires_grad=True)
    out = Keep.apply(x, second)
    del second
    third = pool.empty((3, 5, 7))
    assert third.data_ptr() != held  # saved for a backward: not handed out
    out.sum().backward()
    del out, third
    again = [pool.empty((3, 5, 7)) for _ in range(2)]
    assert held in {t.data_ptr() for t in again}  # free once the graph has released it


def test_pool_keeps_at_most_its_limit(monkeypatch):
    monkeypatch.setattr(pool, "_POOL", pool._Pool())
    monkeypatch.setattr(pool, "POOL_LIMIT_BYTES", 10_000)
    kept = [pool.empty((1000,)) for _ in range(5)]  # 4,064 bytes each: two fit
    assert pool._POOL.bytes <= 10_000 and sum(len(v) for v in pool._POOL.arrays.values()) == 2
    assert len({t.data_ptr() for t in kept}) == 5
    assert pool.release() == 2 * 4064 and pool._POOL.bytes == 0


def test_pool_serves_a_larger_request_from_a_reserved_buffer(monkeypatch):
    """A buffer made with ``reserve`` serves a later, larger request once free; a request takes
    the smallest free buffer that holds it, and none more than ``REUSE_SLACK`` times its size."""
    monkeypatch.setattr(pool, "_POOL", pool._Pool())
    first = pool.empty((6, 100), reserve=800)
    assert first.shape == (6, 100) and first.data_ptr() % 64 == 0
    held = first.data_ptr()
    del first
    grown = pool.empty((8, 100))  # 800 elements: fits the reserve
    assert grown.data_ptr() == held
    too_big = pool.empty((9, 100))  # beyond the reserve: a new buffer
    assert too_big.data_ptr() != held
    del grown, too_big
    small = pool.empty((2, 100))  # 200 elements: both free buffers exceed twice its size
    assert small.data_ptr() != held
    del small
    assert pool.empty((5, 100)).data_ptr() == held  # the smaller of the two that fit
    assert sum(len(v) for v in pool._POOL.arrays.values()) == 3


def test_pool_evicts_the_size_least_recently_used(monkeypatch):
    """Beyond the limit a new buffer evicts unused buffers of the sizes least recently used: a
    size reused since is kept."""
    monkeypatch.setattr(pool, "_POOL", pool._Pool())
    monkeypatch.setattr(pool, "POOL_LIMIT_BYTES", 10_000)
    a, b = pool.empty((1000,)), pool.empty((1200,))  # 4,064 and 4,864 bytes
    a_ptr, b_ptr = a.data_ptr(), b.data_ptr()
    del a, b
    assert pool.empty((1000,)).data_ptr() == a_ptr  # a's size is now the most recently used
    pool.empty((300,))  # 1,264 bytes more would pass the limit: one buffer goes
    held = {int(arr.ctypes.data) for arrays in pool._POOL.arrays.values() for arr in arrays}
    assert any(abs(ptr - a_ptr) < 64 for ptr in held) and not any(abs(ptr - b_ptr) < 64 for ptr in held)


def test_pool_refuses_a_reserve_its_own_size_could_not_reuse():
    with pytest.raises(OSAInputError, match="REUSE_SLACK"):
        pool.empty((10,), reserve=100)


@needs_kernels
def test_kernels_saved_iterates_reuse_memory_as_the_degree_rises(monkeypatch):
    """The forward's saved iterates keep room for more terms: a forward of degree m + 1 after one
    of degree m (freed) writes into the same memory instead of a fresh buffer."""
    monkeypatch.setattr(pool, "_POOL", pool._Pool())
    q, k, v = (torch.randn(4, 20, 16) for _ in range(3))
    st, _, _ = cpu.prepare(q, k, torch.full((4,), 0.1), expm.small_skew_bound(20, q.dtype))
    coef = expm.chebyshev_coefficients(1.0, 8)
    _, zs, _, _ = cpu.chebyshev_forward(st, v, coef, 1.0)
    held = zs.data_ptr()
    del zs
    _, zs, _, _ = cpu.chebyshev_forward(st, v, expm.chebyshev_coefficients(1.0, 10), 1.0)
    assert zs.shape[1] == 10 and zs.data_ptr() == held


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(3, 20, 64).view(3, 20, 4, 16).transpose(1, 2),  # head-split view
        lambda: torch.randn(3, 20, 192)[..., 128:].view(3, 20, 4, 16).transpose(1, 2),  # slice of qkv
        lambda: torch.randn(5, 7, 3),
        lambda: torch.randn(1, 7, 3).expand(4, 7, 3),
    ],
    ids=["head-split", "qkv-slice", "contiguous", "expanded"],
)
def test_pool_empty_like_keeps_the_order_of_dimensions(make):
    x = make()
    out = pool.empty_like(x)
    assert out.shape == x.shape and out.dtype == torch.float32
    assert out.stride() == torch.empty_like(x).stride()
