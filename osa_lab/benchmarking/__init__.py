"""Speed and memory measurement.

* :mod:`osa_lab.benchmarking.runner`: ``osa-lab bench`` (OSA vs SDPA table + CSV).
* :mod:`osa_lab.benchmarking.timing`: timing helpers shared by the runner, the studies and
  ``benchmarks/`` (interleaved timing, machine information, table output).
"""

from osa_lab.extras import require_lab

require_lab("osa_lab.benchmarking")

