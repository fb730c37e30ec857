"""osa_lab dashboard: rank collapse, singular-value spectra and Jacobian conditioning, OSA vs SSA.

Serve it with::

    panel serve dashboards/osa_dashboard.py --warm --show      # or: osa-lab dashboard

Layout (docs/dashboard.md): a :class:`~panel.template.FastListTemplate` whose sidebar holds the
:class:`Controls` (presets, depth, tokens N, width d, heads, α, seeds, metric) and whose main
area holds the OSA-check badges and one tab per view:

* :class:`OSACheckView`: orthogonality and dense-vs-low-rank error badges (:mod:`osa_lab.checks`);
* :class:`RankCollapseView`: the chosen metric against layer, mean and band over seeds;
* :class:`SpectraView`: spectra heatmaps per preset (shared log colour scale) and selected layers;
* :class:`JacobianView`: κ across depth and the end-to-end Jacobian's singular-value histogram.

Everything that defines what is on screen (presets, tab, site, scale, metric, Jacobian mode and
scope, sizes) lives in :class:`Controls` and in the page URL (:meth:`Controls.to_query`,
:meth:`Controls.apply_query`): a copied link restores the view, and a bad URL value is named in
a message and replaced in the address bar. Only the visible tab is drawn; hidden tabs redraw
when opened. Sweeps and figures are cached process-wide on their primitive settings, so
revisiting settings is a cache hit for every session. Sweeps and figure builds run in daemon
threads (never blocking the event loop or the server's exit); Jacobians run in a worker process
(:mod:`osa_lab.dashboard_jobs`) with a time estimate, progress, a *Cancel* button, and are
stopped when their session closes or the server gets SIGTERM. The page loads no resource from
the internet (:class:`OfflineFast`).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import hashlib
import io
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import holoviews as hv
import pandas as pd
import panel as pn
import param
from panel.io.resources import CDN_DIST
from panel.theme.fast import Fast

from osa_lab import dashboard_jobs as jobs
from osa_lab.errors import ConfigurationError, OSAInputError, UnknownNameError
from osa_lab.plots import depth as plots

log = logging.getLogger("osa_lab.dashboard")

#: Errors whose message is shown to the user as is (bad or too-expensive settings).
USER_ERRORS: tuple[type[BaseException], ...] = (ConfigurationError, OSAInputError, UnknownNameError, ValueError,
                                                MemoryError)

#: Controls mirrored in the page URL's query string, in this order (shareable links).
URL_PARAMETERS = ("presets", "view", "depth", "tokens", "dim", "heads", "seeds", "derived_alpha", "alpha", "metric",
                  "site", "scale", "jacobian", "scope", "points")

TOKENS = [4, 8, 16, 32, 48, 64, 96, 128, 192, 256]
DIMS = [4, 8, 16, 24, 32, 48, 64, 96, 128]
HEAD_CHOICES = [1, 2, 4, 8, 16]
#: The heads value meaning "each preset's own head count" (1 for the pure stacks, 4 otherwise).
PRESET_HEADS = "preset default"

METRIC_LABELS = {
    "relative residual (rank collapse)": "relative_residual",
    "token cosine similarity": "token_cosine",
    "stable rank": "stable_rank",
    "effective rank": "effective_rank",
    "condition number κ(X)": "condition_number",
}
SITE_LABELS = {"whole block": "block", "attention sub-layer": "attention"}
SCALE_LABELS = {"auto": "auto", "log": "log", "linear": "linear"}
JACOBIAN_LABELS = {"auto (cheaper)": "auto", "exact": "exact", "matrix-free": "matrix-free"}
SCOPE_LABELS = {"end-to-end ∂X_l/∂X_0": "end_to_end", "single block": "layer"}
VIEW_LABELS = {"Rank collapse": "rank", "Spectra": "spectra", "Jacobian": "jacobian"}
VIEWS = list(VIEW_LABELS.values())

#: Jacobian requests estimated below this many seconds start without pressing *Compute*.
AUTO_JACOBIAN_SECONDS = 8.0


def _preset_names() -> list[str]:
    from osa_lab.presets import preset_names

    return preset_names()


def preset_heads(name: str) -> int:
    """The head count a preset uses by default (:mod:`osa_lab.presets`)."""
    from osa_lab.presets import get_preset

    return int(get_preset(name).heads)


def _label(labels: Mapping[str, str], value: str) -> str:
    return next((k for k, v in labels.items() if v == value), str(value))


class OfflineFast(Fast):
    """The Fast design without its Google Fonts stylesheet, every script served by the app.

    ``Fast`` lists ``fonts.googleapis.com/css?family=Open+Sans``; offline that request fails.
    The text falls back to the system sans-serif font. The design's own module is pointed at
    Panel's bundled copy (a subclass would otherwise look for it under its own name).
    """

    _resources = {
        **Fast._resources,
        "font": {},
        "js_modules": {
            **Fast._resources["js_modules"],
            "fast-design": f"{CDN_DIST}bundled/fast/js/fast_design.js",
        },
    }


# ---------------------------------------------------------------------------------------------
# process-wide caches (primitive keys only) and background execution
# ---------------------------------------------------------------------------------------------


#: Serialises the model computations of all sessions. The models switch torch's *global* default
#: dtype while they build (osa_lab.models), so two sweeps in parallel threads can mix float32 and
#: float64 weights; one computation at a time also avoids oversubscribing small machines. This
#: module runs once per session, so the lock lives in the process-wide ``pn.state.cache``.
COMPUTE_LOCK: threading.Lock = pn.state.cache.setdefault("osa_lab.dashboard.compute_lock", threading.Lock())
#: Serialises building HoloViews objects (their option trees are global state).
FIGURE_LOCK: threading.Lock = pn.state.cache.setdefault("osa_lab.dashboard.figure_lock", threading.Lock())


class LRU:
    """A small thread-safe least-recently-used cache shared by all sessions of the process."""

    def __init__(self, size: int) -> None:
        self.size, self._data, self._lock = size, collections.OrderedDict(), threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            if key not in self._data:
                return None
            self._data.move_to_end(key)
            return self._data[key]

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def __contains__(self, key: Any) -> bool:
        with self._lock:
            return key in self._data

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


#: Built figures (HoloViews objects and the reduced tables they draw), keyed by view, settings
#: and options: returning to computed settings needs no rebuild.
FIGURES: LRU = pn.state.cache.setdefault("osa_lab.dashboard.figures", LRU(96))
#: Jacobian results per :class:`osa_lab.dashboard_jobs.Unit` (preset × seed × resolved method).
JACOBIANS: LRU = pn.state.cache.setdefault("osa_lab.dashboard.jacobians", LRU(256))


@pn.cache(max_items=32)
def compute_sweep(
    presets: tuple[str, ...], depth: int, tokens: int, dim: int, heads: int | None, alpha: float | None, seeds: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tidy metrics and spectra tables of one configuration (:func:`osa_lab.analysis.sweep`).

    ``heads=None`` gives every preset its own head count (the pure stacks one head).
    """
    from osa_lab.analysis import sweep

    with COMPUTE_LOCK:
        result = sweep(
            list(presets), depths=[depth], tokens=[tokens], dims=[dim], heads=[heads], alphas=[alpha],
            seeds=list(range(seeds)), site="both", progress=False,
        )
    return result.metrics, result.spectra


@pn.cache(max_items=64)
def compute_osa_check(tokens: int, dim: int, heads: int, alpha: float | None) -> dict[str, object]:
    """The OSA check of :mod:`osa_lab.checks` for these sizes (seed 0, float32)."""
    from osa_lab.checks import osa_check

    with COMPUTE_LOCK:
        return osa_check(tokens, dim, heads, alpha, seed=0)


#: Computes one Jacobian unit in this process (tests and scripts; served sessions use a worker).
compute_unit = jobs.compute_unit


def jacobian_layers(depth: int, points: int) -> list[int]:
    """``points`` layers from 1 to ``depth``, evenly spaced, always including the last."""
    points = max(1, min(points, depth))
    return sorted({round(depth * (i + 1) / points) for i in range(points)})


def _describe(exc: BaseException) -> str:
    """A one-paragraph message for the page (never a traceback)."""
    if isinstance(exc, USER_ERRORS):
        return str(exc)
    log.error("dashboard computation failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
    return f"The computation failed ({type(exc).__name__}: {exc}). The last good figures are kept."


def _served() -> bool:
    return pn.state.curdoc is not None and pn.state.curdoc.session_context is not None


async def in_daemon_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a daemon thread and await its result.

    Unlike ``asyncio.to_thread`` (whose pool threads the interpreter joins at exit) a daemon
    thread never delays the server's shutdown on SIGTERM.
    """
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if not future.done():
            future.set_exception(exc) if exc is not None else future.set_result(value)

    def run() -> None:
        try:
            value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, value, None)

    threading.Thread(target=run, daemon=True, name="osa-lab-dashboard").start()
    return await future


# ---------------------------------------------------------------------------------------------
# controls: everything on screen, mirrored in the URL
# ---------------------------------------------------------------------------------------------


class Controls(param.Parameterized):
    """The settings of one session: sizes, presets, the visible tab and every display option."""

    presets = param.ListSelector(default=["pure-ssa", "pure-osa"], objects=[], doc="Presets to compare (two or more).")
    depth = param.Integer(default=12, bounds=(1, 48), doc="Number of blocks.")
    tokens = param.Selector(default=32, objects=TOKENS, doc="Tokens N.")
    dim = param.Selector(default=32, objects=DIMS, doc="Width d.")
    heads = param.Selector(default=PRESET_HEADS, objects=[PRESET_HEADS, *HEAD_CHOICES],
                           doc="Attention heads: each preset's own count, or one count for all (divisors of d).")
    derived_alpha = param.Boolean(default=True, label="derived α₀ (OSA init)",
                                  doc="Use the derived OSA initialisation α₀ instead of the α slider.")
    alpha = param.Number(default=0.05, bounds=(0.0, 2.0), step=1e-5, label="α (OSA)",
                         doc="OSA α when 'derived α₀' is off (SSA presets ignore it); shows α₀ while derived.")
    seeds = param.Integer(default=2, bounds=(1, 5), doc="Random seeds; plots show the mean and min–max band.")
    metric = param.Selector(default="relative_residual", objects=METRIC_LABELS, doc="Depth-wise metric.")
    view = param.Selector(default="rank", objects=VIEWS, doc="The visible tab.")
    site = param.Selector(default="block", objects=SITE_LABELS, doc="Hidden state after the block or attention.")
    scale = param.Selector(default="auto", objects=SCALE_LABELS, label="y scale", doc="Log y where values span decades.")
    jacobian = param.Selector(default="auto", objects=JACOBIAN_LABELS, doc="Jacobian computation.")
    scope = param.Selector(default="end_to_end", objects=SCOPE_LABELS, doc="κ of ∂X_l/∂X_0 or of block l alone.")
    points = param.Integer(default=6, bounds=(1, 48), label="layers evaluated",
                           doc="Layers (evenly spaced, last included) at which κ is computed.")

    def __init__(self, **params):
        self.param.presets.objects = _preset_names()
        super().__init__(**params)
        self._sync_heads_choices()
        self._show_derived_alpha()

    # -- derived values -------------------------------------------------------------------

    @property
    def alpha_value(self) -> float | None:
        """α passed to the analyses: ``None`` for the derived initialisation."""
        return None if self.derived_alpha else float(self.alpha)

    @property
    def heads_value(self) -> int | None:
        """Heads passed to the analyses: ``None`` for each preset's own count."""
        return None if self.heads == PRESET_HEADS else int(self.heads)

    def heads_of(self, preset: str) -> int:
        """The head count ``preset`` runs with under the current settings."""
        return preset_heads(preset) if self.heads == PRESET_HEADS else int(self.heads)

    def check_heads(self) -> int:
        """Heads of the OSA check: those of the first OSA preset shown (1 if none)."""
        from osa_lab.presets import get_preset

        for p in self.presets:
            if get_preset(p).attention == "osa":
                return self.heads_of(p)
        return self.heads_value or 1

    def derived_alpha0(self) -> float:
        """The derived α₀ of the OSA check's heads at the current N and d."""
        from osa_lab.layers import derived_alpha_init

        heads = self.check_heads()
        return derived_alpha_init(int(self.tokens), int(self.dim), int(self.dim) // heads)

    @param.depends("dim", watch=True)
    def _sync_heads_choices(self) -> None:
        """Offer only head counts that divide d."""
        valid = [h for h in HEAD_CHOICES if int(self.dim) % h == 0]
        self.param.heads.objects = [PRESET_HEADS, *valid]
        if self.heads != PRESET_HEADS and self.heads not in valid:
            self.heads = PRESET_HEADS

    @param.depends("derived_alpha", "tokens", "dim", "heads", "presets", watch=True)
    def _show_derived_alpha(self) -> None:
        """While 'derived α₀' is ticked the (disabled) α slider shows the value that is used."""
        if self.derived_alpha:
            try:
                self.alpha = float(f"{self.derived_alpha0():.5g}")
            except Exception:  # noqa: BLE001 - impossible sizes are reported by validate()
                pass

    def config(self) -> dict[str, object]:
        """The primitive configuration the analyses are cached on."""
        return dict(presets=tuple(self.presets), depth=int(self.depth), tokens=int(self.tokens), dim=int(self.dim),
                    heads=self.heads_value, alpha=self.alpha_value, seeds=int(self.seeds))

    def validate(self) -> None:
        """Raise :class:`ConfigurationError` with a user-facing message for impossible settings."""
        if len(self.presets) < 2:
            raise ConfigurationError("choose at least two presets to compare")
        for p in self.presets:
            h = self.heads_of(p)
            if int(self.dim) % h:
                divisors = [x for x in HEAD_CHOICES if int(self.dim) % x == 0]
                raise ConfigurationError(
                    f"width d = {self.dim} is not divisible by heads = {h} ({p}): each head gets d / heads value "
                    f"columns. Choose heads from {divisors} or change d."
                )

    def describe(self, cfg: Mapping[str, object] | None = None) -> str:
        """The settings of ``cfg`` (default: the current ones) as a short line for figure titles."""
        cfg = cfg or self.config()
        heads = "preset heads" if cfg["heads"] is None else f"{cfg['heads']} heads"
        alpha = "α₀ derived" if cfg["alpha"] is None else f"α = {cfg['alpha']:.4g}"
        seeds = f"{cfg['seeds']} seed" + ("s" if cfg["seeds"] != 1 else "")
        return f"depth {cfg['depth']} · N {cfg['tokens']} · d {cfg['dim']} · {heads} · {alpha} · {seeds}"

    def notes(self) -> list[str]:
        """Where the settings break an invariant the docs state (shown on the page)."""
        out = []
        if "pure-osa" in self.presets and self.heads != PRESET_HEADS and int(self.heads) > 1:
            out.append(
                f"pure-osa with {self.heads} heads is **not** spectrum preserving: only a single OSA head keeps every "
                "singular value of X (docs/dashboard.md); the heads of a multi-head layer are rotated by "
                "different matrices, so its stable rank and κ(X) drift. Choose *preset default* (1 head) for "
                "the flat curve."
            )
        return out

    # -- the URL ----------------------------------------------------------------------------

    def to_query(self) -> dict[str, str]:
        """The URL query of the current view (α only when it is not derived)."""
        q: dict[str, str] = {}
        for name in URL_PARAMETERS:
            value = getattr(self, name)
            if name == "alpha" and self.derived_alpha:
                continue
            if name == "presets":
                q[name] = ",".join(value)
            elif name == "derived_alpha":
                q[name] = "true" if value else "false"
            elif name == "heads":
                q[name] = "preset" if value == PRESET_HEADS else str(value)
            else:
                q[name] = str(value)
        return q

    def apply_query(self, query: Mapping[str, str | list[str] | bytes | list[bytes]]) -> list[str]:
        """Set the controls from URL query values; returns one message per value that was not used.

        Accepts ``{name: "value"}`` or Bokeh's ``{name: [b"value"]}``. Every value is checked
        before anything is set; bad values are named with the valid choices and left out.
        """
        errors: list[str] = []
        updates: dict[str, object] = {}
        for key, raw in query.items():
            if isinstance(raw, list):
                raw = raw[-1] if raw else ""
            if isinstance(raw, bytes):
                raw = raw.decode("utf-8", "replace")
            text = str(raw).strip()
            if key not in URL_PARAMETERS:
                errors.append(f"unknown URL parameter `{key}` (known: {', '.join(URL_PARAMETERS)})")
                continue
            try:
                updates[key] = self._parse(key, text)
            except ValueError as exc:
                errors.append(f"`{key}={text}` was ignored: {exc}")
        if "alpha" in updates and "derived_alpha" not in updates:
            updates["derived_alpha"] = False  # an explicit α means: use it
        if "dim" in updates or "heads" in updates:
            dim = int(updates.get("dim", self.dim))
            heads = updates.get("heads", self.heads)
            if heads != PRESET_HEADS and dim % int(heads):
                valid = [h for h in HEAD_CHOICES if dim % h == 0]
                errors.append(f"`heads={heads}` was ignored: d = {dim} is not divisible by {heads}; valid: "
                              f"preset, {', '.join(map(str, valid))}")
                updates.pop("heads", None)
        ordered = {k: updates[k] for k in ("dim", "derived_alpha", *URL_PARAMETERS) if k in updates}
        self.param.update(**ordered)
        return errors

    def _parse(self, key: str, text: str) -> object:
        p = self.param[key]
        if key == "presets":
            names = [x.strip() for x in text.split(",") if x.strip()]
            unknown = [x for x in names if x not in p.objects]
            if unknown:
                raise ValueError(f"unknown preset(s) {', '.join(unknown)}; valid: {', '.join(p.objects)}")
            if len(set(names)) < 2:
                raise ValueError("choose at least two presets, comma separated (e.g. vit,pure-osa)")
            return list(dict.fromkeys(names))
        if key == "derived_alpha":
            if text.lower() in ("true", "1", "yes", "on"):
                return True
            if text.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError("use true or false")
        if key == "heads":
            if text.lower() in ("preset", "default", PRESET_HEADS):
                return PRESET_HEADS
            if text.isdigit() and int(text) in HEAD_CHOICES:
                return int(text)
            raise ValueError(f"use preset or one of {', '.join(map(str, HEAD_CHOICES))}")
        if isinstance(p, param.Selector):
            values = list(p.objects.values()) if isinstance(p.objects, dict) else list(p.objects)
            for v in values:
                if str(v) == text:
                    return v
            raise ValueError(f"valid values: {', '.join(map(str, values))}")
        if isinstance(p, param.Integer):
            if not text.lstrip("-").isdigit():
                raise ValueError("not an integer")
            value = int(text)
        else:
            try:
                value = float(text)
            except ValueError:
                raise ValueError("not a number") from None
        lo, hi = p.bounds
        if value < lo or value > hi:
            raise ValueError(f"outside {lo}…{hi}")
        return value


class Job(param.Parameterized):
    """Runs a computation off the event loop when served (synchronously otherwise), keeping the
    last good result on error and dropping results that a newer request has overtaken."""

    busy = param.Boolean(default=False, doc="A computation is running.")
    error = param.String(default="", doc="Message of the last failed computation ('' if it succeeded).")
    seconds = param.Number(default=0.0, doc="Wall time of the last successful computation.")

    def __init__(self, **params):
        super().__init__(**params)
        self._generation = 0

    def run(self, compute: Callable[[], object], apply: Callable[[object], None]) -> None:
        """Compute now (tests, scripts) or in a daemon thread, applying on the server's loop."""
        self._generation += 1
        if _served():
            generation = self._generation

            async def task() -> None:
                await self._run_async(generation, compute, apply)

            self.busy = True
            pn.state.execute(task)
        else:
            self._run_sync(compute, apply)

    def _run_sync(self, compute: Callable[[], object], apply: Callable[[object], None]) -> None:
        start = time.perf_counter()
        try:
            value = compute()
            self.seconds = time.perf_counter() - start
            self.error = ""
            apply(value)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the page
            self.error = _describe(exc)

    async def _run_async(self, generation: int, compute, apply) -> None:
        start = time.perf_counter()
        try:
            value = await in_daemon_thread(compute)
        except Exception as exc:  # noqa: BLE001
            if generation == self._generation:
                self.error = _describe(exc)
                self.busy = False
            return
        if generation != self._generation:
            return  # a newer request is running; its result will be shown
        try:
            self.seconds = time.perf_counter() - start
            self.error = ""
            apply(value)
        except Exception as exc:  # noqa: BLE001
            self.error = _describe(exc)
        finally:
            self.busy = False


class SweepState(Job):
    """The current sweep of one session: tidy metrics and spectra tables of the last good settings."""

    controls = param.ClassSelector(class_=Controls)
    metrics = param.DataFrame(default=None, allow_None=True, doc="Tidy metrics table (osa_lab.analysis).")
    spectra = param.DataFrame(default=None, allow_None=True, doc="Tidy spectra table (osa_lab.analysis).")
    config = param.Dict(default={}, doc="Configuration of the tables shown.")

    @param.depends("controls.presets", "controls.depth", "controls.tokens", "controls.dim", "controls.heads",
                   "controls.derived_alpha", "controls.alpha", "controls.seeds", watch=True)
    def refresh(self) -> None:
        """Recompute for the current controls (cached); on error keep the tables and set ``error``."""
        controls = self.controls
        try:
            controls.validate()
        except ConfigurationError as exc:
            self._generation += 1  # drop any result still running for earlier settings
            self.error = str(exc)
            return
        cfg = controls.config()
        if cfg == self.config and self.metrics is not None and not self.busy:
            self.error = ""
            return  # e.g. the α slider following α₀ while derived

        def compute():
            return cfg, compute_sweep(**cfg)

        def apply(value):
            cfg, (metrics, spectra) = value
            with param.parameterized.batch_call_watchers(self):
                self.config = cfg
                self.metrics = metrics
                self.spectra = spectra

        self.run(compute, apply)


# ---------------------------------------------------------------------------------------------
# views
# ---------------------------------------------------------------------------------------------


def _placeholder(text: str) -> hv.Curve:
    """An empty figure with ``text`` as its title (HoloViews panes need a HoloViews object)."""
    return hv.Curve([]).opts(title=text, xaxis=None, yaxis=None, toolbar=None, height=120, backend="bokeh").opts(
        title=text, xaxis=None, yaxis=None, backend="matplotlib")


def _message_pane(*errors) -> pn.pane.Alert:
    """One alert showing the distinct non-empty bound messages (each message once)."""

    def text(*messages: str) -> str:
        return "\n\n".join(dict.fromkeys(m for m in messages if m))

    bound = pn.bind(text, *errors)
    return pn.pane.Alert(bound, alert_type="warning", visible=pn.bind(bool, bound), sizing_mode="stretch_width")


def _radio(parameter: param.Parameter, width: int) -> pn.widgets.RadioButtonGroup:
    """A radio group whose selected option is filled in the accent colour (others outlined)."""
    return pn.widgets.RadioButtonGroup.from_param(parameter, button_type="primary", button_style="outline",
                                                  width=width, height=34, sizing_mode="fixed")


def _small_title(obj: hv.core.Dimensioned) -> hv.core.Dimensioned:
    """Titles that carry the settings are long: a smaller title font in the browser."""
    return obj.opts(fontsize={"title": "10pt"}, backend="bokeh")


def _digest(table: pd.DataFrame | None) -> str:
    if table is None:
        return ""
    return hashlib.sha1(pd.util.hash_pandas_object(table, index=False).values.tobytes()).hexdigest()[:16]


class _FigureHolder(pn.viewable.Viewer):
    """Base of the views: draws its figures only while ``active``; stale ones redraw when shown.

    ``figures[key]`` is always the object on screen in ``panes[key]`` (placeholders included),
    so a PNG download is the figure shown (:meth:`png`).
    """

    controls = param.ClassSelector(class_=Controls)
    active = param.Boolean(default=False, doc="The view's tab is visible.")

    def __init__(self, **params):
        super().__init__(**params)
        self.figures: dict[str, hv.core.Dimensioned] = {}
        self.tables: dict[str, pd.DataFrame | None] = {}
        self.panes: dict[str, pn.pane.HoloViews] = {}
        self.job = Job()
        self.stale = True
        self._layout: pn.viewable.Viewable | None = None

    # subclasses: the figures to draw, {key: (cache key or None, builder -> (figure, table))}
    def specs(self) -> dict[str, tuple[tuple | None, Callable[[], tuple[hv.core.Dimensioned, Any]]]]:
        raise NotImplementedError

    def _build(self) -> pn.viewable.Viewable:
        raise NotImplementedError

    def __panel__(self) -> pn.viewable.Viewable:
        """The view's layout, built once."""
        if self._layout is None:
            self._layout = self._build()
            self.stale = True
            self.redraw()
        return self._layout

    def _pane(self, key: str, **kwargs) -> pn.pane.HoloViews:
        pane = pn.pane.HoloViews(_placeholder("Computing…"), backend="bokeh", sizing_mode="stretch_width",
                                 loading=self.job.param.busy, **kwargs)
        self.panes[key] = pane
        self.figures[key] = pane.object
        return pane

    @param.depends("active", watch=True)
    def _on_active(self) -> None:
        if self.active and self.stale:
            self._activated()

    def _activated(self) -> None:
        self.redraw()

    def redraw(self) -> None:
        """Build the figures of the current data and options (cached) and show them."""
        if not self.active or not self.panes:
            self.stale = True
            return
        self.stale = False
        specs = self.specs()
        if not specs:
            return

        def compute():
            out = {}
            for key, (cache_key, build) in specs.items():
                hit = FIGURES.get(cache_key) if cache_key is not None else None
                if hit is None:
                    with FIGURE_LOCK:
                        hit = build()
                    if cache_key is not None:
                        FIGURES.put(cache_key, hit)
                out[key] = hit
            return out

        def apply(out):
            for key, (obj, table) in out.items():
                self.figures[key], self.tables[key] = obj, table
                self.panes[key].object = obj

        self.job.run(compute, apply)

    def png(self, key: str) -> bytes:
        """PNG of the figure on screen in pane ``key``; its title goes into the PNG's metadata."""
        obj = self.figures.get(key)
        if obj is None:
            raise ConfigurationError("no figure to export yet")
        meta = {"Title": plots.figure_title(obj), "Description": f"data {_digest(self.tables.get(key))}",
                "Software": "osa_lab dashboard"}
        return plots.png_bytes(obj, metadata=meta)

    def _png_download(self, key: str, filename: str) -> pn.widgets.FileDownload:
        """A PNG button of pane ``key`` (rendered off the event loop, with a loading indicator)."""
        button = pn.widgets.FileDownload(filename=filename, label=f"PNG: {filename}", button_type="light",
                                         embed=False, width=260)

        async def callback() -> io.BytesIO:
            button.loading = True
            try:
                return io.BytesIO(await in_daemon_thread(lambda: self.png(key)))
            finally:
                button.loading = False

        button.callback = callback if _served() else (lambda: io.BytesIO(self.png(key)))
        return button


class RankCollapseView(_FigureHolder):
    """The chosen metric against layer, one curve per preset, min–max band over seeds."""

    state = param.ClassSelector(class_=SweepState)

    @param.depends("state.metrics", "controls.metric", "controls.site", "controls.scale", watch=True)
    def _changed(self) -> None:
        self.redraw()

    def specs(self):
        metrics, c = self.state.metrics, self.controls
        if metrics is None:
            return {}
        cfg, metric, site, scale = self.state.config, c.metric, c.site, c.scale
        settings = c.describe(cfg)

        def build():
            table = plots.metric_vs_depth_data(metrics, metric, site=site)
            logy = None if scale == "auto" else scale == "log"
            label = _label(METRIC_LABELS, metric)
            where = "after each block" if site == "block" else "after attention"
            title = f"{label} {where} · {settings}"
            return _small_title(plots.metric_vs_depth(metrics, metric, site=site, logy=logy, title=title)), table

        return {"metric": (("metric", tuple(sorted(cfg.items())), metric, site, scale), build)}

    def _csv(self) -> io.BytesIO:
        if self.state.metrics is None:
            raise ConfigurationError("no sweep yet")
        return io.BytesIO(self.state.metrics.to_csv(index=False).encode())

    def _spectra_csv(self) -> io.BytesIO:
        if self.state.spectra is None:
            raise ConfigurationError("no sweep yet")
        return io.BytesIO(self.state.spectra.to_csv(index=False).encode())

    def _build(self) -> pn.viewable.Viewable:
        fig = self._pane("metric", min_height=380)
        options = pn.Row(
            pn.pane.Markdown("hidden state after", margin=(12, 5, 0, 10), width=130, height=30, sizing_mode="fixed"),
            _radio(self.controls.param.site, 280),
            pn.pane.Markdown("y scale", margin=(12, 5, 0, 30), width=70, height=30, sizing_mode="fixed"),
            _radio(self.controls.param.scale, 220),
            sizing_mode="stretch_width",
        )
        downloads = pn.Row(
            pn.widgets.FileDownload(callback=self._csv, filename="osa_sweep_metrics.csv",
                                    label="CSV: tidy metrics of this sweep", button_type="primary", embed=False,
                                    width=260),
            pn.widgets.FileDownload(callback=self._spectra_csv, filename="osa_sweep_spectra.csv",
                                    label="CSV: tidy spectra of this sweep", button_type="light", embed=False,
                                    width=260),
            self._png_download("metric", "rank_collapse.png"),
        )
        return pn.Column(_message_pane(self.job.param.error), options, fig, downloads, sizing_mode="stretch_width",
                         name="Rank collapse")


class SpectraView(_FigureHolder):
    """Singular-value spectra across depth: heatmaps per preset and selected layers as lines."""

    state = param.ClassSelector(class_=SweepState)
    layers = param.ListSelector(default=[], objects=[], doc="Layers drawn as lines (empty: a default choice).")

    @param.depends("state.spectra", watch=True, on_init=True)
    def _update_layers(self) -> None:
        spectra = self.state.spectra
        if spectra is None:
            return
        available = sorted(int(x) for x in spectra["layer"].unique())
        self.param.layers.objects = available
        kept = [x for x in self.layers if x in available]
        if kept != list(self.layers):
            self.layers = kept

    @param.depends("state.spectra", "layers", "controls.site", watch=True)
    def _changed(self) -> None:
        self.redraw()

    def specs(self):
        spectra, c = self.state.spectra, self.controls
        if spectra is None:
            return {}
        cfg, site, layers = self.state.config, c.site, tuple(sorted(self.layers))
        n = len(cfg["presets"])
        width, cols = (max(250, 1000 // n), n) if n <= 3 else (320, 3)
        settings = c.describe(cfg)
        where = "after each block" if site == "block" else "after attention"
        key = tuple(sorted(cfg.items()))

        def heat():
            title = f"σᵢ/σ₁ across depth {where} · {settings}"
            return plots.spectra_heatmaps(spectra, site=site, title=title, panel_width=width, cols=cols), None

        def lines():
            title = f"normalised spectra of selected layers · {settings}"
            return plots.spectra_lines(spectra, layers=list(layers) or None, site=site, title=title,
                                       panel_width=width, cols=cols), None

        return {"heatmaps": (("heatmaps", key, site), heat), "lines": (("lines", key, site, layers), lines)}

    def _build(self) -> pn.viewable.Viewable:
        heat = self._pane("heatmaps", min_height=340)
        lines = self._pane("lines", min_height=380)
        chooser = pn.widgets.MultiChoice.from_param(self.param.layers, name="layers drawn as lines", width=400)
        downloads = pn.Row(self._png_download("heatmaps", "spectra_heatmaps.png"),
                           self._png_download("lines", "spectra_lines.png"))
        return pn.Column(_message_pane(self.job.param.error), heat, chooser, lines, downloads,
                         sizing_mode="stretch_width", name="Spectra")


class JacobianView(_FigureHolder):
    """κ of the Jacobian across depth and the end-to-end singular-value histogram.

    Computed only while the tab is open, per preset × seed *unit* (cached process-wide, so the
    modes share results: ``auto`` resolves to the cheaper of exact and matrix-free first). A
    request estimated under :data:`AUTO_JACOBIAN_SECONDS` starts at once; longer ones show the
    estimate and wait for *Compute Jacobians*. Served sessions compute in a worker process with
    progress and a *Cancel* button; closing the tab cancels it too.
    """

    seeds = param.Integer(default=1, bounds=(1, 5), label="Jacobian seeds", doc="Seeds (capped by the sidebar).")
    compute = param.Event(label="Compute Jacobians")
    cancel = param.Event(label="Cancel")
    running = param.Boolean(default=False, doc="A Jacobian job is running.")
    profile = param.DataFrame(default=None, allow_None=True)
    svals = param.DataFrame(default=None, allow_None=True)
    notice = param.String(default="", doc="Estimate, progress, or why nothing was computed.")
    shown = param.Dict(default={}, doc="Settings of the figures shown.")

    def __init__(self, **params):
        super().__init__(**params)
        self._job: jobs.JacobianJob | None = None

    # -- requests ---------------------------------------------------------------------------

    def units(self) -> tuple[list[jobs.Unit], str]:
        """The units of the current settings and the method that runs."""
        c = self.controls
        c.validate()
        cfg = c.config()
        method = jobs.resolve_method(c.jacobian, cfg["tokens"], cfg["dim"], cfg["depth"], c.points)
        layers = tuple(jacobian_layers(cfg["depth"], c.points))
        seeds = min(int(self.seeds), int(cfg["seeds"]))
        units = [jobs.Unit(p, cfg["depth"], cfg["tokens"], cfg["dim"], cfg["heads"], cfg["alpha"], s, method, layers)
                 for p in cfg["presets"] for s in range(seeds)]
        return units, method

    @param.depends("compute", watch=True)
    def _on_compute(self) -> None:
        self.request(force=True)

    @param.depends("cancel", watch=True)
    def _on_cancel(self) -> None:
        self.stop("Cancelled: the figures below are from earlier settings.")

    def stop(self, notice: str = "") -> None:
        """Cancel a running job (its worker process is terminated)."""
        if self._job is not None:
            self._job.cancel()
            self._job = None
        if self.running:
            self.running = False
            self.notice = notice

    @param.depends("controls.presets", "controls.depth", "controls.tokens", "controls.dim", "controls.heads",
                   "controls.derived_alpha", "controls.alpha", "controls.seeds", "controls.jacobian",
                   "controls.points", "seeds", watch=True)
    def _settings_changed(self) -> None:
        self.request()

    @param.depends("controls.scope", watch=True)
    def _scope_changed(self) -> None:
        self.redraw()

    def _activated(self) -> None:  # the tab opened: compute (or draw) what is missing
        self.request()

    def request(self, force: bool = False) -> None:
        """Show the current settings' Jacobians: from the cache, or computed (large ones on *Compute*)."""
        if not self.active or not self.panes:
            self.stale = True
            return
        self.stale = False
        self.stop()
        try:
            units, method = self.units()
        except ConfigurationError as exc:
            self.job.error = str(exc)
            return
        self.job.error = ""
        missing = [u for u in units if u not in JACOBIANS]
        if not missing:
            self.notice = ""
            self._show(units)
            return
        c = self.controls
        eta = jobs.estimate_seconds(len(missing), method, int(c.tokens), int(c.dim), int(c.depth), int(c.points))
        what = f"{len(missing)} {method} Jacobian profile{'s' if len(missing) > 1 else ''} (N·d = {c.tokens * c.dim})"
        if eta > AUTO_JACOBIAN_SECONDS and not force:
            self.notice = (f"{what}: estimated {jobs.format_seconds(eta)} on this machine. Press **Compute "
                           "Jacobians** to run them (*Cancel* stops them); the figures below are from earlier "
                           "settings.")
            return
        self.notice = f"Computing {what}, estimated {jobs.format_seconds(eta)}…"
        if _served():
            self._start(units, missing, eta)
        else:
            self._run_here(units, missing)

    def _run_here(self, units: list[jobs.Unit], missing: list[jobs.Unit]) -> None:
        try:
            for unit in missing:
                JACOBIANS.put(unit, compute_unit(unit))
        except Exception as exc:  # noqa: BLE001
            self.job.error = _describe(exc)
            self.notice = ""
            return
        self.notice = ""
        self._show(units)

    def _start(self, units: list[jobs.Unit], missing: list[jobs.Unit], eta: float) -> None:
        job = jobs.start_jacobian_job(missing)
        self._job, self.running = job, True
        SESSION_JOBS.add(job)
        start, done = time.perf_counter(), 0

        async def follow() -> None:
            nonlocal done
            try:
                while not job.finished:
                    await asyncio.sleep(0.2)
                    for kind, unit, result, _seconds in job.poll():
                        if kind == "unit":
                            JACOBIANS.put(unit, result)
                            done += 1
                        elif kind == "error":
                            if self._job is job:
                                self.job.error = _describe(result)
                                self.notice = ""
                    if self._job is job and not job.finished:
                        elapsed = time.perf_counter() - start
                        self.notice = (f"Computing Jacobians: {done}/{len(missing)} done, {elapsed:.0f} s elapsed "
                                       f"(estimated {jobs.format_seconds(eta)}). *Cancel* stops them.")
            finally:
                SESSION_JOBS.discard(job)
            if self._job is job:
                self._job, self.running = None, False
                if not job.cancelled and all(u in JACOBIANS for u in units):
                    self.notice = ""
                    self._show(units)

        pn.state.execute(follow)

    def _show(self, units: list[jobs.Unit]) -> None:
        results = [JACOBIANS.get(u) for u in units]
        profile = pd.concat([r[0] for r in results], ignore_index=True)
        svals = [r[1] for r in results if r[1] is not None]
        with param.parameterized.batch_call_watchers(self):
            self.shown = self.controls.config() | {"jacobian": units[0].method, "jseeds": len({u.seed for u in units})}
            self.profile = profile
            self.svals = pd.concat(svals, ignore_index=True) if len(svals) == len(results) else None
        self.redraw()

    # -- figures ----------------------------------------------------------------------------

    def methods_used(self) -> str:
        """'exact', 'matrix-free' or both, from the ``method`` column of the current profile."""
        if self.profile is None or "method" not in self.profile:
            return ""
        return ", ".join(sorted({str(m) for m in self.profile["method"].unique()}))

    def specs(self):
        profile, svals, scope = self.profile, self.svals, self.controls.scope
        if profile is None:
            return {}
        shown = dict(self.shown)
        method = self.methods_used()
        settings = self.controls.describe({**shown, "seeds": shown.get("jseeds", 1)})
        key = tuple(sorted((k, v) for k, v in shown.items()))

        def kappa():
            title = f"Jacobian κ across depth ({_label(SCOPE_LABELS, scope)}) [{method}] · {settings}"
            fig = _small_title(plots.kappa_vs_depth(profile, scope=scope, title=title))
            return fig, plots.kappa_vs_depth_data(profile, scope=scope)

        def histogram():
            if svals is None:
                return _placeholder(f"No histogram: the {method} method gives only σ_max and σ_min "
                                    f"(choose exact) · {settings}"), None
            title = f"Singular values of the end-to-end Jacobian [{method}] · {settings}"
            return _small_title(plots.jacobian_histogram(svals, title=title)), plots.jacobian_histogram_data(svals)

        return {"kappa": (("kappa", key, scope), kappa), "histogram": (("histogram", key), histogram)}

    def badge(self, profile: pd.DataFrame | None) -> str:
        """Which computation produced the figures."""
        used = self.methods_used()
        if not used:
            return ""
        how = {"exact": "exact (torch.func.jacrev, all singular values)",
               "matrix-free": "matrix-free (jvp/vjp + ARPACK: σ_max and σ_min only)"}
        return "**Jacobian computed:** " + "; ".join(how.get(m, m) for m in used.split(", "))

    def _build(self) -> pn.viewable.Viewable:
        kappa = self._pane("kappa", min_height=380)
        hist = self._pane("histogram", min_height=360)
        options = pn.Row(_radio(self.controls.param.jacobian, 330), _radio(self.controls.param.scope, 300))
        sizes = pn.Row(
            _throttled(self.controls, "points", pn.widgets.IntSlider, name="layers evaluated", width=220),
            _throttled(self, "seeds", pn.widgets.IntSlider, name="Jacobian seeds", width=180),
            pn.widgets.Button.from_param(self.param.compute, button_type="primary", width=170,
                                         disabled=self.param.running),
            pn.widgets.Button.from_param(self.param.cancel, button_type="danger", width=100,
                                         visible=self.param.running),
        )
        notice = pn.pane.Alert(self.param.notice, alert_type="info", visible=pn.bind(bool, self.param.notice),
                               sizing_mode="stretch_width")
        downloads = pn.Row(self._png_download("kappa", "jacobian_kappa.png"),
                           self._png_download("histogram", "jacobian_histogram.png"))
        return pn.Column(_message_pane(self.job.param.error), notice, options, sizes,
                         pn.pane.Markdown(pn.bind(self.badge, self.param.profile)), kappa, hist, downloads,
                         sizing_mode="stretch_width", name="Jacobian")


#: Jobs of all sessions (cancelled on server shutdown).
SESSION_JOBS: set = pn.state.cache.setdefault("osa_lab.dashboard.jobs", set())


class OSACheckView(pn.viewable.Viewer):
    """Badges with the OSA check of the current sizes: orthogonality and dense vs low-rank error."""

    controls = param.ClassSelector(class_=Controls)
    result = param.Dict(default=None, allow_None=True, doc="Last good osa_check result.")

    def __init__(self, compute_now: bool = True, **params):
        super().__init__(**params)
        self.job = Job()
        if compute_now:
            self.refresh()

    @param.depends("controls.tokens", "controls.dim", "controls.heads", "controls.derived_alpha", "controls.alpha",
                   "controls.presets", watch=True)
    def refresh(self) -> None:
        """Run the (cached) check for the current sizes (impossible sizes: the page says so once)."""
        c = self.controls
        try:
            c.validate()
            heads = c.check_heads()
        except ConfigurationError:
            return
        args = (int(c.tokens), int(c.dim), heads, c.alpha_value)

        def compute():
            return compute_osa_check(*args)

        def apply(value):
            self.result = value

        self.job.run(compute, apply)

    @staticmethod
    def badges_html(result: dict | None) -> str:
        """HTML badges, green when within tolerance and red otherwise."""
        if not result:
            return ""
        labels = {
            "orthogonality_error": "‖AᵀA − I‖max",
            "dense_vs_lowrank": "dense vs low-rank",
            "lowrank_vs_float64": "low-rank vs float64",
            "norm_preservation": "norm preservation",
        }
        parts = []
        for key, label in labels.items():
            ok = result["passed"][key]
            colour = "#1a7f37" if ok else "#b42318"
            parts.append(
                f'<span class="osa-badge" data-check="{key}" style="display:inline-block;margin:2px 6px 2px 0;'
                f'padding:3px 10px;border-radius:12px;background:{colour};color:white;font-size:13px">'
                f"{label}: {result[key]:.1e}</span>"
            )
        alpha = result["alpha"]
        meta = (f'<span style="font-size:12px;color:#555">OSA check at N={result["tokens"]}, d={result["dim"]}, '
                f'heads={result["heads"]}, α={alpha:.3g}, {result["dtype"]}, method {result["method"]}</span>')
        return "<div>" + "".join(parts) + meta + "</div>"

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.HTML(pn.bind(self.badges_html, self.param.result), sizing_mode="stretch_width",
                         loading=self.job.param.busy, min_height=30),
            _message_pane(self.job.param.error),
            sizing_mode="stretch_width",
        )


# ---------------------------------------------------------------------------------------------
# the app
# ---------------------------------------------------------------------------------------------


def _throttled(obj: param.Parameterized, pname: str, widget_type: type, **kwargs) -> pn.widgets.Widget:
    """A slider for ``obj.<name>`` that sets the parameter when released (``value_throttled``)
    and follows it when it changes elsewhere (URL, code)."""
    name = pname
    p = obj.param[name]
    if widget_type is pn.widgets.DiscreteSlider:
        widget = widget_type(options=list(p.objects), value=getattr(obj, name), **kwargs)
    else:
        lo, hi = p.bounds
        widget = widget_type(start=lo, end=hi, value=getattr(obj, name), **kwargs)

    def push(event) -> None:
        if event.new is not None and event.new != getattr(obj, name):
            setattr(obj, name, event.new)

    widget.param.watch(push, "value_throttled" if widget_type is not pn.widgets.DiscreteSlider else "value")
    obj.param.watch(lambda e: setattr(widget, "value", e.new), name)
    return widget


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
        self.tabs = pn.Tabs(
            *((label, self.views[v]) for label, v in VIEW_LABELS.items()),
            dynamic=True, sizing_mode="stretch_width", active=VIEWS.index(controls.view),
        )
        self.tabs.param.watch(lambda e: setattr(self.controls, "view", VIEWS[e.new]), "active")
        self._on_view()
        if compute_now:
            self.state.refresh()

    @param.depends("controls.view", watch=True)
    def _on_view(self) -> None:
        index = VIEWS.index(self.controls.view)
        if self.tabs.active != index:
            self.tabs.active = index
        for name, view in self.views.items():
            view.active = name == self.controls.view

    # -- the URL ----------------------------------------------------------------------------

    def apply_url(self, query: Mapping[str, Any]) -> None:
        """Set the controls from the page's query (bad values become :attr:`url_errors`)."""
        self.url_errors = self.controls.apply_query(query)

    def link_url(self, location) -> None:
        """Keep ``location.search`` equal to the view on screen (replacing any bad value at once)."""

        def write(*_events) -> None:
            from urllib.parse import quote, urlencode

            location.search = "?" + urlencode(self.controls.to_query(), quote_via=quote, safe=",")

        self.controls.param.watch(write, list(URL_PARAMETERS))
        write()

    def _url_message(self, errors: list[str]) -> str:
        if not errors:
            return ""
        return ("**This link had settings that could not be used** (the address bar now shows what is on "
                "screen):\n\n" + "\n".join(f"- {e}" for e in errors))

    def stop(self) -> None:
        """Cancel this session's background work (the browser tab closed)."""
        self.jacobian_view.stop()

    # -- layout -----------------------------------------------------------------------------

    def _status(self, busy: bool, seconds: float, config: dict) -> str:
        if busy:
            return "⏳ computing…"
        if not config:
            return ""
        return f"last sweep: {seconds:.2f} s · {len(config['presets'])} presets × {config['seeds']} seeds"

    def _alpha_note(self, derived: bool, alpha: float, presets: list, tokens: int, dim: int, heads: object) -> str:
        if not derived:
            return ""
        from osa_lab.layers import derived_alpha_init
        from osa_lab.presets import get_preset

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
            _message_pane(self.state.param.error),
            notes,
            pn.pane.Markdown("### OSA check", height=40),
            self.check_view,
            self.tabs,
            sizing_mode="stretch_width",
        )

    def sidebar(self) -> list:
        """The sidebar: controls and a status line."""
        c = self.controls
        status = pn.pane.Markdown(pn.bind(self._status, self.state.param.busy, self.state.param.seconds,
                                          self.state.param.config))
        alpha_note = pn.pane.Markdown(
            pn.bind(self._alpha_note, c.param.derived_alpha, c.param.alpha, c.param.presets, c.param.tokens,
                    c.param.dim, c.param.heads), styles={"font-size": "12px"})
        widgets = pn.Column(
            pn.widgets.MultiChoice.from_param(c.param.presets, name="presets"),
            _throttled(c, "depth", pn.widgets.IntSlider, name="depth"),
            _throttled(c, "tokens", pn.widgets.DiscreteSlider, name="tokens N"),
            _throttled(c, "dim", pn.widgets.DiscreteSlider, name="width d"),
            pn.widgets.Select.from_param(c.param.heads, name="heads"),
            pn.widgets.Checkbox.from_param(c.param.derived_alpha),
            _throttled(c, "alpha", pn.widgets.FloatSlider, name="α (OSA)", step=1e-5, format="0.[00000]",
                       disabled=c.param.derived_alpha),
            alpha_note,
            _throttled(c, "seeds", pn.widgets.IntSlider, name="seeds"),
            pn.widgets.Select.from_param(c.param.metric, name="metric"),
            sizing_mode="stretch_width",
        )
        return [widgets, status]

    def template(self) -> pn.template.FastListTemplate:
        """The page: a FastListTemplate with the offline Fast design."""
        return pn.template.FastListTemplate(
            title="osa_lab · Orthogonal vs softmax self-attention across depth",
            sidebar=self.sidebar(),
            main=[self.main()],
            design=OfflineFast,
            font_url="",
            font="system-ui, 'DejaVu Sans', sans-serif",
            accent="#0072B2",
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


def prewarm() -> None:
    """Fill the process-wide caches with the default view (first sweep and figure), once per process.

    Runs when the server starts with ``panel serve --warm`` (or else in the first session), so
    later first loads find the default settings computed.
    """
    if pn.state.cache.get("osa_lab.dashboard.warm"):
        return
    pn.state.cache["osa_lab.dashboard.warm"] = True
    start = time.perf_counter()
    app = Dashboard(compute_now=False)
    app.controls.validate()
    cfg = app.controls.config()
    compute_sweep(**cfg)
    compute_osa_check(int(app.controls.tokens), int(app.controls.dim), app.controls.check_heads(), None)
    app.state._run_sync(lambda: (cfg, compute_sweep(**cfg)), lambda v: app.state.param.update(
        config=v[0], metrics=v[1][0], spectra=v[1][1]))
    for cache_key, build in app.rank_view.specs().values():
        with FIGURE_LOCK:
            FIGURES.put(cache_key, build())
    log.info("dashboard caches warmed in %.1f s", time.perf_counter() - start)


if pn.state.served:
    limit_torch_threads()
    pn.extension(sizing_mode="stretch_width")
    if not pn.state.cache.get("osa_lab.dashboard.atexit"):
        pn.state.cache["osa_lab.dashboard.atexit"] = atexit.register(jobs.cancel_all)
    # SIGTERM: stop the workers and exit at once. Checked per session because the Bokeh server
    # installs its own (graceful, slow under load) handler after a --warm run of this script.
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is not jobs.exit_now:
        signal.signal(signal.SIGTERM, jobs.exit_now)
    prewarm()
    dashboard = Dashboard(compute_now=False)
    if pn.state.session_args:
        dashboard.apply_url(pn.state.session_args)
    pn.state.on_session_destroyed(lambda _ctx, d=dashboard: d.stop())
    dashboard.template().servable()

    def _on_load(d: Dashboard = dashboard) -> None:
        if pn.state.location is not None:
            d.link_url(pn.state.location)  # after the browser's own location has arrived
        d.state.refresh()
        d.check_view.refresh()

    pn.state.onload(_on_load)

__all__ = [
    "Controls", "Dashboard", "JacobianView", "OSACheckView", "OfflineFast", "RankCollapseView", "SpectraView",
    "SweepState", "build_app", "compute_osa_check", "compute_sweep", "compute_unit", "jacobian_layers",
    "limit_torch_threads", "prewarm",
]
