"""``torch.func.vmap`` and per-sample gradients through :func:`osa_lab.osa` (over q, k, v and
over α), through :class:`OrthogonalSelfAttention` and through an encoder under
:func:`functional_mode`, against loops in float64; and the input, α, output and hidden-state
checks kept under vmap: batched over the whole vmapped batch, raising the error a loop raises."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, grad, vmap

import osa_lab
from osa_lab.errors import NonFiniteError, NonFiniteHiddenStateError
from osa_lab.nn.attention import OrthogonalSelfAttention
from osa_lab.nn.models import Encoder, ModelConfig, functional_mode
from osa_lab.ops import guards
from tests.helpers import rel_err

F64 = torch.float64


def _qkv(batch: int, n: int, r: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, 2, n, r, generator=g, dtype=F64) for _ in range(3))


@pytest.mark.parametrize("method", ["auto", "qr", "lowrank", "dense"])
@pytest.mark.parametrize("n", [6, 40])  # N ≤ 4r (the small-N action) and N > 4r (the linear-in-N engines)
def test_vmap_over_qkv_matches_the_loop(method, n):
    q, k, v = _qkv(4, n, 4)
    got = vmap(lambda a, b, c: osa_lab.osa(a, b, c, 0.7, method=method))(q, k, v)
    want = torch.stack([osa_lab.osa(q[i], k[i], v[i], 0.7, method=method) for i in range(4)])
    assert rel_err(got, want) < 1e-12


@pytest.mark.parametrize("method", ["auto", "qr", "lowrank", "dense"])
@pytest.mark.parametrize("n", [6, 40])
def test_vmap_over_alpha_values_and_gradients_match_the_loop(method, n):
    q, k, v = (x[0] for x in _qkv(1, n, 4, seed=1))
    alphas = torch.tensor([0.1, 0.5, 1.3, -0.8, 2.0], dtype=F64)

    def loss(a: torch.Tensor) -> torch.Tensor:
        return (osa_lab.osa(q, k, v, a, method=method) * v.flip(-2)).sum()

    got = vmap(lambda a: osa_lab.osa(q, k, v, a, method=method))(alphas)
    want = torch.stack([osa_lab.osa(q, k, v, a, method=method) for a in alphas])
    assert rel_err(got, want) < 1e-12
    per_alpha = vmap(grad(loss))(alphas)
    looped = torch.stack([grad(loss)(a) for a in alphas])
    # and against plain autograd of the N×N reference, a different path
    dense = []
    for a in alphas:
        leaf = a.clone().requires_grad_()
        (osa_lab.osa(q, k, v, leaf, method="dense") * v.flip(-2)).sum().backward()
        dense.append(leaf.grad)
    assert rel_err(per_alpha, looped) < 1e-10
    assert rel_err(per_alpha, torch.stack(dense)) < 1e-9


def _layer_case(n: int):
    torch.manual_seed(3)
    layer = OrthogonalSelfAttention(dim=8, heads=2, tokens=n, dtype=F64)
    x = torch.randn(5, n, 8, dtype=F64)
    params = {name: p.detach() for name, p in layer.named_parameters()}
    return layer, params, x


@pytest.mark.parametrize("n", [6, 40])
def test_per_sample_gradients_through_the_layer_match_a_loop(n):
    layer, params, x = _layer_case(n)
    target = torch.randn_like(x)

    def loss(p: dict, xi: torch.Tensor, ti: torch.Tensor) -> torch.Tensor:
        return ((functional_call(layer, p, (xi[None],))[0] - ti) ** 2).sum()

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, target)
    for i in range(len(x)):
        layer.zero_grad()
        ((layer(x[i : i + 1])[0] - target[i]) ** 2).sum().backward()
        for name, p in layer.named_parameters():
            assert rel_err(per_sample[name][i], p.grad) < 1e-10, name
    assert per_sample["alpha"].abs().sum() > 0  # α is learned through the vmapped path too


def test_per_sample_gradients_through_an_encoder_in_functional_mode():
    torch.manual_seed(4)
    config = ModelConfig(depth=2, dim=8, heads=2, tokens=6, attention="osa")
    encoder = Encoder(config, dtype=F64)
    x = torch.randn(3, 6, 8, dtype=F64)
    params = {name: p.detach() for name, p in encoder.named_parameters()}

    def loss(p: dict, xi: torch.Tensor) -> torch.Tensor:
        return functional_call(encoder, p, (xi[None],)).pow(2).sum()

    with functional_mode(encoder):
        assert encoder.check_finite  # the checks stay on
        per_sample = vmap(grad(loss), in_dims=(None, 0))(params, x)
    for i in range(len(x)):
        encoder.zero_grad()
        encoder(x[i : i + 1]).pow(2).sum().backward()
        for name, p in encoder.named_parameters():
            assert rel_err(per_sample[name][i], p.grad) < 1e-10, name


def test_vmap_over_the_layer_parameters_of_several_models():
    """vmap over stacked parameters (the models of a seed group) equals each model alone."""
    layers = []
    for seed in range(3):
        torch.manual_seed(seed)
        layers.append(OrthogonalSelfAttention(dim=8, heads=2, tokens=6, dtype=F64))
    params, _ = torch.func.stack_module_state(layers)
    x = torch.randn(3, 4, 6, 8, dtype=F64)
    got = vmap(lambda p, xi: functional_call(layers[0], p, (xi,)))(params, x).detach()
    for i, layer in enumerate(layers):
        assert rel_err(got[i], layer(x[i]).detach()) < 1e-12


# ------------------------------------------------------------------ checks kept under vmap


def test_a_nan_input_in_one_vmapped_sample_raises_as_the_loop_does():
    layer, params, x = _layer_case(6)
    x[2, 1, 3] = float("nan")
    with pytest.raises(NonFiniteError, match="1 NaN and 0 Inf"):
        layer(x[2:3])  # the loop raises at sample 2 ...
    with pytest.raises(NonFiniteError, match="1 NaN and 0 Inf"):  # ... and so does vmap, counting the batch
        vmap(lambda xi: functional_call(layer, params, (xi[None],)))(x)


@pytest.mark.parametrize("n", [6, 40])
def test_a_nan_alpha_in_one_vmapped_call_raises(n):
    q, k, v = (x[0] for x in _qkv(1, n, 4))
    alphas = torch.tensor([0.5, float("nan"), 1.0], dtype=F64)
    with pytest.raises(NonFiniteError, match="alpha"):
        osa_lab.osa(q, k, v, alphas[1])
    with pytest.raises(NonFiniteError, match="alpha"):
        vmap(lambda a: osa_lab.osa(q, k, v, a))(alphas)
    vmap(lambda a: osa_lab.osa(q, k, v, a))(alphas[[0, 2]])  # finite α: no error


def test_the_output_check_runs_under_vmap(monkeypatch):
    """The drift check is decided under vmap (on the whole batch's worst drift), not skipped."""
    from osa_lab.ops import output_check

    seen = []
    real = output_check._decide

    def spy(drift, context, inputs, out):
        seen.append(drift)
        return real(drift, context, inputs, out)

    monkeypatch.setattr(output_check, "_decide", spy)
    q, k, v = _qkv(3, 40, 4)
    vmap(lambda a, b, c: osa_lab.osa(a, b, c, 1.0, method="lowrank"))(q, k, v)
    assert len(seen) == 1 and 0 <= seen[0] < 1e-10


def test_a_nan_hidden_state_under_functional_mode_vmap_names_the_layer():
    torch.manual_seed(5)
    config = ModelConfig(depth=2, dim=8, heads=2, tokens=6, attention="osa")
    encoder = Encoder(config, dtype=F64)
    x = torch.randn(3, 6, 8, dtype=F64)
    x[1, 0, 0] = float("inf")
    params = {name: p.detach() for name, p in encoder.named_parameters()}
    with functional_mode(encoder), pytest.raises(NonFiniteHiddenStateError, match="0 NaN and 1 Inf"):
        vmap(lambda xi: functional_call(encoder, params, (xi[None],)))(x)


def test_whole_batch_is_the_tensor_itself_outside_transforms():
    x = torch.randn(3)
    assert guards.whole_batch(x) is x
    assert guards.sum_is_finite(x) and guards.all_finite(x)


def test_under_vmap_alone_the_cpu_kernels_run_on_the_folded_batch(monkeypatch, cpu_kernels_in_use):
    """vmap alone (a seed group): the vmapped dims are folded into the batch and the fused C
    kernels run, forward and (through the ordinary autograd outside vmap) backward; values and
    gradients are the loop's."""
    from osa_lab.ops import cpu

    calls = []
    for name in ("chebyshev_forward", "chebyshev_backward"):
        real = getattr(cpu, name)
        monkeypatch.setattr(cpu, name, lambda *a, _real=real, _name=name, **kw: calls.append(_name) or _real(*a, **kw))
    g = torch.Generator().manual_seed(8)
    q, k, v = ((0.3 * torch.randn(4, 3, 2, 6, 4, generator=g)).requires_grad_() for _ in range(3))  # 4 members
    alphas = torch.tensor([0.3, 0.9, 1.4, 0.2], requires_grad=True)
    y = vmap(lambda a, qi, ki, vi: osa_lab.osa(qi, ki, vi, a))(alphas, q, k, v)
    weights = torch.randn(y.shape, generator=g)
    (y * weights).sum().backward()
    assert calls == ["chebyshev_forward", "chebyshev_backward"]  # one call each for the whole group
    got = [t.grad.clone() for t in (alphas, q, k, v)]
    for t in (alphas, q, k, v):
        t.grad = None
    loop = torch.stack([osa_lab.osa(q[i], k[i], v[i], alphas[i]) for i in range(4)])
    (loop * weights).sum().backward()
    assert rel_err(y.detach(), loop.detach()) < 1e-6
    for a, b in zip(got, (alphas.grad, q.grad, k.grad, v.grad), strict=True):
        assert rel_err(a, b) < 1e-5


def test_the_cpu_kernels_step_aside_under_grad_transforms(monkeypatch, cpu_kernels_in_use):
    """Under torch.func's grad (per-sample gradients: vmap of grad) the kernels' autograd Function
    has no rule: the plain-PyTorch reference runs instead and gives the loop's values."""
    from osa_lab.ops import cpu

    def refuse(*args, **kwargs):
        raise AssertionError("a CPU kernel ran")

    for name in ("chebyshev_forward", "chebyshev_backward", "prepare"):
        monkeypatch.setattr(cpu, name, refuse)
    q, k, v = (x.float() for x in _qkv(4, 6, 4))
    alphas = torch.tensor([0.3, 0.9, 1.4, 0.2])

    def loss(a, qi, ki, vi):
        return osa_lab.osa(qi, ki, vi, a).sum()

    with pytest.raises(AssertionError, match="a CPU kernel ran"):  # outside vmap they do run here
        loss(alphas[0], q[0], k[0], v[0])

    got = vmap(grad(loss, argnums=(0, 1)))(alphas, q, k, v)
    monkeypatch.undo()
    for i in range(4):
        want = grad(loss, argnums=(0, 1))(alphas[i], q[i], k[i], v[i])
        assert rel_err(got[0][i], want[0]) < 1e-4 and rel_err(got[1][i], want[1]) < 1e-4
