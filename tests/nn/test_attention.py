"""The OSA and SSA layers: interface, orthogonality of the attention, derived initialisation."""

from __future__ import annotations

import pytest
import torch

import osa_lab
from tests.helpers import rel_err


@pytest.mark.parametrize("cls", [osa_lab.OrthogonalSelfAttention, osa_lab.SoftmaxSelfAttention])
def test_layer_shapes_and_gradients(cls):
    layer = cls(dim=32, heads=4)
    x = torch.randn(3, 11, 32, requires_grad=True)
    y = layer(x)
    assert y.shape == x.shape
    y.square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None for p in layer.parameters())


def test_osa_heads_have_separate_alphas_and_keep_value_norms():
    torch.manual_seed(0)
    layer = osa_lab.OrthogonalSelfAttention(dim=16, heads=4, alpha_init=0.8).double()
    with torch.no_grad():
        layer.alpha.copy_(torch.tensor([0.0, 0.5, 1.0, 2.0], dtype=torch.float64).view_as(layer.alpha))
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    per_head = layer.attend(x)
    _, _, v = layer._split(x)
    assert rel_err(per_head[:, 0], v[:, 0]) <= 1e-14  # α = 0 → identity
    assert rel_err(per_head[:, 3], v[:, 3]) > 1e-2
    gram_out = per_head.mT @ per_head
    assert rel_err(gram_out, v.mT @ v) <= 1e-12


def test_osa_alpha_is_learnable_or_fixed():
    assert isinstance(osa_lab.OrthogonalSelfAttention(8, 2).alpha, torch.nn.Parameter)
    fixed = osa_lab.OrthogonalSelfAttention(8, 2, learn_alpha=False)
    assert not isinstance(fixed.alpha, torch.nn.Parameter)
    assert "alpha" not in dict(fixed.named_parameters())


def _layer_kappa(n: int, d: int, seed: int) -> float:
    torch.manual_seed(seed)
    layer = osa_lab.OrthogonalSelfAttention(d, heads=1, tokens=n).double()
    x = torch.randn(1, n, d, dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(layer, x).reshape(n * d, n * d)
    s = torch.linalg.svdvals(jac)
    return float(s[0] / s[-1])


@pytest.mark.parametrize("d", [8, 16, 32])
@pytest.mark.parametrize("n", [8, 16, 32])
def test_derived_init_keeps_layer_jacobian_well_conditioned(n, d):
    """κ of the exact input–output Jacobian ≤ 1.5 at the default init (3 seeds)."""
    kappas = [_layer_kappa(n, d, seed) for seed in range(3)]
    assert max(kappas) <= 1.5, kappas
    assert min(kappas) > 1.0  # the attention is not the identity: α₀ > 0 moves κ off 1


def test_large_alpha_breaks_conditioning():
    """The check above can fail: α = 1 gives an ill-conditioned Jacobian (docs/design.md §3)."""
    torch.manual_seed(0)
    n = d = 16
    layer = osa_lab.OrthogonalSelfAttention(d, heads=1, alpha_init=1.0).double()
    x = torch.randn(1, n, d, dtype=torch.float64)
    s = torch.linalg.svdvals(torch.autograd.functional.jacobian(layer, x).reshape(n * d, n * d))
    assert float(s[0] / s[-1]) > 5


def test_ssa_matches_explicit_softmax_attention():
    torch.manual_seed(1)
    layer = osa_lab.SoftmaxSelfAttention(12, heads=3).double()
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    a = layer.attention_matrix(x)
    assert torch.allclose(a.sum(-1), torch.ones(2, 3, 7, dtype=torch.float64))
    _, _, v = layer._split(x)
    assert rel_err(layer.attend(x), a @ v) <= 1e-12


def test_gram_layer_refuses_too_few_tokens_and_auto_learns_alpha():
    """with N < 2r the "gram" layer gave zero gradients (α never changed); now it
    refuses, and "auto" gives the float64 dense gradients for α."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16, dtype=torch.float64)  # N = 5 tokens, r = 8: [q k] has rank ≤ 5 < 16
    layer = osa_lab.OrthogonalSelfAttention(16, heads=2, alpha_init=0.5, method="gram").double()
    with pytest.raises(osa_lab.UntrustedResultError, match="method=\"qr\", \"lowrank\" or \"auto\""):
        layer(x)
    weight = torch.randn(2, 5, 16, dtype=torch.float64)
    grads = {}
    for method in ("auto", "dense"):
        layer.method = method
        layer.zero_grad()
        (layer(x) * weight).sum().backward()
        grads[method] = layer.alpha.grad.clone()
    assert float(grads["dense"].abs().min()) > 0
    assert rel_err(grads["auto"], grads["dense"]) <= 1e-10


def test_empty_batch_through_the_layer():
    layer = osa_lab.OrthogonalSelfAttention(8, heads=2)
    x = torch.randn(0, 5, 8, requires_grad=True)
    y = layer(x)
    assert y.shape == (0, 5, 8)
    y.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), "0.1"])
def test_osa_layer_refuses_bad_alpha_init_when_built(value):
    """a non-finite α₀ used to pass construction and fail only at the first forward."""
    from osa_lab.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="alpha_init"):
        osa_lab.OrthogonalSelfAttention(8, heads=2, alpha_init=value, tokens=4)


def test_osa_layer_accepts_finite_alpha_init_kinds():
    """Ints, floats, NumPy scalars and 0-d tensors still give α = alpha_init for every head."""
    import numpy as np

    for value in (1, 0.25, np.float32(0.25), torch.tensor(0.25, dtype=torch.float64)):
        layer = osa_lab.OrthogonalSelfAttention(8, heads=2, alpha_init=value, tokens=4)
        assert torch.equal(layer.alpha.detach(), torch.full((2, 1), float(value)))
