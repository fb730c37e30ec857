"""Entry script of the osa_lab dashboard served by ``osa-lab dashboard`` (``panel serve`` runs it
once per browser session). The app lives in :mod:`osa_lab.dashboard.app`; this file only builds
a session from it, so it works from a wheel install. Same as ``dashboards/osa_dashboard.py``.
"""

import panel as pn

from osa_lab.dashboard.app import serve_session

if pn.state.served:
    serve_session()
