"""Compile the Triton OSA kernels for a CUDA target without a GPU.

    python -m osa_lab.ops.triton.compile_check [--arch 90] [--cache-dir DIR] [--max-variants K]

compiles every kernel variant that ``benchmarks/gpu_check.py`` launches (the shapes, dtypes and
configurations are defined here, :data:`GPU_CHECK`, and the GPU script reads them from here)
through Triton's own JIT with a *stand-in driver* that reports an sm_90 device: the host code
of each pass (:func:`osa_lab.ops.triton.kernels.reduce_pass`, ``forward_apply``, ``backward_apply``) runs
on ``meta`` tensors of the real shapes, and every launch becomes ``kernel.warmup(...)``. The
JIT therefore specialises the arguments exactly as the GPU run will (integer divisibility,
strides equal to 1, constexprs), and the cache entries it writes carry the keys the GPU run
looks up: with the same triton version (3.6 on the GPU machine) a run started with
``TRITON_CACHE_DIR=DIR`` finds every kernel compiled (``gpu_check.py --prebuild-cache DIR``).

For each compiled variant it prints the compile time, registers per thread, stack frame and
spill bytes (from ``ptxas -v``, captured through ``TRITON_DUMP_PTXAS_LOG``'s knob, which does
not change cache keys) and shared memory. Exit status 1 when a compile fails, takes longer than
``--max-seconds`` (default 30) or spills; 3 when this Triton has no usable compile path (the
check is skipped, not failed). Must run without ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import time
from dataclasses import dataclass, field

from osa_lab.errors import OSALabError

#: Streaming multiprocessors of an H200 (the plan's split count depends on it; since splits
#: are a runtime argument it changes no compiled kernel).
H200_SMS = 132


@dataclass(frozen=True)
class Case:
    """One workload of the GPU check: ``b`` batch·heads, ``n`` tokens, widths ``r``, ``d``."""

    section: str
    b: int
    n: int
    r: int
    d: int
    dtype: str  # "bfloat16", "float16", "float32"
    backward: bool = True
    config: dict = field(default_factory=dict)

    def label(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in self.config.items())
        return f"{self.section} {self.dtype} b={self.b} N={self.n} r={self.r} d={self.d}{extra}"


#: What ``benchmarks/gpu_check.py`` runs on the GPU (it reads these lists).
GPU_CHECK = {
    # correctness against float64: outputs and all gradients
    "correctness": [
        Case("correctness", 4, n, r, d, dt)
        for (n, r, d) in ((4096, 64, 64), (2048, 128, 128), (3000, 48, 96))
        for dt in ("bfloat16", "float32", "float16")
    ],
    # the passes alone (bandwidth), bf16, with and without the hi/lo split
    "pass": [
        Case("pass", 32, n, r, d, "bfloat16", True, cfg)
        for (n, r, d) in ((16384, 64, 64), (16384, 128, 128), (65536, 64, 64))
        for cfg in ({}, {"hi_lo": False})
    ],
    # forward and forward+backward timings against torch low-rank and SDPA flash
    "timing": [
        Case("timing", 32, n, d, d, "bfloat16", True, cfg)
        for d in (64, 128)
        for n in (1024, 4096, 16384, 65536)
        for cfg in ({}, {"core": "fixed"})
    ],
}


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def launch_case(case: Case, device: str = "meta", sm_count: int | None = H200_SMS) -> None:
    """Run the host code of the passes of ``case`` on ``device`` (launches go through
    ``triton_osa._launch``, so whatever hook is installed sees exactly the GPU run's launches)."""
    import torch

    from osa_lab.ops.triton import kernels as T

    dtype = _torch_dtype(case.dtype)
    b, n, r, d = case.b, case.n, case.r, case.d
    q, k = (torch.empty(b, n, r, dtype=dtype, device=device) for _ in range(2))
    v = torch.empty(b, n, d, dtype=dtype, device=device)
    plan = T.launch_plan(q, v, T.TritonConfig(**case.config), sm_count=sm_count)
    c = torch.zeros(b, 2 * r, d, dtype=torch.float64, device=device)
    T.reduce_pass(q, k, v, plan, gram=True)
    T.forward_apply(q, k, v, c, plan)
    if case.backward:
        gy = torch.empty_like(v)
        h = torch.zeros(b, 2 * r, 2 * r, dtype=torch.float64, device=device)
        T.reduce_pass(q, k, gy, plan, gram=False)
        T.backward_apply(q, k, v, gy, c, c, h, plan)


class _StandInDriver:
    """The part of a Triton driver the JIT needs to compile (not launch) for ``target``."""

    def __init__(self, target) -> None:
        self.target = target

    def is_active(self) -> bool:
        return True

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")


_PTXAS = {
    "regs": re.compile(r"Used (\d+) registers"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
    "spill_st": re.compile(r"(\d+) bytes spill stores"),
    "spill_ld": re.compile(r"(\d+) bytes spill loads"),
}


def parse_ptxas(log: str) -> dict:
    """Registers, stack frame and spill bytes from a ``ptxas -v`` log (max over entries)."""
    out = {}
    for key, rx in _PTXAS.items():
        vals = [int(x) for x in rx.findall(log)]
        out[key] = max(vals) if vals else None
    return out


@dataclass
class Compiled:
    kernel: str
    constexprs: str
    seconds: float
    regs: int | None
    stack: int | None
    spill_st: int | None
    spill_ld: int | None
    shared: int
    cases: list[str]
    cached: bool
    ptx_cp_async: bool
    error: str | None = None
    ptx: str = field(default="", repr=False)

    def line(self) -> str:
        if self.error:
            return f"FAIL  {self.kernel:18s} {self.constexprs}: {self.error}"
        src = "cache" if self.cached else f"{self.seconds:6.1f} s"
        return (
            f"{self.kernel:18s} {src:>8s}  regs={self.regs} stack={self.stack} "
            f"spill_st={self.spill_st} spill_ld={self.spill_ld} shared={self.shared} "
            f"cp.async={'yes' if self.ptx_cp_async else 'no'}  {self.constexprs}"
        )


def compile_cases(
    cases: list[Case], *, arch: int = 90, cache_dir: str | None = None, max_variants: int | None = None,
    echo=print,
) -> list[Compiled]:  # fmt: skip
    """Compile every distinct kernel variant the ``cases`` launch, for ``sm_{arch}``.

    ``cache_dir``: Triton cache directory to fill (default: a fresh temporary one, so every
    variant is really compiled and timed). ``max_variants``: stop after that many distinct
    variants (tests). Raises ``RuntimeError`` under ``TRITON_INTERPRET=1``.
    """
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("unset TRITON_INTERPRET to compile for a GPU target")
    import tempfile

    if cache_dir is None:
        cache_dir = tempfile.mkdtemp(prefix="osa-triton-cache-")
    os.makedirs(cache_dir, exist_ok=True)
    os.environ["TRITON_CACHE_DIR"] = cache_dir  # not part of any cache key

    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    from osa_lab.ops.triton import kernels as T

    if T.INTERPRET:
        raise RuntimeError("osa_lab.ops.triton.kernels was imported under TRITON_INTERPRET=1")
    knobs.cache.dir = cache_dir
    target = GPUTarget("cuda", arch, 32)
    results: dict[int, Compiled] = {}
    current = {"case": ""}

    class _StopError(OSALabError):
        pass

    def hook(kernel, grid, args, kwargs):
        buf = io.StringIO()
        t0 = time.perf_counter()
        cex = {k: v for k, v in kwargs.items() if k.isupper()}
        cex_s = f"{str(args[0].dtype).removeprefix('torch.')} " + " ".join(
            f"{k}={v}" for k, v in cex.items() if k not in ("CAST_F32", "FIX_BF16")
        )
        cex_s += f" warps={kwargs.get('num_warps')} stages={kwargs.get('num_stages')}"
        try:
            with contextlib.redirect_stdout(buf):
                ck = kernel.warmup(*args, grid=grid, **kwargs)
        except Exception as exc:  # a failed compile is a result, not a crash
            key = id(exc)
            results[key] = Compiled(kernel.__name__, cex_s, time.perf_counter() - t0, None, None, None, None,
                                    -1, [current["case"]], False, False, f"{type(exc).__name__}: {exc}"[:400])  # fmt: skip
            echo(results[key].line(), flush=True)
            return
        secs = time.perf_counter() - t0
        key = id(ck)
        if key in results:
            results[key].cases.append(current["case"])
            return
        if max_variants is not None and len(results) >= max_variants:
            raise _StopError
        log = buf.getvalue()
        p = parse_ptxas(log)
        ptx = ck.asm.get("ptx", "") if hasattr(ck, "asm") else ""
        results[key] = Compiled(
            kernel.__name__, cex_s, secs, p["regs"], p["stack"], p["spill_st"], p["spill_ld"],
            int(getattr(ck.metadata, "shared", -1)), [current["case"]], cached=not log.strip(),
            ptx_cp_async="cp.async" in ptx, ptx=ptx,
        )  # fmt: skip
        echo(results[key].line(), flush=True)

    knobs.nvidia.dump_ptxas_log = True
    old_hook = T.LAUNCH_HOOK
    old_driver = getattr(driver, "_active", None)
    driver.set_active(_StandInDriver(target))
    T.LAUNCH_HOOK = hook
    try:
        for case in cases:
            current["case"] = case.label()
            try:
                launch_case(case)
            except _StopError:
                break
    finally:
        T.LAUNCH_HOOK = old_hook
        knobs.nvidia.dump_ptxas_log = False
        driver._active = old_driver  # reset_active() would look for a real GPU driver
    echo(f"# triton {triton.__version__}, sm_{arch}, cache {cache_dir}", flush=True)
    return list(results.values())


def verdict(results: list[Compiled], max_seconds: float = 30.0) -> list[str]:
    """Problems: failed compiles, compiles over ``max_seconds``, any spill or stack frame use."""
    bad = []
    for c in results:
        if c.error:
            bad.append(f"{c.kernel} {c.constexprs}: {c.error}")
            continue
        if not c.cached and c.seconds > max_seconds:
            bad.append(f"{c.kernel} {c.constexprs}: compile {c.seconds:.1f} s > {max_seconds:g} s")
        if c.cached:
            continue  # no ptxas log for a kernel loaded from the cache
        if c.regs is None:
            bad.append(f"{c.kernel} {c.constexprs}: no ptxas -v log captured")
        elif (c.spill_st or 0) or (c.spill_ld or 0):
            bad.append(f"{c.kernel} {c.constexprs}: spills {c.spill_st} B stores / {c.spill_ld} B loads")
    return bad


def all_cases() -> list[Case]:
    return [c for section in GPU_CHECK.values() for c in section]


def main(argv: list[str] | None = None) -> int:
    """Compile the kernels; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90 for H100/H200")
    ap.add_argument("--cache-dir", default=None, help="Triton cache directory to fill (default: fresh temp dir)")
    ap.add_argument("--max-seconds", type=float, default=30.0, help="longest acceptable compile")
    ap.add_argument("--max-variants", type=int, default=None, help="stop after this many variants")
    ap.add_argument("--section", choices=sorted(GPU_CHECK), action="append", help="only these sections")
    args = ap.parse_args(argv)
    cases = [c for s in (args.section or sorted(GPU_CHECK)) for c in GPU_CHECK[s]]
    try:
        import triton  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except Exception as exc:  # pragma: no cover - depends on the install
        print(f"compile-only API unavailable: {exc!r}")
        return 3
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET to compile for a GPU target")
        return 3
    t0 = time.perf_counter()
    results = compile_cases(cases, arch=args.arch, cache_dir=args.cache_dir, max_variants=args.max_variants)
    bad = verdict(results, args.max_seconds)
    fresh = [c for c in results if not c.cached and not c.error]
    worst = max((c.seconds for c in fresh), default=0.0)
    print(
        f"{len(results)} variant(s) for {len(cases)} case(s) in {time.perf_counter() - t0:.1f} s; "
        f"slowest compile {worst:.1f} s; {len(bad)} problem(s)"
    )
    for line in bad:
        print("PROBLEM", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
