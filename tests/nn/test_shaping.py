"""TAT's tailored leaky ReLU: kernel maps and the slope rule (arXiv 2203.08120, eqs. 9-11)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from osa_lab.errors import ConfigurationError
from osa_lab.nn.shaping import (
    c_map_table,
    leaky_relu_c_map,
    monte_carlo_c_map,
    network_c_map,
    tat_leaky_relu_slope,
)


def test_depth_one_slope_matches_the_closed_form():
    # At depth 1, C_a(0) = (1 - a)^2 / (pi (1 + a^2)) = eta is a quadratic in a:
    # with k = pi * eta, a = (1 - sqrt(1 - (1 - k)^2)) / (1 - k).
    for eta in (0.05, 0.1, 0.2, 0.3):
        k = math.pi * eta
        by_hand = (1.0 - math.sqrt(1.0 - (1.0 - k) ** 2)) / (1.0 - k)
        assert tat_leaky_relu_slope(1, eta) == pytest.approx(by_hand, rel=1e-10)


def test_relu_value_at_zero_is_one_over_pi():
    assert float(leaky_relu_c_map(0.0, 0.0)) == pytest.approx(1.0 / math.pi, rel=1e-14)
    # Two ReLU layers: C(1/pi) = 1/pi + (sqrt(1 - 1/pi^2) - arccos(1/pi)/pi) / pi, by hand.
    c1 = 1.0 / math.pi
    by_hand = c1 + (math.sqrt(1 - c1**2) - c1 * math.acos(c1)) / math.pi
    assert float(network_c_map(0.0, 0.0, 2)) == pytest.approx(by_hand, rel=1e-14)


@pytest.mark.parametrize(
    ("depth", "golden"),
    # Pinned from this module's solver at eta = 0.9 (checked to meet the target below).
    [(16, 0.10449862808356056), (32, 0.3202233785860509)],
)
def test_slope_rule_golden_values(depth, golden):
    slope = tat_leaky_relu_slope(depth)
    assert slope == pytest.approx(golden, rel=1e-9)
    assert float(network_c_map(0.0, slope, depth)) == pytest.approx(0.9, abs=1e-12)


def test_slope_grows_with_depth():
    slopes = [tat_leaky_relu_slope(d, 0.5) for d in (4, 8, 16, 32, 64)]
    assert all(b > a for a, b in zip(slopes, slopes[1:], strict=False))


def test_unreachable_target_names_the_fix():
    with pytest.raises(ConfigurationError, match="unreachable at depth 8"):
        tat_leaky_relu_slope(8, 0.9)
    with pytest.raises(ConfigurationError, match="between 0 and 1"):
        tat_leaky_relu_slope(16, 1.5)
    with pytest.raises(ConfigurationError, match="positive integer"):
        tat_leaky_relu_slope(0)


@pytest.mark.parametrize("slope", [0.0, 0.3, 0.8])
@pytest.mark.parametrize("c_in", [-0.9, -0.3, 0.0, 0.5, 0.95])
def test_c_map_matches_monte_carlo(slope, c_in):
    # Standard error of the mean with 200k samples is about 0.003; the margin is 0.01.
    empirical = monte_carlo_c_map(c_in, slope, samples=200_000, seed=1)
    assert float(leaky_relu_c_map(c_in, slope)) == pytest.approx(empirical, abs=0.01)


@settings(max_examples=50, deadline=None)
@given(slope=st.floats(0.0, 0.99), c=st.floats(-1.0, 0.999))
def test_c_map_fixes_one_and_never_decreases_cosine(slope, c):
    assert float(leaky_relu_c_map(1.0, slope)) == pytest.approx(1.0, abs=1e-12)
    out = float(leaky_relu_c_map(c, slope))
    assert c - 1e-12 <= out <= 1.0 + 1e-12


def test_c_map_table_is_tidy():
    pytest.importorskip("pandas", reason="a table needs the lab extra; the maps themselves do not")
    table = c_map_table(0.3, [1, 8], c_in=np.array([0.0, 1.0]))
    assert list(table.columns) == ["depth", "c_in", "c_out"]
    assert len(table) == 4
    assert table.loc[table.c_in == 1.0, "c_out"].tolist() == pytest.approx([1.0, 1.0])
    assert float(table.query("depth == 8 and c_in == 0").c_out.iloc[0]) == pytest.approx(
        float(network_c_map(0.0, 0.3, 8))
    )


# ---------------------------------------------------------------------------------------------
# The shaped presets' MLPs: the slope from depth, the tied init, and the C-map they measure
# ---------------------------------------------------------------------------------------------


def test_the_layer_is_tats_normalised_leaky_relu_with_unit_second_moment():
    import torch

    from osa_lab.nn.shaping import TATLeakyReLU, normalised_leaky_relu

    act = TATLeakyReLU(0.3)
    x = torch.linspace(-3, 3, 13, dtype=torch.float64)
    assert torch.allclose(act(x), torch.from_numpy(normalised_leaky_relu(x.numpy(), 0.3)))
    z = torch.randn(400_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert float(act(z).square().mean()) == pytest.approx(1.0, abs=0.01)
    with pytest.raises(ConfigurationError, match="negative_slope"):
        TATLeakyReLU(1.0)


def test_the_shaped_slope_is_tats_rule_or_relu_where_the_target_is_out_of_reach():
    from osa_lab.nn.shaping import shaped_slope

    assert shaped_slope(8) == 0.0  # a ReLU stack of 8 reaches C(0) = 0.834 < 0.9
    assert shaped_slope(16) == pytest.approx(tat_leaky_relu_slope(16), abs=1e-15)
    assert shaped_slope(32) == pytest.approx(0.3202, abs=1e-4)


@pytest.mark.parametrize("depth", [8, 16, 32])
def test_the_shaped_presets_build_their_mlps_with_the_slope_of_their_depth_and_tied_weights(depth):
    import torch

    from osa_lab import get_preset
    from osa_lab.nn.models import build_model
    from osa_lab.nn.shaping import TATLeakyReLU, shaped_slope

    for preset in ("skipless-osa-shaped", "skipless-ssa-shaped"):
        model = build_model(get_preset(preset, depth=depth, dim=8, heads=2, tokens=4, seed=0), dtype=torch.float64)
        for block in model.blocks:
            assert isinstance(block.mlp.act, TATLeakyReLU) and block.mlp.act.negative_slope == shaped_slope(depth)
            product = (block.mlp.fc2.weight @ block.mlp.fc1.weight).detach()  # g I: tied, mean-square gain g > 1
            gain = float(product[0, 0])
            assert gain > 1 and torch.allclose(product, gain * torch.eye(8, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("slope", [0.0, 0.1045, 0.3202, 0.7])
@pytest.mark.parametrize("hidden", [32, 64])
def test_the_tied_mlp_keeps_the_mean_square_of_its_input(slope, hidden):
    """The gain's closed form against a Monte-Carlo reference: 400,000 Gaussian inputs in float64 keep
    their mean square through the block to 1 % (without the gain: ≈ 0.67–0.86 of it at h = 4d)."""
    import torch

    from osa_lab.nn.models import MLP
    from osa_lab.nn.shaping import TATLeakyReLU

    torch.manual_seed(3)
    mlp = MLP(16, hidden, "tat-leaky-relu", dtype=torch.float64)
    mlp.act = TATLeakyReLU(slope)
    mlp.init_tied_orthogonal()
    x = torch.randn(400_000, 16, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    with torch.no_grad():
        ratio = float(mlp(x).square().mean() / x.square().mean())
    assert ratio == pytest.approx(1.0, abs=0.01)


def test_the_tied_gain_is_one_for_a_square_orthogonal_matrix():
    """By hand: with Q square, P = Q Qᵀ = I, so E|u_j||u_k| vanishes off the diagonal and
    s² (a² + b²) d = d: φ_α keeps the mean square by itself."""
    import torch

    from osa_lab.nn.shaping import tied_mlp_gain

    q = torch.linalg.qr(torch.randn(12, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64))[0]
    for slope in (0.0, 0.3, 0.9):
        assert tied_mlp_gain(q, slope) == pytest.approx(1.0, abs=1e-9)


def test_the_slope_rule_agrees_with_an_independent_solve():
    """The C-map written out again (Cho & Saul's arc-cosine kernel mixed with the identity) and solved
    with scipy's brentq, apart from the module's own solver."""
    from scipy.optimize import brentq

    def c_map(c, a):
        return c + (1 - a) ** 2 / (math.pi * (1 + a * a)) * (math.sqrt(max(0.0, 1 - c * c)) - c * math.acos(c))

    def c0_after(a, depth):
        c = 0.0
        for _ in range(depth):
            c = c_map(c, a)
        return c

    for depth, eta in ((16, 0.9), (32, 0.9), (8, 0.8), (32, 0.5)):
        reference = brentq(lambda a, d=depth, e=eta: c0_after(a, d) - e, 0.0, 0.999, xtol=1e-14)
        assert tat_leaky_relu_slope(depth, eta) == pytest.approx(reference, abs=1e-9)


def test_the_measured_c_map_follows_tats_prediction_with_independent_weights_not_with_tied_ones():
    """Width 256, hidden 1024, MLP blocks only, depth 16, seed 0. Independent orthogonal fc1, fc2:
    measured C(0) 0.917 against 0.900 predicted (C(0.5) 0.934 against 0.919; docs/shaping.md gives
    5 seeds: mean 0.888, range 0.856–0.917). Tied fc2 ∝ fc1ᵀ (the shaped presets' init, chosen for
    κ; built after the independent stack, from the same random stream): 0.618, nearer a linear map;
    the prediction assumes fresh weights per layer."""
    import torch

    from osa_lab.nn.models import MLP
    from osa_lab.nn.shaping import measured_c_map, shaped_slope

    torch.manual_seed(0)
    depth, slope = 16, shaped_slope(16)
    stacks = {"independent": [], "tied": []}
    for kind, stack in stacks.items():
        for _ in range(depth):
            mlp = MLP(256, 1024, "tat-leaky-relu", dtype=torch.float64, depth=depth)
            mlp.init_tied_orthogonal() if kind == "tied" else mlp.init_orthogonal()
            stack.append(mlp)
    for c in (0.0, 0.5, 0.9):
        predicted = float(network_c_map(c, slope, depth))
        assert measured_c_map(stacks["independent"], c, 256) == pytest.approx(predicted, abs=0.03)
    assert 0.5 < measured_c_map(stacks["tied"], 0.0, 256) < 0.8 < float(network_c_map(0.0, slope, depth))
