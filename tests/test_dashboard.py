"""Logic tests of the Panel dashboard (dashboards/osa_dashboard.py), without a server or browser.

The app object is built with small sizes; parameters are changed as a user would, and the tests
assert on the data behind each plot (the HoloViews objects held by the bound panes).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pn = pytest.importorskip("panel")

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "dashboards" / "osa_dashboard.py"
SMALL = dict(depth=3, tokens=8, dim=8, heads=2, seeds=2)


@pytest.fixture(scope="module")
def dash():
    """The dashboard module, imported the way ``panel serve`` would not (so nothing is served)."""
    name = "osa_dashboard_under_test"
    spec = importlib.util.spec_from_file_location(name, APP)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pn.cache looks the defining module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(name, None)


@pytest.fixture
def app(dash):
    a = dash.build_app(**SMALL)
    pn.panel(a)  # build every view's panes (as the server does)
    return a


def _pane_data(view, key):
    """The HoloViews object currently shown by pane ``key`` of ``view``."""
    return view.panes[key].object


def _layers(overlay) -> list[int]:
    curves = [el for el in overlay if type(el).__name__ == "Curve"]
    return sorted({int(x) for c in curves for x in c.dimension_values("layer")})


def test_module_imports_without_serving(dash):
    assert not pn.state.served
    assert hasattr(dash, "Dashboard") and not pn.state._servers


def test_initial_build_draws_every_view(app):
    state = app.state
    assert state.error == ""
    assert set(state.metrics["preset"]) == {"pure-ssa", "pure-osa"}
    assert state.config == dict(presets=("pure-ssa", "pure-osa"), depth=3, tokens=8, dim=8, heads=2, alpha=None,
                                seeds=2)
    fig = _pane_data(app.rank_view, "metric")
    assert {el.label for el in fig} == {"pure-ssa", "pure-osa"}
    assert _layers(fig) == [0, 1, 2, 3]
    data = app.rank_view.tables["metric"]
    assert (data["n"] == 2).all()  # two seeds per point
    heat = _pane_data(app.spectra_view, "heatmaps")
    assert [img.label for img in heat] == ["pure-ssa", "pure-osa"]
    assert heat.values()[0].dimension_values("layer", expanded=False).tolist() == [0, 1, 2, 3]
    assert len(_pane_data(app.spectra_view, "lines")) == 2
    check = app.check_view.result
    assert check["tokens"] == 8 and all(check["passed"].values())
    assert 'data-check="orthogonality_error"' in app.check_view.badges_html(check)


def test_depth_change_updates_the_plotted_data(app):
    before = app.rank_view.tables["metric"]
    app.controls.depth = 5
    assert app.state.error == ""
    assert app.state.metrics["layer"].max() == 5
    assert _layers(_pane_data(app.rank_view, "metric")) == list(range(6))
    after = app.rank_view.tables["metric"]
    assert len(after) == len(before) + 2 * 2
    # the spectra heatmaps and the layer chooser follow
    assert _pane_data(app.spectra_view, "heatmaps").values()[0].dimension_values("layer", expanded=False)[-1] == 5
    assert app.spectra_view.param.layers.objects == list(range(6))


def test_pure_ssa_collapses_and_pure_osa_does_not(app):
    app.controls.depth = 6
    data = app.rank_view.tables["metric"].set_index(["preset", "layer"])
    assert data.loc[("pure-ssa", 6), "mean"] < 1e-3 * data.loc[("pure-ssa", 0), "mean"]
    assert data.loc[("pure-osa", 6), "mean"] > 0.1 * data.loc[("pure-osa", 0), "mean"]


def test_metric_and_site_choices_change_the_figure(app):
    app.controls.metric = "stable_rank"
    fig = _pane_data(app.rank_view, "metric")
    assert "stable rank" in fig.opts.get("plot", "bokeh").kwargs["title"]
    values = app.rank_view.tables["metric"]["mean"]
    assert ((values >= 1 - 1e-9) & (values <= 8 + 1e-9)).all()  # stable rank of an 8×8 matrix
    app.rank_view.site = "attention"
    assert app.rank_view.tables["metric"]["layer"].min() == 1  # attention outputs start at layer 1
    app.rank_view.scale = "linear"
    assert _pane_data(app.rank_view, "metric").opts.get("plot", "bokeh").kwargs["logy"] is False


def test_impossible_settings_keep_the_last_good_figures(app):
    metrics, fig = app.state.metrics, _pane_data(app.rank_view, "metric")
    app.controls.heads = 3  # 8 % 3 != 0
    assert "not divisible by heads" in app.state.error
    assert app.state.metrics is metrics and _pane_data(app.rank_view, "metric") is fig
    assert "not divisible" in app.check_view.job.error
    app.controls.heads = 2
    assert app.state.error == "" and app.check_view.job.error == ""
    app.controls.presets = ["pure-osa"]
    assert "at least two presets" in app.state.error
    assert app.state.metrics is metrics


def test_unexpected_failure_becomes_a_message_not_a_traceback(app, dash, monkeypatch):
    def boom(**kwargs):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(dash, "compute_sweep", boom)
    metrics = app.state.metrics
    app.controls.depth = 2
    assert "simulated failure" in app.state.error and "Traceback" not in app.state.error
    assert app.state.metrics is metrics


def test_layer_selection_draws_those_layers(app):
    app.spectra_view.layers = [0, 3]
    lines = _pane_data(app.spectra_view, "lines")
    assert [c.label for c in lines.values()[0]] == ["layer 0", "layer 3"]
    app.controls.depth = 2  # layer 3 disappears from the choices and the selection
    assert app.spectra_view.layers == [0]


def test_alpha_control_reaches_the_osa_preset(app):
    app.controls.derived_alpha = False
    app.controls.alpha = 0.4
    m = app.state.metrics
    assert np.allclose(m[m["preset"] == "pure-osa"]["alpha"], 0.4)
    assert m[m["preset"] == "pure-ssa"]["alpha"].isna().all()
    assert app.check_view.result["alpha"] == pytest.approx(0.4)


def test_downloads_return_tidy_csv_and_png(app):
    csv = app.rank_view._csv().getvalue().decode()
    header = csv.splitlines()[0].split(",")
    assert header == ["preset", "depth", "tokens", "dim", "heads", "alpha", "seed", "layer", "site", "metric", "value"]
    df = pd.read_csv(app.rank_view._csv())
    assert len(df) == len(app.state.metrics)
    spectra = pd.read_csv(app.rank_view._spectra_csv())
    assert {"index", "sigma", "sigma_normalized"} <= set(spectra.columns)
    buttons = [w for w in app.rank_view.__panel__().select(pn.widgets.FileDownload)]
    png = [b for b in buttons if b.filename.endswith(".png")][0]
    assert png.callback().getvalue()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sessions_are_independent(dash):
    a, b = dash.build_app(**SMALL), dash.build_app(**SMALL)
    pn.panel(a), pn.panel(b)
    a.controls.depth = 4
    assert a.state.metrics["layer"].max() == 4
    assert b.state.metrics["layer"].max() == 3
    assert a.controls is not b.controls and a.state is not b.state


def test_jacobian_view_computes_only_when_open(app, dash, monkeypatch):
    calls = []
    profile = pd.DataFrame(dict(preset=["pure-ssa", "pure-osa"] * 2, depth=3, tokens=8, dim=8, heads=2,
                                alpha=np.nan, seed=0, layer=[1, 1, 2, 2], scope="end_to_end", method="exact",
                                sigma_max=1.0, sigma_min=0.5, kappa=[2.0, 1.0, 4.0, 1.0]))
    svals = pd.DataFrame(dict(preset=["pure-ssa"] * 3 + ["pure-osa"] * 3, method="exact",
                              sigma=[1.0, 0.5, 0.1, 1.0, 1.0, 0.9]))

    def fake(**kwargs):
        calls.append(kwargs)
        return profile, svals

    monkeypatch.setattr(dash, "compute_jacobian", fake)
    app.controls.depth = 2
    assert calls == []  # tab closed: nothing computed
    app.tabs.active = 2
    assert len(calls) == 1 and calls[0]["method"] == "auto" and calls[0]["depth"] == 2
    assert app.jacobian_view.methods_used() == "exact"
    assert "exact" in app.jacobian_view.badge(profile)
    kappa = _pane_data(app.jacobian_view, "kappa")
    assert "exact" in kappa.opts.get("plot", "bokeh").kwargs["title"]
    assert app.jacobian_view.tables["kappa"].set_index(["preset", "layer"]).loc[("pure-ssa", 2), "mean"] == 4.0


def test_large_jacobian_waits_for_the_compute_button(app, dash, monkeypatch):
    calls = []
    monkeypatch.setattr(dash, "compute_jacobian", lambda **kw: calls.append(kw) or (None, None))
    app.controls.tokens, app.controls.dim = 64, 64
    app.tabs.active = 2
    assert calls == [] and "Compute Jacobians" in app.jacobian_view.notice
    app.jacobian_view.param.trigger("compute")
    assert len(calls) == 1 and calls[0]["tokens"] == 64 and app.jacobian_view.notice == ""
    assert calls[0]["seeds"] == 1 and calls[0]["points"] == 6


def test_jacobian_layers_are_spread_and_end_at_depth(dash):
    assert dash.jacobian_layers(12, 4) == [3, 6, 9, 12]
    assert dash.jacobian_layers(3, 6) == [1, 2, 3]
    assert dash.jacobian_layers(1, 1) == [1]


def test_real_jacobian_tiny(app):
    """The real osa_lab.jacobian at a tiny size: exact method, κ per layer, full spectrum."""
    app.controls.param.update(depth=2, tokens=4, dim=4, heads=1, seeds=1)
    app.jacobian_view.points = 2
    app.tabs.active = 2
    view = app.jacobian_view
    assert view.job.error == "", view.job.error
    assert view.methods_used() == "exact"
    assert set(view.profile["layer"]) == {1, 2}
    osa = view.tables["kappa"].set_index(["preset", "layer"])
    assert osa.loc[("pure-osa", 1), "mean"] < 2.0  # OSA init keeps the Jacobian well-conditioned
    assert view.svals.groupby("preset").size().tolist() == [16, 16]  # all N·d singular values
    assert type(_pane_data(view, "histogram")).__name__ == "Overlay"


def test_jacobian_too_big_is_a_message(app, dash, monkeypatch):
    from osa_lab.errors import ConfigurationError

    def too_big(**kwargs):
        raise ConfigurationError("the exact Jacobian would be 4096×4096 (134 MB); use method='matrix-free'")

    monkeypatch.setattr(dash, "compute_jacobian", too_big)
    app.jacobian_view.method = "exact"
    app.tabs.active = 2
    assert "matrix-free" in app.jacobian_view.job.error
    assert app.jacobian_view.profile is None


def test_template_builds_offline_design(app, dash):
    tmpl = app.template()
    assert isinstance(tmpl, pn.template.FastListTemplate)
    assert tmpl.design is dash.OfflineFast
    assert dash.OfflineFast._resources["font"] == {}
    assert tmpl.font_url == ""
