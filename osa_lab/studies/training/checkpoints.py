"""Training checkpoints: written atomically, read back with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import torch

from osa_lab.errors import ConfigurationError, OutputPathError

CHECKPOINT_NAME = "checkpoint.pt"


#: 2: checkpoints record the data source and a content fingerprint (resuming on other data is refused)
CHECKPOINT_FORMAT = 2


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write ``path`` through a unique temporary in the same folder, renamed into place.

    ``write`` fills the open temporary file. A failed write (a full disk, a read-only folder)
    removes the temporary, leaves any earlier ``path`` intact and raises
    :class:`~osa_lab.errors.OutputPathError` naming the path.
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise OutputPathError(f"cannot write {path} ({err.strerror or err}); free space or choose another --output") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OutputPathError(f"cannot write {path} ({err.strerror or err}); free space or choose another --output") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_checkpoint(obj: dict, path: Path) -> None:
    """Save the checkpoint ``obj`` to ``path`` atomically (:func:`atomic_write`)."""
    atomic_write(path, lambda fh: torch.save(obj, fh))


def read_checkpoint(path: Path, device: torch.device) -> dict:
    """The checkpoint dict, or a :class:`ConfigurationError` that suggests ``--no-resume``."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        raise ConfigurationError(
            f"checkpoint {path} holds objects other than tensors and plain data, which osa_lab never "
            "unpickles (a file from elsewhere could run code); it was not written by osa_lab. Pass "
            "--no-resume (resume=False) to start this run over, or choose another output folder"
        ) from None
    except Exception as err:  # noqa: BLE001 — torch.load raises many types on a damaged file
        raise ConfigurationError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {err}); it is truncated or corrupt. "
            "Pass --no-resume (resume=False) to start this run over, or delete the file"
        ) from err
    needed = {"format", "train_config", "epoch", "step", "model", "optimizer", "scheduler", "rng", "rows"}
    if not isinstance(state, dict) or not needed <= set(state):
        raise ConfigurationError(
            f"checkpoint {path} is not an osa_lab training checkpoint (missing fields); pass --no-resume "
            "(resume=False) to start over, or choose another output folder"
        )
    return state
