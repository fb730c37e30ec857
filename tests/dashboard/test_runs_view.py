"""The Runs view: a study's results folder (run table, curves, tuning) and its runs' layers at
initialisation against after training, from the study's own readers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("panel")

from osa_lab.dashboard.runs_view import (  # noqa: E402
    RunsView,
    curves_figure,
    display_runs,
    grouped_runs,
    layers_figure,
    load_study,
    tuning_figure,
)
from osa_lab.errors import MissingDataError  # noqa: E402
from tests.studies.test_depth_study import TINY_EXPERIMENT  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "docs" / "results" / "mnist1d-depth"


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory):
    """A results folder WITH weights: the tiny two-preset study (about 10 s)."""
    from osa_lab.cli import main as cli_main

    root = tmp_path_factory.mktemp("runs_view")
    exp = root / "tiny.yaml"
    exp.write_text(TINY_EXPERIMENT)
    out = root / "results"
    assert cli_main(["train", "--experiment", str(exp), "--output", str(out), "--checkpoints", str(root / "checkpoints"),
                     "--serial", "--quiet"]) == 0  # fmt: skip
    return out


def test_the_committed_study_opens_with_every_run_and_says_no_weights_were_saved():
    study = load_study(COMMITTED)
    expected = pd.read_csv(COMMITTED / "runs.csv")
    assert len(study.runs) == len(expected) > 0
    assert sorted(zip(study.runs["preset"], study.runs["depth"], study.runs["seed"], strict=True)) == sorted(
        zip(expected["preset"], expected["depth"], expected["seed"], strict=True))
    assert study.weights == {} and study.notices == []
    assert len(study.tuning) == len(pd.read_csv(COMMITTED / "tuning.csv"))
    view = RunsView(COMMITTED)
    assert "No weights were saved" in view.header()
    assert set(view.presets) == set(expected["preset"])
    assert "No weights were saved" in view.layers().object


def test_the_filters_select_runs_and_the_groups_summarise_them():
    view = RunsView(COMMITTED)
    view.presets, view.depths = ["vit"], [8]
    runs = view.selected_runs()
    assert set(runs["preset"]) == {"vit"} and set(runs["depth"]) == {8} and len(runs) >= 2
    grouped = grouped_runs(runs, ["preset", "depth"])
    assert len(grouped) == 1 and grouped["runs"].iloc[0] == len(runs)
    assert grouped["mean (%)"].iloc[0] == pytest.approx(100 * runs["test_accuracy"].mean(), abs=0.05)
    by_seed = grouped_runs(runs, ["seed"])
    assert list(by_seed["runs"]) == [1] * len(runs)
    shown = display_runs(runs)
    assert "test acc. (%)" in shown and "test_accuracy" not in shown
    assert shown["test acc. (%)"].iloc[0] == f"{100 * runs['test_accuracy'].iloc[0]:.1f}"


def test_kappa_beyond_float64_is_shown_as_a_bound_not_a_number():
    runs = pd.DataFrame({"preset": ["vit"], "depth": [4], "lr": [0.01], "alpha_lr_mult": [1.0], "seed": [0],
                         "status": ["ok"], "test_accuracy": [0.5], "val_accuracy": [0.5],
                         "kappa_init": [1.13e210], "kappa_trained": [12.0], "weights": ["—"]})
    shown = display_runs(runs)
    assert shown["κ at init"].iloc[0] == "> 4.5e+15" and shown["κ trained"].iloc[0] == "12"


def test_figures_have_one_panel_per_depth_and_a_line_per_seed():
    study = load_study(COMMITTED)
    curves = study.curves[study.curves["preset"] == "vit"]
    fig = curves_figure(curves)
    depths = sorted(curves["depth"].unique())
    assert [ax.get_title() for ax in fig.axes] == [f"depth {d}" for d in depths]
    first = fig.axes[0]
    seeds = curves[curves["depth"] == depths[0]]["seed"].nunique()
    assert len(first.lines) == seeds + 1  # each seed, then the mean
    tfig = tuning_figure(study.tuning[study.tuning["preset"] == "vit"])
    assert [ax.get_xscale() for ax in tfig.axes] == ["log"] * len(tfig.axes)


def test_a_setting_chosen_by_fewest_failures_is_marked_apart_from_an_optimum():
    tuning = load_study(COMMITTED).tuning
    vit = tuning[(tuning["preset"] == "vit") & (tuning["depth"] == 8)]
    assert set(vit["chosen_by"]) == {"tie rule"}  # the committed search records predate the field: the tie rule

    def chosen_marks(frame):
        fig = tuning_figure(frame)
        circled = [c for c in fig.axes[0].collections if len(c.get_facecolors()) == 0]  # the open markers
        return fig.legends[0].get_title().get_text(), {len(c.get_paths()[0].vertices) for c in circled}

    title, optimum = chosen_marks(vit)
    assert title.startswith("○ chosen;") and "fewest failures" not in title
    title, fallback = chosen_marks(vit.assign(chosen_by="fewest failures"))
    assert title.startswith("○ chosen; □ chosen by fewest failures (no setting trained)")
    assert len(optimum) == len(fallback) == 1 and optimum != fallback  # a square, not a circle


def test_damaged_files_are_named_and_left_out(tmp_path):
    folder = tmp_path / "study"
    shutil.copytree(COMMITTED, folder)
    finals = sorted((folder / "final").glob("*.json"))
    finals[0].write_text('{"preset": "vit", "dep')  # cut off mid-write
    finals[1].write_text("[1, 2]")
    payload = json.loads(finals[2].read_text())
    del payload["seed"]
    finals[2].write_text(json.dumps(payload))
    (folder / "tune" / "broken.json").write_bytes(b"\xff\xfe\x00")
    study = load_study(folder)
    text = "\n".join(study.notices)
    for path in (finals[0], finals[1], finals[2]):
        assert f"final/{path.name}" in text
    assert "tune/broken.json" in text and "lacks seed" in text
    assert len(study.runs) == len(load_study(COMMITTED).runs) - 3
    assert "Some files were left out" in RunsView(folder).notices()


def test_a_folder_without_results_is_a_clear_error(tmp_path):
    with pytest.raises(MissingDataError, match="not a study's results folder"):
        load_study(tmp_path)
    view = RunsView(tmp_path)
    assert view.study is None and "not a study's results folder" in view.header()


def test_the_cli_refuses_a_folder_that_is_not_a_study_in_one_line(tmp_path, capsys):
    from osa_lab.cli import main as cli_main

    assert cli_main(["dashboard", "--results", str(tmp_path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--results" in err and "not a study's results folder" in err


def test_the_cli_passes_the_results_folder_to_the_served_page(monkeypatch, capsys):
    from osa_lab.cli import main as cli_main
    from osa_lab.dashboard.runs_view import RESULTS_ENV

    monkeypatch.delenv(RESULTS_ENV, raising=False)
    assert cli_main(["dashboard", "--results", str(COMMITTED), "--dry-run"]) == 0
    import os

    assert os.environ[RESULTS_ENV] == str(COMMITTED.resolve())
    monkeypatch.delenv(RESULTS_ENV)


def test_the_runs_view_is_chosen_by_the_link_or_the_results_folder(monkeypatch):
    from osa_lab.dashboard.app import wants_runs_view
    from osa_lab.dashboard.runs_view import RESULTS_ENV

    monkeypatch.delenv(RESULTS_ENV, raising=False)
    assert wants_runs_view({"view": [b"runs"]}) and not wants_runs_view({}) and not wants_runs_view({"view": [b"rank"]})
    monkeypatch.setenv(RESULTS_ENV, str(COMMITTED))
    assert wants_runs_view({}) and not wants_runs_view({"view": [b"spectra"]})


def test_init_against_trained_layers_of_runs_with_weights(tiny_results):
    from osa_lab.studies.depth_study.layer_profiles import run_layer_profiles
    from osa_lab.studies.depth_study.weights import run_models

    study = load_study(tiny_results)
    assert len(study.weights) == 4 and set(study.runs["weights"]) == {"saved"}
    view = RunsView(tiny_results)
    assert view.runs_compared and all(k.startswith("vit") for k in view.runs_compared)
    label = view.runs_compared[0]
    profiles = run_layer_profiles(study.weights[label])
    assert set(profiles.metrics["state"]) == {"initialisation", "trained"}
    # the trained profile is the trained model's: recomputed here from its own hidden states
    import torch

    from osa_lab.studies.data import load_data
    from osa_lab.studies.metrics import effective_rank

    models = run_models(study.weights[label], data=load_data("mnist1d"))
    x = load_data("mnist1d").x_test[:32]
    for state, model in (("initialisation", models.initial), ("trained", models.trained)):
        with torch.no_grad():
            _, hidden = model(x, return_hidden=True)
        want = effective_rank(hidden.blocks[-1].to(torch.float64)).mean().item()
        metrics = profiles.metrics
        got = metrics[(metrics["state"] == state) & (metrics["metric"] == "effective_rank")]
        assert got.loc[got["layer"].idxmax(), "value"] == pytest.approx(want, rel=1e-9)
    init = profiles.metrics.query("state == 'initialisation'")["value"].to_numpy()
    trained = profiles.metrics.query("state == 'trained'")["value"].to_numpy()
    assert not np.allclose(init, trained)  # training changed the layers
    column = view.layers()
    figure = column.objects[-1].object
    titles = [ax.get_title() for ax in figure.axes]
    assert titles[:2] == ["at initialisation", "after training"]
    assert len(figure.axes[0].lines) == len(view.runs_compared)


def test_a_baseline_without_blocks_is_named_not_drawn(tiny_results):
    view = RunsView(tiny_results)
    mlp = [k for k in view.param.runs_compared.objects if k.startswith("mlp")][0]
    view.runs_compared = [mlp]
    column = view.layers()
    assert "has no transformer blocks" in column.objects[0].object


def test_layers_figure_puts_initialisation_and_training_side_by_side():
    rows = []
    for state, shift in (("initialisation", 0.0), ("trained", 1.0)):
        for layer in range(3):
            for metric in ("effective_rank", "stable_rank", "condition_number"):
                rows.append({"state": state, "layer": layer, "metric": metric, "value": 2.0 + layer + shift})
    spectra = pd.DataFrame([{"state": s, "layer": 2, "index": i, "sigma_normalized": 0.5**i}
                            for s in ("initialisation", "trained") for i in range(4)])
    fig = layers_figure({"a": pd.DataFrame(rows)}, {"a": spectra})
    left, right = fig.axes[0], fig.axes[1]
    assert list(left.lines[0].get_ydata()) == [2.0, 3.0, 4.0] and list(right.lines[0].get_ydata()) == [3.0, 4.0, 5.0]


def test_the_filters_are_in_the_url_and_an_unusable_item_keeps_the_others():
    view = RunsView(COMMITTED)
    view.param.update(presets=["vit", "skipless-osa"], depths=[4, 16], curve="train_accuracy")
    query = view.to_query()
    assert query["view"] == "runs" and query["presets"] == "vit,skipless-osa" and query["depths"] == "4,16"
    again = RunsView(COMMITTED)
    assert again.apply_url({k: [v.encode()] for k, v in query.items()}) == []  # as Bokeh passes session_args
    assert (again.presets, again.depths, again.curve) == (["vit", "skipless-osa"], [4, 16], "train_accuracy")
    third = RunsView(COMMITTED)
    errors = third.apply_url({"presets": "vit,nope", "depths": "4,99", "curve": "<b>x</b>"})
    assert third.presets == ["vit"] and third.depths == [4] and third.curve == "train_loss"
    assert len(errors) == 3 and "nope" in errors[0] and "99" in errors[1]
    assert "could not be used" in third.notices() and "<b>" not in third.notices()  # shown as text


def test_the_address_bar_keeps_the_filters_shown_even_when_the_browsers_address_arrives_late():
    """The link's own address (with its unusable preset) reaching the server after the view wrote its
    filters is written over again; a filter change moves the address with it."""
    from panel.io.location import Location

    view = RunsView(COMMITTED)
    view.apply_url({"presets": "vit,nope", "depths": "4"})
    location = Location()
    view.link_url(location)
    first = location.search
    assert "presets=vit&depths=4&" in first and "nope" not in first
    location.search = "?view=runs&presets=vit,nope&depths=4"  # the browser's, arriving late
    assert location.search == first
    view.depths = [16]
    assert "depths=16" in location.search and location.search != first
