"""What a Jacobian computation may cost and which algorithm runs: limits, the cost model, the choice.

The Jacobian's *algorithm* (:data:`JACOBIAN_ALGORITHMS`: ``"exact"``, ``"matrix-free"`` or
``"auto"``; not the ``method`` of :func:`osa_lab.osa`) is checked here, the size limits that refuse
a computation before it starts (:func:`check_size`, :func:`check_input_dim`), the fitted cost
model :func:`estimate_jacobian_seconds` and :func:`resolve_algorithm`, the one place where
``"auto"`` becomes ``"exact"`` or ``"matrix-free"``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
import torch

from osa_lab.errors import ConfigurationError, JacobianTooLargeError, unknown_name

JACOBIAN_ALGORITHMS = ("auto", "exact", "matrix-free")


SCOPES = ("end_to_end", "layer")


#: Inputs up to this many entries get the exact Jacobian under algorithm="auto" (when the cost
#: model also prefers it).
MAX_EXACT_DIM = 2048
#: Largest input (N·d entries) the Jacobian functions accept unless ``max_input_dim`` is raised:
#: N = 256, d = 256. Above it a single matrix-free solve takes tens of minutes on a CPU.
MAX_INPUT_DIM = 65536


def default_max_bytes() -> int:
    """Byte budget for one exact Jacobian: a quarter of physical memory, at most 4 GiB."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        phys = 16 * 2**30
    return int(min(phys // 4, 4 * 2**30))


def check_algorithm(algorithm: str) -> None:
    """Raise :class:`~osa_lab.errors.UnknownNameError` unless ``algorithm`` is one of :data:`JACOBIAN_ALGORITHMS`."""
    if algorithm not in JACOBIAN_ALGORITHMS:
        raise unknown_name("algorithm", algorithm, list(JACOBIAN_ALGORITHMS))


def check_size(n_out: int, n_in: int, dtype: torch.dtype, max_bytes: int | None) -> None:
    """Raise :class:`JacobianTooLargeError` when a dense ``n_out × n_in`` Jacobian in ``dtype`` would exceed ``max_bytes``."""
    limit = default_max_bytes() if max_bytes is None else max_bytes
    itemsize = torch.finfo(dtype).bits // 8
    need = n_out * n_in * itemsize
    if need > limit:
        raise JacobianTooLargeError(
            f"the exact Jacobian is {n_out} × {n_in} {str(dtype).removeprefix('torch.')} = {need / 2**30:.2f} GiB "
            f"(and about as much again for its SVD), over the limit of {limit / 2**30:.2f} GiB (`max_bytes`); "
            "use algorithm='matrix-free' (extreme singular values from jvp/vjp products, memory linear in the "
            "input) or algorithm='auto'"
        )


def check_input_dim(n: int, max_input_dim: int | None) -> None:
    limit = MAX_INPUT_DIM if max_input_dim is None else int(max_input_dim)
    if n > limit:
        raise JacobianTooLargeError(
            f"the input has {n} entries (N·d), over the limit of {limit} (`max_input_dim`): one Jacobian solve "
            f"would take about {_fmt_seconds(_mf_products(n) * _product_seconds(n, 1))} per layer on a CPU; "
            f"pass max_input_dim={n} (or larger) to run it anyway, or use fewer tokens or a smaller dim"
        )


def _fmt_seconds(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def resolve_layers(layers: Sequence[int] | None, depth: int) -> list[int]:
    """The layers 1..depth to study (all when ``layers`` is None); refuses layers outside 1..depth."""
    if layers is None:
        return list(range(1, depth + 1))
    out = sorted(set(int(l) for l in layers))
    if not out or out[0] < 1 or out[-1] > depth:
        raise ConfigurationError(f"`layers`={list(layers)} must lie in 1..depth={depth}")
    return out


# --------------------------------------------------------------------------------------
# Cost model (seconds) and the choice of algorithm
# --------------------------------------------------------------------------------------

#: Fitted constants of :func:`estimate_jacobian_seconds` (seconds; see its docstring).
COST_MODEL = {
    "product_overhead_osa": 0.017,
    "product_overhead_ssa": 0.003,
    "product_per_flop": 7e-9,
    "exact_row_per_flop_osa": 3e-8,
    "exact_row_per_flop_ssa": 1.4e-8,
    "dense_per_n3": 2.5e-9,
    "mf_products_cap": 2000,
}


def _block_flops(tokens: int, dim: int) -> float:
    """The size term of one block's product cost: ``N·d² + N²·d``."""
    return float(tokens) * dim * dim + float(tokens) ** 2 * dim


def _product_seconds(
    n: int, blocks: int, tokens: int | None = None, dim: int | None = None, osa: bool = True
) -> float:
    """Seconds of one Jacobian product through ``blocks`` blocks (N, d guessed as √n when not given)."""
    if tokens is None or dim is None:
        tokens = dim = max(int(round(math.sqrt(n))), 1)
    c = COST_MODEL
    overhead = c["product_overhead_osa"] if osa else c["product_overhead_ssa"]
    return blocks * (overhead + c["product_per_flop"] * _block_flops(tokens, dim))


def _mf_products(n: int) -> int:
    """Planning figure for the products of one matrix-free solve: the unrestarted Krylov space
    needs at most ``2n``; ill-conditioned cases measured 900–1600 (N·d = 144–576, κ 170–3,100)."""
    return int(min(2 * n, COST_MODEL["mf_products_cap"]))


def estimate_jacobian_seconds(
    tokens: int,
    dim: int,
    depth: int,
    heads: int = 1,
    algorithm: str = "auto",
    *,
    layers: Sequence[int] | None = None,
    scopes: Sequence[str] = SCOPES,
    attention: str = "osa",
) -> float:
    """Estimated CPU seconds (one torch thread) of :func:`~osa_lab.studies.jacobian.profile.jacobian_depth_profile` with these settings.

    ``algorithm`` ``"exact"``, ``"matrix-free"`` or ``"auto"`` (the cheaper of the two, which is
    what ``algorithm="auto"`` runs); ``attention`` ``"osa"`` or ``"ssa"`` (softmax blocks are cheaper
    per product); ``heads`` does not change the estimate measurably and is accepted for the
    callers' convenience. The model, with ``n = N·d``, ``f = N·d² + N²·d``, ``L`` the deepest
    requested layer and ``c`` from :data:`COST_MODEL`:

    * one product through one block: ``t_p = c₀ + 7e-9·f`` with ``c₀`` = 17 ms (OSA, QR path)
      or 3 ms (softmax);
    * exact: per block, ``n`` vjp rows at ``3e-8·f`` (OSA) or ``1.4e-8·f`` (softmax) s each,
      then ``2.5e-9·n³`` s per dense product or SVD (one product per block for the end-to-end
      scope, one SVD per requested layer and scope);
    * matrix-free: per requested layer ``l`` and scope, ``P = min(2n, 2000)`` products through
      ``l`` blocks (end-to-end) or one block (layer); a well-conditioned Jacobian converges in
      far fewer (tens), so this is a planning figure for κ ≳ 100, and solves stop at the
      product budget reported in :class:`~osa_lab.studies.jacobian.monitor.JacobianProgress`.

    Fitted to timings of pure-osa and vit blocks at (N, d) from (8, 8) to (256, 64) on the
    2-core development machine under a load average of ≈ 12 (other jobs running): absolute
    seconds are pessimistic by up to ≈ 5× on an idle machine, the exact/matrix-free ratio is
    what ``"auto"`` uses. Reproduce with ``benchmarks/analysis_speed.py``.
    """
    check_algorithm(algorithm)
    for name, value in (("tokens", tokens), ("dim", dim), ("depth", depth), ("heads", heads)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ConfigurationError(f"`{name}` must be a positive integer, got {value!r}")
    if attention not in ("osa", "ssa"):
        raise unknown_name("attention", attention, ["osa", "ssa"])
    for s in scopes:
        if s not in SCOPES:
            raise unknown_name("scope", s, list(SCOPES))
    wanted = resolve_layers(layers, depth)
    osa = attention == "osa"
    n = tokens * dim
    f = _block_flops(tokens, dim)
    c = COST_MODEL
    row = c["exact_row_per_flop_osa" if osa else "exact_row_per_flop_ssa"] * f
    dense = c["dense_per_n3"] * float(n) ** 3
    deepest = max(wanted)
    exact = (
        deepest * (n * row + (dense if "end_to_end" in scopes else 0.0)) + len(wanted) * len(scopes) * dense
    )
    per_product = _product_seconds(n, 1, tokens, dim, osa)
    blocks = sum((l if s == "end_to_end" else 1) for l in wanted for s in scopes)
    free = blocks * _mf_products(n) * per_product
    if algorithm == "exact":
        return float(exact)
    if algorithm == "matrix-free":
        return float(free)
    return float(min(exact, free))


def resolve_algorithm(
    algorithm: str,
    tokens: int,
    dim: int,
    depth: int = 1,
    heads: int = 1,
    *,
    layers: Sequence[int] | None = None,
    scopes: Sequence[str] = SCOPES,
    attention: str = "osa",
    max_exact_dim: int = MAX_EXACT_DIM,
    max_bytes: int | None = None,
    dtype: torch.dtype = torch.float64,
) -> str:
    """The algorithm ``"auto"`` runs for these settings (other algorithms are returned unchanged).

    Exact when the input has at most ``max_exact_dim`` entries, the ``n × n`` Jacobian fits
    ``max_bytes``, and :func:`estimate_jacobian_seconds` rates it no slower than matrix-free;
    otherwise matrix-free. Results of a call with ``algorithm="auto"`` equal those of the resolved
    algorithm (same seed and settings), so caches can key on the resolved algorithm.
    """
    check_algorithm(algorithm)
    if algorithm != "auto":
        return algorithm
    n = tokens * dim
    limit = default_max_bytes() if max_bytes is None else max_bytes
    if n > max_exact_dim or n * n * (torch.finfo(dtype).bits // 8) > limit:
        return "matrix-free"
    kw = dict(layers=layers, scopes=scopes, attention=attention)
    exact = estimate_jacobian_seconds(tokens, dim, depth, heads, "exact", **kw)
    free = estimate_jacobian_seconds(tokens, dim, depth, heads, "matrix-free", **kw)
    return "exact" if exact <= free else "matrix-free"
