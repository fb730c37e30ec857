"""Seed groups: G runs of one configuration that differ in seed (and optionally learning rate),
trained together in one batched forward and backward.

At the study's sizes (width 32, batch 100) a training step costs mostly per-operation overhead,
not arithmetic; a group pays that overhead once for G models. Each member stays a whole
:class:`~osa_lab.studies.training.loop.TrainingRun` of its own — its model initialised from its
seed, its data order, its AdamW state, warm-up and cosine schedule, its gradient clipping, its α
learning rate, its metrics, checkpoint and run folder — and only the forward and backward of a
step are shared: the members' parameters are stacked along a leading member dimension
(``torch.stack``, differentiable, so each member's ``.grad`` receives exactly its own gradient)
and the model runs once under ``torch.func.vmap`` over :func:`torch.func.functional_call`.

Why ``vmap`` over stacked parameters and not layers with a member dimension: every preset (OSA,
SSA, Cutting the Skip, the controls, ``mlp``, ``cnn1d``) and every OSA engine works unchanged,
the members remain ordinary modules (checkpoints, diagnostics and evaluation are the solo code),
and a group of one is today's loop itself (:meth:`TrainingRun.train_step`), bit for bit. Under
``vmap`` the OSA layers take the PyTorch path (the CPU kernels' autograd Functions step aside,
see :func:`osa_lab.ops.expm.batch.under_transform`) and the finiteness checks decide on the
whole group; a group step that raises one or gives a non-finite loss is replayed member by
member (each member's own forward, as a solo run would take it), so the members that diverge
stop alone with the solo run's :class:`~osa_lab.errors.TrainingDivergedError` and the others
finish.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from osa_lab.errors import ConfigurationError, NonFiniteError, TrainingDivergedError
from osa_lab.nn.attention import SoftmaxAttention
from osa_lab.studies.data import ImageDataset, load_data, split_validation
from osa_lab.studies.training.config import TrainConfig, check_names, resolve_device
from osa_lab.studies.training.lock import RunLock, check_output_dir
from osa_lab.studies.training.loop import TrainingRun, TrainResult, batch_order, check_dataset
from osa_lab.studies.training.tables import metrics_frame

#: the fields in which the members of a group may differ (each member has its own optimiser)
MEMBER_FIELDS = ("seed", "lr", "alpha_lr_mult")


@dataclass
class MemberOutcome:
    """One member of a group: its result, or the divergence that stopped it alone."""

    config: TrainConfig
    result: TrainResult | None
    error: TrainingDivergedError | None
    run_dir: Path | None

    @property
    def ok(self) -> bool:
        return self.error is None


def check_group(configs: Sequence[TrainConfig]) -> None:
    """Refuse a group whose members differ in anything but :data:`MEMBER_FIELDS` or repeat a seed."""
    if not configs:
        raise ConfigurationError("a seed group needs at least one configuration")
    first = configs[0]
    for cfg in configs[1:]:
        for f in dataclasses.fields(TrainConfig):
            if f.name not in MEMBER_FIELDS and getattr(cfg, f.name) != getattr(first, f.name):
                raise ConfigurationError(
                    f"the members of a seed group must share `{f.name}` (got {getattr(first, f.name)!r} and "
                    f"{getattr(cfg, f.name)!r}); they may differ only in {', '.join(MEMBER_FIELDS)}: "
                    "train the other configurations in groups of their own"
                )
    seeds = [c.seed for c in configs]
    if len(set(seeds)) != len(seeds):
        raise ConfigurationError(
            f"a seed group has repeated seeds {seeds}; each member's run folder and data order is its seed's"
        )


class GroupMember:
    """A member's run with its own global-RNG state, swapped in around everything it does alone
    (so that its checkpoints hold exactly the state of a solo run of its seed)."""

    def __init__(self, run: TrainingRun, run_dir: Path | None) -> None:
        self.run, self.run_dir = run, run_dir
        self.rng = torch.get_rng_state()
        self.error: TrainingDivergedError | None = None
        self.loss_sum, self.correct, self.diag_seconds = 0.0, 0, 0.0

    @contextlib.contextmanager
    def own_rng(self) -> Iterator[None]:
        outer = torch.get_rng_state()
        torch.set_rng_state(self.rng)
        try:
            yield
        finally:
            self.rng = torch.get_rng_state()
            torch.set_rng_state(outer)


class _GroupStep:
    """The members' parameters stacked along a leading member dimension and the model run once
    under ``vmap``: ``losses[m] = cross_entropy(model_m(x[m]), y[m])``. ``Σ_m losses[m]`` is
    backpropagated, which gives each member's parameters the gradient of its own loss."""

    def __init__(self, members: list[GroupMember]) -> None:
        self.members = members
        self.model = members[0].run.model  # the structure to call (its own tensors are swapped out)
        self.names = [name for name, _ in self.model.named_parameters()]
        self.buffer_names = [name for name, _ in self.model.named_buffers()]
        self.params = [dict(m.run.model.named_parameters()) for m in members]
        self.buffers = [dict(m.run.model.named_buffers()) for m in members]

        def member_loss(params: dict, buffers: dict, x: torch.Tensor, y: torch.Tensor):
            logits = functional_call(self.model, (params, buffers), (x,))
            return F.cross_entropy(logits, y), logits

        self.forward = vmap(member_loss)

    def __call__(self, xb: torch.Tensor, yb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(losses (G,), logits (G, B, classes))`` of the stacked batches ``xb (G, B, …)``."""
        params = {n: torch.stack([p[n] for p in self.params]) for n in self.names}
        buffers = {n: torch.stack([b[n] for b in self.buffers]) for n in self.buffer_names}
        with explicit_softmax(self.model):
            return self.forward(params, buffers, xb, yb)


@contextlib.contextmanager
def explicit_softmax(model: nn.Module) -> Iterator[None]:
    """Softmax attention by plain tensor operations inside the block: ``vmap`` has no batching rule
    for the CPU's fused SDPA kernel and would loop over the members (the same function to
    rounding, as under :func:`~osa_lab.nn.models.functional_mode`)."""
    layers = [m for m in model.modules() if isinstance(m, SoftmaxAttention) and not m.explicit_softmax]
    for m in layers:
        m.explicit_softmax = True
    try:
        yield
    finally:
        for m in layers:
            m.explicit_softmax = False


def _solo_forward_error(member: GroupMember, xb: torch.Tensor, yb: torch.Tensor, epoch: int) -> TrainingDivergedError | None:
    """The divergence a solo run of ``member`` would report at this step's forward, if any."""
    run = member.run
    with torch.no_grad(), member.own_rng():
        try:
            loss = F.cross_entropy(run.model(xb), yb)
        except NonFiniteError as err:
            return run.diverged(f"non-finite activations ({err})", epoch)
        if not torch.isfinite(loss):
            return run.diverged(f"the loss is {float(loss)}", epoch)
    return None


def _optimiser_step(run: TrainingRun, *, foreach: bool = False) -> None:
    """A member's update after its gradients are in: its clipping, AdamW step and schedule.

    ``foreach``: AdamW's multi-tensor path for this step (the same update as the solo run's
    single-tensor path to rounding, and cheaper on CPU at the study's sizes: see the
    ``adamw_*_ms`` columns of ``benchmarks/seed_group_floor.py``). The optimiser's own setting is restored
    afterwards, so a member's checkpoint is a solo run's."""
    if run.config.grad_clip is not None:
        nn.utils.clip_grad_norm_(run.model.parameters(), run.config.grad_clip)
    saved = [g.get("foreach") for g in run.optimizer.param_groups]
    if foreach:
        for g in run.optimizer.param_groups:
            g["foreach"] = True
    try:
        run.optimizer.step()
    finally:
        for g, value in zip(run.optimizer.param_groups, saved, strict=True):
            g["foreach"] = value
    run.scheduler.step()
    run.step += 1


class SeedGroup:
    """G member runs trained together (see the module doc); :func:`train_group` drives it."""

    def __init__(self, members: list[GroupMember], device: torch.device, *, member_foreach: bool = True) -> None:
        self.members, self.device = members, device
        #: the members' AdamW steps by the multi-tensor path (see :func:`_optimiser_step`)
        self.member_foreach = member_foreach
        self._step_fn: _GroupStep | None = None
        self._step_for: tuple[int, ...] = ()

    def active(self, epoch: int) -> list[GroupMember]:
        return [m for m in self.members if m.error is None and m.run.start_epoch <= epoch]

    def _stepper(self, members: list[GroupMember]) -> _GroupStep:
        key = tuple(id(m) for m in members)
        if self._step_fn is None or key != self._step_for:
            self._step_fn, self._step_for = _GroupStep(members), key
        return self._step_fn

    def step(self, members: list[GroupMember], idxs: list[torch.Tensor], epoch: int) -> list[GroupMember]:
        """One optimiser step of every member in ``members`` on its batch; returns the members that
        diverged at this step (their ``error`` set, their state left as at the step's start)."""
        if len(members) == 1:  # a group of one is the solo loop itself
            m = members[0]
            try:
                with m.own_rng():
                    loss, correct = m.run.train_step(idxs[0], epoch)
            except TrainingDivergedError as err:
                m.error = err
                return [m]
            m.loss_sum += loss
            m.correct += correct
            return []
        data = members[0].run.data
        xb = torch.stack([data.x_train[i] for i in idxs]).to(self.device)
        yb = torch.stack([data.y_train[i] for i in idxs]).to(self.device)
        try:
            losses, logits = self._stepper(members)(xb, yb)
            finite = bool(torch.isfinite(losses.detach()).all())
        except NonFiniteError:
            finite = False
        if not finite:  # replay the forward member by member: who diverged, with the solo run's error
            failed = []
            for m, x, y in zip(members, xb, yb, strict=True):
                m.error = _solo_forward_error(m, x, y, epoch)
                if m.error is not None:
                    failed.append(m)
            rest = [m for m, i in zip(members, idxs, strict=True) if m.error is None]
            if not failed:  # the group's check fired but no member's own does: step them one by one
                for m, i in zip(members, idxs, strict=True):
                    failed += self.step([m], [i], epoch)
                return failed
            rest_idx = [i for m, i in zip(members, idxs, strict=True) if m.error is None]
            return failed + (self.step(rest, rest_idx, epoch) if rest else [])
        for m in members:
            m.run.optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        losses, correct = losses.detach(), (logits.detach().argmax(-1) == yb).sum(-1)
        for g, (m, i) in enumerate(zip(members, idxs, strict=True)):
            _optimiser_step(m.run, foreach=self.member_foreach)
            m.loss_sum += float(losses[g]) * len(i)
            m.correct += int(correct[g])
        return []


def train_group(
    configs: Sequence[TrainConfig],
    run_dirs: Sequence[str | os.PathLike | None] | None = None,
    *,
    data: ImageDataset | None = None,
    resume: bool = True,
    device: str | torch.device = "cpu",
    progress: bool = True,
    data_dir: str | os.PathLike | None = None,
    on_epoch_end: Callable[[int, dict[int, pd.DataFrame]], None] | None = None,
) -> list[MemberOutcome]:
    """Train the runs ``configs`` (one configuration, differing in seed and optionally ``lr`` /
    ``alpha_lr_mult``) as one seed group; see the module doc.

    Each member writes what :func:`~osa_lab.studies.training.train` writes for its config to its
    ``run_dirs`` entry (``metrics.csv``, ``config.json``, ``checkpoint.pt``) and resumes from its
    own checkpoint (members may resume from different epochs). A member that diverges stops
    alone: its outcome carries the :class:`TrainingDivergedError` a solo run would raise and its
    folder keeps its last good checkpoint. ``epoch_time_s`` of a member is the group's training
    time of the epoch divided by the members it trained (the per-seed cost).
    ``on_epoch_end(epoch, {seed: metrics})`` is called after each epoch's checkpoints.

    Returns one :class:`MemberOutcome` per config, in order.
    """
    configs = list(configs)
    check_group(configs)
    check_names([configs[0].preset], configs[0].data)
    dirs = list(run_dirs) if run_dirs is not None else [None] * len(configs)
    if len(dirs) != len(configs):
        raise ConfigurationError(f"train_group got {len(configs)} configs but {len(dirs)} run folders")
    device = resolve_device(device)
    first = configs[0]
    if data is None:
        data = load_data(first.data, data_dir=data_dir, **first.data_options)
    if first.val_fraction > 0 and data.x_val is None:
        data = split_validation(data, first.val_fraction)
    check_dataset(data)
    paths = [check_output_dir(d) if d is not None else None for d in dirs]
    with contextlib.ExitStack() as locks:
        for p in paths:
            if p is not None:
                locks.enter_context(RunLock(p))
        return _train_group(configs, paths, data, resume, device, progress, on_epoch_end)


def _train_group(configs, paths, data, resume, device, progress, on_epoch_end) -> list[MemberOutcome]:
    from tqdm.auto import tqdm

    outer = torch.get_rng_state()
    members = []
    for cfg, path in zip(configs, paths, strict=True):
        run = TrainingRun(cfg, path, data, device)  # seeds the global RNG with cfg.seed, as train() does
        if path is not None:
            run.open_run_folder(resume)
        member = GroupMember(run, path)
        if run.start_epoch == 0 and run.step == 0:
            try:
                with member.own_rng():
                    run.record_initial_state()
            except TrainingDivergedError as err:
                member.error = err
        members.append(member)
    torch.set_rng_state(outer)
    group = SeedGroup(members, device)
    total = sum(m.run.total_steps for m in members)
    seeds = ",".join(str(c.seed) for c in configs)
    bar = tqdm(total=total, initial=sum(m.run.step for m in members), desc=f"{first_preset(configs)} seeds {seeds}",
               disable=not progress, leave=False, dynamic_ncols=True)  # fmt: skip
    for m in members:
        m.run.model.train()
    try:
        for epoch in range(min(m.run.start_epoch for m in members), configs[0].epochs):
            _group_epoch(group, epoch, bar)
            if on_epoch_end is not None:
                on_epoch_end(epoch + 1, {m.run.config.seed: metrics_frame(m.run.rows) for m in members})
    finally:
        bar.close()
    return [MemberOutcome(m.run.config, m.run.result() if m.error is None else None, m.error, m.run_dir)
            for m in members]  # fmt: skip


def first_preset(configs: Sequence[TrainConfig]) -> str:
    return configs[0].preset


def _group_epoch(group: SeedGroup, epoch: int, bar) -> None:
    """One epoch of every active member: the shared steps, then each member's own epoch end
    (weights check, evaluation, diagnostics, checkpoint) as in :meth:`TrainingRun.run_epoch`."""
    members = group.active(epoch)
    if not members:
        return
    run0 = members[0].run
    orders = {id(m): batch_order(m.run.n_train, m.run.config.seed, epoch) for m in members}
    for m in members:
        m.loss_sum, m.correct, m.diag_seconds = 0.0, 0, 0.0
    batch = run0.config.batch_size
    train_seconds, t_step = 0.0, time.perf_counter()
    for i in range(run0.steps_per_epoch):
        live = [m for m in members if m.error is None]
        if not live:
            break
        idxs = [orders[id(m)][i * batch : (i + 1) * batch] for m in live]
        group.step(live, idxs, epoch)
        bar.update(len(live))
        train_seconds += time.perf_counter() - t_step
        for m in live:
            run = m.run
            if m.error is None and run.config.diag_every and run.step % run.config.diag_every == 0 and run.step != run.total_steps:
                try:
                    with m.own_rng():
                        run.diagnostics(epoch)
                except TrainingDivergedError as err:
                    m.error = err
        t_step = time.perf_counter()
        n_live = sum(m.error is None for m in members)
        bar.set_postfix(members=f"{n_live}/{len(group.members)}", step=i + 1)
    trained = [m for m in members if m.error is None]
    for m in trained:
        run = m.run
        try:
            with m.own_rng():
                if not all(torch.isfinite(p).all() for p in run.model.parameters()):
                    raise run.diverged("the weights contain NaN/Inf after the epoch's last update", epoch)
                run.record_epoch(epoch + 1, m.loss_sum, m.correct)
                run.add(epoch + 1, "time", "epoch_time_s", train_seconds / len(members))
                if run.ckpt_path is not None:
                    run.save_checkpoint(epoch + 1)
        except TrainingDivergedError as err:
            m.error = err
