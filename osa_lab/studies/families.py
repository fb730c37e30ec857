"""Model families from other libraries that the depth studies can read.

:func:`osa_lab.studies.depth.depth_profile` and :func:`~osa_lab.studies.depth.hidden_states`
take osa_lab's own models and, through this registry, models of other libraries (timm's Vision
Transformers). The studies own the interface (:class:`ModelFamily`); an integration one floor up
(:mod:`osa_lab.integrations.timm`) implements it and registers itself when imported, so the
studies never import the integrations (arrows point down, docs/architecture.md).

:data:`FAMILY_MODULES` names, per library, the integration that registers its family; it is
loaded the first time a model is looked up while that library is imported (a timm model can
only exist once ``timm`` is imported), so ``timm.create_model(...)`` models work without the
user importing the integration first.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["FAMILY_MODULES", "ModelFamily", "model_family", "register_model_family"]


@dataclass(frozen=True)
class ModelFamily:
    """How the depth studies read one library's models."""

    #: library (top-level package) whose models these are, e.g. ``"timm"``
    library: str
    #: True for a model of this family (must not import the library)
    is_member: Callable[[object], bool]
    #: ``hidden_states(model, inputs) -> HiddenStates`` (block by block)
    hidden_states: Callable[..., Any]
    #: ``depth_profile(model, inputs, *, seed, batch, site, metrics, spectra, label) -> DepthProfile``
    depth_profile: Callable[..., Any]


#: library → the osa_lab module that registers its :class:`ModelFamily` when imported
FAMILY_MODULES: dict[str, str] = {"timm": "osa_lab.integrations.timm.analysis"}

_FAMILIES: dict[str, ModelFamily] = {}


def register_model_family(family: ModelFamily) -> None:
    """Make ``family``'s models readable by the depth studies (called by an integration)."""
    _FAMILIES[family.library] = family


def model_family(model: object) -> ModelFamily | None:
    """The registered family ``model`` belongs to, or None (never imports a library)."""
    for library, module in FAMILY_MODULES.items():
        if library in sys.modules and library not in _FAMILIES:
            importlib.import_module(module)  # registers the family
    for family in _FAMILIES.values():
        if family.is_member(model):
            return family
    return None
