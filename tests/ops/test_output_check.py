"""The output check of osa(): strict (blocking) and deferred (sync-free) modes, float16 casts."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import osa_lab
from osa_lab.ops import expm, functional, output_check
from osa_lab.ops.triton.sync_count import count_syncs


def _qkv(n=6, r=3, d=4):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, c, generator=g) for c in (r, r, d))


def test_deferred_mode_reports_a_nan_at_the_next_call_and_at_flush():
    q, k, v = _qkv()
    with output_check.output_check("deferred"):
        y = osa_lab.osa(q, k, v, torch.tensor(math.nan))  # no error yet: nothing waits for the device
        assert torch.isnan(y).all()
        with pytest.raises(osa_lab.OSAInputError, match="deferred"):
            osa_lab.osa(q, k, v, 0.5)
        osa_lab.osa(q, k, v, torch.tensor(math.inf))
        with pytest.raises(osa_lab.OSAInputError, match="non-finite"):
            output_check.flush()
        assert output_check.discard_pending() == 0


def test_strict_mode_raises_at_the_call_naming_the_input():
    q, k, v = _qkv()
    with output_check.output_check("strict"), pytest.raises(osa_lab.OSAInputError, match="`alpha` contains NaN"):
        osa_lab.osa(q, k, v, torch.tensor(math.nan))
    assert output_check.effective_mode(torch.device("cpu")) == "strict"  # "auto" on the CPU


def test_deferred_mode_warns_on_norm_drift(monkeypatch):
    monkeypatch.setitem(functional.OSA_METHODS, "qr", lambda q, k, v, scale: 1.5 * v)
    q, k, v = _qkv()
    with output_check.output_check("deferred"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", osa_lab.OSAAccuracyWarning)
            osa_lab.osa(q, k, v, 0.5, method="qr")
        with pytest.warns(osa_lab.OSAAccuracyWarning, match="norms differ"):
            output_check.flush()


def test_unknown_mode_is_a_typed_error():
    with pytest.raises(osa_lab.UnknownNameError, match="strict"):
        output_check.set_output_check("lazy")


@pytest.mark.parametrize("method", ["dense", "qr", "lowrank"])
def test_float16_output_is_checked_after_the_cast(monkeypatch, method):
    """A float16 result computed in float32 can overflow in the cast back (|y| > 65504 although
    ‖y‖ = ‖v‖ per matrix holds in float32): the check sees the cast output and raises."""
    monkeypatch.setattr(functional, "check_qkv", lambda q, k, v, finite: None)  # float16 on the CPU
    q = torch.tensor([[1.0], [0.0]], dtype=torch.float16)
    k = torch.tensor([[0.0], [1.0]], dtype=torch.float16)
    v = torch.tensor([[60000.0], [60000.0]], dtype=torch.float16)
    alpha = math.pi / 4  # S = (π/4)[[0, 1], [−1, 0]]: exp(S) v = (84853, 0)
    with pytest.raises(osa_lab.OSAInputError, match="non-finite"):
        osa_lab.osa(q, k, v, alpha, method=method)


def test_gram_engine_norm_change_equals_the_norms():
    """The Gram engine's norm check comes from its small matrices: ‖V + UC‖² − ‖V‖² = 2⟨P, C⟩ + ⟨C, GC⟩."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 200, c, dtype=torch.float64, generator=g) for c in (4, 4, 5))
    scale = torch.full((3,), 0.5, dtype=torch.float64)
    y, (y_sq, v_sq, delta) = expm.blocked_action(
        q, k, expm.osa_skew_core(4, scale), v, "lowrank", osa_core=True, norms=True
    )
    ny = torch.linalg.vector_norm(y, dim=(-2, -1)) ** 2
    nv = torch.linalg.vector_norm(v, dim=(-2, -1)) ** 2
    assert float(((ny - nv) - delta).abs().max() / nv.max()) < 1e-12
    assert float((y_sq - ny).abs().max() / nv.max()) < 1e-12


@pytest.mark.parametrize("method", ["lowrank", "gram", "qr"])
def test_registry_methods_still_return_the_output_tensor(method):
    """The public OSA_METHODS entries return y; the check's sums are asked for by osa() only."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 40, c, generator=g) for c in (4, 4, 5))
    y = osa_lab.OSA_METHODS[method](q, k, v, torch.full((2,), 0.25, dtype=torch.float64))
    assert isinstance(y, torch.Tensor) and y.shape == v.shape
    assert torch.equal(y, osa_lab.osa(q, k, v, 0.5, method=method))


_SPECIAL = st.sampled_from([0.0, 1e-320, 1.0, 1e300, math.inf, -math.inf, math.nan])
_VALUE = st.one_of(st.floats(0.0, 1e6), _SPECIAL)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.tuples(_VALUE, _VALUE, st.one_of(st.floats(-1e6, 1e6), _SPECIAL)), min_size=0, max_size=6),
    with_delta=st.booleans(),
)
def test_the_host_drift_equals_the_device_formula(values, with_delta):
    """relative_drift_on_host (NumPy, the CPU's strict check) against relative_drift (torch, float64),
    zero, subnormal, huge, infinite and NaN norms included."""
    y_sq, v_sq, delta = (torch.tensor([row[i] for row in values], dtype=torch.float64) for i in range(3))
    args = (y_sq, v_sq, delta) if with_delta else (y_sq, v_sq)
    expected = float(output_check.relative_drift(*args))
    got = output_check.relative_drift_on_host(*args)
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected, rel=1e-12, abs=0)


def test_the_host_check_of_a_float32_action_call_names_a_nan_input_and_warns_on_drift(monkeypatch):
    """osa()'s CPU strict path (the drift in NumPy) keeps the check's decisions: a NaN in v is
    named, a drifting output warns."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 8, 4, generator=g) for _ in range(3))
    bad = v.clone()
    bad[1, 2, 5, 0] = math.nan
    with pytest.raises(osa_lab.OSAInputError, match="`v` contains 1 NaN"):
        osa_lab.osa(q, k, bad, 0.3)
    action = expm.osa_chebyshev_action

    def drifting(*args, norms=False):
        y, (y_sq, v_sq) = action(*args, norms=True)
        return y, (1.01 * y_sq, v_sq)

    monkeypatch.setattr(expm, "osa_chebyshev_action", drifting)
    with pytest.warns(osa_lab.OSAAccuracyWarning, match="norms differ"):
        osa_lab.osa(q, k, v, 0.3)


def test_the_cpu_strict_check_adds_no_aten_reduction_or_scalar_read_to_the_small_n_action():
    """On the CPU the output check of a small-N call is decided in NumPy from the action's own
    norms: osa()'s forward dispatches the fused action's operations plus α's chain (its
    float64 copy, scale and per-matrix expansion) and views, and no further reduction,
    comparison or ``.item()``."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(8, 10, 4, generator=g, requires_grad=True) for _ in range(3))
    alpha = torch.full((8,), 0.3, dtype=torch.float64, requires_grad=True)
    osa_lab.osa(q, k, v, alpha)  # warm-up
    with count_syncs() as call:
        osa_lab.osa(q, k, v, alpha)
    with count_syncs() as action:
        expm.osa_chebyshev_action(q, k, (alpha / 2).detach(), v, norms=True)
    extra = call.op_names - action.op_names
    assert not extra.keys() & {"amax", "max", "all", "any", "isfinite", "ne", "eq", "where", "_local_scalar_dense"}, extra
    assert sum(extra.values()) <= 10, extra
