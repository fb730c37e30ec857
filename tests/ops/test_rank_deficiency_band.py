"""Regression probes from an adversarial review that the other test files do not
already pin down: a named engine is right or refuses across the whole band between
well-conditioned and rank-deficient ``[q k]``, and α shapes that broadcast keep v's shape and
match the float64 reference.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import osa_lab
from osa_lab.errors import OSAAccuracyWarning, UntrustedResultError

#: Relative error (vs the float64 dense reference, normalised by ‖v‖) accepted per dtype.
BUDGET = {torch.float64: 1e-10, torch.float32: 1e-4}


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """exp(S) v in float64, S = α/√r (q kᵀ − k qᵀ); a tensor α is broadcast over the matrix dims."""
    q, k, v = q.double(), k.double(), v.double()
    a = alpha.double() if isinstance(alpha, torch.Tensor) else alpha
    s = (q @ k.mT - k @ q.mT) / math.sqrt(q.shape[-1])
    return torch.linalg.matrix_exp(a * s) @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize(("n", "r"), [(8, 4), (9, 4), (16, 8), (64, 8)])
@pytest.mark.parametrize("eps", [1.0, 1e-2, 1e-4, 1e-6, 1e-8])
def test_gram_is_right_or_refuses_between_full_rank_and_rank_deficient(dtype, n, r, eps):
    """Was: method='gram' silently off by relative error up to 7.9 on rank-deficient [q k].

    k = q + eps·noise walks from well-conditioned (eps = 1) to k ∥ q (eps → 0): at every step
    'gram' either raises UntrustedResultError or matches the float64 reference within the budget
    without warning.
    """
    g = torch.Generator().manual_seed(n * 1000 + r)
    q = torch.randn(4, n, r, dtype=dtype, generator=g)
    k = q + eps * torch.randn(4, n, r, dtype=dtype, generator=g)
    v = torch.randn(4, n, 3, dtype=dtype, generator=g)
    for alpha in (0.1, 1.0, 5.0):
        with warnings.catch_warnings():
            warnings.simplefilter("error", OSAAccuracyWarning)
            try:
                y = osa_lab.osa(q, k, v, alpha, method="gram")
            except UntrustedResultError:
                continue
        err = float((y.double() - reference(q, k, v, alpha)).norm() / v.double().norm())
        assert y.shape == v.shape
        assert err <= BUDGET[dtype], (dtype, n, r, eps, alpha, err)


@pytest.mark.parametrize("method", ["lowrank", "qr", "auto"])
def test_robust_methods_never_refuse_rank_deficient_input(method):
    """The engines that 'gram' points to in its refusal handle q = k, k = 2q, q = 0 and N < 2r."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 10, 4, dtype=torch.float64, generator=g)
    v = torch.randn(2, 10, 5, dtype=torch.float64, generator=g)
    short_q = torch.randn(2, 3, 4, dtype=torch.float64, generator=g)
    short_k = torch.randn(2, 3, 4, dtype=torch.float64, generator=g)
    short_v = torch.randn(2, 3, 5, dtype=torch.float64, generator=g)
    for qq, kk, vv in ((q, q, v), (q, 2 * q, v), (torch.zeros_like(q), q, v), (short_q, short_k, short_v)):
        y = osa_lab.osa(qq, kk, vv, 0.8, method=method)
        assert float((y - reference(qq, kk, vv, 0.8)).norm() / vv.norm()) <= 1e-12


@pytest.mark.parametrize(
    ("alpha_shape", "view"),
    [
        ((1, 3, 1, 1), (1, 3, 1, 1)),  # SDPA-style per head
        ((3, 1, 1), (3, 1, 1)),
        ((1, 1, 3), (3, 1, 1)),  # leading 1s dropped: one value per head
        ((2, 1), (2, 1, 1, 1)),  # one value per batch element
        ((2, 3, 1, 1), (2, 3, 1, 1)),
        ((1, 1, 1, 1, 1), ()),
    ],
    ids=str,
)
def test_broadcasting_alpha_keeps_v_shape_and_matches_reference(alpha_shape, view):
    """Was: α of shape (1, H, 1, 1), (H, 1, 1), (1, 1, H) grew the output to (1, H, B, H, N, d)."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 10, 4, dtype=torch.float64, generator=g) for _ in range(3))
    alpha = 0.5 + torch.rand(alpha_shape, dtype=torch.float64, generator=g)
    y = osa_lab.osa(q, k, v, alpha)
    assert y.shape == v.shape
    assert float((y - reference(q, k, v, alpha.reshape(view))).norm() / v.norm()) <= 1e-12


@pytest.mark.parametrize("alpha_shape", [(5, 2, 3), (4,), (3, 1), (2, 3, 2)], ids=str)
def test_alpha_that_would_change_the_output_shape_is_refused(alpha_shape):
    q, k, v = (torch.randn(2, 3, 10, 4) for _ in range(3))
    with pytest.raises(osa_lab.OSAInputError, match="alpha"):
        osa_lab.osa(q, k, v, torch.ones(alpha_shape))
