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
  pip=(.venv/bin/python -m pip install --disable-pip-version-check -q --no-compile)
  uv=(.venv/bin/uv pip install --python .venv/bin/python -q)
  echo "[setup] installing $TORCH_SPEC and osa_lab[all] into .venv"
  # torch through pip, which reads this machine's pip configuration (where the CPU build lies)
  "${pip[@]}" "$TORCH_SPEC"
  # The rest through uv, which fetches and installs in parallel: about a quarter of pip's CPU time
  # here, and the same versions (the two environments' `pip list` agreed). uv reads neither pip's
  # configuration nor its constraints, so the torch that pip installed is pinned for it. pip does
  # it all where uv cannot be fetched or fails.
  pin=.venv/.torch-constraint.txt
  .venv/bin/python -c 'import importlib.metadata as m; print("torch==" + m.version("torch"))' >"$pin"
  if "${pip[@]}" "uv==0.13.9" && "${uv[@]}" --constraint "$pin" -e ".[all]"; then
    installer=("${uv[@]}")
  else
    echo "[setup] uv could not be installed or failed; installing with pip"
    "${pip[@]}" -e ".[all]"
    installer=("${pip[@]}")
  fi
  # The timm extra without its dependencies: timm requires torchvision, and pip would fetch a
  # torchvision (and the CUDA torch it pins) that does not import beside this CPU torch. timm's
  # models then need a torchvision made for this torch; without one, osa_lab.integrations.timm
  # says so in one line and its tests are skipped.
  "${installer[@]}" --no-deps "timm>=1.0.21,<1.1"
  # Python caches a module's bytecode at its first import, so only what runs gets compiled. Where
  # PYTHONDONTWRITEBYTECODE forbids that, every process would compile its imports again: compile
  # the whole environment once, now, as pip does for what it installs. A file that does not
  # compile (torch ships one written for Python 3.12) is one that this Python cannot import either:
  # pip skips them.
  if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    .venv/bin/python -m compileall -q -j 0 "$site" >/dev/null || true
  fi
  rm -f .venv/.osa_lab-installed-*
  touch "$stamp"
else
  echo "[setup] .venv is up to date"
fi
