"""Importing timm: the one place that does, with a one-line error when timm or torchvision is missing.

timm imports torchvision when it is imported (``timm/__init__`` imports ``timm.layers``, whose
``create_norm`` and ``norm_act`` import ``torchvision.ops.misc``; torchvision is one of timm's
declared requirements), so every timm model needs a torchvision that imports beside the installed
torch. :func:`import_timm` checks both and raises
:class:`~osa_lab.errors.OptionalDependencyError` naming what to install; it changes no
process-wide state (no import hooks, no placeholder modules).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import torch

from osa_lab.errors import OptionalDependencyError

#: The timm releases this integration supports (the ``timm`` extra of pyproject.toml): 1.0.21 is the
#: first whose models take ``dtype`` (and ``device``) and pass them to every layer.
TIMM_SPEC = "timm>=1.0.21,<1.1"


def import_timm() -> types.ModuleType:
    """Import and return ``timm`` (with ``timm.models.vision_transformer``).

    Raises:
        OptionalDependencyError: timm is not installed (names the extra that installs it), or
            torchvision, which timm imports, is missing or does not import beside this torch.
    """
    if "timm.models.vision_transformer" in sys.modules:
        return sys.modules["timm"]
    if importlib.util.find_spec("timm") is None:
        raise OptionalDependencyError(
            f"osa_lab.integrations.timm needs timm ({TIMM_SPEC}); install it with `pip install 'osa_lab[lab,timm]'`"
        )
    try:
        importlib.import_module("torchvision")
    except Exception as exc:  # ImportError, or RuntimeError from a torchvision built for another torch
        why = (
            "is not installed"
            if isinstance(exc, ModuleNotFoundError)
            else f"does not import here ({_first_line(exc)})"
        )
        raise OptionalDependencyError(
            f"timm imports torchvision, which {why}; install the torchvision release made for this torch "
            f"({torch.__version__}) to use osa_lab.integrations.timm"
        ) from exc
    import timm
    import timm.models.vision_transformer  # noqa: F401

    return timm


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def timm_attention_class() -> type:
    """``timm.layers.Attention`` (importing timm)."""
    import_timm()
    from timm.layers import Attention

    return Attention


def vit_module() -> types.ModuleType:
    """``timm.models.vision_transformer`` (importing timm)."""
    import_timm()
    return sys.modules["timm.models.vision_transformer"]
