"""One training run: AdamW with linear warm-up and cosine decay, checkpoints per epoch, resume."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from osa_lab.errors import (
    ConfigurationError,
    NonFiniteError,
    OSAInputError,
    TrainingDivergedError,
)
from osa_lab.fileio import atomic_to_csv, atomic_write_text
from osa_lab.nn.models import alpha_zeroed, mixing_table, osa_layers
from osa_lab.studies.data import (
    ImageDataset,
    data_fingerprint,
    load_data,
    split_validation,
)
from osa_lab.studies.training.checkpoints import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    read_checkpoint,
    write_checkpoint,
)
from osa_lab.studies.training.config import (
    TrainConfig,
    build_training_model,
    check_names,
    comparable_json,
    model_config_for,
    resolve_device,
)
from osa_lab.studies.training.lock import RunLock, check_output_dir
from osa_lab.studies.training.tables import final_value, metrics_frame


@dataclass
class TrainResult:
    """What :func:`train` returns: the tidy metrics, the trained model and where things were written."""

    config: TrainConfig
    model_config: Any
    model: nn.Module
    metrics: pd.DataFrame
    run_dir: Path | None
    checkpoint: Path | None
    resumed_from_epoch: int = 0

    def final(self, metric: str = "test_accuracy") -> float:
        """Value of ``metric`` at the last epoch."""
        return final_value(self.metrics, metric)


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 0 at ``total`` (Loshchilov & Hutter 2017)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def _param_groups(
    model: nn.Module, weight_decay: float, lr: float | None = None, alpha_lr_mult: float = 1.0
) -> list[dict]:
    """AdamW groups: decay on matrices; none on biases, norm gains and other vectors; OSA's α alone.

    α (every parameter named ``…alpha``) gets its own group without weight decay and with the
    learning rate ``lr · alpha_lr_mult`` (α's step size decides how much the skipless
    OSA network learns to mix tokens). Groups are named (``"decay"``, ``"no_decay"``, ``"alpha"``);
    empty groups are left out.
    """
    decay, no_decay, alpha = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name.endswith("alpha"):
            alpha.append(p)
        elif p.ndim < 2:
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]
    if alpha:
        group = {"params": alpha, "weight_decay": 0.0, "name": "alpha"}
        if lr is not None:
            group["lr"] = lr * alpha_lr_mult
        groups.append(group)
    return [g for g in groups if g["params"]]


def alpha_values(model: nn.Module) -> list[tuple[int, int, float]]:
    """``(osa_layer_index, head, α)`` for every OSA layer of ``model``, in module order."""
    from osa_lab.nn.attention import OrthogonalSelfAttention

    out = []
    layers = [m for m in model.modules() if isinstance(m, OrthogonalSelfAttention)]
    for i, m in enumerate(layers):
        for h, a in enumerate(m.alpha.detach().flatten().tolist()):
            out.append((i, h, float(a)))
    return out


def hidden_diagnostics(model: nn.Module, x: torch.Tensor) -> list[tuple[int, str, float]]:
    """``(layer, metric, value)`` for each hidden state of ``model`` on ``x`` and each metric of ``METRICS``.

    The metrics (docs/design.md §4, :mod:`osa_lab.studies.metrics`) are computed per image in float64 and
    summarised by the **median** over the batch (a single rank-deficient image would make the
    mean condition number infinite). Non-finite hidden states raise the encoder's
    ``NonFiniteHiddenStateError`` naming the first bad layer.
    """
    from osa_lab.studies.metrics import all_metrics

    was_training = model.training
    model.eval()
    with torch.no_grad():
        _, hidden = model(x, return_hidden=True)
    model.train(was_training)
    rows = []
    for layer, h in enumerate(hidden.blocks):
        for name, val in all_metrics(h.detach().cpu()).items():
            rows.append((layer, name, float(val.median())))
    return rows


def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` on ``(x, y)`` in eval mode."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(y), batch_size):
            xb, yb = x[i : i + batch_size].to(device), y[i : i + batch_size].to(device)
            logits = model(xb)
            loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(-1) == yb).sum())
    model.train(was_training)
    return loss_sum / len(y), correct / len(y)


def batch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The permutation of epoch ``epoch``: a function of (seed, epoch) only, so resuming replays it."""
    g = torch.Generator().manual_seed(1_000_003 * int(seed) + int(epoch))
    return torch.randperm(n, generator=g)


def check_dataset(data: ImageDataset) -> None:
    """Refuse data that would train wrongly: NaN/Inf inputs, non-integer labels or labels outside the classes."""
    splits = [("train", data.x_train, data.y_train), ("test", data.x_test, data.y_test)]
    if data.x_val is not None:
        splits.append(("validation", data.x_val, data.y_val))
    for split, x, y in splits:
        if not bool(torch.isfinite(x).all()):
            n_bad = int((~torch.isfinite(x)).sum())
            raise OSAInputError(
                f"data set {data.name!r} ({data.info.get('source', '?')}): {n_bad} NaN/Inf input value(s) in the "
                f"{split} split; the data are corrupt — fix or replace them (this is not a training divergence)"
            )
        if y is None or y.dtype != torch.int64:
            raise OSAInputError(
                f"data set {data.name!r}: {split} labels must be an int64 tensor, got "
                f"{None if y is None else y.dtype}"
            )
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= data.num_classes):
            raise OSAInputError(
                f"data set {data.name!r} ({data.info.get('source', '?')}): {split} labels span "
                f"{int(y.min())}–{int(y.max())} but the data set has {data.num_classes} classes "
                f"(0–{data.num_classes - 1}); the labels are corrupt"
            )


def train(
    config: TrainConfig,
    run_dir: str | os.PathLike | None = None,
    *,
    data: ImageDataset | None = None,
    resume: bool = True,
    device: str | torch.device = "cpu",
    progress: bool = True,
    data_dir: str | os.PathLike | None = None,
    on_epoch_end: Callable[[int, pd.DataFrame], None] | None = None,
) -> TrainResult:
    """Train one preset on one data set with one seed.

    Args:
        config: the run (:class:`TrainConfig`).
        run_dir: where ``metrics.csv``, ``config.json`` and ``checkpoint.pt`` go; ``None``
            keeps everything in memory (no checkpoints).
        data: a loaded data set (default: ``load_data(config.data, **config.data_options)``).
        resume: continue from ``run_dir/checkpoint.pt`` when it exists (a finished run is
            returned without training). The checkpoint must come from the same config.
        device: torch device for the model and batches.
        progress: show a tqdm bar over steps.
        data_dir: directory of the MNIST files (see :func:`osa_lab.studies.data.load_mnist`).
        on_epoch_end: called as ``on_epoch_end(epoch, metrics_so_far)`` after the epoch's
            checkpoint is written (tests use it to simulate an interruption).

    Determinism: the model is initialised under ``torch.manual_seed(seed)`` and the batch
    order of epoch ``e`` depends on ``(seed, e)`` only, so two runs of the same config on the
    same machine and thread count give identical metrics, and a resumed run gives the same
    result as an uninterrupted one.

    Raises:
        TrainingDivergedError: the loss, the weights or a hidden state became NaN/Inf; the
            message names the step, the preset and the last good checkpoint.
        RunLockedError: another live process owns ``run_dir`` (its ``run.lock``).
        ConfigurationError: the checkpoint comes from another config or other data, or is
            unreadable (the message suggests ``--no-resume``); the device is not available.
        OSAInputError: the data contain NaN/Inf inputs or labels outside the classes.
    """
    check_names([config.preset], config.data)
    device = resolve_device(device)
    if data is None:
        data = load_data(config.data, data_dir=data_dir, **config.data_options)
    if config.val_fraction > 0 and data.x_val is None:
        data = split_validation(data, config.val_fraction)
    check_dataset(data)
    if run_dir is None:
        return _train(config, None, data, resume, device, progress, on_epoch_end)
    run_path = check_output_dir(run_dir)
    with RunLock(run_path):
        return _train(config, run_path, data, resume, device, progress, on_epoch_end)


class TrainingRun:
    """One run of :func:`train` in progress: the model, its optimiser and learning-rate schedule,
    the metric rows so far and the last good checkpoint. Each step of a run is one method."""

    def __init__(self, config: TrainConfig, run_path: Path | None, data: ImageDataset, device: torch.device) -> None:
        self.config, self.run_path, self.data, self.device = config, run_path, data, device
        self.model_config = model_config_for(config, data)
        self.fingerprint = data_fingerprint(data)
        self.data_source = {"name": data.name, "source": str(data.info.get("source", "")), "fingerprint": self.fingerprint}
        torch.manual_seed(config.seed)
        self.model = build_training_model(self.model_config).to(device)
        self.optimizer = torch.optim.AdamW(
            _param_groups(self.model, config.weight_decay, config.lr, config.alpha_lr_mult), lr=config.lr
        )
        self.n_train = len(data.y_train)
        self.steps_per_epoch = math.ceil(self.n_train / config.batch_size)
        self.total_steps = self.steps_per_epoch * config.epochs
        warmup = int(round(config.warmup_fraction * self.total_steps))
        total = self.total_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, total, warmup))
        # held-out inputs for the diagnostics: the validation split when there is one, else test
        self.heldout = "val" if data.x_val is not None else "test"
        self.heldout_x = data.x_val if data.x_val is not None else data.x_test
        self.heldout_y = data.y_val if data.y_val is not None else data.y_test
        self.diag_x = self.heldout_x[: config.diag_samples].to(device)
        self.keys = {"preset": config.preset, "data": config.data, "seed": config.seed}
        self.rows: list[dict] = []
        self.start_epoch, self.step = 0, 0
        self.ckpt_path = run_path / CHECKPOINT_NAME if run_path is not None else None
        self.last_good: Path | None = None
        self.good_epoch = 0

    # ------------------------------------------------------------------ run folder

    def open_run_folder(self, resume: bool) -> None:
        """Create the run folder, resume from its checkpoint if asked, record the configuration."""
        assert self.run_path is not None and self.ckpt_path is not None
        self.run_path.mkdir(parents=True, exist_ok=True)
        if resume and self.ckpt_path.exists():
            self.resume(read_checkpoint(self.ckpt_path, self.device))
        else:  # starting over: an earlier run's files must not be read as this run's (a divergence before
            # the first checkpoint would otherwise leave the old metrics.csv standing for this run)
            for stale in (self.run_path / "metrics.csv", self.ckpt_path):
                stale.unlink(missing_ok=True)
        self.good_epoch = self.start_epoch
        text = json.dumps(
            {"train": self.config.to_dict(), "model": dataclasses.asdict(self.model_config),
             "data": self.data.info, "data_fingerprint": self.fingerprint},  # fmt: skip
            indent=2,
            default=str,
        )
        atomic_write_text(self.run_path / "config.json", text)

    def resume(self, state: dict) -> None:
        """Continue from a checkpoint of the same configuration and data (else a ConfigurationError)."""
        config, ckpt_path, fingerprint = self.config, self.ckpt_path, self.fingerprint
        if state.get("format") != CHECKPOINT_FORMAT or comparable_json(state["train_config"]) != comparable_json(
            config.to_dict()
        ):
            raise ConfigurationError(
                f"checkpoint {ckpt_path} was written by a different run configuration or checkpoint format "
                f"({state.get('train_config')}); resuming it with {config.to_dict()} would not "
                "reproduce either run. Use another output directory, or pass resume=False "
                "(`--no-resume`) to start over and overwrite it."
            )
        old = state.get("data") or {}
        if old.get("fingerprint") != fingerprint:
            raise ConfigurationError(
                f"checkpoint {ckpt_path} was trained on other data ({old.get('name')!r} from "
                f"{old.get('source')!r}, fingerprint {old.get('fingerprint')}) than this run loads "
                f"({self.data.name!r} from {self.data_source['source']!r}, fingerprint {fingerprint}); resuming "
                "would train the remaining epochs on other data. Pass the original --data-dir, choose another "
                "--output, or --no-resume to start over"
            )
        if old.get("source") != self.data_source["source"]:
            warnings.warn(
                f"resuming {ckpt_path}: the data now come from {self.data_source['source']!r} instead of "
                f"{old.get('source')!r}, with identical contents (fingerprint {fingerprint})",
                RuntimeWarning,
                stacklevel=5,
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        self.rows = list(state["rows"])
        self.start_epoch, self.step = int(state["epoch"]), int(state["step"])
        self.last_good = ckpt_path

    def save_checkpoint(self, epoch: int) -> None:
        """Write the checkpoint after ``epoch`` (atomically) and ``metrics.csv``."""
        assert self.run_path is not None and self.ckpt_path is not None
        write_checkpoint(
            {
                "format": CHECKPOINT_FORMAT,
                "train_config": self.config.to_dict(),
                "model_config": dataclasses.asdict(self.model_config),
                "epoch": epoch,
                "step": self.step,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "rng": torch.get_rng_state(),
                "rows": self.rows,
                "data": self.data_source,
            },
            self.ckpt_path,
        )
        self.last_good, self.good_epoch = self.ckpt_path, epoch
        atomic_to_csv(metrics_frame(self.rows), self.run_path / "metrics.csv", index=False)

    # ------------------------------------------------------------------ metrics

    def add(self, epoch: int, kind: str, metric: str, value: float, layer=None, head=None) -> None:
        """Append one row of the tidy metrics table."""
        self.rows.append({**self.keys, "epoch": epoch, "step": self.step, "kind": kind, "metric": metric,
                          "layer": layer, "head": head, "value": float(value)})  # fmt: skip

    def diverged(self, what: str, epoch: int) -> TrainingDivergedError:
        """The error for a divergence at the current step, naming the last good checkpoint."""
        config = self.config
        where = (
            f"the last good checkpoint is {self.last_good} (epoch {self.good_epoch}); resume from it "
            "with a lower --lr or a --grad-clip"
            if self.last_good is not None
            else "there is no good checkpoint (none was written yet"
            + (")" if self.run_path else "; no run_dir given)")
        )
        return TrainingDivergedError(
            f"training of preset {config.preset!r} (seed {config.seed}, data {config.data!r}) diverged "
            f"at step {self.step} (epoch {epoch + 1} of {config.epochs}): {what}. {where}. "
            f"Peak lr was {config.lr:g}; a lower learning rate usually avoids this.",
            step=self.step,
            epoch=epoch + 1,
            preset=config.preset,
            checkpoint=self.last_good,
        )

    def diagnostics(self, epoch: int) -> float:
        """Record the hidden-state metrics; returns the seconds spent (left out of epoch times)."""
        t = time.perf_counter()
        try:
            for layer, metric, value in hidden_diagnostics(self.model, self.diag_x):
                self.add(epoch, "hidden", metric, value, layer=layer)
            for layer, head, metric, value in mixing_table(self.model, self.diag_x):
                self.add(epoch, "mixing", metric, value, layer=layer, head=head)
        except NonFiniteError as err:  # NaN/Inf in the hidden states: a divergence, not bad input
            raise self.diverged(f"non-finite hidden states ({err})", epoch) from err
        return time.perf_counter() - t

    def record_initial_state(self) -> None:
        """Epoch 0: the diagnostics and α of the freshly initialised model."""
        self.diagnostics(0)
        for layer, head, a in alpha_values(self.model):
            self.add(0, "alpha", "alpha", a, layer=layer, head=head)

    # ------------------------------------------------------------------ training

    def train_step(self, idx: torch.Tensor, epoch: int) -> tuple[float, int]:
        """One optimiser step on the batch ``idx``; returns (loss · batch size, correct predictions)."""
        config = self.config
        xb, yb = self.data.x_train[idx].to(self.device), self.data.y_train[idx].to(self.device)
        try:
            logits = self.model(xb)
            loss = F.cross_entropy(logits, yb)
        except NonFiniteError as err:  # NaN/Inf activations: a divergence, not bad input
            raise self.diverged(f"non-finite activations ({err})", epoch) from err
        if not torch.isfinite(loss):
            raise self.diverged(f"the loss is {float(loss.detach())}", epoch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), config.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return float(loss.detach()) * len(idx), int((logits.detach().argmax(-1) == yb).sum())

    def run_epoch(self, epoch: int, bar) -> None:
        """Train one epoch, then evaluate, record the epoch's rows and write the checkpoint."""
        config = self.config
        t0 = time.perf_counter()
        order = batch_order(self.n_train, config.seed, epoch)
        loss_sum, correct, diag_seconds = 0.0, 0, 0.0
        for i in range(self.steps_per_epoch):
            idx = order[i * config.batch_size : (i + 1) * config.batch_size]
            batch_loss, batch_correct = self.train_step(idx, epoch)
            loss_sum += batch_loss
            correct += batch_correct
            bar.update(1)
            if config.diag_every and self.step % config.diag_every == 0 and self.step != self.total_steps:
                diag_seconds += self.diagnostics(epoch)
        epoch_time = time.perf_counter() - t0 - diag_seconds
        if not all(torch.isfinite(p).all() for p in self.model.parameters()):
            raise self.diverged("the weights contain NaN/Inf after the epoch's last update", epoch)
        test_acc = self.record_epoch(epoch + 1, loss_sum, correct)
        self.add(epoch + 1, "time", "epoch_time_s", epoch_time)
        bar.set_postfix(loss=f"{loss_sum / self.n_train:.3f}", test_acc=f"{test_acc:.3f}")
        if self.ckpt_path is not None:
            self.save_checkpoint(epoch + 1)

    def record_epoch(self, e: int, loss_sum: float, correct: int) -> float:
        """The rows of epoch ``e``: training and held-out metrics, α, and after the last step the
        diagnostics and the α := 0 ablation. Returns the test accuracy."""
        model, data = self.model, self.data
        test_loss, test_acc = evaluate(model, data.x_test, data.y_test)
        self.add(e, "train", "train_loss", loss_sum / self.n_train)
        self.add(e, "train", "train_accuracy", correct / self.n_train)
        self.add(e, "train", "lr", self.scheduler.get_last_lr()[0])
        self.add(e, "eval", "test_loss", test_loss)
        self.add(e, "eval", "test_accuracy", test_acc)
        if data.x_val is not None:
            val_loss, val_acc = evaluate(model, data.x_val, data.y_val)
            self.add(e, "eval", "val_loss", val_loss)
            self.add(e, "eval", "val_accuracy", val_acc)
        for layer, head, a in alpha_values(model):
            self.add(e, "alpha", "alpha", a, layer=layer, head=head)
        if self.step == self.total_steps:
            self.diagnostics(e)
            if osa_layers(model):
                _, acc_full = evaluate(model, self.heldout_x, self.heldout_y)
                with alpha_zeroed(model):
                    _, acc_zero = evaluate(model, self.heldout_x, self.heldout_y)
                self.add(e, "mixing", f"{self.heldout}_accuracy_alpha0", acc_zero)
                self.add(e, "mixing", f"{self.heldout}_accuracy_alpha0_drop", acc_full - acc_zero)
        return test_acc

    def result(self) -> TrainResult:
        """The finished run."""
        return TrainResult(
            self.config, self.model_config, self.model, metrics_frame(self.rows), self.run_path, self.ckpt_path,
            self.start_epoch,
        )  # fmt: skip


def _train(
    config: TrainConfig,
    run_path: Path | None,
    data: ImageDataset,
    resume: bool,
    device: torch.device,
    progress: bool,
    on_epoch_end: Callable[[int, pd.DataFrame], None] | None,
) -> TrainResult:
    """The body of :func:`train` (with the run folder, if any, locked by the caller)."""
    from tqdm.auto import tqdm

    run = TrainingRun(config, run_path, data, device)
    if run_path is not None:
        run.open_run_folder(resume)
    if run.start_epoch == 0 and run.step == 0:
        run.record_initial_state()
    bar = tqdm(total=run.total_steps, initial=run.step, desc=f"{config.preset} s{config.seed}",
               disable=not progress, leave=False, dynamic_ncols=True)  # fmt: skip
    run.model.train()
    try:
        for epoch in range(run.start_epoch, config.epochs):
            run.run_epoch(epoch, bar)
            if on_epoch_end is not None:
                on_epoch_end(epoch + 1, metrics_frame(run.rows))
    finally:
        bar.close()
    return run.result()
