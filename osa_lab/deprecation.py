"""Old public names that were renamed: they keep working for one release, with a warning.

A module that renamed a public name declares ``__getattr__ = renamed(__name__, {"old": "new"})``;
``module.old`` (and ``from module import old``) then returns ``module.new`` and emits a
:class:`DeprecationWarning` that names the new spelling. Bottom floor: any module may use it.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable

__all__ = ["renamed"]

#: the release after which the old names go away
REMOVED_IN = "0.3"


def renamed(module: str, names: dict[str, str]) -> Callable[[str], object]:
    """A module-level ``__getattr__`` answering each old name in ``names`` with its new one."""

    def module_getattr(name: str) -> object:
        if name in names:
            new = names[name]
            warnings.warn(
                f"{module}.{name} was renamed {module}.{new}; the old name goes away in osa_lab {REMOVED_IN}",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(sys.modules[module], new)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return module_getattr
