"""Triton low-rank OSA (osa_lab.kernels.triton_osa) against the torch paths and the dense reference.

On the CPU the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1
before triton is imported): tiny shapes only. GPU tests at realistic sizes are skipped without
CUDA.

Tolerances, by dtype:
* float32: every pass accumulates in float32 (dots with input_precision="ieee"), the small core
  runs in float64; errors vs the float64 dense reference are eps32 · (cond(U) · ‖S‖-sized
  growth), ≈ 1e-6 here. We allow 2e-5 for outputs and gradients.
* bfloat16/float16: the reference is float64 on the *same* rounded inputs. The kernels compute in
  float32 and round once when storing, so the error must be that of rounding the exact
  result to the dtype: at most 1.25× the error of ``exact.to(dtype)`` plus 2e-5.
"""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import sys

import pytest
import torch

import osa_lab
from osa_lab.errors import MethodUnavailableError, OSADtypeError, OSAInputError

triton = pytest.importorskip("triton")
T = importlib.import_module("osa_lab.kernels.triton_osa")

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
if not CUDA and not T.INTERPRET:  # pragma: no cover - conftest sets it
    pytest.skip("TRITON_INTERPRET=1 was not set before triton was imported", allow_module_level=True)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    den = torch.linalg.vector_norm(b)
    num = torch.linalg.vector_norm(a - b)
    return float(num / den) if den > 0 else float(num)


def make_inputs(b, n, r, dv, dtype, *, alpha=0.5, seed=0, equal=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n, r, generator=g)
    k = q.clone() if equal else torch.randn(b, n, r, generator=g)
    v = torch.randn(b, n, dv, generator=g)
    scale = torch.full((b,), alpha / math.sqrt(r), dtype=torch.float64) * (1 + 0.1 * torch.arange(b))
    q, k, v = (x.to(dtype).to(DEV).requires_grad_() for x in (q, k, v))
    return q, k, v, scale.to(DEV).requires_grad_()


def dense_reference(q, k, v, scale, gy):
    """float64 dense exp(S) V and its gradients w.r.t. q, k, v, scale (DESIGN.md §2 reference)."""
    qd, kd, vd, sd = (x.detach().double().requires_grad_() for x in (q, k, v, scale))
    s = sd[:, None, None] * (qd @ kd.mT - kd @ qd.mT)
    y = torch.linalg.matrix_exp(s) @ vd
    return (y, *torch.autograd.grad(y, (qd, kd, vd, sd), gy.double()))


def check_close(got, want, dtype, what, zero_scale: float = 1.0):
    """Relative error within the dtype's tolerance (module docstring). Where ``want`` is exactly 0
    (dq for N = 1, dq + dk for q = k), ``‖got‖ / zero_scale`` must be within the float32 one."""
    if dtype == torch.float32:
        tol = 2e-5
    else:
        tol = 1.25 * rel_err(want.to(dtype), want) + 2e-5
    if torch.linalg.vector_norm(want) == 0:
        assert float(torch.linalg.vector_norm(got.detach().double())) <= 2e-5 * zero_scale, what
        return
    err = rel_err(got, want)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:.3g}"


# (b, N, r, d_v, dtype, config, path): "gram" = Triton passes used, "qr" = QR fallback expected.
CASES = [
    (2, 70, 8, 12, torch.float32, {}, "gram"),
    (2, 70, 8, 12, torch.float32, {"splits": 2, "block_n": 16}, "gram"),
    (3, 33, 4, 16, torch.float32, {"splits": 3, "block_n": 16}, "gram"),
    (1, 130, 16, 8, torch.float32, {}, "gram"),
    (2, 12, 8, 12, torch.float32, {}, "qr"),
    (2, 1, 4, 4, torch.float32, {}, "qr"),
    (2, 70, 8, 12, torch.bfloat16, {}, "gram"),
    (2, 70, 8, 12, torch.float16, {"splits": 2, "block_n": 16}, "gram"),
    (1, 130, 16, 24, torch.bfloat16, {}, "gram"),
]


def case_id(case) -> str:
    b, n, r, dv, dtype, cfg, _ = case
    extra = "".join(f"-{k.replace('_', '')}{v}" for k, v in cfg.items())
    return f"b{b}-N{n}-r{r}-dv{dv}-{str(dtype).removeprefix('torch.')}{extra}"


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_matches_dense_and_lowrank(case):
    b, n, r, dv, dtype, cfg, path = case
    q, k, v, scale = make_inputs(b, n, r, dv, dtype)
    config = T.TritonConfig(**cfg)
    if path == "gram":  # the kernels' own result, no fallback involved
        y, bad = T._OSATriton.apply(q, k, v, scale, config)
        assert not bool(bad.any()), f"expected the Triton passes to be trusted, bad={bad}"
    else:
        _, bad = T._OSATriton.apply(q.detach(), k.detach(), v.detach(), scale.detach(), config)
        assert bool(bad.all()), f"expected the QR fallback, bad={bad}"
        y = T.osa_triton(q, k, v, scale, config=config)
    assert y.dtype == dtype and y.shape == (b, n, dv)
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEV)
    grads = torch.autograd.grad(y, (q, k, v, scale), gy)
    want = dense_reference(q, k, v, scale, gy)
    for name, got, ref in zip(("y", "dq", "dk", "dv", "dscale"), (y, *grads), want, strict=True):
        # The scale gradient is a float64 sum over all tokens: hold it to the float32 budget.
        check_close(got, ref, torch.float32 if name == "dscale" else dtype, name)

    # The torch low-rank path on the same (float32-upcast) inputs.
    q32, k32, v32, s32 = (x.detach().float().requires_grad_() for x in (q, k, v, scale))
    y_lr = osa_lab.expm.lowrank_action(
        torch.cat([q32, k32], -1), osa_lab.expm.osa_skew_core(r, s32), v32, engine="lowrank"
    )
    g_lr = torch.autograd.grad(y_lr, (q32, k32, v32, s32), gy.float())
    for name, got, ref in zip(("y", "dq", "dk", "dv", "dscale"), (y, *grads), (y_lr, *g_lr), strict=True):
        check_close(got, ref, torch.float32 if name == "dscale" else dtype, f"{name} vs lowrank")


def test_bf16_without_hi_lo_split():
    """hi_lo=False rounds C, gP, H once to bf16: errors of the order of the output's own rounding
    (allowed: 3× the rounding error of the exact result)."""
    q, k, v, scale = make_inputs(2, 70, 8, 12, torch.bfloat16)
    y, bad = T._OSATriton.apply(q, k, v, scale, T.TritonConfig(hi_lo=False))
    assert not bool(bad.any())
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(y.dtype).to(DEV)
    grads = torch.autograd.grad(y, (q, k, v), gy)
    want = dense_reference(q, k, v, scale, gy)
    for name, got, ref in zip(("y", "dq", "dk", "dv"), (y, *grads), want[:4], strict=True):
        tol = 3 * rel_err(ref.to(torch.bfloat16), ref) + 2e-5
        assert rel_err(got, ref) <= tol, f"{name}: {rel_err(got, ref):.3g} > {tol:.3g}"


def test_equal_qk_uses_qr_fallback():
    """q = k gives S = 0 and a singular Gram matrix: the QR engine must take over (exp(0) V = V)."""
    q, _, v, scale = make_inputs(2, 40, 8, 8, torch.float32, equal=True)
    y = T.osa_triton(q, q, v, scale)
    torch.testing.assert_close(y, v, rtol=0, atol=1e-5)
    gy = torch.randn_like(y)
    gq, gv = torch.autograd.grad(y, (q, v), gy)
    want = dense_reference(q, q, v, scale, gy)
    check_close(gv, want[3], torch.float32, "dv")
    zero_scale = float(torch.linalg.vector_norm(want[3]))
    check_close(gq, want[1] + want[2], torch.float32, "dq (= dq + dk of the reference)", zero_scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_reduce_pass_multi_tile(dtype):
    """Gram tiles below the diagonal are skipped and mirrored; several splits are summed."""
    q, k, v, _ = make_inputs(2, 50, 32, 24, dtype)
    plan = T._plan(q, v, T.TritonConfig(tile=16, splits=2, block_n=16))
    assert (plan.splits, plan.chunk, plan.tile) == (2, 32, 16)  # 4 token blocks: 2 splits × 2
    got, v_sq = T._reduce(q.detach(), k.detach(), v.detach(), plan, gram=True)
    idx = T._idx(32, plan.rp, q.device)
    got = got[:, idx][:, :, torch.cat([idx, torch.arange(2 * plan.rp, 2 * plan.rp + 24, device=q.device)])]
    want = T.reference_reduce(q.detach(), k.detach(), v.detach())
    assert rel_err(got, want) < 1e-6
    torch.testing.assert_close(v_sq, v.detach().double().square().sum((-2, -1)), rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
def test_backward_apply_pass(dtype):
    """The fused gq/gk/gv pass against its float64 reference, with small matrices of mixed scale."""
    b, n, r, dv = 2, 37, 32, 24
    q, k, v, _ = make_inputs(b, n, r, dv, dtype)
    g = torch.Generator().manual_seed(3)
    gy = torch.randn(b, n, dv, generator=g).to(dtype).to(DEV)
    c = torch.randn(b, 2 * r, dv, generator=g, dtype=torch.float64).to(DEV) * 1e-3
    gp = torch.randn(b, 2 * r, dv, generator=g, dtype=torch.float64).to(DEV) * 1e2
    h = torch.randn(b, 2 * r, 2 * r, generator=g, dtype=torch.float64).to(DEV)
    plan = T._plan(q, v, T.TritonConfig(block_n=16))
    got = T._bwd_apply(q.detach(), k.detach(), v.detach(), gy, c, gp, h, plan)
    want = T.reference_backward_apply(q.detach(), k.detach(), v.detach(), gy, c, gp, h)
    for name, a, w in zip(("gq", "gk", "gv"), got, want, strict=True):
        check_close(a, w, dtype, name)


def test_strided_inputs_match_contiguous():
    """Transposed, sliced and batch-broadcast (stride 0) inputs are read through their strides."""
    b, n, r, dv = 2, 40, 8, 8
    g = torch.Generator().manual_seed(5)
    q = torch.randn(b, r, n, generator=g).to(DEV).transpose(1, 2)  # feature stride N
    k = torch.randn(1, n, r, generator=g).to(DEV).expand(b, n, r)  # batch stride 0
    v = torch.randn(b, n, 2 * dv, generator=g).to(DEV)[..., ::2]  # feature stride 2
    scale = torch.tensor([0.2, 0.1], dtype=torch.float64, device=DEV)
    y = T.osa_triton(q, k, v, scale)
    y_ref = T.osa_triton(q.contiguous(), k.contiguous(), v.contiguous(), scale)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)


def test_through_functional_osa_with_heads():
    """osa(method="triton") on (batch, heads, N, r) with one alpha per head, gradients to alpha."""
    g = torch.Generator().manual_seed(7)
    q, k = (torch.randn(2, 2, 40, 8, generator=g).to(DEV).requires_grad_() for _ in range(2))
    v = torch.randn(2, 2, 40, 12, generator=g).to(DEV).requires_grad_()
    alpha = torch.tensor([[0.5], [1.0]], dtype=torch.float64, device=DEV).requires_grad_()
    y = osa_lab.osa(q, k, v, alpha, method="triton")
    y_ref = osa_lab.osa(*(x.detach().double().requires_grad_() for x in (q, k, v, alpha)), method="dense")
    assert rel_err(y, y_ref) < 2e-5
    (ga,) = torch.autograd.grad(y.sum(), (alpha,))
    assert torch.isfinite(ga).all() and ga.shape == alpha.shape


def test_refuses_what_it_cannot_do(monkeypatch):
    q, k, v, scale = (x.detach() for x in make_inputs(1, 8, 4, 4, torch.float32))
    with pytest.raises(OSADtypeError, match="float64"):
        T.osa_triton(q.double(), k.double(), v.double(), scale)
    with pytest.raises(OSAInputError, match="up to 128"):
        T.osa_triton(torch.zeros(1, 8, 130, device=DEV), torch.zeros(1, 8, 130, device=DEV), v, scale)
    with pytest.raises(OSAInputError, match="3-D"):
        T.osa_triton(q[0], k[0], v[0], scale)
    with pytest.raises(OSAInputError, match="input_precision"):
        T.osa_triton(q, k, v, scale, config=T.TritonConfig(input_precision="bf16"))
    monkeypatch.setattr(T, "INTERPRET", False)
    with pytest.raises(MethodUnavailableError, match="TRITON_INTERPRET=1"):
        T.osa_triton(q.cpu(), k.cpu(), v.cpu(), scale.cpu())


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("OSA_COMPILE_CHECK") != "1", reason="set OSA_COMPILE_CHECK=1 (takes minutes)"
)
def test_kernels_compile_for_sm90():
    """Compile every kernel for an H100/H200 target without a GPU (catches codegen errors the
    interpreter cannot see). Runs in a subprocess without TRITON_INTERPRET; opt-in because
    it takes 1–5 minutes on a small CPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run(
        [sys.executable, "-m", "osa_lab.kernels.compile_check", "--quick"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if proc.returncode == 3:
        pytest.skip(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------------------
# GPU tests at realistic sizes
# --------------------------------------------------------------------------------------

GPU_CASES = [
    (32, 4096, 64, 64, torch.bfloat16),
    (8, 16384, 128, 128, torch.bfloat16),
    (8, 4096, 64, 64, torch.float16),
    (8, 4096, 64, 64, torch.float32),
    (4, 3000, 48, 96, torch.float32),
]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize(
    "case", GPU_CASES, ids=[f"b{c[0]}-N{c[1]}-r{c[2]}-dv{c[3]}-{str(c[4])[6:]}" for c in GPU_CASES]
)
def test_gpu_realistic_sizes(case):
    b, n, r, dv, dtype = case
    q, k, v, scale = make_inputs(b, n, r, dv, dtype, alpha=1.0)
    y = T.osa_triton(q, k, v, scale)
    gy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (q, k, v, scale), gy)
    q64, k64, v64, s64 = (x.detach().double().requires_grad_() for x in (q, k, v, scale))
    y64 = osa_lab.expm.lowrank_action(torch.cat([q64, k64], -1), osa_lab.expm.osa_skew_core(r, s64), v64)
    want = (y64, *torch.autograd.grad(y64, (q64, k64, v64, s64), gy.double()))
    for name, got, ref in zip(("y", "dq", "dk", "dv", "dscale"), (y, *grads), want, strict=True):
        tol = (
            1e-4 if dtype == torch.float32 or name == "dscale" else 1.25 * rel_err(ref.to(dtype), ref) + 1e-4
        )
        assert rel_err(got, ref) <= tol, f"{name}: {rel_err(got, ref):.3g} > {tol:.3g}"
