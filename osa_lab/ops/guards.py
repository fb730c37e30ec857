"""Input checks shared by the functional API and the layers."""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from osa_lab.errors import CausalMaskError, NonFiniteError, OSADtypeError, OSAInputError

_MASK_KEYS = ("mask", "attn_mask", "causal", "is_causal")


def refuse_masks(kwargs: dict) -> None:
    """Raise :class:`CausalMaskError` for a mask or causal flag, else TypeError for unknown keywords.

    The neutral values of PyTorch's and timm's conventions (``attn_mask=None``, ``mask=None``,
    ``is_causal=False``, ``causal=False``) ask for nothing and are accepted; a padding mask is
    ``key_padding_mask`` (:func:`apply_key_padding`), which OSA honours exactly."""
    for key in _MASK_KEYS:
        if key not in kwargs:
            continue
        value = kwargs.pop(key)
        if value is None or (key in ("causal", "is_causal") and value is False):
            continue
        raise CausalMaskError(
            f"OSA got `{key}`={value!r}, but orthogonal self-attention is non-causal: "
            "exp(S) of a skew-symmetric S mixes every token with every other, and masking S "
            "breaks skew-symmetry and with it orthogonality. Remove the mask (padding: pass "
            "`key_padding_mask`, which OSA honours exactly), or use SoftmaxSelfAttention / "
            "F.scaled_dot_product_attention for causal attention."
        )
    if kwargs:
        raise TypeError(f"unexpected keyword arguments: {sorted(kwargs)}")


def apply_key_padding(
    q: torch.Tensor, k: torch.Tensor, key_padding_mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` and ``k`` with the rows of padded tokens zeroed (``key_padding_mask``: bool
    ``(B, N)``, True = pad, as in ``nn.MultiheadAttention``; q, k ``(B, ..., N, r)``).

    Zero rows of q and k zero the pads' rows and columns of ``S = α/√r (q kᵀ − k qᵀ)``, so
    ``exp(S)`` is block diagonal: the valid tokens get exactly the output of the truncated
    sequence and each pad keeps its value, ``y = v`` (Zhang & Martens, arXiv 2602.05996, the OSA
    definition; the result stays orthogonal)."""
    if key_padding_mask is None:
        return q, k
    if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool:
        raise OSAInputError(
            "`key_padding_mask` must be a bool tensor (B, N), True where a token is padding (as in "
            f"nn.MultiheadAttention), got {type(key_padding_mask).__name__}"
            + (f" of dtype {key_padding_mask.dtype}" if isinstance(key_padding_mask, torch.Tensor) else "")
        )
    n = q.shape[-2]
    if key_padding_mask.dim() != 2 or key_padding_mask.shape[-1] != n or key_padding_mask.shape[0] != q.shape[0]:
        raise OSAInputError(
            f"`key_padding_mask` must have shape (batch, tokens) = ({q.shape[0] if q.dim() > 2 else '?'}, {n}), "
            f"got {tuple(key_padding_mask.shape)}; q is {tuple(q.shape)}"
        )
    keep = (~key_padding_mask).to(q.dtype).reshape(q.shape[0], *([1] * (q.dim() - 3)), n, 1)
    return q * keep, k * keep


def check_float_tensor(
    name: str, x: object, *, allow_half_on_cpu: bool = False, finite: bool = True
) -> torch.Tensor:
    """Check that ``x`` is a floating-point tensor (with finite entries unless ``finite=False``).

    Raises :class:`~osa_lab.errors.OSADtypeError` for a non-tensor or an unusable dtype and
    :class:`~osa_lab.errors.NonFiniteError` (counting the NaN and Inf entries) for NaN/Inf.
    """
    if not isinstance(x, torch.Tensor):
        raise OSADtypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise OSADtypeError(
            f"`{name}` has dtype {x.dtype}; OSA needs a floating dtype "
            "(float32 or float64; bfloat16/float16 on CUDA). Convert with `.float()`."
        )
    if x.dtype == torch.float16 and x.device.type == "cpu" and not allow_half_on_cpu:
        raise OSADtypeError(
            f"`{name}` is float16 on the CPU, which PyTorch's CPU linear algebra does not support "
            "accurately; use float32 (`.float()`) on the CPU or move the tensor to a CUDA device."
        )
    # One reduction instead of an elementwise isfinite pass (which costs as much as a matmul
    # here): NaN/Inf entries make the sum non-finite; only then are they counted.
    if finite and not sum_is_finite(x):
        values = whole_batch(x)  # under torch.func.vmap: every call of the vmapped batch
        n_nan = int(torch.isnan(values).sum())
        n_inf = int(torch.isinf(values).sum())
        if n_nan == 0 and n_inf == 0:
            return x  # the sum overflowed, the entries are finite
        raise NonFiniteError(
            f"`{name}` contains {n_nan} NaN and {n_inf} Inf entries (shape {tuple(x.shape)}); "
            "OSA needs finite inputs. Check the layer that produced them."
        )
    return x


def whole_batch(x: torch.Tensor) -> torch.Tensor:
    """The values of ``x`` as a plain tensor for a check: ``x`` itself outside torch.func
    transforms; under ``vmap`` those of every call of the vmapped batch (vmapped dims in front),
    under ``grad``/``jvp`` the unwrapped values (:func:`osa_lab.ops.expm.batch.concrete`).

    A check that decides on these values raises the project's error under ``vmap`` exactly when
    a loop over the vmapped calls would raise it in one of them: the checks are batched, never
    skipped, and the error names the whole batch's NaN/Inf counts."""
    from osa_lab.ops.expm.batch import concrete  # (the expm package imports this module)

    return concrete(x)


def sum_is_finite(x: torch.Tensor) -> bool:
    """True when the sum of ``x`` is finite: one reduction that any NaN or Inf entry spoils.
    Under torch.func transforms the sum is taken over the whole vmapped batch (:func:`whole_batch`)."""
    acc = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    total = x.sum(dtype=acc)
    try:
        return bool(torch.isfinite(total))
    except RuntimeError:  # a torch.func wrapper has no single value: decide on the whole batch
        return bool(torch.isfinite(whole_batch(x).sum(dtype=acc)))


def all_finite(x: torch.Tensor) -> bool:
    """Whether every entry of ``x`` is finite. A small float32/float64 CPU tensor is tested in
    NumPy, without the six ATen operations of ``torch.isfinite(x).all()`` and their dispatch."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and x.numel() <= 4096:
        try:
            return bool(np.isfinite((x.detach() if x.requires_grad else x).numpy()).all())
        except RuntimeError:  # a torch.func wrapper has no NumPy view
            pass
    try:
        return bool(torch.isfinite(x).all())
    except RuntimeError:  # under torch.func transforms: every call of the vmapped batch
        return bool(torch.isfinite(whole_batch(x)).all())


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, finite: bool = True) -> None:
    """Check shapes, dtypes and devices of q (..., N, r), k (..., N, r), v (..., N, d_v).

    ``finite=False`` skips the NaN/Inf scan; :func:`osa_lab.osa` instead checks its output,
    which every NaN or Inf input spoils, and only then scans the inputs to name the culprit.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_float_tensor(name, x, finite=finite)
        if x.dim() < 2:
            raise OSAInputError(
                f"`{name}` has shape {tuple(x.shape)}; it needs at least 2 dims (..., tokens, features)"
            )
    if q.shape != k.shape:
        raise OSAInputError(
            f"`q` has shape {tuple(q.shape)} but `k` has shape {tuple(k.shape)}; "
            "they must match, (..., N, r)"
        )
    if v.shape[-2] != q.shape[-2]:
        raise OSAInputError(
            f"token counts differ: `q`/`k` have N={q.shape[-2]} (shape {tuple(q.shape)}) but `v` has "
            f"N={v.shape[-2]} (shape {tuple(v.shape)}); OSA needs the same N for q, k and v"
        )
    try:
        if q.shape[:-2] != v.shape[:-2]:  # (torch.broadcast_shapes costs as much as the rest of the checks)
            torch.broadcast_shapes(q.shape[:-2], v.shape[:-2])
    except RuntimeError as exc:
        raise OSAInputError(
            f"leading dims of `q` {tuple(q.shape[:-2])} and `v` {tuple(v.shape[:-2])} do not broadcast"
        ) from exc
    if not (q.dtype == k.dtype == v.dtype):
        raise OSADtypeError(f"dtypes differ: q {q.dtype}, k {k.dtype}, v {v.dtype}; cast them to one dtype")
    if not (q.device == k.device == v.device):
        raise OSAInputError(f"devices differ: q {q.device}, k {k.device}, v {v.device}")
    if q.shape[-2] == 0:
        raise OSAInputError(f"`q` has N=0 tokens (shape {tuple(q.shape)}); OSA needs at least one token")
    if q.shape[-1] == 0:
        raise OSAInputError(f"`q` has head width r=0 (shape {tuple(q.shape)}); r must be at least 1")


def check_alpha(alpha: object, *, finite: bool = True) -> float | None:
    """Check OSA's α: a real number (returned as a float) or a real tensor (checked, None returned).

    Bool, complex and non-numbers raise :class:`OSADtypeError`; a number beyond float64's range
    (e.g. ``10**400``) or NaN/Inf raises :class:`OSAInputError`, as does a tensor with NaN/Inf
    entries unless ``finite=False`` (its check then needs no host synchronisation: the caller
    checks the output, which a NaN/Inf α spoils).
    """
    if isinstance(alpha, torch.Tensor):
        if alpha.dtype == torch.bool or alpha.is_complex():
            raise OSADtypeError(
                f"`alpha` is a tensor of dtype {alpha.dtype}; α must be real: pass a float or a "
                "floating-point tensor (e.g. `alpha.float()`, or `alpha.real` for a complex one)"
            )
        if finite and alpha.numel() and not all_finite(alpha):
            raise NonFiniteError(f"`alpha` contains NaN or Inf: {whole_batch(alpha.detach())}")
        return None
    if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, numbers.Real):
        raise OSADtypeError(f"`alpha` must be a real number or a floating-point tensor, got {type(alpha).__name__}")
    try:
        value = float(alpha)
    except OverflowError:
        raise OSAInputError(
            f"`alpha` = {alpha!r:.40} is beyond float64's range (±1.8e308); α must be a finite real number"
        ) from None
    if not math.isfinite(value):
        raise OSAInputError(f"`alpha` must be finite, got {alpha}")
    return value
