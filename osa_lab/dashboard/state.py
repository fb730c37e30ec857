"""Settings and computations of the dashboard: controls mirrored in the URL, cached sweeps.

Everything that defines what is on screen (presets, tab, site, scale, metric, Jacobian mode and
scope, sizes) lives in :class:`Controls` and in the page URL (:meth:`Controls.to_query`,
:meth:`Controls.apply_query`). :class:`Job` runs a computation off the server's event loop in a
daemon thread (:class:`osa_lab.dashboard.sweep.SweepState` holds one session's current sweep);
:func:`follow_job` follows a worker process. The caches (:func:`compute_osa_check`,
:func:`osa_lab.dashboard.sweep.compute_sweep`, :mod:`osa_lab.dashboard.caches`) are shared by
every session of the server process. Sessions compute concurrently: models are built with an
explicit dtype (no process-wide default-dtype switch).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import panel as pn
import param

from osa_lab.dashboard import jobs
from osa_lab.dashboard.caches import CHECKS
from osa_lab.dashboard.text import (  # noqa: F401  (the views import these from here too)
    DECIMAL_PATTERN,
    INTEGER_PATTERN,
    MESSAGE_LIMIT,
    QUOTE_LIMIT,
    label_of,
    markdown_literal,
    quoted,
)
from osa_lab.errors import ConfigurationError, UserError

log = logging.getLogger("osa_lab.dashboard")

#: Errors whose message is shown to the user as is (bad or too-expensive settings): osa_lab's user
#: errors (:class:`~osa_lab.errors.UserError`), the ``ValueError`` s of the URL parser below and
#: the ``MemoryError`` of a size this machine cannot hold.
USER_ERRORS: tuple[type[BaseException], ...] = (UserError, ValueError, MemoryError)

#: Controls mirrored in the page URL's query string, in this order (shareable links).
URL_PARAMETERS = ("presets", "view", "depth", "tokens", "dim", "heads", "seeds", "derived_alpha", "alpha", "metric",
                  "site", "scale", "colours", "floor", "layers", "jacobian", "scope", "points")

#: The pages' accent colour (the header; Okabe–Ito blue, as the OSA presets' lines).
ACCENT = "#0072B2"

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
#: The spectra heatmaps' colour range (:func:`osa_lab.plots.depth.spectra_heatmaps`): shared or per panel.
COLOURS_LABELS = {"one for all": "shared", "per panel": "per_panel"}
#: The low end of the spectra heatmaps' colour range; "auto": the smallest value shown.
FLOOR_LABELS = {"auto": "auto", "1e-2": "1e-2", "1e-4": "1e-4", "1e-8": "1e-8", "1e-16": "1e-16"}
JACOBIAN_LABELS = {"auto (cheaper)": "auto", "exact": "exact", "matrix-free": "matrix-free"}
SCOPE_LABELS = {"end-to-end ∂X_l/∂X_0": "end_to_end", "single block": "layer"}
VIEW_LABELS = {"Rank collapse": "rank", "Spectra": "spectra", "Jacobian": "jacobian"}
VIEWS = list(VIEW_LABELS.values())

#: Jacobian requests estimated below this many seconds start without pressing *Compute*.
AUTO_JACOBIAN_SECONDS = 8.0


def preset_names() -> list[str]:
    """Names of the model presets (:mod:`osa_lab.nn.presets`)."""
    from osa_lab.nn.presets import preset_names as names

    return names()


def preset_heads(name: str) -> int:
    """The head count a preset uses by default (:mod:`osa_lab.nn.presets`)."""
    from osa_lab.nn.presets import get_preset

    return int(get_preset(name).heads)


# ---------------------------------------------------------------------------------------------
# process-wide caches (primitive keys only) and background execution
# ---------------------------------------------------------------------------------------------


# Model computations of different sessions run concurrently (no lock): models receive their dtype
# explicitly (osa_lab.nn.models), seeded builds draw from local generators (osa_lab.nn.models.seeding)
# and inputs come from private generators.
#: Serialises building HoloViews objects (their option trees are global state).
FIGURE_LOCK: threading.Lock = threading.Lock()


def progress_text(what: str, done: int, total: int, elapsed: float, eta: float, cancel: str = "Cancel") -> str:
    """The progress line of a job in a worker process (Jacobians, long sweeps)."""
    left = f", about {jobs.format_seconds(elapsed / done * (total - done))} left" if done else ""
    return (f"Computing {what}: {done}/{total} done, {elapsed:.0f} s elapsed (estimated "
            f"{jobs.format_seconds(eta)}{left}). *{cancel}* stops it.")


def follow_job(
    job: jobs.WorkerJob,
    on_unit: Callable[[Any, Any], None],
    on_progress: Callable[[int, float], None],
    on_error: Callable[[BaseException], None],
    on_end: Callable[[float], None],
) -> None:
    """Follow a worker job (:func:`osa_lab.dashboard.jobs.start_job`) on the server's event loop.

    Every 0.2 s each finished unit goes to ``on_unit(unit, result)``, a failure to
    ``on_error(exception)`` and, while it runs, the count of units done and the seconds elapsed
    to ``on_progress``; ``on_end(seconds)`` is called once the worker has finished, failed or
    been cancelled. The one path of every long computation of the dashboard (Jacobians and
    long sweeps): estimate before, progress during, *Cancel* at any time.
    """
    start = time.perf_counter()

    async def follow() -> None:
        done = 0
        while not job.finished:
            await asyncio.sleep(0.2)
            for kind, unit, result, _seconds in job.poll():
                if kind == "unit":
                    done += 1
                    on_unit(unit, result)
                elif kind == "error":
                    on_error(result)
            if not job.finished:
                on_progress(done, time.perf_counter() - start)
        on_end(time.perf_counter() - start)

    pn.state.execute(follow)


def compute_osa_check(tokens: int, dim: int, heads: int, alpha: float | None) -> dict[str, object]:
    """The OSA check of :mod:`osa_lab.studies.self_check` for these sizes (seed 0, float32), cached
    process-wide in :data:`CHECKS`."""
    args = (tokens, dim, heads, alpha)
    hit = CHECKS.get(args)
    if hit is None:
        from osa_lab.studies.self_check import osa_check

        hit = osa_check(tokens, dim, heads, alpha, seed=0)
        CHECKS.put(args, hit)
    return hit


#: Computes one Jacobian unit in this process (tests and scripts; served sessions use a worker).
compute_unit = jobs.compute_unit


def jacobian_layers(depth: int, points: int) -> list[int]:
    """``points`` layers from 1 to ``depth``, evenly spaced, always including the last."""
    points = max(1, min(points, depth))
    return sorted({round(depth * (i + 1) / points) for i in range(points)})


def describe_error(exc: BaseException) -> str:
    """A one-paragraph message for the page (never a traceback)."""
    if isinstance(exc, USER_ERRORS):
        return str(exc)
    log.error("dashboard computation failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
    return f"The computation failed ({type(exc).__name__}: {exc}). The last good figures are kept."


def is_served() -> bool:
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
    colours = param.Selector(default="shared", objects=COLOURS_LABELS, label="colour range",
                             doc="Spectra heatmaps: one colour range for every preset, or each its own.")
    floor = param.Selector(default="1e-4", objects=FLOOR_LABELS, label="colour floor",
                           doc="Spectra heatmaps: σᵢ/σ₁ below this take the lowest colour (auto: the smallest value).")
    layers = param.List(default=[], item_type=int,
                        doc="Spectra: layers drawn as lines (empty: the input, ¼, ½ and the last layer).")
    jacobian = param.Selector(default="auto", objects=JACOBIAN_LABELS, doc="Jacobian computation.")
    scope = param.Selector(default="end_to_end", objects=SCOPE_LABELS, doc="κ of ∂X_l/∂X_0 or of block l alone.")
    points = param.Integer(default=6, bounds=(1, 48), label="layers evaluated",
                           doc="Layers (evenly spaced, last included) at which κ is computed.")
    adjusted = param.String(default="", precedence=-1,
                            doc="Why a control was changed by another one (shown on the page; '' if none).")

    def __init__(self, **params):
        self.param.presets.objects = preset_names()
        super().__init__(**params)
        self._canonical_presets()
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
        from osa_lab.nn.presets import get_preset

        for p in self.presets:
            if get_preset(p).attention == "osa":
                return self.heads_of(p)
        return self.heads_value or 1

    def check_args(self) -> tuple[int, int, int, float | None]:
        """Arguments of :func:`compute_osa_check` for the current settings (the first OSA preset's)."""
        return int(self.tokens), int(self.dim), self.check_heads(), self.alpha_value

    def check_groups(self) -> list[tuple[tuple[str, ...], tuple[int, int, int, float | None]]]:
        """One OSA check per head count among the OSA presets shown: ``(presets, args)`` pairs in the
        presets' order (presets with equal heads share a check: it depends on N, d, heads and α
        only). Without an OSA preset, one check of :meth:`check_args` for no preset."""
        from osa_lab.nn.presets import get_preset

        groups: dict[tuple[int, int, int, float | None], list[str]] = {}
        for p in self.presets:
            if get_preset(p).attention == "osa":
                args = (int(self.tokens), int(self.dim), self.heads_of(p), self.alpha_value)
                groups.setdefault(args, []).append(p)
        if not groups:
            return [((), self.check_args())]
        return [(tuple(names), args) for args, names in groups.items()]

    def derived_alpha0(self) -> float:
        """The derived α₀ of the OSA check's heads at the current N and d."""
        from osa_lab.nn.attention import derived_alpha_init

        heads = self.check_heads()
        return derived_alpha_init(int(self.tokens), int(self.dim), int(self.dim) // heads)

    @param.depends("presets", watch=True)
    def _canonical_presets(self) -> None:
        """Keep the chosen presets in the order of :func:`preset_names`: the order of the chips in
        the presets widget, of the curves in every legend and of the sweep tables, whatever order
        they were picked or written in a link (one order, and one cache key per set of presets)."""
        ordered = [p for p in self.param.presets.objects if p in self.presets]
        if ordered != list(self.presets):
            self.presets = ordered

    @param.depends("dim", watch=True)
    def _sync_heads_choices(self) -> None:
        """Offer only head counts that divide d."""
        valid = [h for h in HEAD_CHOICES if int(self.dim) % h == 0]
        self.param.heads.objects = [PRESET_HEADS, *valid]
        if self.heads != PRESET_HEADS and self.heads not in valid:
            old = self.heads
            self.heads = PRESET_HEADS
            self.adjusted = (f"heads was reset from {old} to preset default: width d = {self.dim} is not divisible "
                             f"by {old} (valid: {', '.join(map(str, valid))}).")
        else:
            self.adjusted = ""

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
            elif name == "layers":
                q[name] = ",".join(str(x) for x in value)
            elif name == "alpha":
                q[name] = f"{float(value):.10g}"  # 0.59971, not the slider's 0.5997100000000001
            else:
                q[name] = str(value)
        return q

    def apply_query(self, query: Mapping[str, str | list[str] | bytes | list[bytes]]) -> list[str]:
        """Set the controls from URL query values; returns one message per value that was not used.

        Accepts ``{name: "value"}`` or Bokeh's ``{name: [b"value"]}``. Every value is checked
        before anything is set (known name, parses, finite, within bounds, one of the choices);
        an unusable one is named, with the valid choices, in a plain-text message and left out,
        so no link can stop the page from loading. The messages quote the link's text as typed
        (:func:`quoted`): pass them through :func:`markdown_literal` before they reach a page.
        """
        errors: list[str] = []
        updates: dict[str, object] = {}
        texts: dict[str, str] = {}
        for key, raw in query.items():
            if isinstance(raw, list):
                raw = raw[-1] if raw else ""
            if isinstance(raw, bytes):
                raw = raw.decode("utf-8", "replace")
            key = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
            text = str(raw).strip()
            if key not in URL_PARAMETERS:
                errors.append(f"unknown URL parameter {quoted(key)} (known: {', '.join(URL_PARAMETERS)})")
                continue
            texts[key] = text
            if key == "layers":  # each layer on its own: an unusable one never discards the others
                updates[key], bad = self._parse_layers(text)
                if bad:
                    errors.append(f"layers {quoted(','.join(bad))} ignored: use whole numbers from 0 to the depth")
                continue
            try:
                updates[key] = self._parse(key, text)
            except (ValueError, OverflowError) as exc:
                errors.append(f"{key}={quoted(text)} was ignored: {exc}")
        if "alpha" in updates and "derived_alpha" not in updates:
            updates["derived_alpha"] = False  # an explicit α means: use it
        if "alpha" in texts and "alpha" not in updates and updates.get("derived_alpha") is False:
            updates["derived_alpha"] = True  # no usable α to use instead of α₀
            errors.append(self._derived_alpha_kept(texts["derived_alpha"]))
        if "dim" in updates or "heads" in updates:
            dim = int(updates.get("dim", self.dim))
            heads = updates.get("heads", self.heads)
            if heads != PRESET_HEADS and dim % int(heads):
                valid = [h for h in HEAD_CHOICES if dim % h == 0]
                errors.append(f"heads={heads} was ignored: d = {dim} is not divisible by {heads}; valid: "
                              f"preset, {', '.join(map(str, valid))}")
                updates.pop("heads", None)
        ordered = {k: updates[k] for k in ("dim", "derived_alpha", *URL_PARAMETERS) if k in updates}
        try:
            self.param.update(**ordered)
        except Exception:  # noqa: BLE001 - set what can be set, name the rest
            errors.extend(self._apply_one_by_one(ordered, texts.get("derived_alpha", "false")))
        if len(errors) > MESSAGE_LIMIT:
            errors = [*errors[:MESSAGE_LIMIT], f"and {len(errors) - MESSAGE_LIMIT} more unusable values"]
        return errors

    def _apply_one_by_one(self, ordered: dict[str, object], derived_text: str) -> list[str]:
        """Set each value of ``ordered`` on its own; one message per value the controls refuse.
        A refused α leaves the derived α₀ on (no α would stand behind ``derived_alpha=false``)."""
        errors = []
        for name, value in ordered.items():
            try:
                setattr(self, name, value)
            except Exception as exc:  # noqa: BLE001
                log.warning("URL value %s=%r not applied: %s", name, value, exc)
                errors.append(f"{name}={quoted(value)} was ignored: the control refused it")
                if name == "alpha" and not self.derived_alpha:
                    self.derived_alpha = True
                    errors.append(self._derived_alpha_kept(derived_text))
        return errors

    @staticmethod
    def _derived_alpha_kept(derived_text: str) -> str:
        """The message for a link whose α is unusable while it turns the derived α₀ off."""
        return (f"derived_alpha={quoted(derived_text)} was ignored: the link's alpha cannot be used, so the "
                "derived α₀ (OSA init) is used instead of a fixed α")

    def _parse_layers(self, text: str) -> tuple[list[int], list[str]]:
        """The usable layers of a comma-separated list (whole numbers in 0…max depth) and the rest;
        a layer past the sweep's depth is dropped later, by the view, with the others kept."""
        good, bad = [], []
        for part in (x.strip() for x in text.split(",")):
            if not part:
                continue
            if INTEGER_PATTERN.fullmatch(part) and len(part) <= 3 and 0 <= int(part) <= self.param.depth.bounds[1]:
                good.append(int(part))
            else:
                bad.append(part)
        return sorted(set(good)), bad

    def _parse(self, key: str, text: str) -> object:
        p = self.param[key]
        if key == "presets":
            names = [x.strip() for x in text.split(",") if x.strip()]
            unknown = [x for x in names if x not in p.objects]
            if unknown:
                raise ValueError(f"unknown preset(s) {', '.join(quoted(x, 40) for x in unknown[:5])}; "
                                 f"valid: {', '.join(p.objects)}")
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
            if INTEGER_PATTERN.fullmatch(text) and int(text) in HEAD_CHOICES:
                return int(text)
            raise ValueError(f"use preset or one of {', '.join(map(str, HEAD_CHOICES))}")
        if isinstance(p, param.Selector):
            values = list(p.objects.values()) if isinstance(p.objects, dict) else list(p.objects)
            for v in values:
                if str(v) == text:
                    return v
            raise ValueError(f"valid values: {', '.join(map(str, values))}")
        lo, hi = p.bounds
        if isinstance(p, param.Integer):
            if not INTEGER_PATTERN.fullmatch(text) or len(text) > 12:
                raise ValueError(f"not a whole number in {lo}…{hi}")
            value = int(text)
        else:
            if not DECIMAL_PATTERN.fullmatch(text):
                raise ValueError(f"not a decimal number in {lo}…{hi}")
            value = float(text)
            if not math.isfinite(value):
                raise ValueError(f"not a finite number; use one in {lo}…{hi}")
        if value < lo or value > hi:
            raise ValueError(f"outside {lo}…{hi}")
        return value


class Job(param.Parameterized):
    """Runs a computation off the event loop when served (synchronously otherwise), keeping the
    last good result on error and dropping results that a newer request has overtaken."""

    busy = param.Boolean(default=False, doc="A computation is running.")
    error = param.String(default="", doc="Message of the last failed computation ('' if it succeeded).")
    seconds = param.Number(default=0.0, doc="Wall time of the last successful computation.")
    from_cache = param.Boolean(default=False, doc="The value shown came from a cache (nothing was computed).")

    def __init__(self, **params):
        super().__init__(**params)
        self._generation = 0

    def run(
        self,
        compute: Callable[[], object],
        apply: Callable[[object], None],
        cached: Callable[[], object | None] | None = None,
    ) -> None:
        """Compute now (tests, scripts) or in a daemon thread, applying on the server's loop.

        ``cached()`` (optional) returns the value when it is already at hand (``None`` if not):
        it is then applied at once, without a thread hop or a loading indicator, so returning to
        computed settings and a session's first view of pre-warmed settings cost no round trip.
        """
        self._generation += 1
        value = cached() if cached is not None else None
        if value is not None:
            self.error, self.seconds, self.from_cache, self.busy = "", 0.0, True, False  # overtakes older runs
            try:
                apply(value)
            except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the page
                self.error = describe_error(exc)
            return
        if is_served():
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
            self.seconds, self.from_cache = time.perf_counter() - start, False
            self.error = ""
            apply(value)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the page
            self.error = describe_error(exc)

    async def _run_async(self, generation: int, compute, apply) -> None:
        start = time.perf_counter()
        try:
            value = await in_daemon_thread(compute)
        except Exception as exc:  # noqa: BLE001
            if generation == self._generation:
                self.error = describe_error(exc)
                self.busy = False
            return
        if generation != self._generation:
            return  # a newer request is running; its result will be shown
        try:
            self.seconds, self.from_cache = time.perf_counter() - start, False
            self.error = ""
            apply(value)
        except Exception as exc:  # noqa: BLE001
            self.error = describe_error(exc)
        finally:
            self.busy = False
