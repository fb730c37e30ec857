"""Deprecated alias of :mod:`osa_lab.dashboard.cli` (moved there; this name works for one release)."""

import sys

from osa_lab.dashboard import cli

sys.modules[__name__] = cli
