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
