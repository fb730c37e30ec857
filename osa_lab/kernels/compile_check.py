"""Compile the Triton OSA kernels for a CUDA target without a GPU.

``python -m osa_lab.kernels.compile_check [--quick] [--arch 90]`` lowers every kernel through
Triton's full pipeline (TTIR → TTGIR → LLVM → PTX → cubin with the bundled ptxas) for the
shapes and dtypes the GPU path uses, and prints the shared memory each needs. It catches
code-generation errors the CPU interpreter cannot see (type merges, layouts, dot shapes).
Must run without ``TRITON_INTERPRET=1``. Exit status 3: this Triton has no usable
compile-only API (the check is skipped, not failed).
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    """Compile the kernels; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="bf16 r=d=64 and float32 r=d=128 only")
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90 for H100/H200")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET to compile for a GPU target")
        return 3
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        from osa_lab.kernels import triton_osa as T
    except Exception as exc:  # pragma: no cover - depends on the install
        print(f"compile-only API unavailable: {exc!r}")
        return 3

    target = GPUTarget("cuda", args.arch, 32)
    combos = [("bf16", 64, 64), ("fp32", 128, 128)] if args.quick else [
        (dt, rp, dp) for dt in ("bf16", "fp16", "fp32") for rp, dp in ((32, 32), (64, 64), (128, 128), (64, 128))
    ]  # fmt: skip

    def compile_one(fn, types: list[str], cex: dict) -> int:
        names = list(fn.arg_names)
        sig = dict(zip(names, types, strict=False))
        for n in cex:
            sig[n] = "constexpr"
        src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(n),): v for n, v in cex.items()})
        k = triton.compile(src, target=target, options={"num_warps": 4, "num_stages": 2})
        return int(getattr(k.metadata, "shared", -1))

    failures = 0
    for dt, rp, dp in combos:
        p = "*" + dt
        split = dt != "fp32"
        wdt = p if split else "*fp32"
        block_n = 64 if max(rp, dp) <= 64 else 32
        tile = min(64, rp, dp)
        apply_cex = {"BLOCK_N": block_n, "RP": rp, "DP": dp, "M": max(rp, dp), "SPLIT": split,
                     "CAST_F32": False, "PRECISION": "ieee", "FIX_BF16": False}  # fmt: skip
        jobs = [
            (T._reduce_kernel, [p, p, p, "*i32", "*fp32", "*fp32"] + ["i32"] * 15,
             {"BLOCK_N": block_n, "RP": rp, "BR": tile, "BC": tile, "BLOCKS": 8, "NUM_TILES": 5,
              "CAST_F32": False, "PRECISION": "ieee"}),
            (T._fwd_apply_kernel, [p, p, p, wdt, "*fp32", p] + ["i32"] * 17, apply_cex),
            (T._bwd_apply_kernel, [p] * 4 + [wdt, "*fp32", p, p, p] + ["i32"] * 22, apply_cex),
        ]  # fmt: skip
        for fn, types, cex in jobs:
            try:
                shared = compile_one(fn, types, cex)
                print(f"ok    {fn.__name__:18s} {dt} rp={rp} dp={dp} shared={shared} B")
            except Exception as exc:
                failures += 1
                print(f"FAIL  {fn.__name__:18s} {dt} rp={rp} dp={dp}: {type(exc).__name__}: {exc}")
    print(f"{failures} failure(s) for sm_{args.arch}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
