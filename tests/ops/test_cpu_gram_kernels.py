"""The CPU kernels of the Gram engine's token passes (``osa_lab.ops.cpu.gram_kernels``) against
their references: float64 products for each pass, over grids of batch, N, widths, thread counts
(the split of a matrix's tokens over threads when the batch is small) and layouts; and the whole
low-rank OSA, output and gradients, with the kernels and on the torch path (``OSA_LAB_CPU_KERNELS=0``)
against float64 dense ``torch.linalg.matrix_exp``.

The kernels are built by the machine's C compiler; without one these tests are skipped. The passes
run, and are tested, only on a build with hardware vectors (AVX-512 or AVX2 with FMA,
``gram_kernels.usable``); on another build they refuse every tensor, and osa() keeps the torch
path (tests/ops/test_cpu_builds.py checks that on a generic x86-64 build).
tests/ops/test_cpu_builds.py runs this file again on the AVX2 build (``OSA_LAB_CPU_MARCH``).
"""

from __future__ import annotations

import os
import shutil
from unittest import mock

import pytest
import torch

import osa_lab
from osa_lab.errors import OSAInputError
from osa_lab.ops import expm
from osa_lab.ops.cpu import build, gram_kernels
from tests.helpers import rel_err

HAVE_COMPILER = shutil.which(os.environ.get("CC", "cc")) is not None
pytestmark = pytest.mark.skipif(not HAVE_COMPILER, reason="no C compiler: the kernels cannot be built here")


def _vector_build() -> bool:
    lib = build.library()
    return lib is not None and lib.osa_gram_vector_floats() in gram_kernels.VECTOR_FLOATS


needs_vector_build = pytest.mark.skipif(
    not (HAVE_COMPILER and _vector_build()), reason="osa() takes the kernels only from an AVX-512 or AVX2 build"
)


def _tokens(b: int, n: int, widths: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, n, w, generator=g) for w in widths]


@needs_vector_build
@pytest.mark.parametrize(("b", "n"), [(1, 1), (3, 17), (2, 700), (5, 256), (1, 3000)])
@pytest.mark.parametrize(("r", "d"), [(16, 16), (64, 64), (32, 48)])
@pytest.mark.parametrize("nthreads", [1, 2, 3])
def test_transposed_products_match_float64(b, n, r, d, nthreads, torch_threads_for_test):
    """``qᵀ[q k v]`` and ``kᵀ[k v]`` in one pass, within float32 summation error of float64; with
    fewer matrices than threads the tokens of a matrix are split over threads."""
    torch_threads_for_test(nthreads)
    q, k, v = _tokens(b, n, (r, r, d), seed=n + r + d)
    top, bottom = gram_kernels.transposed_products((q, k, v), (0, 1))
    qd, kd, vd = q.double(), k.double(), v.double()
    want_top = torch.cat([qd.mT @ qd, qd.mT @ kd, qd.mT @ vd], -1)
    want_bottom = torch.cat([kd.mT @ kd, kd.mT @ vd], -1)
    scale = max(n, 1) ** 0.5 * 4e-7  # float32 sums of n products: error ≲ √n·eps relative to the entries' scale
    assert top.shape == (b, r, 2 * r + d) and bottom.shape == (b, r, r + d)
    assert (top.double() - want_top).abs().max() <= scale * want_top.abs().max() + 1e-6
    assert (bottom.double() - want_bottom).abs().max() <= scale * want_bottom.abs().max() + 1e-6
    # qᵀq and kᵀk: computed on and above the diagonal, mirrored: exactly symmetric
    assert torch.equal(top[..., :r], top[..., :r].mT) and torch.equal(bottom[..., :r], bottom[..., :r].mT)


@needs_vector_build
@pytest.mark.parametrize("firsts", [(0,), (1,), (2,), (0, 0), (1, 1), (0, 2), (2, 2)])
@pytest.mark.parametrize("nthreads", [1, 5])
def test_transposed_products_for_every_choice_of_firsts(firsts, nthreads, torch_threads_for_test):
    """Each ``X_aᵀ [X_lo … X_last]``, widths above 64 included, batch below and above the threads."""
    torch_threads_for_test(nthreads)
    xs = _tokens(3, 530, (32, 80, 128), seed=11)
    outs = gram_kernels.transposed_products(xs, firsts)
    for a, (out, lo) in enumerate(zip(outs, firsts, strict=True)):
        want = xs[a].double().mT @ torch.cat([x.double() for x in xs[lo:]], -1)
        assert out.shape == want.shape and rel_err(out, want) < 1e-5, (a, lo)


@needs_vector_build
def test_token_passes_read_expanded_views():
    """A view with a zero stride (an expanded v or gY) is read in place."""
    q, k = _tokens(2, 300, (16, 16), seed=5)
    v = torch.randn(2, 1, 32).expand(2, 300, 32)
    top, bottom = gram_kernels.transposed_products((q, k, v), (0, 1))
    assert rel_err(top, torch.cat([q.mT @ q, q.mT @ k, q.mT @ v], -1)) < 1e-5
    out = torch.empty(2, 300, 32)
    c = torch.randn(2, 32, 32)
    gram_kernels.token_products([(torch.cat([q, k], -1), c)], out, add=v)
    assert rel_err(out, v + torch.cat([q, k], -1) @ c) < 1e-5


@needs_vector_build
def test_an_empty_batch_gives_empty_results():
    q, k, v = (torch.randn(0, 300, w) for w in (16, 16, 32))
    g, p = expm.gram_and_projection(q, k, v)
    assert g.shape == (0, 32, 32) and p.shape == (0, 32, 32)
    assert expm.gram_output(q, k, torch.randn(0, 32, 32), v).shape == (0, 300, 32)


@needs_vector_build
@pytest.mark.parametrize("nthreads", [1, 2, 3])
def test_transposed_products_of_a_later_view_only(nthreads, torch_threads_for_test):
    """``firsts = (2, 2)``: ``qᵀ g`` and ``kᵀ g``, the backward's ``gC = Uᵀ gY``."""
    torch_threads_for_test(nthreads)
    q, k, g = _tokens(2, 900, (32, 32, 16), seed=3)
    out_q, out_k = gram_kernels.transposed_products((q, k, g), (2, 2))
    assert rel_err(out_q.double(), q.double().mT @ g.double()) < 1e-5
    assert rel_err(out_k.double(), k.double().mT @ g.double()) < 1e-5


@needs_vector_build
@pytest.mark.parametrize(("b", "n"), [(1, 1), (3, 17), (2, 700), (1, 3001)])
@pytest.mark.parametrize("terms", [1, 2, 4])
@pytest.mark.parametrize("add", [True, False])
@pytest.mark.parametrize("nthreads", [1, 3, 5])
@pytest.mark.parametrize("d", [16, 32, 64, 80])
def test_token_products_match_float64(b, n, terms, add, nthreads, d, torch_threads_for_test):
    torch_threads_for_test(nthreads)
    widths = (16, 32, 48, 7)[:terms]
    xs = _tokens(b, n, (*widths, d), seed=b + n + terms)
    g = torch.Generator().manual_seed(7)
    cs = [torch.randn(b, w, d, generator=g) for w in widths]
    out = torch.full((b, n, d), float("nan"))
    squares = torch.full((b,), float("nan"), dtype=torch.float64) if add else None
    gram_kernels.token_products(
        list(zip(xs[:terms], cs, strict=True)), out, add=xs[-1] if add else None, add_squares=squares
    )
    want = sum(x.double() @ c.double() for x, c in zip(xs, cs, strict=False)) + (xs[-1].double() if add else 0)
    assert rel_err(out.double(), want) < 1e-6
    if add:  # Σ add² per matrix from the same read (summed over token ranges when they are split)
        assert torch.allclose(squares, xs[-1].double().pow(2).sum((-2, -1)), rtol=1e-6)


@needs_vector_build
def test_kernels_read_and_write_head_split_views():
    """A layer's q, k, v are head-split views of one projection; the output a merged-heads view."""
    b, n, heads, width = 2, 300, 4, 32
    qkv = torch.randn(b, n, 3, heads, width)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (b, heads, n, width), not contiguous
    assert not q.is_contiguous()
    top, bottom = gram_kernels.transposed_products((q, k, v), (0, 1))
    assert rel_err(top, torch.cat([q.mT @ q, q.mT @ k, q.mT @ v], -1)) < 1e-5
    assert rel_err(bottom, torch.cat([k.mT @ k, k.mT @ v], -1)) < 1e-5
    c = torch.randn(b, heads, 2 * width, width)
    out = torch.empty(b, n, heads, width).transpose(1, 2)
    gram_kernels.token_products([(q, c[..., :width, :]), (k, c[..., width:, :])], out, add=v)
    assert rel_err(out, v + q @ c[..., :width, :] + k @ c[..., width:, :]) < 1e-5


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda: (torch.randn(2, 9, 8), torch.randn(2, 9, 8)), "width not a multiple of 16"),
        (lambda: (torch.randn(2, 9, 16, dtype=torch.float64),) * 2, "float64"),
        (lambda: (torch.randn(2, 16, 9).mT, torch.randn(2, 9, 16)), "columns not contiguous"),
        (lambda: (torch.randn(2, 9, 16), torch.randn(2, 10, 16)), "different N"),
        (lambda: (torch.randn(2, 9, 16), torch.randn(3, 9, 16)), "different batch"),
        (lambda: (torch.nn.Parameter(torch.randn(2, 9, 16)),), "a subclass"),
    ],
)
@needs_vector_build
def test_usable_refuses_what_the_kernels_cannot_read(make, why):
    assert gram_kernels.usable(torch.randn(2, 9, 16), torch.randn(2, 9, 32))  # what they can read
    assert not gram_kernels.usable(*make()), why
    assert not gram_kernels.usable(torch.randn(0, 9, 16)), "an empty batch"


@needs_vector_build
def test_the_passes_refuse_what_they_cannot_read():
    """Called directly, the passes check what usable() checks, and the shapes of add and out."""
    with pytest.raises(OSAInputError, match="cannot read"):
        gram_kernels.transposed_products((torch.randn(1, 300, 16), torch.randn(1, 10, 16)), (0,))
    with pytest.raises(OSAInputError, match="cannot read"):
        gram_kernels.transposed_products((torch.randn(1, 16, 300).mT,), (0,))
    q = torch.randn(1, 9, 16)
    with pytest.raises(OSAInputError, match="differ in shape"):
        gram_kernels.token_products([(q, torch.randn(1, 16, 32))], torch.empty(1, 9, 32), add=torch.randn(1, 9, 16))
    with pytest.raises(OSAInputError, match="overlaps itself"):
        gram_kernels.token_products([(q, torch.randn(1, 16, 16))], torch.empty(1, 1, 16).expand(1, 9, 16))


@needs_vector_build
def test_usable_takes_head_split_views_on_a_vector_build():
    qkv = torch.randn(2, 30, 3, 4, 16)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    assert gram_kernels.usable(q, k, v)
    assert gram_kernels.usable(torch.randn(2, 9, 16), torch.randn(2, 9, 32))


def test_usable_is_false_when_the_kernels_are_turned_off(monkeypatch):
    monkeypatch.setenv("OSA_LAB_CPU_KERNELS", "0")
    assert not gram_kernels.usable(torch.randn(2, 9, 16))


@needs_vector_build
def test_bad_arguments_raise_a_clear_error():
    q = torch.randn(2, 9, 16)
    with pytest.raises(OSAInputError, match="does not fit"):
        gram_kernels.token_products([(q, torch.randn(2, 16, 32))], torch.empty(2, 9, 16))
    with pytest.raises(OSAInputError, match="1–4 terms"):
        gram_kernels.token_products([], torch.empty(2, 9, 16))
    with pytest.raises(OSAInputError, match="add_squares"):
        gram_kernels.token_products([(q, torch.randn(2, 16, 16))], torch.empty(2, 9, 16), add_squares=torch.zeros(2))
    with pytest.raises(OSAInputError, match="1–3 token tensors"):
        gram_kernels.transposed_products((q,), (0, 0))
    with pytest.raises(OSAInputError, match="must index"):
        gram_kernels.transposed_products((q, q), (0, 2))


def _osa_run(q, k, v, alpha, grad, *, native: bool, monkeypatch):
    monkeypatch.setenv("OSA_LAB_CPU_KERNELS", "1" if native else "0")
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v, alpha)]
    spies = (
        mock.patch.object(gram_kernels, "transposed_products", wraps=gram_kernels.transposed_products),
        mock.patch.object(gram_kernels, "token_products", wraps=gram_kernels.token_products),
    )
    with spies[0] as transposed, spies[1] as token:
        y = osa_lab.osa(*leaves)
        y.backward(grad)
    return y.detach(), [t.grad for t in leaves], (transposed.call_count, token.call_count)


@needs_vector_build
@pytest.mark.parametrize(("b", "n", "r", "d"), [(3, 300, 16, 32), (1, 700, 32, 16), (1, 600, 64, 64)])
@pytest.mark.parametrize("norm", [0.5, 20.0, 300.0])
def test_low_rank_osa_with_the_kernels_matches_the_torch_path_and_float64(b, n, r, d, norm, monkeypatch):
    """Output and gradients of q, k, v and α of the whole low-rank OSA (N > 4r: the Gram engine)."""
    g = torch.Generator().manual_seed(n + r)
    q, k = (torch.randn(b, n, r, generator=g) / r**0.5 for _ in range(2))
    v = torch.randn(b, n, d, generator=g)
    s_two = float(torch.linalg.matrix_norm(expm.skew_symmetric_from_qk(q.double(), k.double(), 1.0), ord=2).amax())
    alpha = torch.tensor(norm / s_two)
    grad = torch.randn(b, n, d, generator=g)
    y_c, grads_c, calls_c = _osa_run(q, k, v, alpha, grad, native=True, monkeypatch=monkeypatch)
    y_t, grads_t, calls_t = _osa_run(q, k, v, alpha, grad, native=False, monkeypatch=monkeypatch)
    # forward (Gram pass, output) and backward (gC; ∂V, ∂q, ∂k) took the kernels, or none of them did
    assert calls_c[0] >= 2 and calls_c[1] >= 4 and calls_t == (0, 0)
    leaves = [t.double().requires_grad_(True) for t in (q, k, v, alpha)]
    s = expm.skew_symmetric_from_qk(leaves[0], leaves[1], leaves[3])
    y_ref = torch.linalg.matrix_exp(s) @ leaves[2]
    y_ref.backward(grad.double())
    y_ref = y_ref.detach()
    budget = max(2e-6, 1e-7 * norm) * 4  # the float32 accuracy target (docs/osa.md) with a margin
    assert rel_err(y_c, y_ref) < budget and rel_err(y_t, y_ref) < budget
    assert rel_err(y_c, y_t) < budget
    for got_c, got_t, leaf in zip(grads_c, grads_t, leaves, strict=True):
        assert rel_err(got_c, leaf.grad) < 50 * budget
        assert rel_err(got_c, got_t) < 50 * budget


@needs_vector_build
def test_torch_compile_of_low_rank_osa_runs_the_torch_path_while_tracing():
    """Under torch.compile the passes see no real tensors while dynamo traces: usable() says no
    there, and the compiled function agrees with eager (output and gradients)."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 300, 16, generator=g) / 4 for _ in range(2))
    v = torch.randn(2, 300, 32, generator=g)
    alpha = torch.tensor(0.3)
    eager = [t.clone().requires_grad_(True) for t in (q, k, v)]
    compiled = [t.clone().requires_grad_(True) for t in (q, k, v)]
    y_e = osa_lab.osa(*eager, alpha)
    y_c = torch.compile(osa_lab.osa, backend="eager")(*compiled, alpha)
    y_e.sum().backward()
    y_c.sum().backward()
    assert rel_err(y_c.detach(), y_e.detach()) < 1e-5
    for got, want in zip(compiled, eager, strict=True):
        assert rel_err(got.grad, want.grad) < 1e-4
