# The two commands of the README: `make report` (main job) and `make test` (tests).
.PHONY: setup report report-quick test lint bench lab dashboard

setup:
	@bash scripts/setup.sh

report: setup
	.venv/bin/osa-lab report

report-quick: setup
	.venv/bin/osa-lab report --quick

test: setup
	@bash scripts/install_browser.sh
	.venv/bin/ruff check .
	.venv/bin/python -m pytest -q -n 2

bench: setup
	.venv/bin/osa-lab bench

lab: setup
	JUPYTER_CONFIG_PATH=$(CURDIR)/.jupyter .venv/bin/jupyter lab notebooks/

dashboard: setup
	.venv/bin/osa-lab dashboard
