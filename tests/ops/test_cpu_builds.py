"""The CPU kernels' builds (``osa_lab.ops.cpu.build``): the instruction set named by
``OSA_LAB_CPU_MARCH``, what happens to a name the compiler refuses or that is not a ``-march``
name, and the kernels' tests run again on the AVX2 build.

The default build is ``-march=native``; on an AVX-512 machine the AVX2 build (8-float vectors,
16 registers, its own register blocks) would otherwise go untested. Each case runs in a fresh
process: the library is built once per process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HAVE_COMPILER = shutil.which(os.environ.get("CC", "cc")) is not None
pytestmark = pytest.mark.skipif(not HAVE_COMPILER, reason="no C compiler: the kernels cannot be built here")

_REPORT = """
import json
from osa_lab.ops.cpu import build
lib = build.library()
print(json.dumps({"status": build.status(), "built": lib is not None,
                  "floats": lib.osa_gram_vector_floats() if lib else None,
                  "doubles": lib.osa_core_vector_doubles() if lib else None}))
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


@pytest.mark.skipif(not AVX2_MACHINE, reason="this CPU cannot run an AVX2 build")
def test_the_avx2_build_has_8_float_vectors_and_passes_the_kernel_tests():
    report = _report("x86-64-v3")
    assert report["built"] and "-march=x86-64-v3" in report["status"], report
    assert (report["floats"], report["doubles"]) == (8, 4), report
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
