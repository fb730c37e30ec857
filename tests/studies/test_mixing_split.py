"""Which part of an OSA sub-block is ill-conditioned (``osa_lab.studies.jacobian.mixing_split``): the
fixed-mixing map against exact references, at initialisation and with non-orthogonal projections."""

from __future__ import annotations

import pytest
import torch

from osa_lab.errors import ConfigurationError
from osa_lab.studies.jacobian.mixing_split import MIXING_SPLIT_COLUMNS, mixing_split_summary, osa_mixing_split
from osa_lab.studies.jacobian.sub_blocks import sub_block_kappas, sub_block_record
from tests.helpers import small_classifier, small_images

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _classifier(preset: str, depth: int, heads: int = 2):
    return small_classifier(preset, depth, dim=8, heads=heads, side=3)


def _inputs() -> torch.Tensor:
    return small_images(side=3)


def test_at_initialisation_the_fixed_mixing_map_is_orthogonal_and_the_whole_layer_matches_the_sub_block_table():
    model = _classifier("skipless-osa", 2)
    table = osa_mixing_split(model, _inputs())
    assert list(table.columns) == MIXING_SPLIT_COLUMNS and len(table) == 2 * 2
    # orthogonal W_V, W_O and orthogonal A_h: κ = 1 (docs/design.md §3), to the float32 weights' ≈ 5e-7
    assert table["kappa_fixed_mixing"].sub(1).abs().max() < 1e-5
    assert table["kappa_value"].sub(1).abs().max() < 1e-5 and table["kappa_output"].sub(1).abs().max() < 1e-5
    # the whole layer is the attention sub-block of a skipless, normless block: the same κ as sub_block_kappas
    sub = sub_block_kappas(model, _inputs())
    sub = sub[sub["part"] == "attention"].sort_values(["input", "layer"])["kappa"].to_numpy()
    assert table.sort_values(["input", "layer"])["kappa_attention"].to_numpy() == pytest.approx(sub, rel=1e-8)
    # summarised as a run records its sub-block κ: the recorded attention median, reproduced
    medians, _ = sub_block_record(model, _inputs())
    assert mixing_split_summary(table)["kappa_attention"] == pytest.approx(medians["attention"], rel=1e-8)


def test_without_the_whole_layer_the_other_columns_are_unchanged():
    """``whole=False`` (what a run records) skips only the whole layer's Jacobian."""
    model = _classifier("skipless-osa", 2)
    full, lean = osa_mixing_split(model, _inputs()), osa_mixing_split(model, _inputs(), whole=False)
    assert list(lean.columns) == MIXING_SPLIT_COLUMNS and lean["kappa_attention"].isna().all()
    others = [c for c in MIXING_SPLIT_COLUMNS if c != "kappa_attention"]
    assert lean[others].equals(full[others])


def test_with_one_head_the_fixed_mixing_kappa_is_that_of_the_value_output_product():
    """A ⊗ M has the singular values of M for orthogonal A, so κ is κ(W_V W_O) exactly; the whole
    Jacobian differs (the mixing moves with the input)."""
    model = _classifier("skipless-osa", 1, heads=1)
    attn = model.encoder.blocks[0].attn
    with torch.no_grad():
        attn.to_v.weight.mul_(torch.linspace(0.2, 3.0, 8)[:, None])  # rows of W_V scaled: no longer orthogonal
    table = osa_mixing_split(model, _inputs())
    product = attn.to_v.weight.detach().double().T @ attn.to_out.weight.detach().double().T  # x W_Vᵀ W_Oᵀ for row tokens x
    s = torch.linalg.svdvals(product)
    assert table["kappa_fixed_mixing"].to_numpy() == pytest.approx([float(s[0] / s[-1])] * 2, rel=1e-8)
    assert table["kappa_value"].iloc[0] == pytest.approx(15.0, rel=1e-5)  # 3.0 / 0.2 on float32 weights
    assert not table["kappa_attention"].to_numpy() == pytest.approx(table["kappa_fixed_mixing"].to_numpy(), rel=1e-3)


def test_with_two_heads_the_fixed_mixing_map_is_the_sum_of_each_heads_kronecker_product():
    """Against a reference built by hand: J = Σ_h A_h ⊗ (P_h Q_h)ᵀ (row-major tokens), with
    A_h = matrix_exp(α/√r (q kᵀ − k qᵀ)) and P_h, Q_h head h's slices of W_Vᵀ and W_Oᵀ."""
    model = _classifier("skipless-osa", 1, heads=2)
    attn = model.encoder.blocks[0].attn
    with torch.no_grad():
        attn.to_v.weight.mul_(torch.linspace(0.2, 3.0, 8)[:, None])
        attn.alpha.fill_(0.7)
    table = osa_mixing_split(model, _inputs()[:1])
    m = model.double().eval()
    with torch.no_grad():
        z = m.embed(_inputs().double()[:1])[0]
        q, k = m.encoder.blocks[0].attn.to_q(z), m.encoder.blocks[0].attn.to_k(z)
        a = m.encoder.blocks[0].attn
        jac = torch.zeros(z.numel(), z.numel(), dtype=torch.float64)
        for h in range(2):
            qh, kh = q[:, h * a.head_dim:(h + 1) * a.head_dim], k[:, h * a.head_dim:(h + 1) * a.head_dim]
            mix = torch.linalg.matrix_exp(0.7 / a.head_dim**0.5 * (qh @ kh.T - kh @ qh.T))
            p = a.to_v.weight.T[:, h * a.value_dim:(h + 1) * a.value_dim]
            o = a.to_out.weight.T[h * a.value_dim:(h + 1) * a.value_dim, :]
            jac += torch.kron(mix.contiguous(), (p @ o).T.contiguous())
    s = torch.linalg.svdvals(jac)
    assert table["kappa_fixed_mixing"].iloc[0] == pytest.approx(float(s[0] / s[-1]), rel=1e-8)


def test_a_model_without_osa_or_not_a_classifier_is_refused():
    with pytest.raises(ConfigurationError, match="no OSA layer|has none"):
        osa_mixing_split(_classifier("vit", 1), _inputs())
    with pytest.raises(ConfigurationError, match="ViTClassifier"):
        osa_mixing_split(torch.nn.Linear(3, 3), _inputs())


def test_a_study_run_of_an_osa_preset_records_the_split_before_and_after_training(tmp_path):
    """A tuning run of skipless-osa records ``osa_split_init`` and ``osa_split_trained``: at initialisation
    orthogonal (κ 1), and the values :func:`osa_split_record` gives on the model rebuilt from the run's
    seed and on its last checkpoint."""
    import copy
    import json

    from osa_lab.studies.depth_study.run import run_checkpoint_dir, study_data, study_run
    from osa_lab.studies.depth_study.weights import run_models
    from osa_lab.studies.jacobian.mixing_split import osa_split_record
    from osa_lab.studies.training.checkpoints import read_checkpoint

    spec = {"data": "mnist1d", "val_fraction": 0.1, "batch_size": 100, "model": {"dim": 8, "heads": 2},
            "kappa_samples": 1}  # fmt: skip
    payload = study_run(spec=spec, stage="tune", preset="skipless-osa", depth=1, seed=1000, lr=0.01,
                        alpha_lr_mult=10.0, steps=36, results_dir=str(tmp_path / "results"),
                        scratch_dir=str(tmp_path / "ck"), kappa=True)  # fmt: skip
    assert payload["status"] == "ok" and set(payload["osa_split_init"]) == {"fixed_mixing", "value", "output"}
    assert all(abs(v - 1) < 1e-5 for v in payload["osa_split_init"].values()), payload["osa_split_init"]
    data = study_data("mnist1d", 0.1)
    result = next((tmp_path / "results" / "tune").glob("*.json"))
    models = run_models(result, data)
    assert osa_split_record(models.initial, data.x_val[:1]) == pytest.approx(payload["osa_split_init"], rel=1e-9)
    state = read_checkpoint(run_checkpoint_dir(tmp_path / "ck", tmp_path / "results", result, payload["train_config"])
                            / "checkpoint.pt", torch.device("cpu"))  # fmt: skip
    trained = copy.deepcopy(models.initial)
    trained.load_state_dict(state["model"])
    assert osa_split_record(trained, data.x_val[:1]) == pytest.approx(payload["osa_split_trained"], rel=1e-9)
    assert payload["osa_split_trained"]["value"] > 1 + 1e-4  # training moved W_V off orthogonal
    # a run recorded without the split gets it back from its seed and its checkpoint
    from types import SimpleNamespace

    from osa_lab.studies.depth_study.tuning_kappas import add_tuning_kappas

    recorded = json.loads(result.read_text())
    stripped = {k: v for k, v in recorded.items() if not k.startswith("osa_split")}
    result.write_text(json.dumps(stripped, indent=1))
    study = SimpleNamespace(data="mnist1d", val_fraction=0.1, kappa_samples=1)
    assert add_tuning_kappas(tmp_path / "results", study, tmp_path / "ck").changed == [result]
    restored = json.loads(result.read_text())
    for when in ("init", "trained"):
        assert restored[f"osa_split_{when}"] == pytest.approx(recorded[f"osa_split_{when}"], rel=1e-9)
    assert {k: restored[k] for k in stripped} == stripped


@pytest.mark.parametrize("preset", ["pure-osa", "skipless-osa-alpha0", "skipless-osa-shaped"])
def test_every_osa_preset_splits_with_an_orthogonal_fixed_mixing_map_at_initialisation(preset):
    model = _classifier(preset, 2)
    table = osa_mixing_split(model, _inputs())
    assert len(table) == 2 * 2 and table["kappa_fixed_mixing"].sub(1).abs().max() < 1e-5
    sub = sub_block_kappas(model, _inputs())
    sub = sub[sub["part"] == "attention"].sort_values(["input", "layer"])["kappa"].to_numpy()
    assert table.sort_values(["input", "layer"])["kappa_attention"].to_numpy() == pytest.approx(sub, rel=1e-8)
