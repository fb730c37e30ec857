"""osa() under torch.func (vmap, jacrev, jacfwd, hessian) and the public-API reads behind it:
:func:`expm.transformed` and :func:`expm.concrete` (autograd.Function's torch.func support)."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import forward_ad
from torch.func import grad, hessian, jacfwd, jacrev, vmap

import osa_lab
from osa_lab.ops import expm
from tests.helpers import rel_err


def _seen(t: torch.Tensor, record: list) -> torch.Tensor:
    """Record ``(transformed(t), concrete(t))`` and return a function of ``t`` to transform."""
    record.append((expm.transformed(t), expm.concrete(t)))
    return (t * t).sum()


def test_concrete_is_the_tensor_itself_outside_transforms():
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert expm.concrete(x) is x and not expm.transformed(x)
    leaf = x.clone().requires_grad_()
    assert expm.concrete(leaf) is leaf and not expm.transformed(leaf * 2)
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x, torch.ones_like(x))
        assert not expm.transformed(dual) and expm.under_transform(dual)  # forward-mode AD is seen apart


@pytest.mark.parametrize(
    "name", ["vmap", "vmap-dim1", "vmap-vmap", "grad", "jacrev", "jacfwd", "hessian", "vmap-grad"]
)
def test_concrete_reads_the_values_below_every_transform(name):
    """Under every transform the value is a plain tensor (no wrapper left) holding every value of
    the vmapped batch: the sum of all its entries is the input's."""
    x = torch.arange(24, dtype=torch.float64).reshape(2, 3, 4) / 7
    record: list = []
    f = lambda t: _seen(t, record)  # noqa: E731
    runs = {
        "vmap": lambda: vmap(f)(x),
        "vmap-dim1": lambda: vmap(f, in_dims=1)(x),
        "vmap-vmap": lambda: vmap(vmap(f))(x),
        "grad": lambda: grad(f)(x),
        "jacrev": lambda: jacrev(f)(x),
        "jacfwd": lambda: jacfwd(f)(x),
        "hessian": lambda: hessian(f)(x),
        "vmap-grad": lambda: vmap(grad(f))(x),
    }
    runs[name]()
    assert record
    for wrapped, value in record:
        assert wrapped
        assert not expm.transformed(value) and value.numel() == x.numel()
        assert float(value.sum()) == pytest.approx(float(x.sum()), rel=1e-15)
    if name == "vmap-dim1":  # the vmapped dimension comes first
        assert torch.equal(record[0][1], x.movedim(1, 0))


def test_any_row_sees_the_whole_vmapped_batch():
    """One True in one sample: any_row is True for every sample's call (the loop's "any" over the batch)."""
    mask = torch.zeros(4, 3, dtype=torch.bool)
    mask[2, 1] = True
    answers = []

    def f(m):
        answers.append(expm.any_row(m))
        return m.float()

    vmap(f)(mask)
    assert answers == [True]
    vmap(f)(torch.zeros_like(mask))
    assert answers == [True, False]


def test_the_default_path_never_reads_through_the_transform_machinery(monkeypatch):
    """Outside torch.func, osa() forward and backward (with a float64 recompute and a QR fallback)
    never call the whole-batch reader: no autograd.Function is added to the hot path."""

    def refuse(*args):
        raise AssertionError("the whole-batch reader ran outside torch.func")

    monkeypatch.setattr(expm.batch._WholeBatch, "apply", refuse)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(3, 64, 8, generator=g) for _ in range(3))
    q[1] *= 1e3  # ‖S‖₂ above FLOAT64_NORM: recomputed in float64
    k[2] = q[2]  # rank-deficient: the QR fallback
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    y = osa_lab.osa(*leaves, 1.0, method="lowrank")
    y.sum().backward()
    assert torch.isfinite(y).all() and all(torch.isfinite(t.grad).all() for t in leaves)


def _float64_case():
    """Three samples (N = 64, r = 8, d = 4, float32): sample 1 alone has ‖S‖₂ above FLOAT64_NORM
    (q and k scaled alike, so that [q k] stays well-conditioned and the Gram engine accepts it)."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(3, 1, 64, 8, generator=g) for _ in range(3))
    q[1] *= 30
    k[1] *= 30
    two = [float(torch.linalg.matrix_norm(expm.skew_symmetric_from_qk(q[i].double(), k[i].double(), 1.0), 2).max())
           for i in range(3)]  # fmt: skip
    assert two[1] > expm.FLOAT64_NORM > 10 * max(two[0], two[2])
    return q, k, v


@pytest.mark.parametrize("method", ["lowrank", "gram", "qr", "auto"])
def test_vmap_recomputes_only_the_samples_that_need_float64(method, monkeypatch):
    """vmap over a batch where one sample needs float64: that sample alone is recomputed (the
    decision reads the whole vmapped batch), and vmap equals the loop over the samples."""
    q, k, v = _float64_case()
    f = lambda a, b, c: osa_lab.osa(a, b, c, 1.0, method=method)  # noqa: E731
    loop = torch.stack([f(*x) for x in zip(q, k, v, strict=True)])
    calls = []
    replace = expm.replace_rows

    def spy(y, mask, compute):
        calls.append((compute.__name__, expm.concrete(mask).reshape(-1).tolist()))
        return replace(y, mask, compute)

    for room in (expm.dispatch, expm.qr):
        monkeypatch.setattr(room, "replace_rows", spy)
    got = vmap(f)(q, k, v)
    recompute = "again" if method == "qr" else "in_float64"
    assert [mask for what, mask in calls if what == recompute] == [[False, True, False]]
    ref = osa_lab.osa(q.double(), k.double(), v.double(), 1.0, method="dense")
    for sample in range(3):
        assert rel_err(got[sample], loop[sample]) <= 1e-6, sample
        assert rel_err(got[sample], ref[sample]) <= 2e-6, sample


def _second_order_case(n: int):
    g = torch.Generator().manual_seed(n)
    q, k, v, w = (torch.randn(n, 2, dtype=torch.float64, generator=g) for _ in range(4))
    return q, k, v, w, torch.tensor(0.7, dtype=torch.float64)


@pytest.mark.parametrize("method", ["lowrank", "gram", "qr", "auto"])
@pytest.mark.parametrize("n", [6, 20])  # r = 2: N ≤ 4r (the N×N Chebyshev action), N > 4r (low-rank engines)
@pytest.mark.parametrize("transform", ["jacrev", "jacfwd", "hessian"])
def test_jacobians_and_hessian_match_dense_float64(method, n, transform):
    """torch.func.jacrev / jacfwd of osa() with respect to q, k, v and α, and torch.func.hessian
    of ⟨w, osa()⟩ with respect to q and α, equal those of dense float64 ``matrix_exp``."""
    q, k, v, w, alpha = _second_order_case(n)

    def f(meth):
        return lambda q_, k_, v_, a_: osa_lab.osa(q_, k_, v_, a_, method=meth)

    def loss(meth):
        return lambda q_, a_: (f(meth)(q_, k, v, a_) * w).sum()

    if transform == "hessian":
        got, want = (hessian(loss(m), argnums=(0, 1))(q, alpha) for m in (method, "dense"))
        pairs = [(got[i][j], want[i][j]) for i in range(2) for j in range(2)]
    else:
        jac = jacrev if transform == "jacrev" else jacfwd
        got, want = (jac(f(m), argnums=(0, 1, 2, 3))(q, k, v, alpha) for m in (method, "dense"))
        pairs = list(zip(got, want, strict=True))
    for i, (a, b) in enumerate(pairs):
        assert torch.isfinite(a).all() and rel_err(a, b) <= 1e-9, (i, rel_err(a, b))


@pytest.mark.parametrize("method", ["lowrank", "gram", "qr", "auto"])
@pytest.mark.parametrize("n", [6, 20])
def test_forward_mode_ad_matches_dense_float64(method, n):
    """Forward-mode AD (torch.autograd.forward_ad) through osa(): the directional derivative in
    q, k, v and α at once equals dense float64's."""
    q, k, v, _, alpha = _second_order_case(n)
    g = torch.Generator().manual_seed(2)
    tangents = [torch.randn(t.shape, dtype=torch.float64, generator=g) for t in (q, k, v, alpha)]
    out = []
    for meth in (method, "dense"):
        with forward_ad.dual_level():
            duals = [forward_ad.make_dual(t, dt) for t, dt in zip((q, k, v, alpha), tangents, strict=True)]
            out.append(forward_ad.unpack_dual(osa_lab.osa(*duals, method=meth)).tangent)
    assert rel_err(out[0], out[1]) <= 1e-9
