"""The network's kernel (DKS's C-map) of built encoders: exact invariants and the shaped presets' values."""

from __future__ import annotations

import math

import pytest
import torch

from osa_lab import get_preset
from osa_lab.errors import ConfigurationError
from osa_lab.nn.models import build_classifier, build_model
from osa_lab.studies.depth import KERNEL_COLUMNS, encoder_c_map


def _encoder(preset: str, depth: int, seed: int = 0):
    return build_model(get_preset(preset, depth=depth, dim=32, heads=2, tokens=20, seed=seed), dtype=torch.float64)


@pytest.mark.parametrize("preset", ["vit", "skipless-osa", "skipless-ssa", "skipless-osa-shaped"])
def test_identical_inputs_keep_cosine_1_and_the_input_layer_has_the_cosine_asked_for(preset):
    table = encoder_c_map(_encoder(preset, 4), (1.0, 0.0, 0.5, 0.9), pairs=64)
    assert list(table.columns) == KERNEL_COLUMNS
    assert len(table) == 4 * (5 + 4)  # layers 0..4 after blocks, 1..4 after attention
    same = table[table["c_in"] == 1.0]
    assert (same["c_out"] - 1.0).abs().max() < 1e-12
    inputs = table[(table["site"] == "block") & (table["layer"] == 0)].set_index("c_in")["c_out"]
    for c in (0.0, 0.5, 0.9):  # 64 pairs of 640 numbers: the mean cosine lies within ~0.005 of c
        assert inputs[c] == pytest.approx(c, abs=0.03)


def test_an_orthogonal_attention_sub_layer_keeps_the_cosine_exactly():
    """Value-SkipInit attention at initialisation is X ↦ X W_V W_O with W_V W_O orthogonal: each
    attention sub-layer of skipless-ssa-shaped leaves the pair's cosine as the block before left it."""
    table = encoder_c_map(_encoder("skipless-ssa-shaped", 6), (0.0, 0.5, 0.9), pairs=8)
    for c, rows in table.groupby("c_in"):
        blocks = rows[rows["site"] == "block"].set_index("layer")["c_out"]
        attention = rows[rows["site"] == "attention"].set_index("layer")["c_out"]
        for layer, value in attention.items():
            assert value == pytest.approx(blocks[layer - 1], abs=1e-12), (c, layer)
        if c == 0.0:  # the MLPs do move it: orthogonal inputs come out correlated
            assert blocks[6] > blocks[0] + 0.2


def test_the_shaped_presets_kernel_is_neither_degenerate_nor_linear_and_the_vits_stays_near_linear():
    """Width 32, 20 tokens, 16 pairs, seed 0 here; over seeds 0–2 (docs/shaping.md) skipless-osa-shaped
    at depth 16 maps C(0) to 0.60–0.75 and the ViT at depth 8 to 0.08–0.10."""
    shaped = encoder_c_map(_encoder("skipless-osa-shaped", 16), (0.0, 0.9))
    last = shaped[(shaped["site"] == "block") & (shaped["layer"] == 16)].set_index("c_in")["c_out"]
    assert 0.4 < last[0.0] < 0.85 and last[0.0] < last[0.9] < 0.99
    vit = encoder_c_map(_encoder("vit", 8), (0.0,))
    assert vit[(vit["site"] == "block") & (vit["layer"] == 8)]["c_out"].item() < 0.3


def test_the_encoder_is_left_in_its_mode_and_the_draws_are_seeded():
    encoder = _encoder("skipless-osa", 2)
    encoder.train()
    first = encoder_c_map(encoder, (0.5,), pairs=4, seed=3)
    assert encoder.training
    assert first.equals(encoder_c_map(encoder, (0.5,), pairs=4, seed=3))
    assert not first.equals(encoder_c_map(encoder, (0.5,), pairs=4, seed=4))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"c_in": (0.0, 1.5)}, r"cosines in \[-1, 1\], got \[0.0, 1.5\]"),
    ({"c_in": (math.nan,)}, r"cosines in \[-1, 1\]"),
    ({"c_in": ()}, r"one or more cosines"),
    ({"c_in": "abc"}, r"sequence of cosines"),
    ({"pairs": 1}, r"`pairs` must be an int ≥ 2"),
    ({"tokens": 0}, r"`tokens` must be an int ≥ 1"),
])  # fmt: skip
def test_bad_arguments_name_the_problem(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        encoder_c_map(_encoder("skipless-osa", 1), **kwargs)


def test_a_classifier_is_refused_with_the_fix():
    model = build_classifier(get_preset("skipless-osa", depth=1, dim=16, heads=2, input="patches", image_size=4,
                                        patch_size=1, channels=1))  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"token Encoder.*pass its `.encoder`"):
        encoder_c_map(model)
