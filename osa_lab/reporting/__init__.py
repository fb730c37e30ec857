"""The report notebooks' machinery.

* :mod:`osa_lab.reporting.runner`: ``osa-lab report`` (papermill runner, HTML export).
* :mod:`osa_lab.reporting.sources`: the notebook sources and their checked parameters.
* :mod:`osa_lab.reporting.execution`: the kernel and one notebook's papermill run.
* :mod:`osa_lab.reporting.export`: an executed notebook as one offline HTML page.
* :mod:`osa_lab.reporting.index`: the report folder's ``index.html`` and ``summary.json``.
* :mod:`osa_lab.reporting.kernel_setup`: the set-up cell every report notebook runs.
* :mod:`osa_lab.reporting.provenance`: what produced a table (versions, settings, machine).
"""

from osa_lab.extras import require_lab

require_lab("osa_lab.reporting")

