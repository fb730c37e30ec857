"""A spare session, built while the server is idle, for the next page request without a query.

Why (the first plot of a session within 3 s): ``panel serve`` builds a session
(runs the entry script and creates its Bokeh models) *before* it answers the page request, on
its only event loop; the browser can fetch and run BokehJS only after that answer. On the 2-core
machine the build takes 0.5–0.9 s of a 2.1–2.9 s first plot (BENCHMARKS.md). A session built in
advance moves that build off the path from navigation to the first plot: the page is answered
at once, from the spare session, and its websocket connects to a document that already exists.

How, on Bokeh's and Panel's own objects:

* :func:`install` (called by every session build; acts once per process) wraps Panel's
  ``DocHandler.get_session`` so that a request that *can* use the spare gets it, and Bokeh's
  ``BokehTornado.start`` so that the first spare is built when the server starts;
* a spare is built by Bokeh's ``ApplicationContext.create_session_if_needed``, exactly as a page
  request would build one (the entry script runs, ``pn.state.session_args`` is empty), and kept
  from Bokeh's unused-session cleanup (``block_expiration``) until its page has loaded;
* it is handed out only to a plain page request: the app's own path, **no query string** (a
  shared link with ``?presets=…`` is built for its URL as before), no Bokeh session id or token
  of the client's own, no ``--reuse-sessions``, no ``--autoreload`` (a spare would hold the code
  of before the reload), no login (OAuth, basic auth) and no authorisation callback. The page gets a
  fresh token for the spare's session id, with the request's headers and cookies in its payload
  (``pn.state.headers`` and ``cookies`` inside the session are those of the build, empty: the
  dashboard reads neither);
* the next spare is built :data:`REBUILD_DELAY_S` after a page has loaded, or
  :data:`FALLBACK_DELAY_S` after a hand-out whose page never loaded, and never while a page
  answered in the last :data:`IN_FLIGHT_S` has not loaded: the build blocks the event loop for
  as long as a page request would, and would hold up that page's scripts. A request that
  arrives during a build waits for it and then gets the new spare.

``OSA_DASHBOARD_SPARE_SESSION=0`` (``osa-lab dashboard --no-spare-session``) turns it off. If a
Panel or Bokeh release renames what this wraps, :func:`install` logs a warning and changes
nothing: pages are then built per request, which works, only later.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

log = logging.getLogger("osa_lab.dashboard")

#: Environment variable that turns the spare session off ("0").
ENV_VARIABLE = "OSA_DASHBOARD_SPARE_SESSION"
#: Seconds after a page's document is ready before the next spare is built.
REBUILD_DELAY_S = 0.25
#: While a page answered this recently has not loaded, no spare is built (the build would hold
#: up that page's scripts and websocket); the build is retried every :data:`RETRY_S`.
IN_FLIGHT_S = 10.0
RETRY_S = 0.5
#: Seconds after a hand-out before a spare is built anyway (its page never loaded).
FALLBACK_DELAY_S = 20.0
#: Seconds a handed-out spare stays protected from cleanup while its page has not loaded.
HANDOUT_GRACE_S = 60.0
#: Stem of the served entry scripts (``dashboards/osa_dashboard.py`` and the package's copy):
#: the app path whose spare is built at server start.
APP_NAME = "osa_dashboard"


def enabled() -> bool:
    """Whether spare sessions are on (``OSA_DASHBOARD_SPARE_SESSION`` is not ``0``)."""
    return os.environ.get(ENV_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")


#: Token payload of a request without headers, cookies or arguments (a spare's build).
_EMPTY_PAYLOAD: dict = {"headers": {}, "cookies": {}, "arguments": {}}


class SpareSessions:
    """At most one spare session per app path, built by Bokeh's application context."""

    def __init__(self) -> None:
        self.tornado: Any = None  # bokeh.server.tornado.BokehTornado, once known
        self.spares: dict[str, Any] = {}  # app path -> ServerSession
        self.building: set[str] = set()
        self.handed_out: dict[Any, Any] = {}  # Document -> ServerSession (expiration still blocked)
        self.in_flight: dict[Any, float] = {}  # Document -> when its page was answered (not loaded yet)

    # -- building ---------------------------------------------------------------------------

    @staticmethod
    def _token(app: Any, session_id: str, payload: dict) -> str:
        """A session token for ``session_id`` signed and timed as the server ``app``'s own."""
        from bokeh.util.token import generate_jwt_token

        return generate_jwt_token(session_id, secret_key=app.secret_key, signed=app.sign_sessions,
                                  expiration=app.session_token_expiration, extra_payload=payload)

    def _context(self, path: str) -> Any:
        apps = getattr(self.tornado, "_applications", None)
        return apps.get(path) if isinstance(apps, dict) else None

    def schedule(self, path: str, delay: float) -> None:
        """Build a spare for ``path`` after ``delay`` seconds unless one exists or is being built
        (callable from any thread: the work is done on the server's event loop)."""
        if self.tornado is not None:
            self.tornado.io_loop.add_callback(self._schedule_on_loop, path, delay)

    def _schedule_on_loop(self, path: str, delay: float) -> None:
        if path in self.spares or path in self.building:
            return
        self.building.add(path)
        self.tornado.io_loop.call_later(delay, self._build, path)

    async def _build(self, path: str) -> None:
        from bokeh.util.token import generate_session_id
        from tornado.httputil import HTTPHeaders, HTTPServerRequest

        now = time.monotonic()
        self.in_flight = {d: t for d, t in self.in_flight.items() if now - t < IN_FLIGHT_S}
        if self.in_flight:  # a page is loading: build when it has (keeps the "building" mark)
            log.debug("spare session for %s postponed: %d page(s) loading", path, len(self.in_flight))
            self.tornado.io_loop.call_later(RETRY_S, self._build, path)
            return
        try:
            context, app = self._context(path), self.tornado
            if context is None or path in self.spares:
                return
            start = time.perf_counter()
            session_id = generate_session_id(secret_key=app.secret_key, signed=app.sign_sessions)
            request = HTTPServerRequest(method="GET", uri=path, version="HTTP/1.1",
                                        headers=HTTPHeaders({"Host": "localhost"}), host="localhost")
            request.route_params, request.app_path = {}, path  # as Panel's page handler sets them
            payload = {**_EMPTY_PAYLOAD, **context.application.process_request(request)}
            session = await context.create_session_if_needed(session_id, request, self._token(app, session_id, payload))
            session.block_expiration()
            self.spares[path] = session
            log.info("spare dashboard session for %s built in %.2f s", path, time.perf_counter() - start)
        except Exception:  # noqa: BLE001 - a failed spare only means the next page is built per request
            log.warning("could not build a spare dashboard session for %s", path, exc_info=True)
        finally:
            self.building.discard(path)

    # -- handing out ------------------------------------------------------------------------

    def usable_by(self, handler: Any) -> bool:
        """Whether the page request of ``handler`` may get the spare (see the module docstring)."""
        from bokeh.server.auth_provider import NullAuth
        from panel.config import config

        request = handler.request
        return (request.path in self.spares and not request.query
                and "Bokeh-Session-Id" not in request.headers and not config.reuse_sessions
                and not config.authorize_callback and not config.autoreload
                and isinstance(getattr(handler.application, "auth_provider", None), NullAuth))

    def take(self, handler: Any) -> Any:
        """The spare session for ``handler``'s request with a fresh token, or ``None``."""
        if self.tornado is None:
            self.tornado = handler.application
        if not self.usable_by(handler):
            return None
        path = handler.request.path
        session = self.spares.pop(path)
        if session.destroyed:
            return None
        payload_of = getattr(handler, "_generate_token_payload", None)
        payload = payload_of() if payload_of is not None else dict(_EMPTY_PAYLOAD)
        session._token = self._token(handler.application, session.id, payload)
        self.handed_out[session.document] = session
        log.info("page request for %s answered from the spare session", path)
        loop = handler.application.io_loop
        loop.call_later(HANDOUT_GRACE_S, self._release, session.document)
        loop.call_later(FALLBACK_DELAY_S, self.schedule, path, 0.0)
        return session

    def _release(self, doc: Any) -> None:
        session = self.handed_out.pop(doc, None)
        if session is not None:
            session.unblock_expiration()  # Bokeh's cleanup may now discard it like any session

    def page_loaded(self, doc: Any) -> None:
        """A session's document is ready in its browser: release a handed-out spare to Bokeh's
        cleanup, and build the next spare a moment later (callable from any thread)."""
        if self.tornado is not None:
            self.tornado.io_loop.add_callback(self._page_loaded_on_loop, doc)

    def page_answered(self, session: Any) -> None:
        """A page request got ``session`` (spare or built for it): no spare is built until its
        document is ready or :data:`IN_FLIGHT_S` have passed."""
        self.in_flight[session.document] = time.monotonic()

    def _page_loaded_on_loop(self, doc: Any) -> None:
        self.in_flight.pop(doc, None)
        self._release(doc)
        context = getattr(getattr(doc, "session_context", None), "server_context", None)
        path = getattr(getattr(context, "application_context", None), "url", None)
        if path:
            self.schedule(path, REBUILD_DELAY_S)


SPARES = SpareSessions()
_INSTALLED = {"done": False, "active": False}


def install() -> bool:
    """Wrap Panel's page handler and Bokeh's server start once per process (see the module
    docstring). Returns whether spare sessions are in use."""
    if _INSTALLED["done"]:
        return _INSTALLED["active"]
    _INSTALLED["done"] = True
    if not enabled():
        log.info("spare dashboard sessions are off (%s=0)", ENV_VARIABLE)
        return False
    try:
        from bokeh.server.tornado import BokehTornado
        from panel.io.server import DocHandler
    except ImportError:
        log.warning("Panel's DocHandler or Bokeh's BokehTornado not found: no spare dashboard session")
        return False
    original_get_session, original_start = DocHandler.get_session, BokehTornado.start

    async def get_session(handler):
        session = SPARES.take(handler)
        if session is None:
            session = await original_get_session(handler)
        SPARES.page_answered(session)
        return session

    def start(tornado) -> None:
        original_start(tornado)
        SPARES.tornado = tornado
        for path in list(getattr(tornado, "_applications", {})):
            if path.rstrip("/").rsplit("/", 1)[-1] == APP_NAME:
                SPARES.schedule(path, 0.0)

    DocHandler.get_session = get_session
    BokehTornado.start = start
    _INSTALLED["active"] = True
    return True


def page_loaded(doc: Any) -> None:
    """Called by each session's ``onload`` (:func:`osa_lab.dashboard.app.serve_session`)."""
    if _INSTALLED["active"]:
        SPARES.page_loaded(doc)
