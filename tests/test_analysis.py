"""depth_profile, sweep (tidy schema, depth slicing, cache) and the ``osa-lab sweep`` CLI."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from osa_lab.analysis import METRIC_COLUMNS, SPECTRA_COLUMNS, depth_profile, sweep
from osa_lab.cli import main
from osa_lab.errors import ConfigurationError, UnknownNameError
from osa_lab.layers import derived_alpha_init
from osa_lab.metrics import METRICS
from osa_lab.models import NonFiniteHiddenStateError, build_model
from osa_lab.presets import get_preset


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def test_depth_profile_schema_and_values():
    prof = depth_profile("pure-ssa", depth=12, tokens=32, dim=64, heads=4, seed=0)
    m, s = prof.metrics, prof.spectra
    assert list(m.columns) == METRIC_COLUMNS and list(s.columns) == SPECTRA_COLUMNS
    assert set(m["metric"]) == set(METRICS)
    assert set(m["site"]) == {"block", "attention"}
    blocks = m[(m["site"] == "block") & (m["metric"] == "relative_residual")].set_index("layer")["value"]
    assert list(blocks.index) == list(range(13))
    assert blocks[12] < 1e-3 * blocks[0]  # rank collapse (Dong et al. 2021)
    assert m[m["site"] == "attention"]["layer"].min() == 1
    assert m["alpha"].isna().all()  # SSA: no α
    top = s[(s["index"] == 0)]
    assert (top["sigma_normalized"] == 1.0).all()
    layer0 = s[(s["layer"] == 0) & (s["site"] == "block")].sort_values("index")
    assert len(layer0) == 32 and layer0["sigma"].is_monotonic_decreasing


def test_depth_profile_osa_alpha_column_and_custom_model():
    prof = depth_profile("pure-osa", depth=2, tokens=16, dim=16, seed=0, site="block")
    assert prof.metrics["alpha"].iloc[0] == pytest.approx(derived_alpha_init(16, 16, 16))
    prof = depth_profile("pure-osa", depth=2, tokens=16, dim=16, alpha=0.25, seed=0, site="block")
    assert (prof.metrics["alpha"] == 0.25).all()
    model = build_model(get_preset("pure-osa", depth=2, dim=16, tokens=16, seed=0), dtype=torch.float64)
    custom = depth_profile(model, torch.randn(1, 16, 16, dtype=torch.float64), label="mine", site="block")
    assert (custom.metrics["preset"] == "mine").all() and custom.metrics["depth"].iloc[0] == 2


def test_nan_hidden_state_names_layer():
    model = build_model(get_preset("skipless-osa", depth=3, dim=16, heads=2, tokens=8, seed=0))
    with torch.no_grad():
        model.blocks[1].attn.to_v.weight.fill_(float("nan"))
    with pytest.raises(NonFiniteHiddenStateError, match="layer 2"):
        depth_profile(model)


def test_sweep_slices_depths_dedupes_ssa_alpha_and_caches(tmp_path):
    kw = dict(tokens=16, dims=16, heads=2, alphas=[None, 0.1], seeds=2, cache_dir=tmp_path, progress=False)
    res = sweep(["pure-osa", "pure-ssa"], [2, 4], **kw)
    m = res.metrics
    assert list(m.columns) == METRIC_COLUMNS and list(res.spectra.columns) == SPECTRA_COLUMNS
    # SSA runs once per seed (α = NaN); OSA once per α and seed
    ssa = m[m["preset"] == "pure-ssa"]
    assert ssa["alpha"].isna().all() and sorted(ssa["seed"].unique()) == [0, 1]
    osa = m[m["preset"] == "pure-osa"]
    assert osa["alpha"].nunique() == 2
    # depth 2 rows are exactly the first layers of the depth-4 model, and a real depth-2 model
    d2 = m[(m["depth"] == 2)]
    assert d2["layer"].max() == 2
    direct = depth_profile("pure-ssa", depth=2, tokens=16, dim=16, heads=2, seed=1, site="block").metrics
    got = d2[(d2["preset"] == "pure-ssa") & (d2["seed"] == 1)].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, direct, check_exact=False, rtol=1e-12)
    assert len(list(tmp_path.glob("*.pkl"))) == 2 * 2 + 2  # OSA 2α×2 seeds, SSA 2 seeds
    again = sweep(["pure-osa", "pure-ssa"], [2, 4], **kw)
    pd.testing.assert_frame_equal(again.metrics, m)
    summary = res.summary()
    assert {"mean", "std", "n"} <= set(summary.columns) and (summary["n"] == 2).all()


def test_sweep_errors_before_computing():
    with pytest.raises(UnknownNameError, match="skipless-osa"):
        sweep(["pure-os"], 2, progress=False)
    with pytest.raises(ConfigurationError, match="not divisible"):
        sweep(["pure-osa"], 2, tokens=8, dims=[16, 18], heads=4, seeds=1, progress=False)
    with pytest.raises(UnknownNameError, match="site"):
        sweep(["pure-osa"], 2, site="mlp", progress=False)


def test_cli_sweep_writes_tidy_csvs(tmp_path, capsys):
    out = tmp_path / "results.csv"
    rc = main(
        ["sweep", "--presets", "pure-osa", "pure-ssa", "--depth", "3", "--tokens", "8", "--dim", "8",
         "--seeds", "2", "--output", str(out), "--no-progress"]
    )  # fmt: skip
    assert rc == 0
    metrics = pd.read_csv(out)
    spectra = pd.read_csv(tmp_path / "results_spectra.csv")
    assert list(metrics.columns) == METRIC_COLUMNS and list(spectra.columns) == SPECTRA_COLUMNS
    assert set(metrics["preset"]) == {"pure-osa", "pure-ssa"} and set(metrics["seed"]) == {0, 1}
    assert "mean over seeds" in capsys.readouterr().out
    rc = main(["sweep", "--presets", "nope", "--output", str(out), "--no-progress"])
    assert rc == 2
    assert "valid presets" in capsys.readouterr().err


def test_cli_jacobian_too_large_names_size(tmp_path, capsys):
    rc = main(
        ["sweep", "--presets", "pure-osa", "--depth", "1", "--tokens", "512", "--dim", "512", "--seeds", "1",
         "--no-spectra", "--jacobian", "exact", "--output", str(tmp_path / "r.csv"), "--no-progress"]
    )  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err
    assert "GiB" in err and "matrix-free" in err
