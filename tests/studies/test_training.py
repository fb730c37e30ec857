"""Training loop: determinism, resume = uninterrupted, divergence errors, tidy metrics, comparison, CLI.

All runs use the synthetic task (256 train / 128 test 8×8 images) and tiny models (depth 2,
dim 16, 4 tokens) so the whole file runs in well under a minute on 2 cores.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest
import torch
from torch import nn

import osa_lab.studies.training as T
from osa_lab.cli import main as cli_main
from osa_lab.errors import ConfigurationError, UnknownNameError
from osa_lab.nn.models import osa_layers
from osa_lab.studies.data import load_synthetic
from osa_lab.studies.training import TrainConfig, TrainingDivergedError, compare, summarize_runs, train
from osa_lab.studies.training.statistics import finished_run_metrics

TINY = {"depth": 2, "dim": 16, "heads": 2}


def tiny(preset: str = "skipless-osa", **kw) -> TrainConfig:
    base = dict(preset=preset, data="synthetic", epochs=3, batch_size=64, lr=3e-3, diag_every=2,
                diag_samples=16, patch_size=4, model=TINY)  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


pytestmark = pytest.mark.usefixtures("one_torch_thread_per_module")

@pytest.fixture(scope="module")
def data():
    return load_synthetic()


def deterministic(df: pd.DataFrame) -> pd.DataFrame:
    """Everything except the wall-clock rows."""
    return df[df["kind"] != "time"].reset_index(drop=True)


def test_two_runs_give_identical_metrics_and_weights(data):
    a = train(tiny(), data=data, progress=False)
    b = train(tiny(), data=data, progress=False)
    pd.testing.assert_frame_equal(deterministic(a.metrics), deterministic(b.metrics))
    for (name, p), q in zip(a.model.state_dict().items(), b.model.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    # a different seed gives a different run (the test above could not pass vacuously)
    c = train(tiny(seed=1), data=data, progress=False)
    assert not deterministic(c.metrics)["value"].equals(deterministic(a.metrics)["value"])


def test_metrics_table_is_tidy_and_complete(data):
    from osa_lab.studies.metrics import METRICS

    cfg = tiny()
    m = train(cfg, data=data, progress=False).metrics
    assert list(m.columns) == list(T.COLUMNS)
    per_epoch = {"train_loss", "train_accuracy", "lr", "test_loss", "test_accuracy", "epoch_time_s"}
    for metric in per_epoch:
        assert m.loc[m["metric"] == metric, "epoch"].tolist() == [1, 2, 3], metric
    # α of every OSA layer and head at init and after each epoch
    alpha = m[m["kind"] == "alpha"]
    assert len(alpha) == 4 * TINY["depth"] * TINY["heads"]
    assert set(alpha["layer"]) == {0, 1} and set(alpha["head"]) == {0, 1}
    assert alpha["value"].nunique() > TINY["depth"] * TINY["heads"]  # α is learned, it moves
    # hidden-state diagnostics: every metric at every layer (0 = input … depth) at steps 0, 2, 4, …, last
    hidden = m[m["kind"] == "hidden"]
    assert set(hidden["metric"]) == set(METRICS)
    assert set(hidden["layer"]) == set(range(TINY["depth"] + 1))
    steps_per_epoch = math.ceil(256 / 64)
    assert sorted(hidden["step"].unique()) == [0, 2, 4, 6, 8, 10, 12]
    assert hidden["step"].max() == 3 * steps_per_epoch
    assert hidden["value"].notna().all()
    # lr follows the cosine schedule down to zero at the end
    lr = m.loc[m["metric"] == "lr", "value"].tolist()
    assert lr[0] > lr[1] > lr[2] == pytest.approx(0.0, abs=1e-12)


def test_ssa_runs_have_no_alpha_rows(data):
    m = train(tiny("vit", epochs=1), data=data, progress=False).metrics
    assert (m["kind"] == "alpha").sum() == 0
    assert (m["kind"] == "hidden").sum() > 0


def test_training_learns_the_synthetic_task(data):
    res = train(tiny("vit", epochs=6, lr=3e-3), data=data, progress=False)
    first = res.metrics.query("metric == 'train_loss'")["value"].iloc[0]
    assert res.final("train_loss") < 0.5 * first
    assert res.final("test_accuracy") > 0.8  # chance is 0.25


def test_resume_equals_uninterrupted(tmp_path, data):
    full = train(tiny(epochs=4), tmp_path / "full", data=data, progress=False)

    class SimulatedCrashError(Exception):
        pass

    def stop_after_two(epoch, _):
        if epoch == 2:
            raise SimulatedCrashError

    with pytest.raises(SimulatedCrashError):
        train(tiny(epochs=4), tmp_path / "cut", data=data, progress=False, on_epoch_end=stop_after_two)
    on_disk = T.load_metrics(tmp_path / "cut" / "metrics.csv")
    assert on_disk["epoch"].max() == 2  # at most the interrupted epoch is lost
    resumed = train(tiny(epochs=4), tmp_path / "cut", data=data, progress=False)
    assert resumed.resumed_from_epoch == 2
    pd.testing.assert_frame_equal(deterministic(resumed.metrics), deterministic(full.metrics))
    for (name, p), q in zip(
        full.model.state_dict().items(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.equal(p, q), name
    # the CSV on disk matches the returned table
    pd.testing.assert_frame_equal(
        deterministic(T.load_metrics(tmp_path / "cut" / "metrics.csv")), deterministic(resumed.metrics),
        check_dtype=False,
    )  # fmt: skip
    # a finished run is returned from its checkpoint without training again
    again = train(tiny(epochs=4), tmp_path / "cut", data=data, progress=False)
    assert again.resumed_from_epoch == 4
    pd.testing.assert_frame_equal(again.metrics, resumed.metrics)


def test_resume_refuses_a_checkpoint_of_another_config(tmp_path, data):
    train(tiny(epochs=1), tmp_path, data=data, progress=False)
    with pytest.raises(ConfigurationError, match="different run configuration"):
        train(tiny(epochs=2), tmp_path, data=data, progress=False)
    # --no-resume starts over
    res = train(tiny(epochs=2), tmp_path, data=data, progress=False, resume=False)
    assert res.resumed_from_epoch == 0 and res.metrics["epoch"].max() == 2


class NaNAfter(nn.Module):
    """Wraps a classifier and returns NaN logits from the ``n``-th training call on."""

    def __init__(self, inner: nn.Module, n: int) -> None:
        super().__init__()
        self.inner, self.n, self.calls = inner, n, 0

    def forward(self, x, return_hidden=False):
        if return_hidden:
            return self.inner(x, return_hidden=True)
        if self.training:
            self.calls += 1
            if self.calls >= self.n:
                return self.inner(x) * float("nan")
        return self.inner(x)


@pytest.fixture
def nan_at_step_6(monkeypatch):
    real = T.build_training_model
    monkeypatch.setattr(T.loop, "build_training_model", lambda cfg: NaNAfter(real(cfg), 7))  # 7th call = step 6


def test_diverging_run_names_step_preset_and_last_checkpoint(tmp_path, data, nan_at_step_6):
    with pytest.raises(TrainingDivergedError) as err:
        train(tiny("skipless-ssa", epochs=3), tmp_path, data=data, progress=False)
    msg = str(err.value)
    assert "step 6" in msg and "'skipless-ssa'" in msg and "nan" in msg.lower()
    ckpt = tmp_path / T.CHECKPOINT_NAME
    assert str(ckpt) in msg and "epoch 1" in msg  # 4 steps per epoch: epoch 1 was the last good one
    assert err.value.step == 6 and err.value.checkpoint == ckpt
    assert torch.load(ckpt, weights_only=False)["epoch"] == 1


def test_diverging_run_without_checkpoint_says_so(data, nan_at_step_6):
    with pytest.raises(TrainingDivergedError, match="no good checkpoint"):
        train(tiny("vit"), data=data, progress=False)


def test_nan_in_hidden_states_is_reported_as_divergence(data, monkeypatch):
    real = T.build_training_model

    def poisoned(cfg):
        model = real(cfg)
        with torch.no_grad():
            model.encoder.blocks[1].attn.to_v.weight.fill_(float("inf"))
        return model

    monkeypatch.setattr(T.loop, "build_training_model", poisoned)
    with pytest.raises(TrainingDivergedError, match=r"step 0 .*layer 2"):
        train(tiny("skipless-ssa"), data=data, progress=False)


def test_unknown_names_list_the_valid_ones(data):
    with pytest.raises(UnknownNameError, match="skipless-osa") as err:
        train(tiny("skipless-osaa"), data=data, progress=False)
    assert "vit" in str(err.value)
    with pytest.raises(UnknownNameError, match="digits"):
        train(tiny(data="cifar10"), progress=False)


def test_compare_summarises_presets_and_records_divergence(tmp_path, data, monkeypatch):
    real = T.build_training_model
    # make every skipless-ssa run diverge; the others must still run and be summarised
    monkeypatch.setattr(
        T.loop,
        "build_training_model",
        lambda cfg: NaNAfter(real(cfg), 3) if cfg.attention == "ssa" and not cfg.skip else real(cfg),
    )
    base = tiny(epochs=2)
    metrics, summary = compare(
        ["vit", "skipless-osa", "skipless-ssa"], [0, 1], base, tmp_path, progress=False
    )
    assert summary["preset"].tolist() == ["vit", "skipless-osa", "skipless-ssa"]
    row = summary.set_index("preset")
    assert row.loc["vit", "seeds"] == 2 and row.loc["skipless-ssa", "diverged"] == 2
    assert math.isnan(row.loc["skipless-ssa", "test_accuracy_mean"])
    finals = metrics.query("preset == 'vit' and metric == 'test_accuracy' and epoch == 2")["value"]
    assert row.loc["vit", "test_accuracy_mean"] == pytest.approx(finals.mean())
    assert row.loc["vit", "test_accuracy_std"] == pytest.approx(finals.std(ddof=1))
    assert row.loc["skipless-osa", "params"] > 0
    for name in ("metrics.csv", "summary.csv", "runs.csv"):
        assert (tmp_path / name).exists()
    assert (tmp_path / "skipless-osa" / "seed1" / T.CHECKPOINT_NAME).exists()


def test_summarise_golden_values():
    rows = []
    for seed, (acc, t) in enumerate([(0.90, 1.0), (0.94, 3.0), (0.98, 2.0)]):
        for metric, val in (("test_accuracy", acc), ("train_accuracy", 1.0), ("train_loss", 0.1),
                            ("epoch_time_s", t)):  # fmt: skip
            rows.append(dict(preset="p", data="d", seed=seed, epoch=5, step=50, kind="x", metric=metric,
                             layer=None, head=None, value=val))  # fmt: skip
        rows.append(dict(preset="p", data="d", seed=seed, epoch=4, step=40, kind="eval",
                         metric="test_accuracy", layer=None, head=None, value=0.0))  # fmt: skip
    s = summarize_runs(T.metrics_frame(rows)).iloc[0]
    assert s["test_accuracy_mean"] == pytest.approx(0.94)
    assert s["test_accuracy_std"] == pytest.approx(0.04)
    assert s["epoch_time_s_mean"] == pytest.approx(2.0) and s["seeds"] == 3 and s["epochs"] == 5
    text = T.format_summary(summarize_runs(T.metrics_frame(rows)))
    assert text["test acc %"].iloc[0] == "94.0 ± 4.0"


def test_lr_schedule_warmup_then_cosine_to_zero():
    total, warm = 100, 10
    f = [T.lr_factor(s, total, warm) for s in range(total + 1)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert (
        f[10] == pytest.approx(1.0)
        and f[55] == pytest.approx(0.5)
        and f[100] == pytest.approx(0.0, abs=1e-12)
    )
    assert all(a >= b for a, b in zip(f[9:], f[10:], strict=False))


def test_config_validation():
    with pytest.raises(ConfigurationError, match="epochs"):
        TrainConfig(epochs=0)
    with pytest.raises(ConfigurationError, match="lr"):
        TrainConfig(lr=float("nan"))
    assert dataclasses.replace(TrainConfig(), seed=3).seed == 3


def test_cli_trains_and_writes_summary(tmp_path, capsys):
    args = ["train", "--preset", "vit", "skipless-osa", "--data", "synthetic", "--epochs", "1", "--seeds", "0",
            "--depth", "2", "--dim", "16", "--heads", "2", "--patch-size", "4", "--diag-every", "0",
            "--output", str(tmp_path), "--quiet"]  # fmt: skip
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert "skipless-osa" in out and "test acc %" in out
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary["preset"].tolist() == ["vit", "skipless-osa"]
    # rerunning resumes the finished runs instead of training again
    assert cli_main(args) == 0


def test_cli_bad_names_exit_2_with_valid_list(tmp_path, capsys):
    assert cli_main(["train", "--preset", "nope", "--output", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'nope'" in err and "skipless-osa" in err
    assert cli_main(["train", "--data", "imagenet", "--output", str(tmp_path), "--quiet"]) == 2
    assert "digits" in capsys.readouterr().err
    assert cli_main(["train", "--osa-method", "magic", "--output", str(tmp_path), "--quiet"]) == 2
    assert "unknown OSA method 'magic'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- plot builders


@pytest.fixture(scope="module")
def compared(data, tmp_path_factory):
    return compare(
        ["vit", "skipless-osa"], [0, 1], tiny(epochs=2), tmp_path_factory.mktemp("cmp"), progress=False
    )


def test_plot_data_reduce_over_seeds(compared):
    from osa_lab.plots import training as P

    metrics, summary = compared
    lc = P.learning_curve_data(metrics, "test_accuracy")
    assert lc["preset"].tolist() == ["vit", "vit", "skipless-osa", "skipless-osa"]
    vit2 = metrics.query("preset == 'vit' and metric == 'test_accuracy' and epoch == 2")["value"]
    row = lc.query("preset == 'vit' and epoch == 2").iloc[0]
    assert row["mean"] == pytest.approx(vit2.mean()) and row["lo"] == vit2.min() and row["n"] == 2
    al = P.alpha_data(metrics)
    assert set(al["layer"]) == {"layer 1", "layer 2"} and sorted(al["epoch"].unique()) == [0, 1, 2]
    diag = P.diagnostics_over_training_data(metrics, "stable_rank")
    assert diag["step"].min() == 0 and diag["step"].max() == 8
    prof = P.depth_profiles_data(metrics, "effective_rank")
    assert set(prof["profile"]) == {
        "vit · init",
        "vit · trained",
        "skipless-osa · init",
        "skipless-osa · trained",
    }
    assert sorted(prof["layer"].unique()) == [0, 1, 2]


def test_plot_builders_render_with_both_backends(compared):
    import holoviews as hv

    from osa_lab.plots import training as P

    metrics, summary = compared
    objs = [
        P.learning_panel(metrics),
        P.learning_curves(metrics, "train_loss"),
        P.alpha_curves(metrics),
        P.diagnostics_over_training(metrics, "condition_number"),
        P.depth_profiles(metrics, "relative_residual"),
        P.summary_bars(summary),
    ]
    for obj in objs:
        assert P.png_bytes(obj)[:4] == b"\x89PNG"
        hv.render(obj, backend="bokeh")


def test_plot_builders_name_missing_metrics(compared):
    from osa_lab.errors import OSAInputError
    from osa_lab.plots import training as P

    metrics, _ = compared
    with pytest.raises(OSAInputError, match="stable_rank"):
        P.learning_curves(metrics, "nope")
    with pytest.raises(OSAInputError, match="no α rows"):
        P.alpha_data(metrics, "vit")


def test_cli_trains_on_local_mnist_idx_files(tmp_path, capsys):
    from tests.studies.test_data import _write_fake_mnist

    _write_fake_mnist(tmp_path / "mnist", gz=True, n_train=40, n_test=20)
    args = ["train", "--preset", "skipless-osa", "--data", "mnist", "--data-dir", str(tmp_path / "mnist"),
            "--epochs", "1", "--depth", "1", "--dim", "16", "--heads", "2", "--diag-every", "0",
            "--output", str(tmp_path / "out"), "--quiet"]  # fmt: skip
    assert cli_main(args) == 0
    cfg = (tmp_path / "out" / "skipless-osa" / "seed0" / "config.json").read_text()
    assert '"image_size": 28' in cfg and '"patch_size": 4' in cfg and '"tokens": 49' in cfg
    # without the files: exit 2 and the message says where to get them and where to put them
    assert (
        cli_main([*args[:5], "--data-dir", str(tmp_path / "nowhere"), "--output", str(tmp_path / "o2")]) == 2
    )
    err = capsys.readouterr().err
    assert "https://" in err and str((tmp_path / "nowhere").resolve()) in err


# ----------------------------------------------------------------------------- α group, validation, controls, mixing


def test_alpha_has_its_own_group_without_decay_and_with_the_multiplier():
    from osa_lab.nn.models import build_classifier
    from osa_lab.nn.presets import get_preset

    cfg = get_preset("skipless-osa", input="patches", image_size=8, patch_size=4, seed=0, **TINY)
    model = build_classifier(cfg)
    groups = {g["name"]: g for g in T.loop._param_groups(model, 0.05, lr=1e-3, alpha_lr_mult=10.0)}
    assert set(groups) == {"decay", "no_decay", "alpha"}
    alphas = [m.alpha for m in osa_layers(model)]
    assert len(groups["alpha"]["params"]) == len(alphas) == 2
    assert all(any(p is a for p in groups["alpha"]["params"]) for a in alphas)
    assert groups["alpha"]["weight_decay"] == 0.0 and groups["alpha"]["lr"] == pytest.approx(1e-2)
    assert not any(p is a for a in alphas for g in ("decay", "no_decay") for p in groups[g]["params"])

    # one AdamW step: α moves lr·mult (Adam's first step is ≈ lr·sign(g)), the other weights lr
    def first_step(mult: float) -> tuple[torch.Tensor, torch.Tensor]:
        m = build_classifier(cfg)
        opt = torch.optim.AdamW(T.loop._param_groups(m, 0.0, lr=1e-3, alpha_lr_mult=mult), lr=1e-3)
        a0 = torch.cat([x.alpha.detach().flatten() for x in osa_layers(m)])
        w0 = m.head.weight.detach().clone()
        x = torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(0))
        F_loss = m(x).logsumexp(-1).mean()
        F_loss.backward()
        opt.step()
        a1 = torch.cat([x.alpha.detach().flatten() for x in osa_layers(m)])
        return (a1 - a0).abs(), (m.head.weight.detach() - w0).abs()

    da1, dw1 = first_step(1.0)
    da10, dw10 = first_step(10.0)
    torch.testing.assert_close(da10, 10 * da1, rtol=1e-3, atol=1e-9)
    torch.testing.assert_close(dw10, dw1)


def test_validation_split_partitions_training_data_and_never_overlaps_test(data):
    from osa_lab.studies.data import split_validation

    v = split_validation(data, 0.25)
    assert len(v.y_val) == 64 and len(v.y_train) == 192
    assert torch.equal(v.x_test, data.x_test) and torch.equal(v.y_test, data.y_test)
    rows = lambda x: {tuple(r.flatten().tolist()) for r in x}  # noqa: E731
    assert not rows(v.x_val) & rows(data.x_test)
    assert not rows(v.x_val) & rows(v.x_train)
    assert rows(v.x_val) | rows(v.x_train) == rows(data.x_train)
    assert torch.bincount(v.y_val).tolist() == [16, 16, 16, 16]  # stratified
    # independent of the training seed, fixed across calls
    assert torch.equal(split_validation(data, 0.25).x_val, v.x_val)


def test_training_with_validation_logs_val_metrics_and_mixing(data):
    r = train(tiny(val_fraction=0.25, epochs=2), data=data, progress=False)
    m = r.metrics
    assert {"val_loss", "val_accuracy"} <= set(m["metric"])
    mix = m[m["kind"] == "mixing"]
    assert {"s_norm", "mixing_ratio", "val_accuracy_alpha0", "val_accuracy_alpha0_drop"} <= set(mix["metric"])
    per_head = mix[mix["metric"] == "s_norm"]
    assert set(zip(per_head["layer"], per_head["head"], strict=True)) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert (per_head["value"] > 0).all()
    # the ablation drop is accuracy(as trained) − accuracy(α := 0) on the validation split
    full = float(m.query("metric == 'val_accuracy' and epoch == 2")["value"].iloc[0])
    zero = float(mix.query("metric == 'val_accuracy_alpha0'")["value"].iloc[0])
    drop = float(mix.query("metric == 'val_accuracy_alpha0_drop'")["value"].iloc[0])
    assert drop == pytest.approx(full - zero)


def test_mixing_metric_against_a_hand_computed_rotation():
    from osa_lab.nn.models import mixing_stats

    # N = 2, r = 1: S = α [[0, 1], [−1, 0]], exp(S) a rotation by α; v = e₁ moves by 2 sin(α/2)
    q = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    k = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    v = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    for alpha in (0.0, 0.3, 1.0, 2.5):
        s_norm, ratio = mixing_stats(q, k, v, alpha)
        assert float(s_norm) == pytest.approx(alpha, abs=1e-12)
        assert float(ratio) == pytest.approx(2 * math.sin(alpha / 2), abs=1e-12)
    # per head: α broadcasts over leading dims; r = 4 scales by 1/√r
    qh, kh, vh = q.repeat(2, 3, 1, 4), k.repeat(2, 3, 1, 4), v.repeat(2, 3, 1, 1)
    s_norm, ratio = mixing_stats(qh, kh, vh, torch.tensor([0.1, 0.2, 0.3]))
    want = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64) * 4 / 2  # α/√r · ‖q kᵀ − k qᵀ‖ = α/2 · 4
    torch.testing.assert_close(s_norm, want.expand(2, 3))
    torch.testing.assert_close(ratio, 2 * torch.sin(want / 2).expand(2, 3))


def test_mixing_table_matches_a_direct_float64_computation():
    from osa_lab.nn.models import build_classifier, mixing_table
    from osa_lab.nn.presets import get_preset

    cfg = get_preset("skipless-osa", input="patches", image_size=8, patch_size=4, seed=0, alpha_init=0.3, **TINY)
    model = build_classifier(cfg).eval()
    x = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    rows = {(layer, head, metric): v for layer, head, metric, v in mixing_table(model, x)}
    block = model.encoder.blocks[1]
    with torch.no_grad():
        h = model.encoder(model.embed(x), layers=1)
        q, k, v = block.attn._split(h)
        q, k, v = q.double(), k.double(), v.double()
        r = q.shape[-1]
        a = block.attn.alpha.double().reshape(1, -1, 1, 1)  # 0.3 as stored (float32)
        s = a / math.sqrt(r) * (q @ k.mT - k @ q.mT)
        e = torch.linalg.matrix_exp(s)
        ratio = torch.linalg.matrix_norm(e @ v - v) / torch.linalg.matrix_norm(v)
        snorm = torch.linalg.svdvals(s)[..., 0]
    for head in range(2):
        assert rows[(1, head, "mixing_ratio")] == pytest.approx(float(ratio[:, head].median()), rel=1e-9)
        assert rows[(1, head, "s_norm")] == pytest.approx(float(snorm[:, head].median()), rel=1e-9)


def test_alpha_zero_control_leaves_exp_s_the_identity(data):
    from osa_lab.nn.models import build_classifier, mixing_stats
    from osa_lab.nn.presets import get_preset
    from osa_lab.ops.functional import osa

    cfg = get_preset("skipless-osa-alpha0", input="patches", image_size=8, patch_size=4, seed=0, **TINY)
    model = build_classifier(cfg)
    names = {n for n, _ in model.named_parameters()}
    assert not any(n.endswith("alpha") for n in names)  # α is a frozen buffer, not learned
    layer = osa_layers(model)[0]
    x = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(0))
    q, k, v = (t.detach() for t in layer._split(x))
    # exp(S) = I: the layer's OSA returns its values unchanged, and S is exactly 0
    torch.testing.assert_close(osa(q, k, v, layer.alpha.reshape(-1), method=layer.method), v, rtol=0, atol=1e-6)
    s_norm, ratio = mixing_stats(q, k, v, layer.alpha.reshape(-1))
    assert float(s_norm.abs().max()) == 0.0 and float(ratio.abs().max()) == 0.0
    # and training does not move it
    r = train(tiny(preset="skipless-osa-alpha0", epochs=1), data=data, progress=False)
    assert all(a == 0.0 for _, _, a in T.alpha_values(r.model))
    mix = r.metrics[r.metrics["metric"] == "mixing_ratio"]
    assert len(mix) and (mix["value"] == 0).all()


def test_alpha_zeroed_restores_alpha():
    from osa_lab.nn.models import alpha_zeroed, build_classifier
    from osa_lab.nn.presets import get_preset

    model = build_classifier(get_preset("skipless-osa", input="patches", image_size=8, patch_size=4, seed=0, **TINY))
    before = [a for _, _, a in T.alpha_values(model)]
    with alpha_zeroed(model):
        assert all(a == 0 for _, _, a in T.alpha_values(model))
    assert [a for _, _, a in T.alpha_values(model)] == before


def test_vit_without_attention_is_token_wise():
    from osa_lab.nn.models import build_classifier
    from osa_lab.nn.presets import get_preset

    model = build_classifier(get_preset("vit-no-attn", input="patches", image_size=8, patch_size=4, seed=0, **TINY))
    assert all(b.attn is None for b in model.encoder.blocks)
    x = torch.randn(2, 4, 16)
    # each token's output depends on that token only: permuting tokens permutes outputs
    perm = torch.tensor([2, 0, 3, 1])
    y = model.encoder(x)
    torch.testing.assert_close(model.encoder(x[:, perm]), y[:, perm])


def test_paired_differences_golden_values():
    rows = []
    for preset, accs in (("skipless-osa", [0.90, 0.92, 0.91]), ("vit", [0.95, 0.96, 0.93])):
        for seed, a in enumerate(accs):
            rows.append({"preset": preset, "data": "x", "seed": seed, "epoch": 1, "step": 1, "kind": "eval",
                         "metric": "test_accuracy", "layer": None, "head": None, "value": a})  # fmt: skip
    p = T.paired_differences(T.metrics_frame(rows)).set_index("preset").loc["vit"]
    d = [-0.05, -0.04, -0.02]
    mean, sd = sum(d) / 3, float(pd.Series(d).std())
    half = 4.302652729911275 * sd / math.sqrt(3)  # t_{0.975, 2}
    assert p["n"] == 3 and p["diff_mean"] == pytest.approx(mean)
    assert p["ci_low"] == pytest.approx(mean - half) and p["ci_high"] == pytest.approx(mean + half)
    text = T.verdict(
        pd.DataFrame([{"preset": "skipless-osa", "seeds": 3, "test_accuracy_mean": 0.91, "test_accuracy_std": 0.01},
                      {"preset": "vit", "seeds": 3, "test_accuracy_mean": 0.947, "test_accuracy_std": 0.015}]),
        T.paired_differences(T.metrics_frame(rows)), "mnist1d", "test budget",
    )  # fmt: skip
    assert "comparable to the skip-connected ViT" in text and "inconclusive" in text
    assert "MNIST-1D, a different task" in text and "≥ 5" in text and "97.2" in text


def test_a_run_that_broke_is_never_paired_at_the_value_it_reached():
    """vit seed 2 stopped at epoch 1 of 3 (it diverged there): pairing it at its last accuracy would move
    the difference; by epochs or by the runs table, only finished runs are paired."""
    rows = []
    for preset, accs, last in (("skipless-osa", [0.90, 0.92, 0.91], [3, 3, 3]), ("vit", [0.95, 0.96, 0.10], [3, 3, 1])):
        for seed, (a, e) in enumerate(zip(accs, last, strict=True)):
            rows.append({"preset": preset, "data": "x", "seed": seed, "epoch": e, "step": e, "kind": "eval",
                         "metric": "test_accuracy", "layer": None, "head": None, "value": a})  # fmt: skip
    metrics = T.metrics_frame(rows)
    assert T.paired_differences(metrics).set_index("preset").loc["vit", "n"] == 3  # what tune paired before
    by_epochs = T.paired_differences(finished_run_metrics(metrics, None, 3)).set_index("preset").loc["vit"]
    assert by_epochs["n"] == 2 and by_epochs["diff_mean"] == pytest.approx((-0.05 - 0.04) / 2)
    runs = pd.DataFrame({"preset": ["skipless-osa"] * 3 + ["vit"] * 3, "seed": [0, 1, 2] * 2,
                         "status": ["ok", "ok", "ok", "ok", "failed", "diverged"]})  # fmt: skip
    by_status = T.paired_differences(finished_run_metrics(metrics, runs, 3)).set_index("preset").loc["vit"]
    assert by_status["n"] == 1 and by_status["diff_mean"] == pytest.approx(-0.05)


def test_tune_chooses_on_validation_and_reports_test_of_the_choice_only(tmp_path, data):
    grid = T.TuneGrid(lrs=(1e-3, 1e-2), alpha_lr_mults=(1.0, 10.0), seeds=(7,))
    res = T.tune(["vit", "skipless-osa"], [0, 1], tiny(epochs=1, diag_every=0), tmp_path, grid=grid, progress=False)
    tuning = res.tuning
    # vit is tried once per lr, skipless-osa once per (lr, multiplier)
    assert len(tuning[tuning["preset"] == "vit"]) == 2 and len(tuning[tuning["preset"] == "skipless-osa"]) == 4
    for p, row in res.chosen.set_index("preset").iterrows():
        cand = tuning[tuning["preset"] == p]
        assert row["val_accuracy"] == cand["val_accuracy"].max()
    # the final runs use the chosen setting and the final seeds (not the tuning seed)
    assert sorted(res.metrics["seed"].unique()) == [0, 1]
    osa_lr = res.chosen.set_index("preset").loc["skipless-osa", "lr"]
    assert (res.summary.set_index("preset").loc["skipless-osa", "lr"]) == osa_lr
    for name in ("tuning.csv", "chosen.csv", "summary.csv", "paired.csv", "verdict.md", "summary.png"):
        assert (tmp_path / name).exists(), name
    assert "Verdict" in (tmp_path / "verdict.md").read_text()
    # no test-set number enters the choice: the tuning table has no test column
    assert not any("test" in c for c in tuning.columns)


def test_resume_refuses_other_data_and_a_corrupt_checkpoint(tmp_path, data):
    """resuming on other data trained the remaining epochs on it; a damaged checkpoint raised EOFError."""
    other = load_synthetic(seed=5)

    class StopError(Exception):
        pass

    def stop_after_one(epoch, _):
        raise StopError

    with pytest.raises(StopError):
        train(tiny(), tmp_path, data=data, progress=False, on_epoch_end=stop_after_one)
    with pytest.raises(ConfigurationError, match="other data"):
        train(tiny(), tmp_path, data=other, progress=False)
    ckpt = tmp_path / T.CHECKPOINT_NAME
    ckpt.write_bytes(ckpt.read_bytes()[: len(ckpt.read_bytes()) // 2])
    with pytest.raises(ConfigurationError, match="--no-resume"):
        train(tiny(), tmp_path, data=data, progress=False)
    assert train(tiny(), tmp_path, data=data, progress=False, resume=False).final() >= 0


def test_negative_grad_clip_and_weight_decay_are_refused():
    with pytest.raises(ConfigurationError, match="gradient ascent"):
        TrainConfig(grad_clip=-1.0)
    with pytest.raises(ConfigurationError, match="weight_decay"):
        TrainConfig(weight_decay=-5.0)
    with pytest.raises(ConfigurationError, match="patch_size"):
        TrainConfig(patch_size=0)


def test_plots_use_percent_and_a_zero_based_accuracy_axis(compared):
    """(notebook 4): the accuracy bars start at 0 (not at min − 5 %), accuracies are drawn
    in percent everywhere, and the display tables of the ablation and paired differences are in
    percent (points)."""
    import holoviews as hv

    from osa_lab.plots import training as P

    metrics, summary = compared
    bars = P.summary_bars(summary)
    for backend in ("bokeh", "matplotlib"):
        el = bars.get(0)
        opts = hv.Store.lookup_options(backend, el, "plot").kwargs
        assert tuple(opts["ylim"]) == (0.0, 100)
    curves = P.learning_curves(metrics, "test_accuracy")
    ys = [c.dimension_values(1) for c in curves if isinstance(c, hv.Curve)]
    raw = P.learning_curve_data(metrics, "test_accuracy")["mean"]
    assert max(float(y.max()) for y in ys) == pytest.approx(100 * raw.max())
    assert "%" in curves.get(0).vdims[0].pprint_label or "%" in str(curves.get(0).vdims[0].label)
    abl = P.ablation_percent(metrics)
    assert abl["accuracy_mean %"].iloc[0] == pytest.approx(100 * P.ablation_data(metrics)["accuracy_mean"].iloc[0])
    paired = pd.DataFrame({"preset": ["vit"], "n": [2], "diff_mean": [0.012], "diff_std": [0.01],
                           "ci_low": [-0.02], "ci_high": [0.04], "per_seed": ["0:+1.0 1:+1.4"]})  # fmt: skip
    shown = P.paired_percent(paired)
    assert shown["diff_mean (points)"].iloc[0] == pytest.approx(1.2) and shown["ci_low (points)"].iloc[0] == pytest.approx(-2.0)


def test_mixing_summary_reports_mean_abs_alpha(compared):
    """Heads take both signs of α, so the table also carries the mean of |α| (the signed mean
    understated α's size: −0.011…0.020 against |α| up to 0.15 in the MNIST-1D runs)."""
    from osa_lab.plots import training as P

    metrics, _ = compared
    mix = P.mixing_summary(metrics)
    rows = metrics[(metrics["kind"] == "alpha") & (metrics["preset"] == "skipless-osa")]
    last = rows[rows["step"] == rows.groupby("seed")["step"].transform("max")]
    want = last.assign(a=last["value"].abs()).groupby(["layer", "head"])["a"].mean()
    got = mix[mix["preset"] == "skipless-osa"].set_index(["layer", "head"])["abs_alpha"]
    assert got.to_numpy() == pytest.approx(want.to_numpy())
    assert (got >= mix[mix["preset"] == "skipless-osa"].set_index(["layer", "head"])["alpha"].abs() - 1e-12).all()


class _CodeRunningPayload:
    """Unpickling this object would create ``marker`` (a stand-in for arbitrary code)."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        import pathlib

        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def test_a_crafted_checkpoint_is_refused_without_running_its_code(tmp_path, data):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    marker = tmp_path / "code-ran"
    torch.save({"format": 2, "payload": _CodeRunningPayload(str(marker))}, run_dir / T.CHECKPOINT_NAME)
    with pytest.raises(ConfigurationError, match="never unpickles"):
        train(tiny(), run_dir, data=data, progress=False)
    assert not marker.exists()


def test_tuning_seeds_that_are_also_final_seeds_are_refused(data):
    with pytest.raises(ConfigurationError, match=r"tuning seeds \[1\] are also final seeds"):
        T.tune(["vit"], [0, 1], tiny(), grid=T.TuneGrid(lrs=(1e-3,), seeds=(1, 1000)), progress=False)
