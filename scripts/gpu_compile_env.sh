#!/usr/bin/env bash
# Create .venv-triton36: triton 3.6 (the GPU machine's version) with a CPU build of torch, for
# compiling the Triton kernels for sm_90 without a GPU (`make gpu-compile-check`, docs/triton.md).
# The triton wheel ships ptxas, so no CUDA toolkit and no CUDA build of torch are needed.
# Separate from .venv so that the project's own environment keeps its newer triton.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv-triton36}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
TRITON_SPEC=${TRITON_SPEC:-triton==3.6.*}
stamp="$VENV/.installed-$(cat pyproject.toml scripts/gpu_compile_env.sh | sha1sum | cut -c1-12)"
if [ -f "$stamp" ]; then
  echo "[gpu-compile-env] $VENV is up to date"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
echo "[gpu-compile-env] installing $TORCH_SPEC, $TRITON_SPEC and osa_lab (no extras) into $VENV"
"$VENV/bin/python" -m pip install --disable-pip-version-check -q "$TORCH_SPEC" "$TRITON_SPEC"
# osa_lab itself without the extras (those would pull a newer triton); its plain dependencies
# are small.
"$VENV/bin/python" -m pip install --disable-pip-version-check -q -e . "$TRITON_SPEC"
"$VENV/bin/python" -c "import triton, torch; print('[gpu-compile-env] triton', triton.__version__, 'torch', torch.__version__)"
rm -f "$VENV"/.installed-*
touch "$stamp"
