"""Gradients of every method: gradcheck in float64, and float32 low-rank against float64 dense."""

from __future__ import annotations

import pytest
import torch

import osa_lab
from tests.helpers import DEGENERATE_KINDS, make_qk, qkv_of_kind, rel_err

GRAD_CASES = [
    pytest.param(method, n, r, kind, id=f"{method}-N{n}-r{r}-{kind}")
    for method in ("dense", "lowrank", "gram", "qr")
    for n, r in ((9, 2), (16, 3), (5, 4))
    for kind in ("random", "equal")
    # the Gram engine alone needs a full-column-rank [q k]
    if not (method == "gram" and (kind == "equal" or n < 2 * r))
]


@pytest.mark.parametrize("method,n,r,kind", GRAD_CASES)
def test_gradcheck_float64(method, n, r, kind):
    q, k = make_qk(kind, n, r, batch=(2,), seed=n)
    v = torch.randn(2, n, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    alpha = torch.tensor([[0.7], [-1.3]], dtype=torch.float64)
    inputs = [t.clone().requires_grad_(True) for t in (q, k, v, alpha)]

    def fn(q, k, v, alpha):
        return osa_lab.osa(q, k, v, alpha.squeeze(-1), method=method)

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("n,r,d", [(64, 8, 16), (300, 16, 8), (1000, 32, 32)], ids=lambda x: str(x))
def test_float32_gradients_match_float64_dense(n, r, d):
    """Both low-rank engines in float32 against one float64 dense reference (at N = 1000 the dense
    backward is the cost of this test, so it is computed once for both)."""
    g = torch.Generator().manual_seed(n)
    q, k = make_qk("random", n, r, batch=(2,), seed=n)
    v = torch.randn(2, n, d, dtype=torch.float64, generator=g)
    weight = torch.randn(2, n, d, dtype=torch.float64, generator=g)
    alpha = torch.tensor(0.5, dtype=torch.float64)

    def grads(dtype, method):
        leaves = [t.detach().to(dtype).clone().requires_grad_(True) for t in (q, k, v, alpha)]
        y = osa_lab.osa(*leaves[:3], leaves[3], method=method)
        (y * weight.to(dtype)).sum().backward()
        return [leaf.grad.double() for leaf in leaves]

    ref = grads(torch.float64, "dense")
    for method in ("lowrank", "gram"):
        got = grads(torch.float32, method)
        for name, a, b in zip("q k v alpha".split(), got, ref, strict=True):
            assert rel_err(a, b) <= 2e-4, (method, name)


def test_lowrank_backward_memory_is_linear_in_n():
    """The saved tensors of the low-rank backward hold no N×N buffer."""
    n, r, d = 2048, 8, 8
    q, k, v = (torch.randn(n, r if i < 2 else d, requires_grad=True) for i in range(3))
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = osa_lab.osa(q, k, v, 0.3, method="lowrank")
    y.sum().backward()
    assert saved, "no tensors were saved: the hook did not see the graph"
    assert max(saved) < n * n / 16
    assert q.grad is not None and k.grad is not None and v.grad is not None


@pytest.mark.parametrize("method", ["qr", "dense"])
@pytest.mark.parametrize("n", [8, 20])
def test_torch_func_transforms(method, n):
    """The autograd-only methods compose with torch.func (jacfwd, jacrev, vmap), as the analysis engine needs."""
    from torch.func import jacfwd, jacrev, vmap

    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(n, 4, dtype=torch.float64, generator=g) for _ in range(3))

    def f(v):
        return osa_lab.osa(q, k, v, 0.01, method=method)

    j_fwd, j_rev = jacfwd(f)(v), jacrev(f)(v)
    a = osa_lab.osa_matrix(q, k, 0.01)
    # y = A v: the Jacobian with respect to v is A ⊗ I
    expected = torch.einsum("ij,kl->ikjl", a, torch.eye(4, dtype=torch.float64))
    assert rel_err(j_fwd, expected) <= 1e-12 and rel_err(j_rev, expected) <= 1e-12
    vs = torch.randn(3, n, 4, dtype=torch.float64, generator=g)
    assert rel_err(vmap(f)(vs), torch.stack([f(x) for x in vs])) <= 1e-14


def _vmap_batch(dtype):
    """(4 samples, 2 heads, N = 40, r = 4): N > 4r, so "auto" runs the Gram engine too."""
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(4, 2, 40, 4, dtype=torch.float64, generator=g).to(dtype) for _ in range(3))
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("method", ["gram", "lowrank", "auto"])
@pytest.mark.parametrize("alpha", [0.5, 1e6], ids=["a0.5", "a1e6"])
def test_gram_engine_under_vmap_equals_the_loop(method, dtype, alpha):
    """Was: torch.func.vmap over the Gram engine raised PyTorch's "autograd.Function ... must
    override the setup_context" error (and the gram refusal poisoned rows with NaN under vmap).
    Now vmap equals the loop over the batch; at α = 1e6 float32 takes the float64 recompute."""
    from torch.func import vmap

    q, k, v = _vmap_batch(dtype)
    if method != "gram":
        k[1, 0] = q[1, 0]  # a rank-deficient head: the QR fallback under vmap
    f = lambda a, b, c: osa_lab.osa(a, b, c, alpha, method=method)  # noqa: E731
    want = torch.stack([f(*x) for x in zip(q, k, v, strict=True)])
    got = vmap(f)(q, k, v)
    assert not torch.isnan(got).any()
    assert rel_err(got, want) <= (1e-12 if dtype == torch.float64 and alpha < 1 else 1e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_gram_refusal_under_vmap_raises_like_the_loop(dtype):
    """One rank-deficient sample: the loop raises UntrustedResultError, so must vmap (no NaN rows)."""
    from torch.func import vmap

    q, k, v = _vmap_batch(dtype)
    k[2, 1] = q[2, 1]
    f = lambda a, b, c: osa_lab.osa(a, b, c, 0.5, method="gram")  # noqa: E731
    with pytest.raises(osa_lab.UntrustedResultError, match="refuses 1 of 8 matrices"):
        vmap(f)(q, k, v)
    with pytest.raises(osa_lab.UntrustedResultError):
        [f(*x) for x in zip(q, k, v, strict=True)]


@pytest.mark.parametrize("method", ["gram", "lowrank"])
def test_gram_engine_composes_with_jacrev_jacfwd_and_per_sample_grads(method):
    """The Gram engine under jacrev / jacfwd / vmap(grad): the float64 dense derivatives."""
    from torch.func import grad, jacfwd, jacrev, vmap

    q, k, v = (x[:, 0] for x in _vmap_batch(torch.float64))
    w = torch.randn_like(v)
    if method == "lowrank":
        k[1] = q[1]  # rank-deficient: the fallback must keep the per-sample gradients finite
    for transform in (jacrev, jacfwd):
        got = transform(lambda a, b: osa_lab.osa(a, b, v[0], 0.3, method=method), argnums=(0, 1))(q[0], k[0])
        want = transform(lambda a, b: osa_lab.osa(a, b, v[0], 0.3, method="dense"), argnums=(0, 1))(q[0], k[0])
        for x, y in zip(got, want, strict=True):
            assert rel_err(x, y) <= 1e-12, transform.__name__

    def loss(meth):
        return lambda a, b, c, ww: (osa_lab.osa(a, b, c, 0.3, method=meth) * ww).sum()

    got = vmap(grad(loss(method), argnums=(0, 1, 2)))(q, k, v, w)
    per_sample = [grad(loss("dense"), argnums=(0, 1, 2))(*x) for x in zip(q, k, v, w, strict=True)]
    want = [torch.stack(t) for t in zip(*per_sample, strict=True)]
    for x, y in zip(got, want, strict=True):
        assert rel_err(x, y) <= 1e-12


# gram refuses rank-deficient [q k] (it returned zero gradients); the methods that
# handle them must give the float64 dense gradients.
def _rank_deficient(kind: str):
    n = 4 if kind == "N<2r" else (1 if kind == "N=1" else 12)
    return qkv_of_kind(kind if kind in DEGENERATE_KINDS else "random", (2,), n, 3, 2, seed=21)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("kind", ["N<2r", "q=k", "k=2q", "q=0", "N=1"])
def test_rank_deficient_gradients_match_dense(kind, dtype):
    q, k, v = _rank_deficient(kind)
    alpha = torch.tensor([0.8, -0.5], dtype=torch.float64)
    weight = torch.randn(v.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def grads(dtype, method):
        leaves = [t.detach().to(dtype).clone().requires_grad_(True) for t in (q, k, v, alpha)]
        y = osa_lab.osa(*leaves, method=method)
        (y * weight.to(dtype)).sum().backward()
        return [leaf.grad.double() for leaf in leaves]

    ref = grads(torch.float64, "dense")
    assert any(float(g.abs().max()) > 0 for g in ref[:2]) or kind == "N=1"  # 1×1 S = 0
    tol = 1e-10 if dtype == torch.float64 else 2e-4
    for method in ("lowrank", "auto", "qr"):
        for name, a, b in zip("q k v alpha".split(), grads(dtype, method), ref, strict=True):
            assert rel_err(a, b) <= tol, (method, name)
    leaves = [t.to(dtype).clone().requires_grad_(True) for t in (q, k, v, alpha)]
    with pytest.raises(osa_lab.UntrustedResultError):
        osa_lab.osa(*leaves, method="gram")


def _dense_osa(q, k, v, alpha):
    """The reference: dense float64 ``torch.linalg.matrix_exp``, differentiable to any order."""
    s = (alpha / q.shape[-1] ** 0.5)[..., None, None] * (q @ k.mT - k @ q.mT)
    return torch.linalg.matrix_exp(s) @ v


def _hessian_vector_products(fn, inputs, weight, direction):
    """∂/∂x ⟨∇_x ⟨w, fn(x)⟩, t⟩ for every input x, α included (a graph of the backward)."""
    grads = torch.autograd.grad((fn(*inputs) * weight).sum(), inputs, create_graph=True)
    assert all(g.grad_fn is not None for g in grads), "the gradient has no graph"
    inner = sum((g * t).sum() for g, t in zip(grads, direction, strict=True))
    return torch.autograd.grad(inner, inputs)


SECOND_ORDER_CASES = [
    pytest.param(method, n, kind, id=f"{method}-N{n}-{kind}")
    for method in ("dense", "lowrank", "gram", "qr", "auto")
    for n in (6, 20)  # r = 2: N ≤ 4r (the N×N Chebyshev action) and N > 4r (the low-rank engines)
    for kind in ("random", "equal")
    if not (method == "gram" and kind == "equal")
]


@pytest.mark.parametrize("method,n,kind", SECOND_ORDER_CASES)
def test_second_derivatives_match_dense_float64(method, n, kind):
    """Hessian-vector products (create_graph=True) of every method, α included, equal those of
    dense float64 ``matrix_exp`` (measured ≲ 2e-14 relative), and gradgradcheck passes; where the
    QR engine meets a rank-deficient [q k] (q = k, N > 4r) a graph of its backward is refused
    with a typed error (PyTorch's QR backward is not differentiable there: error 1.0 measured)."""
    q, k = make_qk(kind, n, 2, batch=(2,), seed=n)
    g = torch.Generator().manual_seed(7)
    v = torch.randn(2, n, 3, dtype=torch.float64, generator=g)
    alpha = torch.tensor([0.7, -1.3], dtype=torch.float64)
    inputs = tuple(t.clone().requires_grad_(True) for t in (q, k, v, alpha))
    weight = torch.randn(2, n, 3, dtype=torch.float64, generator=g)
    direction = tuple(torch.randn(t.shape, dtype=torch.float64, generator=g) for t in inputs)

    def fn(q, k, v, alpha):
        return osa_lab.osa(q, k, v, alpha, method=method)

    if kind == "equal" and n > 8 and method != "dense":  # the QR engine on a rank-deficient [q k]
        with pytest.raises(osa_lab.UntrustedResultError, match="second derivatives"):
            _hessian_vector_products(fn, inputs, weight, direction)
        return
    got = _hessian_vector_products(fn, inputs, weight, direction)
    want = _hessian_vector_products(_dense_osa, inputs, weight, direction)
    for name, a, b in zip(("q", "k", "v", "alpha"), got, want, strict=True):
        assert rel_err(a, b) < 1e-9, (name, rel_err(a, b))
    assert torch.autograd.gradgradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5, fast_mode=True)
