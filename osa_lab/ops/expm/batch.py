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


class _Sink:
    """Where :class:`_WholeBatch` leaves the values it reads (a plain object: torch.func passes it
    through its levels untouched, where a list or dict would be copied as a pytree)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: torch.Tensor | None = None


class _WholeBatch(torch.autograd.Function):
    """Reads the values of a tensor under any torch.func transform (PyTorch's "Extending torch.func
    with autograd.Function"): at a vmap level its ``vmap`` rule receives the batched tensor itself
    and passes it on with the vmapped dimension in front; at a grad or jvp level torch.func hands
    the forward the unwrapped tensor. The forward, below every level, leaves a plain tensor in the
    :class:`_Sink`. It returns nothing and has no derivatives: it only reads."""

    @staticmethod
    def forward(t: torch.Tensor, sink: _Sink) -> None:  # noqa: D102
        sink.value = t

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: D102
        pass

    @staticmethod
    def backward(ctx, *grads):  # noqa: D102
        return None, None

    @staticmethod
    def jvp(ctx, *tangents) -> None:  # noqa: D102
        return None

    @staticmethod
    def vmap(info, in_dims, t: torch.Tensor, sink: _Sink):  # noqa: D102
        _WholeBatch.apply(t.movedim(in_dims[0], 0), sink)
        return None, None


def transformed(t: torch.Tensor) -> bool:
    """Whether ``t`` is wrapped by a torch.func transform (vmap, grad, jacrev, jacfwd, jvp, …):
    :func:`torch.func.debug_unwrap` returns such a tensor's underlying tensor and any other tensor
    itself. Only the identity is compared; the unwrapped tensor is never used (torch.func
    documents its use inside a transformed function as undefined). No tensor operation. While
    ``torch.compile`` traces (fake tensors, no transform wrapper of ours), ``False``: Dynamo cannot
    trace ``debug_unwrap`` and would break the graph at every call."""
    if torch.compiler.is_compiling():
        return False
    return torch.func.debug_unwrap(t, recurse=False) is not t


def concrete(t: torch.Tensor) -> torch.Tensor:
    """The values of ``t`` as a plain tensor, for a decision on them ("does any matrix need
    float64?"): ``t`` itself outside torch.func transforms; under them the values below every
    level (:class:`_WholeBatch`), under ``vmap`` those of the whole vmapped batch with the
    vmapped dimensions in front, so that the decision holds for every call of the batch
    (detached there)."""
    if not transformed(t):
        return t
    sink = _Sink()
    _WholeBatch.apply(t.detach(), sink)
    if sink.value is None:
        raise RuntimeError("whole_batch: the batched call did not hand back its values")
    return sink.value


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
    """True under torch.func transforms (jacrev, jacfwd, vmap, grad; :func:`transformed`) or
    forward-mode AD, which the hand-written backwards of :class:`_ChebyshevAction` and
    :class:`_GramAction` do not support: the plain-operation references run there."""
    from torch.autograd import forward_ad

    return any(transformed(t) or forward_ad.unpack_dual(t).tangent is not None for t in tensors)


def vmap_only(*tensors: torch.Tensor) -> bool:
    """True when every active torch.func transform is ``vmap`` (no ``grad``/``jvp`` level) and no
    tensor carries a forward-mode tangent: a custom autograd.Function with a ``vmap`` rule can
    then fold the vmapped dimensions into its batch and run its plain path, whose backward the
    ordinary autograd outside the transforms records. Reads torch.func's interpreter stack; where
    that is not available it answers False (the plain-operation references run)."""
    from torch.autograd import forward_ad

    try:
        from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

        kinds = [level.key().name for level in retrieve_all_functorch_interpreters()]
    except (ImportError, AttributeError):  # pragma: no cover - a torch without this reader
        return False
    if not kinds or any(kind != "Vmap" for kind in kinds):
        return False
    return all(forward_ad.unpack_dual(t).tangent is None for t in tensors)
