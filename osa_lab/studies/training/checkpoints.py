"""Training checkpoints: written atomically, read back with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from osa_lab.errors import ConfigurationError
from osa_lab.fileio import atomic_writer

CHECKPOINT_NAME = "checkpoint.pt"


#: 2: checkpoints record the data source and a content fingerprint (resuming on other data is refused)
CHECKPOINT_FORMAT = 2


def write_checkpoint(obj: dict, path: Path) -> None:
    """Save the checkpoint ``obj`` to ``path`` whole or not at all (:func:`osa_lab.fileio.atomic_writer`)."""
    with atomic_writer(path, "wb") as fh:
        torch.save(obj, fh)


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
