"""osa_lab dashboard: rank collapse, singular-value spectra and Jacobian conditioning, OSA vs SSA.

Serve it with::

    panel serve dashboards/osa_dashboard.py --warm --show      # or: osa-lab dashboard --show

A thin entry: the app lives in the package (:mod:`osa_lab.dashboard`; docs/dashboard.md) and
``panel serve`` runs this script once per browser session to build that session's page. In a
notebook, ``from osa_lab.dashboard import build_app`` gives the dashboard as a Panel object.
"""

import panel as pn

from osa_lab.dashboard.app import build_app, serve_session

if pn.state.served:
    serve_session()

__all__ = ["build_app"]
