"""Count host synchronisation points, aten ops and kernel launches of a call, on the CPU.

A :class:`torch.utils._python_dispatch.TorchDispatchMode` sees every aten op the host code
issues. On CUDA, these ops force the host to wait for the device:

* ``aten._local_scalar_dense`` — ``.item()``, ``float(t)``, ``int(t)``, ``bool(t)``;
* ``aten.nonzero`` / ``masked_select`` / ``unique`` family — output size depends on the data;
* ``aten.index`` / ``index_put`` with a boolean index (a hidden ``nonzero``);
* ``aten._to_copy`` / ``copy_`` to the CPU (device-to-host copies).

Counting them on CPU tensors gives the number of synchronisations the same code makes on a GPU
(the control flow is the same). Triton launches go through ``triton_osa._launch``; while
counting, the hook runs them with the dispatch mode switched off (the interpreter's own tensor
traffic is not host code of the CUDA path) and counts them.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

_DATA_DEPENDENT = {"nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
                   "unique_consecutive", "repeat_interleave"}  # fmt: skip


#: Ops that only make tensor metadata or allocate (no device kernel).
_METADATA = {"detach", "empty", "empty_strided", "empty_like", "lift_fresh", "alias", "_unsafe_view"}


@dataclass
class Counts:
    """Per-call tally: ``syncs`` (by kind), ``ops`` (aten ops), ``launches`` (Triton kernels)."""

    syncs: Counter = field(default_factory=Counter)
    ops: int = 0
    op_names: Counter = field(default_factory=Counter)
    compute_ops: int = 0
    launches: Counter = field(default_factory=Counter)

    @property
    def n_syncs(self) -> int:
        return sum(self.syncs.values())

    @property
    def n_launches(self) -> int:
        return sum(self.launches.values())


class _Counter(TorchDispatchMode):
    def __init__(self, counts: Counts) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.counts.ops += 1
        self.counts.op_names[name] += 1
        if not (getattr(func, "is_view", False) or name in _METADATA):
            self.counts.compute_ops += 1  # ops that launch device work (views and allocations excluded)
        if name == "_local_scalar_dense":
            self.counts.syncs["item"] += 1
        elif name in _DATA_DEPENDENT and not (name == "repeat_interleave" and kwargs.get("output_size")):
            self.counts.syncs[name] += 1
        elif name in ("index", "index_put", "index_put_", "_index_put_impl_"):
            idx = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in idx or ()):
                self.counts.syncs["bool_mask_index"] += 1
        elif name in ("_to_copy", "to", "copy_") and _to_host(args, kwargs):
            self.counts.syncs["device_to_host"] += 1
        return func(*args, **kwargs)


def _to_host(args, kwargs) -> bool:
    """A copy whose destination is the CPU and whose source is not (never true on a CPU run:
    there every tensor is on the CPU, so these are counted by inspection, see docs/triton.md)."""
    dev = kwargs.get("device")
    src = args[0] if args and isinstance(args[0], torch.Tensor) else None
    return dev is not None and torch.device(dev).type == "cpu" and src is not None and src.device.type != "cpu"


@contextmanager
def count_syncs():
    """``with count_syncs() as c: ...`` — tally of the host code run inside (see module doc)."""
    from osa_lab.ops.triton import kernels as T

    counts = Counts()
    old = T.LAUNCH_HOOK

    def hook(kernel, grid, args, kwargs):
        counts.launches[kernel.__name__] += 1
        with _disable_current_modes():
            kernel[grid](*args, **kwargs)

    T.LAUNCH_HOOK = hook
    try:
        with _Counter(counts):
            yield counts
    finally:
        T.LAUNCH_HOOK = old


def measure(core: str = "adaptive", b: int = 2, n: int = 256, r: int = 32, d: int = 32) -> dict[str, Counts]:
    """Counts for one forward and one backward of ``osa_triton`` (float32, after a warm-up call)."""
    import math

    from osa_lab.ops.triton import kernels as T

    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(b, n, r, generator=g).requires_grad_() for _ in range(2))
    v = torch.randn(b, n, d, generator=g).requires_grad_()
    scale = torch.full((b,), 1 / math.sqrt(r), dtype=torch.float64).requires_grad_()
    cfg = T.TritonConfig(core=core)
    T.osa_triton(q, k, v, scale, config=cfg)
    with count_syncs() as fwd:
        y = T.osa_triton(q, k, v, scale, config=cfg)
    with count_syncs() as bwd:
        torch.autograd.grad(y, (q, k, v, scale), torch.ones_like(y))
    return {"forward": fwd, "backward": bwd}


def measure_osa(mode: str, b: int = 2, n: int = 256, r: int = 32, d: int = 32) -> dict[str, Counts]:
    """Counts for one forward and one backward of ``osa(..., method="triton")`` in the
    output-check ``mode`` (``"deferred"``: the CUDA default; ``"strict"``: blocking)."""
    from osa_lab.ops import output_check
    from osa_lab.ops.functional import osa

    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(b, n, r, generator=g).requires_grad_() for _ in range(2))
    v = torch.randn(b, n, d, generator=g).requires_grad_()
    alpha = torch.full((b,), 0.5, dtype=torch.float64).requires_grad_()
    with output_check.output_check(mode):
        osa(q, k, v, alpha, method="triton")
        with count_syncs() as fwd:
            y = osa(q, k, v, alpha, method="triton")
        with count_syncs() as bwd:
            torch.autograd.grad(y, (q, k, v, alpha), torch.ones_like(y))
        output_check.flush()
    return {"forward": fwd, "backward": bwd}


if __name__ == "__main__":  # TRITON_INTERPRET=1 python -m osa_lab.ops.triton.sync_count
    for mode in ("deferred", "strict"):
        for phase, c in measure_osa(mode).items():
            print(f"osa() {mode:8s} {phase:8s} syncs={c.n_syncs} {dict(c.syncs)} aten_ops={c.ops} "
                  f"compute_ops={c.compute_ops} launches={c.n_launches}")  # fmt: skip
    for core in ("adaptive", "fixed"):
        for phase, c in measure(core).items():
            print(f"core={core:8s} {phase:8s} syncs={c.n_syncs} {dict(c.syncs)} aten_ops={c.ops} "
                  f"compute_ops={c.compute_ops} "
                  f"launches={c.n_launches} {dict(c.launches)}")  # fmt: skip
