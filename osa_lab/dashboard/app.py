"""osa_lab dashboard: rank collapse, singular-value spectra and Jacobian conditioning, OSA vs SSA.

Serve it with::

    panel serve dashboards/osa_dashboard.py --warm --show      # or: osa-lab dashboard

Layout (docs/dashboard.md): a :class:`~panel.template.BootstrapTemplate` whose sidebar holds the
:class:`~osa_lab.dashboard.state.Controls` (presets, depth, tokens N, width d, heads, α, seeds,
metric) and whose main area holds the OSA-check badges (:mod:`osa_lab.dashboard.check_view`)
and one tab per view (:mod:`~osa_lab.dashboard.rank_view`, :mod:`~osa_lab.dashboard.spectra_view`,
:mod:`~osa_lab.dashboard.jacobian_view`). Everything on screen is mirrored in the page URL; a
copied link restores the view. The page loads no resource from the internet.

The served entry scripts (``dashboards/osa_dashboard.py`` and the copy inside this package that
``osa-lab dashboard`` serves) only call :func:`serve_session`; all code lives in this package,
whose module state (caches, the warm flag, running Jacobian jobs) lives once per server process.
"""

from __future__ import annotations

import atexit
import logging
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

import holoviews as hv
import panel as pn
import param

from osa_lab.dashboard import jobs
from osa_lab.dashboard.address import keep_address_on_view
from osa_lab.dashboard.caches import CHECKS, FIGURES, JACOBIANS, SWEEPS
from osa_lab.dashboard.check_view import OSACheckView
from osa_lab.dashboard.figure_view import message_pane, prepared, throttled
from osa_lab.dashboard.jacobian_view import JacobianView
from osa_lab.dashboard.rank_view import RankCollapseView
from osa_lab.dashboard.spectra_view import SpectraView
from osa_lab.dashboard.state import (
    ACCENT,
    FIGURE_LOCK,
    PRESET_HEADS,
    URL_PARAMETERS,
    VIEW_LABELS,
    VIEWS,
    Controls,
    compute_osa_check,
    compute_unit,
    jacobian_layers,
    markdown_literal,
)
from osa_lab.dashboard.sweep import SweepSettings, SweepState, compute_sweep
from osa_lab.errors import ConfigurationError

log = logging.getLogger("osa_lab.dashboard")

_WARM = False
_WARM_LOCK = threading.Lock()


#: The page's short guide (the "How to read this" card above the views).
HOW_TO_READ = """\
Every figure is of models **at initialisation** (random weights, Gaussian tokens): the question is
whether signal propagation across depth keeps the tokens apart, before any training.

- **Rank collapse tab**: one metric after each block, mean over seeds with a band. Rank collapse shows as
  the relative residual and the effective rank falling towards 0 and 1, and the token cosine rising to 1.
- **Spectra tab**: the singular values of the tokens after each block, divided by the largest; a
  collapsing stack leaves one bright row, a healthy one a spread.
- **Jacobian tab**: κ of ∂X_l/∂X_0 (end to end) or of one block; large κ means some input directions
  are lost. κ at or above about 4.5e15 cannot be resolved in float64 (σ_min is then rounding error).
- **OSA check badges**: per OSA preset, whether its attention matrices are orthogonal to rounding.
- Trained models: open a study's results with `osa-lab dashboard --results DIR` (or `?view=runs`).
"""


class Dashboard(pn.viewable.Viewer):
    """One session's dashboard: controls, the shared sweep state and the views."""

    controls = param.ClassSelector(class_=Controls)
    url_errors = param.List(default=[], doc="URL values that could not be used (shown as a message).")

    def __init__(self, compute_now: bool = True, **params):
        controls = params.pop("controls", None) or Controls(
            **{k: params.pop(k) for k in list(params) if k in Controls.param and k != "name"}
        )
        super().__init__(controls=controls, **params)
        self.state = SweepState(controls=controls)
        self.check_view = OSACheckView(controls=controls, compute_now=compute_now)
        self.rank_view = RankCollapseView(controls=controls, state=self.state)
        self.spectra_view = SpectraView(controls=controls, state=self.state)
        self.jacobian_view = JacobianView(controls=controls)
        self.views = {"rank": self.rank_view, "spectra": self.spectra_view, "jacobian": self.jacobian_view}
        # Each tab holds an empty column until first shown: a new session builds only the visible
        # view (the hidden views' widgets and figure panes cost ≈ 0.1 s of the first page).
        self._tab_bodies = {v: pn.Column(sizing_mode="stretch_width") for v in VIEWS}
        self.tabs = pn.Tabs(
            *((label, self._tab_bodies[v]) for label, v in VIEW_LABELS.items()),
            dynamic=True, sizing_mode="stretch_width", active=VIEWS.index(controls.view),
        )
        self.tabs.param.watch(lambda e: setattr(self.controls, "view", VIEWS[e.new]), "active")
        self._on_view()
        if compute_now:
            self.state.refresh()

    def show_cached(self) -> None:
        """Apply the sweep and OSA check of the current controls now if they are already cached
        (the pre-warmed default view, or settings another session computed), so a new session's
        first document carries its figures instead of placeholders and a second round trip;
        anything not cached is left to the page's load (with loading indicators)."""
        try:
            self.controls.validate()
            cfg, groups = self.controls.config(), self.controls.check_groups()
        except ConfigurationError:
            return
        if SWEEPS.get(SweepSettings.of(cfg)) is not None:
            self.state.refresh()
        if all(CHECKS.get(args) is not None for _, args in groups):
            self.check_view.refresh()

    @param.depends("controls.view", watch=True)
    def _on_view(self) -> None:
        index = VIEWS.index(self.controls.view)
        if self.tabs.active != index:
            self.tabs.active = index
        body = self._tab_bodies[self.controls.view]
        if not body.objects:
            body.objects = [self.views[self.controls.view]]
        for name, view in self.views.items():
            view.active = name == self.controls.view

    # -- the URL ----------------------------------------------------------------------------

    def apply_url(self, query: Mapping[str, Any]) -> None:
        """Set the controls from the page's query (bad values become :attr:`url_errors`).

        Never raises: a link cannot stop the page from loading; whatever could not be used is
        named in the page's message and the rest of the page shows the defaults.
        """
        try:
            self.url_errors = self.controls.apply_query(query)
        except Exception as exc:  # noqa: BLE001 - a link must never blank the page
            log.warning("URL query not applied: %s: %s", type(exc).__name__, exc)
            self.url_errors = [f"the link's settings could not be applied ({type(exc).__name__}); the defaults are "
                               "shown"]

    def link_url(self, location) -> None:
        """Keep ``location.search`` equal to the view on screen (replacing any bad value at once;
        :func:`~osa_lab.dashboard.address.keep_address_on_view`)."""
        keep_address_on_view(location, self.controls, URL_PARAMETERS, self.controls.to_query)

    def _url_message(self, errors: list[str]) -> str:
        """The page's message about unusable link values: each one as literal text (a link's keys
        and values are typed by whoever wrote it and must never become markup or script)."""
        if not errors:
            return ""
        return ("**This link had settings that could not be used** (the address bar now shows what is on "
                "screen):\n\n" + "\n".join(f"- {markdown_literal(e)}" for e in errors))

    def stop(self) -> None:
        """Cancel this session's background work (the browser tab closed)."""
        self.jacobian_view.stop()
        self.state.stop_worker()

    # -- layout -----------------------------------------------------------------------------

    def _status(self, busy: bool, seconds: float, config: dict, from_cache: bool = False) -> str:
        if busy:
            return "⏳ computing…"
        if not config:
            return ""
        took = "from the cache" if from_cache else f"{seconds:.2f} s"
        return f"last sweep: {took} · {len(config['presets'])} presets × {config['seeds']} seeds"

    def _alpha_note(self, derived: bool, alpha: float, presets: list, tokens: int, dim: int, heads: object) -> str:
        if not derived:
            return ""
        from osa_lab.nn.attention import derived_alpha_init
        from osa_lab.nn.presets import get_preset

        parts = []
        for p in presets:
            if get_preset(p).attention == "osa":
                h = self.controls.heads_of(p)
                if int(dim) % h == 0:
                    parts.append(f"{p}: {derived_alpha_init(int(tokens), int(dim), int(dim) // h):.3g}")
        return ("derived α₀ = c√r/(√N+√d)² per OSA preset: " + ", ".join(parts)) if parts else ""

    def main(self) -> pn.Column:
        """The main area (also usable without the template)."""
        notes = pn.pane.Alert(pn.bind(lambda *_: "\n\n".join(self.controls.notes()), self.controls.param.presets,
                                      self.controls.param.heads),
                              alert_type="info", sizing_mode="stretch_width",
                              visible=pn.bind(lambda *_: bool(self.controls.notes()), self.controls.param.presets,
                                              self.controls.param.heads))
        return pn.Column(
            pn.pane.Alert(pn.bind(self._url_message, self.param.url_errors), alert_type="danger",
                          visible=pn.bind(bool, self.param.url_errors), sizing_mode="stretch_width"),
            message_pane(self.state.param.error),
            pn.Row(pn.pane.Alert(self.state.param.notice, alert_type="info", sizing_mode="stretch_width"),
                   pn.widgets.Button.from_param(self.state.param.cancel, color="danger", width=130,
                                                visible=self.state.param.running, align="center"),
                   visible=pn.bind(bool, self.state.param.notice), sizing_mode="stretch_width"),
            pn.pane.Alert(pn.bind(markdown_literal, self.controls.param.adjusted), alert_type="info",
                          visible=pn.bind(bool, self.controls.param.adjusted), sizing_mode="stretch_width"),
            notes,
            pn.Card(pn.pane.Markdown(HOW_TO_READ, sizing_mode="stretch_width"), title="How to read this",
                    collapsed=True, sizing_mode="stretch_width"),
            pn.pane.Markdown("### OSA check", height=40),
            self.check_view,
            self.tabs,
            sizing_mode="stretch_width",
        )

    def sidebar(self) -> list:
        """The sidebar: controls and a status line."""
        c = self.controls
        status = pn.pane.Markdown(pn.bind(self._status, self.state.param.busy, self.state.param.seconds,
                                          self.state.param.config, self.state.param.from_cache))
        alpha_note = pn.pane.Markdown(
            pn.bind(self._alpha_note, c.param.derived_alpha, c.param.alpha, c.param.presets, c.param.tokens,
                    c.param.dim, c.param.heads), styles={"font-size": "12px"})
        widgets = pn.Column(
            pn.widgets.MultiChoice.from_param(c.param.presets, label="presets"),
            throttled(c, "depth", pn.widgets.IntSlider, label="depth"),
            throttled(c, "tokens", pn.widgets.DiscreteSlider, label="tokens N"),
            throttled(c, "dim", pn.widgets.DiscreteSlider, label="width d"),
            pn.widgets.Select.from_param(c.param.heads, label="heads"),
            pn.widgets.Checkbox.from_param(c.param.derived_alpha),
            pn.widgets.FloatInput.from_param(c.param.alpha, label="α (OSA), typed exactly", step=0.01,
                                             disabled=c.param.derived_alpha),
            alpha_note,
            throttled(c, "seeds", pn.widgets.IntSlider, label="seeds"),
            pn.widgets.Select.from_param(c.param.metric, label="metric"),
            sizing_mode="stretch_width",
        )
        return [widgets, status]

    def template(self) -> pn.template.BootstrapTemplate:
        """The page: a BootstrapTemplate (served offline: Panel bundles Bootstrap and loads no font).

        Not a FastListTemplate: its Fast web components add 0.9 MB of script to the page. Measured
        side by side (BENCHMARKS.md), a page with Fast, every BokehJS bundle, WebGL and every tab
        built drew its first plot in 4.47 s against 3.48 s for this one while the 2-core machine
        was contended, and within 0.1 s of it (2.9 s) while it was quiet.
        """
        return pn.template.BootstrapTemplate(
            title="osa_lab · Orthogonal vs softmax self-attention across depth",
            sidebar=self.sidebar(),
            main=[self.main()],
            header_background=ACCENT,
            sidebar_width=330,
        )

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Row(pn.Column(*self.sidebar(), width=330), self.main())


def build_app(**params) -> Dashboard:
    """A dashboard for one session; keyword arguments set the initial controls (e.g. ``depth=4``)."""
    return Dashboard(**params)


def limit_torch_threads() -> int:
    """Use ``OSA_DASHBOARD_TORCH_THREADS`` (default 1) intra-op threads in the server process.

    Sessions compute concurrently in worker threads on small matrices; on a 2-core machine shared
    with other work, torch's own thread pool spin-waits and made a depth-24 sweep 15× slower
    (16 s with 2 threads vs 1.1 s with 1, measured under load). Returns the thread count set.
    """
    import os

    import torch

    threads = int(os.environ.get("OSA_DASHBOARD_TORCH_THREADS", "1"))
    torch.set_num_threads(max(threads, 1))
    return torch.get_num_threads()



def canvas_figures() -> None:
    """Draw the served figures on an HTML canvas, not WebGL (HoloViews' default).

    The figures are a few lines and bands per preset, for which WebGL brings nothing; a browser
    without a GPU (a headless or remote session, software GL) drew the first page ≈ 0.25 s later
    with it (websocket open to rendered 0.94–1.04 s with WebGL, 0.69–0.75 s without, 2–3 page loads each;
    BENCHMARKS.md), and its ``bokeh-gl`` path logged GPU-stall warnings.
    """
    hv.renderer("bokeh").webgl = False


def prewarm() -> None:
    """Fill the process-wide caches with the default view (first sweep and figure), once per process.

    Runs when the server starts with ``panel serve --warm`` (or else in the first session), so
    later first loads find the default settings computed.
    """
    global _WARM
    with _WARM_LOCK:
        if _WARM:
            return
        _WARM = True
    start = time.perf_counter()
    app = Dashboard(compute_now=False)
    app.controls.validate()
    cfg = app.controls.config()
    for _, args in app.controls.check_groups():
        compute_osa_check(*args)
    app.state._run_sync(lambda: (cfg, compute_sweep(SweepSettings.of(cfg))), lambda v: app.state.param.update(
        config=v[0], metrics=v[1][0], spectra=v[1][1]))
    for cache_key, build in app.rank_view.specs().values():
        with FIGURE_LOCK:
            hit = build()
            prepared(hit[0])
            FIGURES.put(cache_key, hit)
    log.info("dashboard caches warmed in %.1f s", time.perf_counter() - start)


def serve_session() -> Dashboard:
    """Build this browser session's dashboard and mark its template servable (``panel serve``).

    Called by the entry script once per session. The first call of a server process limits
    torch's threads, installs the SIGTERM handler and the exit hook that stop Jacobian workers,
    and warms the caches (:func:`prewarm`).
    """
    serve_resources_locally()
    log_to_server_output()
    limit_torch_threads()
    canvas_figures()
    pn.extension("tabulator", sizing_mode="stretch_width")
    _install_process_hooks()
    if wants_runs_view(pn.state.session_args):
        from osa_lab.dashboard.runs_view import RunsView

        runs = RunsView()
        runs.apply_url(pn.state.session_args or {})  # before the page is built: its notices name bad filters
        runs.template().servable()

        def link(view: RunsView = runs) -> None:
            if pn.state.location is not None:
                view.link_url(pn.state.location)

        pn.state.onload(link)
        return runs
    prewarm()
    dashboard = Dashboard(compute_now=False)
    if pn.state.session_args:
        dashboard.apply_url(pn.state.session_args)
    dashboard.show_cached()  # pre-warmed or earlier settings: drawn in the first document
    pn.state.on_session_destroyed(lambda _ctx, d=dashboard: d.stop())
    dashboard.template().servable()

    def on_load(d: Dashboard = dashboard) -> None:
        if pn.state.location is not None:
            d.link_url(pn.state.location)  # after the browser's own location has arrived
        d.state.refresh()
        d.check_view.refresh()

    pn.state.onload(on_load)
    return dashboard


def wants_runs_view(query: Mapping[str, Any]) -> bool:
    """Whether the page shows the Runs view: ``?view=runs``, or ``osa-lab dashboard --results DIR``
    without another ``view`` in the link."""
    import os

    from osa_lab.dashboard.runs_view import RESULTS_ENV

    views = [v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in (query or {}).get("view", [])]
    if views:
        return views[-1] == "runs"
    return bool(os.environ.get(RESULTS_ENV))


def log_to_server_output() -> None:
    """Let the dashboard's INFO messages (caches warmed)
    reach the server's log, beside Bokeh's own lines, once per process.

    ``panel serve`` configures the root logger (Bokeh's ``basicConfig``) but raises only the
    ``bokeh`` logger to INFO; the ``osa_lab`` logger is raised to INFO too unless a level was
    set for it. Without any handler (the app run another way) one is added for stderr.
    """
    package = logging.getLogger("osa_lab")
    if package.level == logging.NOTSET:
        package.setLevel(logging.INFO)
    if not package.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        package.addHandler(handler)


def serve_resources_locally() -> str | None:
    """Make every stylesheet of this session's document point at the app's own server.

    Panel rewrites its CDN stylesheet URLs to the server's copies only while rendering the HTML
    page (from the document's ``dist_url`` template variable). A session that Bokeh creates
    *without* that page — the page's websocket arrived after its first session had been
    discarded as unused, e.g. on a loaded machine or after the server's unused-session lifetime
    — built its models with the CDN URLs: the page then fetched Panel's CSS from the internet
    (fails offline). Setting ``dist_url`` before any model is built closes that path. Returns the
    URL prefix set (``None`` outside a server session).
    """
    from panel.io.resources import LOCAL_DIST

    doc = pn.state.curdoc
    if doc is None or doc.session_context is None:
        return None
    rel = pn.state.rel_path
    dist_url = f"{rel}/{LOCAL_DIST}" if rel else LOCAL_DIST
    doc.template_variables["dist_url"] = dist_url
    return dist_url


_HOOKS = {"atexit": False}


def _install_process_hooks() -> None:
    """Stop Jacobian workers at exit; SIGTERM stops them and exits at once.

    Checked per session because the Bokeh server installs its own (graceful, slow under load)
    SIGTERM handler after a ``--warm`` run of the entry script.
    """
    if not _HOOKS["atexit"]:
        _HOOKS["atexit"] = True
        atexit.register(jobs.cancel_all)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is not jobs.exit_now:
        signal.signal(signal.SIGTERM, jobs.exit_now)


__all__ = [
    "ACCENT", "FIGURES", "JACOBIANS", "PRESET_HEADS", "Controls", "Dashboard", "JacobianView",
    "OSACheckView", "RankCollapseView", "SpectraView", "SweepState", "build_app", "canvas_figures", "compute_osa_check",
    "compute_sweep", "compute_unit", "jacobian_layers", "limit_torch_threads", "log_to_server_output",
    "prewarm",
    "serve_resources_locally", "serve_session",
]
