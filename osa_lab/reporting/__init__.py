"""The report notebooks' machinery.

* :mod:`osa_lab.reporting.runner`: ``osa-lab report`` (papermill runner, HTML export).
* :mod:`osa_lab.reporting.kernel_setup`: the set-up cell every report notebook runs.
* :mod:`osa_lab.reporting.provenance`: what produced a table (versions, settings, machine).
"""

from osa_lab.extras import require_lab

require_lab("osa_lab.reporting")

