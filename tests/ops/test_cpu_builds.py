"""The CPU kernels' builds (``osa_lab.ops.cpu.build``): the instruction set named by
``OSA_LAB_CPU_MARCH``, what happens to a name the compiler refuses or that is not a ``-march``
name, and the kernels' tests run again on the AVX2 build; separate builds in one process
(``compile_library``, ``using_library``), as ``benchmarks/cpu_build_ab.py`` times them.

The default build is ``-march=native``; on an AVX-512 machine the AVX2 build (8-float vectors,
16 registers, its own register blocks) would otherwise go untested. The ``OSA_LAB_CPU_MARCH``
cases run in fresh processes (the default library is built once per process).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import osa_lab
from osa_lab.errors import ConfigurationError, MethodUnavailableError
from osa_lab.ops.cpu import build
from osa_lab.ops.cpu import kernels as cpu_kernels
from tests.helpers import rel_err

ROOT = Path(__file__).resolve().parents[2]
HAVE_COMPILER = shutil.which(os.environ.get("CC", "cc")) is not None
pytestmark = pytest.mark.skipif(not HAVE_COMPILER, reason="no C compiler: the kernels cannot be built here")

_REPORT = """
import json
import torch
from osa_lab.ops.cpu import build, core_kernels, gram_kernels, kernels
lib = build.library()
x = torch.ones(2, 20, 4)
print(json.dumps({"status": build.status(), "built": lib is not None,
                  "floats": lib.osa_gram_vector_floats() if lib else None,
                  "doubles": lib.osa_core_vector_doubles() if lib else None,
                  "token_passes": gram_kernels.usable(torch.ones(2, 40, 16)),
                  "core_products": core_kernels.usable(torch.ones(2, 16, 16, dtype=torch.float64)),
                  "small_n_action": kernels.usable(x, x, x)}))
"""


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _env(march: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OSA_LAB_CPU_MARCH=march)
    env.pop("OSA_LAB_CPU_KERNELS", None)
    return env


def _report(march: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _REPORT], capture_output=True, text=True, timeout=300, env=_env(march))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("march", ["native -O0", "x86-64;true", "", "a" * 80])
def test_a_value_that_is_not_a_march_name_is_not_passed_to_the_compiler(march):
    report = _report(march)
    if march == "":  # unset or empty: the default target
        assert report["status"].startswith("built with") and "-march=native" in report["status"], report
        return
    assert not report["built"], report
    assert "is not a -march name" in report["status"] and "PyTorch path" in report["status"], report


def test_a_target_the_compiler_refuses_is_not_replaced_by_another():
    """A named target that does not build leaves the PyTorch path (no silent generic build), and
    the status carries the compiler's reason."""
    report = _report("no-such-cpu-kind")
    assert not report["built"], report
    assert report["status"].startswith("build failed") and "no-such-cpu-kind" in report["status"], report


AVX2_MACHINE = {"avx2", "fma"} <= _cpu_flags()
X86_64 = "lm" in _cpu_flags()  # any x86-64 CPU runs the generic x86-64 build


@pytest.mark.skipif(not X86_64, reason="not an x86-64 CPU")
@pytest.mark.parametrize("march", ["x86-64", build.GENERIC])
def test_a_build_without_hardware_vectors_keeps_the_torch_passes(march):
    """The generic x86-64 build and the default build's last resort (no ``-march``, no OpenMP)
    (SSE2: the kernels' vectors emulated) say 0 floats and 0 doubles per vector, and the token
    passes, core products and small-N action refuse every tensor there (the small-N action ran
    10–20× slower than the torch path on such builds)."""
    report = _report(march)
    assert report["built"], report
    if march == build.GENERIC:
        assert "-march" not in report["status"] and "-fopenmp" not in report["status"], report
    else:
        assert "-march=x86-64 " in report["status"] + " ", report
    assert (report["floats"], report["doubles"]) == (0, 0), report
    assert not report["token_passes"] and not report["core_products"], report
    assert not report["small_n_action"], report
    if AVX2_MACHINE:  # the same tensors on the default build of a vector machine: the kernel is used
        native = _report("native")
        assert native["floats"] in (8, 16) and native["small_n_action"], native


@pytest.mark.skipif(not AVX2_MACHINE, reason="this CPU cannot run an AVX2 build")
def test_the_avx2_build_has_8_float_vectors_and_passes_the_kernel_tests():
    report = _report("x86-64-v3")
    assert report["built"] and "-march=x86-64-v3" in report["status"], report
    assert (report["floats"], report["doubles"]) == (8, 4), report
    assert report["token_passes"] and report["core_products"], report
    files = ["tests/ops/test_cpu_gram_kernels.py", "tests/ops/test_cpu_core_products.py", "tests/ops/test_cpu_kernels.py"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *files],
        capture_output=True, text=True, timeout=900, cwd=ROOT, env=_env("x86-64-v3"),
    )  # fmt: skip
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    # the kernels ran: no test skipped for want of a build (the only skips are the small-N
    # action's shapes outside its range, as on any build)
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("small-N action runs for" in line for line in skips), skips


@pytest.mark.parametrize(
    ("march", "defines", "says"),
    [
        ("native -O0", None, "not a -march name"),
        ("native", {"MR;x": 3}, "not a register block"),
        ("native", {"VW": 4}, "not a register block"),
        ("native", {"MR": "3"}, "integer from 1 to 16"),
        ("native", {"MR": 0}, "integer from 1 to 16"),
        ("native", {"TN_VECS": 9}, "integer from 1 to 8"),
        ("native", {"TN_ROWS": 3}, "must divide 16"),
        ("native", {"CORE_ROWS": 16}, "must divide 8"),
        ("native", {"CORE_ROWS": 6}, "must divide 8"),
        ("native", {"PREFETCH_AHEAD": 9}, "integer from 0 to 8"),
        ("native", {"PREFETCH_AHEAD": -1}, "integer from 0 to 8"),
    ],
)
def test_compile_library_refuses_what_it_would_not_build(march, defines, says):
    with pytest.raises(ConfigurationError, match=says):
        build.compile_library(march, defines)


def test_compile_library_says_why_the_compiler_refused():
    with pytest.raises(MethodUnavailableError, match="no-such-cpu-kind"):
        build.compile_library("no-such-cpu-kind")


def test_using_library_takes_only_a_compiled_library():
    with pytest.raises(ConfigurationError, match="compile_library"):
        with build.using_library(object()):
            pass


def test_using_library_switches_the_kernels_for_the_block_and_thread_only(monkeypatch):
    """Inside the block the small-N kernels' forward and backward take the other build (spied),
    status() names it, another thread keeps the default, and the results agree with the default
    build's to float32 rounding (the builds differ in register blocks, not in the order of sums)."""
    default = build.library()
    if default is None:
        pytest.skip(f"CPU kernels: {build.status()}")
    other = build.compile_library(defines={"MR": 2})
    assert other is not default
    taken: list = []
    for name in ("library", "loaded_library"):
        real = getattr(cpu_kernels, name)
        monkeypatch.setattr(cpu_kernels, name, lambda real=real: taken.append(real()) or taken[-1])
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(6, 20, 16, generator=g, requires_grad=True) for _ in range(3))

    def forward_backward():
        for t in (q, k, v):
            t.grad = None
        y = osa_lab.osa(q, k, v, 0.1)
        y.backward(torch.ones_like(y))
        return y.detach(), [t.grad.clone() for t in (q, k, v)]

    y0, g0 = forward_backward()
    assert taken and all(lib is default for lib in taken)
    taken.clear()
    seen_by_thread = []
    with build.using_library(other) as lib:
        assert lib is other and build.library() is other and build.built_library() is other
        assert "-DMR=2" in build.status() and "using_library" in build.status()
        y1, g1 = forward_backward()
        thread = threading.Thread(target=lambda: seen_by_thread.append(build.library()))
        thread.start()
        thread.join()
    assert taken and all(lib is other for lib in taken), "the kernels did not take the other build"
    assert seen_by_thread == [default]
    assert build.library() is default and "using_library" not in build.status()
    assert rel_err(y1, y0) < 1e-5
    for a, b in zip(g1, g0, strict=True):
        assert rel_err(a, b) < 1e-5


def test_the_prefetch_distance_changes_no_result():
    """Builds that prefetch no rows or five matrices ahead give the default build's bits, on a
    layer's head-split views, forward and backward (a prefetch only moves memory)."""
    if build.library() is None:
        pytest.skip(f"CPU kernels: {build.status()}")
    g = torch.Generator().manual_seed(4)
    tokens = [torch.randn(8, 20, 64, generator=g) for _ in range(3)]

    def forward_backward():
        leaves = [t.clone().requires_grad_(True) for t in tokens]
        q, k, v = (t.view(8, 20, 4, 16).transpose(1, 2) for t in leaves)
        y = osa_lab.osa(q, k, v, 0.3)
        y.backward(torch.ones_like(y))
        return [y.detach(), *(t.grad for t in leaves)]

    default = forward_backward()
    for ahead in (0, 5):
        with build.using_library(build.compile_library(defines={"PREFETCH_AHEAD": ahead})):
            assert f"-DPREFETCH_AHEAD={ahead}" in build.status(), build.status()
            got = forward_backward()
        assert all(torch.equal(a, b) for a, b in zip(got, default, strict=True)), ahead


def test_turned_off_is_the_calling_threads_switch_not_the_processs():
    """``turned_off`` switches this thread to the PyTorch path; another thread and the process
    environment keep the kernels (a context variable, not ``os.environ``)."""
    before = os.environ.get("OSA_LAB_CPU_KERNELS")
    seen: dict[str, bool] = {}
    with build.turned_off():
        assert not build.enabled() and "turned_off" in build.status()
        assert os.environ.get("OSA_LAB_CPU_KERNELS") == before
        worker = threading.Thread(target=lambda: seen.update(other=build.enabled()))
        worker.start()
        worker.join()
    assert seen["other"] == (before is None or before.strip().lower() not in {"0", "false", "no", "off"})
    assert build.enabled() == seen["other"]


_LOGGED = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(levelname)s %(message)s")
from osa_lab.ops.cpu import build
build.library()
"""


@pytest.mark.parametrize(("march", "expected"), [("native", "osa_lab.ops.cpu INFO CPU kernels built with"),
                                                  ("a;b", "osa_lab.ops.cpu WARNING CPU kernels not built")])  # fmt: skip
def test_one_log_line_says_the_kernels_were_built_or_why_not(march, expected):
    done = subprocess.run([sys.executable, "-c", _LOGGED], capture_output=True, text=True, timeout=300,
                          env=_env(march))  # fmt: skip
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("osa_lab.ops.cpu")]
    assert done.returncode == 0 and len(lines) == 1 and lines[0].startswith(expected), done.stdout + done.stderr
    if march == "native":
        assert " s (" in lines[0] and "floats per vector" in lines[0]
