"""Pytest setup and fixtures shared by all tests (the one conftest of the suite).

Shared input builders and error measures live in ``tests/helpers.py``.

Triton's CPU interpreter must be chosen before triton is imported anywhere in the process
(docs/design.md §7): without a CUDA device, the Triton kernel tests run in the interpreter. The
variable only changes how Triton kernels execute; nothing else reads it.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# ------------------------------------------------------------------------------------------------
# shared fixtures
# ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _one_thread():
    """torch on one intra-op thread inside the block (torch alone: the core's tests need no lab)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread_by_default():
    """The tests run on one intra-op thread: `make test` runs two pytest workers on a 2-core
    machine, and two threads per worker over-subscribe it (the OpenMP pools spin against each
    other; an exact 1,024 × 1,024 layer Jacobian took 13× longer on two threads beside other work
    than on one). A test that wants more threads sets them with ``torch_threads_for_test``."""
    with _one_thread():
        yield


@pytest.fixture
def one_torch_thread():
    """torch on one intra-op thread for the test: the tests' matrices are small and extra threads
    only contend on a shared 2-core machine (QR up to 25× slower). Use it for a whole module with
    ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    with _one_thread():
        yield


@pytest.fixture
def torch_threads_for_test():
    """``set(n)`` sets torch's intra-op threads for the rest of the test; the count before is
    restored after it (the kernels' split of work over threads)."""
    import torch

    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.fixture
def cpu_kernels_in_use():
    """Skips the test where the small-N action's CPU kernels are not in use here (no C compiler,
    or turned off); checked when the test runs, so collecting it builds nothing."""
    from osa_lab.ops import cpu

    if not cpu.usable(*(torch.ones(1, 2, 2) for _ in range(3))):
        pytest.skip(f"the CPU kernels are not in use here ({cpu.status()})")


@pytest.fixture(scope="module")
def one_torch_thread_per_module():
    """:func:`one_torch_thread` for a whole module, module-scoped fixtures included (training)."""
    with _one_thread():
        yield
