"""``torch.compile`` of ``osa()`` and of the OSA layer gives eager's outputs and gradients, for N
both at most 4r (the dense exponential) and above it (the low-rank engines and their output
check, whose per-matrix norms once met with shapes (B·H,) and (B, H) under fake tensors).

The CPU kernels are custom autograd Functions that Dynamo runs as graph breaks: the compiled
graph calls them eagerly, so results must match eager to rounding (float64 here).
"""

from __future__ import annotations

import pytest
import torch

from osa_lab.nn.attention import OrthogonalSelfAttention
from osa_lab.ops.functional import osa
from tests.helpers import skip_without_inductor_compiler

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    # Dynamo's notes that it breaks the graph at the CPU kernels' calls: expected (see above)
    pytest.mark.filterwarnings("ignore::UserWarning:torch._dynamo.utils"),
    pytest.mark.filterwarnings("ignore::UserWarning:torch._dynamo.variables.functions"),
]

#: (dim, heads, tokens, backend): r = dim / heads; N ≤ 4r takes the dense path, N > 4r the
#: low-rank one (each compile costs seconds: every shape once, the backends alternating)
LAYER_CASES = [(32, 2, 8, "eager"), (32, 2, 80, "eager"), (16, 2, 40, "aot_eager"), (24, 3, 100, "aot_eager"),
               (16, 4, 12, "aot_eager")]  # fmt: skip


def _grads(out: torch.Tensor, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    return torch.autograd.grad((out * weights).sum(), inputs)


@pytest.mark.parametrize(("dim", "heads", "tokens", "backend"), LAYER_CASES)
def test_compiled_layer_matches_eager_outputs_and_gradients(backend, dim, heads, tokens):
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = OrthogonalSelfAttention(dim=dim, heads=heads, tokens=tokens).double()
    x = torch.randn(2, tokens, dim, dtype=torch.float64, requires_grad=True)
    expected = layer(x)
    expected_grads = _grads(expected, x, layer.alpha)
    compiled = torch.compile(layer, backend=backend)
    out = compiled(x)
    grads = _grads(out, x, layer.alpha)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    for g, e in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize(("n", "r", "backend"), [(6, 4, "eager"), (40, 4, "aot_eager"), (97, 8, "eager")])
def test_compiled_osa_matches_eager_outputs_and_gradients(backend, n, r):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, 3, n, r, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(2, 3, n, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    alpha = torch.tensor([0.3, 0.7, 1.1], dtype=torch.float64, requires_grad=True)
    expected = osa(q, k, v, alpha)
    expected_grads = _grads(expected, q, k, v, alpha)
    out = torch.compile(osa, backend=backend)(q, k, v, alpha)
    grads = _grads(out, q, k, v, alpha)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    for g, e in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-11)


def test_inductor_compiled_layer_above_4r_matches_eager():
    """The default backend, once, small: inductor builds C++ (a compiler must be on the machine)."""
    skip_without_inductor_compiler()
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = OrthogonalSelfAttention(dim=16, heads=2, tokens=40)
    x = torch.randn(2, 40, 16, requires_grad=True)
    expected = layer(x)
    expected_grads = _grads(expected, x, layer.alpha)
    out = torch.compile(layer)(x)
    grads = _grads(out, x, layer.alpha)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    for g, e in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-4)
