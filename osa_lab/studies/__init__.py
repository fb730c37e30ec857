"""The studies: experiments that turn settings into tidy tables.

* :mod:`osa_lab.studies.settings`: the grid point (:class:`~osa_lab.studies.settings.StudyPoint`)
  and the set-up every study shares (inputs, α, lists of seeds).
* :mod:`osa_lab.studies.metrics`: rank-collapse and spectrum metrics of hidden states.
* :mod:`osa_lab.studies.depth`: depth profiles and sweeps (``osa-lab sweep``).
* :mod:`osa_lab.studies.jacobian`: input–output Jacobian conditioning across depth.
* :mod:`osa_lab.studies.summaries`: the summary tables the reports quote.
* :mod:`osa_lab.studies.expm_accuracy`: accuracy / timing of the matrix-exponential methods.
* :mod:`osa_lab.studies.self_check`: the OSA self-check the dashboard shows.
* :mod:`osa_lab.studies.training`, :mod:`osa_lab.studies.data`: training runs and their data.
* :mod:`osa_lab.studies.grid`: running a grid of tasks locally or on a Dask cluster.

This wing imports the wings below it (ops, nn, plots, benchmarking, errors), never above.
"""

from osa_lab.extras import require_lab

require_lab("osa_lab.studies")

