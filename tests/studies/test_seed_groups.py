"""Seed groups (:mod:`osa_lab.studies.training.group`): each member trains exactly as a solo run
of its seed — a group of one bit for bit, a group of four in float64 to 1e-10 over 50 steps —,
a diverging member stops alone, and checkpoints, metrics and resumption are per member."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

import osa_lab.studies.training as T
from osa_lab.errors import ConfigurationError
from osa_lab.studies.data import load_mnist1d, load_synthetic
from osa_lab.studies.training import TrainConfig, TrainingDivergedError, train
from osa_lab.studies.training.compare import MIN_DEFAULT_GROUP, seed_groups
from osa_lab.studies.training.group import check_group, train_group

TINY = {"depth": 2, "dim": 16, "heads": 2}

pytestmark = pytest.mark.usefixtures("one_torch_thread_per_module")


def tiny(preset: str = "skipless-osa", **kw) -> TrainConfig:
    base = dict(preset=preset, data="synthetic", epochs=2, batch_size=64, lr=3e-3, diag_every=3,
                diag_samples=16, patch_size=4, model=TINY)  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


def deterministic(df: pd.DataFrame) -> pd.DataFrame:
    """Everything except the wall-clock rows."""
    return df[df["kind"] != "time"].reset_index(drop=True)


@pytest.fixture(scope="module")
def data():
    return load_synthetic()


def _assert_same_run(a, b, *, exact: bool, tol: float = 0.0, hidden: bool = True) -> None:
    """Two runs' deterministic metrics and weights: equal, or within ``tol`` (absolute, relative
    above 1). ``hidden=False`` leaves out the hidden-state metrics' values (float32 runs: the
    condition numbers of nearly rank-collapsed states, up to 2e5 here, amplify rounding)."""
    ma, mb = deterministic(a.metrics), deterministic(b.metrics)
    pd.testing.assert_frame_equal(ma.drop(columns="value"), mb.drop(columns="value"))
    if not hidden:
        ma, mb = ma[ma["kind"] != "hidden"], mb[mb["kind"] != "hidden"]
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert list(sa) == list(sb)
    if exact:
        assert ma["value"].equals(mb["value"])
        for name in sa:
            assert torch.equal(sa[name], sb[name]), name
    else:
        scale = mb["value"].abs().clip(lower=1.0)  # condition numbers run to 1e3: relative there
        assert float(((ma["value"] - mb["value"]).abs() / scale).max()) < tol
        for name in sa:
            assert float((sa[name] - sb[name]).abs().max()) < tol, name


@pytest.mark.parametrize("preset", ["skipless-osa", "vit"])
def test_a_group_of_one_is_bit_identical_to_the_solo_loop(tmp_path, data, preset):
    solo = train(tiny(preset), tmp_path / "solo", data=data, progress=False)
    (one,) = train_group([tiny(preset)], [tmp_path / "group"], data=data, progress=False)
    assert one.ok
    _assert_same_run(one.result, solo, exact=True)
    a = torch.load(tmp_path / "solo" / T.CHECKPOINT_NAME, weights_only=True)
    b = torch.load(tmp_path / "group" / T.CHECKPOINT_NAME, weights_only=True)
    assert torch.equal(a["rng"], b["rng"]) and a["step"] == b["step"]
    assert [r for r in a["rows"] if r["kind"] != "time"] == [r for r in b["rows"] if r["kind"] != "time"]
    for name, p in a["optimizer"]["state"].items():  # AdamW's moments too
        assert all(torch.equal(v, b["optimizer"]["state"][name][k]) for k, v in p.items())


@pytest.fixture
def float64(data):
    """The synthetic data in float64 and models built in float64."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    wide = dataclasses.replace(data, x_train=data.x_train.double(), x_test=data.x_test.double())
    try:
        yield wide
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize("preset", ["skipless-osa", "vit", "skipless-ssa"])
def test_each_member_of_a_group_of_four_matches_its_solo_run_in_float64(float64, preset):
    """50 steps (batch 32 of 256: 8 per epoch, 7 epochs = 56): seeds 0–3, member 3 with its own lr."""
    cfgs = [tiny(preset, seed=s, batch_size=32, epochs=7, diag_every=25) for s in range(4)]
    cfgs[3] = dataclasses.replace(cfgs[3], lr=1e-3, alpha_lr_mult=3.0)
    group = train_group(cfgs, data=float64, progress=False)
    assert all(m.ok for m in group) and group[0].result.model.state_dict()  # noqa: PT018
    assert next(iter(group[0].result.model.parameters())).dtype == torch.float64
    for cfg, member in zip(cfgs, group, strict=True):
        solo = train(cfg, data=float64, progress=False)
        assert member.result.metrics["step"].max() == 56
        _assert_same_run(member.result, solo, exact=False, tol=1e-10)
    # the members are different runs (the comparison above could not pass vacuously)
    w0, w1 = (next(iter(m.result.model.parameters())).detach() for m in group[:2])
    assert float((w0 - w1).abs().max()) > 1e-2


PRESETS = ["vit", "skipless-ssa", "skipless-osa", "pure-ssa", "pure-osa", "ssa-cutting-skip",
           "ssa-value-skipinit", "skipless-osa-alpha0", "vit-no-attn", "mlp"]  # fmt: skip


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_trains_in_a_group_as_its_solo_runs(data, preset):
    cfgs = [tiny(preset, seed=s) for s in (0, 1)]
    group = train_group(cfgs, data=data, progress=False)
    for cfg, member in zip(cfgs, group, strict=True):
        _assert_same_run(member.result, train(cfg, data=data, progress=False), exact=False, tol=1e-3, hidden=False)


@pytest.fixture(scope="module")
def mnist1d(tmp_path_factory):
    return load_mnist1d(cache_dir=tmp_path_factory.mktemp("mnist1d"), num_samples=300)


@pytest.mark.parametrize("preset", ["cnn1d", "skipless-osa"])
def test_sequence_presets_train_in_a_group(mnist1d, preset):
    cfgs = [TrainConfig(preset=preset, data="mnist1d", epochs=1, batch_size=50, diag_every=0, diag_samples=8,
                        seed=s, model=TINY) for s in (0, 1, 2)]  # fmt: skip
    group = train_group(cfgs, data=mnist1d, progress=False)
    for cfg, member in zip(cfgs, group, strict=True):
        _assert_same_run(member.result, train(cfg, data=mnist1d, progress=False), exact=False, tol=1e-3, hidden=False)


@pytest.fixture
def seed_1_poisoned(monkeypatch):
    """Seed 1's model is built with an Inf weight in layer 2's attention: it diverges at step 0."""
    real = T.build_training_model

    def build(model_config):
        model = real(model_config)
        if model_config.seed == 1:
            with torch.no_grad():
                model.encoder.blocks[1].attn.to_v.weight.fill_(float("inf"))
        return model

    monkeypatch.setattr(T.loop, "build_training_model", build)


def test_a_diverging_member_stops_alone_with_the_solo_error(tmp_path, data, seed_1_poisoned):
    cfgs = [tiny("skipless-osa", seed=s, diag_every=0) for s in (0, 1, 2)]
    group = train_group(cfgs, [tmp_path / f"seed{s}" for s in (0, 1, 2)], data=data, progress=False)
    assert [m.ok for m in group] == [True, False, True]
    with pytest.raises(TrainingDivergedError) as solo:
        train(cfgs[1], tmp_path / "solo1", data=data, progress=False)
    assert str(group[1].error) == str(solo.value).replace("solo1", "seed1")
    assert group[1].error.step == solo.value.step
    assert not (tmp_path / "seed1" / T.CHECKPOINT_NAME).exists()  # it never got past step 0
    for s in (0, 2):  # the others finished, each as its solo run
        assert (tmp_path / f"seed{s}" / T.CHECKPOINT_NAME).exists()
        _assert_same_run(group[s].result, train(cfgs[s], data=data, progress=False), exact=False, tol=1e-4, hidden=False)


@pytest.fixture
def seed_1_nan_gradient_at_step_5(monkeypatch):
    """Seed 1's first weight gets a NaN gradient in the backward of step 5 (the 6th): its forward
    at step 6 (epoch 2 of 4 steps each) is the first non-finite one, after epoch 1's checkpoint."""
    real = T.build_training_model

    def build(model_config):
        model = real(model_config)
        if model_config.seed == 1:
            calls = []

            def poison(grad: torch.Tensor) -> torch.Tensor:
                calls.append(1)
                return grad * float("nan") if len(calls) == 6 else grad

            next(iter(model.parameters())).register_hook(poison)
        return model

    monkeypatch.setattr(T.loop, "build_training_model", build)


def test_a_member_that_diverges_mid_run_keeps_its_last_good_checkpoint(tmp_path, data, seed_1_nan_gradient_at_step_5):
    cfgs = [tiny("skipless-osa", seed=s, epochs=3, diag_every=0) for s in (0, 1, 2)]
    group = train_group(cfgs, [tmp_path / f"seed{s}" for s in (0, 1, 2)], data=data, progress=False)
    assert [m.ok for m in group] == [True, False, True]
    with pytest.raises(TrainingDivergedError) as solo:
        train(cfgs[1], tmp_path / "solo", data=data, progress=False)
    err = group[1].error
    assert (err.step, err.epoch) == (solo.value.step, solo.value.epoch) == (6, 2)
    assert err.checkpoint == tmp_path / "seed1" / T.CHECKPOINT_NAME and "(epoch 1)" in str(err)
    assert torch.load(err.checkpoint, weights_only=True)["epoch"] == 1
    assert T.load_metrics(tmp_path / "seed1" / "metrics.csv")["epoch"].max() == 1
    for s in (0, 2):
        assert group[s].result.metrics["epoch"].max() == 3
        _assert_same_run(group[s].result, train(cfgs[s], data=data, progress=False), exact=False, tol=1e-4,
                         hidden=False)  # fmt: skip


def test_members_resume_each_from_its_own_checkpoint(tmp_path, data):
    cfgs = [tiny("skipless-osa", seed=s, epochs=3) for s in (0, 1, 2)]
    full = [train(c, data=data, progress=False) for c in cfgs]

    class SimulatedCrashError(Exception):
        pass

    def stop_after(epoch_to_stop):
        def stop(epoch, _):
            if epoch == epoch_to_stop:
                raise SimulatedCrashError

        return stop

    dirs = [tmp_path / f"seed{c.seed}" for c in cfgs]
    with pytest.raises(SimulatedCrashError):  # seeds 0 and 1 together, cut after epoch 1
        train_group(cfgs[:2], dirs[:2], data=data, progress=False, on_epoch_end=stop_after(1))
    with pytest.raises(SimulatedCrashError):  # seed 1 alone gets one epoch further
        train(cfgs[1], dirs[1], data=data, progress=False, on_epoch_end=stop_after(2))
    # seed 0 resumes from epoch 1, seed 1 from epoch 2, seed 2 starts: one group
    group = train_group(cfgs, dirs, data=data, progress=False)
    assert [m.result.resumed_from_epoch for m in group] == [1, 2, 0]
    for member, solo, d in zip(group, full, dirs, strict=True):
        _assert_same_run(member.result, solo, exact=False, tol=1e-4, hidden=False)
        on_disk = T.load_metrics(d / "metrics.csv")
        pd.testing.assert_frame_equal(deterministic(on_disk), deterministic(member.result.metrics), check_dtype=False)


def test_a_group_refuses_members_that_differ_in_more_than_seed_and_lr():
    check_group([tiny(seed=0), tiny(seed=1, lr=1e-2, alpha_lr_mult=2.0)])  # allowed
    with pytest.raises(ConfigurationError, match="must share `preset`"):
        check_group([tiny("vit"), tiny("skipless-osa", seed=1)])
    with pytest.raises(ConfigurationError, match="must share `epochs`"):
        check_group([tiny(seed=0), tiny(seed=1, epochs=5)])
    with pytest.raises(ConfigurationError, match="repeated seeds"):
        check_group([tiny(seed=0), tiny(seed=0, lr=1e-2)])
    with pytest.raises(ConfigurationError, match="at least one"):
        check_group([])


# ----------------------------------------------------------------------------- command line and comparison

CLI = ["train", "--preset", "skipless-osa", "--data", "synthetic", "--epochs", "1", "--depth", "2", "--dim", "16",
       "--heads", "2", "--patch-size", "4", "--diag-every", "0", "--quiet", "--serial"]  # fmt: skip


@pytest.fixture
def groups_trained(monkeypatch):
    """The seed lists of every train_group call."""
    from osa_lab.studies.training import group

    seen, real = [], group.train_group

    def spy(configs, *args, **kwargs):
        seen.append([c.seed for c in configs])
        return real(configs, *args, **kwargs)

    monkeypatch.setattr(group, "train_group", spy)
    return seen


def test_cli_trains_several_seeds_as_one_group_and_writes_the_files_per_seed(tmp_path, groups_trained):
    from osa_lab.cli import main as cli_main

    seeds = [str(s) for s in range(6)]
    assert cli_main([*CLI, "--seeds", *seeds, "--output", str(tmp_path / "group")]) == 0
    assert groups_trained == [list(range(6))]
    assert cli_main([*CLI, "--seeds", *seeds, "--group-size", "1", "--output", str(tmp_path / "solo")]) == 0
    assert groups_trained[1:] == [[s] for s in range(6)]
    for seed in range(6):
        files = sorted(p.name for p in (tmp_path / "group" / "skipless-osa" / f"seed{seed}").iterdir())
        assert files == sorted(p.name for p in (tmp_path / "solo" / "skipless-osa" / f"seed{seed}").iterdir())
        assert {"metrics.csv", "config.json", T.CHECKPOINT_NAME} <= set(files)
    runs = pd.read_csv(tmp_path / "group" / "runs.csv")
    assert runs["seed"].tolist() == list(range(6)) and (runs["status"] == "ok").all()
    grouped, alone = (pd.read_csv(tmp_path / d / "metrics.csv") for d in ("group", "solo"))
    pd.testing.assert_frame_equal(deterministic(grouped).drop(columns="value"), deterministic(alone).drop(columns="value"))
    assert float((deterministic(grouped)["value"] - deterministic(alone)["value"]).abs().max()) < 1e-3


def test_cli_group_size_splits_the_seeds(tmp_path, groups_trained):
    from osa_lab.cli import main as cli_main

    assert cli_main([*CLI, "--seeds", "0", "1", "2", "--group-size", "2", "--output", str(tmp_path)]) == 0
    assert groups_trained == [[0, 1], [2]]


def test_cli_trains_fewer_than_six_seeds_alone_by_default_and_groups_them_when_asked(tmp_path, groups_trained):
    """Groups of 2 or 3 cost more per seed than solo runs: the default groups only from six seeds up."""
    from osa_lab.cli import main as cli_main

    assert cli_main([*CLI, "--seeds", "0", "1", "2", "3", "4", "--output", str(tmp_path / "a")]) == 0
    assert groups_trained == [[0], [1], [2], [3], [4]]
    assert cli_main([*CLI, "--seeds", "0", "1", "2", "--group-size", "3", "--output", str(tmp_path / "b")]) == 0
    assert groups_trained[5:] == [[0, 1, 2]]


@pytest.mark.parametrize(
    ("seeds", "size", "groups"),
    [([5], None, [[5]]), ([0, 1], None, [[0], [1]]), ([0, 1, 2], None, [[0], [1], [2]]),
     ([0, 1, 2, 3, 4], None, [[0], [1], [2], [3], [4]]), (list(range(6)), None, [list(range(6))]),
     (list(range(10)), None, [list(range(10))]),
     ([0, 1, 2], 2, [[0, 1], [2]]), ([0, 1], 2, [[0, 1]]), ([3, 1, 2, 0], 1, [[3], [1], [2], [0]])],
)  # fmt: skip
def test_seed_groups_default_rule_groups_from_six_seeds_up(seeds, size, groups):
    assert seed_groups(seeds, size) == groups
    assert MIN_DEFAULT_GROUP == 6


@pytest.mark.parametrize("size", [0, -1, 2.0, True])
def test_seed_groups_refuses_a_size_that_is_not_a_positive_int(size):
    with pytest.raises(ConfigurationError, match="seed-group size must be a positive int"):
        seed_groups([0, 1], size)


def test_cli_refuses_a_group_size_below_one(tmp_path, capsys):
    from osa_lab.cli import main as cli_main

    assert cli_main([*CLI, "--seeds", "0", "1", "--group-size", "0", "--output", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--group-size must be a positive number" in err[0]
    assert not (tmp_path / "x").exists()


def test_compare_records_a_diverging_member_and_keeps_the_others(tmp_path, data, seed_1_poisoned):
    metrics, summary = T.compare(["skipless-osa"], [0, 1, 2], tiny(diag_every=0), tmp_path, progress=False, group_size=3)
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert runs.set_index("seed")["status"].to_dict() == {0: "ok", 1: "diverged", 2: "ok"}
    assert "step 0" in runs.set_index("seed").loc[1, "error"]
    assert int(summary.loc[0, "seeds"]) == 2 and int(summary.loc[0, "diverged"]) == 1
