"""Old import paths of modules that moved when the package was regrouped into wings.

``import osa_lab.analysis`` (and every other name in :data:`MOVED`) keeps working: a finder on
``sys.meta_path`` answers the old name with the module object that now lives at the new path,
so both names are *the same module* (``monkeypatch.setattr(osa_lab.analysis, ...)`` patches the
real one, ``isinstance`` checks and pickles agree). Nothing is imported until the old name is
used. New code imports the new paths (docs/architecture.md lists the wings).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

#: old module name → the module that now holds its code
MOVED: dict[str, str] = {
    "osa_lab.expm": "osa_lab.ops.expm",
    "osa_lab.functional": "osa_lab.ops.functional",
    "osa_lab.validation": "osa_lab.ops.guards",
    "osa_lab.kernels": "osa_lab.ops.triton",
    "osa_lab.kernels.triton_osa": "osa_lab.ops.triton.kernels",
    "osa_lab.kernels.compile_check": "osa_lab.ops.triton.compile_check",
    "osa_lab.kernels.sync_count": "osa_lab.ops.triton.sync_count",
    "osa_lab.layers": "osa_lab.nn.attention",
    "osa_lab.models": "osa_lab.nn.models",
    "osa_lab.presets": "osa_lab.nn.presets",
    "osa_lab.analysis": "osa_lab.studies.depth",
    "osa_lab.metrics": "osa_lab.studies.metrics",
    "osa_lab.jacobian": "osa_lab.studies.jacobian",
    "osa_lab.depth_facts": "osa_lab.studies.summaries",
    "osa_lab.expm_study": "osa_lab.studies.expm_accuracy",
    "osa_lab.checks": "osa_lab.studies.self_check",
    "osa_lab.train": "osa_lab.studies.training",
    "osa_lab.data": "osa_lab.studies.data",
    "osa_lab.grid": "osa_lab.studies.grid",
    "osa_lab.report": "osa_lab.reporting.runner",
    "osa_lab.notebook": "osa_lab.reporting.kernel_setup",
    "osa_lab.provenance": "osa_lab.reporting.provenance",
    "osa_lab.bench": "osa_lab.benchmarking.runner",
    "osa_lab.benchtools": "osa_lab.benchmarking.timing",
}


class MovedModuleLoader(importlib.abc.Loader):
    """Loads an old module name by importing its new home and handing back that module."""

    def __init__(self, new_name: str) -> None:
        self.new_name = new_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new_name)
        # the import system stamps ``__spec__`` on the object it gets; keep the real one
        self.real_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.real_spec
        sys.modules[self.new_name] = module

    def get_code(self, fullname: str):
        """The new module's code, so that ``python -m <old name>`` still runs it."""
        spec = importlib.util.find_spec(self.new_name)
        return spec.loader.get_code(self.new_name)


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old names in :data:`MOVED` (and only those)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        new_name = MOVED.get(fullname)
        if new_name is None:
            return None
        is_package = fullname == "osa_lab.kernels"
        real = importlib.util.find_spec(new_name)  # its file: ``python -m <old name>`` sets __file__ from it
        spec = importlib.machinery.ModuleSpec(
            fullname, MovedModuleLoader(new_name), origin=real.origin if real else None, is_package=is_package
        )
        spec.has_location = real is not None and real.has_location
        return spec


def install() -> None:
    """Put :class:`MovedModuleFinder` on ``sys.meta_path`` once (called by ``osa_lab/__init__``)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())


def moved_module(name: str) -> ModuleType | None:
    """The module an old attribute name of the ``osa_lab`` package stands for (``osa_lab.analysis``
    without an import statement), or None."""
    new_name = MOVED.get(f"osa_lab.{name}")
    return importlib.import_module(f"osa_lab.{name}") if new_name else None
