"""Metrics of docs/design.md §4 against values computed by hand on small matrices."""

from __future__ import annotations

import math

import pytest
import torch

from osa_lab.errors import OSAInputError, UnknownNameError
from osa_lab.studies.metrics import (
    METRICS,
    all_metrics,
    composite_norm,
    condition_number,
    effective_rank,
    normalized_spectrum,
    relative_residual,
    singular_values,
    stable_rank,
    token_cosine,
)


def test_rank_one_matrix():
    # X = u vᵀ with u = (1, 2, 2) (‖u‖ = 3), v = (1, 0): one singular value 3, the other 0.
    x = torch.tensor([[1.0, 0.0], [2.0, 0.0], [2.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(singular_values(x), torch.tensor([3.0, 0.0], dtype=torch.float64), atol=1e-12)
    assert float(stable_rank(x)) == pytest.approx(1.0, abs=1e-12)
    assert float(effective_rank(x)) == pytest.approx(1.0, abs=1e-12)
    assert math.isinf(float(condition_number(x)))
    # all tokens parallel, pointing the same way: cosine 1
    assert float(token_cosine(x)) == pytest.approx(1.0, abs=1e-12)
    # residual: token mean (5/3, 0); res = (-2/3, 1/3, 1/3) in column 0.
    # ‖res‖₁ = 4/3 (column sum), ‖res‖_∞ = 2/3 (max row) → √(8/9); ‖X‖₁ = 5, ‖X‖_∞ = 2 → √10.
    expected = math.sqrt(8 / 9) / math.sqrt(10)
    assert float(relative_residual(x)) == pytest.approx(expected, rel=1e-12)


def test_identical_tokens_have_zero_residual():
    x = torch.tensor([[1.0, -2.0, 3.0]] * 4, dtype=torch.float64)
    assert float(relative_residual(x)) == 0.0
    assert float(token_cosine(x)) == pytest.approx(1.0, abs=1e-12)


def test_orthogonal_matrix():
    q, _ = torch.linalg.qr(torch.randn(5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    assert torch.allclose(singular_values(q), torch.ones(5, dtype=torch.float64), atol=1e-12)
    assert float(stable_rank(q)) == pytest.approx(5.0, abs=1e-10)
    assert float(effective_rank(q)) == pytest.approx(5.0, abs=1e-10)
    assert float(condition_number(q)) == pytest.approx(1.0, abs=1e-10)
    # rows of an orthogonal matrix are orthonormal: mean cosine 0
    assert float(token_cosine(q)) == pytest.approx(0.0, abs=1e-12)


def test_diagonal_matrix():
    x = torch.diag(torch.tensor([4.0, 2.0, 1.0, 1.0], dtype=torch.float64))
    assert torch.allclose(normalized_spectrum(x), torch.tensor([1.0, 0.5, 0.25, 0.25], dtype=torch.float64))
    assert float(stable_rank(x)) == pytest.approx((16 + 4 + 1 + 1) / 16)
    p = torch.tensor([4.0, 2.0, 1.0, 1.0], dtype=torch.float64) / 8
    assert float(effective_rank(x)) == pytest.approx(math.exp(float(-(p * p.log()).sum())), rel=1e-12)
    assert float(condition_number(x)) == pytest.approx(4.0)
    # composite norm of diag(4,2,1,1): ‖·‖₁ = ‖·‖_∞ = 4
    assert float(composite_norm(x)) == pytest.approx(4.0)
    # residual of the diagonal matrix: mean row m = (1, .5, .25, .25); res = X − 1 mᵀ.
    res = x - x.mean(0, keepdim=True)
    one = res.abs().sum(0).max()
    inf = res.abs().sum(1).max()
    assert float(relative_residual(x)) == pytest.approx(float((one * inf).sqrt() / 4.0), rel=1e-12)


def test_token_cosine_by_hand():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    c = 1 / math.sqrt(2)
    # pairs (0,1): 0, (0,2): c, (1,2): c — mean over ordered pairs = (0 + c + c) * 2 / 6
    assert float(token_cosine(x)) == pytest.approx(2 * c / 3, rel=1e-12)


def test_batched_and_float32_promoted():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 2, 6, 4, generator=g)
    for name, fn in METRICS.items():
        batched = fn(x)
        assert batched.shape == (3, 2), name
        assert batched.dtype == torch.float64, name
        single = fn(x[1, 0])
        assert float(batched[1, 0]) == pytest.approx(float(single), rel=1e-12), name
    together = all_metrics(x)
    for name in METRICS:
        assert torch.allclose(together[name], METRICS[name](x), rtol=1e-12), name


def test_zero_matrix_conventions():
    z = torch.zeros(4, 3, dtype=torch.float64)
    assert float(relative_residual(z)) == 0.0
    assert float(stable_rank(z)) == 0.0
    assert float(effective_rank(z)) == 0.0


def test_bad_inputs():
    with pytest.raises(OSAInputError, match="N tokens"):
        stable_rank(torch.ones(3))
    with pytest.raises(OSAInputError, match="at least 2 tokens"):
        token_cosine(torch.ones(1, 3))
    with pytest.raises(UnknownNameError, match="relative_residual"):
        all_metrics(torch.ones(3, 3), ["rank"])
