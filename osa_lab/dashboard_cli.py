"""``osa-lab dashboard``: serve the Panel dashboard (``dashboards/osa_dashboard.py``).

Equivalent to ``panel serve dashboards/osa_dashboard.py [--show] --port PORT --address ADDRESS``,
run with this Python so the same environment (and osa_lab) is used. The page works offline:
Panel serves every script and stylesheet itself (see ``docs/dashboard.md``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

#: The served app, relative to the repository root.
APP_RELATIVE = Path("dashboards") / "osa_dashboard.py"


def app_path() -> Path:
    """Path of the dashboard script (next to the ``osa_lab`` package in a source checkout).

    ``OSA_LAB_DASHBOARD`` overrides it. Raises ``FileNotFoundError`` with a hint when absent
    (e.g. a wheel install, which does not ship ``dashboards/``).
    """
    override = os.environ.get("OSA_LAB_DASHBOARD")
    path = Path(override) if override else Path(__file__).resolve().parents[1] / APP_RELATIVE
    if not path.is_file():
        raise FileNotFoundError(
            f"dashboard script not found at {path}; run from a source checkout of osa_lab "
            "(pip install -e '.[dashboard]') or set OSA_LAB_DASHBOARD to the path of osa_dashboard.py"
        )
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``osa-lab dashboard``."""
    parser.add_argument("--port", type=int, default=5006, help="port to serve on (default 5006; 0 = any free port)")
    parser.add_argument("--address", default="localhost", help="address to bind (default localhost)")
    parser.add_argument("--show", action="store_true", help="open the page in a browser")
    parser.add_argument(
        "--allow-websocket-origin", action="append", default=None, metavar="HOST[:PORT]",
        help="extra websocket origin to allow (repeatable), e.g. for access through an SSH tunnel",
    )
    parser.add_argument("--num-threads", type=int, default=None,
                        help="Panel thread pool size for callbacks (default: none; heavy work already runs in threads)")
    parser.add_argument("--dry-run", action="store_true", help="print the panel serve command and exit")


def build_command(args: argparse.Namespace) -> list[str]:
    """The ``panel serve`` command line for ``args``."""
    cmd = [sys.executable, "-m", "panel", "serve", str(app_path()), "--port", str(args.port),
           "--address", args.address]
    if args.show:
        cmd.append("--show")
    for origin in args.allow_websocket_origin or []:
        cmd += ["--allow-websocket-origin", origin]
    if args.num_threads:
        cmd += ["--num-threads", str(args.num_threads)]
    return cmd


def run(args: argparse.Namespace) -> int:
    """Serve the dashboard until interrupted; returns panel's exit status."""
    try:
        cmd = build_command(args)
    except FileNotFoundError as exc:
        print(f"osa-lab dashboard: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    print(f"serving {cmd[4]} at http://{args.address}:{args.port}/osa_dashboard (Ctrl-C to stop)", flush=True)
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 0
