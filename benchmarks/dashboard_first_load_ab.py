"""First plot of the served dashboard for two (or more) versions side by side, alternating.

Each version is served by its own ``panel serve --warm`` (started together, idle between turns);
every round opens a fresh headless Chromium per version, in alternating order, and records the
seconds from navigation to the rank-collapse plot drawn in the page, the server's answer to the
page request and the page's scripts run (``DOMContentLoaded``). Alternation puts both versions
under the same host load, which on the shared 2-core machine moves single runs by ±0.5 s.

    python benchmarks/dashboard_first_load_ab.py ROUNDS LABEL=SCRIPT[@PYTHONPATH][?VAR=VALUE&...] ...

e.g. an older commit checked out with ``git worktree add /tmp/base <commit>``::

    python benchmarks/dashboard_first_load_ab.py 8 \\
        base=/tmp/base/osa_lab/dashboard/osa_dashboard.py@/tmp/base \\
        now=osa_lab/dashboard/osa_dashboard.py

or the same code under two settings of an environment variable the server reads::

    python benchmarks/dashboard_first_load_ab.py 8 \\
        one=osa_lab/dashboard/osa_dashboard.py?OSA_DASHBOARD_TORCH_THREADS=1 \\
        two=osa_lab/dashboard/osa_dashboard.py?OSA_DASHBOARD_TORCH_THREADS=2

``--gap SECONDS`` (default 0) waits that long before each page, e.g. to give each server idle time
between pages. Prints one line per page and the medians; no assertion on
time.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from dashboard_update import CHROMIUM, JS_DRAWN, JS_NAVIGATION, ROOT, free_port, wait_until_serving


def _serve(label: str, spec: str) -> tuple[str, int, subprocess.Popen, str]:
    spec, _, variables = spec.partition("?")
    script, _, pythonpath = spec.partition("@")
    port = free_port()
    cmd = [sys.executable, "-m", "panel", "serve", script, "--port", str(port), "--address", "127.0.0.1", "--warm",
           "--allow-websocket-origin", f"127.0.0.1:{port}"]
    env = {**os.environ, "OSA_DASHBOARD_TORCH_THREADS": "1",
           **dict(v.split("=", 1) for v in variables.split("&") if v)}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    log = open(ROOT / "bench_results" / f"first_load_{label}.log", "w")  # noqa: SIM115 - lives with the server
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    return label, port, proc, Path(script).stem


def main(argv: list[str]) -> int:
    gap = 0.0
    if len(argv) > 1 and argv[0] == "--gap":
        gap, argv = float(argv[1]), argv[2:]
    if len(argv) < 2 or not argv[0].isdigit() or not all("=" in a for a in argv[1:]):
        print(__doc__.strip().splitlines()[0] + "\nusage: dashboard_first_load_ab.py [--gap S] ROUNDS LABEL=SCRIPT[@PYTHONPATH][?VAR=VALUE&...] ...",
              file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    (ROOT / "bench_results").mkdir(exist_ok=True)
    servers = [_serve(*a.split("=", 1)) for a in argv[1:]]
    results: dict[str, list[tuple[float, float, float]]] = {label: [] for label, *_ in servers}
    try:
        for _, port, proc, _ in servers:
            wait_until_serving(port, proc, timeout=300)
        with sync_playwright() as pw:
            for r in range(int(argv[0])):
                for label, port, _, name in servers if r % 2 == 0 else servers[::-1]:
                    time.sleep(gap)
                    browser = pw.chromium.launch(executable_path=CHROMIUM,
                                                 args=["--headless", "--no-sandbox", "--disable-gpu"])
                    page = browser.new_page()
                    t0 = time.perf_counter()
                    page.goto(f"http://127.0.0.1:{port}/{name}", wait_until="commit", timeout=120_000)
                    page.wait_for_function(JS_DRAWN, timeout=120_000, polling=50)
                    drawn = time.perf_counter() - t0
                    nav = page.evaluate(JS_NAVIGATION)
                    html, dom = nav["html"], nav["dom"]
                    browser.close()
                    results[label].append((drawn, html, dom))
                    print(f"round {r} {label:10s} drawn {drawn:.2f} s  page answered {html:.2f} s  "
                          f"scripts run {dom:.2f} s", flush=True)
    finally:
        for _, _, proc, _ in servers:
            proc.terminate()
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    for label, rows in results.items():
        drawn, html, dom = (statistics.median(col) for col in zip(*rows, strict=True))
        print(f"{label:10s} median of {len(rows)}: drawn {drawn:.2f} s, page answered {html:.2f} s, "
              f"scripts run {dom:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
