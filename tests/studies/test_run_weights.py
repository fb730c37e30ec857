"""A study's final runs keep their trained weights (tensor-only) and rebuild into models that reproduce them."""

from __future__ import annotations

import io
import json
import pickle

import pytest
import torch

from osa_lab.errors import MalformedResultError
from osa_lab.studies.depth_study.weights import load_weights, run_models, save_weights, weights_path
from tests.studies.test_depth_study import TINY_EXPERIMENT


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory):
    from osa_lab.cli import main as cli_main

    root = tmp_path_factory.mktemp("weights")
    exp = root / "tiny.yaml"
    exp.write_text(TINY_EXPERIMENT)
    out = root / "results"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # the study's checkpoints go under ./runs: none shared with another test
        assert cli_main(["train", "--experiment", str(exp), "--output", str(out), "--serial", "--quiet"]) == 0
    return out


def test_every_final_run_saves_weights_that_reproduce_its_test_accuracy(tiny_results):
    from osa_lab.studies.data import load_data
    from osa_lab.studies.training.loop import evaluate

    finals = sorted((tiny_results / "final").glob("*.json"))
    assert len(finals) == 4
    data = load_data("mnist1d")
    for result in finals:
        payload = json.loads(result.read_text())
        assert payload["weights"] == weights_path(result).name and weights_path(result).exists()
        models = run_models(result, data=data)
        assert models.trained is not None
        _, accuracy = evaluate(models.trained, data.x_test, data.y_test)
        assert accuracy == payload["test_accuracy"]
        # the rebuilt initial model is the run's initialisation, not its trained state
        before = dict(models.initial.named_parameters())
        assert any(not torch.equal(p, before[n]) for n, p in models.trained.named_parameters())


def test_tuning_runs_keep_no_weights(tiny_results):
    assert list((tiny_results / "tune").glob("*.weights.pt")) == []


def test_a_weights_file_that_would_run_code_is_refused(tmp_path, capsys):
    class Payload:
        def __reduce__(self):
            return (print, ("this must never run",))

    path = tmp_path / "run.weights.pt"
    path.write_bytes(pickle.dumps({"w": Payload()}, protocol=2))
    with pytest.raises(MalformedResultError, match="not a tensor-only weights file"):
        load_weights(path)
    assert "this must never run" not in capsys.readouterr().out


def test_a_weights_file_of_other_objects_is_refused(tmp_path):
    path = tmp_path / "run.weights.pt"
    buffer = io.BytesIO()
    torch.save({"w": [1, 2, 3]}, buffer)
    path.write_bytes(buffer.getvalue())
    with pytest.raises(MalformedResultError, match="mapping of parameter names to tensors"):
        load_weights(path)


def test_a_result_without_its_configuration_says_it_cannot_be_rebuilt(tmp_path):
    result = tmp_path / "vit-d4-lr0.01-am1-s0.json"
    result.write_text(json.dumps({"preset": "vit", "depth": 4}))
    with pytest.raises(MalformedResultError, match="no `train_config`"):
        run_models(result)


def test_weights_that_do_not_fit_the_model_are_named(tiny_results, tmp_path):
    result = sorted((tiny_results / "final").glob("vit-*.json"))[0]
    copy = tmp_path / result.name
    copy.write_text(result.read_text())
    save_weights(torch.nn.Linear(2, 2), copy)
    with pytest.raises(MalformedResultError, match="do not fit the model"):
        run_models(copy)


def test_weights_path_needs_a_json_result():
    assert weights_path("a/vit-d4-lr0.01-am1-s0.json").name == "vit-d4-lr0.01-am1-s0.weights.pt"
    with pytest.raises(MalformedResultError, match=r"\.json"):
        weights_path("a/run.csv")


def test_per_layer_kappa_is_added_from_the_rebuilt_models_and_checked_against_the_medians(tiny_results, tmp_path):
    """A run recorded before runs kept κ per layer gets it from its rebuilt models, the same values the
    study itself records; a run whose rebuilt models do not reproduce its medians is refused unchanged."""
    import shutil

    from osa_lab.studies.depth_study import load_spec
    from osa_lab.studies.depth_study.layer_kappas import add_layer_kappas
    from tests.studies.test_depth_study import TINY_EXPERIMENT

    exp = tmp_path / "tiny.yaml"
    exp.write_text(TINY_EXPERIMENT)
    spec = load_spec(exp, "full")
    results = tmp_path / "results"
    shutil.copytree(tiny_results, results)
    vit = sorted(results.glob("final/vit-*.json"))[0]
    payload = json.loads(vit.read_text())
    recorded = {when: payload.pop(f"sub_block_kappa_layers_{when}") for when in ("init", "trained")}
    assert set(recorded["init"]) == {"embedding", "attention", "mlp", "readout"}
    vit.write_text(json.dumps(payload, indent=1))
    assert add_layer_kappas(results, spec) == [vit]  # every other run has them already
    restored = json.loads(vit.read_text())
    for when in ("init", "trained"):
        for part, values in recorded[when].items():
            assert restored[f"sub_block_kappa_layers_{when}"][part] == pytest.approx(values, rel=1e-9)
    assert add_layer_kappas(results, spec) == []
    payload["sub_block_kappa_init"]["mlp"] *= 2  # a median the rebuilt model does not give
    vit.write_text(json.dumps(payload, indent=1))
    before = vit.read_text()
    with pytest.raises(MalformedResultError, match="do not reproduce the recorded"):
        add_layer_kappas(results, spec)
    assert vit.read_text() == before


def test_kappa_of_tuning_runs_is_added_from_the_seed_and_the_checkpoint_and_checked_against_the_run(
    tiny_results, tmp_path
):
    """A tuning run recorded before tuning runs kept κ gets the values the study itself records: at
    initialisation from the rebuilt model, after training from its last checkpoint, which must be the
    run's end (its model reproduces the recorded validation accuracy). Without a checkpoint, κ at
    initialisation only, and the run is named; a checkpoint that disagrees is refused unchanged."""
    import math
    import shutil

    from osa_lab.studies.depth_study import load_spec
    from osa_lab.studies.depth_study.runner import scratch_folder
    from osa_lab.studies.depth_study.tuning_kappas import add_tuning_kappas

    exp = tmp_path / "tiny.yaml"
    exp.write_text(TINY_EXPERIMENT)
    spec = load_spec(exp, "full")
    checkpoints = tiny_results.parent / scratch_folder(spec)
    results = tmp_path / "results"
    shutil.copytree(tiny_results, results)
    fields = ["kappa_init", "kappa_trained", "osa_split_init", "osa_split_trained",
              *(f"sub_block_kappa{layers}_{when}" for layers in ("", "_layers") for when in ("init", "trained"))]
    vit, mlp = sorted(results.glob("tune/vit-*.json"))[0], sorted(results.glob("tune/mlp-*.json"))[0]
    recorded = {}
    for path in (vit, mlp):
        payload = json.loads(path.read_text())
        assert payload["status"] == "ok"
        recorded[path] = {k: payload.pop(k) for k in fields if k in payload}
        path.write_text(json.dumps(payload, indent=1))
    assert set(recorded[vit]) == set(fields)  # the study records every field for a ViT tuning run
    assert add_tuning_kappas(results, spec, checkpoints).changed == [mlp, vit]  # every other run has them
    for path in (vit, mlp):
        restored = json.loads(path.read_text())
        for key, value in recorded[path].items():
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(restored[key]), key
            elif key.startswith("sub_block_kappa_layers"):
                for part, values in value.items():
                    assert restored[key][part] == pytest.approx(values, rel=1e-9)
            elif key.startswith(("sub_block_kappa", "osa_split")):
                assert restored[key] == pytest.approx(value, rel=1e-9, nan_ok=True)
            else:
                assert restored[key] == pytest.approx(value, rel=1e-9), key
    assert add_tuning_kappas(results, spec, checkpoints).changed == []
    # a run with κ but not the OSA split gets the split alone; κ is left as it was
    payload = json.loads(vit.read_text())
    payload["kappa_init"] = 123.0  # a sentinel: recomputing κ would replace it
    kept = {k: payload[k] for k in fields if not k.startswith("osa_split")}
    for when in ("init", "trained"):
        payload.pop(f"osa_split_{when}")
    vit.write_text(json.dumps(payload, indent=1))
    assert add_tuning_kappas(results, spec, checkpoints).changed == [vit]
    restored = json.loads(vit.read_text())
    assert restored["osa_split_init"] == restored["osa_split_trained"] == {}  # a ViT has no OSA layer
    assert {k: restored[k] for k in kept} == kept
    # without its checkpoint: κ at initialisation only, and the run named
    payload = json.loads(vit.read_text())
    for key in fields:
        payload.pop(key)
    vit.write_text(json.dumps(payload, indent=1))
    elsewhere = tmp_path / "no-checkpoints"
    done = add_tuning_kappas(results, spec, elsewhere)
    assert done.changed == done.without_checkpoint == [vit]
    restored = json.loads(vit.read_text())
    assert restored["kappa_init"] == pytest.approx(recorded[vit]["kappa_init"], rel=1e-9)
    assert "kappa_trained" not in restored and "sub_block_kappa_trained" not in restored
    before = vit.read_text()
    done = add_tuning_kappas(results, spec, elsewhere)  # still nothing it can add: the run is only named
    assert done.changed == [] and done.without_checkpoint == [vit] and vit.read_text() == before
    # the checkpoint back: the trained κ is added on a later call
    assert add_tuning_kappas(results, spec, checkpoints).changed == [vit]
    assert json.loads(vit.read_text())["kappa_trained"] == pytest.approx(recorded[vit]["kappa_trained"], rel=1e-9)
    # a checkpoint that is not the run's end, or is another configuration's, or whose model does not give
    # the recorded validation accuracy (NaN included) is refused, the run unchanged
    import torch

    from osa_lab.studies.depth_study.run import run_checkpoint_dir

    folder = run_checkpoint_dir(checkpoints, tiny_results, tiny_results / "tune" / vit.name, payload["train_config"])
    state = torch.load(folder / "checkpoint.pt", weights_only=True)
    for change, message in (({"epoch": state["epoch"] - 1}, "not its end"),
                            ({"train_config": {**state["train_config"], "lr": 1.0}}, "another configuration's")):
        moved = tmp_path / "moved"
        shutil.copytree(checkpoints, moved, dirs_exist_ok=True)
        torch.save({**state, **change}, run_checkpoint_dir(moved, results, vit, payload["train_config"]) / "checkpoint.pt")
        vit.write_text(json.dumps(payload, indent=1))
        with pytest.raises(MalformedResultError, match=message):
            add_tuning_kappas(results, spec, moved)
        assert vit.read_text() == json.dumps(payload, indent=1)
    for accuracy in (payload["val_accuracy"] - 0.25, float("nan")):
        vit.write_text(json.dumps({**payload, "val_accuracy": accuracy}, indent=1))
        before = vit.read_text()
        with pytest.raises(MalformedResultError, match="gives validation accuracy"):
            add_tuning_kappas(results, spec, checkpoints)
        assert vit.read_text() == before
    # a run that diverged: κ at initialisation, NaN after training, no checkpoint looked for
    vit.write_text(json.dumps({**payload, "status": "diverged"}, indent=1))
    done = add_tuning_kappas(results, spec, elsewhere)
    assert done.changed == [vit] and done.without_checkpoint == []
    restored = json.loads(vit.read_text())
    assert math.isnan(restored["kappa_trained"]) and "sub_block_kappa_trained" not in restored
    assert restored["kappa_init"] == pytest.approx(recorded[vit]["kappa_init"], rel=1e-9)
