"""Property tests (hypothesis) for the invariants of docs/design.md §1."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import osa_lab
from tests.helpers import rel_err

METHODS = st.sampled_from(["dense", "lowrank", "qr"])


@st.composite
def qkv(draw, max_n: int = 24):
    n = draw(st.integers(1, max_n))
    r = draw(st.integers(1, 6))
    d = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**31 - 1))
    alpha = draw(st.floats(-3.0, 3.0, allow_nan=False))
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, r, generator=g, dtype=torch.float64)
    k = torch.randn(n, r, generator=g, dtype=torch.float64)
    v = torch.randn(n, d, generator=g, dtype=torch.float64)
    return q, k, v, alpha


SETTINGS = settings(max_examples=40, deadline=None)


@SETTINGS
@given(qkv(), METHODS)
def test_norm_and_gram_preserved(data, method):
    q, k, v, alpha = data
    y = osa_lab.osa(q, k, v, alpha, method=method)
    assert rel_err(y.mT @ y, v.mT @ v) <= 1e-10
    assert torch.allclose(torch.linalg.vector_norm(y, dim=0), torch.linalg.vector_norm(v, dim=0), rtol=1e-10)


@SETTINGS
@given(qkv(), METHODS)
def test_alpha_zero_is_identity(data, method):
    q, k, v, _ = data
    assert torch.equal(osa_lab.osa(q, k, v, 0.0, method=method), v) or rel_err(
        osa_lab.osa(q, k, v, 0.0, method=method), v
    ) <= 1e-14


@SETTINGS
@given(qkv(), METHODS)
def test_swapping_q_and_k_inverts(data, method):
    q, k, v, alpha = data
    y = osa_lab.osa(q, k, v, alpha, method=method)
    back = osa_lab.osa(k, q, y, alpha, method=method)
    assert rel_err(back, v) <= 1e-10


@SETTINGS
@given(qkv(), METHODS, st.randoms(use_true_random=False))
def test_token_permutation_equivariance(data, method, rnd):
    q, k, v, alpha = data
    perm = list(range(q.shape[0]))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    y = osa_lab.osa(q, k, v, alpha, method=method)
    y_perm = osa_lab.osa(q[perm], k[perm], v[perm], alpha, method=method)
    assert rel_err(y_perm, y[perm]) <= 1e-10


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 3), st.integers(2, 20), st.integers(0, 10_000), METHODS)
def test_batch_and_head_independence(batch, heads, n, seed, method):
    g = torch.Generator().manual_seed(seed)
    r, d = 3, 4
    q = torch.randn(batch, heads, n, r, generator=g, dtype=torch.float64)
    k = torch.randn(batch, heads, n, r, generator=g, dtype=torch.float64)
    v = torch.randn(batch, heads, n, d, generator=g, dtype=torch.float64)
    alpha = torch.rand(heads, generator=g, dtype=torch.float64) * 2
    y = osa_lab.osa(q, k, v, alpha, method=method)
    for b in range(batch):
        for h in range(heads):
            single = osa_lab.osa(q[b, h], k[b, h], v[b, h], float(alpha[h]), method=method)
            # 1e-10, the float64 accuracy contract: a batch and a single matrix may take different
            # exponential algorithms (expm.dense_exp picks by the batch's largest norm).
            assert rel_err(y[b, h], single) <= 1e-10


# ---------------------------------------------------------------------------------------------
# α's shape never changes the output's; α's type; empty inputs
# ---------------------------------------------------------------------------------------------

ALL_METHODS = ["dense", "lowrank", "gram", "qr", "auto"]


def _heads_case():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 10, 4, dtype=torch.float64, generator=g) for _ in range(3))
    per_head = torch.tensor([0.1, -0.4, 0.7], dtype=torch.float64)
    ref = torch.stack(
        [torch.stack([osa_lab.osa(q[b, h], k[b, h], v[b, h], float(per_head[h]), method="dense") for h in range(3)]) for b in range(2)]
    )
    return q, k, v, per_head, ref


@pytest.mark.parametrize("shape", [(3,), (1, 3), (1, 1, 3), (3, 1, 1), (1, 3, 1, 1), (1, 1, 3, 1, 1)], ids=str)
@pytest.mark.parametrize("method", ["dense", "lowrank", "qr", "auto"])
def test_per_head_alpha_shapes_keep_v_shape(shape, method):
    """Was: (1, H, 1, 1), (H, 1, 1), (1, 1, H) gave outputs with extra dims, e.g. (1, 3, 2, 3, 10, 4)."""
    q, k, v, per_head, ref = _heads_case()
    y = osa_lab.osa(q, k, v, per_head.reshape(shape), method=method)
    assert y.shape == v.shape
    assert rel_err(y, ref) <= 1e-12


def test_per_batch_and_head_alpha_shapes():
    q, k, v, _, _ = _heads_case()
    alpha = torch.rand(2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ref = torch.stack([torch.stack([osa_lab.osa(q[b, h], k[b, h], v[b, h], float(alpha[b, h])) for h in range(3)]) for b in range(2)])
    for a in (alpha, alpha[..., None, None], alpha[None]):
        y = osa_lab.osa(q, k, v, a)
        assert y.shape == v.shape and rel_err(y, ref) <= 1e-12
    y = osa_lab.osa(q, k, v, alpha[:, :1])  # (B, 1): one α per batch element
    assert y.shape == v.shape


@pytest.mark.parametrize("shape", [(5, 2, 3), (2, 3, 2), (3, 1), (5,), (4, 1, 1), (2, 3, 1, 2)], ids=str)
def test_alpha_shapes_that_would_grow_the_output_are_refused(shape):
    q, k, v, _, _ = _heads_case()
    with pytest.raises(osa_lab.OSAInputError, match=r"`alpha` has shape .* without changing the output's shape"):
        osa_lab.osa(q, k, v, torch.ones(shape, dtype=torch.float64))


@pytest.mark.parametrize(
    "alpha,error",
    [
        (torch.tensor(0.5 + 0.5j), osa_lab.OSADtypeError),  # was: imaginary part silently dropped
        (torch.tensor(True), osa_lab.OSADtypeError),  # was: accepted (a bool scalar was refused)
        (torch.tensor([1.0, 2.0], dtype=torch.complex128), osa_lab.OSADtypeError),
        (0.5 + 0.5j, osa_lab.OSADtypeError),
        (True, osa_lab.OSADtypeError),
        (np.bool_(True), osa_lab.OSADtypeError),
        ("0.5", osa_lab.OSADtypeError),
        (torch.tensor(float("nan")), osa_lab.OSAInputError),
        (np.float32("inf"), osa_lab.OSAInputError),
    ],
    ids=["complex-tensor", "bool-tensor", "complex-vector", "complex", "bool", "np-bool", "str", "nan-tensor", "np-inf"],
)
def test_alpha_types_refused(alpha, error):
    q, k, v = (torch.randn(5, 3, dtype=torch.float64) for _ in range(3))
    with pytest.raises(error, match="alpha"):
        osa_lab.osa(q, k, v, alpha)


@pytest.mark.parametrize("alpha", [np.float32(0.5), np.float64(0.5), np.int64(2), 2, torch.tensor(2)], ids=str)
def test_alpha_numpy_and_integer_scalars_accepted(alpha):
    """Was: np.float32 refused while np.float64 was accepted."""
    q, k, v = (torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(i)) for i in range(3))
    assert torch.equal(osa_lab.osa(q, k, v, alpha), osa_lab.osa(q, k, v, float(alpha)))


@pytest.mark.parametrize("method", ALL_METHODS)
@pytest.mark.parametrize("shapes", [((0, 5, 3), (0, 5, 4)), ((5, 3), (5, 0)), ((2, 0, 5, 3), (2, 0, 5, 4))], ids=["batch0", "dv0", "heads0"])
def test_empty_inputs_give_empty_outputs(shapes, method):
    """Was: RuntimeError (dense with batch 0, every method with d_v = 0)."""
    qk_shape, v_shape = shapes
    q, k = (torch.randn(qk_shape, requires_grad=True) for _ in range(2))
    v = torch.randn(v_shape, requires_grad=True)
    y = osa_lab.osa(q, k, v, 0.5, method=method)
    assert y.shape == v.shape and y.dtype == v.dtype
    y.sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape and v.grad.shape == v.shape


def test_zero_tokens_and_bad_shapes_get_typed_errors():
    with pytest.raises(osa_lab.OSAInputError, match="N=0 tokens"):
        osa_lab.lowrank_action(torch.randn(0, 4), torch.zeros(4, 4), torch.randn(0, 2))  # was RuntimeError
    with pytest.raises(osa_lab.OSAInputError, match=r"`q` has shape \(5,\); osa_matrix needs"):
        osa_lab.osa_matrix(torch.randn(5), torch.randn(5))  # was RuntimeError
    with pytest.raises(osa_lab.OSAInputError, match="must match"):
        osa_lab.osa_matrix(torch.randn(5, 2), torch.randn(5, 3))
    with pytest.raises(osa_lab.OSAInputError, match="do not broadcast"):
        osa_lab.lowrank_action(torch.randn(2, 5, 4), torch.zeros(3, 4, 4), torch.randn(5, 2))
    assert osa_lab.lowrank_action(torch.randn(5, 4), torch.zeros(4, 4), torch.randn(5, 0)).shape == (5, 0)
