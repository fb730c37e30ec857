# The two commands of the README: `make report` (main job) and `make test` (tests).
.PHONY: setup report report-quick test lint bench lab dashboard gpu-compile-check

setup:
	@bash scripts/setup.sh

report: setup
	.venv/bin/osa-lab report

report-quick: setup
	.venv/bin/osa-lab report --quick --jobs 2

test: setup
	@bash scripts/install_browser.sh
	.venv/bin/ruff check .
	.venv/bin/mypy
	.venv/bin/python -m pytest -q -n 2 --durations=15

bench: setup
	.venv/bin/osa-lab bench

# JupyterLab refuses to run as root without --allow-root (containers, CI images run as root).
LAB_ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: setup
	JUPYTER_CONFIG_PATH=$(CURDIR)/.jupyter .venv/bin/jupyter lab $(LAB_ROOT_FLAG) notebooks/

dashboard: setup
	.venv/bin/osa-lab dashboard

# Compile every Triton kernel variant benchmarks/gpu_check.py launches for sm_90 with triton 3.6
# (the GPU machine's version) in its own .venv-triton36, no GPU needed: per-kernel compile time,
# registers and spills from ptxas -v; fails on a compile over 30 s or any spill. The cache it
# leaves in build/triton-cache-sm90 lets a GPU run start warm (docs/triton.md).
gpu-compile-check:
	@bash scripts/gpu_compile_env.sh
	rm -rf build/triton-cache-sm90
	.venv-triton36/bin/python benchmarks/gpu_check.py --prebuild-cache build/triton-cache-sm90
