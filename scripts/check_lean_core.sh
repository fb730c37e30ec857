#!/usr/bin/env bash
# CI: the lean core. Builds a fresh venv holding only `pip install osa_lab` (torch and numpy; torch
# is the CPU build on this machine class's disk, set TORCH_SPEC for another), then imports osa_lab
# outside the checkout, runs osa() and OrthogonalSelfAttention forward and backward, checks that
# no laboratory package came along and that a laboratory module names the extra that installs it;
# then installs the test tools and runs the core's tests against the installed package.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
start=$(date +%s)
work=$(mktemp -d "${TMPDIR:-/tmp}/osa-lab-core.XXXXXX")
trap 'rm -rf "$work"' EXIT

# the working tree's files (tracked and new, not ignored), so no stale build/ of the checkout ships
mkdir "$work/src"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$work/src"

"$PYTHON" -m venv "$work/venv"
py="$work/venv/bin/python"
echo "[lean-core] source copied and venv created after $(( $(date +%s) - start )) s"
# --no-compile: byte-compiling torch's sources would take most of the install's CPU time
"$py" -m pip install --disable-pip-version-check -q --no-compile "$TORCH_SPEC"
echo "[lean-core] $TORCH_SPEC installed after $(( $(date +%s) - start )) s"
"$py" -m pip install --disable-pip-version-check -q --no-compile "$work/src"
echo "[lean-core] osa_lab installed after $(( $(date +%s) - start )) s: $("$py" -m pip list --format=freeze --disable-pip-version-check | tr '\n' ' ')"

cd "$work"  # import the installed package, not the checkout
"$py" - <<'PY'
import importlib.util
import math

import torch

import osa_lab
from osa_lab import OrthogonalSelfAttention, osa

assert osa_lab.__file__.find("site-packages") > 0, osa_lab.__file__
lab = ["matplotlib", "pandas", "dask", "distributed", "scipy", "holoviews", "bokeh", "panel", "sklearn",
       "mnist1d", "papermill", "tqdm", "yaml"]
present = [name for name in lab if importlib.util.find_spec(name) is not None]
assert present == [], f"the core install brought laboratory packages: {present}"

g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(2, 3, 16, n, generator=g, dtype=torch.float64, requires_grad=True) for n in (4, 4, 8))
y = osa(q, k, v, alpha=0.5)
# exp(S) is orthogonal: each output column keeps the norm of v's column
with torch.no_grad():
    drift = float(((y.norm(dim=-2) - v.norm(dim=-2)).abs() / v.norm(dim=-2)).max())
assert y.shape == v.shape and drift < 1e-10, drift
y.square().sum().backward()
for name, t in (("q", q), ("k", k), ("v", v)):
    assert t.grad is not None and bool(torch.isfinite(t.grad).all()) and float(t.grad.abs().sum()) > 0, name

layer = OrthogonalSelfAttention(32, 4)
x = torch.randn(2, 10, 32, generator=g, requires_grad=True)
out = layer(x)
assert out.shape == x.shape and bool(torch.isfinite(out).all())
out.pow(2).mean().backward()
grads = [p.grad for p in layer.parameters()] + [x.grad]
assert all(gr is not None and bool(torch.isfinite(gr).all()) for gr in grads)
assert math.isfinite(float(sum(gr.abs().sum() for gr in grads))) and float(x.grad.abs().sum()) > 0

import shutil

from osa_lab.ops import cpu

if shutil.which("cc"):  # the kernels' C source ships with the package and builds where a compiler is
    assert cpu.status().startswith("built with"), cpu.status()
    q32, k32, v32 = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    seen, stack = set(), [osa(q32, k32, v32, alpha=0.5).grad_fn]
    while stack:
        fn = stack.pop()
        if fn is not None and fn not in seen:
            seen.add(fn)
            stack.extend(f for f, _ in fn.next_functions)
    assert "_OSAChebyshevActionCPUBackward" in {type(f).__name__ for f in seen}, seen
    from osa_lab.ops.cpu import gram_kernels  # the token passes, compiled from the same wheel

    a, b, w = (torch.randn(2, 40, 16, generator=g) for _ in range(3))
    top, bottom = gram_kernels.transposed_products((a, b, w), (0, 1))
    assert torch.allclose(top, torch.cat([a.mT @ a, a.mT @ b, a.mT @ w], -1), rtol=1e-5, atol=1e-4)
    assert torch.allclose(bottom, torch.cat([b.mT @ b, b.mT @ w], -1), rtol=1e-5, atol=1e-4)

try:
    import osa_lab.studies  # noqa: F401
except osa_lab.OptionalDependencyError as exc:
    assert 'pip install "osa_lab[lab]"' in str(exc), exc
else:
    raise AssertionError("osa_lab.studies imported without the lab extra")
import contextlib
import io

from osa_lab import cli

stderr = io.StringIO()
with contextlib.redirect_stderr(stderr):
    status = cli.main(["sweep", "--depth", "2"])
lines = stderr.getvalue().strip().splitlines()
assert status == 2 and len(lines) == 1 and "osa_lab[lab]" in lines[0], (status, lines)
print(f"[lean-core] osa_lab {osa_lab.__version__}: osa() and OrthogonalSelfAttention forward and backward ok; "
      "a lab module and a lab command name the extra")
PY

"$work/venv/bin/osa-lab" --version  # the console script

# The core's tests in the lean install: the test tools and scipy (the float64 references) from
# pyproject.toml's specifiers, then the core test files (tests/ops, tests/nn) must all collect,
# and the fast ones run against the installed package. The long grids (gradients, accuracy,
# torch.compile, the builds, Triton) run in `make test`, with the lab installed.
tools=$("$py" - "$work/src/pyproject.toml" <<'PY'
import re
import sys
import tomllib

extras = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]
wanted = {"pytest", "pytest-xdist", "hypothesis", "scipy"}
print(" ".join(r for r in extras["dev"] + extras["lab"] if re.split(r"[<>=!~\[ ]", r, maxsplit=1)[0] in wanted))
PY
)
# shellcheck disable=SC2086  # one word per requirement
"$py" -m pip install --disable-pip-version-check -q --no-compile $tools
mkdir "$work/core"
cp -r "$work/src/tests" "$work/src/pyproject.toml" "$work/core/"
cd "$work/core"
"$py" -m pytest -q -p no:cacheprovider --collect-only tests/ops tests/nn >"$work/collected.txt" \
  || { tail -30 "$work/collected.txt"; echo "[lean-core] the core tests do not collect without the lab"; exit 1; }
echo "[lean-core] core tests collected: $(tail -1 "$work/collected.txt")"
"$py" -m pytest -q -p no:cacheprovider -n 2 \
  tests/nn/test_attention.py tests/nn/test_masks.py tests/nn/test_models.py tests/nn/test_shaping.py \
  tests/ops/test_torch_func.py tests/ops/test_vmap_checks.py tests/ops/test_osa_properties.py \
  tests/ops/test_cpu_kernels.py tests/ops/test_cpu_cache.py tests/ops/test_output_check.py tests/ops/test_osa_fuzz.py \
  tests/ops/test_rank_deficiency_band.py tests/ops/test_cpu_core_products.py
python_path=$("$py" -c "import osa_lab; print(osa_lab.__file__)")
case "$python_path" in *site-packages*) ;; *) echo "[lean-core] the tests imported $python_path, not the installed package"; exit 1;; esac
echo "[lean-core] passed in $(( $(date +%s) - start )) s"
