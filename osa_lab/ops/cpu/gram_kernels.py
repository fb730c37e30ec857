"""Python side of the CPU kernels of the Gram engine's token passes (float32, ``gram_passes.c``).

The Gram engine (:mod:`osa_lab.ops.expm.gram`) computes ``exp(S) V = V + U C`` for ``U = [q k]``
(Zhang & Martens, arXiv 2602.05996; docs/design.md §1–§2) with a small float64 core between two
passes over the tokens: ``G = UᵀU`` and ``P = UᵀV`` before it, ``Y = V + U C`` after it (and in
the backward ``gC = Uᵀ gY``, ``∂L/∂V``, ``∂L/∂q``, ``∂L/∂k``). The batched torch products of
that module are the reference beside these kernels:

- :func:`transposed_products` computes ``X_aᵀ [X_lo … X_last]`` for one or two ``a`` in one pass
  over the tokens (the forward's five ``r × r`` and ``r × d`` blocks read q, k and v once);
- :func:`token_products` computes ``Y = X + Σ_s A_s C_s`` with the small ``C_s`` in cache.

Token tensors of shape ``(*batch, N, w)`` are read and written in their own layout (per-matrix
offsets and a row stride; columns contiguous). :func:`usable` says where the kernels apply;
elsewhere the caller keeps the torch products.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence

import torch

from osa_lab.errors import KernelFailedError, OSAInputError
from osa_lab.ops.cpu.build import library, loaded_library
from osa_lab.ops.cpu.views import view_args

_INT32_MAX = 2**31 - 1

#: Every width of a token tensor is a multiple of this (whole vectors per row).
WIDTH_MULTIPLE = 16

#: Floats per vector of the builds the kernels are used with: 16 (AVX-512) and 8 (AVX2 with FMA).
VECTOR_FLOATS = (8, 16)


def usable(*tokens: torch.Tensor, inner: Sequence[torch.Tensor] = ()) -> bool:
    """True when the kernels can run on the token tensors ``(*batch, N, w)``: plain (not
    subclassed) strided float32 CPU tensors with one batch shape (at least one matrix) and N,
    contiguous columns, every ``w`` a multiple of :data:`WIDTH_MULTIPLE`, sizes within 32-bit
    indices where the kernels use them, outside ``torch.compile`` tracing, and the library built
    with hardware vectors (AVX-512 or AVX2 with FMA; a build without them keeps the torch path).
    ``inner``: token tensors read only as scalars (the ``A_s`` of :func:`token_products`), of any
    width."""
    if not tokens or torch.compiler.is_compiling():  # while dynamo traces there are no real pointers
        return False
    first = tokens[0]
    for t in (*tokens, *inner):
        if not (
            type(t) is torch.Tensor and t.device.type == "cpu" and t.dtype == torch.float32
            and t.layout == torch.strided and t.dim() >= 2 and t.shape[:-1] == first.shape[:-1]
            and (t.stride(-1) == 1 or t.shape[-1] == 1)
        ):  # fmt: skip
            return False
    if any(t.shape[-1] < WIDTH_MULTIPLE or t.shape[-1] % WIDTH_MULTIPLE for t in tokens):
        return False
    if not 1 <= first.shape[-2] <= _INT32_MAX or not 1 <= math.prod(first.shape[:-2]) <= _INT32_MAX:
        return False
    lib = library()
    return lib is not None and lib.osa_gram_vector_floats() in VECTOR_FLOATS


def _require_usable(*tokens: torch.Tensor, inner: Sequence[torch.Tensor] = ()) -> None:
    if not usable(*tokens, inner=inner):
        shapes = ", ".join(f"{tuple(t.shape)} {t.dtype}" for t in (*tokens, *inner))
        raise OSAInputError(
            f"the CPU token passes cannot read these tensors ({shapes}): they take float32 CPU tensors of one batch "
            f"and N, contiguous columns, widths a multiple of {WIDTH_MULTIPLE}, on an AVX-512 or AVX2 build "
            "(osa_lab.ops.cpu.gram_kernels.usable)"
        )


def _check(code: int, what: str) -> None:
    if code == 1:
        raise KernelFailedError(f"the CPU kernel {what} found no memory for its partial sums")
    if code != 0:
        raise KernelFailedError(f"the CPU kernel {what} refused its arguments (code {code})")


def _ints(values: Sequence[int]) -> ctypes.Array:
    return (ctypes.c_int * len(values))(*values)


def _tokens(x: torch.Tensor | None, keep: list) -> tuple:
    return view_args(x, keep, column_stride=False)


def transposed_products(xs: Sequence[torch.Tensor], firsts: Sequence[int]) -> list[torch.Tensor]:
    """``[X_aᵀ [X_firsts[a] … X_last] for a < len(firsts)]`` summed over the tokens, each
    ``(*batch, w_a, Σ w_s)`` float32: the Gram pass ``xs = (q, k, v)``, ``firsts = (0, 1)`` gives
    ``qᵀ[q k v]`` and ``kᵀ[k v]`` in one read of q, k and v. A symmetric block ``X_aᵀX_a``
    (``firsts[a] == a``) is computed on and above its diagonal and mirrored: exactly symmetric.
    ``xs``: 1–3 token tensors that :func:`usable` accepts; ``firsts``: 1–2 indices into ``xs``."""
    if not 1 <= len(xs) <= 3 or not 1 <= len(firsts) <= min(2, len(xs)):
        raise OSAInputError(f"transposed_products takes 1–3 token tensors and 1–2 firsts, got {len(xs)} and {len(firsts)}")
    if not all(0 <= lo < len(xs) for lo in firsts):
        raise OSAInputError(f"transposed_products: each of `firsts` must index `xs`, got {tuple(firsts)}")
    _require_usable(*xs)
    batch, n = xs[0].shape[:-2], xs[0].shape[-2]
    widths = [x.shape[-1] for x in xs]
    outs = [torch.empty(*batch, widths[a], sum(widths[lo:]), dtype=torch.float32) for a, lo in enumerate(firsts)]
    keep: list = []
    views = [arg for i in range(3) for arg in _tokens(xs[i] if i < len(xs) else None, keep)]
    code = loaded_library().osa_gram_tn(
        math.prod(batch), n, len(xs), _ints(widths), *views, len(firsts), _ints(list(firsts)),
        outs[0].data_ptr(), outs[1].data_ptr() if len(outs) > 1 else None, torch.get_num_threads(),
    )  # fmt: skip
    _check(code, "osa_gram_tn")
    return outs


def token_products(
    terms: Sequence[tuple[torch.Tensor, torch.Tensor]],
    out: torch.Tensor,
    add: torch.Tensor | None = None,
    add_squares: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out = add + Σ_s A_s C_s`` for 1–4 ``(A_s, C_s)``: ``A_s`` token tensors ``(*batch, N, w_s)``
    and small ``C_s`` ``(*batch, w_s, d)``; ``add`` and ``out`` ``(*batch, N, d)`` token tensors
    (``add`` None: no term; ``out`` must not overlap an input). ``add_squares``: a contiguous
    float64 tensor of one value per matrix that receives ``Σ add²`` from the same read of ``add``
    (the output check's ``‖V‖²``). Returns ``out``."""
    if not 1 <= len(terms) <= 4:
        raise OSAInputError(f"token_products takes 1–4 terms, got {len(terms)}")
    _require_usable(out, *([] if add is None else [add]), inner=[a for a, _ in terms])
    if add is not None and add.shape != out.shape:
        raise OSAInputError(f"`add` {tuple(add.shape)} and `out` {tuple(out.shape)} differ in shape")
    if any(stride == 0 and size > 1 for stride, size in zip(out.stride(), out.shape, strict=True)):
        raise OSAInputError("`out` overlaps itself (a zero stride): give it its own memory")
    batch, n, d = out.shape[:-2], out.shape[-2], out.shape[-1]
    for a, c in terms:
        if a.shape[:-1] != out.shape[:-1] or c.shape != (*batch, a.shape[-1], d):
            raise OSAInputError(f"a term A {tuple(a.shape)}, C {tuple(c.shape)} does not fit out {tuple(out.shape)}")
    stack = torch.cat([c.to(torch.float32) for _, c in terms], -2).contiguous()
    if add_squares is not None and (
        add is None or add_squares.dtype != torch.float64 or not add_squares.is_contiguous()
        or add_squares.numel() != math.prod(batch)
    ):  # fmt: skip
        raise OSAInputError("`add_squares` takes one contiguous float64 value per matrix, and needs `add`")
    keep: list = []
    views = [arg for i in range(4) for arg in _tokens(terms[i][0] if i < len(terms) else None, keep)]
    code = loaded_library().osa_gram_nn(
        math.prod(batch), n, d, len(terms), _ints([a.shape[-1] for a, _ in terms]), *views, stack.data_ptr(),
        *_tokens(add, keep), *_tokens(out, keep), add_squares.data_ptr() if add_squares is not None else None,
        torch.get_num_threads(),
    )  # fmt: skip
    _check(code, "osa_gram_nn")
    return out
