"""The engines' entry points: :func:`lowrank_action` and :func:`blocked_action` (the path of
:func:`osa_lab.osa`), with the float64 recomputation and the QR fallback.

Part of :mod:`osa_lab.ops.expm` (Zhang & Martens, arXiv 2602.05996; docs/design.md §1–§2).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from osa_lab.errors import OSAInputError, UntrustedResultError, unknown_name
from osa_lab.ops.expm.batch import any_row, concrete, replace_rows, take_rows
from osa_lab.ops.expm.bounds import float64_needed, warn_float64_rounding
from osa_lab.ops.expm.chebyshev import set_general_path
from osa_lab.ops.expm.gram import gram_engine, osa_skew_core
from osa_lab.ops.expm.qr import qr_action
from osa_lab.ops.guards import sum_is_finite

#: Engines of :func:`lowrank_action` and :func:`blocked_action`.
ENGINES = ("gram", "qr", "lowrank")


def lowrank_action(u: torch.Tensor, j: torch.Tensor, v: torch.Tensor, *, engine: str = "lowrank") -> torch.Tensor:
    """``exp(U J Uᵀ) V`` for skew ``J`` without forming an N×N matrix.

    ``u (..., N, m)``, ``j (..., m, m)`` skew-symmetric, ``v (..., N, d)``; leading dims
    broadcast. ``engine`` is ``"gram"``, ``"qr"`` or ``"lowrank"`` (Gram with a QR fallback
    for the matrices the Gram engine cannot compute accurately; see module docstring).
    """
    if j.shape[-1] != u.shape[-1] or j.shape[-2] != u.shape[-1]:
        raise OSAInputError(f"`j` must be ({u.shape[-1]}, {u.shape[-1]}) to match `u`; got {tuple(j.shape)}")
    if u.shape[-2] != v.shape[-2]:
        raise OSAInputError(f"`u` has N={u.shape[-2]} tokens but `v` has N={v.shape[-2]}")
    if u.shape[-2] == 0:
        raise OSAInputError(f"`u` has N=0 tokens (shape {tuple(u.shape)}); lowrank_action needs at least one token")
    try:
        batch = torch.broadcast_shapes(u.shape[:-2], j.shape[:-2], v.shape[:-2])
    except RuntimeError as exc:
        raise OSAInputError(
            f"leading dims of `u` {tuple(u.shape[:-2])}, `j` {tuple(j.shape[:-2])} and `v` "
            f"{tuple(v.shape[:-2])} do not broadcast"
        ) from exc
    n, m, d = u.shape[-2], u.shape[-1], v.shape[-1]
    if math.prod(batch) == 0 or d == 0:  # nothing to transform: an empty result of the right shape
        return v.expand(*batch, n, d).clone()
    u3 = u.expand(*batch, n, m).reshape(-1, n, m)
    j3 = j.expand(*batch, m, m).reshape(-1, m, m)
    v3 = v.expand(*batch, n, d).reshape(-1, n, d)
    half = m // 2
    y3 = blocked_action(u3[..., :half], u3[..., half:], j3, v3, engine)
    return y3.reshape(*batch, n, d)


def blocked_action(
    a: torch.Tensor,
    b: torch.Tensor,
    j: torch.Tensor,
    v: torch.Tensor,
    engine: str,
    *,
    osa_core: bool = False,
    norms: bool = False,
) -> Any:  # a tensor, or (tensor, sums) with norms=True
    """``exp(U J Uᵀ) V`` for ``U = [a b]`` given as 3-D blocks ``(batch, N, ·)`` (no broadcasting).

    The entry point of :func:`osa_lab.osa` (``a = q``, ``b = k``, ``osa_core=True``: ``j`` is
    :func:`osa_skew_core`) and :func:`lowrank_action`. Below float64, the matrices with ``‖S‖₂``
    above :data:`FLOAT64_NORM` are recomputed by the same engine in float64 (measured there);
    ``‖S‖_F`` settles those at or below it without further cost (:func:`gram_core_parts`).
    ``norms=True`` returns ``(Y, norms)`` with the output check's ``(‖Y‖², ‖V‖², difference)``
    per matrix where the Gram engine's small matrices give them (:func:`output_norm_change`), None
    where rows were recomputed or another engine ran.
    """
    if engine not in ENGINES:
        raise unknown_name("engine", engine, ENGINES)
    if engine == "qr":  # (osa() tries osa_chebyshev_action before building J; not again here)
        y = qr_action(torch.cat([a, b], -1), j, v, osa_core=osa_core and a.shape[-1] == b.shape[-1])
        return (y, None) if norms else y
    if v.shape[0] == 0 or v.shape[-2] == 0:
        return (v.clone(), None) if norms else v.clone()
    y, est, s_two, sq = gram_engine(a, b, j, v, engine != "gram", osa_core)
    if v.dtype == torch.float64:
        warn_float64_rounding(s_two, engine)
    big = float64_needed(s_two, v.dtype)
    if any_row(big):  # below float64 with ‖S‖₂ > FLOAT64_NORM: the same engine in float64 there

        def in_float64(idx: torch.Tensor | None) -> torch.Tensor:
            a64, b64, v64 = (take_rows(x, idx).double() for x in (a, b, v))
            return blocked_action(a64, b64, take_rows(j, idx), v64, engine, osa_core=osa_core).to(v.dtype)

        y, sq = replace_rows(y, big, in_float64), None
        est = torch.where(big, 0.0, est)  # settled by the float64 engine, which refuses or falls back itself
    if engine == "gram":
        y = _refuse_untrusted_gram(a, b, v, y, est)
        return (y, sq) if norms else y
    bad = est > 1.0
    if any_row(bad):

        def by_qr(idx: torch.Tensor | None) -> torch.Tensor:
            return qr_action(torch.cat([take_rows(a, idx), take_rows(b, idx)], -1), take_rows(j, idx), take_rows(v, idx))

        y, sq = replace_rows(y, bad, by_qr), None
    return (y, sq) if norms else y


def _refuse_untrusted_gram(a: torch.Tensor, b: torch.Tensor, v: torch.Tensor, y: torch.Tensor, est: torch.Tensor) -> torch.Tensor:
    """The ``"gram"`` engine alone: return ``y`` only where its own estimate trusts it.

    ``est`` is the Gram engine's error estimate over its budget, ``inf`` where the Cholesky
    factorisation failed or the condition estimate of ``U = [a b]`` is over ``GRAM_MAX_COND``
    (rank-deficient ``U``: N < 2r, k ∥ q, q = 0; there the result is wrong by O(1) and its
    gradients are zero). Any untrusted matrix raises :class:`UntrustedResultError`, unless the
    inputs hold NaN/Inf (the caller names those), where the untrusted rows become NaN instead
    of a wrong value. Under ``torch.func.vmap`` the decision is taken on the whole vmapped batch
    (:func:`concrete`), so vmap raises exactly where a loop over the batch would; it used to
    turn those rows into NaN there.
    """
    bad = ~(est <= 1.0)  # NaN counts as untrusted
    if not any_row(bad):
        return y
    if not all(sum_is_finite(concrete(t)) for t in (a, b, v)):
        return torch.where(bad[..., None, None], torch.full_like(y, math.nan), y)
    bad, est = concrete(bad), concrete(est)
    count, n, width = int(bad.sum()), a.shape[-2], a.shape[-1] + b.shape[-1]
    worst = float(est.max())
    why = (
        "its Cholesky factorisation failed or its condition estimate of U = [q k] is over the limit"
        if not math.isfinite(worst)
        else f"its error estimate is {worst:.3g}× the {v.dtype} accuracy budget"
    )
    raise UntrustedResultError(
        f"method/engine 'gram' refuses {count} of {est.numel()} matrices (N={n}, 2r={width}): the "
        f"Gram/Cholesky factorisation is not trustworthy for this input ({why}; [q k] is "
        "rank-deficient or ill-conditioned, e.g. N < 2r, k parallel to q, or q = 0), so its result "
        "and gradients would be wrong. Use method=\"qr\", \"lowrank\" or \"auto\" (engine \"qr\" or "
        "\"lowrank\" for lowrank_action), which handle any q, k."
    )


def _qr_on_blocks(q: torch.Tensor, k: torch.Tensor, c: torch.Tensor, v: torch.Tensor) -> tuple:
    """``exp(c (q kᵀ − k qᵀ)) V`` by the ``"qr"`` engine on 3-D blocks, with the output check's
    sums: what :func:`osa_lab.osa` computes where the small-N action's degrees do not reach."""
    return blocked_action(q, k, osa_skew_core(q.shape[-1], c.double()), v, "qr", osa_core=True, norms=True)


set_general_path(_qr_on_blocks)
