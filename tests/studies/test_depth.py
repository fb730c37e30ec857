"""depth_profile, sweep (tidy schema, depth slicing, cache) and the ``osa-lab sweep`` CLI."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest
import torch

from osa_lab.cli import main
from osa_lab.errors import ConfigurationError, UnknownNameError
from osa_lab.nn.attention import derived_alpha_init
from osa_lab.nn.models import NonFiniteHiddenStateError, build_model
from osa_lab.nn.presets import get_preset
from osa_lab.studies.depth import METRIC_COLUMNS, SPECTRA_COLUMNS, depth_profile, sweep
from osa_lab.studies.metrics import METRICS

pytestmark = pytest.mark.usefixtures("one_torch_thread")

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
    assert len(list(tmp_path.glob("*.npz"))) == 2 * 2 + 2  # OSA 2α×2 seeds, SSA 2 seeds
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


# ---------------------------------------------------------------------------------------------
# no silent wrong answers, refusals before any work
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch": 0}, "batch"),  # was: a CSV of empty values, exit 0
        ({"batch": -1}, "batch"),  # was: a RuntimeError from torch.randn
        ({"batch": 1.5}, "batch"),
        ({"alphas": [float("nan")]}, "finite"),  # was: silently the derived α
        ({"alphas": [float("inf")]}, "finite"),
        ({"tokens": [0]}, "tokens"),
        ({"dims": [8.5]}, "dims"),
    ],
)
def test_sweep_refuses_values_it_used_to_misuse(kwargs, match):
    base = dict(tokens=8, dims=8, seeds=1, progress=False)
    with pytest.raises(ConfigurationError, match=match):
        sweep(["pure-osa"], 2, **{**base, **kwargs})


def test_sweep_refuses_fractional_depth_instead_of_truncating():
    with pytest.raises(ConfigurationError, match="depths"):  # was: depth 2.5 ran depth 2
        sweep(["pure-osa"], [2.5], tokens=8, dims=8, seeds=1, progress=False)


def test_config_for_and_depth_profile_refuse_nan_alpha_and_bad_batch():
    from osa_lab.studies.depth import config_for

    with pytest.raises(ConfigurationError, match="alpha"):
        config_for("pure-osa", depth=2, tokens=8, dim=8, alpha=float("nan"))
    assert config_for("pure-ssa", depth=2, tokens=8, dim=8, alpha=float("nan")).alpha_init is None  # SSA: ignored
    with pytest.raises(ConfigurationError, match="batch"):
        depth_profile("pure-osa", depth=2, tokens=8, dim=8, batch=0)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (dict(depths=[100_000]), "depth 100000"),
        (dict(depths=[2], tokens=[8192]), "N = 8192"),
        (dict(depths=[2], batch=5000), "batch 5000"),
        (dict(depths=[2], seeds=20_000), "20000 models"),
        (dict(depths=[1000], tokens=[1024], dims=[1024]), "GiB"),
    ],
)
def test_sweep_bounds_unreasonable_sizes_and_names_the_override(args, match):
    kw = {**dict(tokens=[8], dims=[8], seeds=1, progress=False), **{k: v for k, v in args.items() if k != "depths"}}
    with pytest.raises(ConfigurationError, match=match) as info:
        sweep(["pure-osa"], args["depths"], **kw)
    assert "--allow-large" in str(info.value)


def test_check_sweep_size_allow_large_lets_it_through():
    from osa_lab.studies.depth import check_sweep_size

    units = [("pure-osa", 100_000, 8, 8, None, None, 0)]
    with pytest.raises(ConfigurationError):
        check_sweep_size(units, ["block"], 1, torch.float64)
    check_sweep_size(units, ["block"], 1, torch.float64, allow_large=True)


def test_cli_sweep_output_checks_happen_before_computing(tmp_path, monkeypatch, capsys):
    import osa_lab.studies.depth.sweeps as sweeps

    calls = []
    monkeypatch.setattr(sweeps, "depth_profile", lambda *a, **k: calls.append(1))
    (tmp_path / "afile").write_text("x")
    cases = [
        ["--output", str(tmp_path)],  # a directory
        ["--output", str(tmp_path / "afile" / "r.csv")],  # parent is a file
        ["--output", str(tmp_path / "r.csv"), "--spectra-output", str(tmp_path / "afile" / "s.csv")],
        ["--output", str(tmp_path / "r.csv"), "--cache-dir", str(tmp_path / "afile")],
        ["--output", str(tmp_path / "r.csv"), "--spectra-output", str(tmp_path / "r.csv")],  # collide
    ]
    for extra in cases:
        rc = main(["sweep", "--presets", "pure-osa", "--depth", "2", "--tokens", "8", "--dim", "8",
                   "--seeds", "1", "--no-progress", *extra])  # fmt: skip
        assert rc == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("osa-lab sweep: error: ") and "--" in err and err.count("\n") == 1, err
    assert calls == []  # nothing was computed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_cli_sweep_missing_spectra_parent_is_created(tmp_path):
    out, spectra = tmp_path / "r.csv", tmp_path / "new" / "deeper" / "s.csv"
    rc = main(["sweep", "--presets", "pure-osa", "--depth", "2", "--tokens", "8", "--dim", "8", "--seeds", "1",
               "--no-progress", "--serial", "--output", str(out), "--spectra-output", str(spectra)])  # fmt: skip
    assert rc == 0 and out.is_file() and spectra.is_file()
    assert list(pd.read_csv(spectra).columns) == SPECTRA_COLUMNS


def test_write_tables_leaves_nothing_behind_when_one_table_fails(tmp_path):
    from osa_lab.studies.depth import write_tables

    class Broken:
        def to_csv(self, *a, **k):
            raise OSError("disk full (simulated)")

    good = pd.DataFrame({"a": [1]})
    with pytest.raises(OSError, match="simulated"):
        write_tables([(tmp_path / "m.csv", good), (tmp_path / "sub" / "s.csv", Broken())])
    assert not (tmp_path / "m.csv").exists()  # the first table is not moved into place alone
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_sweep_allow_large_lifts_the_matrix_free_jacobian_limit(monkeypatch):
    """``allow_large`` must reach the Jacobian task: the library's own input-size bound would
    otherwise refuse inside the task what the user explicitly allowed."""
    import osa_lab.studies.jacobian.estimates as estimates
    from osa_lab.errors import GridTaskFailedWarning

    monkeypatch.setattr(estimates, "MAX_INPUT_DIM", 8)  # N·d = 16 is now "too large"
    kw = dict(depths=[1], tokens=4, dims=4, seeds=1, jacobian="matrix-free", spectra=False, progress=False)
    with pytest.warns(GridTaskFailedWarning, match="JacobianTooLargeError"):
        sweep(["pure-osa"], **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GridTaskFailedWarning)
        res = sweep(["pure-osa"], allow_large=True, **kw)
    assert len(res.jacobian) > 0 and res.jacobian["kappa"].notna().all()


def test_one_token_is_refused_up_front():
    # N = 1 used to run the models and fail every task in token_cosine (empty CSVs)
    with pytest.raises(ConfigurationError, match=r"`tokens` must be ≥ 2.*compare tokens"):
        sweep(["pure-osa"], [2], [8, 1], [8], seeds=1, progress=False)
    with pytest.raises(ConfigurationError, match=r"`tokens` must be ≥ 2"):
        depth_profile("pure-osa", depth=2, tokens=1, dim=8)
    with pytest.raises(ConfigurationError, match=r"tokens.*must be ≥ 2"):
        depth_profile("pure-osa", torch.randn(1, 1, 8, dtype=torch.float64), depth=2, tokens=4, dim=8)


def test_one_study_point_travels_through_profile_config_and_jacobian():
    """A StudyPoint is the study's one settings object: depth_profile, config_for and
    jacobian_depth_profile take it and give what the loose keywords give."""
    from osa_lab.studies.jacobian import jacobian_depth_profile
    from osa_lab.studies.settings import StudyPoint, config_for

    point = StudyPoint("pure-osa", 3, 6, 8, None, 0.7, 2)
    loose = dict(depth=3, tokens=6, dim=8, heads=None, alpha=0.7, seed=2)
    a, b = depth_profile(point, batch=2), depth_profile("pure-osa", batch=2, **loose)
    pd.testing.assert_frame_equal(a.metrics, b.metrics)
    pd.testing.assert_frame_equal(a.spectra, b.spectra)
    assert config_for(point) == config_for("pure-osa", **loose) == point.config()
    kw = dict(algorithm="exact", layers=[1, 3])
    pd.testing.assert_frame_equal(jacobian_depth_profile(point, **kw), jacobian_depth_profile("pure-osa", **loose, **kw))
    with pytest.raises(ConfigurationError, match="either a StudyPoint or"):
        config_for(point, depth=4)
    with pytest.raises(ConfigurationError, match="needs `tokens`, `dim`"):
        config_for("pure-osa", depth=4)
