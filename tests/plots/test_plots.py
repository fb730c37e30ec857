"""Shared plot builders (osa_lab.plots.depth) and the OSA check (osa_lab.studies.self_check).

The builders are tested on small synthetic tables with the analysis schema: the reduced data
each figure draws, the axis choices, and that every figure renders under both the bokeh and
the matplotlib backend (PNG bytes).
"""

from __future__ import annotations

import warnings

import holoviews as hv
import numpy as np
import pandas as pd
import pytest
import torch

from osa_lab.errors import ConfigurationError, OSAInputError
from osa_lab.plots import depth as D

PRESETS = ("pure-ssa", "pure-osa")
CONFIG = dict(depth=5, tokens=16, dim=8, heads=2, alpha=0.1)


def _metrics(presets=PRESETS, depth=5, seeds=3) -> pd.DataFrame:
    rows = []
    for p in presets:
        for seed in range(seeds):
            for layer in range(depth + 1):
                for site in ("attention", "block"):
                    if site == "attention" and layer == 0:
                        continue
                    collapse = 10.0 ** (-2 * layer) if p == "pure-ssa" else 1.0
                    value = collapse * (1 + 0.1 * seed) * (2.0 if site == "attention" else 1.0)
                    for metric, v in (("relative_residual", value), ("token_cosine", 0.5 + 0.01 * seed)):
                        rows.append(
                            dict(preset=p, **dict(CONFIG, depth=depth), seed=seed, layer=layer, site=site,
                                 metric=metric, value=v)
                        )
    return pd.DataFrame(rows)


def _spectra(presets=PRESETS, depth=5, seeds=2, k=6) -> pd.DataFrame:
    rows = []
    for p in presets:
        for seed in range(seeds):
            for layer in range(depth + 1):
                decay = 0.1**layer if p == "pure-ssa" else 0.9
                sigma = 3.0 * decay ** np.arange(k) * (1 + 0.01 * seed)
                for i, s in enumerate(sigma):
                    rows.append(
                        dict(preset=p, **dict(CONFIG, depth=depth), seed=seed, layer=layer, site="block", index=i,
                             sigma=s, sigma_normalized=s / sigma[0])
                    )
    return pd.DataFrame(rows)


def _jacobian(presets=PRESETS, depth=4, seeds=2) -> pd.DataFrame:
    rows = []
    for p in presets:
        for seed in range(seeds):
            for layer in range(1, depth + 1):
                kappa = (1.2 if p == "pure-osa" else 10.0**layer) * (1 + 0.1 * seed)
                rows.append(
                    dict(preset=p, **dict(CONFIG, depth=depth), seed=seed, layer=layer, scope="end_to_end",
                         algorithm="exact", sigma_max=kappa, sigma_min=1.0, kappa=kappa)
                )
    return pd.DataFrame(rows)


def _svals(presets=PRESETS) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.concat(
        [pd.DataFrame({"preset": p, "algorithm": "exact", "sigma": rng.lognormal(0, 1 + i, 200)}) for i, p in
         enumerate(presets)],
        ignore_index=True,
    )


def _renders_both(obj) -> None:
    bk = hv.render(obj, backend="bokeh")
    assert bk is not None
    png = D.png_bytes(obj)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


# ---------------------------------------------------------------------------------------------


def test_band_over_seeds_mean_and_extremes():
    df = pd.DataFrame({"preset": ["a"] * 4, "layer": [0, 0, 1, 1], "value": [1.0, 3.0, 2.0, 2.0]})
    out = D.band_over_seeds(df, "layer", "value")
    assert out["mean"].tolist() == [2.0, 2.0]
    assert out["lo"].tolist() == [1.0, 2.0] and out["hi"].tolist() == [3.0, 2.0]
    assert out["n"].tolist() == [2, 2]


def test_unresolved_and_infinite_values_are_drawn_at_the_ceiling():
    df = pd.DataFrame({"preset": ["a"] * 4, "layer": [0, 0, 1, 1], "value": [1.0, 3.0, np.inf, 1e280]})
    out = D.band_over_seeds(df, "layer", "value").set_index("layer")
    assert out.loc[1, "lo"] == D.LOG_CEILING and out.loc[1, "hi"] == 1e280
    obj = D.kappa_vs_parameter(df.assign(preset="a", kappa=df["value"]), "layer", logy=True)
    opts = hv.Store.lookup_options("bokeh", obj, "plot").kwargs
    ylim, xlim = opts["ylim"], opts["xlim"]
    # the ceiling plus headroom of 5 % of the 15.7 decades shown (data from 1 to the ceiling),
    # so the ✕ markers at the ceiling are not cut by the frame
    pad = 10 ** (0.05 * np.log10(D.LOG_CEILING))
    assert ylim == pytest.approx((1.0 / pad, D.LOG_CEILING * pad))
    assert np.isfinite(ylim[1]) and ylim[1] < 1e17
    assert xlim == pytest.approx((-0.3, 1.3))  # whole markers at the first and last layer
    _renders_both(obj)  # matplotlib log ticks overflow without the ceiling


def test_jacobian_histogram_has_integer_decade_ticks():
    sv = pd.DataFrame({"preset": ["a"] * 50, "sigma": np.logspace(-13, 0, 50)})
    obj = D.jacobian_histogram(sv)
    import matplotlib.pyplot as plt

    fig = hv.render(obj, backend="matplotlib")
    ticks = [t for t in fig.axes[0].get_xticks() if -13 <= t <= 0]
    plt.close(fig)
    assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks)


def test_metric_vs_depth_data_reduces_over_seeds_for_block_site():
    m = _metrics()
    data = D.metric_vs_depth_data(m, "relative_residual")
    assert list(data["preset"].unique()) == list(PRESETS)
    ssa = data[data["preset"] == "pure-ssa"].set_index("layer")
    # block site chosen by default (attention values are doubled in the fixture)
    assert ssa.loc[2, "lo"] == pytest.approx(1e-4)
    assert ssa.loc[2, "hi"] == pytest.approx(1.2e-4)
    assert ssa.loc[2, "mean"] == pytest.approx(1.1e-4)
    assert (data["n"] == 3).all()
    attn = D.metric_vs_depth_data(m, "relative_residual", site="attention")
    assert attn[attn["preset"] == "pure-ssa"].set_index("layer").loc[2, "lo"] == pytest.approx(2e-4)


def test_metric_vs_depth_log_axis_only_when_spanning_decades():
    m = _metrics()
    collapse = D.metric_vs_depth(m, "relative_residual")
    flat = D.metric_vs_depth(m, "token_cosine")
    assert hv.Store.lookup_options("bokeh", collapse, "plot").kwargs["logy"] is True
    assert hv.Store.lookup_options("bokeh", flat, "plot").kwargs["logy"] is False
    # one band (area) + mean curve per preset, labelled by preset
    assert {el.label for el in collapse} == set(PRESETS)
    assert [type(el).__name__ for el in collapse] == ["Area", "Curve"] * len(PRESETS)


def test_metric_vs_depth_renders_in_both_backends():
    _renders_both(D.metric_vs_depth(_metrics(), "relative_residual"))


def test_metric_vs_depth_bad_input_names_the_problem():
    with pytest.raises(OSAInputError, match="not in the table"):
        D.metric_vs_depth(_metrics(), "no_such_metric")
    with pytest.raises(OSAInputError, match="lacks column"):
        D.metric_vs_depth(pd.DataFrame({"preset": ["a"]}), "relative_residual")
    with pytest.raises(OSAInputError, match="empty"):
        D.metric_vs_depth(_metrics().iloc[:0], "relative_residual")


def test_spectra_grid_and_shared_colour_scale():
    s = _spectra()
    grids = D.spectra_grid(s)
    layers, frac, z = grids["pure-ssa"]
    assert layers.tolist() == list(range(6))
    np.testing.assert_allclose(frac, (np.arange(6) + 0.5) / 6)
    np.testing.assert_allclose(z[:, 0], np.ones(6))  # layer 0 of pure-ssa: decay 1
    np.testing.assert_allclose(z[1, 2], 0.01, rtol=1e-12)
    layout = D.spectra_heatmaps(s)
    clims = {hv.Store.lookup_options("bokeh", img, "style").kwargs.get("clim")
             or hv.Store.lookup_options("bokeh", img, "plot").kwargs.get("clim") for img in layout}
    assert len(clims) == 1  # same colour range for every preset
    (lo, hi), = clims
    assert hi == 1.0 and lo == pytest.approx(z[z > 0].min())
    for img in layout:
        assert hv.Store.lookup_options("bokeh", img, "plot").kwargs["logz"] is True
        assert "hover" in hv.Store.lookup_options("bokeh", img, "plot").kwargs["tools"]
    _renders_both(layout)


def _clim(img):
    return (hv.Store.lookup_options("bokeh", img, "style").kwargs.get("clim")
            or hv.Store.lookup_options("bokeh", img, "plot").kwargs.get("clim"))  # fmt: skip


def _colourbar(img) -> bool:
    return bool(hv.Store.lookup_options("bokeh", img, "plot").kwargs.get("colorbar"))


def test_spectra_heatmaps_shared_range_has_one_colour_bar_and_a_floor_clips_it():
    s = _spectra()
    layout = D.spectra_heatmaps(s)
    assert [_colourbar(img) for img in layout] == [False] * (len(layout) - 1) + [True]
    clipped = D.spectra_heatmaps(s, floor=1e-3)
    assert {_clim(img) for img in clipped} == {(1e-3, 1.0)}
    for img in clipped:  # values below the floor are drawn at the floor
        assert np.nanmin(img.dimension_values("sigma_normalized")) >= 1e-3
    _renders_both(clipped)


def test_spectra_heatmaps_per_panel_range_follows_each_preset():
    s = _spectra()
    grids = D.spectra_grid(s)
    layout = D.spectra_heatmaps(s, colour_range="per panel")
    for img, (_, _, z) in zip(layout, grids.values(), strict=True):
        lo, hi = _clim(img)
        assert hi == 1.0 and lo == pytest.approx(max(z[z > 0].min(), D.LOG_FLOOR))
        assert _colourbar(img)
    assert len({_clim(img) for img in layout}) == len(grids)  # the presets' ranges differ here
    _renders_both(layout)


@pytest.mark.parametrize(("kwargs", "match"), [({"colour_range": "both"}, "colour_range must be one of"),
                                               ({"floor": 2.0}, "floor must lie in"),
                                               ({"floor": 0.0}, "floor must lie in")])  # fmt: skip
def test_spectra_heatmaps_bad_range_is_named(kwargs, match):
    with pytest.raises(OSAInputError, match=match):
        D.spectra_heatmaps(_spectra(), **kwargs)


def test_spectra_lines_selected_layers():
    s = _spectra()
    layout = D.spectra_lines(s, layers=[0, 5])
    assert len(layout) == 2
    first = layout[0]
    assert [c.label for c in first] == ["layer 0", "layer 5"]
    np.testing.assert_allclose(first.values()[1].dimension_values("sigma_normalized")[1], 1e-5, rtol=1e-9)
    default = D.spectra_lines(s)
    assert [c.label for c in default[0]] == ["layer 0", "layer 1", "layer 2", "layer 5"]
    with pytest.raises(OSAInputError, match="not in the spectra table"):
        D.spectra_lines(s, layers=[9])
    _renders_both(layout)


def test_kappa_vs_depth_names_algorithm_and_uses_log_axis():
    j = _jacobian()
    data = D.kappa_vs_depth_data(j)
    assert data[data["preset"] == "pure-osa"]["mean"].tolist() == pytest.approx([1.26] * 4)
    obj = D.kappa_vs_depth(j)
    opts = hv.Store.lookup_options("bokeh", obj, "plot").kwargs
    assert "exact" in opts["title"] and opts["logy"] is True
    _renders_both(obj)


def test_jacobian_histogram_counts_every_singular_value():
    sv = _svals()
    data = D.jacobian_histogram_data(sv, bins=20)
    assert data.groupby("preset")["count"].sum().tolist() == [200, 200]
    assert data.groupby("preset").size().tolist() == [20, 20]
    _renders_both(D.jacobian_histogram(sv))


def test_kappa_vs_parameter_groups_and_log_x():
    df = pd.DataFrame(
        [dict(preset=f"N={n}", alpha=a, seed=s, kappa=1 + 100 * a * n / 8 + 0.01 * s)
         for n in (8, 16) for a in (0.001, 0.01, 0.1, 1.0) for s in range(2)]
    )
    obj = D.kappa_vs_parameter(df, "alpha")
    opts = hv.Store.lookup_options("bokeh", obj, "plot").kwargs
    assert opts["logx"] is True
    assert {el.label for el in obj} == {"N=8", "N=16"}
    _renders_both(obj)


# ---------------------------------------------------------------------------------------------
# OSA check


def test_osa_check_passes_at_init_and_reports_method():
    from osa_lab.studies.self_check import osa_check, osa_check_table

    res = osa_check(16, 8, heads=2, alpha=None, seed=0)
    # auto exponentiates S directly through the QR engine for N ≤ 4r (here 16 ≤ 16)
    assert res["method"] == "qr" and res["head_dim"] == 4
    assert osa_check(40, 8, heads=2, alpha=None, seed=0)["method"] == "lowrank"
    assert all(res["passed"].values())
    assert res["orthogonality_error"] < 1e-5
    table = osa_check_table(res)
    assert table["check"].tolist() == ["orthogonality_error", "dense_vs_lowrank", "lowrank_vs_float64",
                                       "norm_preservation"]
    assert table["passed"].all()


def test_osa_check_float64_is_tight_and_rank_deficient_uses_qr():
    from osa_lab.studies.self_check import osa_check

    res = osa_check(6, 8, heads=1, alpha=0.5, dtype=torch.float64)  # N < 2r → QR path
    assert res["method"] == "qr"
    assert res["orthogonality_error"] < 1e-12
    assert res["dense_vs_lowrank"] < 1e-12


def test_osa_check_refuses_impossible_configurations():
    from osa_lab.studies.self_check import osa_check

    with pytest.raises(ConfigurationError, match="not divisible"):
        osa_check(16, 10, heads=3)
    with pytest.raises(ConfigurationError, match="O\\(N³\\)"):
        osa_check(5000, 8)


def test_spectra_lines_axis_ends_at_one_legend_below_and_styles_differ():
    """σᵢ/σ₁ ≤ 1, so the y axis ends just above 1 (not 10¹); the legend sits
    outside the axes (bokeh: below; matplotlib: one legend right of the last panel, since a
    legend below covered the "index" label); coinciding curves stay visible (different dashes
    and widths)."""
    layout = D.spectra_lines(_spectra(), layers=[0, 1, 5])
    for backend, where in (("bokeh", "bottom"), ("matplotlib", "right")):
        opts = hv.Store.lookup_options(backend, layout[-1], "plot").kwargs
        assert opts["ylim"][1] <= 2.0 and opts["legend_position"] == where
    styles = [hv.Store.lookup_options("bokeh", c, "style").kwargs for c in layout[0]]
    assert len({(s["line_dash"], s["line_width"]) for s in styles}) == 3
    _renders_both(layout)


def test_kappa_beyond_float64_is_marked_not_silently_clipped():
    j = _jacobian()
    j.loc[(j["preset"] == "pure-ssa") & (j["layer"] == j["layer"].max()), "kappa"] = np.inf
    obj = D.kappa_vs_depth(j)
    marks = [el for el in obj if type(el).__name__ == "Scatter"]
    assert len(marks) == 1 and "beyond float64" in marks[0].label
    assert marks[0].dimension_values(1).tolist() == [D.LOG_CEILING]
    assert not [el for el in D.kappa_vs_depth(_jacobian()) if type(el).__name__ == "Scatter"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # matplotlib warned on the 'x' marker's edgecolor
        _renders_both(obj)


# Colour-vision deficiency simulation (Machado, Oliveira & Fernandes 2009, severity 1.0, linear RGB).
_CVD = {
    "protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]],
    "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]],
    "tritanopia": [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.303900]],
}


def _linear_rgb(colour: str) -> np.ndarray:
    c = np.array([int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _lab(linear: np.ndarray) -> np.ndarray:
    """CIELAB (D65) of a linear-RGB colour."""
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ np.clip(linear, 0, 1)
    xyz = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def _delta_e(a: str, b: str, vision: str | None = None) -> float:
    """CIE76 colour difference of two colours as seen with normal vision or a simulated deficiency."""
    la, lb = _linear_rgb(a), _linear_rgb(b)
    if vision is not None:
        m = np.array(_CVD[vision])
        la, lb = m @ la, m @ lb
    return float(np.linalg.norm(_lab(la) - _lab(lb)))


#: Colours this far apart (CIE76 ΔE) are told apart at a glance; closer pairs need another cue.
DISTINCT_DELTA_E = 20.0


def test_every_preset_and_control_has_its_own_style_and_colour_blind_readers_can_tell_them_apart():
    """Each of the sweep presets and training controls has a fixed colour of its own; a pair whose
    colours a reader with protanopia, deuteranopia or tritanopia (or a grey-scale print) cannot
    tell apart is drawn with different dashes and markers."""
    from osa_lab.nn.presets import preset_names
    from osa_lab.plots.style import PRESET_STYLES, preset_style

    names = preset_names(training=True)
    assert set(names) == set(PRESET_STYLES), "a preset or control without its fixed style"
    styles = {n: preset_style(n) for n in names}
    colours = [s.colour.lower() for s in styles.values()]
    assert len(set(colours)) == len(colours)
    assert len({(s.dash, s.marker) for s in styles.values()}) == len(names)
    assert len({s.marker for s in styles.values()}) == len(names)
    close = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ca, cb = styles[a].colour, styles[b].colour
            assert _delta_e(ca, cb) >= DISTINCT_DELTA_E, (a, b, _delta_e(ca, cb))  # normal vision
            worst = min(_delta_e(ca, cb, v) for v in _CVD)
            lightness = abs(_lab(_linear_rgb(ca))[0] - _lab(_linear_rgb(cb))[0])
            if worst < DISTINCT_DELTA_E or lightness < 10:
                close.append((a, b))
                assert styles[a].dash != styles[b].dash or styles[a].marker != styles[b].marker, (a, b)
    # the seven presets of the sweeps and the dashboard all draw solid: their colours must carry them
    sweep = preset_names()
    for i, a in enumerate(sweep):
        for b in sweep[i + 1:]:
            worst = min(_delta_e(styles[a].colour, styles[b].colour, v) for v in _CVD)
            assert worst >= 8.0, (a, b, worst)


def test_figures_draw_each_preset_in_its_style_in_both_backends():
    from osa_lab.nn.presets import preset_names
    from osa_lab.plots.style import preset_style

    names = preset_names(training=True)
    metrics = pd.DataFrame([dict(preset=p, layer=layer, metric="stable_rank", value=1.0 + layer + i, seed=0,
                                 site="block") for i, p in enumerate(names) for layer in range(3)])
    overlay = D.metric_vs_depth(metrics, "stable_rank")
    curves = [el for el in overlay if type(el) is hv.Curve]
    assert [c.label for c in curves] == names
    for c in curves:
        want = preset_style(c.label)
        bokeh = hv.Store.lookup_options("bokeh", c, "style").kwargs
        mpl = hv.Store.lookup_options("matplotlib", c, "style").kwargs
        assert bokeh["color"] == want.colour and bokeh["line_dash"] == want.dash
        assert mpl["color"] == want.colour and mpl["linestyle"] == want.dash and mpl["marker"] == want.marker
    fig = hv.render(overlay, backend="matplotlib")
    try:
        lines = [ln for ln in fig.axes[0].get_lines() if ln.get_label() in names]
        assert len({(ln.get_color(), ln.get_linestyle(), ln.get_marker()) for ln in lines}) == len(names)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_preset_colours_are_fixed_across_figures_and_orders():
    from osa_lab.plots import PRESET_COLOURS

    m = _metrics()
    fig = D.metric_vs_depth(m, "relative_residual")
    rev = D.metric_vs_depth(m.iloc[::-1], "relative_residual")
    for obj in (fig, rev):
        for el in obj:
            if type(el).__name__ == "Curve":
                colour = hv.Store.lookup_options("bokeh", el, "style").kwargs["color"]
                assert colour == PRESET_COLOURS[el.label]


def test_time_plot_tick_labels_do_not_overlap():
    from osa_lab.plots import expm as E

    assert E._tick(16384) == "16k" and E._tick(32768) == "32k" and E._tick(512) == "512" and E._tick(0.5) == "0.5"


def test_importing_the_plots_keeps_the_users_matplotlib_backend():
    import subprocess
    import sys

    code = (
        "import matplotlib; matplotlib.use('pdf'); import osa_lab.plots, osa_lab.plots.training, "
        "osa_lab.plots.expm; import matplotlib.pyplot as plt; print(matplotlib.get_backend())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip().lower() == "pdf"  # was switched to Agg by an import


# ---------------------------------------------------------------------------------------------
# one colour per preset (bands and bars too), integer layer ticks,
# legends that cover no axis label. Each inspects the rendered bokeh models / matplotlib artists.

FOUR = ("vit", "skipless-osa", "pure-ssa", "pure-osa")


def _training_metrics(presets=("vit", "skipless-osa"), seeds=2, layers=3) -> pd.DataFrame:
    """A tiny tidy training-metrics table: per-epoch accuracy, hidden-state metrics at two steps,
    OSA mixing rows and the α := 0 ablation."""
    rows = []
    for p in presets:
        for seed in range(seeds):
            for epoch in (1, 2):
                rows.append(dict(preset=p, data="d", seed=seed, epoch=epoch, step=10 * epoch, kind="eval",
                                 metric="test_accuracy", layer=-1, head=-1, value=0.2 + 0.1 * epoch + 0.01 * seed))
            for step in (0, 20):
                for layer in range(layers + 1):
                    rows.append(dict(preset=p, data="d", seed=seed, epoch=step // 10, step=step, kind="hidden",
                                     metric="stable_rank", layer=layer, head=-1,
                                     value=5.0 - layer * (0.5 if step else 0.2) + 0.1 * seed))
                if "osa" in p:
                    for layer in range(2):
                        rows.append(dict(preset=p, data="d", seed=seed, epoch=step // 10, step=step, kind="mixing",
                                         metric="mixing_ratio", layer=layer, head=0,
                                         value=0.01 + 0.02 * (step > 0) + 0.003 * seed + 0.001 * layer))
            if "osa" in p:
                rows.append(dict(preset=p, data="d", seed=seed, epoch=2, step=20, kind="mixing",
                                 metric="val_accuracy_alpha0", layer=-1, head=-1, value=0.3 + 0.01 * seed))
                rows.append(dict(preset=p, data="d", seed=seed, epoch=2, step=20, kind="mixing",
                                 metric="val_accuracy_alpha0_drop", layer=-1, head=-1, value=0.1))
    return pd.DataFrame(rows)


def _hex(c) -> str:
    from matplotlib.colors import to_hex

    return to_hex(c, keep_alpha=False).lower()


def _mpl_axes(obj):
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = hv.render(obj, backend="matplotlib")
    FigureCanvasAgg(fig).draw()  # lay out text so extents and tick labels are final
    return fig, plt


def _assert_bands_match_lines(obj) -> None:
    """Every min–max band (matplotlib PolyCollection, bokeh Patch) has its curve's colour."""
    fig, plt = _mpl_axes(obj)
    try:
        ax = fig.axes[0]
        bands = [c for c in ax.collections if type(c).__name__.endswith("PolyCollection")]
        lines = [ln for ln in ax.lines if not ln.get_label().startswith("_")] or ax.lines
        assert len(bands) == len(lines) > 0
        for band, line in zip(bands, lines, strict=True):
            assert _hex(band.get_facecolor()[0]) == _hex(line.get_color()), line.get_label()
    finally:
        plt.close(fig)
    bk = hv.render(obj, backend="bokeh")
    glyphs = [r.glyph for r in bk.renderers]
    patches = [g for g in glyphs if type(g).__name__ == "Patch"]
    lines = [g for g in glyphs if type(g).__name__ == "Line"]
    assert len(patches) == len(lines) > 0
    for patch, line in zip(patches, lines, strict=True):
        assert str(patch.fill_color).lower() == str(line.line_color).lower()


def test_min_max_bands_take_their_lines_preset_colour_in_both_backends():
    """Matplotlib's Area defaulted to the HoloViews colour cycle (a salmon band under a blue line
    in reports 02 and 04); every band must carry its line's fixed preset colour."""
    from osa_lab.plots import preset_colour
    from osa_lab.plots import training as T

    fig = D.metric_vs_depth(_metrics(FOUR), "token_cosine")
    _assert_bands_match_lines(fig)
    for el in fig:
        assert hv.Store.lookup_options("matplotlib", el, "style").kwargs["color"] == preset_colour(el.label)
    m = _training_metrics()
    _assert_bands_match_lines(T.learning_curves(m, "test_accuracy"))
    for obj in (T.depth_profiles(m, "stable_rank"), T.mixing_profiles(m, "mixing_ratio")):
        _assert_bands_match_lines(obj)
        for el in obj:  # init and trained profiles both in the preset's colour (init dashed)
            preset, _, stage = el.label.partition(" · ")
            style = hv.Store.lookup_options("bokeh", el, "style").kwargs
            assert style["color"] == preset_colour(preset)
            if type(el).__name__ == "Curve":
                assert style["line_dash"] == ("dashed" if stage == "init" else "solid")


def test_colour_map_keeps_preset_colours_in_mixed_groups():
    from osa_lab.plots import PRESET_COLOURS, colour_map

    cm = colour_map(["my-preset", "pure-osa", "vit"])
    assert cm["pure-osa"] == PRESET_COLOURS["pure-osa"] and cm["vit"] == PRESET_COLOURS["vit"]
    assert cm["my-preset"] not in {PRESET_COLOURS["pure-osa"], PRESET_COLOURS["vit"]}


def test_accuracy_bars_have_each_presets_colour_in_both_backends():
    from osa_lab.plots import preset_colour
    from osa_lab.plots import training as T

    summary = pd.DataFrame({"preset": ["vit", "skipless-ssa", "skipless-osa", "ssa-cutting-skip"],
                            "test_accuracy_mean": [0.19, 0.13, 0.17, 0.27], "test_accuracy_std": [0.03, 0.01, 0.02, 0.01]})
    want = [preset_colour(p) for p in summary["preset"]]
    obj = T.summary_bars(summary)
    fig, plt = _mpl_axes(obj)
    try:
        ax = fig.axes[0]
        faces = [_hex(p.get_facecolor()) for p in ax.patches if p.get_height() > 0]
        assert faces == [c.lower() for c in want]
        assert [t.get_text() for t in ax.get_xticklabels()] == summary["preset"].tolist()
    finally:
        plt.close(fig)
    bk = hv.render(obj, backend="bokeh")
    (bars,) = [r for r in bk.renderers if type(r.glyph).__name__ == "VBar"]
    src = bars.data_source.data
    assert list(src["color"]) == want and list(src["preset"]) == summary["preset"].tolist()

    # grouped ablation bars: both settings of a preset in its colour, α := 0 lighter
    ab = T.ablation_bars(_training_metrics(("skipless-osa", "pure-osa")))
    fig, plt = _mpl_axes(ab)
    try:
        patches = [p for p in fig.axes[0].patches if p.get_height() > 0]
        assert [_hex(p.get_facecolor()) for p in patches] == [
            preset_colour(p).lower() for p in ("skipless-osa", "pure-osa")] * 2
        assert [p.get_alpha() for p in patches] == [1.0, 1.0, 0.45, 0.45]
    finally:
        plt.close(fig)
    bk = hv.render(ab, backend="bokeh")
    (bars,) = [r for r in bk.renderers if type(r.glyph).__name__ == "VBar"]
    src = bars.data_source.data
    assert [c for c in src["color"]] == [preset_colour(str(f[0]) if isinstance(f, tuple) else p)
                                         for f, p in zip(src["xoffsets"], src["preset"], strict=True)]

    paired = pd.DataFrame({"preset": ["vit", "skipless-ssa"], "diff_mean": [-0.01, 0.05],
                           "ci_low": [-0.03, 0.02], "ci_high": [0.01, 0.08]})
    pp = T.paired_differences_plot(paired)
    bk = hv.render(pp, backend="bokeh")
    (pts,) = [r for r in bk.renderers if type(getattr(r, "glyph", None)).__name__ == "Scatter"]
    assert list(pts.data_source.data["color"]) == [preset_colour("vit"), preset_colour("skipless-ssa")]


def _assert_integer_ticks(obj, bokeh: bool = True) -> None:
    from bokeh.models import AdaptiveTicker, FixedTicker, SingleIntervalTicker

    fig, plt = _mpl_axes(obj)
    try:
        for ax in fig.axes:
            if not ax.get_xlabel():  # colour bars
                continue
            lo, hi = sorted(ax.get_xlim())
            ticks = [t for t in ax.get_xticks() if lo - 1e-9 <= t <= hi + 1e-9]
            assert ticks and all(float(t).is_integer() for t in ticks), (ax.get_xlabel(), ticks)
    finally:
        plt.close(fig)
    if not bokeh:
        return
    bk = hv.render(obj, backend="bokeh")
    figs = [bk] if hasattr(bk, "xaxis") else [f for f in bk.select({"type": __import__("bokeh").plotting.figure})]
    assert figs
    for f in figs:
        for axis in f.xaxis:
            t = axis.ticker
            if isinstance(t, FixedTicker):
                assert all(float(v).is_integer() for v in t.ticks)
            elif isinstance(t, SingleIntervalTicker):
                assert float(t.interval).is_integer() and t.interval >= 1
            else:
                assert isinstance(t, AdaptiveTicker) and t.min_interval >= 1 and t.num_minor_ticks == 0, t
                assert all(float(m).is_integer() for m in t.mantissas)
        for grid in f.xgrid:  # the grid lines follow the same ticks
            assert grid.ticker is f.xaxis[0].ticker


def test_layer_and_epoch_axes_have_integer_ticks_only():
    """Reports 02/03 and the dashboard showed half- and quarter-layer ticks (1.25, 1.5, …) at small
    depths; every layer/depth/epoch axis must tick whole numbers only, in both backends."""
    from osa_lab.plots import training as T

    for depth in (3, 4):
        _assert_integer_ticks(D.metric_vs_depth(_metrics(depth=depth), "token_cosine"))
        _assert_integer_ticks(D.kappa_vs_depth(_jacobian(depth=depth)))
    _assert_integer_ticks(T.learning_curves(_training_metrics(), "test_accuracy"))
    _assert_integer_ticks(T.mixing_profiles(_training_metrics(), "mixing_ratio"))
    _assert_integer_ticks(D.spectra_heatmaps(_spectra(depth=3)))
    _assert_integer_ticks(D.spectra_lines(_spectra(depth=3)))
    # a continuous parameter keeps ordinary ticks
    df = pd.DataFrame({"preset": "pure-osa", "alpha": [0.1, 0.2, 0.3], "seed": 0, "kappa": [1.0, 2.0, 3.0]})
    assert not hv.Store.lookup_options("bokeh", list(D.kappa_vs_parameter(df, "alpha"))[1], "plot").kwargs.get("hooks")


def test_integer_layer_ticks_survive_the_dashboards_dynamic_map():
    """The dashboard shows figures through a DynamicMap, with overlay-level options (``hooks``)
    of its own that replace the overlay's; the integer ticker is installed per element and so
    still applies, also after a data update."""
    from bokeh.models import AdaptiveTicker

    def noop(plot, element):
        return None

    def on_dmap(fig):
        pipe = hv.streams.Pipe(data=fig)
        return hv.DynamicMap(lambda data: data, streams=[pipe]).opts(framewise=True, hooks=[noop],
                                                                      backend="bokeh"), pipe

    def on_overlay(fig):  # options set on the figure itself (cloned) before it goes into the map
        def prep(f):
            return f.opts(framewise=True, hooks=[noop], backend="bokeh", clone=True)

        pipe = hv.streams.Pipe(data=prep(fig))
        dmap = hv.DynamicMap(lambda data: data, streams=[pipe])
        return dmap, type("P", (), {"send": staticmethod(lambda f: pipe.send(prep(f)))})

    for wrap in (on_dmap, on_overlay):
        dmap, pipe = wrap(D.kappa_vs_depth(_jacobian(depth=3)))
        plot = hv.renderer("bokeh").get_plot(dmap)
        ticker = plot.state.xaxis[0].ticker
        assert isinstance(ticker, AdaptiveTicker) and ticker.min_interval >= 1, wrap.__name__
        pipe.send(D.kappa_vs_depth(_jacobian(depth=4)))  # a data update keeps it
        assert plot.state.xaxis[0].ticker.min_interval >= 1


def test_spectra_line_legend_covers_no_axis_label_or_curve_panel():
    """Report 02: the legends of the spectra lines (below each panel) covered the "index" label.
    Matplotlib: one legend, to the right of the last panel, overlapping no axes and no label."""
    layout = D.spectra_lines(_spectra(presets=FOUR)).cols(4).opts(hspace=0.5, vspace=0.35, backend="matplotlib")
    fig, plt = _mpl_axes(layout)
    try:
        r = fig.canvas.get_renderer()
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        assert len(legends) == 1
        box = legends[0].get_window_extent(r)
        for ax in fig.axes:
            for artist in (ax, ax.xaxis.label, ax.yaxis.label, ax.title):
                other = artist.get_window_extent(r)
                assert not box.overlaps(other), f"legend overlaps {artist} of {ax.get_title()!r}"
    finally:
        plt.close(fig)


def test_dashed_profiles_show_their_dash_in_the_matplotlib_legend():
    """Report 04: the init (dashed) and trained (solid) legend entries looked alike at the default
    handle length; the legend's lines are long enough to show the dash."""
    from osa_lab.plots import training as T

    fig, plt = _mpl_axes(T.mixing_profiles(_training_metrics(), "mixing_ratio"))
    try:
        legend = fig.axes[0].get_legend()
        assert legend.handlelength >= 4.0
        styles = {t.get_text(): h.get_linestyle() for t, h in zip(legend.get_texts(), legend.legend_handles, strict=True)}
        assert styles["skipless-osa · init"] != styles["skipless-osa · trained"] == "-"
    finally:
        plt.close(fig)


def test_figures_export_as_vector_formats_and_refuse_unknown_ones():
    from osa_lab.plots.depth import figure_bytes

    obj = D.metric_vs_depth(_metrics(), "relative_residual", title="a very long title " * 8)
    assert figure_bytes(obj, "pdf", metadata={"Title": "t"}).startswith(b"%PDF")
    svg = figure_bytes(obj, "svg", metadata={"Title": "t", "Software": "x"})
    assert b"<svg" in svg and b"<path" in svg
    with pytest.raises(OSAInputError, match="svg"):
        figure_bytes(obj, "jpeg")


def test_ablation_bar_labels_do_not_overlap():
    """The α := 0 ablation bars (report 04): one label per preset under its group of bars, on
    one row and clear of each other, and a legend naming the two settings (HoloViews' own labels
    put each preset beside its bars' setting labels, where the longer names ran into them)."""
    import itertools

    from osa_lab.plots import training as T

    presets = ("skipless-osa", "pure-osa", "skipless-osa-alpha0")
    fig, plt = _mpl_axes(T.ablation_bars(_training_metrics(presets)))
    try:
        ax = fig.axes[0]
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        labels = [t for t in (*ax.get_xticklabels(), *ax.get_xticklabels(minor=True)) if t.get_text()]
        assert [t.get_text() for t in labels] == list(presets)
        boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
        assert len({t.get_position()[1] for t in labels}) == 1  # one row
        assert max(b.y0 for b in boxes) < min(b.y1 for b in boxes)
        gaps = [right.x0 - left.x1 for left, right in itertools.pairwise(boxes)]
        assert min(gaps) > 5, gaps  # pixels between neighbouring labels
        centres = [(b.x0 + b.x1) / 2 for b in boxes]
        bars = sorted(ax.patches, key=lambda p: p.get_x())
        groups = [bars[2 * i: 2 * i + 2] for i in range(len(presets))]
        for centre, (first, second) in zip(centres, groups, strict=True):
            left = ax.transData.transform((first.get_x(), 0))[0]
            right = ax.transData.transform((second.get_x() + second.get_width(), 0))[0]
            assert left < centre < right  # each label under its own group of bars
        legend = ax.get_legend()
        assert legend is not None and [t.get_text() for t in legend.get_texts()] == list(T.ABLATION_SETTINGS)
    finally:
        plt.close(fig)
