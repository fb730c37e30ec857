"""α = exp(a) instead of a linear α for skipless-osa on MNIST-1D (issue 13 item 2).

Same budget as the final comparison (docs/training.md): 10 epochs, batch 64, lr 3e-3, depth 4,
width 32, 2 heads, validation 0.1, seeds 0–2, α-lr multiplier 10 and 1. Every OSA layer's α
parameter is replaced by ``log_alpha`` (α₀ > 0, so ``log α₀`` exists; its name still ends in
"alpha", so it keeps α's own AdamW group without weight decay); "α := 0 after training" sets
``log_alpha = −inf``. Prints one JSON line per run:

    .venv/bin/python docs/results/alpha_param/log_alpha_run.py
"""

from __future__ import annotations

import contextlib
import json
import time

import torch
import torch.nn as nn

from osa_lab.nn.attention import OrthogonalSelfAttention
from osa_lab.studies import training as T


class LogAlphaOSA(OrthogonalSelfAttention):
    """OSA with α = exp(log_alpha)."""

    @property
    def alpha(self) -> torch.Tensor:
        return torch.exp(self.log_alpha)


def to_log(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if type(m) is OrthogonalSelfAttention and isinstance(m._parameters.get("alpha"), nn.Parameter):
            a = m._parameters.pop("alpha").detach()
            assert (a > 0).all()
            m.__class__ = LogAlphaOSA
            m.log_alpha = nn.Parameter(torch.log(a))
    return model


@contextlib.contextmanager
def zeroed(model: nn.Module):
    layers = [m for m in model.modules() if isinstance(m, LogAlphaOSA)]
    saved = [m.log_alpha.detach().clone() for m in layers]
    try:
        with torch.no_grad():
            for m in layers:
                m.log_alpha.fill_(-float("inf"))
        yield model
    finally:
        with torch.no_grad():
            for m, s in zip(layers, saved, strict=True):
                m.log_alpha.copy_(s)


def main() -> None:
    build = T.build_training_model
    T.build_training_model = lambda cfg: to_log(build(cfg))
    T.alpha_zeroed = zeroed
    torch.set_num_threads(1)
    for mult in (10.0, 1.0):
        for seed in (0, 1, 2):
            cfg = T.TrainConfig(preset="skipless-osa", data="mnist1d", epochs=10, batch_size=64, lr=3e-3,
                                alpha_lr_mult=mult, seed=seed, val_fraction=0.1,
                                model={"depth": 4, "dim": 32, "heads": 2})  # fmt: skip
            t0 = time.time()
            m = T.train(cfg, None, progress=False).metrics

            def last(metric: str, m=m) -> float:
                return float(m.loc[m.metric == metric].sort_values(["epoch", "step"])["value"].iloc[-1])

            row = {"param": "log", "alpha_lr_mult": mult, "seed": seed, "test_accuracy": last("test_accuracy"),
                   "val_accuracy": last("val_accuracy"), "val_drop_alpha0": last("val_accuracy_alpha0_drop"),
                   "seconds": time.time() - t0,
                   "alpha_max": float(m.loc[m.metric == "alpha", "value"].abs().max())}  # fmt: skip
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
