"""Logic tests of the Panel dashboard (osa_lab.dashboard), without a server or browser.

The app object is built with small sizes; parameters are changed as a user would, and the tests
assert on the data behind each plot (the HoloViews objects held by the bound panes).
"""

from __future__ import annotations

import html
import importlib.util
import io
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pn = pytest.importorskip("panel")
hv = pytest.importorskip("holoviews")

ROOT = Path(__file__).resolve().parents[2]

from osa_lab.dashboard import figure_view, jacobian_view  # noqa: E402 - after the panel importorskip
from osa_lab.errors import ConfigurationError  # noqa: E402
from osa_lab.plots.depth import figure_title  # noqa: E402

APP = ROOT / "dashboards" / "osa_dashboard.py"
SMALL = dict(depth=3, tokens=8, dim=8, seeds=2)


@pytest.fixture(scope="module")
def dash():
    """The dashboard's app module (importing it serves nothing)."""
    from osa_lab.dashboard import app

    return app


def _load_script(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


@pytest.mark.parametrize("script", [APP, ROOT / "osa_lab" / "dashboard" / "osa_dashboard.py"])
def test_entry_scripts_are_thin_and_build_from_the_package(script):
    """``dashboards/osa_dashboard.py`` (and the packaged copy ``osa-lab dashboard``
    serves) define no app code of their own: every class comes from ``osa_lab.dashboard``."""
    import ast

    tree = ast.parse(script.read_text())
    assert not [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))]
    module = _load_script(script, "osa_dashboard_entry_under_test")
    assert not pn.state.served and not pn.state._servers
    from osa_lab.dashboard import app

    assert module.serve_session is app.serve_session


def test_cli_serves_the_script_inside_the_package(monkeypatch):
    """``osa-lab dashboard`` serves the entry script shipped in the package (no path search, so a
    wheel install works) with --warm and short unused-session settings."""
    import argparse

    import osa_lab
    from osa_lab.dashboard import cli

    monkeypatch.delenv("OSA_LAB_DASHBOARD", raising=False)
    path = cli.app_path()
    assert path.parent == Path(osa_lab.__file__).parent / "dashboard" and path.name == "osa_dashboard.py"
    args = argparse.Namespace(port=0, address="127.0.0.1", show=False, allow_websocket_origin=None, num_threads=None)
    cmd = cli.build_command(args)
    assert cmd[3:5] == ["serve", str(path)] and "--warm" in cmd
    assert cmd[cmd.index("--unused-session-lifetime") + 1] == str(cli.UNUSED_SESSION_LIFETIME_MS)


@pytest.fixture
def app(dash):
    dash.JACOBIANS.clear()
    a = dash.build_app(**SMALL)
    pn.panel(a)  # build every view's panes (as the server does)
    return a


def _pane_data(view, key):
    """The HoloViews object currently shown by pane ``key`` of ``view`` (the figure itself, or the
    last frame of the DynamicMap that data updates go through)."""
    obj = view.panes[key].object
    if isinstance(obj, hv.DynamicMap):
        frame = obj[()]
        assert frame is figure_view.prepared(view.figures[key])[0]  # the figure with its update options
        return frame
    return obj


def _layers(overlay) -> list[int]:
    curves = [el for el in overlay if type(el).__name__ == "Curve"]
    return sorted({int(x) for c in curves for x in c.dimension_values("layer")})


def test_module_imports_without_serving(dash):
    assert not pn.state.served
    assert hasattr(dash, "Dashboard") and not pn.state._servers


def test_initial_build_draws_the_visible_view(app):
    state = app.state
    assert state.error == ""
    assert set(state.metrics["preset"]) == {"pure-ssa", "pure-osa"}
    assert state.config == dict(presets=("pure-ssa", "pure-osa"), depth=3, tokens=8, dim=8, heads=None, alpha=None,
                                seeds=2)
    fig = _pane_data(app.rank_view, "metric")
    assert {el.label for el in fig} == {"pure-ssa", "pure-osa"}
    assert _layers(fig) == [0, 1, 2, 3]
    data = app.rank_view.tables["metric"]
    assert (data["n"] == 2).all()  # two seeds per point
    # the hidden Spectra tab is neither built nor drawn until it is shown
    assert app.spectra_view.stale and not app.spectra_view.panes and not app.tabs[1].objects
    app.controls.view = "spectra"
    assert app.tabs.active == 1
    heat = _pane_data(app.spectra_view, "heatmaps")
    assert [img.label for img in heat] == ["pure-ssa", "pure-osa"]
    assert heat.values()[0].dimension_values("layer", expanded=False).tolist() == [0, 1, 2, 3]
    assert len(_pane_data(app.spectra_view, "lines")) == 2
    check = app.check_view.result
    assert check["tokens"] == 8 and all(check["passed"].values())
    assert check["heads"] == 1  # pure-osa's own head count
    assert 'data-check="orthogonality_error"' in app.check_view.badges_html(check)


def _title(obj) -> str:
    from osa_lab.plots.depth import figure_title

    return figure_title(obj)


def test_titles_state_the_settings_and_labels_are_human(app):
    title = _title(_pane_data(app.rank_view, "metric"))
    assert "relative residual" in title and "relative_residual" not in title
    assert "depth 3 · N 8 · d 8 · preset heads · α₀ derived · 2 seeds" in title
    app.controls.heads = 2
    assert "2 heads" in _title(_pane_data(app.rank_view, "metric"))


def test_depth_change_updates_the_plotted_data(app):
    before = app.rank_view.tables["metric"]
    app.controls.depth = 5
    assert app.state.error == ""
    assert app.state.metrics["layer"].max() == 5
    assert _layers(_pane_data(app.rank_view, "metric")) == list(range(6))
    after = app.rank_view.tables["metric"]
    assert len(after) == len(before) + 2 * 2
    app.controls.view = "spectra"  # the spectra heatmaps and the layer chooser follow
    assert _pane_data(app.spectra_view, "heatmaps").values()[0].dimension_values("layer", expanded=False)[-1] == 5
    assert app.spectra_view.param.layers.objects == list(range(6))


def test_pure_ssa_collapses_and_pure_osa_does_not(app):
    app.controls.depth = 6
    data = app.rank_view.tables["metric"].set_index(["preset", "layer"])
    assert data.loc[("pure-ssa", 6), "mean"] < 1e-3 * data.loc[("pure-ssa", 0), "mean"]
    assert data.loc[("pure-osa", 6), "mean"] > 0.1 * data.loc[("pure-osa", 0), "mean"]


@pytest.mark.parametrize("metric", ["stable_rank", "condition_number"])
def test_pure_osa_with_preset_default_heads_is_flat(dash, metric):
    """The default heads are each preset's own (1 for pure-osa), which keeps every
    singular value, so stable rank and κ(X) are flat across depth (they were not with 2 heads)."""
    a = dash.build_app(presets=["pure-ssa", "pure-osa"], depth=12, tokens=16, dim=16, seeds=1, metric=metric)
    pn.panel(a)
    osa = a.rank_view.tables["metric"].set_index(["preset", "layer"]).loc["pure-osa", "mean"]
    assert np.allclose(osa.to_numpy(), osa.iloc[0], rtol=1e-6, atol=0), osa.tolist()
    a.controls.heads = 2  # several heads: the page says the invariant is broken, and the curve drifts
    assert any("not** spectrum preserving" in n for n in a.controls.notes())
    osa2 = a.rank_view.tables["metric"].set_index(["preset", "layer"]).loc["pure-osa", "mean"]
    assert not np.allclose(osa2.to_numpy(), osa2.iloc[0], rtol=1e-6, atol=0)


def test_metric_and_site_choices_change_the_figure(app):
    app.controls.metric = "stable_rank"
    fig = _pane_data(app.rank_view, "metric")
    assert "stable rank" in _title(fig)
    values = app.rank_view.tables["metric"]["mean"]
    assert ((values >= 1 - 1e-9) & (values <= 8 + 1e-9)).all()  # stable rank of an 8×8 matrix
    app.controls.site = "attention"
    assert app.rank_view.tables["metric"]["layer"].min() == 1  # attention outputs start at layer 1
    app.controls.scale = "linear"
    assert _pane_data(app.rank_view, "metric").opts.get("plot", "bokeh").kwargs["logy"] is False


def test_heads_offer_only_divisors_and_impossible_settings_keep_figures(app, dash):
    assert app.controls.param.heads.objects == [dash.PRESET_HEADS, 1, 2, 4, 8]
    with pytest.raises(ValueError):
        app.controls.heads = 3
    app.controls.dim = 24
    assert 16 not in app.controls.param.heads.objects and 8 in app.controls.param.heads.objects
    app.controls.heads = 8
    app.controls.dim = 4  # 8 no longer divides d: back to the preset default, not an error
    assert app.controls.heads == dash.PRESET_HEADS and app.state.error == ""
    metrics, fig = app.state.metrics, _pane_data(app.rank_view, "metric")
    app.controls.presets = ["pure-osa"]
    assert "at least two presets" in app.state.error
    assert app.state.metrics is metrics and _pane_data(app.rank_view, "metric") is fig
    assert app.check_view.job.error == ""  # the message appears once (the sweep's), not per view


def test_unexpected_failure_becomes_a_message_not_a_traceback(app, monkeypatch):
    from osa_lab.dashboard import sweep

    def boom(settings, should_stop=None):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(sweep, "compute_sweep", boom)  # where the session's sweep calls it
    metrics = app.state.metrics
    app.controls.depth = 2
    assert "simulated failure" in app.state.error and "Traceback" not in app.state.error
    assert app.state.metrics is metrics


def test_layer_selection_draws_those_layers(app):
    app.controls.view = "spectra"
    app.spectra_view.layers = [0, 3]
    lines = _pane_data(app.spectra_view, "lines")
    assert [c.label for c in lines.values()[0]] == ["layer 0", "layer 3"]
    app.controls.depth = 2  # layer 3 disappears from the choices and the selection
    assert app.spectra_view.layers == [0]


def test_spectra_layers_colour_range_and_floor_are_in_the_url(app, dash):
    app.controls.view = "spectra"
    app.spectra_view.layers = [1, 3]
    app.controls.param.update(colours="per_panel", floor="1e-8")
    query = app.controls.to_query()
    assert (query["layers"], query["colours"], query["floor"]) == ("1,3", "per_panel", "1e-8")
    b = dash.Dashboard(compute_now=False)
    b.apply_url({k: [v.encode()] for k, v in query.items()})
    assert b.url_errors == []
    assert (b.controls.layers, b.controls.colours, b.controls.floor) == ([1, 3], "per_panel", "1e-8")


def test_an_unusable_layer_in_the_url_keeps_the_usable_ones(dash):
    d = dash.Dashboard(compute_now=False)
    d.apply_url({"layers": "0,x,2,-1,999", "floor": "7"})
    assert d.controls.layers == [0, 2]
    assert len(d.url_errors) == 2
    assert "layers" in d.url_errors[0] and "x" in d.url_errors[0] and "999" in d.url_errors[0]
    assert d.controls.floor == "1e-4"  # the default kept; its error names the valid values
    assert "1e-2" in d.url_errors[1]


def test_spectra_floor_and_per_panel_range_reach_the_heatmaps(app):
    import holoviews as hv

    def clims():
        heat = _pane_data(app.spectra_view, "heatmaps")
        return [hv.Store.lookup_options("bokeh", img, "plot").kwargs.get("clim")
                or hv.Store.lookup_options("bokeh", img, "style").kwargs.get("clim") for img in heat]  # fmt: skip

    app.controls.view = "spectra"
    assert set(clims()) == {(1e-4, 1.0)}  # the default floor
    app.controls.floor = "1e-2"
    assert set(clims()) == {(1e-2, 1.0)}
    app.controls.param.update(colours="per_panel", floor="auto")
    assert len(set(clims())) == 2  # pure-ssa collapses, pure-osa does not: each panel its own range


def test_the_osa_check_runs_for_every_osa_preset_shown(app):
    """pure-osa (1 head) and skipless-osa (4 heads) are different OSA operators at the same N and d:
    each gets its own check, named on the page; two OSA presets with equal heads share one."""
    app.controls.presets = ["pure-ssa", "skipless-osa", "pure-osa"]
    results = app.check_view.results
    assert [(r["presets"], r["heads"]) for r in results] == [(("skipless-osa",), 4), (("pure-osa",), 1)]
    page = app.check_view.results_html(results)
    assert page.count('class="osa-check-row"') == 2 and "skipless-osa:" in page and "pure-osa:" in page
    app.controls.heads = 1  # one head count for all: one check covers both presets
    assert [r["presets"] for r in app.check_view.results] == [("skipless-osa", "pure-osa")]
    assert app.check_view.results_html(app.check_view.results).count('class="osa-check-row"') == 1


def test_alpha_control_reaches_the_osa_preset_and_shows_derived_value(app):
    from osa_lab.nn.attention import derived_alpha_init

    assert app.controls.derived_alpha
    assert app.controls.alpha == pytest.approx(derived_alpha_init(8, 8, 8), rel=1e-4)  # pure-osa: 1 head, r = 8
    app.controls.derived_alpha = False
    app.controls.alpha = 0.4
    m = app.state.metrics
    assert np.allclose(m[m["preset"] == "pure-osa"]["alpha"], 0.4)
    assert m[m["preset"] == "pure-ssa"]["alpha"].isna().all()
    assert app.check_view.result["alpha"] == pytest.approx(0.4)
    sidebar = pn.Column(*app.sidebar())
    field = [w for w in sidebar.select(pn.widgets.FloatInput)][0]
    assert not field.disabled and not sidebar.select(pn.widgets.FloatSlider)
    field.value = 0.4975  # typed: the control takes exactly this value (a slider's step cannot)
    assert app.controls.alpha == 0.4975
    app.controls.derived_alpha = True
    assert field.disabled and field.value == pytest.approx(app.controls.derived_alpha0(), rel=1e-4)


def test_preset_colours_are_fixed_whatever_the_order(dash):
    from osa_lab.plots import PRESET_COLOURS

    def colours(presets):
        a = dash.build_app(presets=presets, depth=2, tokens=8, dim=8, seeds=1)
        pn.panel(a)
        fig = _pane_data(a.rank_view, "metric")
        return {el.label: el.opts.get("style", "bokeh").kwargs["color"] for el in fig if type(el).__name__ == "Curve"}

    assert colours(["vit", "pure-osa"]) == {"vit": PRESET_COLOURS["vit"], "pure-osa": PRESET_COLOURS["pure-osa"]}
    assert colours(["pure-osa", "skipless-ssa", "vit"])["vit"] == PRESET_COLOURS["vit"]


def test_url_round_trip_restores_the_view(dash):
    a = dash.build_app(presets=["vit", "pure-osa", "pure-ssa"], depth=4, tokens=16, dim=16, seeds=1)
    a.controls.param.update(view="jacobian", site="attention", scale="log", metric="stable_rank",
                            jacobian="matrix-free", scope="layer", heads=4)
    query = a.controls.to_query()
    assert query["presets"] == "vit,pure-ssa,pure-osa" and query["view"] == "jacobian"  # osa_lab.nn.presets order
    b = dash.Dashboard(compute_now=False)
    b.apply_url({k: [v.encode()] for k, v in query.items()})  # as Bokeh passes session_args
    assert b.url_errors == []
    names = ["presets", "view", "depth", "tokens", "dim", "heads", "seeds", "metric", "site", "scale", "jacobian",
             "scope", "derived_alpha"]
    assert {n: getattr(b.controls, n) for n in names} == {n: getattr(a.controls, n) for n in names}
    c = dash.Dashboard(compute_now=False)
    c.apply_url({"presets": "vit,pure-osa", "derived_alpha": "false", "alpha": "0.3"})
    assert c.controls.presets == ["vit", "pure-osa"] and c.controls.alpha_value == 0.3


def test_the_address_bar_keeps_the_view_even_when_the_browsers_address_arrives_late(dash):
    """``link_url`` writes the view's query into the page's location; the browser's own address
    (a link's unusable values) reaching the server afterwards is written over again, and a
    control change moves the address with it."""
    from panel.io.location import Location

    d = dash.Dashboard(compute_now=False)
    d.apply_url({"alpha": [b"inf"], "derived_alpha": [b"false"], "depth": [b"nan"], "tokens": [b"16"]})
    location = Location()
    d.link_url(location)
    first = location.search
    assert first.startswith("?") and "nan" not in first.lower() and "inf" not in first.lower()
    location.search = "?depth=4&alpha=inf&derived_alpha=false&depth=nan"  # the browser's, arriving late
    assert location.search == first
    d.controls.depth = 6 if d.controls.depth != 6 else 5
    assert f"depth={d.controls.depth}" in location.search and location.search != first


def test_bad_url_values_are_named_and_not_used(dash):
    d = dash.Dashboard(compute_now=False)
    d.apply_url({"presets": "vit,nope", "depth": "99", "heads": "3", "metric": "relative-residual", "dim": "16",
                 "zoom": "2"})
    text = " ".join(d.url_errors)
    for bit in ("presets=“vit,nope”", "unknown preset(s) “nope”", "depth=“99”", "heads=“3”",
                "metric=“relative-residual”", "unknown URL parameter “zoom”"):
        assert bit in text, text
    assert d.controls.presets == ["pure-ssa", "pure-osa"] and d.controls.depth == 12 and d.controls.dim == 16
    assert "presets=pure-ssa,pure-osa" in "&".join(f"{k}={v}" for k, v in d.controls.to_query().items())
    assert "could not be used" in d._url_message(d.url_errors)


@pytest.mark.parametrize("value", ["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e400", "0x1p-3", "1_0",
                                   "٣", "", " ", "0.5.5", "1e", "½"])
def test_non_finite_or_malformed_numbers_in_a_link_are_named_and_the_rest_applies(dash, value):
    """A value that Python's float() or int() accepts but the controls cannot hold (NaN, inf, a
    non-ASCII digit) or that is not a number is refused before anything is set, named in the
    message; the link's other values are used."""
    d = dash.Dashboard(compute_now=False)
    d.apply_url({"alpha": value, "derived_alpha": "false", "depth": value, "seeds": value, "points": value,
                 "tokens": "16"})
    text = " ".join(d.url_errors)
    for name in ("alpha", "depth", "seeds", "points"):
        assert f"{name}=“{value.strip()}” was ignored" in text, text
    c = d.controls
    assert c.tokens == 16 and c.derived_alpha is True and c.alpha_value is None  # no usable α: α₀ stays
    assert "derived_alpha=“false” was ignored" in text, text
    assert np.isfinite(c.alpha)
    assert (c.depth, c.seeds, c.points) == (12, 2, 6)
    assert "nan" not in str(c.to_query()).lower() and "inf" not in str(c.to_query()).lower()


@pytest.mark.parametrize("derived", ["false", "0", "off"])
def test_an_unusable_alpha_keeps_the_derived_alpha0_and_says_so(dash, derived):
    """``alpha=nan&derived_alpha=false``: the α is refused, so turning the derived α₀ off would
    run with whatever α the slider held (the α₀ of other sizes, as a fixed α). The derived α₀
    stays on, the sweep and the OSA check run with it, and the message names both values."""
    d = dash.Dashboard(compute_now=False)
    d.apply_url({"alpha": [b"nan"], "derived_alpha": [derived.encode()], "tokens": [b"16"], "dim": [b"16"]})
    c = d.controls
    assert c.derived_alpha is True and c.alpha_value is None
    assert c.config()["alpha"] is None and c.check_args()[3] is None  # what the sweep and the check run with
    assert c.alpha == pytest.approx(c.derived_alpha0(), rel=1e-4)  # the slider shows the α₀ of N = d = 16
    assert d.url_errors[0].startswith("alpha=“nan” was ignored"), d.url_errors
    assert any(e.startswith(f"derived_alpha=“{derived}” was ignored") and "derived α₀" in e
               for e in d.url_errors), d.url_errors
    assert c.to_query()["derived_alpha"] == "true" and "alpha" not in c.to_query()
    assert "derived α₀" in d._url_message(d.url_errors)  # on the page (as escaped Markdown)


def test_a_usable_alpha_or_no_alpha_leaves_derived_alpha_as_the_link_says(dash):
    d = dash.Dashboard(compute_now=False)
    assert d.controls.apply_query({"alpha": "0.25", "derived_alpha": "false"}) == []
    assert d.controls.alpha_value == 0.25
    e = dash.Dashboard(compute_now=False)
    assert e.controls.apply_query({"derived_alpha": "false"}) == []
    assert e.controls.derived_alpha is False and np.isfinite(e.controls.alpha_value)
    f = dash.Dashboard(compute_now=False)
    assert f.controls.apply_query({"alpha": "nan"})[0].startswith("alpha=“nan” was ignored")
    assert f.controls.derived_alpha is True  # nothing asked to turn α₀ off


def test_a_link_value_the_controls_refuse_is_named_and_the_page_still_builds(dash, monkeypatch):
    """Should a parsed value still be refused when set, the page builds and the message names it."""
    d = dash.Dashboard(compute_now=False)
    original = d.controls._parse

    def lenient(key, text):
        return float("nan") if key == "alpha" else original(key, text)

    monkeypatch.setattr(d.controls, "_parse", lenient)
    d.apply_url({"alpha": "0.3", "depth": "5"})
    assert d.controls.depth == 5
    assert any(e.startswith("alpha=“nan” was ignored") for e in d.url_errors), d.url_errors
    assert d.controls.derived_alpha is True and d.controls.alpha_value is None  # the refused α is not used
    assert any(e.startswith("derived_alpha=“false” was ignored") for e in d.url_errors), d.url_errors
    monkeypatch.setattr(d.controls, "apply_query", lambda q: 1 / 0)
    d.apply_url({"depth": "6"})
    assert d.url_errors and "could not be applied" in d.url_errors[0]
    pn.panel(d)  # the page still builds


def test_a_curve_hidden_under_another_is_named_below_the_figure(app):
    view = app.rank_view
    m = app.state.metrics
    note = view.hidden_note(m, "relative_residual", "block")
    assert note == ""  # pure-ssa collapses, pure-osa does not: both visible
    twin = m[m["preset"] == "pure-osa"].assign(preset="vit")
    note = view.hidden_note(pd.concat([m, twin]), "relative_residual", "block")
    assert "pure\\-osa lies under vit" in note


def test_figures_export_as_svg_and_high_resolution_png_named_by_their_settings(app):
    import xml.etree.ElementTree as ET

    from PIL import Image

    buttons = {b.filename.rsplit(".", 1)[1]: b for b in app.rank_view.__panel__().select(pn.widgets.FileDownload)
               if b.filename.startswith("rank_collapse")}
    svg = buttons["svg"].callback().getvalue()
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg") and b"<path" in svg  # vector paths, not an embedded raster only
    assert buttons["svg"].filename == ("rank_collapse_relative-residual-rank-collapse-after-each-block_depth-3_N-8_d-8_"
                                       "preset-heads_alpha0-derived_2-seeds.svg")
    png = buttons["png"].callback().getvalue()
    assert Image.open(io.BytesIO(png)).info["dpi"][0] > 190
    assert buttons["png"].filename.endswith("_depth-3_N-8_d-8_preset-heads_alpha0-derived_2-seeds.png")
    app.controls.depth = 4
    buttons["png"].callback()
    assert "_depth-4_" in buttons["png"].filename


def test_osa_check_badges_say_pass_or_fail_without_colour_and_explain_a_failure(app):
    check = dict(app.check_view.result)
    page = app.check_view.badges_html(check)
    assert page.count("✓ ") == 4 and "✗" not in page and "within the float32 tolerance 1e-04" in page
    failing = {**check, "dense_vs_lowrank": 1.9e-4, "passed": {**check["passed"], "dense_vs_lowrank": False}}
    page = app.check_view.badges_html(failing)
    assert page.count("✓ ") == 3 and "✗ dense vs low-rank: 1.9e-04" in page
    assert 'data-passed="false"' in page and "outside the float32 tolerance 1e-04" in page
    assert "dense vs low-rank 1.9e-04 &gt; 1e-04" in page and "grows with ‖S‖₂" in page


def test_a_heads_value_a_width_change_makes_invalid_is_reset_with_a_message(dash):
    c = dash.Controls(dim=32, heads=16)
    assert c.adjusted == ""
    c.dim = 24
    assert c.heads == dash.PRESET_HEADS
    assert "reset from 16 to preset default" in c.adjusted and "d = 24" in c.adjusted
    c.dim = 32
    assert c.adjusted == ""


def test_alpha_in_the_url_is_written_without_float_noise(dash):
    d = dash.Dashboard(compute_now=False)
    d.apply_url({"alpha": "0.5997"})
    d.controls.alpha = d.controls.alpha + 0.00001  # the slider's step: 0.5997100000000001
    assert d.controls.to_query()["alpha"] == "0.59971"


#: Links someone else wrote: script in the keys and values (backticks close a code span).
SCRIPT_PAYLOADS = [
    "x` <img src=x onerror=\"document.title='XSS'\"> `",
    "<script>document.title='XSS'</script>",
    "[click](javascript:document.title='XSS')",
    "<a href=\"javascript:document.title='XSS'\">click</a>",
    "``<svg onload=alert(1)>``",
    "*x* _y_ # z\n\n<iframe src=javascript:alert(1)>",
    "&lt;img src=x onerror=alert(1)&gt;",
    "<javascript:alert(1)>",
    "![x](x\" onerror=\"alert(1))",
]


def _rendered_html(markdown: str) -> str:
    """The HTML that Panel's Markdown pane (the dashboard's alerts) sends to the browser."""
    return html.unescape(pn.pane.Alert(markdown)._transform_object(markdown)["object"])


@pytest.mark.parametrize("payload", SCRIPT_PAYLOADS)
def test_link_keys_and_values_reach_the_page_as_text_never_as_markup(dash, payload):
    d = dash.Dashboard(compute_now=False)
    d.apply_url({payload: "1", "metric": payload, "presets": f"vit,{payload}", "depth": payload})
    assert len(d.url_errors) == 4
    page = _rendered_html(d._url_message(d.url_errors))
    body = page.split("</p>", 1)[1]  # after the message's bold heading
    assert "<strong>" in page  # the heading is Markdown; what follows carries no tag but the list's
    assert set(re.findall(r"<\s*/?\s*([a-zA-Z]+)", body)) <= {"ul", "li"}, body  # no <a>, <img>, <script>
    assert not re.search(r"\son[a-z]+\s*=|href|src\s*=", re.sub(r"&[a-z]+;|“[^”]*”", "", body)), body
    shown = html.unescape(re.sub(r"<[^>]+>", "", body))
    first_line = payload.splitlines()[0]
    assert first_line[:40] in shown, (first_line, shown)  # the text is shown as typed


@pytest.mark.parametrize("payload", SCRIPT_PAYLOADS)
def test_error_messages_reach_the_page_as_text(payload):
    pane = figure_view.message_pane(pn.widgets.TextInput(value=f"failed for {payload}").param.value)
    page = _rendered_html(pane.object)
    assert set(re.findall(r"<\s*/?\s*([a-zA-Z]+)", page)) <= {"p"}, page


def test_downloads_return_tidy_csv_and_the_png_on_screen(app):
    csv = app.rank_view._csv().getvalue().decode()
    header = csv.splitlines()[0].split(",")
    assert header == ["preset", "depth", "tokens", "dim", "heads", "alpha", "seed", "layer", "site", "metric", "value"]
    df = pd.read_csv(app.rank_view._csv())
    assert len(df) == len(app.state.metrics)
    spectra = pd.read_csv(app.rank_view._spectra_csv())
    assert {"index", "sigma", "sigma_normalized"} <= set(spectra.columns)
    buttons = [w for w in app.rank_view.__panel__().select(pn.widgets.FileDownload)]
    png = [b for b in buttons if b.filename.endswith(".png")][0]
    data = png.callback().getvalue()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert _png_title(data) == _title(_pane_data(app.rank_view, "metric"))


def _png_title(data: bytes) -> str:
    from PIL import Image

    return Image.open(io.BytesIO(data)).text.get("Title", "")


def test_sessions_are_independent(dash):
    a, b = dash.build_app(**SMALL), dash.build_app(**SMALL)
    pn.panel(a), pn.panel(b)
    a.controls.depth = 4
    assert a.state.metrics["layer"].max() == 4
    assert b.state.metrics["layer"].max() == 3
    assert a.controls is not b.controls and a.state is not b.state


def _fake_unit(calls):
    def fake(unit):
        calls.append(unit)
        kappa = 2.0 ** unit.layers[-1] if unit.preset == "pure-ssa" else 1.0
        profile = pd.DataFrame(dict(preset=unit.preset, depth=unit.depth, tokens=unit.tokens, dim=unit.dim, heads=1,
                                    alpha=np.nan, seed=unit.seed, layer=list(unit.layers), scope="end_to_end",
                                    algorithm=unit.algorithm, sigma_max=1.0, sigma_min=0.5,
                                    kappa=[2.0**x if unit.preset == "pure-ssa" else 1.0 for x in unit.layers]))
        svals = (pd.DataFrame(dict(preset=unit.preset, algorithm="exact", sigma=[1.0, 0.5, kappa and 0.1]))
                 if unit.algorithm == "exact" else None)
        return profile, svals

    return fake


def test_jacobian_view_computes_only_when_open_and_modes_share_results(app, dash, monkeypatch):
    calls = []
    monkeypatch.setattr(jacobian_view, "compute_unit", _fake_unit(calls))
    app.controls.depth = 2
    assert calls == []  # tab closed: nothing computed
    app.controls.view = "jacobian"
    assert len(calls) == 2 and {u.algorithm for u in calls} == {"exact"} and calls[0].depth == 2
    assert app.jacobian_view.algorithms_used() == "exact"
    assert "exact" in app.jacobian_view.badge(app.jacobian_view.profile)
    kappa = _pane_data(app.jacobian_view, "kappa")
    assert "[exact]" in _title(kappa) and "depth 2" in _title(kappa)
    assert app.jacobian_view.tables["kappa"].set_index(["preset", "layer"]).loc[("pure-ssa", 2), "mean"] == 4.0
    app.controls.jacobian = "exact"  # auto resolved to exact: the same results, nothing recomputed
    assert len(calls) == 2


def test_jacobian_badge_never_claims_earlier_figures_are_current(app, dash, monkeypatch):
    """Settings whose Jacobians wait for *Compute* leave the earlier figures on screen: the line
    above them says they are of earlier settings, and which, until the new ones are shown."""
    monkeypatch.setattr(jacobian_view, "compute_unit", _fake_unit([]))
    app.controls.view = "jacobian"
    view = app.jacobian_view
    assert view.figures_are_current() and "earlier settings" not in view.badge(view.profile)
    monkeypatch.setattr(jacobian_view.jobs, "estimate_seconds", lambda *a, **k: 1e6)  # too long to start alone
    app.controls.depth = 2
    assert "Press **Compute Jacobians**" in view.notice
    line = view.badge(view.profile)
    assert not view.figures_are_current()
    assert line.startswith("*The figures below are of earlier settings* (depth 3") and "computed there" in line
    view.request(force=True)  # Compute pressed: the new figures, and the line says so
    assert view.figures_are_current() and "earlier settings" not in view.badge(view.profile)


def test_histogram_download_follows_a_mode_switch(app, dash, monkeypatch):
    """After exact → matrix-free the PNG is the figure on screen, not the old one."""
    monkeypatch.setattr(jacobian_view, "compute_unit", _fake_unit([]))
    app.controls.view = "jacobian"
    exact_png = app.jacobian_view.png("histogram")
    assert "[exact]" in _png_title(exact_png)
    app.controls.jacobian = "matrix-free"
    assert "Compute Jacobians" in app.jacobian_view.notice  # matrix-free is slow: it waits, figures unchanged
    assert app.jacobian_view.png("histogram") == exact_png
    app.jacobian_view.param.trigger("compute")
    shown = _pane_data(app.jacobian_view, "histogram")
    assert "No histogram" in _title(shown)  # a message, not a figure: nothing to download
    assert "histogram" not in app.jacobian_view.exportable
    with pytest.raises(ConfigurationError, match="no figure to export"):
        app.jacobian_view.png("histogram")
    kappa_png = app.jacobian_view.png("kappa")
    assert "matrix-free" in _png_title(kappa_png)
    assert _png_title(kappa_png) == _title(_pane_data(app.jacobian_view, "kappa"))


def _downloads(view) -> dict[str, pn.widgets.FileDownload]:
    """The PNG and SVG buttons of a view, by file name."""
    return {b.filename: b for b in pn.panel(view).select(pn.widgets.FileDownload)}


def test_figure_downloads_are_disabled_while_a_pane_shows_a_message(dash, monkeypatch):
    """While the Jacobian tab shows a placeholder message (nothing computed, waiting for
    Compute), its PNG and SVG buttons are disabled and say why, and an export refuses with
    a message; once a figure is drawn they are enabled and export it."""
    calls = []
    monkeypatch.setattr(jacobian_view, "compute_unit", _fake_unit(calls))
    monkeypatch.setattr(jacobian_view.JacobianView, "preview_units", lambda self, units: None)  # no preview
    a = dash.build_app(**{**SMALL, "tokens": 64, "dim": 64})
    pn.panel(a)
    a.controls.view = "jacobian"
    view = a.jacobian_view
    assert "Compute Jacobians" in view.notice and not calls
    assert figure_view.is_placeholder(view.figures["kappa"]) and view.exportable == []
    buttons = _downloads(view)
    assert len(buttons) == 4 and all(b.disabled for b in buttons.values())
    assert all("message" in b.description for b in buttons.values())
    for key in ("kappa", "histogram"):
        for fmt in ("png", "svg"):
            with pytest.raises(ConfigurationError, match="no figure to export"):
                view.export(key, fmt)
    view.param.trigger("compute")  # matrix-free at this size: κ drawn, the histogram a message
    assert calls and view.exportable == ["kappa"]
    assert {name: b.disabled for name, b in buttons.items()} == {
        "jacobian_kappa.png": False, "jacobian_kappa.svg": False, "jacobian_histogram.png": True,
        "jacobian_histogram.svg": True}
    assert view.png("kappa").startswith(b"\x89PNG")


def test_large_jacobian_shows_an_estimate_and_waits_for_compute(app, dash, monkeypatch):
    calls = []
    monkeypatch.setattr(jacobian_view, "compute_unit", _fake_unit(calls))
    app.controls.tokens, app.controls.dim = 64, 64
    app.controls.view = "jacobian"
    notice = app.jacobian_view.notice
    assert "Compute Jacobians" in notice and "estimated ≈" in notice
    # meanwhile a preview at smaller sizes, estimated within the automatic budget, is drawn
    assert calls and all(u.tokens < 64 or u.dim < 64 for u in calls), calls
    p = calls[0]
    assert f"preview at N = {p.tokens}, d = {p.dim}" in notice
    assert jacobian_view.jobs.estimate_seconds(len(calls), p.algorithm, p.tokens, p.dim, p.depth,
                                            len(p.layers)) <= jacobian_view.AUTO_JACOBIAN_SECONDS
    assert "PREVIEW at smaller N, d" in _title(_pane_data(app.jacobian_view, "kappa"))
    assert f"N {p.tokens} · d {p.dim}" in _title(_pane_data(app.jacobian_view, "kappa"))
    calls.clear()
    app.jacobian_view.param.trigger("compute")
    assert len(calls) == 2 and calls[0].tokens == 64 and app.jacobian_view.notice == ""
    assert calls[0].algorithm == "matrix-free" and calls[0].layers == (1, 2, 3)
    assert "PREVIEW" not in _title(_pane_data(app.jacobian_view, "kappa"))


def test_default_jacobian_view_draws_a_preview_figure(dash, monkeypatch):
    """At the default settings (estimated minutes) the Jacobian tab draws a figure at once, at
    smaller N and d, and says so, instead of an empty placeholder."""
    calls = []
    monkeypatch.setattr(jacobian_view, "compute_unit", _fake_unit(calls))
    d = dash.Dashboard(compute_now=False)
    pn.panel(d)
    d.controls.view = "jacobian"
    view = d.jacobian_view
    pn.panel(view)
    view.request()
    assert calls and view.profile is not None
    assert "preview at N" in view.notice and "PREVIEW" in _title(_pane_data(view, "kappa"))


def test_jacobian_layers_are_spread_and_end_at_depth(dash):
    assert dash.jacobian_layers(12, 4) == [3, 6, 9, 12]
    assert dash.jacobian_layers(3, 6) == [1, 2, 3]
    assert dash.jacobian_layers(1, 1) == [1]


def test_real_jacobian_tiny(app):
    """The real osa_lab.studies.jacobian at a tiny size: exact algorithm, κ per layer, full spectrum."""
    app.controls.param.update(depth=2, tokens=4, dim=4, seeds=1, points=2)
    app.controls.view = "jacobian"
    view = app.jacobian_view
    assert view.job.error == "", view.job.error
    assert view.algorithms_used() == "exact"
    assert set(view.profile["layer"]) == {1, 2}
    osa = view.tables["kappa"].set_index(["preset", "layer"])
    assert osa.loc[("pure-osa", 1), "mean"] < 2.0  # OSA init keeps the Jacobian well-conditioned
    assert view.svals.groupby("preset").size().tolist() == [16, 16]  # all N·d singular values
    assert type(_pane_data(view, "histogram")).__name__ == "Overlay"


def test_jacobian_too_big_is_a_message(app, dash, monkeypatch):
    from osa_lab.errors import ConfigurationError

    def too_big(unit):
        raise ConfigurationError("the exact Jacobian would be 4096×4096 (134 MB); use algorithm='matrix-free'")

    monkeypatch.setattr(jacobian_view, "compute_unit", too_big)
    app.controls.jacobian = "exact"
    app.controls.view = "jacobian"
    assert "matrix-free" in app.jacobian_view.job.error
    assert app.jacobian_view.profile is None
    from osa_lab.plots import depth as plots

    titles = [plots.figure_title(_pane_data(app.jacobian_view, k)) for k in ("kappa", "histogram")]
    assert all("failed" in t and "Computing" not in t for t in titles), titles  # not a stale "Computing…"


def test_jacobian_worker_process_can_be_cancelled():
    """The served path: a worker process computing a long Jacobian stops at once when cancelled."""
    import time

    from osa_lab.dashboard import jobs

    unit = jobs.Unit("pure-osa", 12, 32, 32, None, None, 0, "matrix-free", tuple(range(1, 13)))
    job = jobs.start_jacobian_job([unit])
    time.sleep(1.0)
    assert job.process.is_alive() and job.poll() == []
    start = time.perf_counter()
    job.cancel()
    assert time.perf_counter() - start < 3 and not job.process.is_alive() and job.finished


def test_template_is_bootstrap(app, dash):
    tmpl = app.template()
    assert isinstance(tmpl, pn.template.BootstrapTemplate)
    assert tmpl.header_background == dash.ACCENT


def _patched_library_attributes(source: str) -> list[str]:
    """``module.name = …`` (or ``setattr(module, …)``) where ``module`` was imported from Panel,
    Bokeh, HoloViews or Tornado: a patch of a library's internals."""
    import ast

    tree = ast.parse(source)
    libraries = ("panel", "bokeh", "holoviews", "tornado", "param")
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {(a.asname or a.name.split(".")[0]) for a in node.names if a.name.split(".")[0] in libraries}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in libraries:
            modules |= {a.asname or a.name for a in node.names}
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        found += [ast.unparse(t) for t in targets
                  if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in modules]  # fmt: skip
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and node.args:
            if isinstance(node.args[0], ast.Name) and node.args[0].id in modules:
                found.append(ast.unparse(node))
    return found


def test_the_dashboard_patches_no_library_internal():
    import pathlib

    import osa_lab.dashboard as package

    sources = sorted(pathlib.Path(package.__file__).parent.glob("*.py"))
    assert len(sources) > 5
    found = {p.name: hits for p in sources if (hits := _patched_library_attributes(p.read_text()))}
    assert found == {}, "the dashboard must use Panel's and Bokeh's public APIs, not patch them"
    # the check finds the patterns it is meant to refuse
    assert _patched_library_attributes("import panel.io.server as server\nserver.bundle_resources = f\n")
    assert _patched_library_attributes("from bokeh.server.views import doc_handler as h\nsetattr(h, 'get', f)\n")
    assert _patched_library_attributes("import panel as pn\npn.state.x += 1\n") == []  # pn.state.x: not a module attribute


def test_dashboard_package_imports_no_private_names_and_has_no_cycles():
    """The dashboard's modules import only public names of osa_lab, and their imports
    of each other point one way (state ← sweep ← figure_view ← one view per tab ← app; jobs
    below all)."""
    import ast

    pkg = ROOT / "osa_lab" / "dashboard"
    edges: dict[str, set[str]] = {}
    for path in sorted(pkg.glob("*.py")):
        name = f"osa_lab.dashboard.{path.stem}" if path.stem != "__init__" else "osa_lab.dashboard"
        edges[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("osa_lab"):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                assert not private, f"{path.name} imports private {private} from {node.module}"
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            edges[name] |= {t for t in targets if t.startswith("osa_lab.dashboard.")}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in edges.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    cycles = [m for m in edges if reaches(m, m, {m})]
    assert cycles == [], f"import cycles through {cycles}"


def test_a_depth_change_is_a_data_update_of_the_figure_drawn(app):
    """Speed: a change that only alters data (depth, sizes, seeds) updates the Bokeh
    models already drawn through the pane's DynamicMap instead of rebuilding them; a change of
    what is drawn (presets, metric, y scale) draws a new figure. Either way the data on screen
    follow the controls."""
    from bokeh.document import Document
    from bokeh.models import ColumnDataSource

    view = app.rank_view
    root = view.panes["metric"].get_root(Document())

    def layers_drawn() -> set[int]:
        return {int(max(m.data["layer"])) for m in root.select({"type": ColumnDataSource}) if "layer" in m.data}

    dmap = view.panes["metric"].object
    assert isinstance(dmap, hv.DynamicMap) and layers_drawn() == {3}
    app.controls.depth = 2
    assert view.panes["metric"].object is dmap and layers_drawn() == {2}
    assert _layers(_pane_data(view, "metric")) == [0, 1, 2]
    ylim = _pane_data(view, "metric").opts.get("plot", "bokeh").kwargs["ylim"]  # the new data's limits
    from bokeh.models import Range1d

    starts = {(r.start, r.end) for r in root.select({"type": Range1d})}
    assert any(abs(s - ylim[0]) <= 1e-12 * abs(ylim[0]) + 1e-300 and abs(e - ylim[1]) <= 1e-12 * abs(ylim[1])
               for s, e in starts), (starts, ylim)
    app.controls.scale = "linear"  # other options (auto was log here): a new figure
    assert view.panes["metric"].object is not dmap
    app.controls.depth = 3
    assert _layers(_pane_data(view, "metric")) == [0, 1, 2, 3]


def test_cached_settings_are_applied_at_once_even_when_served(dash, monkeypatch):
    """A session whose settings another session (or the pre-warm) computed gets its sweep, OSA
    check and figures synchronously (the first document carries the figure, no
    placeholder and no second round trip); nothing is recomputed."""
    first = dash.build_app(**SMALL)  # computes (synchronously outside a server) and fills the caches
    pn.panel(first)
    assert first.state.metrics is not None and first.check_view.result is not None

    for module in (figure_view, jacobian_view):
        monkeypatch.setattr(module, "is_served", lambda: True)  # as in a server session
    from osa_lab.dashboard import state as dash_state
    from osa_lab.dashboard import sweep as dash_sweep

    for module in (dash_state, dash_sweep):
        monkeypatch.setattr(module, "is_served", lambda: True)

    def no_compute(settings, should_stop=None):
        raise AssertionError("cached settings were recomputed")

    for module in (dash_sweep, dash):  # where a session's sweep and the pre-warm call it
        monkeypatch.setattr(module, "compute_sweep", no_compute)
    second = dash.build_app(compute_now=False, **SMALL)
    pn.panel(second)
    assert second.state.metrics is None  # nothing yet: the served page would show placeholders
    second.show_cached()
    assert second.state.metrics is first.state.metrics and not second.state.busy
    assert second.check_view.result == first.check_view.result and not second.check_view.job.busy
    fig = _pane_data(second.rank_view, "metric")  # the drawn figure (asserted inside), not a placeholder
    assert isinstance(fig, hv.Overlay) and not second.rank_view.job.busy
    assert "Computing" not in figure_title(fig)


def test_show_cached_leaves_uncached_settings_to_the_page_load(dash):
    """Settings nobody computed are not computed at session creation (the page's load does it)."""
    a = dash.build_app(compute_now=False, depth=5, tokens=4, dim=8, seeds=1)
    pn.panel(a)
    a.show_cached()
    assert a.state.metrics is None and a.check_view.result is None


def test_status_line_says_when_the_sweep_came_from_the_cache(app):
    from osa_lab.dashboard.caches import SWEEPS

    depth = app.controls.depth
    SWEEPS.clear()
    app.controls.depth = depth + 1  # computed (synchronously outside a server)
    assert not app.state.from_cache
    status = app._status(False, app.state.seconds, app.state.config, app.state.from_cache)
    assert status.startswith("last sweep: ") and status.split(": ")[1].split(" s ")[0].replace(".", "").isdigit()
    app.controls.depth = depth
    app.controls.depth = depth + 1  # back to settings just computed: taken from the cache
    assert app.state.from_cache
    status = app._status(False, app.state.seconds, app.state.config, app.state.from_cache)
    assert status.startswith("last sweep: from the cache · 2 presets × 2 seeds"), status


def test_the_dashboard_patches_no_server_internals():
    """The dashboard serves through Panel's and Bokeh's public hooks only: no module of the
    package replaces a method of a Panel, Bokeh or Tornado class (e.g. a page handler's
    ``get_session`` or the server's ``start``) or sets a private attribute of an object it
    does not own (e.g. a session's ``_token``)."""
    import ast

    foreign = ("panel", "bokeh", "tornado")
    for path in sorted((ROOT / "osa_lab" / "dashboard").glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and (node.module or "").split(".")[0] in foreign for alias in node.names}
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if not isinstance(target, ast.Attribute):
                    continue
                where = f"{path.name}:{node.lineno}"
                assert not (isinstance(target.value, ast.Name) and target.value.id in imported), \
                    f"{where} replaces {target.value.id}.{target.attr}"
                owned = target.attr.startswith("_osa_lab") or (isinstance(target.value, ast.Name)
                                                                and target.value.id == "self")
                assert owned or not target.attr.startswith("_"), f"{where} sets a private attribute {target.attr}"


def test_cli_dry_run_prints_the_panel_serve_command(capsys):
    from osa_lab.cli import main

    assert main(["dashboard", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert " -m panel serve " in out and "--warm" in out and "=" not in out.split()[0]


def test_an_options_cleanup_race_in_holoviews_is_tried_again(monkeypatch):
    """HoloViews raises a RuntimeError when two threads clean up one options tree at once; preparing a
    figure applies its options again instead of failing the computation. Other errors pass through."""
    import holoviews as hv

    from osa_lab.plots.style import with_options

    calls = {"n": 0}
    real = hv.core.accessors.Opts.__call__

    def racing(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("Cleanup of custom options tree with id '7' failed with the following exception: "
                               "list.remove(x): x not in list")  # fmt: skip
        return real(self, *args, **kwargs)

    monkeypatch.setattr(hv.core.accessors.Opts, "__call__", racing)
    curve = hv.Curve([(0, 1), (1, 2)])
    shown = with_options(curve, framewise=True)
    assert calls["n"] == 2 and shown is not curve
    monkeypatch.setattr(hv.core.accessors.Opts, "__call__", lambda self, *a, **k: (_ for _ in ()).throw(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="other"):
        with_options(curve, framewise=True)


def test_sweep_points_assemble_to_the_tables_of_the_whole_sweep():
    """A long sweep runs model by model in a worker: its units, assembled, are the rows that
    compute_sweep gives for the same settings, in the same order."""
    from osa_lab.dashboard import caches, jobs, sweep

    settings = sweep.SweepSettings(("pure-ssa", "pure-osa", "vit"), depth=3, tokens=8, dim=8, heads=None, alpha=None,
                                   seeds=2)
    units = settings.points()
    assert [(u.preset, u.seed) for u in units] == [(p, s) for p in settings.presets for s in range(2)]
    results = {u: jobs.compute_sweep_unit(u) for u in units}
    metrics, spectra = sweep.assemble_sweep(units, results)
    caches.SWEEPS.clear()
    whole_metrics, whole_spectra = sweep.compute_sweep(settings)
    pd.testing.assert_frame_equal(metrics, whole_metrics)
    pd.testing.assert_frame_equal(spectra, whole_spectra)


def test_sweep_settings_are_one_cache_key_per_sweep(monkeypatch):
    """Equal settings, however written (a list or a tuple of presets, NumPy or Python numbers),
    are one frozen, hashable key and share one SWEEPS entry; settings that differ in any field
    have their own entry and their own tables."""
    from osa_lab.dashboard import caches, sweep
    from osa_lab.studies import depth

    base = dict(presets=("pure-ssa", "pure-osa"), depth=2, tokens=8, dim=8, heads=None, alpha=None, seeds=1)
    a = sweep.SweepSettings(**base)
    same = sweep.SweepSettings(**{**base, "presets": ["pure-ssa", "pure-osa"], "depth": np.int64(2),
                                  "tokens": np.int32(8)})
    assert a == same and hash(a) == hash(same) and repr(a) == repr(same)
    assert a == sweep.SweepSettings.of({**base, "view": "rank"})  # from Controls.config()
    with pytest.raises(AttributeError):
        a.depth = 3  # frozen
    others = [sweep.SweepSettings(**{**base, name: value}) for name, value in (
        ("presets", ("pure-ssa", "vit")), ("depth", 3), ("tokens", 16), ("dim", 16), ("heads", 2), ("alpha", 0.3),
        ("seeds", 2))]
    assert len({a, *others}) == 1 + len(others)

    calls = []
    real_sweep = depth.sweep
    monkeypatch.setattr(depth, "sweep", lambda *args, **kw: calls.append(kw) or real_sweep(*args, **kw))
    caches.SWEEPS.clear()
    first = sweep.compute_sweep(a)
    again = sweep.compute_sweep(same)
    assert len(calls) == 1 and again[0] is first[0] and again[1] is first[1]  # the equal settings' entry
    assert caches.SWEEPS.get(same)[0] is first[0]
    deeper = sweep.compute_sweep(others[1])  # depth 3: its own entry and its own tables
    assert len(calls) == 2 and calls[1]["depths"] == [3]
    assert deeper[0]["layer"].max() == 3 and first[0]["layer"].max() == 2
    assert caches.SWEEPS.get(a)[0] is first[0]  # the depth-3 tables did not replace them
    assert caches.SWEEPS.get(others[2]) is None  # nothing computed for N = 16


def test_spectra_panels_repaint_their_canvas_edge(app):
    """Every spectra panel (heatmap and lines) carries a border line in the background colour,
    2 px wide with mitred corners, that repaints the outermost canvas column and row
    (:data:`osa_lab.plots.style.CLEAN_EDGE_OPTIONS`, set by the shared plot builders; the browser test reads the pixels)."""
    from bokeh.models import Plot

    from osa_lab.plots.style import CANVAS_BACKGROUND

    app.controls.view = "spectra"
    for key in ("heatmaps", "lines"):
        fig = app.spectra_view.figures[key]
        plots_ = list(hv.renderer("bokeh").get_plot(fig).state.select({"type": Plot}))
        assert len(plots_) == len(app.controls.presets), key
        for p in plots_:
            assert (p.border_line_color, p.border_line_width, p.border_line_join) == (CANVAS_BACKGROUND, 2, "miter")
            assert p.border_fill_color == CANVAS_BACKGROUND  # the line is invisible on the figure's margin


def test_sweep_estimate_separates_the_default_view_from_the_largest_link():
    """The largest sizes a link reaches (7 presets × 5 seeds, depth 48, N 256, d 128) are
    estimated beyond the worker threshold (a measured 118 s), the default view far below it."""
    from osa_lab.dashboard import jobs, sweep

    largest = jobs.estimate_sweep_seconds(7 * 5, 256, 128, 48)
    default = jobs.estimate_sweep_seconds(2 * 2, 32, 32, 12)
    assert largest > 10 * sweep.WORKER_SWEEP_SECONDS
    assert default < sweep.WORKER_SWEEP_SECONDS / 5


def test_a_long_sweep_runs_in_a_worker_with_estimate_progress_and_cancel(dash, monkeypatch):
    """Served, a sweep over the worker threshold starts a worker process: the notice gives the
    estimate, then progress; Cancel sweep terminates the worker, keeps the last tables and says
    so; a later setting computes as usual."""
    import time

    from osa_lab.dashboard import caches, sweep

    followed = []
    monkeypatch.setattr(sweep, "is_served", lambda: True)
    monkeypatch.setattr(sweep, "follow_job", lambda job, *callbacks: followed.append((job, callbacks)))
    a = dash.build_app(**SMALL)
    pn.panel(a)
    shown = a.state.config
    assert a.state.metrics is not None and not a.state.running
    caches.SWEEPS.clear()
    a.controls.param.update(tokens=256, dim=128, depth=48, seeds=5)
    try:
        assert a.state.running and a.state.busy and len(followed) == 1
        job, (on_unit, on_progress, on_error, on_end) = followed[0]
        assert job.process.is_alive() and len(job.units) == 2 * 5
        assert "estimated" in a.state.notice and "Cancel sweep" in a.state.notice
        on_progress(0, 3.0)
        assert "0/10 done, 3 s elapsed" in a.state.notice
        a.state.param.trigger("cancel")
        deadline = time.time() + 5
        while job.process.is_alive() and time.time() < deadline:
            time.sleep(0.05)
        assert not job.process.is_alive() and job.cancelled
        assert not a.state.running and not a.state.busy
        assert a.state.notice.startswith("Cancelled the sweep at depth 48 · N 256 · d 128")
        assert a.state.config == shown and a.state.metrics is not None  # the last tables stay
        on_end(1.0)  # the follower's last call after a cancel changes nothing
        assert a.state.config == shown
    finally:
        a.stop()
    a.controls.param.update(tokens=8, dim=8, depth=2, seeds=1)  # small: computed at once, no worker
    assert len(followed) == 1 and a.state.config["depth"] == 2 and a.state.notice == ""


def test_jacobians_and_long_sweeps_share_one_worker_path():
    """One mechanism: both start their worker through jobs.start_job and follow it with
    state.follow_job; the views keep no follower loop of their own."""
    import inspect

    from osa_lab.dashboard import app, figure_view, jobs, rank_view, spectra_view, sweep

    assert "start_job(" in inspect.getsource(jobs.start_jacobian_job)
    assert "start_job(" in inspect.getsource(jobs.start_sweep_job)
    assert "follow_job(" in inspect.getsource(jacobian_view.JacobianView._start)
    assert "follow_job(" in inspect.getsource(sweep.SweepState._start_worker)
    for module in (figure_view, rank_view, spectra_view, jacobian_view, app):
        assert "asyncio.sleep" not in inspect.getsource(module)


def test_preset_chips_and_legend_share_one_order(dash):
    """However presets are picked or written in a link, the chips of the presets widget, the
    legend of the figure and the URL list them in one order (that of osa_lab.nn.presets)."""
    from osa_lab.dashboard.state import preset_names

    a = dash.build_app(**SMALL)
    pn.panel(a)
    a.controls.presets = ["pure-osa", "vit", "pure-ssa"]  # picked in this order
    canonical = [p for p in preset_names() if p in ("pure-osa", "vit", "pure-ssa")]
    assert canonical != ["pure-osa", "vit", "pure-ssa"]
    chips = pn.widgets.MultiChoice.from_param(a.controls.param.presets)
    assert list(chips.value) == canonical == list(a.controls.presets)
    legend = list(dict.fromkeys(el.label for el in _pane_data(a.rank_view, "metric") if isinstance(el, hv.Curve)))
    assert legend == canonical
    assert a.controls.to_query()["presets"] == ",".join(canonical)
    b = dash.build_app(compute_now=False)
    b.apply_url({"presets": "pure-ssa,vit"})
    assert list(b.controls.presets) == [p for p in preset_names() if p in ("pure-ssa", "vit")]


def test_process_wide_caches_are_kept_by_panel():
    """The sweeps, checks, figures and Jacobians shared by all sessions live in Panel's memo
    store (pn.cache, least recently used evicted first), not in a cache of the package's own:
    Panel's clear_caches empties them."""
    from osa_lab.dashboard import caches, state

    assert not hasattr(state, "LRU") and not hasattr(caches, "LRU")
    cache = caches.CHECKS  # pn.cache(max_items=64)
    cache.clear()
    for i in range(65):
        cache.put(("check", i), {"i": i})
        cache.get(("check", 0))  # 0 stays recently used
    assert cache.get(("check", 0)) == {"i": 0} and cache.get(("check", 64)) == {"i": 64}
    assert cache.get(("check", 1)) is None  # the least recently used went
    pn.state.clear_caches()
    assert cache.get(("check", 64)) is None and ("check", 0) not in cache


def test_a_superseded_sweep_stops_before_its_next_model_run(monkeypatch):
    """A session's sweep asks before each model run whether newer settings superseded it; then it stops
    (ComputationCancelledError) instead of computing the rest unseen, and caches nothing for its settings."""
    from osa_lab.dashboard import jobs, sweep
    from osa_lab.dashboard.caches import SWEEPS
    from osa_lab.errors import ComputationCancelledError

    settings = sweep.SweepSettings(presets=("vit", "skipless-osa"), depth=2, tokens=8, dim=8, heads=None,
                                   alpha=None, seeds=3)
    computed = []
    real = jobs.compute_sweep_unit

    def counting(unit):
        computed.append(unit)
        return real(unit)

    monkeypatch.setattr(jobs, "compute_sweep_unit", counting)
    asked = []

    def stop_after_two() -> bool:
        asked.append(len(computed))
        return len(computed) >= 2

    with pytest.raises(ComputationCancelledError, match="after 2 of 6 model runs"):
        sweep.compute_sweep(settings, should_stop=stop_after_two)
    assert len(computed) == 2 and asked == [0, 1, 2]
    assert SWEEPS.get(settings) is None
    # not superseded: the same tables as the whole sweep, the two units already computed reused
    metrics, spectra = sweep.compute_sweep(settings, should_stop=lambda: False)
    assert len(computed) == 6
    from osa_lab.studies.depth import sweep as whole

    reference = whole(["vit", "skipless-osa"], depths=[2], tokens=[8], dims=[8], heads=[None], alphas=[None],
                      seeds=[0, 1, 2], site="both", progress=False)
    pd.testing.assert_frame_equal(metrics, reference.metrics)
    pd.testing.assert_frame_equal(spectra, reference.spectra)


def test_the_session_sweep_is_superseded_by_newer_settings(monkeypatch):
    """SweepState hands compute_sweep a check that turns true once newer settings were requested."""
    from osa_lab.dashboard import sweep
    from osa_lab.dashboard.app import build_app

    app = build_app(compute_now=False, depth=2, tokens=8, dim=8, seeds=1, presets=["vit", "skipless-osa"])
    checks = []

    def recording(settings, should_stop=None):
        checks.append(should_stop)
        return sweep.SWEEPS.get(settings) or (pd.DataFrame(), pd.DataFrame())

    monkeypatch.setattr(sweep, "compute_sweep", recording)
    app.state.refresh()
    assert checks and checks[0] is not None and checks[0]() is False
    app.controls.depth = 3  # newer settings: the first request is superseded
    assert checks[0]() is True and checks[-1]() is False
