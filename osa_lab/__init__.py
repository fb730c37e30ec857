"""osa_lab: Orthogonal Self-Attention (Zhang & Martens, arXiv 2602.05996) against softmax attention."""

from osa_lab.errors import (
    CausalMaskError,
    ConfigurationError,
    MethodUnavailableError,
    OSADtypeError,
    OSAInputError,
    UnknownNameError,
)
from osa_lab.expm import (
    is_orthogonal,
    lowrank_action,
    orthogonality_error,
    osa_matrix,
    skew_expm,
    skew_symmetric_from_qk,
)
from osa_lab.functional import METHODS, osa
from osa_lab.layers import OrthogonalSelfAttention, SoftmaxSelfAttention, derived_alpha_init

__version__ = "0.1.0"

__all__ = [
    "METHODS",
    "CausalMaskError",
    "ConfigurationError",
    "MethodUnavailableError",
    "OSADtypeError",
    "OSAInputError",
    "OrthogonalSelfAttention",
    "SoftmaxSelfAttention",
    "UnknownNameError",
    "derived_alpha_init",
    "is_orthogonal",
    "lowrank_action",
    "orthogonality_error",
    "osa",
    "osa_matrix",
    "skew_expm",
    "skew_symmetric_from_qk",
]
