"""Input–output Jacobians of layers, blocks and networks: singular values and condition numbers.

Implements the Jacobian-conditioning analysis of docs/analysis.md (Ji et al. 2025, *Cutting the Skip*,
arXiv 2510.00345, who measure κ of ``∂X_l/∂X_0``) and the OSA initialisation evidence of
docs/initialisation.md (Zhang & Martens 2026, arXiv 2602.05996: the OSA layer's Jacobian is
well-conditioned at the right α).

The package's rooms:

* :mod:`~osa_lab.studies.jacobian.estimates`: the algorithms, the size limits, the cost model
  and :func:`resolve_algorithm` (what ``"auto"`` runs);
* :mod:`~osa_lab.studies.jacobian.monitor`: progress reports and the cancel hook;
* :mod:`~osa_lab.studies.jacobian.krylov`: Golub–Kahan–Lanczos, ARPACK and LOBPCG on a linear
  operator given by its products;
* :mod:`~osa_lab.studies.jacobian.solvers`: the Jacobian of a function at a point, exact or
  matrix-free (:func:`jacobian_spectrum`);
* :mod:`~osa_lab.studies.jacobian.profile`: the study's tables (κ across depth, every σ, the OSA
  layer against α, N and d);
* :mod:`~osa_lab.studies.jacobian.sub_blocks`: κ of every sub-block (embedding, attention, MLP,
  readout) per layer;
* :mod:`~osa_lab.studies.jacobian.mixing_split`: an OSA layer's κ against the same layer with its
  mixing held fixed, and κ of W_V and W_O.

Three algorithms, one interface (:func:`jacobian_spectrum`, option ``algorithm``; not to be
confused with the ``method`` of :func:`osa_lab.osa`, which the models choose):

``"exact"``
    the full Jacobian by ``torch.func.jacrev`` (reverse mode, ``chunk_size`` rows at a time so
    memory stays bounded) and all its singular values (``torch.linalg.svdvals``, float64).
    Needs ``n_out · n_in`` numbers; refused with :class:`JacobianTooLargeError` (which says how
    many bytes it would need) above ``max_bytes``.
``"matrix-free"``
    only the extreme singular values, from Jacobian–vector products: ``Jᵀ u`` by
    ``torch.func.vjp`` and ``J v`` as the transpose of that linear map (a vjp of the vjp, 5–6×
    cheaper than ``torch.func.jvp`` through the OSA layer's QR path). The default solver
    ``"lanczos"`` is Golub–Kahan–Lanczos bidiagonalisation of ``J`` itself (never the normal
    matrix ``JᵀJ``, so σ_min keeps its accuracy down to ≈ eps·σ_max) with full
    reorthogonalisation and thick restarts that keep the smallest Ritz triplets and the largest
    one (which deflates the top of the spectrum; Baglama & Reichel 2005, SIAM J. Sci. Comput.
    27:19–42). Converged means the residual bound ``‖Jᵀu − σv‖ ≤ tol·σ`` holds for both ends, which
    bounds the relative error of each σ by ``tol``. ``"arpack"`` (``svds``/``eigsh`` on ``JᵀJ``)
    and ``"lobpcg"`` remain as alternatives. A σ_min that did not converge is NaN with
    ``converged=False`` (κ NaN: unknown, never ``inf``). Memory is ``ncv + 1`` copies of the
    input and ``ncv`` of the output.
``"auto"``
    the cheaper of the two by :func:`estimate_jacobian_seconds` (a cost model fitted to timings
    on the development machine), exact only when it also fits ``max_bytes``.

Long calls take ``progress`` (a callback receiving :class:`JacobianProgress`) and
``should_stop`` (checked between products; returning True raises
:class:`~osa_lab.errors.ComputationCancelledError`). Inputs above ``max_input_dim`` entries are
refused with :class:`JacobianTooLargeError` naming the override.

Models run under :func:`osa_lab.nn.models.functional_mode` (OSA by the ``"qr"`` method, SSA by an
explicit softmax) because the fast OSA engine and SDPA do not support ``torch.func`` transforms;
the function computed is the same.
"""

from osa_lab.errors import JacobianTooLargeError
from osa_lab.studies.jacobian.estimates import (
    COST_MODEL,
    JACOBIAN_ALGORITHMS,
    MAX_EXACT_DIM,
    MAX_INPUT_DIM,
    SCOPES,
    check_algorithm,
    check_input_dim,
    check_size,
    default_max_bytes,
    estimate_jacobian_seconds,
    resolve_algorithm,
    resolve_layers,
)
from osa_lab.studies.jacobian.krylov import (
    ARPACK_MAXITER,
    ARPACK_NCV,
    LANCZOS_BASIS_BYTES,
    LANCZOS_KEEP,
    LANCZOS_MAX_PRODUCTS,
    LANCZOS_NCV,
    SOLVERS,
)
from osa_lab.studies.jacobian.monitor import JacobianProgress, ProgressCallback, StopHook
from osa_lab.studies.jacobian.profile import (
    KAPPA_COLUMNS,
    SIGMA_COLUMNS,
    JacobianSettings,
    block_function,
    build_point,
    jacobian_depth_profile,
    jacobian_singular_values,
    osa_layer_conditioning,
    prefix_function,
)
from osa_lab.studies.jacobian.solvers import (
    JacobianSpectrum,
    exact_jacobian,
    jacobian_spectrum,
    kappa_from_extremes,
    matrix_free_extremes,
)

__all__ = [
    "ARPACK_MAXITER", "ARPACK_NCV", "COST_MODEL", "JACOBIAN_ALGORITHMS", "KAPPA_COLUMNS", "LANCZOS_BASIS_BYTES",
    "LANCZOS_KEEP", "LANCZOS_MAX_PRODUCTS", "LANCZOS_NCV", "MAX_EXACT_DIM", "MAX_INPUT_DIM", "SCOPES", "SIGMA_COLUMNS",
    "SOLVERS", "JacobianProgress", "JacobianSettings", "JacobianSpectrum", "JacobianTooLargeError", "ProgressCallback",
    "StopHook", "block_function", "build_point", "check_algorithm", "check_input_dim", "check_size",
    "default_max_bytes", "estimate_jacobian_seconds", "exact_jacobian", "jacobian_depth_profile",
    "jacobian_singular_values", "jacobian_spectrum", "kappa_from_extremes", "matrix_free_extremes",
    "osa_layer_conditioning", "prefix_function", "resolve_algorithm", "resolve_layers",
]  # fmt: skip
