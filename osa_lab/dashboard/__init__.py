"""The Panel dashboard of osa_lab (docs/dashboard.md).

* :mod:`osa_lab.dashboard.state`: the controls (mirrored in the URL), background jobs and the
  process-wide caches of sweeps, OSA checks, figures and Jacobians;
* :mod:`osa_lab.dashboard.figure_view`: the base of the tabs' views and the widgets they share;
* one module per tab: :mod:`~osa_lab.dashboard.rank_view`, :mod:`~osa_lab.dashboard.spectra_view`,
  :mod:`~osa_lab.dashboard.jacobian_view`, and :mod:`~osa_lab.dashboard.check_view` for the
  OSA-check badges above them;
* :mod:`osa_lab.dashboard.app`: the page (:class:`~osa_lab.dashboard.app.Dashboard`,
  :func:`~osa_lab.dashboard.app.build_app`, :func:`~osa_lab.dashboard.app.serve_session`);
* :mod:`osa_lab.dashboard.jobs`: Jacobians in a worker process that can be cancelled;
* :mod:`osa_lab.dashboard.cli`: ``osa-lab dashboard``.

Importing this package does not import Panel (the Jacobian worker imports :mod:`.jobs` only);
``build_app`` and ``Dashboard`` are loaded on first use.
"""

from __future__ import annotations

from typing import Any

from osa_lab.extras import require_lab

require_lab("osa_lab.dashboard", "panel", "param")

__all__ = ["Dashboard", "build_app"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from osa_lab.dashboard import app

        return getattr(app, name)
    raise AttributeError(f"module 'osa_lab.dashboard' has no attribute {name!r}")
