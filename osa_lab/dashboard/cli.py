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


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: give an int from 0 to 65535") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: give an int from 0 (any free port) to 65535")
    return value


def address(text: str) -> str:
    """argparse type: a non-empty host name or IP address without spaces."""
    if not text.strip() or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"invalid address {text!r}: give a host name or IP, e.g. localhost")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``osa-lab dashboard``."""
    from osa_lab.cli import positive_int

    parser.add_argument("--port", type=port_number, default=5006,
                        help="port to serve on (default 5006; 0 = any free port)")  # fmt: skip
    parser.add_argument("--address", type=address, default="localhost", help="address to bind (default localhost)")
    parser.add_argument("--show", action="store_true", help="open the page in a browser")
    parser.add_argument(
        "--allow-websocket-origin", action="append", default=None, metavar="HOST[:PORT]",
        help="extra websocket origin to allow (repeatable), e.g. for access through an SSH tunnel",
    )
    parser.add_argument("--num-threads", type=positive_int, default=None,
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
        print(f"osa-lab dashboard: error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    print(f"serving {cmd[4]} at http://{args.address}:{args.port}/osa_dashboard (Ctrl-C to stop)", flush=True)
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 0
