#!/usr/bin/env bash
# Create .venv and install osa_lab with every extra, from the project's own files.
# torch is pinned to the CPU build that lies on this machine class's disk (pip finds it there);
# set TORCH_SPEC to install another build, e.g. TORCH_SPEC="torch==2.11.0".
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
stamp=".venv/.osa_lab-installed-$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing $TORCH_SPEC and osa_lab[all] into .venv"
  .venv/bin/python -m pip install --disable-pip-version-check -q "$TORCH_SPEC"
  .venv/bin/python -m pip install --disable-pip-version-check -q -e ".[all]"
  # The timm extra without its dependencies: timm requires torchvision, and pip would fetch a
  # torchvision (and the CUDA torch it pins) that does not import beside this CPU torch. timm's
  # models then need a torchvision made for this torch; without one, osa_lab.integrations.timm
  # says so in one line and its tests are skipped.
  .venv/bin/python -m pip install --disable-pip-version-check -q --no-deps "timm>=1.0.21,<1.1"
  rm -f .venv/.osa_lab-installed-*
  touch "$stamp"
else
  echo "[setup] .venv is up to date"
fi
