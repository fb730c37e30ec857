"""Data loaders: digits split, IDX reader on files the test writes, MNIST errors, synthetic task."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from osa_lab.errors import ConfigurationError, OSAInputError, UnknownNameError
from osa_lab.studies.data import (
    DATASETS,
    MissingDataError,
    load_data,
    load_digits,
    load_mnist,
    load_synthetic,
    read_idx,
    write_idx,
)


def test_digits_split_is_fixed_stratified_and_standardised():
    a, b = load_digits(), load_digits()
    assert a.x_train.shape == (1437, 1, 8, 8) and a.x_test.shape == (360, 1, 8, 8)
    assert a.x_train.dtype == torch.float32 and a.y_train.dtype == torch.int64
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    # stratified: every class in the test set in nearly its overall proportion (≈36 each)
    counts = torch.bincount(a.y_test, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37
    assert abs(float(a.x_train.mean())) < 1e-5 and abs(float(a.x_train.std()) - 1) < 1e-3
    assert a.image_size == 8 and a.channels == 1 and a.num_classes == 10
    # train and test are disjoint images (no sample appears in both)
    tr = {tuple(x.flatten().tolist()) for x in a.x_train}
    assert sum(tuple(x.flatten().tolist()) in tr for x in a.x_test) < 5  # sklearn digits has a few duplicates


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gzip"])
@pytest.mark.parametrize("dtype", ["u1", ">i4", ">f4"], ids=["ubyte", "int32", "float32"])
def test_idx_round_trip(tmp_path, gz, dtype):
    rng = np.random.default_rng(0)
    arr = (rng.integers(0, 255, size=(5, 3, 4))).astype(dtype)
    path = write_idx(tmp_path / ("a.idx" + (".gz" if gz else "")), arr)
    out = read_idx(path)
    assert out.shape == (5, 3, 4) and np.array_equal(out, arr)


def test_idx_reader_matches_hand_written_bytes(tmp_path):
    # 2 images of 2×3, type 0x08, written by hand (big-endian dims) — independent of write_idx
    body = bytes(range(12))
    raw = bytes([0, 0, 0x08, 3]) + (2).to_bytes(4, "big") + (2).to_bytes(4, "big") + (3).to_bytes(4, "big")
    (tmp_path / "x").write_bytes(raw + body)
    out = read_idx(tmp_path / "x")
    assert out.shape == (2, 2, 3) and out[1, 1, 2] == 11 and out.dtype == np.uint8
    labels = bytes([0, 0, 0x08, 1]) + (3).to_bytes(4, "big") + bytes([7, 0, 9])
    with gzip.open(tmp_path / "y.gz", "wb") as fh:
        fh.write(labels)
    assert read_idx(tmp_path / "y.gz").tolist() == [7, 0, 9]


def test_idx_reader_rejects_bad_files(tmp_path):
    (tmp_path / "html").write_bytes(b"<html>404</html>")
    with pytest.raises(OSAInputError, match="not an IDX file"):
        read_idx(tmp_path / "html")
    raw = bytes([0, 0, 0x08, 1]) + (10).to_bytes(4, "big") + bytes(4)
    (tmp_path / "short").write_bytes(raw)
    with pytest.raises(OSAInputError, match="truncated or corrupt"):
        read_idx(tmp_path / "short")


def _write_fake_mnist(root, gz: bool, n_train=40, n_test=20, size=28):
    rng = np.random.default_rng(1)
    ext = ".gz" if gz else ""
    root.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, size, size)).astype(np.uint8),
        "train-labels-idx1-ubyte": (np.arange(n_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, size, size)).astype(np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_test) % 10).astype(np.uint8),
    }
    for stem, arr in arrays.items():
        write_idx(root / (stem + ext), arr)
    return arrays


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gzip"])
def test_mnist_from_idx_files(tmp_path, gz):
    arrays = _write_fake_mnist(tmp_path / "m", gz)
    ds = load_data("mnist", data_dir=tmp_path / "m")
    assert ds.x_train.shape == (40, 1, 28, 28) and ds.x_test.shape == (20, 1, 28, 28)
    assert ds.y_train.tolist() == arrays["train-labels-idx1-ubyte"].tolist()
    # standardised with the training statistics, order preserved
    raw = arrays["train-images-idx3-ubyte"].astype(np.float64)
    expected = (raw - raw.mean()) / raw.std()
    np.testing.assert_allclose(ds.x_train[:, 0].numpy(), expected, rtol=1e-5, atol=1e-5)
    small = load_mnist(tmp_path / "m", train_limit=20, test_limit=10)
    assert len(small.y_train) == 20 and torch.bincount(small.y_train).tolist() == [2] * 10


def test_mnist_from_npz(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (30, 28, 28)).astype(np.uint8)
    y = (np.arange(30) % 10).astype(np.uint8)
    np.savez(tmp_path / "mnist.npz", x_train=x, y_train=y, x_test=x[:10], y_test=y[:10])
    for where in (tmp_path, tmp_path / "mnist.npz"):
        ds = load_mnist(where)
        assert ds.x_train.shape == (30, 1, 28, 28) and ds.y_test.tolist() == list(range(10))


def test_missing_mnist_says_where_to_get_and_put_files(tmp_path):
    with pytest.raises(MissingDataError) as err:
        load_data("mnist", data_dir=tmp_path)
    msg = str(err.value)
    assert "train-images-idx3-ubyte" in msg and str(tmp_path.resolve()) in msg
    assert "https://" in msg and "mnist.npz" in msg and "--data-dir" in msg
    # one file present, three missing: only the missing ones are named
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", np.zeros((1, 2, 2), np.uint8))
    with pytest.raises(MissingDataError, match="t10k-images") as err:
        load_mnist(tmp_path)
    assert "missing train-images" not in str(err.value)


@pytest.mark.parametrize("name", ["digits", "synthetic"])
def test_data_dir_for_a_built_in_data_set_is_refused(tmp_path, name):
    """``data_dir`` is read by MNIST and MNIST-1D only; elsewhere it used to be ignored silently."""
    with pytest.raises(ConfigurationError, match=rf"used only by the mnist, mnist1d.*{name!r} needs no directory: drop data_dir"):
        load_data(name, data_dir=tmp_path)


def test_unknown_data_name_lists_valid_ones():
    with pytest.raises(UnknownNameError) as err:
        load_data("cifar")
    for name in DATASETS:
        assert name in str(err.value)


def test_synthetic_is_deterministic_balanced_and_learnable():
    a, b = load_synthetic(), load_synthetic()
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_train, b.y_train)
    assert torch.bincount(a.y_train).tolist() == [64] * 4
    # nearest class mean on the training set classifies the test set well: the task has signal
    means = torch.stack([a.x_train[a.y_train == c].mean(0) for c in range(4)]).flatten(1)
    pred = torch.cdist(a.x_test.flatten(1), means).argmin(1)
    assert (pred == a.y_test).float().mean() > 0.9


# ----------------------------------------------------------------------------- corrupt files


def test_corrupt_label_byte_is_refused_not_a_201_class_model(tmp_path):
    arrays = _write_fake_mnist(tmp_path / "m", gz=False)
    labels = arrays["train-labels-idx1-ubyte"].copy()
    labels[7] = 200
    write_idx(tmp_path / "m" / "train-labels-idx1-ubyte", labels)
    with pytest.raises(OSAInputError, match=r"1 label\(s\) outside 0–9 \(e.g. \[200\]\)"):
        load_mnist(tmp_path / "m")


def test_float_and_negative_labels_are_refused(tmp_path):
    x = np.zeros((10, 28, 28), np.uint8)
    np.savez(tmp_path / "mnist.npz", x_train=x, y_train=np.arange(10) + 0.5, x_test=x, y_test=np.arange(10))
    with pytest.raises(OSAInputError, match="dtype float64"):
        load_mnist(tmp_path)
    np.savez(tmp_path / "mnist.npz", x_train=x, y_train=np.arange(10) - 1, x_test=x, y_test=np.arange(10))
    with pytest.raises(OSAInputError, match=r"\[-1\]"):
        load_mnist(tmp_path)


def test_truncated_gzip_and_non_zip_npz_name_the_file(tmp_path):
    _write_fake_mnist(tmp_path / "m", gz=True)
    p = tmp_path / "m" / "t10k-labels-idx1-ubyte.gz"
    p.write_bytes(p.read_bytes()[:-12])
    with pytest.raises(OSAInputError, match="t10k-labels-idx1-ubyte.gz is truncated"):
        load_mnist(tmp_path / "m")
    (tmp_path / "n").mkdir()
    (tmp_path / "n" / "mnist.npz").write_bytes(b"\x80\x04garbage" * 20)
    with pytest.raises(OSAInputError, match="not a readable .npz"):
        load_mnist(tmp_path / "n")


def test_nan_pixels_are_a_data_error(tmp_path):
    x = np.ones((10, 28, 28), np.float32)
    x[0, 0, 0] = np.inf
    np.savez(tmp_path / "mnist.npz", x_train=x, y_train=np.arange(10), x_test=x, y_test=np.arange(10))
    with pytest.raises(OSAInputError, match="1 NaN/Inf pixel"):
        load_mnist(tmp_path)


def test_fingerprint_follows_contents_only():
    from osa_lab.studies.data import data_fingerprint

    a, b = load_synthetic(), load_synthetic()
    assert data_fingerprint(a) == data_fingerprint(b)
    assert data_fingerprint(load_synthetic(seed=1)) != data_fingerprint(a)


@pytest.mark.parametrize("empty", ["train", "test"])
def test_empty_mnist_split_is_refused_before_standardising(tmp_path, empty):
    """An .npz with 0 training (or test) images: one clear OSAInputError naming the split, and no
    NumPy RuntimeWarning from the mean/std of nothing."""
    import warnings

    x = np.random.default_rng(0).integers(0, 256, (10, 28, 28), dtype=np.uint8)
    y = np.arange(10, dtype=np.uint8)
    arrays = {"x_train": x, "y_train": y, "x_test": x, "y_test": y}
    arrays[f"x_{empty}"], arrays[f"y_{empty}"] = x[:0], y[:0]
    np.savez(tmp_path / "mnist.npz", **arrays)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would surface as an error here
        with pytest.raises(OSAInputError, match=f"{empty} split has 0 images"):
            load_mnist(tmp_path)
