"""osa_lab: Orthogonal Self-Attention (Zhang & Martens, arXiv 2602.05996) against softmax attention."""

from osa_lab import compat
from osa_lab.deprecation import renamed
from osa_lab.errors import (
    CausalMaskError,
    ConfigurationError,
    MethodUnavailableError,
    NonFiniteHiddenStateError,
    OSAAccuracyWarning,
    OSADtypeError,
    OSAInputError,
    UnknownNameError,
    UntrustedResultError,
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
from osa_lab.ops.functional import OSA_METHODS, osa
from osa_lab.studies.metrics import METRICS
from osa_lab.version import __version__

# ``import osa_lab.analysis`` and the other pre-regrouping module paths keep working
compat.install()

__all__ = [
    "__version__",
    "OSA_METHODS",
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
    "reference_skew_exp",
    "core_skew_exp",
    "skew_symmetric_from_qk",
]


_renamed = renamed(
    __name__, {"METHODS": "OSA_METHODS", "skew_expm": "reference_skew_exp", "skew_matrix_exp": "core_skew_exp"}
)


def __getattr__(name: str):
    """Renamed public names (with a DeprecationWarning) and ``osa_lab.analysis`` etc. (old module
    paths) without an import statement."""
    module = compat.moved_module(name)
    if module is not None:
        return module
    return _renamed(name)
