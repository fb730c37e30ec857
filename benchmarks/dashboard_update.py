"""Dashboard responsiveness: first plot, uncached and cached updates, concurrent sessions.

The targets (at the default view, on the 2-core CPU machine): the first plot of a session
within 3 s, a return to settings already computed within 0.5 s, and an uncached update with
5 presets within 3 s. Two kinds of measurement:

* **in process** (the dashboard's own objects, no browser): an *update* is a depth change of a
  built app whose Bokeh models exist (as in a served session), from setting the control to
  those models updated (what the server then sends to the browser). ``uncached`` clears the process-wide sweep and figure caches first;
  ``cached`` returns to the settings just shown. For 2 and 5 presets.
* **served** (the ``panel serve`` command of ``osa-lab dashboard``, with ``--warm``, on a free port, Debian's headless Chromium through
  Playwright, as ``tests/dashboard/test_browser.py``): from navigation to the rank-collapse plot
  drawn in the page, for the first session after start and for 3 sessions opened at once.
  Skipped (with a note) when Chromium or Playwright is missing.

Medians of ``--repeat`` runs; no assertion on time (shared machines are noisy); a table is
printed and written to ``--csv``.

    python benchmarks/dashboard_update.py [--repeat 3] [--threads 1] [--no-browser | --only-served]
        [--sessions 5 [--only-sessions]] [--csv bench_results/dashboard_update.csv]

``--sessions 5`` adds 5 sessions making an uncached update at the same moment (in process,
one thread per session, as the server's sweeps run): the case that shows whether sessions
compute concurrently; with ``--compare-lock`` runs alternate between the old global compute lock
(emulated around every sweep) and none, so both see the same load.
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import holoviews as hv
import torch

from osa_lab.benchmarking.timing import emit_table, machine_info

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("OSA_LAB_CHROMIUM", "/usr/bin/chromium")
FIVE = ["pure-ssa", "pure-osa", "vit", "skipless-ssa", "skipless-osa"]
TARGETS = {"first_plot": 3.0, "cached_update": 0.5, "uncached_update_5": 3.0}


class _Dashboard:
    """The dashboard's modules under one name (caches live in :mod:`osa_lab.dashboard.caches`)."""

    def __init__(self) -> None:
        from osa_lab.dashboard import app, caches

        self.build_app = app.build_app
        self.FIGURES, self.SWEEPS, self.CHECKS = caches.FIGURES, caches.SWEEPS, caches.CHECKS

    def clear(self) -> None:
        """Empty every process-wide cache (sweeps, OSA checks, figures): the next update computes."""
        for cache in (self.FIGURES, self.SWEEPS, self.CHECKS):
            cache.clear()


def load_dashboard() -> _Dashboard:
    """The package's dashboard (``osa_lab.dashboard``)."""
    return _Dashboard()


def in_process(dash, presets: list[str], repeat: int) -> list[dict]:
    """Uncached and cached depth changes of a built app at the default sizes."""
    import panel as pn
    from bokeh.document import Document

    app = dash.build_app(presets=presets)
    pn.panel(app).get_root(Document())  # the session's Bokeh models, as the server holds them
    depths = [12, 11]
    rows = []

    def update(depth: int) -> float:  # compute (or cache hit) and update the session's Bokeh models
        start = time.perf_counter()
        app.controls.depth = depth
        assert app.state.error == "" and app.rank_view.job.error == "", (app.state.error, app.rank_view.job.error)
        return time.perf_counter() - start

    uncached, cached = [], []
    for _ in range(repeat):
        dash.clear()
        # Each round starts at a third depth: a round ending on depths[1] must not make the next
        # round's first setting a no-op (which left that round's "cached" update uncached).
        update(depths[0] + 1)
        update(depths[1])  # computed now (uncached), revisited below
        uncached.append(update(depths[0]))
        cached.append(update(depths[1]))  # back to settings computed a moment ago
    n = len(presets)
    rows.append({"measure": f"uncached_update_{n}", "presets": n, "seconds": statistics.median(uncached)})
    rows.append({"measure": "cached_update", "presets": n, "seconds": statistics.median(cached)})
    return rows


class _SerialisedSweeps:
    """Emulates the removed global compute lock: every sweep of every session in turn."""

    def __init__(self) -> None:
        import osa_lab.studies.depth as analysis

        self.analysis, self.original, self.lock = analysis, analysis.sweep, threading.Lock()

    def __enter__(self):
        def locked(*args, **kwargs):
            with self.lock:
                return self.original(*args, **kwargs)

        self.analysis.sweep = locked
        return self

    def __exit__(self, *exc) -> None:
        self.analysis.sweep = self.original


def compare_lock(dash, sessions: int, repeat: int) -> list[dict]:
    """Concurrent sessions with the old global lock (emulated) and without, alternating, so both
    see the same machine load."""
    rows: dict[str, list[dict]] = {"lock": [], "no lock": []}
    for _ in range(repeat):
        with _SerialisedSweeps():
            rows["lock"] += concurrent_sessions(dash, sessions, 1)
        rows["no lock"] += concurrent_sessions(dash, sessions, 1)
    out = []
    for kind, rs in rows.items():
        for measure in sorted({r["measure"] for r in rs}):
            secs = [r["seconds"] for r in rs if r["measure"] == measure]
            out.append({"measure": f"{measure} ({kind})", "presets": 2, "seconds": statistics.median(secs)})
    return out


def concurrent_sessions(dash, sessions: int, repeat: int) -> list[dict]:
    """``sessions`` apps (default presets) each make an uncached depth change at the same time.

    Each session runs in its own thread, as the server runs each session's sweep in its own
    daemon thread; rendering to Bokeh models is serialised (the server does it on its one event
    loop). Reports the median over sessions and the slowest session, median over ``repeat``.
    """
    import panel as pn

    apps = [dash.build_app() for _ in range(sessions)]
    for a in apps:
        pn.panel(a)
    render_lock = threading.Lock()
    medians, slowest = [], []
    for r in range(repeat):
        dash.clear()
        times = [0.0] * sessions
        barrier = threading.Barrier(sessions)

        def one(i: int, r: int = r, barrier: threading.Barrier = barrier, times: list = times) -> None:
            app = apps[i]
            barrier.wait()
            start = time.perf_counter()
            app.controls.depth = 20 - i - sessions * (r % 2)  # distinct settings: every sweep is uncached
            with render_lock:
                hv.render(app.rank_view.figures["metric"], backend="bokeh")
            times[i] = time.perf_counter() - start
            assert app.state.error == "", app.state.error

        threads = [threading.Thread(target=one, args=(i,)) for i in range(sessions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        medians.append(statistics.median(times))
        slowest.append(max(times))
    return [
        {"measure": f"concurrent_{sessions}_sessions_median", "presets": 2, "seconds": statistics.median(medians)},
        {"measure": f"concurrent_{sessions}_sessions_slowest", "presets": 2, "seconds": statistics.median(slowest)},
    ]


def free_port() -> int:
    """A free localhost TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(port: int, proc: subprocess.Popen, timeout: float = 600) -> float:
    """Seconds until the server on ``port`` answers HTTP; raises if ``proc`` exits or ``timeout`` passes."""
    start = time.perf_counter()
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/")
            conn.getresponse()
            return time.perf_counter() - start
        except OSError:
            if proc.poll() is not None or time.perf_counter() - start > timeout:
                raise RuntimeError(f"panel serve on port {port} did not start") from None
            time.sleep(0.3)


JS_DRAWN = """() => {
  for (const doc of (window.Bokeh ? Bokeh.documents : []))
    for (const m of doc.all_models)
      if (m.type === 'Title' && String(m.text).includes('after each block')) return true;
  return false;
}"""


#: navigation timing of the page (seconds from navigation start)
JS_NAVIGATION = """() => { const n = performance.getEntriesByType('navigation')[0];
  return {html: n.responseStart / 1000, dom: n.domContentLoadedEventEnd / 1000}; }"""


def served(repeat: int) -> list[dict]:
    """First plot of a fresh server's first session, and of 3 sessions at once (browser)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("served measurements skipped: the playwright package is not installed")
        return []
    if not Path(CHROMIUM).exists():
        print(f"served measurements skipped: no Chromium at {CHROMIUM}")
        return []
    port = free_port()
    log = open(ROOT / "bench_results" / "dashboard_serve.log", "w")
    import argparse

    from osa_lab.dashboard.cli import build_command

    cmd = build_command(argparse.Namespace(port=port, address="127.0.0.1", show=False, num_threads=None,
                                           allow_websocket_origin=[f"127.0.0.1:{port}"]))  # as osa-lab dashboard
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "OSA_DASHBOARD_TORCH_THREADS": "1"})
    rows = []
    try:
        rows.append({"measure": "server_start_with_warm", "presets": 2, "seconds": wait_until_serving(port, proc)})
        url = f"http://127.0.0.1:{port}/osa_dashboard"
        if True:  # each measurement drives its own browser (a fresh session, like a new user)

            def first_plot(results: list, index: int) -> None:
                with sync_playwright() as pw2:  # one driver per thread
                    b = pw2.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox",
                                                                             "--disable-gpu"])
                    page = b.new_page()
                    t0 = time.perf_counter()
                    page.goto(url, wait_until="commit", timeout=120_000)
                    page.wait_for_function(JS_DRAWN, timeout=300_000, polling=100)
                    results[index] = time.perf_counter() - t0
                    parts[index] = page.evaluate(JS_NAVIGATION)  # where the time went
                    b.close()

            times, pages = [], []
            for _ in range(repeat):
                out, parts = [None], [None]
                first_plot(out, 0)
                times.append(out[0])
                pages.append(parts[0])
            rows.append({"measure": "first_plot", "presets": 2, "seconds": times[0]})
            rows.append({"measure": "first_plot_later_sessions", "presets": 2,
                         "seconds": statistics.median(times[1:]) if len(times) > 1 else times[0]})
            # the parts of the first plot (medians over all sessions in a row): the server's
            # answer to the page request (it builds the session), the page's scripts run
            for key, measure in (("html", "first_plot_page_answered"), ("dom", "first_plot_scripts_run")):
                rows.append({"measure": measure, "presets": 2,
                             "seconds": statistics.median(p[key] for p in pages)})
            out, parts = [None] * 3, [None] * 3
            threads = [threading.Thread(target=first_plot, args=(out, i)) for i in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            rows.append({"measure": "first_plot_3_concurrent_max", "presets": 2, "seconds": max(out)})
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads, as the served dashboard uses (OSA_DASHBOARD_TORCH_THREADS)")
    parser.add_argument("--no-browser", action="store_true", help="in-process measurements only")
    parser.add_argument("--sessions", type=int, default=0,
                        help="also measure this many sessions making an uncached update at once (in process)")
    parser.add_argument("--compare-lock", action="store_true",
                        help="with --sessions: alternate runs with the old global compute lock (emulated) and without")
    parser.add_argument("--only-sessions", action="store_true",
                        help="measure only the concurrent sessions (with --sessions)")
    parser.add_argument("--only-served", action="store_true", help="measure only the served page (browser)")
    parser.add_argument("--csv", default="bench_results/dashboard_update.csv")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    (ROOT / "bench_results").mkdir(exist_ok=True)
    print("machine:", machine_info())
    print("load average:", os.getloadavg())
    dash = load_dashboard()
    rows = []
    if not args.only_sessions and not args.only_served:
        rows += in_process(dash, ["pure-ssa", "pure-osa"], args.repeat) + in_process(dash, FIVE, args.repeat)
    if args.sessions and args.compare_lock:
        rows += compare_lock(dash, args.sessions, args.repeat)
    elif args.sessions:
        rows += concurrent_sessions(dash, args.sessions, args.repeat)
    if not args.no_browser and not args.only_sessions:
        rows += served(args.repeat)
    for row in rows:
        row["target_s"] = TARGETS.get(row["measure"])
        row["load_average_1min"] = round(os.getloadavg()[0], 1)
    emit_table(rows, args.csv, title="dashboard (default view: depth 12, N 32, d 32, 2 seeds; median seconds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
