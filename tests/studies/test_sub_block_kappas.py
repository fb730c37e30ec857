"""κ per sub-block (``osa_lab.studies.jacobian.sub_blocks``) and the shaped presets at
initialisation: where each network loses its conditioning, at depths 8, 16 and 32.

The bounds keep a margin of at least 3× from the values measured with seed 0 (width 16, 2 heads,
16 tokens, float64; docs/shaping.md lists them)."""

from __future__ import annotations

import pytest
import torch

from osa_lab import get_preset
from osa_lab.errors import ConfigurationError
from osa_lab.nn.models import build_model
from osa_lab.studies.depth_study.run import encoder_kappa
from osa_lab.studies.jacobian.sub_blocks import PARTS, SUB_BLOCK_COLUMNS, sub_block_kappas, sub_block_summary
from tests.helpers import small_classifier, small_images

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _classifier(preset: str, depth: int):
    return small_classifier(preset, depth)


def _inputs() -> torch.Tensor:
    return small_images()


def test_the_table_has_every_part_and_layer_and_matches_a_direct_jacobian():
    model = _classifier("skipless-osa", 2)
    table = sub_block_kappas(model, _inputs())
    assert list(table.columns) == SUB_BLOCK_COLUMNS
    assert len(table) == 2 * (1 + 2 + 2 + 1)
    assert set(table["part"]) == set(PARTS)
    assert sorted(table.loc[table["part"] == "mlp", "layer"].unique()) == [1, 2]
    # the first attention sub-block's κ from a Jacobian taken here, by torch.autograd
    m = model.double().eval()
    from osa_lab.nn.models import functional_mode

    x0 = m.embed(_inputs().double()[:1])[0].detach()
    with functional_mode(m):
        jac = torch.autograd.functional.jacobian(lambda z: m.encoder.blocks[0].attention_part(z[None])[0], x0)
    s = torch.linalg.svdvals(jac.reshape(x0.numel(), x0.numel()))
    row = table[(table["part"] == "attention") & (table["layer"] == 1) & (table["input"] == 0)].iloc[0]
    assert row["kappa"] == pytest.approx(float(s[0] / s[-1]), rel=1e-8)


def test_a_run_records_the_medians_and_each_layer_from_one_table():
    from osa_lab.studies.jacobian.sub_blocks import sub_block_record

    model = _classifier("skipless-osa", 3)
    table = sub_block_kappas(model, _inputs())
    medians, layers = sub_block_record(model, _inputs())
    per_layer = table.groupby(["part", "layer"])["kappa"].median()
    assert layers["attention"] == pytest.approx(list(per_layer.loc["attention"])) and len(layers["mlp"]) == 3
    assert len(layers["embedding"]) == len(layers["readout"]) == 1
    summary = sub_block_summary(table).set_index("part")["kappa_median"]
    assert medians == pytest.approx({part: summary[part] for part in PARTS})
    assert sub_block_record(build_model(get_preset("skipless-osa", depth=2, dim=8, tokens=4)), torch.randn(1, 4, 8))[1] == {}


def test_a_model_without_sub_blocks_is_refused_with_the_reason():
    with pytest.raises(ConfigurationError, match="ViTClassifier"):
        sub_block_kappas(build_model(get_preset("skipless-osa", depth=2, dim=8, tokens=4)), torch.randn(1, 4, 8))


@pytest.mark.parametrize("depth", [8, 16, 32])
@pytest.mark.parametrize("preset", ["skipless-osa-shaped", "skipless-ssa-shaped"])
def test_the_shaped_presets_are_conditioned_in_every_sub_block(preset, depth):
    """Measured (seed 0), depth 8 / 16 / 32. OSA: attention κ median 1.10 / 1.25 / 1.09, worst layer
    1.16 / 1.72 / 1.41. Value-SkipInit attention is the identity (κ 1). MLP κ median 18 / 5.8 / 2.7 and
    worst layer 59 / 8.4 / 2.9; readout 6.49; end to end 7.6e4 / 4.2e4 / 2.6e3 (OSA) and 7.7e4 / 3.9e4 /
    2.6e3 (softmax). κ near 1 keeps a 3× margin on κ − 1."""
    model = _classifier(preset, depth)
    summary = sub_block_summary(sub_block_kappas(model, _inputs())).set_index("part")
    attention_median, attention_worst = (2.0, 4.0) if preset == "skipless-osa-shaped" else (1.001, 1.001)
    assert summary.loc["attention", "kappa_median"] < attention_median
    assert summary.loc["attention", "kappa_worst_layer"] < attention_worst
    mlp_median, mlp_worst = {8: (60, 200), 16: (20, 30), 32: (10, 10)}[depth]
    assert summary.loc["mlp", "kappa_median"] < mlp_median and summary.loc["mlp", "kappa_worst_layer"] < mlp_worst
    assert summary.loc["embedding", "kappa_median"] < 3 and summary.loc["readout", "kappa_median"] < 20
    assert encoder_kappa(model, _inputs()) < {8: 3e5, 16: 1.5e5, 32: 1e4}[depth]


@pytest.mark.parametrize("depth", [8, 16, 32])
def test_the_shaped_presets_keep_the_signal_s_scale_through_depth(depth):
    """The last block's mean square over the first's (seed 0): 3.3 / 2.7 / 0.53 (OSA) and 3.3 / 2.7 /
    0.49 (softmax) at depth 8 / 16 / 32. Without the tied MLP's gain each MLP kept ≈ 0.67–0.84 of it:
    0.12 / 0.018 / 0.003 of it, and OSA's α₀ (set for unit-scale tokens) mixed less and less."""
    for preset in ("skipless-osa-shaped", "skipless-ssa-shaped"):
        model = _classifier(preset, depth).double()
        with torch.no_grad():
            _, hidden = model(_inputs().double(), return_hidden=True)
        ratio = float(hidden.blocks[-1].square().mean() / hidden.blocks[0].square().mean())
        assert 0.1 < ratio < 10, (preset, ratio)


@pytest.mark.parametrize("depth", [8, 16])
def test_the_unshaped_osa_preset_loses_its_conditioning_in_the_mlps(depth):
    """Measured (seed 0): MLP κ median 1.8e3 / 1.6e3, attention 1.09 / 1.19, end to end 1.4e11 /
    beyond what float64 resolves at depth 8 / 16: the MLPs, not attention, lose it."""
    model = _classifier("skipless-osa", depth)
    summary = sub_block_summary(sub_block_kappas(model, _inputs())).set_index("part")
    assert summary.loc["mlp", "kappa_median"] > 300 > 3 > summary.loc["attention", "kappa_median"]
    assert encoder_kappa(model, _inputs()) > 1e9
