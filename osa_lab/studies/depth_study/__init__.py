"""The depth study: ease of training of skipless, normless OSA against softmax attention across depth,
joined to signal propagation (Jacobian κ at initialisation), on MNIST-1D.

Rooms: :mod:`.spec` (the experiment file), :mod:`.bracket` (a tuning grid that brackets its
optimum), :mod:`.run` (one run → a small JSON result), :mod:`.stats` (paired tests, TOST, Holm),
:mod:`.report` (tables and verdict from the results folder alone), :mod:`.runner` (the driver).
"""

from osa_lab.studies.depth_study.report import summarise
from osa_lab.studies.depth_study.runner import run_study
from osa_lab.studies.depth_study.spec import StudySpec, TuningSpec, load_spec

__all__ = ["StudySpec", "TuningSpec", "load_spec", "run_study", "summarise"]
