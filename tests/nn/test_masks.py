"""Masks in PyTorch's and timm's conventions: neutral values accepted, causal or dense masks
refused, and ``key_padding_mask`` exact (the valid tokens get the truncated sequence's output,
each pad its value), for ``osa()``, the OSA layer and timm's ``OSAAttention``; outputs and
gradients in float64."""

from __future__ import annotations

import pytest
import torch

from osa_lab.errors import CausalMaskError, OSAInputError
from osa_lab.nn.attention import OrthogonalSelfAttention
from osa_lab.ops.functional import osa

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: (N, r, valid lengths per batch row): dense (N ≤ 4r) and low-rank (N > 4r) paths
CASES = [(7, 4, (7, 3)), (30, 2, (30, 11)), (50, 4, (23, 41))]


def _padding(lengths: tuple[int, ...], n: int) -> torch.Tensor:
    return torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]  # True = pad


@pytest.mark.parametrize(("n", "r", "lengths"), CASES)
def test_osa_with_key_padding_equals_the_truncated_sequence(n, r, lengths):
    gen = torch.Generator().manual_seed(n)
    b, h, d = len(lengths), 2, 5
    q, k = (torch.randn(b, h, n, r, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(b, h, n, d, generator=gen, dtype=torch.float64, requires_grad=True)
    alpha = torch.tensor([0.4, 0.9], dtype=torch.float64, requires_grad=True)
    pad = _padding(lengths, n)
    y = osa(q, k, v, alpha, key_padding_mask=pad)
    weights = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((y * weights).sum(), (q, k, v, alpha))
    alpha_grad = torch.zeros_like(alpha)
    for i, m in enumerate(lengths):
        qi, ki, vi = (t[i : i + 1, :, :m].detach().requires_grad_() for t in (q, k, v))
        ai = alpha.detach().requires_grad_()
        yi = osa(qi, ki, vi, ai)
        torch.testing.assert_close(y[i : i + 1, :, :m], yi, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(y[i, :, m:], v[i, :, m:].detach(), rtol=0, atol=1e-12)  # pads keep v
        gq, gk, gv, ga = torch.autograd.grad((yi * weights[i : i + 1, :, :m]).sum(), (qi, ki, vi, ai))
        torch.testing.assert_close(grads[0][i, :, :m], gq[0], rtol=1e-9, atol=1e-11)
        torch.testing.assert_close(grads[1][i, :, :m], gk[0], rtol=1e-9, atol=1e-11)
        torch.testing.assert_close(grads[2][i, :, :m], gv[0], rtol=1e-9, atol=1e-11)
        assert torch.all(grads[0][i, :, m:] == 0) and torch.all(grads[1][i, :, m:] == 0)
        torch.testing.assert_close(grads[2][i, :, m:], weights[i, :, m:], rtol=0, atol=1e-12)  # y = v there
        alpha_grad += ga
    torch.testing.assert_close(grads[3], alpha_grad, rtol=1e-9, atol=1e-11)


def test_layer_with_key_padding_equals_the_truncated_sequence():
    torch.manual_seed(0)
    layer = OrthogonalSelfAttention(dim=16, heads=2, tokens=40).double()
    x = torch.randn(2, 40, 16, dtype=torch.float64)
    pad = _padding((40, 17), 40)
    y = layer(x, key_padding_mask=pad, attn_mask=None, is_causal=False)
    torch.testing.assert_close(y[1:, :17], layer(x[1:, :17]), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(y[:1], layer(x[:1]), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("neutral", [{"attn_mask": None}, {"is_causal": False}, {"mask": None},
                                     {"causal": False}, {"attn_mask": None, "is_causal": False}])  # fmt: skip
def test_neutral_mask_arguments_are_accepted(neutral):
    torch.manual_seed(0)
    layer = OrthogonalSelfAttention(dim=8, heads=2, tokens=5)
    x = torch.randn(1, 5, 8)
    torch.testing.assert_close(layer(x, **neutral), layer(x), rtol=0, atol=0)
    q, k, v = torch.randn(5, 3), torch.randn(5, 3), torch.randn(5, 4)
    torch.testing.assert_close(osa(q, k, v, **neutral), osa(q, k, v), rtol=0, atol=0)


@pytest.mark.parametrize("mask", [{"attn_mask": torch.zeros(5, 5)}, {"is_causal": True}, {"causal": True},
                                  {"attn_mask": torch.ones(5, 5, dtype=torch.bool).tril()}])  # fmt: skip
def test_causal_or_dense_masks_are_still_refused(mask):
    layer = OrthogonalSelfAttention(dim=8, heads=2, tokens=5)
    with pytest.raises(CausalMaskError, match="key_padding_mask"):
        layer(torch.randn(1, 5, 8), **mask)


@pytest.mark.parametrize(("pad", "match"), [(torch.zeros(2, 5), "bool tensor"),
                                            (torch.zeros(3, 5, dtype=torch.bool), "shape"),
                                            (torch.zeros(2, 4, dtype=torch.bool), "shape"),
                                            (torch.zeros(2, 1, 5, dtype=torch.bool), "shape")])  # fmt: skip
def test_a_bad_padding_mask_is_named(pad, match):
    q, k, v = torch.randn(2, 1, 5, 3), torch.randn(2, 1, 5, 3), torch.randn(2, 1, 5, 4)
    with pytest.raises(OSAInputError, match=match):
        osa(q, k, v, key_padding_mask=pad)
    with pytest.raises(OSAInputError, match="batch dim"):
        osa(q[0, 0], k[0, 0], v[0, 0], key_padding_mask=torch.zeros(1, 5, dtype=torch.bool))


def test_factory_arguments_and_the_method_type():
    """``device=`` and ``dtype=`` build the parameters there; ``OSAMethod`` names every method."""
    from typing import get_args

    from osa_lab import OSAMethod
    from osa_lab.nn.attention import SoftmaxSelfAttention, ValueSkipInitAttention
    from osa_lab.ops.functional import OSA_METHODS

    assert set(get_args(OSAMethod)) == {"auto", *OSA_METHODS}
    for layer in (OrthogonalSelfAttention(8, 2, device="cpu", dtype=torch.float64),
                  SoftmaxSelfAttention(8, 2, device=torch.device("cpu"), dtype=torch.float64),
                  ValueSkipInitAttention(8, 2, device="cpu", dtype=torch.float64)):  # fmt: skip
        assert {(p.device.type, p.dtype) for p in [*layer.parameters(), *layer.buffers()]} == {("cpu", torch.float64)}
    with pytest.raises(RuntimeError):  # a device that does not exist here is torch's own error
        OrthogonalSelfAttention(8, 2, device="no-such-device")


def test_the_package_ships_its_type_marker():
    from importlib.resources import files

    assert files("osa_lab").joinpath("py.typed").is_file()
