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
@pytest.mark.parametrize("method", ["lowrank", "gram"])
def test_float32_gradients_match_float64_dense(method, n, r, d):
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
    got = grads(torch.float32, method)
    for name, a, b in zip("q k v alpha".split(), got, ref, strict=True):
        assert rel_err(a, b) <= 2e-4, name


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


# Issue 11: gram refuses rank-deficient [q k] (it returned zero gradients); the methods that
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
