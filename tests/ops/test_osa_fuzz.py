"""Fuzz test of :func:`osa_lab.osa`: for any shapes, dtypes, α forms and methods, the
call returns an output of v's shape and dtype that matches a float64 reference within the
documented budget, or raises a typed osa_lab error — never anything else (no other exception,
no wrong shape, no silently wrong values, no accuracy warning).

Budgets (relative Frobenius error against the float64 exponential of the same, already rounded
inputs): float64 1e-10; float32 max(2e-6, 1e-7·‖S‖₂) (the float32 target of the accuracy tests);
bfloat16 inputs and output 1e-2 (the output is rounded to bfloat16, 2⁻⁹ per entry).

``OSA_FUZZ_EXAMPLES=2000 pytest tests/ops/test_osa_fuzz.py`` explores with fresh random examples;
by default a fixed, modest set runs (derandomised, so CI is deterministic).
"""

from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import osa_lab
from osa_lab import errors
from tests.helpers import DEGENERATE_KINDS, qkv_of_kind, rel_err

_EXAMPLES = os.environ.get("OSA_FUZZ_EXAMPLES")
FUZZ = settings(
    max_examples=int(_EXAMPLES) if _EXAMPLES else 60,
    deadline=None,
    derandomize=_EXAMPLES is None,
    suppress_health_check=[HealthCheck.too_slow],
)

#: Every typed error osa_lab raises on bad input.
TYPED_ERRORS = (
    errors.OSAInputError,
    errors.OSADtypeError,
    errors.UnknownNameError,
    errors.MethodUnavailableError,
    errors.CausalMaskError,
    errors.ConfigurationError,
)

METHODS = ["dense", "gram", "qr", "lowrank", "auto"]
DTYPES = [torch.float64, torch.float32, torch.bfloat16]
BUDGET_BASE = {torch.float64: 1e-10, torch.float32: 2e-6, torch.bfloat16: 1e-2}
ALPHA_FORMS = ["float", "np.float32", "int", "tensor0d", "full", "per-head", "sdpa", "lead1", "bad", "complex", "bool"]


@st.composite
def cases(draw):
    batch = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    n = draw(st.integers(0, 12) | st.just(1))
    r = draw(st.integers(1, 5))
    d = draw(st.integers(0, 4))
    kind = draw(st.sampled_from(["random", "q=k", "k=2q", "q=0", "tiny-N"]))
    if kind == "tiny-N":
        n = min(n, 2 * r - 1) if n else 0  # [q k] has rank below 2r
    dtype = draw(st.sampled_from(DTYPES))
    method = draw(st.sampled_from(METHODS))
    form = draw(st.sampled_from(ALPHA_FORMS))
    a0 = draw(st.floats(-3.0, 3.0, allow_nan=False, allow_infinity=False))
    seed = draw(st.integers(0, 2**31 - 1))
    return batch, n, r, d, kind, dtype, method, form, a0, seed


def _inputs(batch, n, r, d, kind, dtype, seed):
    return qkv_of_kind(kind if kind in DEGENERATE_KINDS else "random", batch, n, r, d, seed=seed, dtype=dtype)


def _alpha(form, a0, batch, seed):
    """(α as passed, α per matrix as a float64 tensor of shape ``batch``; None if α must be refused)."""
    g = torch.Generator().manual_seed(seed + 1)
    full = torch.full(batch, float(a0), dtype=torch.float64)
    if form == "float":
        return a0, full
    if form == "np.float32":
        return np.float32(a0), torch.full(batch, float(np.float32(a0)), dtype=torch.float64)
    if form == "int":
        return round(a0), torch.full(batch, float(round(a0)), dtype=torch.float64)
    if form == "tensor0d":
        return torch.tensor(a0, dtype=torch.float64), full
    if form == "full":
        t = (torch.rand(batch, dtype=torch.float64, generator=g) - 0.5) * 2 * a0
        return t, t
    if form in ("per-head", "sdpa"):
        heads = batch[-1] if batch else 1
        t = (torch.rand(heads, dtype=torch.float64, generator=g) - 0.5) * 2 * a0
        passed = t if form == "per-head" else t[:, None, None]
        return passed, t.expand(batch) if batch else t.reshape(())
    if form == "lead1":
        t = (torch.rand(batch, dtype=torch.float64, generator=g) - 0.5) * 2 * a0
        return t[None, None], t
    if form == "bad":
        return torch.ones((5, *batch), dtype=torch.float64), None
    if form == "complex":
        return torch.tensor(complex(a0, 1.0)), None
    return torch.tensor(True), None  # "bool"


def _reference(q, k, v, alpha_full):
    """exp(S) v per matrix in float64 by torch.linalg.matrix_exp, and the largest ‖S‖₂."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    r = q.shape[-1]
    qk = q64 @ k64.mT
    s = alpha_full[..., None, None] / math.sqrt(r) * (qk - qk.mT)
    s_norm = float(torch.linalg.matrix_norm(s, 2).max()) if s.numel() else 0.0
    return torch.linalg.matrix_exp(s) @ v64, s_norm


@FUZZ
@given(cases())
def test_osa_is_right_or_refuses(case):
    batch, n, r, d, kind, dtype, method, form, a0, seed = case
    q, k, v = _inputs(batch, n, r, d, kind, dtype, seed)
    alpha, alpha_full = _alpha(form, a0, batch, seed)
    must_refuse = alpha_full is None or n == 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", errors.OSAAccuracyWarning)
            y = osa_lab.osa(q, k, v, alpha, method=method)
    except TYPED_ERRORS as exc:
        # A typed refusal is always allowed for bad input; on valid input only "gram" may refuse
        # (its own estimate says it cannot be trusted), and only with UntrustedResultError.
        assert must_refuse or (method == "gram" and isinstance(exc, errors.UntrustedResultError)), (
            f"valid input refused by {method!r}: {exc!r}"
        )
        return
    assert not must_refuse, f"{method!r} accepted α form {form!r} / N={n} that must be refused"
    assert y.shape == v.shape, f"{method!r}: output shape {tuple(y.shape)} != v's {tuple(v.shape)}"
    assert y.dtype == v.dtype
    if y.numel() == 0:
        return
    ref, s_norm = _reference(q, k, v, alpha_full)
    budget = BUDGET_BASE[dtype] if dtype != torch.float32 else max(2e-6, 1e-7 * s_norm)
    err = rel_err(y, ref)
    assert err <= budget, f"{method!r} {dtype} kind={kind} N={n} r={r} ‖S‖₂={s_norm:.3g}: error {err:.3g} > {budget:.3g}"


@pytest.mark.parametrize("method", METHODS)
def test_fuzz_reference_agrees_with_the_methods(method):
    """The fuzz test's own reference against every method on one well-conditioned batch."""
    q, k, v = _inputs((2, 3), 40, 2, 3, "random", torch.float64, 0)
    alpha = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64)
    ref, _ = _reference(q, k, v, alpha.expand(2, 3))
    assert rel_err(osa_lab.osa(q, k, v, alpha, method=method), ref) <= 1e-10
