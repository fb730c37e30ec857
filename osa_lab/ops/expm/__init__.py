"""Matrix exponentials of skew-symmetric matrices: dense references and low-rank actions.

Implements docs/design.md §1–§2 (Zhang & Martens, "Orthogonal Self-Attention", arXiv 2602.05996):

* ``S = (α/√r)(Q Kᵀ − K Qᵀ) = U J Uᵀ`` with ``U = [Q K]`` and ``J = (α/√r)[[0, I], [−I, 0]]``;
* the OSA matrix ``A = exp(S)`` is orthogonal with determinant +1;
* its action on ``V`` is computed in time and memory linear in N from a ``2r × 2r`` problem.

Two low-rank engines live here, both exact in exact arithmetic:

``"gram"``  (Cholesky form, the fast path). With ``G = UᵀU = L Lᵀ`` (Cholesky) the matrix
    ``B = U L⁻ᵀ`` has orthonormal columns and ``S = B M Bᵀ`` with ``M = Lᵀ J L`` (2r×2r,
    skew), so ``exp(S) V = V + U F (Uᵀ V)`` with ``F = L⁻ᵀ (exp(M) − I) L⁻¹``. Only two
    passes over the tokens (``Uᵀ[U V]`` and ``V + U C``); the small problem runs in float64.
    Its rounding error grows like ``eps · ‖U‖ ‖C‖ / ‖V‖`` (≈ eps · cond(U)), so it needs a
    well-conditioned ``U``; an a-posteriori estimate of that bound is returned per matrix.
    Used alone it raises :class:`~osa_lab.errors.UntrustedResultError` for any matrix whose
    estimate is over the budget (it returned O(1) errors and zero gradients there).
``"qr"``  (QR form, docs/design.md §2). ``U = B R`` (Householder), ``M = R J Rᵀ``,
    ``exp(S) V = V + B (exp(M) − I)(Bᵀ V)``: backward stable for any ``U``, including rank
    deficient ones (``Q = K``, ``N < 2r``), at the price of a slower QR.

``"lowrank"`` runs ``"gram"`` and recomputes with ``"qr"`` exactly those matrices whose
Cholesky factorisation failed or whose error estimate is above the dtype's tolerance.

Below float64 every engine recomputes in float64 the matrices with ``‖S‖₂`` above
:data:`FLOAT64_NORM` (float32 loses ≈ eps₃₂·‖S‖₂: relative error ≈ 0.5 at α = 1e6, measured), and
every engine warns (:class:`~osa_lab.errors.OSAAccuracyWarning`) where even float64 rounding of
``S`` spoils the result (:data:`FLOAT64_ROUNDING_WARN`). Both rules look at ``‖S‖₂ = ‖M‖₂`` of the
2r×2r core, not at ``‖S‖_F`` (up to √(2r) times larger): ``‖S‖_F`` is computed anyway and settles
every matrix at or below the bound; only matrices above it get the tighter
:func:`spectral_norm_bound`.


Rooms: :mod:`~osa_lab.ops.expm.batch`, :mod:`~osa_lab.ops.expm.bounds`, :mod:`~osa_lab.ops.expm.dense`, :mod:`~osa_lab.ops.expm.core`, :mod:`~osa_lab.ops.expm.gram`, :mod:`~osa_lab.ops.expm.chebyshev`, :mod:`~osa_lab.ops.expm.qr`, :mod:`~osa_lab.ops.expm.dispatch`, :mod:`~osa_lab.ops.expm.scratch`.
"""

from osa_lab.ops.expm import batch, bounds, chebyshev, core, dense, dispatch, gram, qr, scratch
from osa_lab.ops.expm.batch import (
    any_row,
    composite_backward,
    concrete,
    replace_rows,
    take_rows,
    transformed,
    under_transform,
)
from osa_lab.ops.expm.bounds import (
    FLOAT64_NORM,
    FLOAT64_ROUNDING_NORM,
    FLOAT64_ROUNDING_WARN,
    NORM_BOUND_SLACK,
    SPECTRAL_SLACK,
    float64_needed,
    skew_bound_with_allowance,
    skew_norm_bound,
    skew_spectral_bound,
    small_skew_bound,
    spectral_norm_bound,
    spectral_refine_above,
    warn_float64_rounding,
)
from osa_lab.ops.expm.chebyshev import (
    ACTION_MAX_DEGREE,
    ACTION_TOLERANCE,
    bessel_j_sequence,
    chebyshev_action,
    chebyshev_action_reference,
    chebyshev_coefficients,
    chebyshev_degree,
    osa_chebyshev_action,
)
from osa_lab.ops.expm.core import (
    SHARED_SCALING_SPREAD,
    core_skew_exp,
    may_reuse,
    one_norm,
    skew_exp,
    taylor_ps,
    taylor_theta,
    truncation_unit,
)
from osa_lab.ops.expm.dense import (
    SHORT_TAYLOR_MAX_PRODUCTS,
    dense_exp,
    differentiable_plan,
    is_orthogonal,
    orthogonality_error,
    osa_matrix,
    reference_skew_exp,
    short_taylor,
    short_taylor_plan,
    skew_from_scale,
    skew_symmetric_from_qk,
)
from osa_lab.ops.expm.dispatch import ENGINES, blocked_action, lowrank_action
from osa_lab.ops.expm.gram import (
    CORE_TOLERANCE,
    GRAM_MAX_COND,
    GRAM_TOLERANCE,
    block_gram,
    cholesky_with_inverse,
    core_matrix,
    gram_action,
    gram_action_reference,
    gram_and_projection,
    gram_core,
    gram_core_backward,
    gram_core_parts,
    gram_core_with_norm,
    gram_engine,
    gram_output,
    gram_trust_ratio,
    osa_skew_core,
    output_norm_change,
)
from osa_lab.ops.expm.qr import qr_action
from osa_lab.ops.expm.scratch import (
    ACTION_SCRATCH,
    HUGE_PAGE_MIN_BYTES,
    SCRATCH,
    SCRATCH_LIMIT_BYTES,
    advise_huge_pages,
    fresh_output,
    release_scratch,
)

__all__ = [
    "ACTION_MAX_DEGREE",
    "ACTION_TOLERANCE",
    "CORE_TOLERANCE",
    "ENGINES",
    "FLOAT64_NORM",
    "FLOAT64_ROUNDING_NORM",
    "FLOAT64_ROUNDING_WARN",
    "GRAM_MAX_COND",
    "GRAM_TOLERANCE",
    "NORM_BOUND_SLACK",
    "ACTION_SCRATCH",
    "HUGE_PAGE_MIN_BYTES",
    "SCRATCH",
    "SCRATCH_LIMIT_BYTES",
    "SHARED_SCALING_SPREAD",
    "SHORT_TAYLOR_MAX_PRODUCTS",
    "SPECTRAL_SLACK",
    "advise_huge_pages",
    "any_row",
    "batch",
    "bessel_j_sequence",
    "block_gram",
    "blocked_action",
    "bounds",
    "chebyshev",
    "chebyshev_action",
    "chebyshev_action_reference",
    "chebyshev_coefficients",
    "chebyshev_degree",
    "cholesky_with_inverse",
    "composite_backward",
    "concrete",
    "core",
    "core_matrix",
    "core_skew_exp",
    "dense",
    "dense_exp",
    "differentiable_plan",
    "dispatch",
    "float64_needed",
    "fresh_output",
    "gram",
    "gram_action",
    "gram_action_reference",
    "gram_core",
    "gram_core_backward",
    "gram_core_parts",
    "gram_core_with_norm",
    "gram_engine",
    "gram_and_projection",
    "gram_output",
    "gram_trust_ratio",
    "is_orthogonal",
    "lowrank_action",
    "may_reuse",
    "one_norm",
    "orthogonality_error",
    "osa_chebyshev_action",
    "osa_matrix",
    "osa_skew_core",
    "output_norm_change",
    "qr",
    "qr_action",
    "reference_skew_exp",
    "release_scratch",
    "replace_rows",
    "scratch",
    "short_taylor",
    "short_taylor_plan",
    "skew_exp",
    "skew_from_scale",
    "skew_norm_bound",
    "skew_bound_with_allowance",
    "small_skew_bound",
    "skew_spectral_bound",
    "skew_symmetric_from_qk",
    "spectral_norm_bound",
    "spectral_refine_above",
    "take_rows",
    "transformed",
    "taylor_ps",
    "taylor_theta",
    "truncation_unit",
    "under_transform",
    "warn_float64_rounding",
]
