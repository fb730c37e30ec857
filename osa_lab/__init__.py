"""osa_lab: Orthogonal Self-Attention (Zhang & Martens, arXiv 2602.05996) against softmax attention.

The names here are the core (:mod:`osa_lab.ops`, :mod:`osa_lab.nn`, :mod:`osa_lab.errors`), which
needs torch and numpy only. The laboratory wings (:mod:`osa_lab.studies`, :mod:`osa_lab.plots`,
:mod:`osa_lab.reporting`, :mod:`osa_lab.dashboard`, …) need ``pip install "osa_lab[lab]"``
(:mod:`osa_lab.extras`).
"""

from osa_lab.errors import (
    CausalMaskError,
    ConfigurationError,
    MethodUnavailableError,
    NonFiniteError,
    NonFiniteHiddenStateError,
    OptionalDependencyError,
    OSAAccuracyWarning,
    OSADtypeError,
    OSAInputError,
    OSALabError,
    OSALabWarning,
    UnknownNameError,
    UntrustedResultError,
    UserError,
)
from osa_lab.nn.attention import OrthogonalSelfAttention, SoftmaxSelfAttention, derived_alpha_init
from osa_lab.nn.models import ModelConfig, build_classifier, build_model
from osa_lab.nn.presets import PRESETS, get_preset, preset_names
from osa_lab.ops.expm import (
    core_skew_exp,
    is_orthogonal,
    lowrank_action,
    orthogonality_error,
    osa_matrix,
    reference_skew_exp,
    skew_symmetric_from_qk,
)
from osa_lab.ops.functional import OSA_METHODS, OSAMethod, osa
from osa_lab.version import __version__

__all__ = [
    "__version__",
    "OSA_METHODS",
    "PRESETS",
    "ModelConfig",
    "NonFiniteError",
    "NonFiniteHiddenStateError",
    "OSALabError",
    "OSALabWarning",
    "OptionalDependencyError",
    "UserError",
    "build_classifier",
    "build_model",
    "get_preset",
    "preset_names",
    "CausalMaskError",
    "ConfigurationError",
    "MethodUnavailableError",
    "OSADtypeError",
    "OSAInputError",
    "OrthogonalSelfAttention",
    "SoftmaxSelfAttention",
    "UnknownNameError",
    "UntrustedResultError",
    "OSAAccuracyWarning",
    "derived_alpha_init",
    "is_orthogonal",
    "lowrank_action",
    "orthogonality_error",
    "osa",
    "OSAMethod",
    "osa_matrix",
    "reference_skew_exp",
    "core_skew_exp",
    "skew_symmetric_from_qk",
]

