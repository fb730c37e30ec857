"""The tables and plot builders behind report notebook 1 (small sizes, a few seconds)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from osa_lab.errors import UnknownNameError
from osa_lab.ops.expm import skew_symmetric_from_qk
from osa_lab.plots import expm as plots
from osa_lab.plots.depth import png_bytes
from osa_lab.studies import expm_accuracy as expm_study


@pytest.fixture(scope="module")
def acc():
    return expm_study.accuracy_table(
        (3, 16, 40), (0.0, 0.5, 4.0), ("float64", "float32"), rank=4, value_dim=3, seeds=(0, 1), orthogonality_max_n=16
    )


def test_accuracy_table_shape_and_float64_accuracy(acc):
    assert len(acc) == 3 * 3 * 2 * 2 * 2  # n × alpha × dtype × method × seed
    f64 = acc[acc["dtype"] == "float64"]
    assert f64["rel_error"].max() < 1e-11, f64.sort_values("rel_error").tail()
    assert f64["orth_error"].dropna().max() < 1e-12
    assert acc[acc["n"] > 16]["orth_error"].isna().all()  # above orthogonality_max_n
    f32 = acc[acc["dtype"] == "float32"]
    assert 1e-9 < f32["rel_error"].max() < 1e-4  # float32 is measured, not rounded away
    assert acc[acc["alpha"] == 0.0]["rel_error"].max() < 1e-6  # α = 0: A = I


def test_skew_norm_matches_dense_svd():
    gen = torch.Generator().manual_seed(3)
    for n, r in [(5, 4), (30, 2), (64, 8)]:
        q, k = (torch.randn(n, r, generator=gen, dtype=torch.float64) for _ in range(2))
        dense = np.linalg.norm(skew_symmetric_from_qk(q, k, 0.3).numpy(), 2)
        assert expm_study.skew_norm(q, k, 0.3) == pytest.approx(dense, rel=1e-10)


def test_fit_slopes_recovers_power_laws():
    ns = np.array([64, 128, 256, 512, 1024])
    rows = [{"method": m, "n": n, "seconds": 1e-9 * n**p * (1.5 if n == 64 else 1.0)} for m, p in (("dense", 3), ("sdpa", 2)) for n in ns]
    slopes = expm_study.fit_slopes(pd.DataFrame(rows), points=3).set_index("method")
    assert slopes.loc["dense", "slope"] == pytest.approx(3.0, abs=1e-9)
    assert slopes.loc["sdpa", "slope"] == pytest.approx(2.0, abs=1e-9)
    assert slopes.loc["dense", "n_min"] == 256 and slopes.loc["dense", "expected"] == 3
    one = expm_study.fit_slopes(pd.DataFrame(rows[:1]))
    assert np.isnan(one["slope"].iloc[0])


def test_timing_table_caps_and_names():
    t = expm_study.timing_table((8, 32), max_n={"dense": 8}, batch_heads=1, head_dim=4, repeat=1)
    assert set(t[t["n"] == 32]["method"]) == {"lowrank", "sdpa"}
    assert (t["seconds"] > 0).all()
    with pytest.raises(UnknownNameError, match="sdpa"):
        expm_study.timing_table((8,), methods=("flash",))
    with pytest.raises(ValueError, match="ns"):
        expm_study.accuracy_table(ns=[0])


def test_builders_render_with_both_backends(acc):
    import holoviews as hv

    timings = pd.DataFrame(
        [{"method": m, "n": n, "seconds": 1e-6 * n**p} for m, p in (("dense", 3), ("lowrank", 1)) for n in (8, 16, 32)]
    )
    figures = [
        plots.error_vs_n(acc),
        plots.error_vs_alpha(acc),
        plots.error_vs_norm(acc),
        plots.orthogonality_vs_n(acc),
        plots.time_vs_n(timings, expm_study.fit_slopes(timings)),
    ]
    for fig in figures:
        assert png_bytes(fig, dpi=30).startswith(b"\x89PNG")
        hv.render(fig, backend="bokeh")
    with pytest.raises(ValueError, match="lacks columns"):
        plots.error_vs_n(acc.drop(columns=["dtype"]))
