"""κ per sub-block (``osa_lab.studies.jacobian.sub_blocks``) and the shaped presets at
initialisation: where each network loses its conditioning, at depths 8, 16 and 32.

The bounds keep a margin of at least 3× from the values measured with seed 0 (width 16, 2 heads,
16 tokens, float64; docs/shaping.md lists them)."""

from __future__ import annotations

import pytest
import torch

from osa_lab import get_preset
from osa_lab.errors import ConfigurationError
from osa_lab.nn.models import build_classifier, build_model
from osa_lab.studies.depth_study.run import encoder_kappa
from osa_lab.studies.jacobian.sub_blocks import PARTS, SUB_BLOCK_COLUMNS, sub_block_kappas, sub_block_summary

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _classifier(preset: str, depth: int):
    cfg = get_preset(preset, depth=depth, dim=16, heads=2, tokens=16, seed=0, input="patches", image_size=4,
                     patch_size=1, channels=1)  # fmt: skip
    return build_classifier(cfg)


def _inputs() -> torch.Tensor:
    return torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(1))


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


def test_a_model_without_sub_blocks_is_refused_with_the_reason():
    with pytest.raises(ConfigurationError, match="ViTClassifier"):
        sub_block_kappas(build_model(get_preset("skipless-osa", depth=2, dim=8, tokens=4)), torch.randn(1, 4, 8))


@pytest.mark.parametrize("depth", [8, 16, 32])
def test_the_shaped_osa_preset_is_conditioned_in_every_sub_block(depth):
    """Measured (seed 0): attention κ median 1.02, worst layer ≤ 1.09; MLP κ median 18.5 / 5.8 /
    2.7 and worst layer 59 / 8.4 / 2.9 at depth 8 / 16 / 32; end to end 7.4e4 / 4.9e4 / 2.0e3."""
    model = _classifier("skipless-osa-shaped", depth)
    summary = sub_block_summary(sub_block_kappas(model, _inputs())).set_index("part")
    assert summary.loc["attention", "kappa_median"] < 1.5 and summary.loc["attention", "kappa_worst_layer"] < 3
    mlp_median, mlp_worst = {8: (60, 200), 16: (20, 30), 32: (10, 10)}[depth]
    assert summary.loc["mlp", "kappa_median"] < mlp_median and summary.loc["mlp", "kappa_worst_layer"] < mlp_worst
    assert summary.loc["embedding", "kappa_median"] < 3
    assert encoder_kappa(model, _inputs()) < 3e5


@pytest.mark.parametrize("depth", [8, 16])
def test_the_unshaped_osa_preset_loses_its_conditioning_in_the_mlps(depth):
    """Measured (seed 0): MLP κ median 1.8e3 / 1.6e3, attention 1.09 / 1.19, end to end 1.4e11 /
    2.8e18 at depth 8 / 16: the MLPs, not attention, lose it."""
    model = _classifier("skipless-osa", depth)
    summary = sub_block_summary(sub_block_kappas(model, _inputs())).set_index("part")
    assert summary.loc["mlp", "kappa_median"] > 300 > 3 > summary.loc["attention", "kappa_median"]
    assert encoder_kappa(model, _inputs()) > 1e9
