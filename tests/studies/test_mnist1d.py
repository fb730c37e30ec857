"""MNIST-1D loader: offline generation, never the download path, cache, split sizes, variants."""

from __future__ import annotations

import pickle
import random
import re
import socket
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from osa_lab.errors import DataCacheWarning
from osa_lab.studies.data import MNIST1D_VARIANTS, load_data, load_mnist1d, mnist1d_args, split_validation


class NetworkUsedError(AssertionError):
    pass


def _no_network(*args, **kwargs):
    raise NetworkUsedError("the MNIST-1D loader tried to use the network / the package's download path")


@pytest.fixture
def offline(monkeypatch):
    """Every way the mnist1d package (or anything else) could download raises."""
    import mnist1d.data
    import requests

    monkeypatch.setattr(socket.socket, "connect", _no_network)
    monkeypatch.setattr(socket, "create_connection", _no_network)
    monkeypatch.setattr(urllib.request, "urlopen", _no_network)
    monkeypatch.setattr(requests, "get", _no_network)
    monkeypatch.setattr(mnist1d.data, "get_dataset", _no_network)
    monkeypatch.setattr(mnist1d.data.requests, "get", _no_network)


def test_the_offline_guard_itself_catches_the_download_path(offline):
    """The guard above really trips on the package's download function (so the tests below mean something)."""
    import mnist1d.data

    with pytest.raises(NetworkUsedError):
        mnist1d.data.get_dataset(mnist1d.data.get_dataset_args())


@pytest.fixture(scope="module")
def standard_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("mnist1d-cache")


def test_standard_split_offline_shapes_labels_and_cache(offline, standard_cache):
    np_state, py_state = np.random.get_state()[1].copy(), random.getstate()
    a = load_data("mnist1d", data_dir=standard_cache)
    # the generator seeds NumPy's and Python's global RNGs; the loader restores them
    assert np.array_equal(np.random.get_state()[1], np_state) and random.getstate() == py_state
    assert a.x_train.shape == (4000, 1, 40) and a.x_test.shape == (1000, 1, 40)
    assert a.x_train.dtype == torch.float32 and a.y_train.dtype == torch.int64
    assert a.num_classes == 10 and a.sequence and a.image_size == 40 and a.channels == 1
    assert set(a.y_train.tolist()) == set(range(10)) and set(a.y_test.tolist()) == set(range(10))
    assert abs(float(a.x_train.mean())) < 1e-5 and abs(float(a.x_train.std()) - 1) < 1e-3
    files = list((standard_cache / "mnist1d").glob("mnist1d-*.npz"))
    assert len(files) == 1
    # second call: read back from the cache, identical
    b = load_mnist1d("mnist1d", cache_dir=standard_cache)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert a.info["generator_args"]["num_samples"] == 5000 and a.info["generator_args"]["seed"] == 42
    assert "url" not in a.info["generator_args"]


def test_generation_is_deterministic_and_keyed_by_arguments(offline, tmp_path):
    a = load_mnist1d(cache_dir=tmp_path / "a", num_samples=200)
    b = load_mnist1d(cache_dir=tmp_path / "b", num_samples=200)  # generated again, not read from a's cache
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_train, b.y_train)
    assert a.x_train.shape == (160, 1, 40) and a.x_test.shape == (40, 1, 40)
    c = load_mnist1d(cache_dir=tmp_path / "a", num_samples=200, seed=7)
    assert not torch.equal(a.x_train, c.x_train)
    assert len(list((tmp_path / "a" / "mnist1d").glob("*.npz"))) == 2  # one file per argument set
    # a damaged cache entry is regenerated, not trusted
    path = next((tmp_path / "b" / "mnist1d").glob("*.npz"))
    path.write_bytes(b"garbage")
    with pytest.warns(DataCacheWarning, match="not a readable .npz archive"):
        d = load_mnist1d(cache_dir=tmp_path / "b", num_samples=200)
    assert torch.equal(d.x_train, a.x_train)


# ----------------------------------------------------------------------------- the cache is checked


class Payload:
    """Unpickling this object opens (creates) ``marker``: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _damage(path: Path, damage: str, marker: Path) -> None:
    """Rewrite the cache file ``path`` with one kind of damage (its record is kept as it was)."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    x, y = arrays["x"], arrays["y"]
    if damage == "permuted labels":
        arrays["y"] = np.roll(y, 1)
        assert not np.array_equal(arrays["y"], y)
    elif damage == "truncated sequences":
        arrays["x"] = x[:, :39]
    elif damage == "fewer rows of x than y":
        arrays["x"] = x[:-1]
    elif damage == "NaN":
        arrays["x"] = x.copy()
        arrays["x"][3, 5] = np.nan
    elif damage == "float labels":
        arrays["y"] = y.astype(np.float64)
    elif damage == "no record":
        del arrays["record"]
    elif damage == "pickle payload":
        assert pickle.loads(pickle.dumps(Payload(marker))) and marker.exists()  # the payload is live
        marker.unlink()
        arrays["y"] = np.array([Payload(marker)], dtype=object)
    with path.open("wb") as fh:
        np.savez(fh, **arrays)


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("permuted labels", "does not match its recorded content hash"),
        ("truncated sequences", r"train sequences of shape \(160, 39\); expected \(n, 40\)"),
        ("fewer rows of x than y", r"159 train sequences but \(160,\) labels"),
        ("NaN", "1 NaN/Inf value"),
        ("float labels", "train labels of dtype float64; class labels are integers"),
        ("no record", "lacks the arrays \\['record'\\]"),
        ("pickle payload", "not a readable .npz archive"),
    ],
)
def test_a_changed_or_damaged_cache_is_generated_again_with_a_warning(offline, tmp_path, damage, reason):
    marker = tmp_path / "marker"
    fresh = load_mnist1d(cache_dir=tmp_path, num_samples=200)
    (path,) = (tmp_path / "mnist1d").glob("*.npz")
    _damage(path, damage, marker)
    with pytest.warns(DataCacheWarning) as record:
        again = load_mnist1d(cache_dir=tmp_path, num_samples=200)
    (warning,) = record
    message = str(warning.message)
    assert message.startswith(f"MNIST-1D cache {path} ") and message.endswith("generating it again")
    assert re.search(reason, message), message
    assert "download" not in message  # the data are generated here, not downloaded
    assert not marker.exists()
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(again, name), getattr(fresh, name))
    with warnings.catch_warnings():  # the file was rewritten: the next load is silent
        warnings.simplefilter("error", DataCacheWarning)
        third = load_mnist1d(cache_dir=tmp_path, num_samples=200)
    assert torch.equal(third.y_train, fresh.y_train)
    assert sorted(p.name for p in (tmp_path / "mnist1d").iterdir()) == [path.name]  # no temporary left


def test_shuffle_variant_permutes_time_steps_of_the_same_samples(offline, tmp_path):
    plain = load_mnist1d("mnist1d", cache_dir=tmp_path, num_samples=200)
    shuf = load_mnist1d("mnist1d-shuffle", cache_dir=tmp_path, num_samples=200)
    assert torch.equal(plain.y_train, shuf.y_train)
    assert not torch.equal(plain.x_train, shuf.x_train)
    # the same values per sample, in another (fixed) order of the 40 steps
    torch.testing.assert_close(plain.x_train.sort(-1).values, shuf.x_train.sort(-1).values)
    perm = [int((plain.x_train[0, 0] == v).nonzero()[0]) for v in shuf.x_train[0, 0]]
    torch.testing.assert_close(plain.x_train[..., perm], shuf.x_train)


def test_large_variant_arguments():
    args = mnist1d_args("mnist1d-large")
    assert args["num_samples"] * args["train_split"] == pytest.approx(50_000)
    assert args["seed"] != mnist1d_args("mnist1d")["seed"]
    assert set(MNIST1D_VARIANTS) == {"mnist1d", "mnist1d-large", "mnist1d-shuffle"}


def test_unknown_generator_argument_is_refused():
    from osa_lab.errors import OSAInputError, UnknownNameError

    with pytest.raises(OSAInputError, match="num_sampels"):
        mnist1d_args("mnist1d", num_sampels=3)
    with pytest.raises(UnknownNameError, match="mnist1d-shuffle"):
        mnist1d_args("mnist1d-huge")


def test_validation_split_of_mnist1d_never_touches_test(offline, tmp_path):
    d = load_mnist1d(cache_dir=tmp_path, num_samples=400)
    v = split_validation(d, 0.1)
    assert len(v.y_val) == 32 and len(v.y_train) == 288 and torch.equal(v.x_test, d.x_test)
    rows = lambda x: {tuple(r.flatten().tolist()) for r in x}  # noqa: E731
    assert not rows(v.x_val) & rows(v.x_test) and not rows(v.x_val) & rows(v.x_train)
    assert rows(v.x_val) | rows(v.x_train) == rows(d.x_train)


def test_sequences_become_patch_tokens():
    from osa_lab.studies.data import load_mnist1d as _  # noqa: F401
    from osa_lab.studies.training import TrainConfig, model_config_for

    class Fake:
        image_size, channels, num_classes, sequence = 40, 1, 10, True

    cfg = model_config_for(TrainConfig(preset="skipless-osa", data="mnist1d"), Fake())
    assert cfg.input == "sequence" and cfg.patch_size == 2 and cfg.tokens == 20
    cfg = model_config_for(TrainConfig(preset="vit", data="mnist1d", patch_size=4), Fake())
    assert cfg.tokens == 10
    # the baselines keep their published sizes whatever --depth/--dim say
    cfg = model_config_for(TrainConfig(preset="cnn1d", data="mnist1d", model={"depth": 6, "dim": 64}), Fake())
    assert cfg.backbone == "cnn1d" and cfg.dim == 25
