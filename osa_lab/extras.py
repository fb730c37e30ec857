"""The laboratory extra: which optional packages the lab wings need, and the one error without them.

``pip install osa_lab`` installs the core, the :mod:`osa_lab.ops` and :mod:`osa_lab.nn` wings
(:func:`osa_lab.osa`, :class:`osa_lab.OrthogonalSelfAttention`, the models and presets), with
torch and numpy only. The laboratory (studies, plots, reporting, benchmarking, the dashboard,
the integrations, Dask grids and data sets) needs the ``lab`` extra. Each lab wing calls
:func:`require_lab` when it is imported, so a missing package raises one
:class:`~osa_lab.errors.OptionalDependencyError` that names the extra, instead of a bare
``ModuleNotFoundError`` from deep inside a module. Bottom floor: imports only :mod:`osa_lab.errors`.
"""

from __future__ import annotations

import importlib.util

from osa_lab.errors import OptionalDependencyError

__all__ = ["LAB_INSTALL", "LAB_IMPORTS", "missing_modules", "require_lab"]

#: the command that installs the laboratory
LAB_INSTALL = 'pip install "osa_lab[lab]"'

#: import names of the ``lab`` extra's packages that the lab wings import when they load
#: (pyproject.toml's ``lab`` extra installs each of them; tests/test_packaging.py checks this)
LAB_IMPORTS: tuple[str, ...] = ("pandas", "scipy", "matplotlib", "holoviews", "bokeh", "tqdm", "yaml")


def missing_modules(names: tuple[str, ...] | list[str]) -> list[str]:
    """The top-level modules of ``names`` that cannot be imported here (looked up, not imported)."""
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken or blocked package counts as absent
            found = False
        if not found:
            missing.append(name)
    return missing


def require_lab(wing: str, *also: str) -> None:
    """Raise :class:`~osa_lab.errors.OptionalDependencyError` naming the ``lab`` extra unless the
    packages of :data:`LAB_IMPORTS` (and ``also``) are installed; ``wing`` names the importer."""
    missing = missing_modules((*LAB_IMPORTS, *also))
    if missing:
        raise OptionalDependencyError(
            f"{wing} is part of osa_lab's laboratory, which needs {', '.join(missing)} (not installed); "
            f'install it with: {LAB_INSTALL}. The core (osa_lab.osa, osa_lab.OrthogonalSelfAttention, '
            "osa_lab.ops, osa_lab.nn) needs only torch and numpy."
        )
