"""The mathematics of orthogonal self-attention, with no model, table or plot code.

* :mod:`osa_lab.ops.expm`: the skew-symmetric exponential exp(S) of S = α(qkᵀ − kqᵀ) (Zhang &
  Martens, arXiv 2602.05996, eq. 3), its dense references (:func:`~osa_lab.ops.expm.osa_matrix`,
  orthogonality checks) and the low-rank engines (Gram / QR cores with the public trust rule
  :func:`~osa_lab.ops.expm.gram_core_with_norm` that the Triton path uses too).
* :mod:`osa_lab.ops.functional`: :func:`~osa_lab.ops.functional.osa` and its registry of
  computation methods (:data:`~osa_lab.ops.functional.OSA_METHODS`).
* :mod:`osa_lab.ops.guards`: input guards shared by every entry point (shapes, dtypes, masks).
* :mod:`osa_lab.ops.triton`: the Triton kernels, their compile check and sync counter.
* :mod:`osa_lab.ops.cpu`: compiled CPU kernels (the small-N Chebyshev action, float32), built at
  first use from the package's C source.

This wing imports only :mod:`osa_lab.errors` (docs/architecture.md).
"""
