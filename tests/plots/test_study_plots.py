"""The depth study's figures (osa_lab.plots.study): what each draws and its shape in both backends."""

from __future__ import annotations

import holoviews as hv
import numpy as np
import pandas as pd

from osa_lab.plots import study


def _summary() -> pd.DataFrame:
    # one cell whose seeds spread so widely that its t-interval runs past 0–100 %
    return pd.DataFrame({
        "preset": ["vit", "vit", "skipless-osa", "skipless-osa"],
        "depth": [4, 8, 4, 8],
        "test_accuracy_mean": [0.88, 0.883, 0.869, 0.663],
        "ci_low": [0.872, 0.874, 0.864, 0.068],
        "ci_high": [0.888, 0.892, 0.873, 1.258],
        "finished": [10, 4, 10, 4],
        "diverged": [0, 0, 0, 0],
    })  # fmt: skip


def _runs() -> pd.DataFrame:
    rows = []
    for preset, depth, kappa, steps in (("vit", 4, 38.0, 1908.0), ("skipless-osa", 4, 2.3e7, 2196.0),
                                        ("skipless-ssa", 4, 5e20, 3096.0), ("vit", 8, 65.0, 2016.0)):  # fmt: skip
        for seed in range(2):
            rows.append(dict(preset=preset, depth=depth, seed=seed, status="ok", kappa_init=kappa,
                             steps_to_90=steps, test_accuracy=0.8))  # fmt: skip
    return pd.DataFrame(rows)


def test_accuracy_band_is_cut_to_the_accuracy_scale_and_the_axis_shows_all_of_it():
    data = study.accuracy_vs_depth_data(_summary())
    assert data["lo"].min() >= 0.0 and data["hi"].max() <= 100.0
    wide = data[(data["preset"] == "skipless-osa") & (data["depth"] == 8)].iloc[0]
    assert np.isclose(wide["lo"], 6.8) and wide["hi"] == 100.0  # the low end kept, the high end cut
    assert np.isclose(wide["mean"], 66.3)
    fig = study.accuracy_vs_depth(_summary())
    for backend in ("bokeh", "matplotlib"):
        assert hv.Store.lookup_options(backend, fig, "plot").kwargs["ylim"] == (0, 100)
    ax = hv.render(fig, backend="matplotlib").axes[0]
    assert ax.get_ylim() == (0.0, 100.0)


def test_kappa_figure_axes_are_wider_than_tall_beside_its_legend():
    fig = study.kappa_vs_trainability(_runs(), "steps_to_90")
    mpl = hv.render(fig, backend="matplotlib")
    ax = mpl.axes[0]
    box = ax.get_position()
    width, height = box.width * mpl.get_size_inches()[0], box.height * mpl.get_size_inches()[1]
    assert width > 1.4 * height  # a numeric HoloViews aspect on this log axis gave 0.7
    assert ax.get_xscale() == "log"
    hv.render(fig, backend="bokeh")  # renders in the other backend too


def test_sub_block_kappa_draws_a_line_per_preset_through_the_sub_blocks():
    rows = []
    for preset, mlp in (("skipless-osa", 1.6e3), ("skipless-osa-shaped", 5.8)):
        for seed, factor in enumerate((1.0, 2.0)):
            rows.append(dict(preset=preset, depth=16, seed=seed, **{
                "kappa_embedding_init": 1.0, "kappa_attention_init": 1.1 * factor,
                "kappa_mlp_init": mlp * factor, "kappa_readout_init": 6.5}))  # fmt: skip
    rows.append(dict(preset="vit", depth=8, seed=0, kappa_embedding_init=1.0, kappa_attention_init=2.0,
                     kappa_mlp_init=float("nan"), kappa_readout_init=3.0))  # fmt: skip
    runs = pd.DataFrame(rows)
    data = study.sub_block_kappa_data(runs, 16)
    mlp = data[(data["preset"] == "skipless-osa") & (data["part"] == "mlp")].iloc[0]
    assert (mlp["mean"], mlp["lo"], mlp["hi"], mlp["n"]) == (2.4e3, 1.6e3, 3.2e3, 2)
    assert list(data.loc[data["preset"] == "skipless-osa-shaped", "part"]) == list(study.SUB_BLOCKS)
    assert set(study.sub_block_kappa_data(runs, 8)["part"]) == {"embedding", "attention", "readout"}  # NaN left out
    fig = study.sub_block_kappa(runs, 16)
    ax = hv.render(fig, backend="matplotlib").axes[0]
    assert ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels() if t.get_text()] == list(study.SUB_BLOCKS)
    hv.render(fig, backend="bokeh")
    import pytest

    from osa_lab.errors import OSAInputError

    with pytest.raises(OSAInputError, match="depth 32"):
        study.sub_block_kappa(runs, 32)


def test_sub_block_kappa_by_layer_walks_the_sub_blocks_in_the_order_a_token_meets_them():
    rows = []
    for seed in (0, 1):
        rows.append(dict(preset="skipless-osa", depth=2, seed=seed, when="init", part="embedding", layer=0, kappa=1.0))
        for layer in (1, 2):
            rows.append(dict(preset="skipless-osa", depth=2, seed=seed, when="init", part="attention", layer=layer,
                             kappa=1.1 + seed))  # fmt: skip
            rows.append(dict(preset="skipless-osa", depth=2, seed=seed, when="init", part="mlp", layer=layer,
                             kappa=1e3 * layer))  # fmt: skip
        rows.append(dict(preset="skipless-osa", depth=2, seed=seed, when="init", part="readout", layer=3, kappa=6.5))
    rows.append(dict(preset="skipless-osa", depth=2, seed=0, when="trained", part="mlp", layer=1, kappa=float("inf")))
    layers = pd.DataFrame(rows)
    data = study.sub_block_layer_data(layers, 2)
    assert data[["position", "part", "layer"]].values.tolist() == [
        [0, "embedding", 0], [1, "attention", 1], [2, "mlp", 1], [3, "attention", 2], [4, "mlp", 2], [5, "readout", 3]]
    attention = data[data["part"] == "attention"].iloc[0]
    assert (attention["mean"], attention["lo"], attention["hi"], attention["n"]) == (1.6, 1.1, 2.1, 2)
    assert study.sub_block_layer_data(layers, 2, "trained")["mean"].iloc[0] == study.LOG_CEILING  # inf kept drawable
    fig = study.sub_block_kappa_by_layer(layers, 2)
    ax = hv.render(fig, backend="matplotlib").axes[0]
    assert ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels() if t.get_text()] == ["embed", "attn 1", "attn 2", "readout"]
    hv.render(fig, backend="bokeh")
    import pytest

    from osa_lab.errors import OSAInputError

    with pytest.raises(OSAInputError, match="depth 8"):
        study.sub_block_kappa_by_layer(layers, 8)


def test_tuning_kappa_draws_kappa_after_training_against_learning_rate_per_setting():
    """The median over tuning seeds and their range per setting and learning rate; runs without a trained
    κ (diverged, or recorded before tuning runs kept it) are left out, and ∞ is kept drawable."""
    rows = []
    for mult in (1.0, 10.0):
        for lr, base in ((3e-4, 30.0), (1e-3, 60.0), (3e-3, 600.0)):
            for seed, factor in zip((1000, 1001, 1002), (1.0, 2.0, 4.0), strict=True):
                rows.append(dict(preset="skipless-osa", depth=8, lr=lr, alpha_lr_mult=mult, warmup_fraction=0.05,
                                 tune_seed=seed, status="ok", kappa_attention_trained=base * factor * mult,
                                 kappa_mlp_trained=5e3))  # fmt: skip
    rows[-1]["kappa_attention_trained"] = float("nan")  # diverged
    rows[-2]["kappa_attention_trained"] = float("inf")  # singular
    rows.append(dict(preset="vit", depth=8, lr=1e-3, alpha_lr_mult=1.0, warmup_fraction=0.05, tune_seed=1000,
                     status="ok", kappa_attention_trained=float("nan"), kappa_mlp_trained=float("nan")))  # fmt: skip
    # a run that collapsed to chance has a trained κ, but is a failure: left out
    rows.append(dict(preset="skipless-osa", depth=8, lr=3e-4, alpha_lr_mult=1.0, warmup_fraction=0.05,
                     tune_seed=1003, status="failed", kappa_attention_trained=1e6, kappa_mlp_trained=5e3))  # fmt: skip
    tuning = pd.DataFrame(rows)
    data = study.tuning_kappa_data(tuning, 8)
    assert set(data["preset"]) == {"skipless-osa α-lr ×1", "skipless-osa α-lr ×10"}  # the ViT recorded none
    low = data[(data["preset"] == "skipless-osa α-lr ×1") & np.isclose(data["lr"], 3e-4)].iloc[0]
    assert (low["mean"], low["lo"], low["hi"], low["n"]) == (60.0, 30.0, 120.0, 3)
    edge = data[(data["preset"] == "skipless-osa α-lr ×10") & np.isclose(data["lr"], 3e-3)].iloc[0]
    assert edge["n"] == 2 and edge["hi"] == study.LOG_CEILING and edge["lo"] == 6000.0
    assert study.tuning_kappa_data(tuning, 8, "mlp")["mean"].eq(5e3).all()
    fig = study.tuning_kappa(tuning, 8)
    ax = hv.render(fig, backend="matplotlib").axes[0]
    assert ax.get_yscale() == "log" and ax.get_xscale() == "log"
    hv.render(fig, backend="bokeh")
    import pytest

    from osa_lab.errors import OSAInputError

    with pytest.raises(OSAInputError, match="depth 16"):
        study.tuning_kappa(tuning, 16)
    with pytest.raises(OSAInputError, match="part must be one of"):
        study.tuning_kappa_data(tuning, 8, "attn")
