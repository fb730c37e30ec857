"""`osa-lab train` with bad arguments, bad data, bad checkpoints and busy folders.

Every case must exit with code 2, print exactly one line on stderr naming the problem (never a
traceback) and leave no partial output behind. Runs use the synthetic task and a 1-block,
width-16 model so the file stays fast.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import osa_lab.studies.training as T
from osa_lab.cli import main as cli_main
from osa_lab.errors import OSAInputError
from osa_lab.studies.data import write_idx

TINY_ARGS = ["--depth", "1", "--dim", "16", "--heads", "2", "--diag-every", "0", "--quiet"]


def synthetic_args(out, *extra: str) -> list[str]:
    return ["train", "--preset", "skipless-osa", "--data", "synthetic", "--epochs", "1", "--patch-size", "4",
            *TINY_ARGS, "--output", str(out), *extra]  # fmt: skip


def mnist_args(out, data_dir, *extra: str) -> list[str]:
    return ["train", "--preset", "skipless-osa", "--data", "mnist", "--data-dir", str(data_dir), "--epochs", "1",
            *TINY_ARGS, "--output", str(out), *extra]  # fmt: skip


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    code = cli_main(args)
    return code, capsys.readouterr().err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err and lines[0].startswith("osa-lab train: error:"), err
    for needle in needles:
        assert needle.lower() in lines[0].lower(), (needle, lines[0])


pytestmark = pytest.mark.usefixtures("one_torch_thread_per_module")

# --------------------------------------------------------------------------- bad arguments

BAD_ARGS = [
    (["--grad-clip", "-1"], "grad-clip"),
    (["--weight-decay", "-5"], "weight_decay"),
    (["--weight-decay", "nan"], "weight_decay"),
    (["--patch-size", "0"], "patch_size"),
    (["--patch-size", "3"], "patch_size"),
    (["--epochs", "0"], "epochs"),
    (["--batch-size", "0"], "batch_size"),
    (["--lr", "0"], "lr"),
    (["--lr=-1e-3"], "lr"),
    (["--lr", "inf"], "lr"),
    (["--warmup-fraction", "1.5"], "warmup_fraction"),
    (["--warmup-fraction", "-0.1"], "warmup_fraction"),
    (["--diag-samples", "-1"], "diag-samples"),
    (["--diag-every", "-3"], "diag_every"),
    (["--threads", "-1"], "threads"),
    (["--threads", "0"], "threads"),
    (["--device", "bogus"], "device"),
    (["--seeds", "-1"], "seeds"),
    (["--seeds", "0", "0"], "seeds"),
    (["--depth", "0"], "depth"),
    (["--alpha-lr-mult", "0"], "alpha_lr_mult"),
    (["--val-fraction", "1"], "val_fraction"),
    (["--preset", "nope"], "unknown preset"),
    (["--osa-method", "magic"], "unknown OSA method"),
]


@pytest.mark.parametrize("extra,needle", BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_bad_argument_exits_2_with_one_line_and_no_output(tmp_path, extra, needle):
    """Through the shared CLI harness: exit 2, one error line, nothing created under tmp_path."""
    import re

    from tests.helpers import assert_cli_user_error

    assert_cli_user_error(synthetic_args(tmp_path / "out", *extra), re.escape(needle), watch=[tmp_path])
    assert not (tmp_path / "out").exists()


def test_train_limit_zero_is_refused_not_ignored(tmp_path, capsys):
    code, err = run_cli(mnist_args(tmp_path / "out", tmp_path / "nowhere", "--train-limit", "0"), capsys)
    assert_one_line_error(code, err, "--train-limit")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("data", ["digits", "synthetic"])
def test_data_dir_for_a_built_in_data_set_is_refused_not_ignored(tmp_path, capsys, data):
    """Was: ``--data digits --data-dir X`` trained on the built-in digits and exited 0, X unread."""
    args = ["train", "--preset", "skipless-osa", "--data", data, "--data-dir", str(tmp_path / "mine"),
            "--epochs", "1", *TINY_ARGS, "--output", str(tmp_path / "out")]  # fmt: skip
    code, err = run_cli(args, capsys)
    assert_one_line_error(code, err, "--data-dir is used only by --data mnist, mnist1d", f"--data {data}", "drop --data-dir")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_device_on_a_cpu_machine(tmp_path, capsys):
    code, err = run_cli(synthetic_args(tmp_path / "out", "--device", "cuda"), capsys)
    assert_one_line_error(code, err, "no CUDA GPU", "--device cpu")


def test_output_that_is_a_file_or_under_a_file(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    code, err = run_cli(synthetic_args(f), capsys)
    assert_one_line_error(code, err, "is a file")
    code, err = run_cli(synthetic_args(f / "sub"), capsys)
    assert_one_line_error(code, err, "is a file")
    assert f.read_text() == "x"


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can write to read-only folders")
def test_read_only_output_parent(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        code, err = run_cli(synthetic_args(ro / "out"), capsys)
        assert_one_line_error(code, err, "cannot write")
    finally:
        ro.chmod(0o700)


# --------------------------------------------------------------------------- bad data files


def fake_mnist(root, *, gz=True, labels=None, images=None, n_train=20, n_test=10):
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    ext = ".gz" if gz else ""
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)).astype(np.uint8)
        if images is None
        else images,
        "train-labels-idx1-ubyte": (np.arange(n_train) % 10).astype(np.uint8) if labels is None else labels,
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)).astype(np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_test) % 10).astype(np.uint8),
    }
    for stem, arr in arrays.items():
        write_idx(root / (stem + ext), arr)
    return root


def _label_200(root):
    labels = (np.arange(20) % 10).astype(np.uint8)
    labels[3] = 200
    fake_mnist(root, labels=labels)


def _label_minus_1(root):
    labels = (np.arange(20) % 10).astype(np.int8)
    labels[5] = -1
    fake_mnist(root, labels=labels)


def _float_labels(root):
    fake_mnist(root, labels=(np.arange(20) % 10).astype(np.float32) + 0.7)


def _truncated_gz(root):
    fake_mnist(root)
    path = root / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:200])


def _corrupt_idx(root):
    fake_mnist(root, gz=False)
    (root / "train-images-idx3-ubyte").write_bytes(b"<html>404</html>")


def _non_zip_npz(root):
    root.mkdir(parents=True)
    (root / "mnist.npz").write_bytes(b"this is not a zip archive at all" * 10)


def _nan_pixels(root):
    root.mkdir(parents=True)
    x = np.random.default_rng(0).random((20, 28, 28)).astype(np.float32)
    x[2, 3, 4] = np.nan
    y = (np.arange(20) % 10).astype(np.uint8)
    np.savez(root / "mnist.npz", x_train=x, y_train=y, x_test=x[:10], y_test=y[:10])


BAD_DATA = [
    (_label_200, ["label", "0–9", "200"]),
    (_label_minus_1, ["label", "-1"]),
    (_float_labels, ["labels have dtype float32", "integers"]),
    (_truncated_gz, ["train-images-idx3-ubyte.gz", "truncated"]),
    (_corrupt_idx, ["not an IDX file"]),
    (_non_zip_npz, ["mnist.npz", "not a readable .npz"]),
    (_nan_pixels, ["NaN", "not a training divergence"]),
]


@pytest.mark.parametrize("make,needles", BAD_DATA, ids=[f.__name__.strip("_") for f, _ in BAD_DATA])
def test_bad_mnist_files_exit_2_naming_the_file(tmp_path, capsys, make, needles):
    make(tmp_path / "data")
    out = tmp_path / "out"
    code, err = run_cli(mnist_args(out, tmp_path / "data"), capsys)
    assert_one_line_error(code, err, *needles)
    assert not out.exists()


# --------------------------------------------------------------------------- errors during a run


def test_method_refusing_its_input_is_a_one_line_error_not_a_divergence(tmp_path, capsys, monkeypatch):
    """A named OSA engine that refuses its input (`gram` on rank-deficient q, k)."""

    class Refusing(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x, return_hidden=False):
            raise OSAInputError("method 'gram' needs [q k] of full column rank; use method='lowrank' or 'qr'")

    build = T.build_training_model
    monkeypatch.setattr(T.loop, "build_training_model", lambda cfg: Refusing(build(cfg)))
    out = tmp_path / "out"
    code, err = run_cli(synthetic_args(out, "--osa-method", "gram"), capsys)
    assert_one_line_error(code, err, "full column rank", "lowrank")
    assert "diverged" not in err
    assert not out.exists()


def test_corrupt_checkpoint_suggests_no_resume(tmp_path, capsys):
    out = tmp_path / "out"
    args = synthetic_args(out)
    assert cli_main(args) == 0
    ckpt = out / "skipless-osa" / "seed0" / T.CHECKPOINT_NAME
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    capsys.readouterr()
    code, err = run_cli(args, capsys)
    assert_one_line_error(code, err, "checkpoint", "--no-resume")
    assert out.is_dir()  # existing results are not deleted
    assert cli_main([*args, "--no-resume"]) == 0


def test_resume_with_other_data_dir_is_refused(tmp_path, capsys):
    fake_mnist(tmp_path / "a")
    other = fake_mnist(tmp_path / "b", images=np.zeros((20, 28, 28), np.uint8) + 7)
    out = tmp_path / "out"
    assert cli_main(mnist_args(out, tmp_path / "a")) == 0
    capsys.readouterr()
    config_before = (out / "skipless-osa" / "seed0" / "config.json").read_text()
    code, err = run_cli(mnist_args(out, other), capsys)
    assert_one_line_error(code, err, "other data", "--data-dir")
    assert (out / "skipless-osa" / "seed0" / "config.json").read_text() == config_before
    # the same files under another path: same contents, resumes (with a notice)
    (tmp_path / "a").rename(tmp_path / "moved")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli_main(mnist_args(out, tmp_path / "moved")) == 0
    assert any("identical contents" in str(w.message) for w in caught)


# --------------------------------------------------------------------------- one writer per folder


def _live_foreign_process():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_second_writer_is_refused_naming_the_owner(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    proc = _live_foreign_process()
    try:
        lock = {"pid": proc.pid, "host": __import__("socket").gethostname(), "started": "now", "command": "osa-lab train"}
        (out / T.LOCK_NAME).write_text(json.dumps(lock))
        code, err = run_cli(synthetic_args(out), capsys)
        assert_one_line_error(code, err, f"process {proc.pid}", "another --output")
        assert sorted(p.name for p in out.iterdir()) == [T.LOCK_NAME]  # nothing written, lock kept
    finally:
        proc.kill()
        proc.wait()
    # the owner is gone now: its lock is stale and is taken over with a notice
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli_main(synthetic_args(out)) == 0
    assert any("stale lock" in str(w.message) for w in caught)
    assert not (out / T.LOCK_NAME).exists()  # released at the end


def test_run_folder_lock_is_held_during_training(tmp_path):
    """While train() runs, its folder holds a lock naming this process; a second train() is refused."""
    from osa_lab.errors import RunLockedError
    from osa_lab.studies.data import load_synthetic

    cfg = T.TrainConfig(preset="skipless-osa", data="synthetic", epochs=2, patch_size=4, diag_every=0,
                        model={"depth": 1, "dim": 16, "heads": 2})  # fmt: skip
    data = load_synthetic()
    seen = {}

    def during(epoch, _):
        seen["lock"] = json.loads((tmp_path / T.LOCK_NAME).read_text())
        with pytest.raises(RunLockedError, match=str(os.getpid())):
            T.train(cfg, tmp_path, data=data, progress=False)

    T.train(cfg, tmp_path, data=data, progress=False, on_epoch_end=during)
    assert seen["lock"]["pid"] == os.getpid()
    assert not (tmp_path / T.LOCK_NAME).exists()


def test_gzip_error_names_the_file_in_the_library(tmp_path):
    from osa_lab.studies.data import read_idx

    path = tmp_path / "x.gz"
    with gzip.open(path, "wb") as fh:
        fh.write(b"\0" * 1000)
    path.write_bytes(path.read_bytes()[:15])
    with pytest.raises(OSAInputError, match="x.gz"):
        read_idx(path)


# --------------------------------------------------------------------------- QA follow-ups


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_output_on_a_special_file_system_is_probed_not_trusted(tmp_path, monkeypatch):
    """`--output /proc/o`: os.access says yes (as root), mkdir fails; a real probe refuses it (exit 2)."""
    from tests.helpers import assert_cli_user_error

    monkeypatch.setattr(os, "access", lambda *a, **k: True)  # what root sees, for any user
    args = ["train", "--data", "digits", "--epochs", "1", *TINY_ARGS, "--serial", "--output", "/proc/osa-lab-o"]
    assert_cli_user_error(args, r"/proc", watch=[tmp_path])
    assert not os.path.exists("/proc/osa-lab-o")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_run_lock_mkdir_failure_is_an_output_path_error():
    """RunLock.acquire turns an OSError from creating the folder into OutputPathError (no raw OSError)."""
    from osa_lab.errors import OutputPathError

    with pytest.raises(OutputPathError, match="cannot create output folder /proc/osa-lab-o"):
        T.RunLock("/proc/osa-lab-o").acquire()


@pytest.mark.parametrize("fraction", ["0.999", "0.001"])
def test_val_fraction_leaving_a_part_with_too_few_samples_is_refused_before_any_run(tmp_path, fraction):
    """digits has 1437 training samples and 10 classes: 0.999 leaves 1 for training, 0.001 1 for
    validation. One line naming val_fraction, exit 2, no metrics.csv/runs.csv/summary.csv."""
    from tests.helpers import assert_cli_user_error

    args = ["train", "--data", "digits", "--epochs", "1", *TINY_ARGS, "--serial", "--val-fraction", fraction,
            "--output", str(tmp_path / "out")]  # fmt: skip
    assert_cli_user_error(args, r"val_fraction.*at least 10", watch=[tmp_path])
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- what finished runs wrote


def test_a_late_user_error_keeps_the_runs_that_finished(tmp_path, capsys):
    out = tmp_path / "X"
    args = ["train", "--preset", "vit", "skipless-osa", "--osa-method", "gram", "--data", "synthetic",
            "--epochs", "1", "--patch-size", "4", *TINY_ARGS, "--serial", "--output", str(out)]  # fmt: skip
    code, err = run_cli(args, capsys)
    assert_one_line_error(code, err, "gram")
    assert (out / "vit" / "seed0" / T.CHECKPOINT_NAME).exists()
    assert (out / "vit" / "seed0" / "metrics.csv").exists()


@pytest.mark.filterwarnings("ignore::osa_lab.errors.OSAAccuracyWarning")  # the diverging run's huge ‖S‖: expected
def test_a_diverged_rerun_does_not_report_the_earlier_runs_metrics(tmp_path, capsys):
    out = tmp_path / "X"
    assert run_cli(synthetic_args(out, "--serial"), capsys)[0] == 0
    first = (out / "metrics.csv").read_bytes()
    code, _ = run_cli(synthetic_args(out, "--serial", "--no-resume", "--lr", "1e6", "--grad-clip", "0"), capsys)
    assert code == 1  # the run diverged: reported, not a crash
    assert (out / "metrics.csv").read_bytes() != first
    assert not (out / "skipless-osa" / "seed0" / "metrics.csv").exists()


def test_a_full_disk_during_training_is_one_line_and_leaves_nothing_partial(tmp_path, capsys, monkeypatch):
    import errno

    from osa_lab.studies.training import checkpoints

    def full(obj, fh):
        fh.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoints.torch, "save", full)
    out = tmp_path / "X"
    code, err = run_cli(synthetic_args(out, "--serial"), capsys)
    assert_one_line_error(code, err, "cannot write", "checkpoint.pt", "No space left")
    left = [p.name for p in out.rglob("*")] if out.exists() else []
    assert not [n for n in left if n.endswith(".tmp") or n == "metrics.csv"], left


def test_an_all_diverged_tune_keeps_the_runs_that_finished(tmp_path, capsys, monkeypatch):
    from tests.studies.test_training import NaNAfter

    build = T.loop.build_training_model
    # every skipless-ssa run diverges at its second step, whatever the learning rate; vit trains
    monkeypatch.setattr(T.loop, "build_training_model",
                        lambda cfg: NaNAfter(build(cfg), 2) if cfg.attention == "ssa" and not cfg.skip else build(cfg))  # fmt: skip
    out = tmp_path / "X"
    args = ["train", "--tune", "--preset", "vit", "skipless-ssa", "--data", "synthetic", "--epochs", "1",
            "--patch-size", "4", *TINY_ARGS, "--serial", "--seeds", "0", "--tune-seeds", "1000",
            "--lr-grid", "1e-3", "3e-3", "--output", str(out)]  # fmt: skip
    code, err = run_cli(args, capsys)
    assert_one_line_error(code, err, "every tuning run of preset 'skipless-ssa' diverged")
    kept = sorted(p.relative_to(out).as_posix() for p in out.rglob(T.CHECKPOINT_NAME))
    assert kept and all("vit" in p for p in kept), kept  # the finished vit tuning runs are still there
