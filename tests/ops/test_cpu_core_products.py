"""The float64 products of the core's exponential on the CPU (``osa_lab.ops.cpu.core_kernels``)
against ``torch.matmul`` / ``torch.baddbmm``: exact on small-integer matrices (every product and
sum exact in float64), within rounding on random ones, over sizes, batches, thread counts and
``alpha``/``add``; and ``skew_exp`` with them against the torch path and the dense reference.

The kernels are built by the machine's C compiler and used from a build with hardware vectors
(AVX-512, or AVX2 with FMA); elsewhere these tests are skipped. tests/ops/test_cpu_builds.py runs
this file again on the AVX2 build (``OSA_LAB_CPU_MARCH``).
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from osa_lab.errors import OSAInputError
from osa_lab.ops import expm
from osa_lab.ops.cpu import build, core_kernels
from tests.helpers import rel_err

HAVE_COMPILER = shutil.which(os.environ.get("CC", "cc")) is not None


def _vector_build() -> bool:
    lib = build.library()
    return lib is not None and lib.osa_core_vector_doubles() in core_kernels.VECTOR_DOUBLES


pytestmark = pytest.mark.skipif(not (HAVE_COMPILER and _vector_build()), reason="the products run on AVX-512 and AVX2 builds")


@pytest.mark.parametrize("n", [8, 16, 64, 128, 136])
@pytest.mark.parametrize("batch", [1, 3, 32])
@pytest.mark.parametrize("nthreads", [1, 3])
def test_products_of_small_integers_are_exact(n, batch, nthreads, torch_threads_for_test):
    torch_threads_for_test(nthreads)
    g = torch.Generator().manual_seed(n + batch)
    a, b, x = (torch.randint(-8, 9, (batch, n, n), generator=g).double() for _ in range(3))
    out = torch.full_like(a, float("nan"))
    assert torch.equal(core_kernels.matmul(a, b, out), a @ b)
    assert torch.equal(core_kernels.matmul(a, b, out, alpha=0.5, add=x), 0.5 * (a @ b) + x)


def test_add_may_be_out():
    g = torch.Generator().manual_seed(1)
    a, b, x = (torch.randint(-8, 9, (4, 64, 64), generator=g).double() for _ in range(3))
    want = 2.0 * (a @ b) + x
    assert torch.equal(core_kernels.matmul(a, b, x, alpha=2.0, add=x), want)


@pytest.mark.parametrize("n", [16, 128])
def test_random_products_agree_with_torch_to_rounding(n):
    a, b = (torch.randn(5, n, n, dtype=torch.float64) for _ in range(2))
    out = torch.empty_like(a)
    assert rel_err(core_kernels.matmul(a, b, out), a @ b) < 1e-14


@pytest.mark.parametrize(
    "make",
    [
        lambda: (torch.randn(2, 12, 12, dtype=torch.float64),),  # n not a multiple of 8
        lambda: (torch.randn(2, 16, 16),),  # float32
        lambda: (torch.randn(2, 16, 16, dtype=torch.float64).mT,),  # not contiguous
        lambda: (torch.randn(16, 16, dtype=torch.float64),),  # not a batch
        lambda: (torch.randn(2, 16, 8, dtype=torch.float64),),  # not square
        lambda: (torch.randn(2, 16, 16, dtype=torch.float64), torch.randn(3, 16, 16, dtype=torch.float64)),
    ],
)
def test_usable_refuses_what_the_products_cannot_take(make):
    assert core_kernels.usable(torch.randn(2, 16, 16, dtype=torch.float64))
    assert not core_kernels.usable(*make())


def test_bad_arguments_raise_a_clear_error():
    a = torch.randn(2, 16, 16, dtype=torch.float64)
    with pytest.raises(OSAInputError, match="must not be"):
        core_kernels.matmul(a, a.clone(), a)
    with pytest.raises(OSAInputError, match="multiple of 8"):
        core_kernels.matmul(a, a, torch.empty(2, 16, 16))


@pytest.mark.parametrize("norm", [0.3, 5.0, 300.0])
def test_skew_exp_with_the_products_matches_the_torch_path_and_dense(norm, monkeypatch):
    """The core's exponential through the scratch path (the products the kernels take) with the
    kernels and without, against float64 ``torch.linalg.matrix_exp``."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, 128, 128, generator=g, dtype=torch.float64)
    m = x - x.mT
    m = m * (norm / torch.linalg.matrix_norm(m, ord=2).amax())
    want = torch.linalg.matrix_exp(m)
    got = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("OSA_LAB_CPU_KERNELS", flag)
        got[flag] = expm.core_skew_exp(m)
    assert rel_err(got["1"], want) < 1e-12 * max(1.0, norm)
    assert rel_err(got["1"], got["0"]) < 1e-12 * max(1.0, norm)
