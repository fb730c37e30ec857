"""Low-rank OSA ``exp(S) V`` in Triton, forward and backward (docs/triton.md).

Zhang & Martens, "Orthogonal Self-Attention" (arXiv 2602.05996): ``S = U J Uᵀ`` with
``U = [q k]`` (N × 2r) and ``J = s [[0, I], [−I, 0]]``, ``s = α/√r``. The Gram form of
:mod:`osa_lab.ops.expm` gives ``exp(S) V = V + U F (Uᵀ V)`` with ``F = F(G, J)``, ``G = UᵀU``
(2r × 2r). This module computes it in three steps per (batch·head) ``b``:

Forward
    1. **reduce pass** (Triton, over tokens, split over N): ``[G | P] = Uᵀ [U | V]`` in float32
       tiles, partial sums per token split, summed afterwards in float64. ``U`` is never
       materialised: a tile's rows come from ``q`` or ``k``, its columns from ``q``, ``k`` or
       ``v``; Gram tiles strictly below the diagonal are skipped (``G`` is symmetric).
    2. **core** (torch, float64, batched): ``F, ok = expm.gram_core(G, J)``; ``C = F P``
       (2r × d). The error estimate of the torch Gram engine decides, per ``b``, whether the
       result is trusted; those that are not are recomputed by :func:`expm.qr_action` in
       float32 (rank-deficient ``U``, ``N < 2r``, ``q = k``, ill-conditioned ``U``), or in
       float64 where ``‖S‖₂ > expm.FLOAT64_NORM`` (float32 loses ≈ eps₃₂·‖S‖₂ there; ``‖S‖₂``
       is only worked out, from the core, where ``‖S‖_F`` is above that bound).
    3. **apply pass** (Triton, elementwise over tokens): ``Y = V + q C_q + k C_k``.

Backward (``gY`` given; the formulas of the torch engine, :func:`osa_lab.ops.expm.gram_action`)
    1. **reduce pass**: ``gC = Uᵀ gY`` (the same kernel with ``gY`` in place of ``V``).
    2. **core**: ``gF = gC Pᵀ``, ``gP = Fᵀ gC``; ``(gG, gs)`` by autograd through
       ``gram_core`` in float64; ``H = gG + gGᵀ``.
    3. **apply pass**: ``gq = gY C_qᵀ + V gP_qᵀ + q H_qq + k H_kq``,
       ``gk = gY C_kᵀ + V gP_kᵀ + q H_qk + k H_kk``, ``gv = gY + q gP_q + k gP_k``
       (``gU = gY Cᵀ + V gPᵀ + U H``, ``gV = gY + U gP``), one program per token block.

Precision. Products of two token matrices (``UᵀU``, ``UᵀV``, ``Uᵀ gY``) run on the input
dtype with float32 accumulation: for bf16/fp16 the products are exact in float32. Products of a
token matrix with a small float64 matrix (``C``, ``gP``, ``H``) run, for bf16/fp16 inputs, as
two dots against a hi/lo split of the small matrix in the input dtype (per-matrix power-of-two
scaling keeps fp16 in range): ≈ 16 (bf16) / 22 (fp16) significant bits instead of 8/11, no TF32.
For float32 inputs every dot uses ``input_precision`` (default ``"ieee"``, as torch's own
float32 matmul with TF32 off); ``"tf32x3"`` and ``"tf32"`` are opt-in speed trades.

The naive torch references of each pass (``reference_*``) stand beside the kernels for tests.
Bytes and flops per pass: ``docs/triton.md``.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from osa_lab.errors import MethodUnavailableError, OSADtypeError, OSAInputError
from osa_lab.ops import expm
from osa_lab.ops.amp import autocast_off_backward

try:  # Triton is optional on the CPU.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the install
    HAVE_TRITON = False

#: Whether the kernels were built for Triton's CPU interpreter (decided when this module was
#: imported: Triton reads ``TRITON_INTERPRET`` when a kernel is decorated).
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

#: Under triton 3.6's interpreter the reduce loop needs a constexpr bound (it cannot run a
#: loop bounded by a runtime value with NumPy ≥ 2.4); newer interpreters, like the GPU, run
#: the runtime-bounded loop, so the CPU tests exercise the GPU's loop.
_CONST_LOOP = INTERPRET and HAVE_TRITON and tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 7)

_SUPPORTED = (torch.float32, torch.bfloat16, torch.float16)
_PRECISIONS = ("ieee", "tf32x3", "tf32")
_MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class TritonConfig:
    """Tuning knobs. ``None`` picks a default from the shapes and the device.

    ``block_n``: tokens per tile (power of two, 16 … 256). ``tile``: width of a Gram/projection
    tile in the reduce pass (power of two, 16 … 128, at most the padded widths).
    ``splits``: token splits of the reduce pass per ``b`` (≥ 1).
    ``input_precision``: dots of float32 inputs. ``"tf32x3"`` (default) runs on tensor cores
    as three TF32 products of a hi/lo split (≈ 21 significant bits per product, within the
    float32 budget: docs/triton.md); ``"ieee"`` is exact float32 on the FMA units (compiles
    for minutes and spills at r = d = 128 with triton 3.6: opt-in only); ``"tf32"`` is one TF32
    product (≈ 11 bits, outside the float32 budget, the fallback rule does not account for it).
    ``hi_lo``: for bf16/fp16 inputs, multiply token tiles by the small matrices as two dots
    against a hi/lo split (≈ 16/22 significant bits); ``False`` rounds them once to the input
    dtype (half the tensor-core flops, errors of the order of the output's own rounding).
    ``num_warps``: warps of the reduce and forward apply kernels; ``bwd_warps`` those of the
    backward apply kernel (``None``: 8 when r or d_v > 64, else ``num_warps``, so its four
    input tiles and accumulators fit in registers). ``chunk_cols``: output columns per step of
    the apply kernels (power of two ≥ 16; a K × chunk piece of each small matrix is live at a time).
    ``core``: ``"adaptive"`` plans the core's exponential on the host from ‖S‖ (a few host
    synchronisations per call) and recomputes untrusted batch elements with the QR engine;
    ``"fixed"`` runs a fixed sequence of device operations (Taylor degree 16, per-matrix
    squaring count chosen on the device, at most ``max_squarings``) with no host
    synchronisation at all, so the call can be captured in a CUDA graph; untrusted batch
    elements (rank-deficient/ill-conditioned ``U``, ``‖S‖₂ > 2^max_squarings·θ₁₆``) come
    out as NaN instead of being recomputed.
    """

    block_n: int | None = None
    tile: int | None = None
    splits: int | None = None
    input_precision: str = "tf32x3"
    hi_lo: bool = True
    num_warps: int = 4
    num_stages: int = 2
    bwd_warps: int | None = None
    chunk_cols: int = 32
    core: str = "adaptive"
    max_squarings: int = 12


DEFAULT_CONFIG = TritonConfig()


def _pow2(x: int, lo: int = 16) -> int:
    return max(lo, 1 << max(0, (x - 1).bit_length()))


# --------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------

if HAVE_TRITON:

    @triton.jit
    def _reduce_block(acc, ss, start, N, a_base, a_sn, a_sf, b_base, b_sn, b_sf, offs_r, offs_c, r_mask, c_mask,
                      BLOCK_N: tl.constexpr, CAST_F32: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
        """One token block of the reduce pass: ``acc += A_tᵀ B_t``, ``ss += Σ B_t²`` over tokens
        ``[start, start + BLOCK_N)``."""
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < N
        on = offs_n.to(tl.int64)
        a_t = tl.load(
            a_base + offs_r[:, None] * a_sf + on[None, :] * a_sn,
            mask=r_mask[:, None] & n_mask[None, :],
            other=0.0,
        )
        b_t = tl.load(
            b_base + on[:, None] * b_sn + offs_c[None, :] * b_sf,
            mask=n_mask[:, None] & c_mask[None, :],
            other=0.0,
        )
        if CAST_F32:
            a_t = a_t.to(tl.float32)
            b_t = b_t.to(tl.float32)
        acc = tl.dot(a_t, b_t, acc, input_precision=PRECISION)
        b32 = b_t.to(tl.float32)
        ss += tl.sum(b32 * b32, axis=0)
        return acc, ss

    @triton.jit
    def _reduce_kernel(
        q_ptr, k_ptr, x_ptr, tiles_ptr, out_ptr, ss_ptr,
        N, R, D, CHUNK,
        sqb, sqn, sqf, skb, skn, skf, sxb, sxn, sxf,
        s_ob, s_os, s_or,
        BLOCK_N: tl.constexpr, RP: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
        NUM_TILES: tl.constexpr, CAST_F32: tl.constexpr, PRECISION: tl.constexpr, INTERP_BLOCKS: tl.constexpr,
    ):  # fmt: skip
        """One (tile, split, b): ``out[b, split, rows, cols] = A_tileᵀ B_tile`` over the split's tokens.

        The tile table row ``(row_src, row_off, col_src, col_off, out_col)`` names the
        sources (0 = q, 1 = k, 2 = x, where x is v forward and gY backward). Row ``i`` of the
        output is ``row_src·RP + row_off + i``. ``ss`` gets Σ x² of the tile's columns (for ‖V‖).
        Split ``s`` covers tokens ``[s·CHUNK, (s+1)·CHUNK)``: ``CHUNK`` is a runtime argument, so
        one compiled kernel serves every N and every split count (``INTERP_BLOCKS`` is 0 on
        the GPU; only the interpreter gets a constexpr bound).
        """
        # Tiles vary fastest so that the tiles of one token chunk run side by side (L2 reuse).
        pid_t = tl.program_id(0)
        pid_s = tl.program_id(1)
        pid_b = tl.program_id(2).to(tl.int64)
        row_src = tl.load(tiles_ptr + pid_t * 5 + 0)
        # The offsets are multiples of the tile width (the table is built so): telling the
        # compiler lets it prove 16-byte alignment and use vector/cp.async loads.
        row_off = tl.multiple_of(tl.load(tiles_ptr + pid_t * 5 + 1), BR)
        col_src = tl.load(tiles_ptr + pid_t * 5 + 2)
        col_off = tl.multiple_of(tl.load(tiles_ptr + pid_t * 5 + 3), BC)
        out_col = tl.multiple_of(tl.load(tiles_ptr + pid_t * 5 + 4), BC)
        # Select the sources arithmetically (no divergent branches: strides equal to 1 are
        # specialised to constants, which an if/else could not merge).
        a_q = row_src == 0
        a_base = tl.where(a_q, q_ptr + pid_b * sqb, k_ptr + pid_b * skb)
        a_sn = tl.where(a_q, sqn, skn)
        a_sf = tl.where(a_q, sqf, skf)
        b_q = col_src == 0
        b_k = col_src == 1
        b_base = tl.where(b_q, q_ptr + pid_b * sqb, tl.where(b_k, k_ptr + pid_b * skb, x_ptr + pid_b * sxb))
        b_sn = tl.where(b_q, sqn, tl.where(b_k, skn, sxn))
        b_sf = tl.where(b_q, sqf, tl.where(b_k, skf, sxf))
        c_lim = tl.where(col_src == 2, D, R)
        offs_r = row_off + tl.arange(0, BR)
        offs_c = col_off + tl.arange(0, BC)
        r_mask = offs_r < R
        c_mask = offs_c < c_lim
        acc = tl.zeros((BR, BC), dtype=tl.float32)
        ss = tl.zeros((BC,), dtype=tl.float32)
        n0 = pid_s * CHUNK
        if INTERP_BLOCKS > 0:
            # Interpreter only: triton 3.6's interpreter cannot run a loop bounded by a runtime
            # value (NumPy ≥ 2.4), so there the loop bound is a constexpr (CHUNK / BLOCK_N).
            for i in range(INTERP_BLOCKS):
                acc, ss = _reduce_block(acc, ss, n0 + i * BLOCK_N, N, a_base, a_sn, a_sf, b_base, b_sn, b_sf,
                                        offs_r, offs_c, r_mask, c_mask, BLOCK_N, CAST_F32, PRECISION)  # fmt: skip
        else:
            n_end = tl.minimum(n0 + CHUNK, N)
            for start in range(n0, n_end, BLOCK_N):
                acc, ss = _reduce_block(acc, ss, start, N, a_base, a_sn, a_sf, b_base, b_sn, b_sf,
                                        offs_r, offs_c, r_mask, c_mask, BLOCK_N, CAST_F32, PRECISION)  # fmt: skip
        rows = row_src * RP + row_off + tl.arange(0, BR)
        cols = out_col + tl.arange(0, BC)
        o_base = out_ptr + pid_b * s_ob + pid_s.to(tl.int64) * s_os
        tl.store(o_base + rows[:, None] * s_or + cols[None, :], acc)
        tl.store(ss_ptr + (pid_b * tl.num_programs(1) + pid_s) * NUM_TILES + pid_t, tl.sum(ss, axis=0))

    @triton.jit
    def _rtne_bf16(x):
        """Round float32 ``x`` to the nearest bf16 value (ties to even), still as float32.

        Only for the interpreter: its float32 → bf16 cast truncates, the GPU's rounds to nearest.
        """
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _wdot(x, w_ptr, s_wh, scale, c0, K: tl.constexpr, NC: tl.constexpr, M: tl.constexpr,
              SPLIT: tl.constexpr, CAST_F32: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
        """``scale · x W[:, c0:c0+NC]`` for a token tile ``x`` (BLOCK_N × K) and a packed small
        matrix ``W`` (K × ·), one column chunk of it.

        ``W`` is stored zero-padded in an M × M slot; with ``SPLIT`` it is ``W_hi + W_lo``
        (two slots ``s_wh`` apart) in the input dtype, and the two dots add up.
        """
        offs_k = tl.arange(0, K)
        offs_c = c0 + tl.arange(0, NC)
        wp = w_ptr + offs_k[:, None] * M + offs_c[None, :]
        w = tl.load(wp)
        if CAST_F32:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        out = tl.dot(x, w, input_precision=PRECISION)
        if SPLIT:
            w_lo = tl.load(wp + s_wh)
            if CAST_F32:
                w_lo = w_lo.to(tl.float32)
            out = tl.dot(x, w_lo, out, input_precision=PRECISION)
        return out * scale

    @triton.jit
    def _fwd_apply_kernel(
        q_ptr, k_ptr, v_ptr, w_ptr, ws_ptr, y_ptr, ysq_ptr,
        N, R, D,
        sqb, sqn, sqf, skb, skn, skf, svb, svn, svf, syb, syn,
        s_wb, s_ww, s_wh,
        BLOCK_N: tl.constexpr, RP: tl.constexpr, DP: tl.constexpr, M: tl.constexpr, CH: tl.constexpr,
        SPLIT: tl.constexpr, CAST_F32: tl.constexpr, PRECISION: tl.constexpr, FIX_BF16: tl.constexpr,
    ):  # fmt: skip
        """``Y = V + q C_q + k C_k`` for one token block (W slots: 0 = C_q, 1 = C_k); also
        ``Σ Y²`` of the block as stored (after the cast to Y's dtype) for the output check.

        The output columns go in chunks of ``CH`` (a loop, not unrolled): only a K × CH piece of
        each small matrix and a BLOCK_N × CH accumulator are live at a time (no spills at
        r = d = 128); ``q`` and ``k`` are loaded once, ``v`` chunk by chunk.
        """
        pid_b = tl.program_id(0).to(tl.int64)
        pid_n = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        on = offs_n.to(tl.int64)
        offs_r = tl.arange(0, RP)
        n_mask = offs_n < N
        rm = n_mask[:, None] & (offs_r[None, :] < R)
        q = tl.load(q_ptr + pid_b * sqb + on[:, None] * sqn + offs_r[None, :] * sqf, mask=rm, other=0.0)
        k = tl.load(k_ptr + pid_b * skb + on[:, None] * skn + offs_r[None, :] * skf, mask=rm, other=0.0)
        wb = w_ptr + pid_b * s_wb
        sb = ws_ptr + pid_b * 2
        s_q = tl.load(sb)
        s_k = tl.load(sb + 1)
        ysq = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for c0 in range(0, DP, CH):
            offs_d = c0 + tl.arange(0, CH)
            dm = n_mask[:, None] & (offs_d[None, :] < D)
            v = tl.load(v_ptr + pid_b * svb + on[:, None] * svn + offs_d[None, :] * svf, mask=dm, other=0.0)
            acc = v.to(tl.float32)
            acc += _wdot(q, wb, s_wh, s_q, c0, RP, CH, M, SPLIT, CAST_F32, PRECISION)
            acc += _wdot(k, wb + s_ww, s_wh, s_k, c0, RP, CH, M, SPLIT, CAST_F32, PRECISION)
            if FIX_BF16:
                acc = _rtne_bf16(acc)
            out = acc.to(y_ptr.dtype.element_ty)
            tl.store(y_ptr + pid_b * syb + on[:, None] * syn + offs_d[None, :], out, mask=dm)
            o32 = tl.where(dm, out.to(tl.float32), 0.0)
            ysq += tl.sum(o32 * o32, axis=1)
        tl.store(ysq_ptr + pid_b * tl.num_programs(1) + pid_n, tl.sum(ysq, axis=0))

    @triton.jit
    def _bwd_apply_kernel(
        q_ptr, k_ptr, v_ptr, gy_ptr, w_ptr, ws_ptr, gq_ptr, gk_ptr, gv_ptr,
        N, R, D,
        sqb, sqn, sqf, skb, skn, skf, svb, svn, svf, sgb, sgn, sgf, sob_r, son_r, sob_d, son_d,
        s_wb, s_ww, s_wh,
        BLOCK_N: tl.constexpr, RP: tl.constexpr, DP: tl.constexpr, M: tl.constexpr,
        CHR: tl.constexpr, CHD: tl.constexpr, TWO_PHASE: tl.constexpr,
        SPLIT: tl.constexpr, CAST_F32: tl.constexpr, PRECISION: tl.constexpr, FIX_BF16: tl.constexpr,
    ):  # fmt: skip
        """``gq, gk, gv`` for one token block, reading q, k, v, gY from DRAM once.

        W slots: 0 C_qᵀ, 1 gP_qᵀ, 2 H_qq, 3 H_kq (→ gq); 4 C_kᵀ, 5 gP_kᵀ, 6 H_qk, 7 H_kk (→ gk);
        8 gP_q, 9 gP_k (→ gv = gY + q gP_q + k gP_k). Output columns in chunks of ``CHR``
        (gq, gk) and ``CHD`` (gv), as in the forward; the gY chunk added to gv is re-read
        (from L1/L2: the block read it moments before). ``TWO_PHASE`` (float32 at width 128,
        whose TF32 hi/lo operand splits would not fit four live tiles): gq, gk first get the
        gY and V terms, are stored, and after a block barrier re-read (from L1/L2) to add the
        q and k terms, so only two input tiles are live at a time; DRAM traffic is unchanged.
        """
        pid_b = tl.program_id(0).to(tl.int64)
        pid_n = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        on = offs_n.to(tl.int64)
        offs_r = tl.arange(0, RP)
        offs_d = tl.arange(0, DP)
        n_mask = offs_n < N
        rm = n_mask[:, None] & (offs_r[None, :] < R)
        dm = n_mask[:, None] & (offs_d[None, :] < D)
        wb = w_ptr + pid_b * s_wb
        sb = ws_ptr + pid_b * 10
        v = tl.load(v_ptr + pid_b * svb + on[:, None] * svn + offs_d[None, :] * svf, mask=dm, other=0.0)
        gy = tl.load(gy_ptr + pid_b * sgb + on[:, None] * sgn + offs_d[None, :] * sgf, mask=dm, other=0.0)
        if TWO_PHASE:
            for c0 in range(0, RP, CHR):
                offs_c = c0 + tl.arange(0, CHR)
                cm = n_mask[:, None] & (offs_c[None, :] < R)
                r_off = on[:, None] * son_r + offs_c[None, :]
                gq = _wdot(gy, wb, s_wh, tl.load(sb), c0, DP, CHR, M, SPLIT, CAST_F32, PRECISION)
                gq += _wdot(v, wb + s_ww, s_wh, tl.load(sb + 1), c0, DP, CHR, M, SPLIT, CAST_F32, PRECISION)
                tl.store(gq_ptr + pid_b * sob_r + r_off, gq, mask=cm)
                gk = _wdot(gy, wb + 4 * s_ww, s_wh, tl.load(sb + 4), c0, DP, CHR, M, SPLIT, CAST_F32, PRECISION)
                gk += _wdot(v, wb + 5 * s_ww, s_wh, tl.load(sb + 5), c0, DP, CHR, M, SPLIT, CAST_F32, PRECISION)
                tl.store(gk_ptr + pid_b * sob_r + r_off, gk, mask=cm)
            tl.debug_barrier()  # the partial sums above are re-read by other threads of the block
        q = tl.load(q_ptr + pid_b * sqb + on[:, None] * sqn + offs_r[None, :] * sqf, mask=rm, other=0.0)
        k = tl.load(k_ptr + pid_b * skb + on[:, None] * skn + offs_r[None, :] * skf, mask=rm, other=0.0)
        for c0 in range(0, RP, CHR):
            offs_c = c0 + tl.arange(0, CHR)
            cm = n_mask[:, None] & (offs_c[None, :] < R)
            r_off = on[:, None] * son_r + offs_c[None, :]
            if TWO_PHASE:
                gq = tl.load(gq_ptr + pid_b * sob_r + r_off, mask=cm, other=0.0).to(tl.float32)
            else:
                gq = _wdot(gy, wb, s_wh, tl.load(sb), c0, DP, CHR, M, SPLIT, CAST_F32, PRECISION)
                gq += _wdot(v, wb + s_ww, s_wh, tl.load(sb + 1), c0, DP, CHR, M, SPLIT, CAST_F32, PRECISION)
            gq += _wdot(q, wb + 2 * s_ww, s_wh, tl.load(sb + 2), c0, RP, CHR, M, SPLIT, CAST_F32, PRECISION)
            gq += _wdot(k, wb + 3 * s_ww, s_wh, tl.load(sb + 3), c0, RP, CHR, M, SPLIT, CAST_F32, PRECISION)
            if FIX_BF16:
                gq = _rtne_bf16(gq)
            tl.store(gq_ptr + pid_b * sob_r + r_off, gq.to(gq_ptr.dtype.element_ty), mask=cm)
            if TWO_PHASE:
                gk = tl.load(gk_ptr + pid_b * sob_r + r_off, mask=cm, other=0.0).to(tl.float32)
            else:
                gk = _wdot(gy, wb + 4 * s_ww, s_wh, tl.load(sb + 4), c0, DP, CHR, M, SPLIT, CAST_F32, PRECISION)
                gk += _wdot(v, wb + 5 * s_ww, s_wh, tl.load(sb + 5), c0, DP, CHR, M, SPLIT, CAST_F32, PRECISION)
            gk += _wdot(q, wb + 6 * s_ww, s_wh, tl.load(sb + 6), c0, RP, CHR, M, SPLIT, CAST_F32, PRECISION)
            gk += _wdot(k, wb + 7 * s_ww, s_wh, tl.load(sb + 7), c0, RP, CHR, M, SPLIT, CAST_F32, PRECISION)
            if FIX_BF16:
                gk = _rtne_bf16(gk)
            tl.store(gk_ptr + pid_b * sob_r + r_off, gk.to(gk_ptr.dtype.element_ty), mask=cm)
        for c0 in range(0, DP, CHD):
            offs_c = c0 + tl.arange(0, CHD)
            cm = n_mask[:, None] & (offs_c[None, :] < D)
            gyc = tl.load(gy_ptr + pid_b * sgb + on[:, None] * sgn + offs_c[None, :] * sgf, mask=cm, other=0.0)
            gv = gyc.to(tl.float32)
            gv += _wdot(q, wb + 8 * s_ww, s_wh, tl.load(sb + 8), c0, RP, CHD, M, SPLIT, CAST_F32, PRECISION)
            gv += _wdot(k, wb + 9 * s_ww, s_wh, tl.load(sb + 9), c0, RP, CHD, M, SPLIT, CAST_F32, PRECISION)
            if FIX_BF16:
                gv = _rtne_bf16(gv)
            d_off = on[:, None] * son_d + offs_c[None, :]
            tl.store(gv_ptr + pid_b * sob_d + d_off, gv.to(gv_ptr.dtype.element_ty), mask=cm)


# --------------------------------------------------------------------------------------
# Launch helpers
# --------------------------------------------------------------------------------------

#: When set, ``_launch`` hands every kernel launch to this callable
#: ``hook(kernel, grid, args, kwargs)`` instead of launching it: the compile-only check
#: (:mod:`osa_lab.ops.triton.compile_check`) compiles through it, the sync counter counts launches.
LAUNCH_HOOK: Callable[..., Any] | None = None


def _launch(kernel, grid: tuple, *args, **kwargs) -> None:
    if LAUNCH_HOOK is not None:
        LAUNCH_HOOK(kernel, grid, args, kwargs)
    else:
        kernel[grid](*args, **kwargs)


#: Software-pipelining stages of the apply kernels. They have no token loop, only the loop over
#: output-column chunks: pipelining it would buffer every W chunk of all the dots in shared
#: memory and registers (165 KB shared, spills at r = d = 128 bf16), for no gain.
_APPLY_STAGES = 1


@dataclass(frozen=True)
class _Plan:
    r: int
    d: int
    rp: int
    dp: int
    block_n: int
    tile: int
    splits: int
    chunk: int
    precision: str
    half: bool
    split_w: bool
    cast_f32: bool
    num_warps: int
    num_stages: int
    bwd_warps: int
    chunk_cols: int
    core: str
    max_squarings: int

    @property
    def m(self) -> int:
        return max(self.rp, self.dp)


def _is_pow2(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0 and x & (x - 1) == 0


def _validate_config(cfg: TritonConfig, rp: int, dp: int) -> None:
    """Reject knobs the kernels cannot compile or would silently mis-handle."""
    if cfg.input_precision not in _PRECISIONS:
        raise OSAInputError(f"input_precision must be one of {_PRECISIONS}; got {cfg.input_precision!r}")
    if cfg.block_n is not None and not (_is_pow2(cfg.block_n) and 16 <= cfg.block_n <= 256):
        raise OSAInputError(f"TritonConfig.block_n must be a power of two in [16, 256]; got {cfg.block_n!r}")
    if cfg.tile is not None and not (_is_pow2(cfg.tile) and 16 <= cfg.tile <= min(rp, dp)):
        raise OSAInputError(
            f"TritonConfig.tile must be a power of two in [16, {min(rp, dp)}] for these shapes "
            f"(padded widths r={rp}, d_v={dp}); got {cfg.tile!r}"
        )
    if cfg.splits is not None and not (isinstance(cfg.splits, int) and cfg.splits >= 1):
        raise OSAInputError(f"TritonConfig.splits must be an int ≥ 1 or None; got {cfg.splits!r}")
    for name in ("num_warps", "bwd_warps"):
        val = getattr(cfg, name)
        if val is not None and not (_is_pow2(val) and val <= 16):
            raise OSAInputError(f"TritonConfig.{name} must be a power of two ≤ 16; got {val!r}")
    if not (_is_pow2(cfg.chunk_cols) and cfg.chunk_cols >= 16):
        raise OSAInputError(f"TritonConfig.chunk_cols must be a power of two ≥ 16; got {cfg.chunk_cols!r}")
    if not (isinstance(cfg.num_stages, int) and 1 <= cfg.num_stages <= 8):
        raise OSAInputError(f"TritonConfig.num_stages must be an int in [1, 8]; got {cfg.num_stages!r}")
    if cfg.core not in ("adaptive", "fixed"):
        raise OSAInputError(f"TritonConfig.core must be 'adaptive' or 'fixed'; got {cfg.core!r}")
    if not (isinstance(cfg.max_squarings, int) and 0 <= cfg.max_squarings <= 40):
        raise OSAInputError(f"TritonConfig.max_squarings must be an int in [0, 40]; got {cfg.max_squarings!r}")


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def launch_plan(q: torch.Tensor, v: torch.Tensor, cfg: TritonConfig, *, sm_count: int | None = None) -> _Plan:
    """Block sizes, splits and precision for inputs shaped like ``q``, ``v`` (host arithmetic only).

    ``sm_count``: streaming multiprocessors of the target (default: the device of ``q``; 4 on
    the CPU). The compile-only check passes the H200's 132.
    """
    b, n, r = q.shape
    d = v.shape[-1]
    rp, dp = _pow2(r), _pow2(d)
    _validate_config(cfg, rp, dp)
    # Token tiles of 64 × 64 (bf16/fp16), 32 × 128 (bf16/fp16), 64 × 32 and 16 × ≥64 (float32,
    # whose TF32 hi/lo splits double the registers) keep the backward apply free of spills
    # (ptxas -v, compile_check; docs/triton.md).
    width_bytes = max(rp, dp) * q.element_size()
    half_in = q.dtype in (torch.float16, torch.bfloat16)
    block_n = cfg.block_n or (64 if width_bytes <= 128 else 32 if half_in and width_bytes <= 256 else 16)
    tile = cfg.tile or min(64, rp, dp)
    n_blocks = max(1, math.ceil(n / block_n))
    if n_blocks > _MAX_GRID_YZ:
        raise OSAInputError(
            f"osa_triton handles up to {_MAX_GRID_YZ * block_n} tokens with block_n={block_n}; got N={n}"
        )
    n_tiles = len(_tile_rows(rp, dp, tile, True))
    if cfg.splits is not None:
        splits = max(1, min(cfg.splits, n_blocks))
    else:
        # Enough programs for ≈ 16 per SM (wave-quantisation tails ≤ ≈ 1/16), but ≥ 32 token
        # blocks per program so the float32 partial sums stay small next to what each program
        # reads (docs/triton.md).
        if sm_count is None:
            sm_count = _sm_count(q.device.index or 0) if q.is_cuda else 4
        splits = max(1, min(math.ceil(16 * sm_count / max(1, b * n_tiles)), n_blocks // 32 or 1))
    chunk = math.ceil(n_blocks / splits) * block_n
    splits = math.ceil(n / chunk) if n else 1
    half = q.dtype in (torch.float16, torch.bfloat16)
    bwd_warps = cfg.bwd_warps or (8 if max(rp, dp) > 64 else cfg.num_warps)
    return _Plan(
        r=r, d=d, rp=rp, dp=dp, block_n=block_n, tile=tile, splits=splits, chunk=chunk,
        precision="ieee" if half else cfg.input_precision, half=half, split_w=half and cfg.hi_lo,
        cast_f32=INTERPRET, num_warps=cfg.num_warps, num_stages=cfg.num_stages, bwd_warps=bwd_warps,
        chunk_cols=cfg.chunk_cols, core=cfg.core, max_squarings=cfg.max_squarings,
    )  # fmt: skip


@functools.cache
def _tile_rows(rp: int, dp: int, tile: int, gram: bool) -> tuple[tuple[int, int, int, int, int], ...]:
    """Rows ``(row_src, row_off, col_src, col_off, out_col)`` of the tile table of ``Uᵀ[U | X]``
    (``gram=True``) or ``Uᵀ X``. Output rows: ``[q rows (rp) | k rows (rp)]``; columns
    ``[q (rp) | k (rp) | x (dp)]`` with ``gram=True``, else ``[x (dp)]``. Gram tiles strictly
    below the diagonal are skipped. Every offset is a multiple of ``tile`` (the kernel relies on it)."""
    rows = [(src, off) for src in (0, 1) for off in range(0, rp, tile)]
    cols = [(src, off, src * rp + off) for src in (0, 1) for off in range(0, rp, tile)] if gram else []
    x0 = 2 * rp if gram else 0
    cols += [(2, off, x0 + off) for off in range(0, dp, tile)]
    table = []
    for rs, ro in rows:
        gr = rs * rp + ro
        for cs, co, oc in cols:
            if cs < 2 and oc + tile <= gr:  # entirely below the diagonal of G
                continue
            table.append((rs, ro, cs, co, oc))
    return tuple(table)


_DEVICE_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _tile_table(
    rp: int, dp: int, tile: int, *, gram: bool, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Device copies of the tile table, the mask of output entries it fills and the indices of
    the tiles that read each x column once (for Σ x²); built once per shape and device
    (no host-to-device copy per call)."""
    key = (rp, dp, tile, gram, str(device))
    hit = _DEVICE_TABLES.get(key)
    if hit is not None:
        return hit
    table = _tile_rows(rp, dp, tile, gram)
    width = (2 * rp if gram else 0) + dp
    filled = torch.zeros(2 * rp, width, dtype=torch.bool)
    for rs, ro, _cs, _co, oc in table:
        gr = rs * rp + ro
        filled[gr : gr + tile, oc : oc + tile] = True
    first_row = [i for i, t in enumerate(table) if t[0] == 0 and t[1] == 0 and t[2] == 2]
    out = (
        torch.tensor(table, dtype=torch.int32).to(device),
        filled.to(device),
        torch.tensor(first_row, dtype=torch.long).to(device),
    )
    _DEVICE_TABLES[key] = out
    return out


def reduce_pass(q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, plan: _Plan, *, gram: bool):
    """Run the reduce pass; returns float64 ``Uᵀ[U | X]`` (b, 2rp, 2rp + dp) or ``Uᵀ X`` (b, 2rp, dp)
    summed over splits (Gram symmetrised), and Σ x² per b (float64)."""
    b, n, _ = q.shape
    table, filled, first_row = _tile_table(plan.rp, plan.dp, plan.tile, gram=gram, device=q.device)
    n_tiles = table.shape[0]
    width = filled.shape[1]
    out = torch.empty(b, plan.splits, 2 * plan.rp, width, dtype=torch.float32, device=q.device)
    ss = torch.empty(b, plan.splits, n_tiles, dtype=torch.float32, device=q.device)
    for b0 in range(0, b, _MAX_GRID_YZ):  # grid axes 1 and 2 are limited to 65535
        b1 = min(b, b0 + _MAX_GRID_YZ)
        qc, kc, xc, oc = q[b0:b1], k[b0:b1], x[b0:b1], out[b0:b1]
        _launch(
            _reduce_kernel, (n_tiles, plan.splits, b1 - b0),
            qc, kc, xc, table, oc, ss[b0:b1],
            n, plan.r, x.shape[-1], plan.chunk,
            *qc.stride(), *kc.stride(), *xc.stride(),
            oc.stride(0), oc.stride(1), oc.stride(2),
            BLOCK_N=plan.block_n, RP=plan.rp, BR=plan.tile, BC=plan.tile,
            NUM_TILES=n_tiles, CAST_F32=plan.cast_f32, PRECISION=plan.precision,
            INTERP_BLOCKS=plan.chunk // plan.block_n if _CONST_LOOP else 0,
            num_warps=plan.num_warps, num_stages=plan.num_stages,
        )  # fmt: skip
    total = out.sum(1, dtype=torch.float64)
    if gram:
        total = torch.where(filled, total, _transpose_gram(total, plan.rp))
    # Σ x² from the tiles that read x with the first row block (each x column once).
    x_sq = ss.sum(1, dtype=torch.float64).index_select(1, first_row).sum(-1)
    return total, x_sq


def _transpose_gram(total: torch.Tensor, rp: int) -> torch.Tensor:
    return torch.nn.functional.pad(total[:, :, : 2 * rp].mT, (0, total.shape[-1] - 2 * rp))


_INDEX_CACHE: dict[tuple, torch.Tensor] = {}


def _idx(r: int, rp: int, device: torch.device) -> torch.Tensor:
    """Indices of the true q and k rows inside the padded ``2rp`` layout (cached per device)."""
    key = (r, rp, str(device))
    hit = _INDEX_CACHE.get(key)
    if hit is None:
        ar = list(range(r))
        hit = _INDEX_CACHE[key] = torch.tensor(ar + [i + rp for i in ar], dtype=torch.long).to(device)
    return hit


def _pack(mats: list[torch.Tensor], plan: _Plan, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack small float64 matrices (b, K_i, C_i) into zero-padded (b, n, 2|1, M, M) slots.

    For 16-bit inputs each matrix ``W`` is scaled by a power of two ``s`` (max |W/s| in [1, 2))
    and split ``W/s = hi + lo`` in ``dtype`` (``lo`` omitted without ``hi_lo``); the kernel
    computes ``s (x hi + x lo)``. Float32 inputs get one float32 slot and ``s = 1``.
    All matrices are padded and stacked first, then scaled and split together (a handful of
    batched ops instead of a few per matrix).
    """
    m = plan.m
    w64 = torch.stack([torch.nn.functional.pad(x, (0, m - x.shape[-1], 0, m - x.shape[-2])) for x in mats], 1)
    if not plan.half:
        w = w64.to(torch.float32).unsqueeze(2)
        return w, torch.ones(w.shape[:2], dtype=torch.float32, device=w.device)
    amax = w64.abs().amax(dim=(-2, -1))
    e = torch.floor(torch.log2(amax.clamp_min(1e-300))).clamp(-126, 126)
    s = torch.exp2(torch.where(amax > 0, e, torch.zeros_like(e)))
    ms = w64 / s[..., None, None]
    hi = ms.to(dtype)
    parts = [hi, (ms - hi.double()).to(dtype)] if plan.split_w else [hi]
    return torch.stack(parts, 2), s.float()


def _pad_rows(mat: torch.Tensor, plan: _Plan, which: int) -> torch.Tensor:
    """Block ``which`` (0 = q, 1 = k) of the row dimension of a (b, 2r, ·) matrix."""
    r = plan.r
    return mat[:, which * r : (which + 1) * r]


def forward_apply(q, k, v, c: torch.Tensor, plan: _Plan, *, with_sq: bool = False):
    """The forward apply pass ``Y = V + U C`` (Triton kernel launch; ``U = [q k]``); with
    ``with_sq`` also ``Σ Y²`` per b (float64), summed from the kernel's per-block sums."""
    b, n, _ = q.shape
    y = torch.empty(b, n, plan.d, dtype=v.dtype, device=v.device)
    w, ws = _pack([_pad_rows(c, plan, 0), _pad_rows(c, plan, 1)], plan, q.dtype)
    grid = (b, triton.cdiv(n, plan.block_n))
    ysq = torch.empty(grid, dtype=torch.float32, device=v.device)
    _launch(
        _fwd_apply_kernel, grid,
        q, k, v, w, ws, y, ysq,
        n, plan.r, plan.d,
        *q.stride(), *k.stride(), *v.stride(), y.stride(0), y.stride(1),
        w.stride(0), w.stride(1), w.stride(2),
        BLOCK_N=plan.block_n, RP=plan.rp, DP=plan.dp, M=plan.m, CH=min(plan.chunk_cols, plan.dp),
        SPLIT=plan.split_w, CAST_F32=plan.cast_f32, PRECISION=plan.precision,
        FIX_BF16=plan.cast_f32 and q.dtype == torch.bfloat16,
        num_warps=plan.num_warps, num_stages=_APPLY_STAGES,
    )  # fmt: skip
    return (y, ysq.sum(1, dtype=torch.float64)) if with_sq else y


def backward_apply(q, k, v, gy, c, gp, h, plan: _Plan):
    """The backward apply pass ``gU = gY Cᵀ + V gPᵀ + U H``, ``gV = gY + U gP`` (Triton kernel launch)."""
    b, n, _ = q.shape
    r = plan.r
    cq, ck = _pad_rows(c, plan, 0), _pad_rows(c, plan, 1)
    gpq, gpk = _pad_rows(gp, plan, 0), _pad_rows(gp, plan, 1)
    mats = [
        cq.mT, gpq.mT, h[:, :r, :r], h[:, r:, :r],
        ck.mT, gpk.mT, h[:, :r, r:], h[:, r:, r:],
        gpq, gpk,
    ]  # fmt: skip
    w, ws = _pack(mats, plan, q.dtype)
    gq = torch.empty(b, n, r, dtype=q.dtype, device=q.device)
    gk = torch.empty_like(gq)
    gv = torch.empty(b, n, plan.d, dtype=v.dtype, device=v.device)
    grid = (b, triton.cdiv(n, plan.block_n))
    _launch(
        _bwd_apply_kernel, grid,
        q, k, v, gy, w, ws, gq, gk, gv,
        n, r, plan.d,
        *q.stride(), *k.stride(), *v.stride(), *gy.stride(),
        gq.stride(0), gq.stride(1), gv.stride(0), gv.stride(1),
        w.stride(0), w.stride(1), w.stride(2),
        BLOCK_N=plan.block_n, RP=plan.rp, DP=plan.dp, M=plan.m,
        CHR=min(plan.chunk_cols, plan.rp), CHD=min(plan.chunk_cols, plan.dp),
        TWO_PHASE=not plan.half and plan.m > 64,
        SPLIT=plan.split_w, CAST_F32=plan.cast_f32, PRECISION=plan.precision,
        FIX_BF16=plan.cast_f32 and q.dtype == torch.bfloat16,
        num_warps=plan.bwd_warps, num_stages=_APPLY_STAGES,
    )  # fmt: skip
    return gq, gk, gv


# --------------------------------------------------------------------------------------
# The small core and the fallback decision
# --------------------------------------------------------------------------------------

#: Factor on float32's eps in the fallback rule, by ``input_precision``. tf32x3 products carry
#: ≈ 2⁻²² relative error each (the dropped tail·tail term and the tails' TF32 rounding), but the
#: float32 accumulation over N tokens dominates the error of every pass in both modes; the
#: rule is kept as for ieee and the end-to-end error with emulated tf32x3 dots is tested
#: against the float32 budget (tests/ops/test_triton.py). ``tf32`` is not modelled (opt-in).
_PRECISION_EPS_FACTOR = {"ieee": 1.0, "tf32x3": 1.0, "tf32": 1.0}


def _untrusted(
    g: torch.Tensor,
    c: torch.Tensor,
    v_sq: torch.Tensor,
    ok: torch.Tensor,
    s_norm: torch.Tensor,
    cond: torch.Tensor,
    s_two: torch.Tensor,
    precision: str = "ieee",
) -> torch.Tensor:
    """Per-b mask of results the Gram engine cannot deliver within the float32 budget.

    The torch engine's rule itself (:func:`osa_lab.ops.expm.gram_trust_ratio`): Cholesky failed,
    or cond(U) above ``GRAM_MAX_COND``, or ``eps·‖U‖_F‖C‖_F/‖V‖_F`` above ``GRAM_TOLERANCE``, with
    float32 values (the kernels accumulate in float32 whatever the input dtype; ``eps`` scaled by
    ``_PRECISION_EPS_FACTOR`` for tf32x3 dots); or ``‖S‖₂`` above ``expm.FLOAT64_NORM``, where
    float32 passes lose ≈ eps₃₂·‖S‖₂ (relative error 0.22 measured at α = 1e6, N = 40, r = 8) and
    the fallback recomputes in float64. ``ok``, ``s_norm``, ``cond`` and ``s_two`` (an upper bound
    of ``‖S‖₂``, tight where above ``expm.FLOAT64_NORM``) come from the core.
    Device operations only (no host synchronisation).
    """
    eps = torch.finfo(torch.float32).eps * _PRECISION_EPS_FACTOR[precision]
    ratio = expm.gram_trust_ratio(g, c, v_sq.clamp_min(0).sqrt(), ok, s_norm, cond, torch.float32, eps)
    s_two = torch.where(ok, s_two, math.nan)
    return ~(torch.isfinite(ratio) & (ratio <= 1)) | expm.float64_needed(s_two, torch.float32)


#: Taylor degree and Paterson–Stockmeyer block of the fixed core plan (6 products + squarings).
_FIXED_DEGREE, _FIXED_BLOCK = 16, 4


def fixed_gram_core(
    g: torch.Tensor, j: torch.Tensor, max_squarings: int = 12, norm_above: float | None = expm.FLOAT64_NORM
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The Gram core ``F = L⁻ᵀ (exp(Lᵀ J L) − I) L⁻¹`` (paper's low-rank form; docs/triton.md)
    by a fixed sequence of device operations: no host synchronisation, so CUDA graphs and
    ``torch.compile`` can capture it.

    Returns ``(F, ok, (s_norm, cond, s_two))`` like ``expm.gram_core_with_norm``; ``s_two`` is
    ``‖M‖_F``, and where that is above ``norm_above`` (None: nowhere)
    ``expm.spectral_norm_bound`` by its all-squarings device path (``sync=False``). ``J`` must be
    :func:`osa_lab.ops.expm.osa_skew_core`'s ``s·[[0, I], [−I, 0]]``. The exponential of the skew
    ``M = Lᵀ J L`` is the degree-16 Taylor polynomial (Paterson–Stockmeyer, block 4) of
    ``M / 2^{s_b}`` squared ``s_b`` times, where each matrix's ``s_b`` comes from the
    spectral-radius bound ``ρ ≤ min(‖M‖₁, ‖M²‖₁^½, ‖M⁴‖₁^¼)`` on the device (as
    :func:`osa_lab.ops.expm.core_skew_exp` does on the host); all ``max_squarings`` squarings run,
    masked per matrix. ``ok`` is False where the Cholesky factorisation failed or
    ``ρ > 2^max_squarings·θ₁₆`` (the plan cannot reach the float64 truncation tolerance).
    """
    width = g.shape[-1]
    eye = torch.eye(width, dtype=g.dtype, device=g.device)
    chol, chol_inv, ok = expm.cholesky_with_inverse(g)
    okm = ok[..., None, None]
    chol = torch.where(okm, chol, eye)
    chol_inv = torch.where(okm, chol_inv, eye)
    m = expm.core_matrix(chol, j, True)
    fro = torch.linalg.matrix_norm(m.detach())
    s_norm = fro / math.sqrt(width)
    m2 = m @ m
    m3 = m2 @ m
    m4 = m2 @ m2
    rho = torch.minimum(
        torch.minimum(expm.one_norm(m), expm.one_norm(m2).sqrt()), expm.one_norm(m4) ** 0.25
    )
    unit = torch.finfo(g.dtype).eps / 2
    theta = expm.taylor_theta(_FIXED_DEGREE, unit)
    # ρ ≥ ‖M‖₂ = ‖S‖₂ (M is normal). Matrices with ρ beyond the plan's reach come out untrusted
    # anyway, so when that reach θ·2^max_squarings is at or below norm_above the cheap bound
    # min(‖M‖_F, ρ) settles every matrix the plan can compute, and the float64 squarings of
    # expm.spectral_norm_bound are needed only for plans that reach beyond norm_above.
    if norm_above is None:
        s_two = fro
    elif theta * 2.0**max_squarings <= norm_above:
        s_two = torch.where(fro > norm_above, torch.minimum(fro, rho.detach()), fro)
    else:
        s_two = expm.spectral_norm_bound(m, fro, norm_above, sync=False)
    counts = torch.ceil(torch.log2(rho.clamp_min(1e-300) / theta)).clamp(0, max_squarings)
    counts = counts.nan_to_num(nan=float(max_squarings))
    fits = torch.isfinite(rho) & (rho <= theta * 2.0**max_squarings)
    cm = counts[..., None, None]
    # Powers of X = M/2^s directly (float coefficients in the polynomial: no per-coefficient
    # tensor powers of the scaling).
    h = torch.pow(2.0, -cm)
    h2 = h * h
    xs = [None, m * h, m2 * h2, m3 * (h2 * h), m4 * (h2 * h2)]
    e = expm.taylor_ps(xs, _FIXED_DEGREE, _FIXED_BLOCK, 1.0, None)
    for step in range(max_squarings):
        e = torch.where(cm > step, e @ e, e)
    f = chol_inv.mT @ (e - eye) @ chol_inv
    cond = torch.linalg.matrix_norm(chol.detach()) * torch.linalg.matrix_norm(chol_inv.detach()) / width
    return f, ok & fits, (s_norm, cond, s_two)


def _core(g: torch.Tensor, j: torch.Tensor, plan: _Plan, norm_above: float | None = None):
    """The plan's core; ``norm_above``: where ``s_two`` must be tight (the forward's fallback rule)."""
    if plan.core == "fixed":
        return fixed_gram_core(g, j, plan.max_squarings, norm_above)
    return expm.gram_core_with_norm(g, j, norm_above)


class _OSATriton(torch.autograd.Function):
    """``Y = exp(U J Uᵀ) V`` by the Triton passes; also returns the mask of untrusted ``b``.

    Rows of ``Y`` for untrusted ``b`` equal ``V`` (``C`` set to 0) and get zero gradients;
    :func:`osa_triton` overwrites them with the QR engine (adaptive core) or NaN (fixed core).
    """

    @staticmethod
    def forward(ctx, q, k, v, scale, cfg: TritonConfig):  # noqa: D102
        b, n, r = q.shape
        plan = launch_plan(q, v, cfg)
        idx = _idx(r, plan.rp, q.device)
        gp_full, v_sq = reduce_pass(q, k, v, plan, gram=True)
        rows = gp_full.index_select(1, idx)
        g = rows.index_select(2, idx)
        p = rows[:, :, 2 * plan.rp : 2 * plan.rp + plan.d]
        j = expm.osa_skew_core(r, scale.detach())
        f, ok, (s_norm, cond, s_two) = _core(g, j, plan, expm.FLOAT64_NORM)
        c = f @ p
        bad = _untrusted(g, c, v_sq, ok, s_norm, cond, s_two, plan.precision)
        keep = ~bad[:, None, None]
        g = torch.where(keep, g, torch.eye(2 * r, dtype=torch.float64, device=q.device))
        c = torch.where(keep, c, 0.0)
        y, y_sq = forward_apply(q, k, v, c, plan, with_sq=True)
        ctx.save_for_backward(q, k, v, scale, g, p, c, bad)
        ctx.plan = plan
        ctx.mark_non_differentiable(bad, y_sq, v_sq)
        return y, bad, y_sq, v_sq

    @staticmethod
    @autocast_off_backward
    def backward(ctx, gy, _gbad, _gysq, _gvsq):  # noqa: D102
        q, k, v, scale, g, p, c, bad = ctx.saved_tensors
        plan: _Plan = ctx.plan
        r = plan.r
        need_q, need_k, need_v, need_s, _ = ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph=True: autograd through the torch Gram engine
            gy = torch.where(bad[:, None, None], 0.0, gy)

            def ref(q_, k_, v_, s_):
                return expm.gram_action_reference(q_, k_, expm.osa_skew_core(r, s_), v_, False, True)[0]

            return (*expm.composite_backward(ref, (q, k, v, scale), (need_q, need_k, need_v, need_s), gy), None)
        idx = _idx(r, plan.rp, q.device)
        gc_full, _ = reduce_pass(q, k, gy, plan, gram=False)
        gc = gc_full.index_select(1, idx)[:, :, : plan.d]
        s64 = scale.detach().to(torch.float64)
        if need_s:
            gg_sym, gp, (gs64,) = expm.gram_core_backward(
                lambda g_, s_: _core(g_, expm.osa_skew_core(r, s_), plan)[0], g, (s64,), gc, p
            )
        else:
            gg_sym, gp, _ = expm.gram_core_backward(
                lambda g_: _core(g_, expm.osa_skew_core(r, s64), plan)[0], g, (), gc, p
            )
        keep = ~bad[:, None, None]
        h = torch.where(keep, gg_sym, 0.0)
        gp = torch.where(keep, gp, 0.0)
        gq, gk, gv = backward_apply(q, k, v, gy, c, gp, h, plan)
        gs = None
        if need_s:
            gs = torch.where(bad, 0.0, gs64).to(scale.dtype)
        return (gq if need_q else None, gk if need_k else None, gv if need_v else None, gs, None)


# --------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: torch.Tensor) -> None:
    if not HAVE_TRITON:
        raise MethodUnavailableError(
            "method='triton' needs the `triton` package (pip install 'osa_lab[gpu]')"
        )
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 3:
            raise OSAInputError(
                f"osa_triton expects 3-D `{name}` (b, N, features); got shape {tuple(x.shape)}"
            )
        if x.dtype not in _SUPPORTED:
            raise OSADtypeError(
                f"osa_triton supports float32, bfloat16 and float16; `{name}` is {x.dtype} "
                "(use method='lowrank' for float64)"
            )
    if q.shape != k.shape or v.shape[:2] != q.shape[:2]:
        raise OSAInputError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match")
    if not (q.dtype == k.dtype == v.dtype):
        raise OSADtypeError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise OSAInputError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    if q.device.type != "cuda" and not INTERPRET:
        raise MethodUnavailableError(
            f"osa_triton needs CUDA tensors (got device {q.device}); on the CPU set TRITON_INTERPRET=1 "
            "before triton and osa_lab are imported to run the kernels in Triton's interpreter "
            "(slow, for tests), or use method='lowrank'"
        )
    if q.shape[-1] > 128 or v.shape[-1] > 128:
        raise OSAInputError(
            f"osa_triton supports head widths up to 128 (got r={q.shape[-1]}, d_v={v.shape[-1]}); "
            "use method='lowrank'"
        )
    if scale.dim() > 1 or (scale.dim() == 1 and scale.shape[0] not in (1, q.shape[0])):
        raise OSAInputError(
            f"`scale` must be a scalar or have shape ({q.shape[0]},); got {tuple(scale.shape)}"
        )


def osa_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: torch.Tensor,
    *,
    config: TritonConfig | None = None,
    norms: bool = False,
) -> Any:  # a tensor, or (tensor, (Σ y², Σ v², None)) with norms=True
    """``exp(S) v`` with ``S = scale·(q kᵀ − k qᵀ)`` per batch element, by the Triton kernels.

    Args:
        q, k: ``(b, N, r)``; v: ``(b, N, d_v)``; one dtype among float32, bfloat16, float16;
            any strides (the kernels read through them, no copies). ``r, d_v ≤ 128``.
        scale: ``(b,)`` or scalar tensor, ``α/√r``; differentiable.
        config: :class:`TritonConfig` tuning knobs.

    Returns ``(b, N, d_v)`` in the dtype of ``v``; differentiable w.r.t. q, k, v and scale.
    Batch elements the Gram engine cannot compute accurately (see :func:`_untrusted`) are
    recomputed by :func:`osa_lab.ops.expm.qr_action` in float32, or in float64 where ``‖S‖₂`` is
    above ``expm.FLOAT64_NORM`` (differentiable by autograd);
    with ``config.core == "fixed"`` they are NaN instead and the call makes no host
    synchronisation (docs/triton.md, "Host synchronisations"). ``norms=True`` returns
    ``(y, (Σ y², Σ v², None))`` per b (float64), the sums taken by the reduce and output kernels
    (NaN where a row is NaN), for :mod:`osa_lab.ops.output_check`.
    """
    if not isinstance(scale, torch.Tensor):
        scale = torch.tensor(float(scale), dtype=torch.float64, device=q.device)
    _check(q, k, v, scale)
    b, n, r = q.shape
    scale = scale.to(q.device).expand(b)
    if b == 0 or n == 0:
        return (v.clone(), None) if norms else v.clone()
    cfg = config or DEFAULT_CONFIG
    y, bad, y_sq, v_sq = _OSATriton.apply(q, k, v, scale, cfg)
    if cfg.core == "fixed":  # no data-dependent host decision: untrusted rows are NaN
        y = torch.where(bad[:, None, None], float("nan"), y)
        y_sq = torch.where(bad, math.nan, y_sq)
    elif bool(bad.any()):
        sel = bad.nonzero().squeeze(-1)
        u = torch.cat([q[sel], k[sel]], dim=-1).float()
        j = expm.osa_skew_core(r, scale[sel])
        fixed = expm.qr_action(u, j, v[sel].float()).to(y.dtype)
        y = y.index_copy(0, sel, fixed)
        y_sq = y_sq.index_copy(0, sel, torch.linalg.vector_norm(fixed.detach(), dim=(-2, -1), dtype=torch.float64) ** 2)
    return (y, (y_sq, v_sq, None)) if norms else y


# --------------------------------------------------------------------------------------
# Naive references of each pass (fla-org style), used by the tests
# --------------------------------------------------------------------------------------


def reference_reduce(q: torch.Tensor, k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``Uᵀ [U | X]`` in float64, ``U = [q k]``: what the reduce pass sums (b, 2r, 2r + d)."""
    u = torch.cat([q, k], -1).double()
    return u.mT @ torch.cat([u, x.double()], -1)


def reference_backward_apply(q, k, v, gy, c, gp, h) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward apply pass in float64: ``gU = gY Cᵀ + V gPᵀ + U H``, ``gV = gY + U gP``."""
    r = q.shape[-1]
    u = torch.cat([q, k], -1).double()
    gu = gy.double() @ c.mT + v.double() @ gp.mT + u @ h
    return gu[..., :r], gu[..., r:], gy.double() + u @ gp
