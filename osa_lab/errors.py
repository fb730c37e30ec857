"""Typed exceptions and warnings raised by osa_lab, all below one root, :class:`OSALabError`.

Every error names the argument, what it got and what it needs, following geotorch's
practice of typed, explanatory exceptions (docs/design.md §6). Each type also keeps the builtin
base its callers expect (``OSAInputError`` is a ``ValueError``, ``MissingDataError`` a
``FileNotFoundError`` …), so ``except ValueError`` keeps working. The tree, by meaning:

* :class:`OSALabError` — the root: ``except OSALabError`` catches everything osa_lab raises.

  * :class:`UserError` — bad input or environment; the message says what to change. The one
    definition of a user error (:func:`is_user_error`): the command line prints it on one line
    and exits with status 2, the dashboard shows it as is.

    * input: :class:`OSAInputError` (wrong shape, value or contents), with
      :class:`NonFiniteError` (NaN/Inf; :class:`NonFiniteHiddenStateError` names the layer),
      :class:`UntrustedResultError` (a named method refuses an input it cannot compute
      accurately) and :class:`CausalMaskError`; :class:`OSADtypeError` (dtype or device);
    * configuration: :class:`ConfigurationError` (impossible settings), with
      :class:`OutputPathError`, :class:`RunLockedError`, :class:`SchedulerConnectionError`,
      :class:`JacobianTooLargeError`; :class:`UnknownNameError` (a name osa_lab does not know);
    * environment: :class:`MethodUnavailableError` (cannot run here), :class:`MissingDataError`
      (a data file is absent), :class:`OptionalDependencyError` (an extra is not installed),
      :class:`ReportError` (a report request cannot run), :class:`OutputWriteError` (an output
      cannot be written: a full disk, a read-only folder), :class:`UnstorableResultError` (a task
      result that cannot be stored without pickling).

  * outcomes that are not the user's mistake: :class:`TrainingDivergedError`,
    :class:`ComputationCancelledError`, :class:`MalformedResultError` (a damaged stored result,
    computed again), :class:`KernelFailedError` (a compiled CPU kernel could not run: no memory
    for its workspace).
  * :class:`OSALabWarning` — the root of osa_lab's warnings: :class:`OSAAccuracyWarning`,
    :class:`SolverNotConvergedWarning`, :class:`GridTaskFailedWarning`, :class:`TaskStoreWarning`,
    :class:`DataCacheWarning`.
"""

from __future__ import annotations

from pathlib import Path


class OSALabError(Exception):
    """The root of every exception (and warning) type osa_lab defines."""


class UserError(OSALabError):
    """Bad input or environment: the message names the problem and the fix.

    The command line prints it on one line and exits with status 2 (no traceback); the dashboard
    shows the message on the page. Anything else osa_lab raises is a result (a diverged run, a
    cancelled computation) or a bug.
    """


def is_user_error(exc: BaseException) -> bool:
    """True for a :class:`UserError` (bad input or environment), the errors the CLI answers with exit 2."""
    return isinstance(exc, UserError)


# --------------------------------------------------------------------------------------------
# input
# --------------------------------------------------------------------------------------------


class OSAInputError(UserError, ValueError):
    """An argument has the wrong shape, value or contents (mismatched sizes, a bad table)."""


class NonFiniteError(OSAInputError, FloatingPointError):
    """A tensor holds NaN or Inf: an input, a parameter (α) or a value computed from finite
    inputs (an overflow). Raised where a layer or the encoder detects them, so callers test the
    type (e.g. training treats it as divergence), never the message."""


class NonFiniteHiddenStateError(NonFiniteError):
    """A hidden state contains NaN or Inf; ``.layer`` (0 = input) and ``.site`` say where it first appears."""

    def __init__(self, message: str, layer: int, site: str) -> None:
        super().__init__(message)
        self.layer = layer
        self.site = site


class UntrustedResultError(OSAInputError):
    """A method chosen by name cannot compute this input to its accuracy budget, by its own error
    or condition estimate (e.g. ``method="gram"`` on a rank-deficient ``[q k]``: N < 2r, k ∥ q,
    q = 0); it refuses instead of returning a wrong result. The message names the methods that
    handle the input (``"qr"``, ``"lowrank"``, ``"auto"``)."""


class CausalMaskError(OSAInputError):
    """A mask or causal flag was given to orthogonal self-attention.

    OSA is non-causal: exp(S) of a skew-symmetric S is dense and a causal mask destroys
    skew-symmetry, so the matrix would no longer be orthogonal (Zhang & Martens 2026).
    """


class OSADtypeError(UserError, TypeError):
    """An argument has a dtype or device combination that osa_lab cannot use."""


# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------


class ConfigurationError(UserError, ValueError):
    """A model or analysis configuration is impossible (e.g. dim not divisible by heads)."""


class UnknownNameError(UserError, ValueError):
    """A method, preset or data-set name is not one osa_lab knows; the message lists the valid ones."""


def unknown_name(kind: str, name: object, valid: list[str] | tuple[str, ...]) -> UnknownNameError:
    """Build an :class:`UnknownNameError` that lists the valid names."""
    return UnknownNameError(f"unknown {kind} {name!r}; valid {kind}s are: {', '.join(sorted(valid))}")


class OutputPathError(ConfigurationError):
    """An output path cannot be written (a directory where a file is needed, a parent that is a
    file, a read-only location); raised by the command line before any computation starts."""


class RunLockedError(ConfigurationError):
    """An output (a training folder, a sweep's tables, a report folder) is owned by another live
    process (its lock file names the owner's PID and host); a second writer would mix two runs'
    outputs."""


class SchedulerConnectionError(ConfigurationError):
    """The Dask scheduler given to a grid (``--scheduler`` / ``DASK_SCHEDULER_ADDRESS``) cannot be
    reached or has no workers; the message says how to start one (``osa_lab.studies.grid``)."""


class JacobianTooLargeError(ConfigurationError):
    """The Jacobian is too large to compute here; the message gives its size and the alternative."""


# --------------------------------------------------------------------------------------------
# environment
# --------------------------------------------------------------------------------------------


class MethodUnavailableError(UserError, RuntimeError):
    """The requested computation method cannot run here (e.g. Triton on a CPU tensor)."""


class MissingDataError(UserError, FileNotFoundError):
    """A data file osa_lab needs is not on disk; the message says where to get it and put it."""


class OptionalDependencyError(UserError, ImportError):
    """An optional package that a feature needs is not installed (e.g. ``timm`` for
    ``osa_lab.integrations.timm``, pandas for the laboratory); the message names the extra that
    installs it (``pip install "osa_lab[lab]"``)."""


class OutputWriteError(UserError, OSError):
    """An output file could not be written (a full disk, a read-only file system); the message
    names the path. Nothing partial is left: the earlier file, if any, is kept
    (:mod:`osa_lab.fileio`)."""


class ReportError(UserError, RuntimeError):
    """A problem with a report request itself (unknown notebook, bad parameter file, no kernel)."""


# --------------------------------------------------------------------------------------------
# outcomes that are not the user's mistake
# --------------------------------------------------------------------------------------------


class TrainingDivergedError(OSALabError, RuntimeError):
    """The loss (or the weights, or hidden states) became NaN/Inf during training.

    Attributes ``step`` (optimiser steps taken), ``epoch`` (1-based epoch in progress),
    ``preset`` and ``checkpoint`` (the last good checkpoint, or None) are set so callers such as
    :func:`osa_lab.studies.training.compare` can record the failure.
    """

    def __init__(self, message: str, *, step: int, epoch: int, preset: str, checkpoint: Path | None) -> None:
        super().__init__(message)
        self.step, self.epoch, self.preset, self.checkpoint = step, epoch, preset, checkpoint


class UnstorableResultError(UserError, TypeError):
    """A task result cannot be written without pickling (``osa_lab.studies.result_store``): it
    is not made of numbers, strings, arrays, DataFrames, lists, tuples and string-keyed dicts."""


class MalformedResultError(OSALabError, ValueError):
    """A stored task result is not one osa_lab wrote for this task (damaged, truncated, a pickle,
    another task's, an unknown format); it is never executed, and the grid computes it again."""


class KernelFailedError(OSALabError, RuntimeError):
    """A compiled CPU kernel (:mod:`osa_lab.ops.cpu`) reported a failure, e.g. no memory for its
    per-thread workspace; the message names the kernel."""


class ComputationCancelledError(OSALabError, RuntimeError):
    """A long computation stopped early because its ``should_stop`` hook returned True (e.g. the
    dashboard's cancel button or a closed session); no partial result is returned."""


# --------------------------------------------------------------------------------------------
# warnings
# --------------------------------------------------------------------------------------------


class OSALabWarning(OSALabError, UserWarning):  # noqa: N818 - a warning, named as one
    """The root of osa_lab's warnings (``warnings.simplefilter("error", OSALabWarning)`` turns them all into errors)."""


class OSAAccuracyWarning(OSALabWarning):
    """A result is computed but its accuracy is doubtful: ``‖S‖`` is so large that the working
    precision's rounding error (about ``eps · ‖S‖``) is no longer small, or the output's column
    norms drifted from those of ``v`` (``exp(S)`` is orthogonal, so they must match)."""


class SolverNotConvergedWarning(OSALabWarning):
    """An iterative eigen/singular-value solver stopped before converging; the value it gives is
    a bound, not an estimate (e.g. matrix-free σ_min from partial Ritz values is an upper bound,
    so κ is a lower bound)."""


class GridTaskFailedWarning(OSALabWarning):
    """Some tasks of a grid (sweep, Jacobian study, training comparison) failed while the others
    finished; the message names each failed task's settings and error (``osa_lab.studies.grid``)."""


class TaskStoreWarning(OSALabWarning):
    """A stored task result of a grid was not used (malformed, of another task, of the wrong kind,
    or a pickle, which is never loaded) or a new one could not be stored; the task is computed
    again (``osa_lab.studies.grid``). The message names the file."""


class DataCacheWarning(OSALabWarning):
    """A cached data file of generated data did not match its recorded content hash or generator
    arguments (or was malformed) and was generated again; the message names the file."""


def heads_do_not_divide(
    dim: int, heads: int, *, dim_name: str = "dim", heads_name: str = "heads", otherwise: str = "change dim"
) -> ConfigurationError:
    """Build the :class:`ConfigurationError` for a width ``dim`` that ``heads`` does not divide.

    Each head gets ``dim / heads`` value columns, so the message lists the head counts that
    divide ``dim`` and the other way out (``otherwise``).
    """
    divisors = [h for h in range(1, dim + 1) if dim % h == 0]
    return ConfigurationError(
        f"`{dim_name}`={dim} is not divisible by `{heads_name}`={heads}: each head's value width is "
        f"{dim_name}/{heads_name}; choose {heads_name} from {divisors} or {otherwise}"
    )
