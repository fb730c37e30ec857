"""The output check of :func:`osa_lab.osa`, blocking (``"strict"``) or deferred (sync-free).

``exp(S)`` is orthogonal (Zhang & Martens, arXiv 2602.05996), so every output matrix keeps the
norm of its ``v``: ``‖y_b‖ = ‖v_b‖``. A relative drift above :data:`NORM_DRIFT_WARN` means the
method failed on this input (:class:`~osa_lab.errors.OSAAccuracyWarning`); a non-finite norm
means NaN/Inf inputs or an overflow (:class:`~osa_lab.errors.OSAInputError`). The squared norms
come from data a pass already reads where the method provides them (``Σ v²`` from the Gram
pass, ``Σ y²`` from the Triton output kernel or from the small matrices of the Gram engine),
else from two norm passes.

Modes (:func:`set_output_check`, :func:`output_check`):

* ``"strict"``: the decision is taken before :func:`osa_lab.osa` returns; on CUDA this blocks
  the host until the device has finished the call (one synchronisation per call). On the CPU
  the drift is computed in NumPy from the norms (:func:`relative_drift_on_host`): 18 fewer
  dispatched operations in a small-N layer call's forward.
* ``"deferred"``: the drift is reduced to one number on the device and copied into pinned host
  memory without waiting; it is read, and warned or raised on, by a later :func:`osa_lab.osa`
  call once the device has got there, or by :func:`flush`. No host synchronisation per call.
* ``"auto"`` (default): ``"deferred"`` on CUDA, ``"strict"`` elsewhere (on the CPU the check
  costs no wait).
"""

from __future__ import annotations

import math
import threading
import warnings
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from osa_lab.errors import NonFiniteError, OSAAccuracyWarning, unknown_name
from osa_lab.ops.guards import all_finite, check_float_tensor, whole_batch

MODES = ("auto", "strict", "deferred")

#: Largest relative drift ``|‖y_b‖ − ‖v_b‖| / ‖v_b‖`` of one matrix's output norm accepted
#: without an :class:`OSAAccuracyWarning`, per working dtype. ``exp(S)`` is orthogonal, so the
#: norms match to rounding; a drift this large means the method failed on this input.
NORM_DRIFT_WARN = {torch.float64: 1e-6, torch.float32: 1e-3}
NORM_DRIFT_WARN_HALF = 3e-2

#: Most deferred checks kept waiting for the device; beyond it the oldest is waited for.
MAX_PENDING = 64


class _State(threading.local):
    def __init__(self) -> None:
        self.mode = "auto"


_STATE = _State()
_PENDING: deque = deque()
_LOCK = threading.Lock()


def set_output_check(mode: str) -> None:
    """Set this thread's output-check mode: ``"auto"``, ``"strict"`` or ``"deferred"`` (module doc)."""
    if mode not in MODES:
        raise unknown_name("output check mode", mode, MODES)
    _STATE.mode = mode


def get_output_check() -> str:
    """This thread's output-check mode as set (``"auto"`` unless changed)."""
    return _STATE.mode


@contextmanager
def output_check(mode: str) -> Iterator[None]:
    """``with output_check("strict"): ...`` — the mode inside the block, restored after it."""
    old = _STATE.mode
    set_output_check(mode)
    try:
        yield
    finally:
        _STATE.mode = old


def effective_mode(device: torch.device) -> str:
    """``"strict"`` or ``"deferred"`` for outputs on ``device``."""
    mode = _STATE.mode
    if mode == "auto":
        return "deferred" if device.type == "cuda" else "strict"
    return mode


def drift_limit(work_dtype: torch.dtype) -> float:
    """The largest accepted relative norm drift for a result computed in ``work_dtype``."""
    return NORM_DRIFT_WARN.get(work_dtype, NORM_DRIFT_WARN_HALF)


def relative_drift(y_sq: torch.Tensor, v_sq: torch.Tensor, delta: torch.Tensor | None = None) -> torch.Tensor:
    """``max_b |‖y_b‖ − ‖v_b‖| / ‖v_b‖`` from the squared norms (float64, on the device); NaN or
    Inf where a norm is non-finite. ``delta`` (``‖y_b‖² − ‖v_b‖²`` computed directly) avoids
    the cancellation of ``y_sq − v_sq``."""
    y_sq, v_sq = y_sq.detach().double(), v_sq.detach().double()  # a check, not part of the graph
    if not y_sq.numel():
        return y_sq.new_zeros(())
    tiny = torch.finfo(torch.float64).tiny
    if delta is None:
        # |√(y²/v²) − 1|; NaN and Inf propagate (a NaN through amax, an Inf Σ y² as an Inf ratio,
        # an Inf Σ v² against a finite Σ y² only by the isfinite test below)
        drift = (y_sq / v_sq.clamp_min(tiny)).sqrt_().sub_(1).abs_().amax()
        return torch.where(torch.isfinite(v_sq).all(), drift, math.inf)
    ratio = delta.detach().double() / v_sq.clamp_min(tiny)
    drift = (ratio.clamp_min(-1.0) + 1).sqrt() - 1
    drift = torch.where(torch.isfinite(y_sq) & torch.isfinite(v_sq), drift.abs(), math.inf)
    return drift.amax()


def relative_drift_on_host(y_sq: torch.Tensor, v_sq: torch.Tensor, delta: torch.Tensor | None = None) -> float:
    """:func:`relative_drift` of CPU tensors as a Python float, computed in NumPy (float64).

    The same formula, NaN and Inf included (tests compare the two), without dispatching the
    dozen ATen operations of :func:`relative_drift` and the ``.item()`` of its result. (A
    layer call's time did not measurably change with it, BENCHMARKS.md; the CPU's check now
    has no host read of its own.) The tensors must be plain CPU tensors (not under torch.func
    transforms)."""
    y, v = _host(y_sq), _host(v_sq)
    if not y.size:
        return 0.0
    tiny = np.finfo(np.float64).tiny
    with np.errstate(all="ignore"):
        if delta is None:
            drift = np.abs(np.sqrt(y / np.maximum(v, tiny)) - 1).max()
            return float(drift) if np.isfinite(v).all() else math.inf
        ratio = _host(delta) / np.maximum(v, tiny)
        drift = np.sqrt(np.maximum(ratio, -1.0) + 1) - 1
        return float(np.where(np.isfinite(y) & np.isfinite(v), np.abs(drift), math.inf).max())


def _host(t: torch.Tensor) -> np.ndarray:
    return np.asarray((t.detach() if t.requires_grad else t).numpy(), dtype=np.float64)


def squared_norms(y: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Σ y², Σ v²)`` per matrix by two norm passes (float64 or float32 accumulation)."""
    acc = torch.float64 if y.dtype == torch.float64 else torch.float32
    ny = torch.linalg.vector_norm(y.detach(), dim=(-2, -1), dtype=acc)
    nv = torch.linalg.vector_norm(v.detach(), dim=(-2, -1), dtype=acc)
    return ny.double() ** 2, nv.double() ** 2


@dataclass
class _Pending:
    """A deferred check: the drift in (pinned) host memory, filled when ``event`` completes."""

    host: torch.Tensor
    event: object | None
    context: dict


def check_now(drift: torch.Tensor | float, out: torch.Tensor, inputs: tuple, context: dict) -> None:
    """The blocking check: raise for non-finite output (naming a NaN/Inf input first), warn on drift."""
    try:
        value = float(drift)
    except RuntimeError:  # under torch.func.vmap: the worst drift of every call of the vmapped batch
        value = float(whole_batch(torch.as_tensor(drift)).amax())
    _decide(value, context, inputs, out)


def defer(drift: torch.Tensor, context: dict) -> None:
    """Queue ``drift`` (a 0-d device tensor) for a later look, without waiting for the device."""
    if drift.device.type == "cuda":
        host = torch.empty((), dtype=drift.dtype, pin_memory=True)
        host.copy_(drift, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
    else:  # the CPU computes synchronously: the value is there already
        host, event = drift.detach(), None
    with _LOCK:
        _PENDING.append(_Pending(host, event, context))
        oldest = _PENDING[0] if len(_PENDING) > MAX_PENDING else None
    if oldest is not None:
        if oldest.event is not None:
            oldest.event.synchronize()  # the host is MAX_PENDING calls ahead of the device
        report_pending()


def report_pending(*, block: bool = False) -> None:
    """Warn or raise for the deferred checks whose values have arrived (all of them, waiting,
    with ``block=True``). Never waits for the device otherwise."""
    while True:
        with _LOCK:
            if not _PENDING:
                return
            rec = _PENDING[0]
            if rec.event is not None and not rec.event.query():
                if not block:
                    return
                rec.event.synchronize()
            _PENDING.popleft()
        _decide(float(rec.host.numpy()), rec.context, None, None)


def flush() -> None:
    """Wait for every deferred output check of this process and report it (warning or error)."""
    report_pending(block=True)


def discard_pending() -> int:
    """Drop the deferred checks not yet reported (e.g. after handling an error); returns how many."""
    with _LOCK:
        count = len(_PENDING)
        _PENDING.clear()
    return count


def _decide(drift: float, context: dict, inputs: tuple | None, out: torch.Tensor | None) -> None:
    name, n, r, dtype = context["method"], context["n"], context["r"], context["work_dtype"]
    if not math.isfinite(drift):
        if inputs is not None:
            # Any NaN/Inf in q, k, v or α reaches y; name the input (this raises) before blaming overflow.
            for arg, x in zip(("q", "k", "v", "alpha"), inputs, strict=False):
                check_float_tensor(arg, x, allow_half_on_cpu=True)
            if out is not None and all_finite(out):
                return  # finite entries whose squared norm overflowed the accumulation
        if inputs is not None:  # every input was checked finite above
            raise NonFiniteError(
                f"OSA produced non-finite values from finite inputs (method {name!r}, N={n}, r={r}); the inputs "
                "or α are too large for the dtype: rescale them or use float64"
            )
        raise NonFiniteError(
            f"OSA produced non-finite values (method {name!r}, N={n}, r={r}) (reported late: the output check "
            "was deferred, see osa_lab.ops.output_check); q, k, v or α hold NaN/Inf, or the inputs or α are too "
            "large for the dtype: check the layer that produced them, rescale them or use float64"
        )
    limit = drift_limit(dtype)
    if drift > limit:
        warnings.warn(
            f"osa(method={name!r}, {dtype}, N={n}, r={r}): the output's norms differ from v's by more "
            f"than {limit:g} (relative) although exp(S) is orthogonal; the result is inaccurate for "
            "this input. Rescale q, k or α"
            + (", compute in float64" if dtype != torch.float64 else "")
            + (", or use method='qr'" if name != "qr" else "")
            + ".",
            OSAAccuracyWarning,
            stacklevel=4,
        )
