"""osa_lab: Orthogonal Self-Attention (Zhang & Martens, arXiv 2602.05996) against softmax attention."""

from osa_lab.errors import (
    CausalMaskError,
    ConfigurationError,
    MethodUnavailableError,
    OSAAccuracyWarning,
    OSADtypeError,
    OSAInputError,
    UnknownNameError,
    UntrustedResultError,
)
from osa_lab.expm import (
    is_orthogonal,
    lowrank_action,
    orthogonality_error,
    osa_matrix,
    skew_expm,
    skew_matrix_exp,
    skew_symmetric_from_qk,
)
from osa_lab.functional import METHODS, osa
from osa_lab.layers import OrthogonalSelfAttention, SoftmaxSelfAttention, derived_alpha_init
from osa_lab.metrics import METRICS
from osa_lab.models import ModelConfig, NonFiniteHiddenStateError, build_classifier, build_model
from osa_lab.presets import PRESETS, get_preset, preset_names

__version__ = "0.1.0"

__all__ = [
    "METHODS",
    "METRICS",
    "PRESETS",
    "ModelConfig",
    "NonFiniteHiddenStateError",
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
    "osa_matrix",
    "skew_expm",
    "skew_matrix_exp",
    "skew_symmetric_from_qk",
]
