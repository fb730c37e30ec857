"""Batches of matrices: selecting and replacing rows of a batch, torch.func detection, and the
second-derivative backward through a plain-operation reference.

Part of :mod:`osa_lab.ops.expm` (Zhang & Martens, arXiv 2602.05996; docs/design.md §1–§2).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def composite_backward(
    forward: Callable[..., torch.Tensor], inputs: tuple, needs: tuple[bool, ...], grad_out: torch.Tensor
) -> tuple[torch.Tensor | None, ...]:
    """The vector-Jacobian product of ``forward(*inputs)`` with ``grad_out`` by autograd, with a
    graph (``create_graph=True``): the backward of a hand-written :class:`torch.autograd.Function`
    when a graph of the backward is requested (Hessian-vector products, gradient penalties),
    differentiable to any order. ``inputs`` are the Function's saved inputs, still attached to
    their graph; ``needs`` says which of them want a gradient."""
    with torch.enable_grad():
        outs = forward(*inputs)
        wanted = [x for x, need in zip(inputs, needs, strict=True) if need]
        grads = iter(torch.autograd.grad(outs, wanted, grad_out, create_graph=True, allow_unused=True))
    return tuple(_zero_if_none(next(grads), x) if need else None for x, need in zip(inputs, needs, strict=True))


def _zero_if_none(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like) if grad is None else grad


def concrete(t: torch.Tensor) -> torch.Tensor:
    """``t`` without its torch.func wrappers: under ``vmap`` the values of the whole vmapped
    batch, so that a decision on them ("does any matrix need float64?") holds for every call."""
    wrapped, unwrap = torch._C._functorch.is_functorch_wrapped_tensor, torch._C._functorch.get_unwrapped
    while wrapped(t):
        t = unwrap(t)
    return t


def any_row(mask: torch.Tensor) -> bool:
    """Whether any entry of ``mask`` is True (under torch.func.vmap: anywhere in the vmapped batch)."""
    return bool(concrete(mask).any())


def take_rows(x: torch.Tensor, idx: torch.Tensor | None) -> torch.Tensor:
    return x if idx is None else x[idx]


def replace_rows(
    y: torch.Tensor, mask: torch.Tensor, compute: Callable[[torch.Tensor | None], torch.Tensor]
) -> torch.Tensor:
    """``y`` (b, …) with the matrices where ``mask`` (b,) holds replaced by ``compute(idx)``, their
    recomputation from the rows ``idx``. Under torch.func transforms, which allow no shapes that
    depend on values, ``compute(None)`` recomputes every row and ``torch.where`` selects."""
    if under_transform(y, mask):
        return torch.where(mask[..., None, None], compute(None), y)
    idx = mask.nonzero().squeeze(-1)
    return y.index_copy(0, idx, compute(idx))


def under_transform(*tensors: torch.Tensor) -> bool:
    """True under torch.func transforms (jacrev, jacfwd, vmap, grad) or forward-mode AD, which the
    hand-written backwards of :class:`_ChebyshevAction` and :class:`_GramAction` do not support:
    the plain-operation references run there."""
    from torch.autograd import forward_ad

    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    return any(wrapped(t) or forward_ad.unpack_dual(t).tangent is not None for t in tensors)
