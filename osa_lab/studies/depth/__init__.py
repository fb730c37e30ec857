"""Rank collapse and singular-value spectra across depth: depth profiles, sweeps, the ``sweep`` CLI.

The package's rooms: :mod:`~osa_lab.studies.depth.profiles` (one model's hidden states scored
layer by layer: :func:`depth_profile`), :mod:`~osa_lab.studies.depth.sweeps` (a grid of model
runs: :func:`sweep`) and :mod:`~osa_lab.studies.depth.cli` (``osa-lab sweep``). Every public name
imports from ``osa_lab.studies.depth`` itself.

Implements the measurements of docs/design.md §4 on the models of :mod:`osa_lab.nn.models`: the tokens
after every block (and every attention sub-layer) are scored by the metrics of
:mod:`osa_lab.studies.metrics` and their full singular-value spectra are recorded.

Tidy schema
-----------
Every table is long format, one row per observation, keyed by all its parameters.

**metrics** (:data:`METRIC_COLUMNS`)::

    preset, depth, tokens, dim, heads, alpha, seed, layer, site, metric, value

**spectra** (:data:`SPECTRA_COLUMNS`)::

    preset, depth, tokens, dim, heads, alpha, seed, layer, site, index, sigma, sigma_normalized

* ``preset``: preset name (or the ``label`` given for a custom model); ``depth``: number of
  blocks of the model the row belongs to; ``tokens`` N, ``dim`` d, ``heads``: as built.
* ``alpha``: the OSA α used at initialisation (the derived α₀ when none is given); NaN for SSA.
* ``seed``: seeds both the weights (:attr:`ModelConfig.seed`) and the Gaussian input tokens.
* ``layer``: 0 = the input, l = after block l (``site="block"``) or after block l's attention
  sub-layer (``site="attention"``, layers 1..depth only).
* ``metric``: a key of :data:`osa_lab.studies.metrics.METRICS`; ``value``: float64, averaged over the
  input batch when ``batch > 1``.
* ``index``: 0 = largest singular value; ``sigma_normalized = σ_i / σ_1``.

Depth sweeps are cheap: block ``i`` of a seeded model is initialised from ``(seed, i)``, so the
first l blocks of a depth-L model *are* the depth-l model; :func:`sweep` runs the deepest model
once per configuration and slices it for every requested depth.

CLI::

    osa-lab sweep --presets pure-osa pure-ssa --depth 24 --tokens 64 --dim 64 --seeds 3 \\
        --output results.csv          # also writes results_spectra.csv
"""

from osa_lab.studies.depth.cli import MAX_MATRIX_FREE_INPUTS, add_arguments, run
from osa_lab.studies.depth.kernel import KERNEL_COLUMNS, encoder_c_map
from osa_lab.studies.depth.profiles import (
    DTYPES,
    KEY_COLUMNS,
    METRIC_COLUMNS,
    MIN_TOKENS,
    SITES,
    SPECTRA_COLUMNS,
    DepthProfile,
    depth_profile,
    hidden_states,
    profile_tables,
    resolve_sites,
    token_count,
)
from osa_lab.studies.depth.sweeps import (
    MAX_BATCH,
    MAX_DEPTH,
    MAX_HIDDEN_BYTES,
    MAX_MODELS,
    MAX_WIDTH,
    SweepResult,
    check_jacobian_result,
    check_profile_result,
    check_sweep_size,
    summarize_over_seeds,
    sweep,
    torch_threads,
    write_tables,
)
from osa_lab.studies.settings import StudyPoint, config_for

__all__ = [
    "DTYPES", "KERNEL_COLUMNS", "KEY_COLUMNS", "MAX_BATCH", "MAX_DEPTH", "MAX_HIDDEN_BYTES", "MAX_MATRIX_FREE_INPUTS", "MAX_MODELS",
    "MAX_WIDTH", "METRIC_COLUMNS", "MIN_TOKENS", "SITES", "SPECTRA_COLUMNS", "DepthProfile", "StudyPoint",
    "SweepResult", "add_arguments", "check_jacobian_result", "check_profile_result", "check_sweep_size", "config_for",
    "depth_profile", "encoder_c_map", "hidden_states", "profile_tables", "resolve_sites", "run", "summarize_over_seeds", "sweep",
    "token_count", "torch_threads", "write_tables",
]  # fmt: skip
