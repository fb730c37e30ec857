"""Deprecated alias of :mod:`osa_lab.dashboard.jobs` (moved there; this name works for one release)."""

import sys

from osa_lab.dashboard import jobs

sys.modules[__name__] = jobs
