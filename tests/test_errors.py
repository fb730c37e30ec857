"""Bad input gets a clear, typed error naming the argument, what it got and what it needs."""

from __future__ import annotations

import pytest
import torch

import osa_lab


def _qkv(n=6, r=3, d=4, dtype=torch.float32):
    return torch.randn(n, r, dtype=dtype), torch.randn(n, r, dtype=dtype), torch.randn(n, d, dtype=dtype)


@pytest.mark.parametrize("key", ["mask", "attn_mask", "causal", "is_causal"])
def test_masks_are_refused_with_explanation(key):
    q, k, v = _qkv()
    with pytest.raises(osa_lab.CausalMaskError, match="non-causal"):
        osa_lab.osa(q, k, v, **{key: True})
    layer = osa_lab.OrthogonalSelfAttention(8, 2)
    with pytest.raises(osa_lab.CausalMaskError, match="skew-symmetry"):
        layer(torch.randn(1, 5, 8), **{key: True})


def test_unknown_keyword_is_a_type_error():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="unexpected keyword"):
        osa_lab.osa(q, k, v, temperature=2.0)


def test_mismatched_q_k_shapes():
    q, k, v = _qkv()
    with pytest.raises(osa_lab.OSAInputError, match=r"`q` has shape \(6, 3\) but `k` has shape \(6, 2\)"):
        osa_lab.osa(q, k[:, :2], v)


def test_mismatched_token_counts():
    q, k, v = _qkv()
    with pytest.raises(osa_lab.OSAInputError, match=r"token counts differ.*N=6.*N=5"):
        osa_lab.osa(q, k, v[:5])


def test_non_floating_dtype():
    q, k, v = _qkv()
    with pytest.raises(osa_lab.OSADtypeError, match=r"`q` has dtype torch.int64"):
        osa_lab.osa(q.long(), k.long(), v.long())


def test_mixed_dtypes():
    q, k, v = _qkv()
    with pytest.raises(osa_lab.OSADtypeError, match="dtypes differ"):
        osa_lab.osa(q, k, v.double())


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_and_inf_inputs(bad):
    q, k, v = _qkv()
    v[2, 1] = bad
    with pytest.raises(osa_lab.OSAInputError, match=r"`v` contains .*(NaN|Inf)"):
        osa_lab.osa(q, k, v)
    with pytest.raises(osa_lab.OSAInputError, match="alpha"):
        osa_lab.osa(q, k, v.nan_to_num(), alpha=bad)


def test_float16_on_cpu():
    q, k, v = _qkv(dtype=torch.float16)
    with pytest.raises(osa_lab.OSADtypeError, match="float16 on the CPU"):
        osa_lab.osa(q, k, v)


def test_too_few_dims():
    with pytest.raises(osa_lab.OSAInputError, match="at least 2 dims"):
        osa_lab.osa(torch.randn(5), torch.randn(5), torch.randn(5))


def test_alpha_that_does_not_broadcast():
    q, k, v = (torch.randn(2, 3, 6, 4) for _ in range(3))
    with pytest.raises(osa_lab.OSAInputError, match=r"shape \(heads,\)"):
        osa_lab.osa(q, k, v, alpha=torch.ones(5))


def test_unknown_method_lists_valid_ones():
    q, k, v = _qkv()
    with pytest.raises(osa_lab.UnknownNameError, match="auto, dense, gram, lowrank, qr, triton"):
        osa_lab.osa(q, k, v, method="fast")


def test_triton_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k, v = _qkv()
    with pytest.raises(osa_lab.MethodUnavailableError, match="needs a CUDA tensor"):
        osa_lab.osa(q, k, v, method="triton")


@pytest.mark.parametrize("cls", [osa_lab.OrthogonalSelfAttention, osa_lab.SoftmaxSelfAttention])
def test_dim_not_divisible_by_heads(cls):
    with pytest.raises(osa_lab.ConfigurationError, match=r"`dim`=10 is not divisible by `heads`=4.*\[1, 2, 5, 10\]"):
        cls(10, 4)


@pytest.mark.parametrize("cls", [osa_lab.OrthogonalSelfAttention, osa_lab.SoftmaxSelfAttention])
def test_layer_input_shape(cls):
    layer = cls(8, 2)
    with pytest.raises(osa_lab.ConfigurationError, match=r"\(batch, tokens, dim=8\)"):
        layer(torch.randn(3, 5, 6))


def test_zero_tokens():
    with pytest.raises(osa_lab.OSAInputError, match="N=0 tokens"):
        osa_lab.osa(torch.randn(0, 3), torch.randn(0, 3), torch.randn(0, 4))


def test_reference_skew_exp_bad_inputs():
    with pytest.raises(osa_lab.OSAInputError, match="NaN"):
        osa_lab.reference_skew_exp(torch.full((3, 3), float("nan")))
    with pytest.raises(osa_lab.OSADtypeError, match="floating dtype"):
        osa_lab.reference_skew_exp(torch.zeros(3, 3, dtype=torch.long))


def test_unknown_engine():
    u, v = torch.randn(10, 4), torch.randn(10, 2)
    with pytest.raises(osa_lab.UnknownNameError, match="gram, lowrank, qr"):
        osa_lab.lowrank_action(u, torch.zeros(4, 4), v, engine="foo")


def test_layer_constructor_checks():
    with pytest.raises(osa_lab.UnknownNameError, match="valid methods"):
        osa_lab.OrthogonalSelfAttention(8, 2, method="fast")
    with pytest.raises(osa_lab.ConfigurationError, match="head_dim"):
        osa_lab.OrthogonalSelfAttention(8, 2, head_dim=True)
    with pytest.raises(osa_lab.ConfigurationError, match="tokens"):
        osa_lab.OrthogonalSelfAttention(8, 2, tokens=0)


def test_metrics_refuse_nan():
    from osa_lab.studies.metrics import METRICS

    with pytest.raises(osa_lab.OSAInputError, match="NaN"):
        METRICS["stable_rank"](torch.full((4, 3), float("nan")))


# ---- one root, one meaning per type ---------------------------------------------------------


def _error_types() -> list[type[BaseException]]:
    from osa_lab import errors

    return [obj for obj in vars(errors).values()
            if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__]  # fmt: skip


def test_every_error_type_is_below_the_root_and_keeps_its_builtin_base():
    from osa_lab import errors

    for cls in _error_types():
        assert issubclass(cls, errors.OSALabError), cls
    builtin_bases = {
        errors.OSAInputError: ValueError,
        errors.ConfigurationError: ValueError,
        errors.UnknownNameError: ValueError,
        errors.OSADtypeError: TypeError,
        errors.NonFiniteError: FloatingPointError,
        errors.MissingDataError: FileNotFoundError,
        errors.OptionalDependencyError: ImportError,
        errors.MethodUnavailableError: RuntimeError,
        errors.TrainingDivergedError: RuntimeError,
        errors.OSAAccuracyWarning: UserWarning,
    }
    for cls, base in builtin_bases.items():
        assert issubclass(cls, base), (cls, base)


def test_user_errors_are_one_subtree():
    from osa_lab import errors

    # outcomes, not mistakes: a diverged run, a cancelled computation, a damaged stored result
    # (recomputed), a compiled kernel that could not run
    not_user = {errors.OSALabError, errors.TrainingDivergedError, errors.ComputationCancelledError,
                errors.MalformedResultError, errors.KernelFailedError}
    not_user |= {cls for cls in _error_types() if issubclass(cls, Warning)}
    for cls in _error_types():
        assert issubclass(cls, errors.UserError) == (cls not in not_user), cls
    assert errors.is_user_error(errors.RunLockedError("x")) and errors.is_user_error(errors.NonFiniteError("x"))
    assert not errors.is_user_error(errors.ComputationCancelledError("x"))
    assert not errors.is_user_error(ValueError("x"))
    assert osa_lab.OSALabError is errors.OSALabError and osa_lab.UserError is errors.UserError


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_and_inf_inputs_are_non_finite_errors(bad):
    q, k, v = _qkv()
    q[0, 0] = bad
    with pytest.raises(osa_lab.NonFiniteError, match=r"`q` contains"):
        osa_lab.osa(q, k, v)
    with pytest.raises(osa_lab.NonFiniteError, match="`alpha` contains NaN or Inf"):
        osa_lab.osa(*_qkv(), alpha=torch.tensor(bad))
    layer = osa_lab.OrthogonalSelfAttention(8, 2)
    x = torch.randn(1, 5, 8)
    x[0, 1, 2] = bad
    with pytest.raises(osa_lab.NonFiniteError):
        layer(x)


@pytest.mark.filterwarnings("ignore::osa_lab.OSAAccuracyWarning")
@pytest.mark.parametrize("method", ["dense", "qr", "auto"])
def test_an_overflow_from_finite_inputs_is_a_non_finite_error(method):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(8, 4, generator=g) for _ in range(3))
    with pytest.raises(osa_lab.NonFiniteError, match="non-finite values from finite inputs"):
        osa_lab.osa(q, k, v, alpha=3e38, method=method)  # S = α(qkᵀ − kqᵀ) overflows float32


@pytest.mark.filterwarnings("ignore::osa_lab.OSAAccuracyWarning")
def test_the_encoder_names_the_layer_whose_attention_overflows():
    """An α so large that the layer's output overflows from a finite input: the encoder raises the
    typed hidden-state error naming that layer, not a bare input error."""
    from osa_lab.nn.models import build_model
    from osa_lab.nn.presets import get_preset

    model = build_model(get_preset("pure-osa", depth=2, dim=16, tokens=8, seed=0))
    with torch.no_grad():
        model.blocks[1].attn.alpha.fill_(1e20)
    with pytest.raises(osa_lab.NonFiniteHiddenStateError) as info:
        model(torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(0)))
    assert isinstance(info.value, osa_lab.NonFiniteError)
    assert (info.value.layer, info.value.site) == (2, "attention")


def test_metrics_refuse_nan_as_a_non_finite_error():
    from osa_lab.studies.metrics import METRICS

    with pytest.raises(osa_lab.NonFiniteError, match="NaN"):
        METRICS["stable_rank"](torch.full((4, 3), float("nan")))


def test_a_table_without_the_needed_columns_is_the_same_error_in_every_plot_and_summary():
    import pandas as pd

    from osa_lab.plots import depth as depth_plots
    from osa_lab.plots import expm as expm_plots
    from osa_lab.studies import summaries

    table = pd.DataFrame({"x": [1.0]})
    for build in (lambda: expm_plots.error_vs_n(table), lambda: depth_plots.metric_vs_depth(table, "stable_rank"),
                  lambda: summaries.collapse_table(table)):  # fmt: skip
        with pytest.raises(osa_lab.OSAInputError, match="lacks columns|lacks column"):
            build()


def test_alpha_beyond_float64_range_is_a_typed_error():
    q, k, v = _qkv()
    with pytest.raises(osa_lab.OSAInputError, match="beyond float64's range"):
        osa_lab.osa(q, k, v, alpha=10**400)
    with pytest.raises(osa_lab.OSAInputError, match="beyond float64's range"):
        osa_lab.ops.expm.osa_matrix(q, k, 10**400)


@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), torch.tensor(float("nan"))], ids=["nan", "inf", "tensor-nan"])
def test_osa_matrix_refuses_non_finite_alpha_like_osa(alpha):
    q, k, v = _qkv()
    with pytest.raises(osa_lab.OSAInputError, match="alpha"):
        osa_lab.osa(q, k, v, alpha)
    with pytest.raises(osa_lab.OSAInputError, match="alpha"):
        osa_lab.ops.expm.osa_matrix(q, k, alpha)
